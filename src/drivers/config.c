/*
 * config.c — the relay's configuration: defaults that work, a YAML file (libyaml) over them,
 * and flag overrides by dotted key. One table (`keys`) is the whole schema: names, types,
 * limits, defaults and help; the file parser, obx_config_new, obx_config_set, the dump and the
 * reference (obx_config_reference: `man obx` CONFIGURATION and `obx help config`) follow it.
 * Errors name the key and, from a file, the line: `relay.dispatchers (line 4): 0 is outside
 * 1..64`. Unknown keys, wrong types, a key given twice, a NUL byte inside a value and a second
 * YAML document are errors, never ignored or cut short; values are echoed in messages only in
 * printable form. The JSON dump (obx_config_dump) is itself a valid configuration file.
 */
#include "drivers/config.h"
#include "drivers/log.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef enum { K_STR, K_INT, K_BOOL, K_LIST, K_MAP } kind;

typedef struct key {
    const char *name;
    kind k;
    size_t off;
    size_t cap; /* K_STR: buffer size */
    int64_t min, max;
    bool secret;
    const char *def;    /* the default as typed (obx_config_new applies it); NULL: empty */
    const char *values; /* K_STR with a fixed set: "text|json"; NULL: any */
    const char *help;   /* one or two sentences: the man page and `obx help config` */
} key;

#define S(name, field, def, values, help)                                                          \
    {                                                                                              \
        name, K_STR, offsetof(obx_config, field), sizeof(((obx_config *)0)->field), 0, 0, false,   \
            def, values, help                                                                      \
    }
#define I(name, field, lo, hi, def, help)                                                          \
    { name, K_INT, offsetof(obx_config, field), 0, lo, hi, false, def, NULL, help }
#define B(name, field, def, help)                                                                  \
    { name, K_BOOL, offsetof(obx_config, field), 0, 0, 1, false, def, NULL, help }
#define L(name, field, help)                                                                       \
    { name, K_LIST, offsetof(obx_config, field), 0, 0, 0, false, NULL, NULL, help }
#define M(name, field, help)                                                                       \
    { name, K_MAP, offsetof(obx_config, field), 0, 0, 0, false, NULL, NULL, help }
#define YEAR_MS INT64_C(31536000000)

/* The whole schema: the parser, obx_config_new's defaults, the dump and the reference that
 * `man obx` and `obx help config` print (obx_config_reference) all read this one table. */
static const key keys[] = {
    S("db", db, "sqlite:obx.db", NULL, "The outbox store: sqlite:PATH or postgres://..."),
    S("broker", broker, "log:obx-broker.db", NULL,
      "The broker: log:PATH, kafka://HOST:PORT[,...] or amqp(s)://USER:PASS@HOST:PORT/VHOST."),
    M("broker_properties", broker_props,
      "name: value pairs passed to the broker backend (librdkafka, rabbitmq-c properties)."),
    S("relay.id", relay_id, NULL, NULL,
      "The relay's name in claims and audit rows; empty: HOST:PID."),
    I("relay.dispatchers", dispatchers, 1, 64, "2",
      "Dispatcher threads; beyond the first they claim only under a backlog, and only the first "
      "waits for commits (LISTEN)."),
    I("relay.batch", batch, 1, 10000, "256", "Events per claim, sweep and reconcile step."),
    I("relay.max_payload", max_payload, 0, 268435456, "0",
      "The largest payload the relay reads and sends, in bytes; 0: the outbox's payload limit "
      "(PostgreSQL: obx_meta's payload_limit, default 1 MiB; SQLite: 1 MiB). A larger event is "
      "parked with an audit row and an ALARM log record, never read whole nor sent."),
    I("relay.window", window, 1, 100000, "2048", "In-flight messages per dispatcher at most."),
    I("relay.lease_ms", lease_ms, 100, 86400000, "30000", "The claim and SENDING lease."),
    I("relay.reconcile_lease_ms", reconcile_lease_ms, 100, 86400000, "30000",
      "The reconciler's claim on an UNKNOWN event."),
    I("relay.recheck_ms", recheck_ms, 10, 86400000, "5000",
      "The next lookup after a broker could not tell (grows to relay.recheck_max_ms)."),
    I("relay.recheck_max_ms", recheck_max_ms, 10, 86400000, "300000",
      "The longest wait between lookups."),
    I("relay.backoff_base_ms", backoff_base_ms, 1, 86400000, "500",
      "After a definite rejection: retry after base * 2^(n-1), plus or minus 20%."),
    I("relay.backoff_max_ms", backoff_max_ms, 1, 86400000, "60000",
      "The longest backoff (at least relay.backoff_base_ms)."),
    I("relay.poll_ms", poll_ms, 1, 60000, "50",
      "The idle wait between claims (PostgreSQL: a commit's NOTIFY wakes the relay sooner)."),
    I("relay.sweep_ms", sweep_ms, 10, 3600000, "1000",
      "How often expired SENDING leases become DISPATCH_UNKNOWN."),
    I("relay.reconcile_ms", reconcile_ms, 10, 3600000, "1000", "How often the reconciler runs."),
    I("relay.heartbeat_ms", heartbeat_ms, 100, 600000, "10000",
      "How often the relay says it serves its cluster; it counts as serving it until three "
      "heartbeats are missed (obx status: clusters nobody serves)."),
    I("relay.drain_ms", drain_ms, 0, 600000, "10000",
      "On stop: how long to wait for in-flight acknowledgements."),
    B("relay.reconciler", reconciler, "true", "Run the reconciler in this relay."),
    L("relay.aliases", aliases, "The dispatcher aliases this relay serves; empty: all."),
    B("relay.shadow", shadow, "false",
      "Claim and send nothing; compare with what another dispatcher published "
      "(docs/migration.md)."),
    S("relay.shadow_feed", shadow_feed, NULL, NULL,
      "A receipts feed (JSON lines) to compare with instead of the broker (with relay.shadow)."),
    I("relay.shadow_interval_ms", shadow_interval_ms, 100, 86400000, "10000",
      "One shadow comparison per interval."),
    I("relay.shadow_grace_ms", shadow_grace_ms, 0, YEAR_MS, "60000",
      "Younger events are not missing yet."),
    I("relay.shadow_window_ms", shadow_window_ms, 1000, YEAR_MS, "3600000",
      "Events committed within this window are compared."),
    L("relay.shadow_topics", shadow_topics,
      "Also read these topics (to see misrouted publications)."),
    I("connect.retry_initial_ms", retry_initial_ms, 10, 3600000, "500",
      "A database or broker that is not there yet or went away is waited for: the first wait "
      "between tries, doubling per failed try (each drawn from its upper half: jitter)."),
    I("connect.retry_max_ms", retry_max_ms, 10, 86400000, "15000",
      "The longest wait between tries (at least connect.retry_initial_ms)."),
    S("http.listen", http_listen, NULL, NULL,
      "ADDR:PORT for /healthz, /readyz, /metrics, the dashboard and its API; empty: no HTTP "
      "server; port 0 picks a free one."),
    S("http.token_file", http_token_file, NULL, NULL,
      "The bearer token for mutating requests (requeue, re-drive, resolve)."),
    L("http.allowed_hosts", http_allowed_hosts,
      "With a loopback http.listen: Host names served besides 127.0.0.0/8 addresses, [::1] and "
      "localhost (each compared whole, any port); others get 403 (DNS rebinding)."),
    I("http.max_connections", http_max_connections, 1, 1000000, "4096",
      "Open HTTP connections at most (epoll: RLIMIT_NOFILE is the bound)."),
    I("http.max_connections_per_ip", http_max_connections_per_ip, 0, 1000000, "256",
      "Open HTTP connections from one address at most; 0: no limit."),
    I("http.series_interval_ms", series_interval_ms, 100, 3600000, "5000",
      "The dashboard's charts: one sample per interval."),
    I("http.series_points", series_points, 2, 100000, "720",
      "The dashboard's charts: samples kept (720 at 5 s: an hour)."),
    S("log.format", log_format, "text", "text|json",
      "text: one line per record; json: one JSON object per line, every line the relay writes."),
    S("log.level", log_level, "info", "debug|info|warn|error", "The least level written."),
    I("log.fold_after", log_fold_after, 0, 1000000, "20",
      "Per-event records of one kind written one by one per window; past it one line counts the "
      "rest (the metrics count every event); 0: never fold."),
    I("log.fold_interval_ms", log_fold_interval_ms, 100, 3600000, "10000",
      "The window of log.fold_after."),
    S("otel.endpoint", otel_endpoint, NULL, NULL,
      "OpenTelemetry: the OTLP/HTTP collector to send spans to (http://HOST:4318; /v1/traces is "
      "added); empty: no spans."),
    S("otel.service_name", otel_service, "obx", NULL,
      "OpenTelemetry: the resource's service.name on every span."),
    I("otel.queue_max", otel_queue_max, 1, 1000000, "4096",
      "OpenTelemetry: spans waiting for export at most; past it new spans are dropped and "
      "counted (obx_otel_spans_dropped_total)."),
    I("otel.export_interval_ms", otel_interval_ms, 10, 3600000, "1000",
      "OpenTelemetry: the longest a span waits before its batch is sent."),
    I("otel.timeout_ms", otel_timeout_ms, 100, 600000, "5000",
      "OpenTelemetry: one export request's time limit; a failed batch is dropped and counted."),
    S("encryption.keys", enc_keys, NULL, NULL,
      "The key ring of encrypted routes (obx route set --encrypt KEY_ID): ${file:PATH} or ${NAME} "
      "holding KEY_ID=HEX64 lines; payloads are sealed with AES-256-GCM before the send "
      "(docs/security.md); empty: an encrypted route's events are parked, never sent."),
    L("audit.critical_consumers", critical_consumers,
      "ID=URL of each consumer that must consume every event (its inbox database): the audit, "
      "retention, lag and poison in /metrics and the dashboard, receipts in traces."),
    I("audit.pending_max_age_ms", pending_max_age_ms, 0, YEAR_MS, "300000",
      "PENDING or CLAIMED older than this is a finding; 0: off."),
    I("audit.unconsumed_max_age_ms", unconsumed_max_age_ms, 0, YEAR_MS, "900000",
      "PUBLISHED without a critical consumer's receipt for longer is a finding; 0: off."),
    I("audit.unknown_max_age_ms", unknown_max_age_ms, 0, YEAR_MS, "900000",
      "An UNKNOWN outcome older than this is a finding; 0: off."),
    I("audit.interval_ms", audit_interval_ms, 0, 86400000, "60000",
      "The relay's audit period (counts on /metrics); 0: off."),
    I("audit.max_ids", audit_max_ids, 1, 10000, "20", "Event IDs listed per finding."),
    I("audit.max_scan", audit_max_scan, 1, 100000000, "100000",
      "PUBLISHED events checked against the inboxes per audit."),
    I("audit.broker_scan_window_ms", audit_scan_window_ms, 0, YEAR_MS, "3600000",
      "The bypass check reads broker messages this recent; 0: all."),
    I("retention.replay_window_ms", replay_window_ms, 0, YEAR_MS, "604800000",
      "Payloads stay at least this long after publication (7 days)."),
    I("retention.batch", purge_batch, 1, 100000, "500", "Events per purge transaction."),
    I("retention.interval_ms", purge_interval_ms, 0, 86400000, "0",
      "The relay's purge period; 0: off (obx purge from cron works too)."),
    I("retention.max_rate", purge_max_rate, 0, 10000000, "0",
      "Purge pace in events per second; 0: as fast as the database goes."),
};
#undef S
#undef I
#undef B
#undef L
#undef M
#undef YEAR_MS

static const key *find_key(const char *name) {
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

static void strv_free(obx__strv *v) {
    for (size_t i = 0; i < v->n; i++) free(v->v[i]);
    free(v->v);
    v->v = NULL;
    v->n = 0;
}

static obx_err strv_push(obx__strv *v, const char *s) {
    char **p = realloc(v->v, (v->n + 1) * sizeof *p);
    if (!p) return obx__fail(OBX_ENOMEM, "config: out of memory");
    v->v = p;
    if (!(v->v[v->n] = obx__strdup(s))) return obx__fail(OBX_ENOMEM, "config: out of memory");
    v->n++;
    return OBX_OK;
}

static obx_err set_scalar(obx_config *c, const key *k, const char *v, int line);

obx_err obx_config_new(obx_config **out) {
    if (!out) return obx__fail(OBX_EINVAL, "out: NULL");
    obx_config *c = calloc(1, sizeof *c);
    if (!c) return obx__fail(OBX_ENOMEM, "config: out of memory");
    /* the table's defaults, parsed as a file's values would be */
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        obx_err e = keys[i].def ? set_scalar(c, &keys[i], keys[i].def, 0) : OBX_OK;
        if (e) {
            obx_config_free(c);
            return obx__fail_prefix(OBX_EINTERNAL, "configuration default");
        }
    }
    *out = c;
    return OBX_OK;
}

void obx_config_free(obx_config *c) {
    if (!c) return;
    strv_free(&c->broker_props);
    strv_free(&c->aliases);
    strv_free(&c->critical_consumers);
    strv_free(&c->shadow_topics);
    free(c);
}

obx_err obx__config_copy(const obx_config *src, obx_config **out) {
    obx_config *c = malloc(sizeof *c);
    if (!c) return obx__fail(OBX_ENOMEM, "config: out of memory");
    *c = *src;
    c->broker_props = (obx__strv){0};
    c->aliases = (obx__strv){0};
    c->critical_consumers = (obx__strv){0};
    c->shadow_topics = (obx__strv){0};
    obx_err e = OBX_OK;
    for (size_t i = 0; !e && i < src->broker_props.n; i++)
        e = strv_push(&c->broker_props, src->broker_props.v[i]);
    for (size_t i = 0; !e && i < src->aliases.n; i++) e = strv_push(&c->aliases, src->aliases.v[i]);
    for (size_t i = 0; !e && i < src->critical_consumers.n; i++)
        e = strv_push(&c->critical_consumers, src->critical_consumers.v[i]);
    for (size_t i = 0; !e && i < src->shadow_topics.n; i++)
        e = strv_push(&c->shadow_topics, src->shadow_topics.v[i]);
    if (e) {
        obx_config_free(c);
        return e;
    }
    *out = c;
    return OBX_OK;
}

static obx_err where(obx_err e, const char *name, int line) {
    if (line > 0) return obx__fail_prefix(e, "%s (line %d)", name, line);
    return obx__fail_prefix(e, "%s", name);
}

/* v is one of the '|'-separated values (a key with a fixed set: log.format, log.level). */
static bool one_of(const char *values, const char *v) {
    size_t n = strlen(v);
    for (const char *p = values; *p;) {
        size_t len = strcspn(p, "|");
        if (len == n && !strncmp(p, v, n)) return true;
        p += len + (p[len] == '|');
    }
    return false;
}

/* Sets a scalar-typed key from text. */
static obx_err set_scalar(obx_config *c, const key *k, const char *v, int line) {
    char *base = (char *)c + k->off;
    /* values are UTF-8 text: a control byte in a URL or a path is a mistake (or an attack on
     * whoever reads the dump in a terminal), never meant */
    if (obx__check_field("value", v, 0, SIZE_MAX, OBX__CS_TEXT)) {
        char msg[512];
        obx__strlcpy(msg, obx_errmsg(), sizeof msg);
        return where(obx__fail(OBX_ECONFIG, "%s", msg), k->name, line);
    }
    switch (k->k) {
    case K_STR:
        if (strlen(v) >= k->cap)
            return where(
                obx__fail(OBX_ECONFIG, "%zu bytes, over the limit of %zu", strlen(v), k->cap - 1),
                k->name, line);
        if (k->values && !one_of(k->values, v)) {
            char shown[64];
            return where(obx__fail(OBX_ECONFIG, "'%s' is not one of %s",
                                   obx__printable(v, strlen(v), shown, sizeof shown), k->values),
                         k->name, line);
        }
        strcpy(base, v);
        return OBX_OK;
    case K_INT: {
        char *end, shown[64];
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno)
            return where(obx__fail(OBX_ECONFIG, "'%s' is not an integer",
                                   obx__printable(v, strlen(v), shown, sizeof shown)),
                         k->name, line);
        if (x < k->min || x > k->max)
            return where(obx__fail(OBX_ECONFIG, "%lld is outside %lld..%lld", x, (long long)k->min,
                                   (long long)k->max),
                         k->name, line);
        *(int64_t *)(void *)base = x;
        return OBX_OK;
    }
    case K_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on") || !strcmp(v, "1"))
            *(int64_t *)(void *)base = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off") || !strcmp(v, "0"))
            *(int64_t *)(void *)base = 0;
        else {
            char shown[64];
            return where(obx__fail(OBX_ECONFIG, "'%s' is not a boolean (true/false)",
                                   obx__printable(v, strlen(v), shown, sizeof shown)),
                         k->name, line);
        }
        return OBX_OK;
    case K_LIST: { /* from a flag: comma separated */
        obx__strv *sv = (obx__strv *)(void *)base;
        strv_free(sv);
        char *copy = obx__strdup(v);
        if (!copy) return obx__fail(OBX_ENOMEM, "config: out of memory");
        obx_err e = OBX_OK;
        for (char *save = NULL, *t = strtok_r(copy, ",", &save); t && !e;
             t = strtok_r(NULL, ",", &save))
            e = strv_push(sv, t);
        free(copy);
        return e;
    }
    case K_MAP: { /* from a flag: k=v[,k=v...] */
        obx__strv *sv = (obx__strv *)(void *)base;
        /* not echoed: it may be a password typed without its key */
        if (!strchr(v, '=') || v[0] == '=')
            return where(obx__fail(OBX_ECONFIG, "an entry is not key=value"), k->name, line);
        return strv_push(sv, v);
    }
    }
    return OBX_OK;
}

obx_err obx_config_set(obx_config *c, const char *name, const char *value) {
    if (!c || !name || !value) return obx__fail(OBX_EINVAL, "config: NULL argument");
    const key *k = find_key(name);
    if (!k) return obx__fail(OBX_ECONFIG, "%s: unknown configuration key", name);
    return set_scalar(c, k, value, 0);
}

obx_err obx_config_append(obx_config *c, const char *name, const char *value) {
    if (!c || !name || !value) return obx__fail(OBX_EINVAL, "config: NULL argument");
    const key *k = find_key(name);
    if (!k) return obx__fail(OBX_ECONFIG, "%s: unknown configuration key", name);
    if (k->k != K_LIST && k->k != K_MAP)
        return obx__fail(OBX_ECONFIG, "%s: not a list (set it with obx_config_set)", name);
    if (!*value) return obx__fail(OBX_ECONFIG, "%s: empty item", name);
    if (k->k == K_MAP && !strchr(value, '='))
        return obx__fail(OBX_ECONFIG, "%s: '%s' is not key=value", name, value);
    return strv_push((obx__strv *)(void *)((char *)c + k->off), value);
}

/* ---- YAML ---------------------------------------------------------------------------------- */

typedef struct ynode {
    yaml_node_type_t t;
    int line;
} ynode;

static obx_err load_node(obx_config *c, yaml_document_t *doc, yaml_node_t *n, const char *prefix);

/* libyaml keeps "\0" escapes inside a scalar's bytes: C strings would silently cut the value
 * there (a URL, a path), so such a value is refused. */
static bool has_nul(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE &&
           strlen((const char *)n->data.scalar.value) != n->data.scalar.length;
}

/* One item of a YAML list, held to the same rules as a value. */
static obx_err set_list_item(obx__strv *sv, const key *k, const char *v, int line) {
    if (obx__check_field("item", v, 0, SIZE_MAX, OBX__CS_TEXT)) {
        char msg[512];
        obx__strlcpy(msg, obx_errmsg(), sizeof msg);
        return where(obx__fail(OBX_ECONFIG, "%s", msg), k->name, line);
    }
    return strv_push(sv, v);
}

static obx_err load_value(obx_config *c, yaml_document_t *doc, const key *k, yaml_node_t *v) {
    int line = (int)v->start_mark.line + 1;
    if (k->k == K_LIST) {
        if (v->type != YAML_SEQUENCE_NODE)
            return where(obx__fail(OBX_ECONFIG, "expected a list"), k->name, line);
        obx__strv *sv = (obx__strv *)(void *)((char *)c + k->off);
        strv_free(sv);
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
             it++) {
            yaml_node_t *item = yaml_document_get_node(doc, *it);
            if (!item || item->type != YAML_SCALAR_NODE)
                return where(obx__fail(OBX_ECONFIG, "list items must be scalars"), k->name, line);
            if (has_nul(item))
                return where(obx__fail(OBX_ECONFIG, "a list item contains a NUL byte"), k->name,
                             (int)item->start_mark.line + 1);
            obx_err e = set_list_item(sv, k, (const char *)item->data.scalar.value,
                                      (int)item->start_mark.line + 1);
            if (e) return e;
        }
        return OBX_OK;
    }
    if (k->k == K_MAP) {
        obx__strv *sv = (obx__strv *)(void *)((char *)c + k->off);
        if (v->type == YAML_SEQUENCE_NODE) { /* ["name=value", ...], as obx_config_dump writes */
            strv_free(sv);
            for (yaml_node_item_t *it = v->data.sequence.items.start;
                 it < v->data.sequence.items.top; it++) {
                yaml_node_t *item = yaml_document_get_node(doc, *it);
                int il = item ? (int)item->start_mark.line + 1 : line;
                if (!item || item->type != YAML_SCALAR_NODE || has_nul(item))
                    return where(obx__fail(OBX_ECONFIG, "list items must be name=value scalars"),
                                 k->name, il);
                obx_err e = set_scalar(c, k, (const char *)item->data.scalar.value, il);
                if (e) return e;
            }
            return OBX_OK;
        }
        if (v->type != YAML_MAPPING_NODE)
            return where(obx__fail(OBX_ECONFIG, "expected a mapping of name: value"), k->name,
                         line);
        strv_free(sv);
        for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top;
             p++) {
            yaml_node_t *kn = yaml_document_get_node(doc, p->key);
            yaml_node_t *vn = yaml_document_get_node(doc, p->value);
            if (!kn || !vn || kn->type != YAML_SCALAR_NODE || vn->type != YAML_SCALAR_NODE ||
                !kn->data.scalar.length || has_nul(kn) || has_nul(vn))
                return where(obx__fail(OBX_ECONFIG, "entries must be name: scalar (no NUL byte)"),
                             k->name, (int)(kn ? kn->start_mark.line : 0) + 1);
            char *kv = obx__asprintf("%s=%s", (const char *)kn->data.scalar.value,
                                     (const char *)vn->data.scalar.value);
            if (!kv) return obx__fail(OBX_ENOMEM, "config: out of memory");
            obx_err e = set_scalar(c, k, kv, (int)kn->start_mark.line + 1);
            free(kv);
            if (e) return e;
        }
        return OBX_OK;
    }
    if (v->type != YAML_SCALAR_NODE)
        return where(obx__fail(OBX_ECONFIG, "expected a single value, found a %s",
                               v->type == YAML_MAPPING_NODE ? "mapping" : "list"),
                     k->name, line);
    if (has_nul(v)) return where(obx__fail(OBX_ECONFIG, "contains a NUL byte"), k->name, line);
    return set_scalar(c, k, (const char *)v->data.scalar.value, line);
}

static obx_err load_node(obx_config *c, yaml_document_t *doc, yaml_node_t *n, const char *prefix) {
    if (n->type != YAML_MAPPING_NODE)
        return obx__fail(OBX_ECONFIG, "%s (line %d): expected a mapping of keys",
                         *prefix ? prefix : "configuration", (int)n->start_mark.line + 1);
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        if (!kn || !vn || kn->type != YAML_SCALAR_NODE || has_nul(kn))
            return obx__fail(OBX_ECONFIG, "configuration (line %d): keys must be scalars",
                             (int)(kn ? kn->start_mark.line : 0) + 1);
        const char *kv = (const char *)kn->data.scalar.value;
        for (yaml_node_pair_t *q = n->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *qk = yaml_document_get_node(doc, q->key);
            if (qk && qk->type == YAML_SCALAR_NODE &&
                !strcmp((const char *)qk->data.scalar.value, kv)) {
                char shown[160];
                return obx__fail(OBX_ECONFIG, "%s%s%s (line %d): given twice (first on line %d)",
                                 prefix, *prefix ? "." : "",
                                 obx__printable(kv, strlen(kv), shown, sizeof shown),
                                 (int)kn->start_mark.line + 1, (int)qk->start_mark.line + 1);
            }
        }
        char name[256];
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", kv);
        const key *k = find_key(name);
        if (k) {
            obx_err e = load_value(c, doc, k, vn);
            if (e) return e;
            continue;
        }
        /* a section? (some key starts with "name.") */
        bool section = false;
        size_t nl = strlen(name);
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strncmp(keys[i].name, name, nl) && keys[i].name[nl] == '.') section = true;
        if (!section) {
            char shown[160];
            return obx__fail(OBX_ECONFIG, "%s (line %d): unknown configuration key",
                             obx__printable(name, strlen(name), shown, sizeof shown),
                             (int)kn->start_mark.line + 1);
        }
        obx_err e = load_node(c, doc, vn, name);
        if (e) return e;
    }
    return OBX_OK;
}

obx_err obx_config_load(const char *path, obx_config **out) {
    if (!path || !out) return obx__fail(OBX_EINVAL, "config: NULL argument");
    obx__clear_error();
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return obx__fail(OBX_ECONFIG, "%s: cannot open: %s", path, strerror(errno));
    obx_config *c;
    obx_err e = obx_config_new(&c);
    if (e) {
        fclose(f);
        return e;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        e = obx__fail(OBX_ECONFIG, "%s (line %d): YAML: %s", path,
                      (int)parser.problem_mark.line + 1,
                      parser.problem ? parser.problem : "syntax error");
    } else {
        yaml_node_t *root = yaml_document_get_root_node(&doc);
        if (root) e = load_node(c, &doc, root, "");
        yaml_document_delete(&doc);
        /* a second document would be ignored by a reader that stops at the first: refuse */
        if (!e && root) {
            yaml_document_t next;
            if (!yaml_parser_load(&parser, &next))
                e = obx__fail(OBX_ECONFIG, "(line %d): YAML: %s", (int)parser.problem_mark.line + 1,
                              parser.problem ? parser.problem : "syntax error");
            else {
                yaml_node_t *r2 = yaml_document_get_root_node(&next);
                if (r2)
                    e = obx__fail(OBX_ECONFIG,
                                  "(line %d): a second YAML document; a configuration is one",
                                  (int)r2->start_mark.line + 1);
                yaml_document_delete(&next);
            }
        }
        if (e) obx__fail_prefix(e, "%s", path);
    }
    yaml_parser_delete(&parser);
    fclose(f);
    if (!e) e = obx__config_check(c);
    if (e) {
        obx_config_free(c);
        return e;
    }
    *out = c;
    return OBX_OK;
}

/* A field check's message, as a configuration error (one code for every bad setting). */
static obx_err as_config_error(void) {
    char msg[512];
    obx__strlcpy(msg, obx_errmsg(), sizeof msg);
    return obx__fail(OBX_ECONFIG, "%s", msg);
}

obx_err obx__config_check(const obx_config *c) {
    obx_err e;
    if ((e = obx_url_check(c->db, "store"))) return obx__fail_prefix(e, "db");
    if ((e = obx_url_check(c->broker, "broker"))) return obx__fail_prefix(e, "broker");
    if (c->relay_id[0] && obx__check_field("relay.id", c->relay_id, 1, 200, OBX__CS_OWNER))
        return as_config_error();
    if (c->backoff_max_ms < c->backoff_base_ms)
        return obx__fail(OBX_ECONFIG,
                         "relay.backoff_max_ms (%lld) is below relay.backoff_base_ms "
                         "(%lld)",
                         (long long)c->backoff_max_ms, (long long)c->backoff_base_ms);
    if (c->retry_max_ms < c->retry_initial_ms)
        return obx__fail(OBX_ECONFIG,
                         "connect.retry_max_ms (%lld) is below connect.retry_initial_ms (%lld)",
                         (long long)c->retry_max_ms, (long long)c->retry_initial_ms);
    for (size_t i = 0; i < c->aliases.n; i++)
        if (obx__check_field("relay.aliases", c->aliases.v[i], 1, OBX_NAME_MAX, OBX__CS_NAME))
            return as_config_error();
    for (size_t i = 0; i < c->shadow_topics.n; i++)
        if (obx__check_field("relay.shadow_topics", c->shadow_topics.v[i], 1, OBX_TOPIC_MAX,
                             OBX__CS_NAME))
            return as_config_error();
    if (c->shadow_feed[0] && !c->shadow)
        return obx__fail(OBX_ECONFIG, "relay.shadow_feed: given, but relay.shadow is false");
    for (size_t i = 0; i < c->broker_props.n; i++)
        if (!strchr(c->broker_props.v[i], '='))
            return obx__fail(OBX_ECONFIG, "broker_properties: '%s' is not key=value",
                             c->broker_props.v[i]);
    /* critical consumers: "ID=URL", ID as an inbox consumer_id, URL a store, IDs distinct */
    for (size_t i = 0; i < c->critical_consumers.n; i++) {
        const char *item = c->critical_consumers.v[i], *eq = strchr(item, '=');
        char id[OBX_NAME_MAX + 2];
        if (!eq || eq == item)
            return obx__fail(OBX_ECONFIG,
                             "audit.critical_consumers[%zu]: '%.60s' is not ID=URL (e.g. "
                             "projection=sqlite:consumer.db)",
                             i, item);
        size_t idl = (size_t)(eq - item);
        if (idl > OBX_NAME_MAX)
            return obx__fail(OBX_ECONFIG,
                             "audit.critical_consumers[%zu]: consumer ID of %zu bytes, over the "
                             "limit of %d",
                             i, idl, OBX_NAME_MAX);
        memcpy(id, item, idl);
        id[idl] = '\0';
        /* a bad ID is a configuration error; a bad URL keeps OBX_EURL */
        if (obx__check_field("consumer ID", id, 1, OBX_NAME_MAX, OBX__CS_NAME))
            return obx__fail_prefix(OBX_ECONFIG, "audit.critical_consumers[%zu]", i);
        if ((e = obx_url_check(eq + 1, "store")))
            return obx__fail_prefix(e, "audit.critical_consumers[%zu]", i);
        for (size_t j = 0; j < i; j++) {
            const char *o = c->critical_consumers.v[j];
            if (!strncmp(o, item, idl + 1))
                return obx__fail(OBX_ECONFIG,
                                 "audit.critical_consumers[%zu]: consumer ID '%s' is declared "
                                 "twice",
                                 i, id);
        }
    }
    return OBX_OK;
}

/* "name=value" as a dump shows it: the value of a secret property becomes "***" (a ${...}
 * reference is shown: it names where the secret is, not what it is). */
static json_t *prop_json(const char *kv) {
    const char *eq = strchr(kv, '=');
    char name[256];
    size_t kl = eq ? (size_t)(eq - kv) : strlen(kv);
    if (kl >= sizeof name) kl = sizeof name - 1;
    memcpy(name, kv, kl);
    name[kl] = '\0';
    const char *v = eq ? eq + 1 : "";
    if (!obx__secret_key(name) ||
        (!strncmp(v, "${", 2) && v[strlen(v) - 1] == '}' && !strchr(v + 2, '}')[1]))
        return json_string(kv);
    char *red = obx__asprintf("%s=***", name);
    json_t *j = red ? json_string(red) : NULL;
    free(red);
    return j;
}

obx_err obx_config_dump(const obx_config *c, char **out) {
    if (!c || !out) return obx__fail(OBX_EINVAL, "config: NULL argument");
    json_t *o = json_object();
    for (size_t i = 0; o && i < sizeof keys / sizeof keys[0]; i++) {
        const key *k = &keys[i];
        const char *base = (const char *)c + k->off;
        json_t *v = NULL;
        if (k->k == K_STR) {
            char *red = NULL;
            if ((!strcmp(k->name, "db") || !strcmp(k->name, "broker")) &&
                obx_url_redact(base, &red) == OBX_OK) {
                v = json_string(red);
                free(red);
            } else if (!strcmp(k->name, "encryption.keys") && base[0] && strncmp(base, "${", 2))
                v = json_string("***"); /* keys written inline: never shown */
            else
                v = json_string(base);
        } else if (k->k == K_INT)
            v = json_integer(*(const int64_t *)(const void *)base);
        else if (k->k == K_BOOL)
            v = json_boolean(*(const int64_t *)(const void *)base);
        else {
            const obx__strv *sv = (const obx__strv *)(const void *)base;
            v = json_array();
            for (size_t j = 0; j < sv->n; j++) {
                const char *eq = strchr(sv->v[j], '=');
                char *red = NULL;
                /* "ID=URL": the URL may carry a password (an unparsable one is hidden whole) */
                if (!strcmp(k->name, "audit.critical_consumers") && eq) {
                    if (obx_url_redact(eq + 1, &red) != OBX_OK) red = NULL;
                    char *item =
                        obx__asprintf("%.*s=%s", (int)(eq - sv->v[j]), sv->v[j], red ? red : "***");
                    json_array_append_new(v, json_string(item ? item : "(redacted)"));
                    free(item);
                    free(red);
                    continue;
                }
                json_array_append_new(v,
                                      k->k == K_MAP ? prop_json(sv->v[j]) : json_string(sv->v[j]));
            }
        }
        json_object_set_new(o, k->name, v);
    }
    return obx__json_out(o, out);
}

obx_err obx_config_get(const obx_config *c, const char *name, char **out) {
    if (!c || !name || !out) return obx__fail(OBX_EINVAL, "config: NULL argument");
    *out = NULL;
    const key *k = find_key(name);
    if (!k) return obx__fail(OBX_ECONFIG, "%s: unknown configuration key", name);
    const char *base = (const char *)c + k->off;
    obx__buf b = {0};
    switch (k->k) {
    case K_STR: obx__buf_puts(&b, base); break;
    case K_INT: obx__buf_printf(&b, "%lld", (long long)*(const int64_t *)(const void *)base); break;
    case K_BOOL: obx__buf_puts(&b, *(const int64_t *)(const void *)base ? "true" : "false"); break;
    case K_LIST:
    case K_MAP: {
        const obx__strv *sv = (const obx__strv *)(const void *)base;
        for (size_t i = 0; i < sv->n; i++) {
            if (i) obx__buf_put(&b, "\n", 1);
            obx__buf_puts(&b, sv->v[i]);
        }
        break;
    }
    }
    obx__buf_put(&b, "", 1);
    if (b.oom) {
        obx__buf_free(&b);
        return obx__fail(OBX_ENOMEM, "config: out of memory");
    }
    *out = (char *)b.data;
    return OBX_OK;
}

obx_err obx_config_reference(char **out) {
    if (!out) return obx__fail(OBX_EINVAL, "config: NULL argument");
    static const char *const types[] = {"string", "integer", "boolean", "list", "map"};
    json_t *a = json_array();
    for (size_t i = 0; a && i < sizeof keys / sizeof keys[0]; i++) {
        const key *k = &keys[i];
        json_t *o = json_pack("{s:s,s:s,s:s}", "key", k->name, "type", types[k->k], "default",
                              k->def ? k->def : "");
        if (o && k->k == K_INT) {
            json_object_set_new(o, "min", json_integer((json_int_t)k->min));
            json_object_set_new(o, "max", json_integer((json_int_t)k->max));
        }
        if (o && k->values) json_object_set_new(o, "values", json_string(k->values));
        if (o) json_object_set_new(o, "help", json_string(k->help));
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            a = NULL;
        }
    }
    if (!a) return obx__fail(OBX_ENOMEM, "config: out of memory");
    return obx__json_out(a, out);
}

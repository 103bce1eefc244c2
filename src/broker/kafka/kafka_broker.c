/*
 * kafka_broker.c — the Kafka broker backend (librdkafka). It owns:
 *   - the configuration: librdkafka properties passed through from the URL query and the
 *     `props` array, minus the ones obx owns (refused by name), plus obx's own `obx.*` knobs;
 *   - the cluster identity: the logical name receipts carry (`cluster=`/`obx.cluster`, default
 *     the Kafka cluster ID) and the real Kafka cluster ID, read and checked at open;
 *   - an idempotent producer (acks=all) that sends each attempt to its pinned partition with
 *     the obx headers, and maps every delivery report to exactly one outcome;
 *   - the lookup/scan reader: an assign-only consumer handle that reads a bounded offset range;
 *   - the inbox consumer: a group member whose positions move only by consume_ack().
 *
 *   URL: kafka://HOST:PORT[,HOST:PORT...][?cluster=NAME&cluster_id=ID&<property>=<value>...]
 *
 * Delivery report mapping (rd_kafka_message_status decides what "definite" means):
 *   no error                                   -> ACK (cluster, topic, partition, offset, ts,
 *                                                 and identity/digests echoed from the headers
 *                                                 of the persisted message)
 *   a definite error and NOT_PERSISTED         -> REJECT (unknown topic/partition, too large,
 *                                                 invalid record, authorization, policy ...)
 *   any other error and NOT_PERSISTED          -> NOT_SENT (never reached a broker's log)
 *   POSSIBLY_PERSISTED (timeout, lost link...) -> UNKNOWN (the reconciler looks it up)
 *
 * Lookup (authoritative after the quiet time): scan the pinned partition from the first offset
 * whose timestamp is >= since - obx.lookup.skew.ms up to the high watermark read at lookup
 * time, matching the obx-event-id and obx-envelope-gen headers. Cost: three ListOffsets requests
 * (log start, high watermark, by time) plus Fetch requests for every message appended to the
 * partition since the attempt started (batched by librdkafka's fetch sizes); bounded by
 * obx.lookup.max.messages and obx.lookup.timeout.ms, past which the answer is CANNOT_TELL.
 * See docs/kafka.md.
 *
 * @locality One thread owns a handle (like every obx backend). librdkafka calls this file's
 * callbacks (delivery reports, errors) only from rd_kafka_poll() on the producer, which runs
 * inside kb_poll() and kb_close() on the owning thread; its internal threads never touch the
 * kafka_broker struct.
 */
#include "broker/broker.h"

#include <errno.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define KB_PROPS_MAX 128
#define KB_BATCH 256

typedef enum { SCOPE_ALL, SCOPE_PRODUCER, SCOPE_CONSUMER } prop_scope;

typedef struct kb_prop {
    prop_scope scope;
    char *key;
    char *value; /* wiped before it is freed: may be a password */
} kb_prop;

typedef struct kb_topic {
    char name[OBX_TOPIC_MAX + 1];
    rd_kafka_topic_t *rkt; /* producer's topic handle */
    int32_t partitions;    /* from metadata; 0 = unknown */
    int64_t partitions_at; /* monotonic ms of that answer */
} kb_topic;

typedef struct kb_committed {
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t next; /* the offset this consumer last committed (next to read) */
} kb_committed;

typedef struct kafka_broker {
    obx__broker base;
    char hosts[1024];
    char cluster[OBX_NAME_MAX + 1];   /* identity receipts carry */
    char kafka_id[OBX_NAME_MAX + 1];  /* the Kafka cluster ID verified at open */
    char expect_id[OBX_NAME_MAX + 1]; /* configured expected Kafka cluster ID, or "" */
    kb_prop *props;
    size_t n_props;
    /* obx.* knobs */
    int64_t open_timeout_ms, lookup_timeout_ms, lookup_max_msgs, skew_ms, meta_ttl_ms;
    char reader_group[OBX_NAME_MAX + 1];
    int64_t quiet_ms; /* message.timeout.ms + request.timeout.ms of the live producer */
    rd_kafka_t *prod;
    kb_topic *topics;
    size_t n_topics;
    /* outcomes not yet returned by kb_poll (FIFO) */
    obx__outcome *q;
    size_t nq, capq;
    size_t dr_pending; /* produced, delivery report not yet served */
    /* kb_wake_fd (made on first use): librdkafka writes a byte to wake[1] when the main
     * queue, which holds the delivery reports, goes from empty to not empty; kb_poll reads
     * wake[0] empty before it serves the queue, so no report can come unsignalled */
    rd_kafka_queue_t *wake_q;
    int wake[2];
    char live_id[OBX_NAME_MAX + 1]; /* cluster ID librdkafka holds at this poll ("" = unknown) */
    bool fatal;
    char fatal_reason[OBX_TEXT_MAX + 1];
    char last_error[OBX_TEXT_MAX + 1];
    /* lookup / scan reader (lazy) */
    rd_kafka_t *reader;
    rd_kafka_queue_t *reader_q;
    bool no_time_index; /* the broker answers timestamp ListOffsets with -1 (mock cluster) */
    /* inbox consumer (consume_open) */
    rd_kafka_t *cons;
    kb_committed *committed;
    size_t n_committed;
} kafka_broker;

/* ---- small helpers -------------------------------------------------------------------------- */

static int64_t remaining(int64_t deadline) {
    int64_t left = deadline - obx__mono_ms();
    return left > 0 ? left : 0;
}

static int ms_int(int64_t ms) { return ms > 0x7fffffff ? 0x7fffffff : (int)ms; }

static void wipe_free(char *s) {
    if (!s) return;
    volatile char *p = s;
    while (*p) *p++ = '\0';
    free(s);
}

/* Properties whose values are secrets: never echoed in a message, refused in the URL. */
static bool sensitive(const char *key) {
    return strstr(key, "password") || strstr(key, "secret") || strstr(key, ".pem") ||
           !strcmp(key, "ssl_key") || !strcmp(key, "sasl.username") ||
           !strcmp(key, "sasl.oauthbearer.config");
}

static bool is_true(const char *v) {
    return !strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "t") ||
           !strcasecmp(v, "yes");
}

static bool is_false(const char *v) {
    return !strcasecmp(v, "false") || !strcmp(v, "0") || !strcasecmp(v, "f") ||
           !strcasecmp(v, "no");
}

static bool acks_all(const char *v) { return !strcasecmp(v, "all") || !strcmp(v, "-1"); }

/* ---- configuration -------------------------------------------------------------------------- */

/* Properties obx sets itself. A property listed here is refused unless the user's value is the
 * one obx sets anyway (`ok` says which); the message names the property and why obx owns it. */
static obx_err check_owned(const char *key, const char *value) {
    struct owned {
        const char *key;
        bool (*ok)(const char *value);
        const char *why;
    };
    static const struct owned owned[] = {
        {"enable.idempotence", is_true,
         "obx needs the idempotent producer (no reordering or duplication by internal retries)"},
        {"acks", acks_all, "a receipt must mean every in-sync replica has the message"},
        {"request.required.acks", acks_all,
         "a receipt must mean every in-sync replica has the message"},
        {"enable.auto.commit", is_false,
         "the inbox commits a position only after its database transaction (consume_ack)"},
        {"enable.auto.offset.store", is_false,
         "the inbox commits a position only after its database transaction (consume_ack)"},
        {"partitioner", NULL,
         "obx pins every attempt to the partition of the route's frozen algorithm"},
        {"bootstrap.servers", NULL, "the brokers come from the kafka:// URL"},
        {"metadata.broker.list", NULL, "the brokers come from the kafka:// URL"},
        {"group.id", NULL, "the inbox consumer's group is given to consume_open"},
        {"transactional.id", NULL,
         "obx does not use Kafka transactions (receipts would precede visibility)"},
    };
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
        if (strcmp(key, owned[i].key)) continue;
        if (owned[i].ok && owned[i].ok(value)) return OBX_OK;
        return obx__fail(OBX_ECONFIG, "kafka property '%s' is owned by obx and cannot be set%s: %s",
                         key, owned[i].ok ? " to that value" : "", owned[i].why);
    }
    if (!strcmp(key, "message.timeout.ms") || !strcmp(key, "delivery.timeout.ms")) {
        char *end;
        long v = strtol(value, &end, 10);
        if (*end || end == value || v < 1)
            return obx__fail(OBX_ECONFIG,
                             "kafka property '%s' must be a positive number of ms: with 0 "
                             "(infinite) an attempt never becomes quiet and an UNKNOWN outcome "
                             "can never be proven absent",
                             key);
    }
    if (!strcmp(key, "max.in.flight.requests.per.connection") || !strcmp(key, "max.in.flight")) {
        char *end;
        long v = strtol(value, &end, 10);
        if (*end || end == value || v < 1 || v > 5)
            return obx__fail(OBX_ECONFIG,
                             "kafka property '%s' must be 1..5: the idempotent producer keeps "
                             "per-partition order only up to 5 requests in flight",
                             key);
    }
    return OBX_OK;
}

static obx_err parse_knob(const char *key, const char *value, int64_t min, int64_t max,
                          int64_t *out) {
    char *end;
    long long v = strtoll(value, &end, 10);
    if (*end || end == value || v < min || v > max)
        return obx__fail(OBX_ECONFIG, "kafka option '%s'='%s': expected an integer in %lld..%lld",
                         key, value, (long long)min, (long long)max);
    *out = v;
    return OBX_OK;
}

/* Tries a property on a scratch configuration so that an unknown name or a bad value is
 * reported at open, naming the property (and never showing a secret value). */
static obx_err try_prop(const char *key, const char *value) {
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    char err[512];
    rd_kafka_conf_res_t r = rd_kafka_conf_set(c, key, value, err, sizeof err);
    rd_kafka_conf_destroy(c);
    if (r == RD_KAFKA_CONF_OK) return OBX_OK;
    if (r == RD_KAFKA_CONF_UNKNOWN)
        return obx__fail(OBX_ECONFIG, "kafka property '%s': librdkafka has no such property", key);
    if (sensitive(key))
        return obx__fail(OBX_ECONFIG, "kafka property '%s': invalid value (not shown)", key);
    return obx__fail(OBX_ECONFIG, "kafka property '%s': %s", key, err);
}

/* Adds "key=value" (from the URL when from_url) to the broker's configuration. */
static obx_err add_prop(kafka_broker *b, const char *key, const char *value, bool from_url) {
    if (!*key) return obx__fail(OBX_ECONFIG, "kafka configuration: empty property name");
    /* obx's own knobs */
    if (!strcmp(key, "cluster") || !strcmp(key, "obx.cluster")) {
        obx_err e = obx__check_field("cluster", value, 1, OBX_NAME_MAX, OBX__CS_NAME);
        if (!e) obx__strlcpy(b->cluster, value, sizeof b->cluster);
        return e;
    }
    if (!strcmp(key, "cluster_id") || !strcmp(key, "obx.cluster.id")) {
        obx_err e = obx__check_field("cluster_id", value, 1, OBX_NAME_MAX, OBX__CS_NAME);
        if (!e) obx__strlcpy(b->expect_id, value, sizeof b->expect_id);
        return e;
    }
    if (!strncmp(key, "obx.", 4)) {
        if (!strcmp(key, "obx.open.timeout.ms"))
            return parse_knob(key, value, 1, 3600000, &b->open_timeout_ms);
        if (!strcmp(key, "obx.lookup.timeout.ms"))
            return parse_knob(key, value, 1, 3600000, &b->lookup_timeout_ms);
        if (!strcmp(key, "obx.lookup.max.messages"))
            return parse_knob(key, value, 1, INT64_MAX / 2, &b->lookup_max_msgs);
        if (!strcmp(key, "obx.lookup.skew.ms"))
            return parse_knob(key, value, 0, 86400000, &b->skew_ms);
        if (!strcmp(key, "obx.metadata.ttl.ms"))
            return parse_knob(key, value, 0, 86400000, &b->meta_ttl_ms);
        if (!strcmp(key, "obx.lookup.group")) {
            obx_err e = obx__check_field(key, value, 1, OBX_NAME_MAX, OBX__CS_NAME);
            if (!e) obx__strlcpy(b->reader_group, value, sizeof b->reader_group);
            return e;
        }
        return obx__fail(OBX_ECONFIG,
                         "kafka option '%s' is unknown (obx.cluster, obx.cluster.id, "
                         "obx.open.timeout.ms, obx.lookup.timeout.ms, obx.lookup.max.messages, "
                         "obx.lookup.skew.ms, obx.lookup.group, obx.metadata.ttl.ms)",
                         key);
    }
    prop_scope scope = SCOPE_ALL;
    const char *name = key;
    if (!strncmp(key, "producer.", 9)) {
        scope = SCOPE_PRODUCER;
        name = key + 9;
    } else if (!strncmp(key, "consumer.", 9)) {
        scope = SCOPE_CONSUMER;
        name = key + 9;
    }
    if (from_url && sensitive(name))
        return obx__fail(OBX_ECONFIG,
                         "kafka property '%s' holds a secret: pass it as a backend property, "
                         "not in the URL",
                         name);
    obx_err e = check_owned(name, value);
    if (e || (e = try_prop(name, value))) return e;
    if (b->n_props == KB_PROPS_MAX)
        return obx__fail(OBX_ECONFIG, "kafka configuration: more than %d properties", KB_PROPS_MAX);
    kb_prop *p = &b->props[b->n_props];
    p->scope = scope;
    p->key = obx__strdup(name);
    p->value = obx__strdup(value);
    if (!p->key || !p->value) {
        free(p->key);
        wipe_free(p->value);
        return obx__fail(OBX_ENOMEM, "kafka configuration: out of memory");
    }
    b->n_props++;
    return OBX_OK;
}

static int unhex1(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* In-place %XX decoding of a query value. */
static bool pct_decode(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '%') {
            int h = p[1] ? unhex1(p[1]) : -1, l = h >= 0 && p[2] ? unhex1(p[2]) : -1;
            if (h < 0 || l < 0 || (h == 0 && l == 0)) return false;
            *o++ = (char)(h * 16 + l);
            p += 2;
        } else
            *o++ = *p;
    }
    *o = '\0';
    return true;
}

static obx_err parse_config(kafka_broker *b, const obx__url *u, const char *const *props,
                            size_t n_props) {
    char q[sizeof u->query];
    obx__strlcpy(q, u->query, sizeof q);
    for (char *save = NULL, *kv = strtok_r(q, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return obx__fail(OBX_EURL, "broker URL: kafka option '%s' needs a value", kv);
        *eq = '\0';
        if (!pct_decode(eq + 1))
            return obx__fail(OBX_EURL, "broker URL: kafka option '%s' has a bad %%-escape", kv);
        obx_err e = add_prop(b, kv, eq + 1, true);
        if (e) return e;
    }
    for (size_t i = 0; i < n_props; i++) {
        if (!props[i]) continue;
        const char *eq = strchr(props[i], '=');
        /* the text is not echoed: it may be a password typed without its key */
        if (!eq) return obx__fail(OBX_ECONFIG, "kafka property #%zu is not key=value", i + 1);
        char key[256];
        size_t kl = (size_t)(eq - props[i]);
        if (kl >= sizeof key)
            return obx__fail(OBX_ECONFIG, "kafka property #%zu: name too long", i + 1);
        memcpy(key, props[i], kl);
        key[kl] = '\0';
        obx_err e = add_prop(b, key, eq + 1, false);
        if (e) return e;
    }
    return OBX_OK;
}

static obx_err conf_set(rd_kafka_conf_t *c, const char *key, const char *value) {
    char err[512];
    if (rd_kafka_conf_set(c, key, value, err, sizeof err) == RD_KAFKA_CONF_OK) return OBX_OK;
    if (sensitive(key))
        return obx__fail(OBX_ECONFIG, "kafka property '%s': invalid value (not shown)", key);
    return obx__fail(OBX_ECONFIG, "kafka property '%s': %s", key, err);
}

static bool user_set(const kafka_broker *b, prop_scope scope, const char *key) {
    for (size_t i = 0; i < b->n_props; i++)
        if ((b->props[i].scope == SCOPE_ALL || b->props[i].scope == scope) &&
            !strcmp(b->props[i].key, key))
            return true;
    return false;
}

/* librdkafka's own lines (syslog levels: 0..3 errors, 4 warnings, 5..6 information, 7
 * debugging) through obx's log, in log.format like every other record (core.h). */
static void kafka_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
    obx__blog_level l = level <= 3   ? OBX__BLOG_ERROR
                        : level == 4 ? OBX__BLOG_WARN
                        : level <= 6 ? OBX__BLOG_INFO
                                     : OBX__BLOG_DEBUG;
    obx__backend_log(l, "kafka", "%s: %s: %s", rk ? rd_kafka_name(rk) : "rdkafka", fac, buf);
}

/* A configuration for one handle: the user's properties for its scope, then what obx owns. */
static obx_err make_conf(kafka_broker *b, prop_scope scope, rd_kafka_conf_t **out) {
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(c, kafka_log);
    obx_err e = OBX_OK;
    for (size_t i = 0; i < b->n_props && !e; i++)
        if (b->props[i].scope == SCOPE_ALL || b->props[i].scope == scope)
            e = conf_set(c, b->props[i].key, b->props[i].value);
    if (!e) e = conf_set(c, "bootstrap.servers", b->hosts);
    if (!e && !user_set(b, scope, "client.id")) e = conf_set(c, "client.id", "obx");
    /* A default, not owned: TCP_NODELAY on every broker connection (librdkafka 2.0 leaves
     * Nagle's algorithm on; later librdkafka made this its own default). With several requests
     * in flight per broker (the producer pipelines up to 5), Nagle holds a small request back
     * until the previous one is acknowledged: at 250 events/s the relay's produce-to-delivery-
     * report p90 was 10.8 ms with Nagle on and 1.5 ms with it off on both ends, as against a
     * real broker, which sets TCP_NODELAY on its end (docs/performance.md, section 2). */
    if (!e && !user_set(b, scope, "socket.nagle.disable"))
        e = conf_set(c, "socket.nagle.disable", "true");
    if (e) {
        rd_kafka_conf_destroy(c);
        return e;
    }
    *out = c;
    return OBX_OK;
}

/* ---- outcomes ---------------------------------------------------------------------------------
 */

static obx__outcome *queue_slot(kafka_broker *b) {
    if (b->nq == b->capq) {
        size_t c = b->capq ? b->capq * 2 : 256;
        obx__outcome *p = realloc(b->q, c * sizeof *p);
        if (!p) return NULL;
        b->q = p;
        b->capq = c;
    }
    obx__outcome *o = &b->q[b->nq++];
    memset(o, 0, sizeof *o);
    return o;
}

/* Copies header `name` into out; false when absent or too long. */
static bool hdr_copy(rd_kafka_headers_t *h, const char *name, char *out, size_t cap) {
    const void *v = NULL;
    size_t sz = 0;
    out[0] = '\0';
    if (!h || rd_kafka_header_get_last(h, name, &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return false;
    if (sz >= cap || (sz && memchr(v, '\0', sz))) return false;
    if (sz) memcpy(out, v, sz);
    out[sz] = '\0';
    return true;
}

/* Header `name` as a positive 32-bit decimal, or 0. */
static int32_t hdr_gen(rd_kafka_headers_t *h, const char *name) {
    char v[16], *end;
    if (!hdr_copy(h, name, v, sizeof v)) return 0;
    long x = strtol(v, &end, 10);
    return (*end || end == v || x < 1 || x > INT32_MAX) ? 0 : (int32_t)x;
}

/* Fills the identity part of an outcome from the obx headers of a message. */
static void outcome_identity(obx__outcome *o, rd_kafka_headers_t *h) {
    hdr_copy(h, OBX__H_EVENT_ID, o->event_id, sizeof o->event_id);
    o->envelope_gen = hdr_gen(h, OBX__H_ENVELOPE_GEN);
    hdr_copy(h, OBX__H_ATTEMPT_ID, o->attempt_id, sizeof o->attempt_id);
    hdr_copy(h, OBX__H_PAYLOAD_DIGEST, o->payload_digest, sizeof o->payload_digest);
    hdr_copy(h, OBX__H_DEST_DIGEST, o->dest_digest, sizeof o->dest_digest);
}

/* Errors after which the message was certainly not appended and a retry as is cannot succeed
 * (only trusted together with status NOT_PERSISTED). UNKNOWN_TOPIC_OR_PART is retriable inside
 * librdkafka (metadata propagation); it reaches a delivery report only once librdkafka has
 * waited topic.metadata.propagation.max.ms and the cluster still says the topic is absent. */
static bool definite_error(rd_kafka_resp_err_t err) {
    switch (err) {
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__BAD_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD: return true;
    default: return false;
    }
}

static const char *status_name(rd_kafka_msg_status_t s) {
    return s == RD_KAFKA_MSG_STATUS_PERSISTED            ? "persisted"
           : s == RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED ? "possibly persisted"
                                                         : "not persisted";
}

/* Delivery report callback. @locality served by rd_kafka_poll() inside kb_poll()/kb_close() on
 * the handle's thread. Queues exactly one outcome per message. */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    kafka_broker *b = opaque;
    if (b->dr_pending) b->dr_pending--;
    obx__outcome *o = queue_slot(b);
    if (!o) {
        /* Without memory the outcome is lost: the attempt stays SENDING, the lease sweeper
         * makes it UNKNOWN and the reconciler resolves it (the documented fallback). */
        obx__strlcpy(b->last_error, "out of memory queueing a delivery report",
                     sizeof b->last_error);
        return;
    }
    rd_kafka_headers_t *h = NULL;
    if (rd_kafka_message_headers(m, &h) != RD_KAFKA_RESP_ERR_NO_ERROR) h = NULL;
    outcome_identity(o, h);
    obx__strlcpy(o->topic, rd_kafka_topic_name(m->rkt), sizeof o->topic);
    o->partition = m->partition;
    o->offset = -1;
    obx__strlcpy(o->cluster, b->cluster, sizeof o->cluster);
    rd_kafka_msg_status_t st = rd_kafka_message_status(m);
    if (!m->err && m->offset >= 0) {
        rd_kafka_timestamp_type_t tt;
        int64_t ts = rd_kafka_message_timestamp(m, &tt);
        o->kind = OBX__OUT_ACK;
        o->offset = m->offset;
        o->broker_ts = ts >= 0 ? ts : 0;
        /* A receipt names the cluster that holds the message. If librdkafka now talks to a
         * different cluster than the one verified at open, say so: the acceptance point then
         * refuses the receipt instead of crediting the frozen destination's cluster. */
        if (b->live_id[0] && strcmp(b->live_id, b->kafka_id)) {
            obx__strlcpy(o->cluster, b->live_id, sizeof o->cluster);
            snprintf(o->reason, sizeof o->reason, "acknowledged by Kafka cluster %s, not %s",
                     b->live_id, b->kafka_id);
        }
        return;
    }
    if (!m->err) { /* persisted without an offset (acks=0 only): find it by lookup */
        o->kind = OBX__OUT_UNKNOWN;
        snprintf(o->reason, sizeof o->reason, "acknowledged without an offset");
        return;
    }
    if (st == RD_KAFKA_MSG_STATUS_NOT_PERSISTED)
        o->kind = definite_error(m->err) ? OBX__OUT_REJECT : OBX__OUT_NOT_SENT;
    else
        o->kind = OBX__OUT_UNKNOWN;
    snprintf(o->reason, sizeof o->reason, "%s (%s, %s)%s%s", rd_kafka_err2str(m->err),
             rd_kafka_err2name(m->err), status_name(st), b->last_error[0] ? "; last: " : "",
             b->last_error);
}

/* Error callback. @locality rd_kafka_poll() on the handle's thread. */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    kafka_broker *b = opaque;
    snprintf(b->last_error, sizeof b->last_error, "%s: %s",
             rd_kafka_err2name((rd_kafka_resp_err_t)err), reason);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        char why[256];
        rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, why, sizeof why);
        b->fatal = true;
        snprintf(b->fatal_reason, sizeof b->fatal_reason, "%s: %s", rd_kafka_err2name(orig), why);
    }
}

/* ---- open / close ------------------------------------------------------------------------- */

static void drop_reader(kafka_broker *b) {
    if (b->reader_q) rd_kafka_queue_destroy(b->reader_q);
    if (b->reader) rd_kafka_destroy(b->reader);
    b->reader_q = NULL;
    b->reader = NULL;
}

static void drop_consumer(kafka_broker *b) {
    if (b->cons) {
        rd_kafka_consumer_close(b->cons); /* leaves the group; commits nothing */
        rd_kafka_destroy(b->cons);
        b->cons = NULL;
    }
    free(b->committed);
    b->committed = NULL;
    b->n_committed = 0;
}

/* Outcomes still unreturned at close are dropped: those attempts stay SENDING in the store and
 * the lease sweeper hands them to the reconciler (broker.h). Messages still queued or in
 * flight are purged so that their delivery reports are served here and nothing leaks. */
static void kb_close(obx__broker *base) {
    kafka_broker *b = (kafka_broker *)base;
    if (!b) return;
    if (b->wake_q) { /* librdkafka stops writing to the pipe before it is closed */
        rd_kafka_queue_io_event_enable(b->wake_q, -1, NULL, 0);
        rd_kafka_queue_destroy(b->wake_q);
        close(b->wake[0]);
        close(b->wake[1]);
    }
    drop_consumer(b);
    drop_reader(b);
    if (b->prod) {
        rd_kafka_purge(b->prod, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        int64_t deadline = obx__mono_ms() + 5000;
        while (rd_kafka_outq_len(b->prod) > 0 && remaining(deadline) > 0)
            rd_kafka_poll(b->prod, 50);
        for (size_t i = 0; i < b->n_topics; i++)
            if (b->topics[i].rkt) rd_kafka_topic_destroy(b->topics[i].rkt);
        rd_kafka_destroy(b->prod);
    }
    for (size_t i = 0; i < b->n_props; i++) {
        free(b->props[i].key);
        wipe_free(b->props[i].value);
    }
    free(b->props);
    free(b->topics);
    free(b->q);
    free(b);
}

/* A millisecond property of the producer. message.timeout.ms and request.timeout.ms are
 * topic-level properties in librdkafka (set on the global configuration, they land in its
 * default topic configuration), so look there too: reading only the global one silently gave
 * the defaults (300 s + 30 s of quiet time whatever was configured). */
static int64_t conf_ms(rd_kafka_t *rk, const char *name, int64_t dflt) {
    char v[64];
    size_t sz = sizeof v;
    const rd_kafka_conf_t *c = rd_kafka_conf(rk);
    if (rd_kafka_conf_get(c, name, v, &sz) != RD_KAFKA_CONF_OK) {
        rd_kafka_topic_conf_t *tc = rd_kafka_conf_get_default_topic_conf((rd_kafka_conf_t *)c);
        sz = sizeof v;
        if (!tc || rd_kafka_topic_conf_get(tc, name, v, &sz) != RD_KAFKA_CONF_OK) return dflt;
    }
    char *end;
    long long x = strtoll(v, &end, 10);
    return *end || x < 0 ? dflt : x;
}

/* Reads the Kafka cluster ID through rk (bounded). */
static obx_err read_cluster_id(rd_kafka_t *rk, int64_t timeout_ms, char *out, size_t cap,
                               const char *hosts) {
    char *id = rd_kafka_clusterid(rk, ms_int(timeout_ms));
    if (!id)
        return obx__fail(OBX_EBROKER,
                         "kafka: could not read the cluster ID from %s within %lld ms (brokers "
                         "unreachable, or too old to report one)",
                         hosts, (long long)timeout_ms);
    obx_err e = obx__check_field("kafka cluster ID", id, 1, cap - 1, OBX__CS_NAME);
    if (!e) obx__strlcpy(out, id, cap);
    rd_kafka_mem_free(rk, id);
    return e;
}

static obx_err kb_open(const obx__url *u, const char *const *props, size_t n_props,
                       obx__broker **out) {
    kafka_broker *b = calloc(1, sizeof *b);
    if (!b || !(b->props = calloc(KB_PROPS_MAX, sizeof *b->props))) {
        free(b);
        return obx__fail(OBX_ENOMEM, "kafka: out of memory");
    }
    b->base.m = &obx__kafka_broker_methods;
    obx__strlcpy(b->hosts, u->hosts, sizeof b->hosts);
    b->open_timeout_ms = 10000;
    b->lookup_timeout_ms = 60000;
    b->lookup_max_msgs = 5000000;
    b->skew_ms = 60000;
    b->meta_ttl_ms = 60000;
    obx__strlcpy(b->reader_group, "obx-lookup-reader", sizeof b->reader_group);
    obx_err e = parse_config(b, u, props, n_props);
    rd_kafka_conf_t *c = NULL;
    if (!e) e = make_conf(b, SCOPE_PRODUCER, &c);
    if (!e) {
        /* what obx owns (set last, after the user's properties) */
        if (!(e = conf_set(c, "enable.idempotence", "true")) && !(e = conf_set(c, "acks", "all")) &&
            !user_set(b, SCOPE_PRODUCER, "allow.auto.create.topics"))
            e = conf_set(c, "allow.auto.create.topics", "false");
        /* A default, not owned: the relay hands librdkafka a whole claimed batch at once, so
         * librdkafka's 5 ms wait for more messages mostly delays each batch (at 1,000 ev/s it
         * was half of the 10 ms commit-to-PUBLISHED p50). 0 costs throughput instead (one
         * produce request per handful of messages: relay CPU per event 0.28 -> 0.54 s/10k in
         * bench_throughput); 1 ms keeps the requests full (docs/performance.md). */
        if (!e && !user_set(b, SCOPE_PRODUCER, "linger.ms") &&
            !user_set(b, SCOPE_PRODUCER, "queue.buffering.max.ms"))
            e = conf_set(c, "linger.ms", "1");
        if (e) rd_kafka_conf_destroy(c);
    }
    if (e) {
        kb_close(&b->base);
        return e;
    }
    rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
    rd_kafka_conf_set_error_cb(c, on_error);
    rd_kafka_conf_set_opaque(c, b);
    char err[512];
    b->prod = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!b->prod) {
        rd_kafka_conf_destroy(c);
        e = obx__fail(OBX_ECONFIG, "kafka: cannot create the producer: %s", err);
        kb_close(&b->base);
        return e;
    }
    b->quiet_ms = conf_ms(b->prod, "message.timeout.ms", 300000) +
                  conf_ms(b->prod, "request.timeout.ms", 30000);
    e = read_cluster_id(b->prod, b->open_timeout_ms, b->kafka_id, sizeof b->kafka_id, b->hosts);
    if (e) {
        rd_kafka_poll(b->prod, 0); /* serves on_error: say why, when librdkafka knows */
        if (b->last_error[0]) {
            char msg[512];
            obx__strlcpy(msg, obx_errmsg(), sizeof msg);
            e = obx__fail(e, "%s; last client error: %s", msg, b->last_error);
        }
    }
    if (!e && b->expect_id[0] && strcmp(b->expect_id, b->kafka_id))
        e = obx__fail(OBX_EREFUSED,
                      "kafka: the brokers at %s belong to Kafka cluster '%s', but the "
                      "configuration expects cluster ID '%s': refusing to publish to another "
                      "cluster",
                      b->hosts, b->kafka_id, b->expect_id);
    if (e) {
        kb_close(&b->base);
        return e;
    }
    if (!b->cluster[0]) obx__strlcpy(b->cluster, b->kafka_id, sizeof b->cluster);
    obx__strlcpy(b->live_id, b->kafka_id, sizeof b->live_id);
    *out = &b->base;
    return OBX_OK;
}

static obx_err kb_cluster_id(obx__broker *base, char *out, size_t cap) {
    obx__strlcpy(out, ((kafka_broker *)base)->cluster, cap);
    return OBX_OK;
}

static int64_t kb_quiet(obx__broker *base) { return ((kafka_broker *)base)->quiet_ms; }

/* ---- producer ------------------------------------------------------------------------------- */

static kb_topic *topic_get(kafka_broker *b, const char *name) {
    for (size_t i = 0; i < b->n_topics; i++)
        if (!strcmp(b->topics[i].name, name)) return &b->topics[i];
    kb_topic *t = realloc(b->topics, (b->n_topics + 1) * sizeof *t);
    if (!t) return NULL;
    b->topics = t;
    t = &b->topics[b->n_topics];
    memset(t, 0, sizeof *t);
    obx__strlcpy(t->name, name, sizeof t->name);
    t->rkt = rd_kafka_topic_new(b->prod, name, NULL);
    if (!t->rkt) return NULL;
    b->n_topics++;
    return t;
}

/* Partition count of a topic from metadata, cached for obx.metadata.ttl.ms. A stale count is
 * used when the brokers do not answer (the first attempt's partition is pinned anyway). */
static obx_err topic_partitions(kafka_broker *b, kb_topic *t, int32_t *n) {
    int64_t now = obx__mono_ms();
    if (t->partitions > 0 && now - t->partitions_at < b->meta_ttl_ms) {
        *n = t->partitions;
        return OBX_OK;
    }
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t err =
        rd_kafka_metadata(b->prod, 0, t->rkt, &md, ms_int(b->open_timeout_ms));
    obx_err e = OBX_OK;
    if (err) {
        if (t->partitions > 0) {
            *n = t->partitions;
            return OBX_OK;
        }
        return obx__fail(OBX_EBROKER, "kafka: metadata for topic '%s': %s", t->name,
                         rd_kafka_err2str(err));
    }
    if (md->topic_cnt != 1 || md->topics[0].err || md->topics[0].partition_cnt < 1) {
        rd_kafka_resp_err_t te =
            md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
        /* the brokers answered that the topic does not exist: a definite answer (the engine
         * rejects the attempt instead of retrying the metadata forever) */
        bool missing =
            te == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART || te == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
        e = obx__fail(missing ? OBX_ENOTFOUND : OBX_EBROKER, "kafka: topic '%s' on cluster %s: %s",
                      t->name, b->kafka_id, te ? rd_kafka_err2str(te) : "no partitions");
    } else {
        t->partitions = md->topics[0].partition_cnt;
        t->partitions_at = now;
        *n = t->partitions;
    }
    rd_kafka_metadata_destroy(md);
    return e;
}

static obx_err kb_partition_for(obx__broker *base, const obx__dest *d, int32_t *out) {
    kafka_broker *b = (kafka_broker *)base;
    kb_topic *t = topic_get(b, d->topic);
    if (!t) return obx__fail(OBX_ENOMEM, "kafka: topic handle for '%s'", d->topic);
    int32_t n = 0;
    obx_err e = topic_partitions(b, t, &n);
    if (e) return e;
    *out = obx__partition(d->algorithm, d->routing_key, n);
    return OBX_OK;
}

/* An outcome decided at send time (the message never reached librdkafka's queue). */
static obx_err local_outcome(kafka_broker *b, const obx__msg *m, obx__outcome_kind k,
                             const char *fmt, ...) OBX__PRINTF(4, 5);
static obx_err local_outcome(kafka_broker *b, const obx__msg *m, obx__outcome_kind k,
                             const char *fmt, ...) {
    obx__outcome *o = queue_slot(b);
    if (!o) return obx__fail(OBX_ENOMEM, "kafka: out of memory");
    o->kind = k;
    obx__strlcpy(o->event_id, m->env->event_id, sizeof o->event_id);
    o->envelope_gen = m->env->envelope_gen;
    obx__strlcpy(o->attempt_id, m->attempt_id, sizeof o->attempt_id);
    obx__strlcpy(o->payload_digest, m->env->payload_digest, sizeof o->payload_digest);
    obx__strlcpy(o->dest_digest, m->dest_digest, sizeof o->dest_digest);
    obx__strlcpy(o->cluster, b->cluster, sizeof o->cluster);
    obx__strlcpy(o->topic, m->dest->topic, sizeof o->topic);
    o->partition = m->partition;
    o->offset = -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->reason, sizeof o->reason, fmt, ap);
    va_end(ap);
    return OBX_OK;
}

/* Hands the batch to librdkafka without blocking. A message librdkafka refuses at once gets
 * its outcome here (queue full: NOT_SENT; too large, unknown partition: REJECT). Returns an
 * error, and hands nothing over, when the producer is unusable (fatal) or a topic handle cannot
 * be made; only running out of memory for a local outcome fails after messages were handed
 * over (those still get their outcomes). */
static obx_err kb_send(obx__broker *base, const obx__msg *msgs, size_t n, int64_t now) {
    kafka_broker *b = (kafka_broker *)base;
    int64_t wall = obx__ref_ms(), t_now = now > wall ? now : wall;
    if (b->fatal)
        return obx__fail(OBX_EBROKER, "kafka: the producer hit a fatal error (%s): reopen it",
                         b->fatal_reason);
    for (size_t i = 0; i < n; i++)
        if (!topic_get(b, msgs[i].dest->topic))
            return obx__fail(OBX_ENOMEM, "kafka: topic handle for '%s'", msgs[i].dest->topic);
    for (size_t i = 0; i < n; i++) {
        const obx__msg *m = &msgs[i];
        if (m->deadline && t_now > m->deadline) {
            /* broker.h: never hand an attempt to the broker after its deadline. A write handed
             * over before it lands within message.timeout.ms + request.timeout.ms (the quiet
             * time), so a lookup after deadline + quiet time can prove absence. */
            char at[32];
            obx__iso_ms(m->deadline, at); /* reasons reach operators: ISO, never epoch ms */
            obx_err e = local_outcome(b, m, OBX__OUT_NOT_SENT,
                                      "attempt deadline %s passed before produce: not sent", at);
            if (e) return e;
            continue;
        }
        kb_topic *t = topic_get(b, m->dest->topic); /* cached by the loop above */
        obx__headers h;
        obx__headers_build(m, &h);
        rd_kafka_headers_t *hdrs = rd_kafka_headers_new(h.n);
        for (size_t k = 0; k < h.n; k++) rd_kafka_header_add(hdrs, h.name[k], -1, h.value[k], -1);
        const char *key = m->dest->routing_key;
        rd_kafka_resp_err_t err = rd_kafka_producev(
            b->prod, RD_KAFKA_V_RKT(t->rkt), RD_KAFKA_V_PARTITION(m->partition),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, strlen(key)),
            RD_KAFKA_V_VALUE((void *)(m->payload ? m->payload : ""), m->payload_len),
            RD_KAFKA_V_HEADERS(hdrs), RD_KAFKA_V_END);
        if (!err) {
            b->dr_pending++;
            continue;
        }
        rd_kafka_headers_destroy(hdrs); /* not taken over on failure */
        obx__outcome_kind k = definite_error(err) ? OBX__OUT_REJECT : OBX__OUT_NOT_SENT;
        if (err == RD_KAFKA_RESP_ERR__FATAL) {
            char why[256];
            rd_kafka_resp_err_t orig = rd_kafka_fatal_error(b->prod, why, sizeof why);
            b->fatal = true;
            snprintf(b->fatal_reason, sizeof b->fatal_reason, "%s: %s", rd_kafka_err2name(orig),
                     why);
        }
        obx_err e = local_outcome(b, m, k, "refused by the producer: %s (%s)",
                                  rd_kafka_err2str(err), rd_kafka_err2name(err));
        if (e) return e;
    }
    return OBX_OK;
}

static void refresh_live_id(kafka_broker *b) {
    char *id = rd_kafka_clusterid(b->prod, 0); /* cached value, does not block */
    if (!id) return;
    obx__strlcpy(b->live_id, id, sizeof b->live_id);
    rd_kafka_mem_free(b->prod, id);
}

static obx_err kb_poll(obx__broker *base, int64_t now, int timeout_ms, obx__outcome *out,
                       size_t cap, size_t *n) {
    kafka_broker *b = (kafka_broker *)base;
    (void)now;
    if (b->dr_pending) refresh_live_id(b);
    if (b->wake_q) { /* emptied before the queue is served: a report after this signals */
        char buf[64];
        while (read(b->wake[0], buf, sizeof buf) > 0) continue;
    }
    /* wait only when nothing is ready and something is still coming */
    rd_kafka_poll(b->prod, b->nq == 0 && b->dr_pending ? timeout_ms : 0);
    size_t k = b->nq < cap ? b->nq : cap;
    if (k) {
        memcpy(out, b->q, k * sizeof *out);
        memmove(b->q, b->q + k, (b->nq - k) * sizeof *b->q);
        b->nq -= k;
    }
    *n = k;
    return OBX_OK;
}

static int kb_wake_fd(obx__broker *base) {
    kafka_broker *b = (kafka_broker *)base;
    if (b->wake_q) return b->wake[0];
    if (pipe2(b->wake, O_NONBLOCK | O_CLOEXEC)) return -1; /* the caller waits in turns */
    b->wake_q = rd_kafka_queue_get_main(b->prod);
    rd_kafka_queue_io_event_enable(b->wake_q, b->wake[1], "1", 1);
    /* what the queue got since the last poll sent no byte: the first wait polls at once */
    if (write(b->wake[1], "1", 1) < 0 && errno != EAGAIN) return -1;
    return b->wake[0];
}

static size_t kb_in_flight(obx__broker *base) {
    kafka_broker *b = (kafka_broker *)base;
    return b->dr_pending + b->nq;
}

/* ---- the reader: bounded offset-range scans (lookup, scan) ---------------------------------- */

/* Defaults, not owned: how much the reader fetches ahead. librdkafka's own (64 MiB queued per
 * partition) are a streaming consumer's; the reader scans a range once, in the relay beside its
 * dispatchers: the auditor's bypass scan of a topic's last hour made a relay's peak RSS 28-47 MiB
 * from run to run on a 1,000,000-event backlog (bench_resources, issue 49: < 32 MiB). 1 MiB
 * queued per partition still holds thousands of messages. fetch.max.bytes is left alone:
 * librdkafka refuses one below message.max.bytes, which a user may raise for every client
 * (test_lookup_large_message_limit). */
static obx_err reader_bounds(kafka_broker *b, rd_kafka_conf_t *c) {
    static const char *const d[][2] = {{"queued.max.messages.kbytes", "1024"},
                                       {"queued.min.messages", "1000"}};
    obx_err e = OBX_OK;
    for (size_t i = 0; !e && i < sizeof d / sizeof d[0]; i++)
        if (!user_set(b, SCOPE_CONSUMER, d[i][0])) e = conf_set(c, d[i][0], d[i][1]);
    return e;
}

static obx_err reader_get(kafka_broker *b) {
    if (b->reader) return OBX_OK;
    rd_kafka_conf_t *c;
    obx_err e = make_conf(b, SCOPE_CONSUMER, &c);
    if (e) return e;
    /* A group.id is required by rd_kafka_assign(), but this handle never subscribes, joins or
     * commits: it reads explicit offsets only (clusters with ACLs must still let the principal
     * describe that group: obx.lookup.group). read_uncommitted bounds reads by the high
     * watermark (not by another producer's open transaction). */
    if ((e = conf_set(c, "group.id", b->reader_group)) ||
        (e = conf_set(c, "enable.auto.commit", "false")) ||
        (e = conf_set(c, "enable.auto.offset.store", "false")) ||
        (e = conf_set(c, "enable.partition.eof", "true")) ||
        (e = conf_set(c, "auto.offset.reset", "error")) ||
        (e = conf_set(c, "isolation.level", "read_uncommitted")) ||
        (e = conf_set(c, "fetch.wait.max.ms", "100")) || (e = reader_bounds(b, c))) {
        rd_kafka_conf_destroy(c);
        return e;
    }
    char err[512];
    b->reader = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!b->reader) {
        rd_kafka_conf_destroy(c);
        return obx__fail(OBX_ECONFIG, "kafka: cannot create the lookup reader: %s", err);
    }
    b->reader_q = rd_kafka_queue_get_consumer(b->reader);
    return OBX_OK;
}

typedef struct span {
    const char *topic;
    int32_t partition;
    int64_t start, end; /* [start, end) */
    bool done;
} span;

/* Called for each message read; non-zero stops the scan. */
typedef int (*visit_fn)(void *user, const rd_kafka_message_t *m);

typedef enum { SCAN_COMPLETE, SCAN_STOPPED, SCAN_INCOMPLETE } scan_status;

/* Reads every span's offsets [start, end) with the reader, in batches, calling visit for each
 * message, until all spans are covered, visit stops, the deadline passes or *budget messages
 * were read. On SCAN_INCOMPLETE, why says what cut it short. */
static obx_err read_spans(kafka_broker *b, span *s, size_t n, int64_t deadline, int64_t *budget,
                          visit_fn visit, void *user, scan_status *status, char *why,
                          size_t why_cap) {
    *status = SCAN_COMPLETE;
    why[0] = '\0';
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    size_t open = 0;
    for (size_t i = 0; i < n; i++) {
        s[i].done = s[i].start >= s[i].end;
        if (s[i].done) continue;
        rd_kafka_topic_partition_list_add(l, s[i].topic, s[i].partition)->offset = s[i].start;
        open++;
    }
    if (!open) {
        rd_kafka_topic_partition_list_destroy(l);
        return OBX_OK;
    }
    rd_kafka_resp_err_t err = rd_kafka_assign(b->reader, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        *status = SCAN_INCOMPLETE;
        snprintf(why, why_cap, "assign: %s", rd_kafka_err2str(err));
        return OBX_OK;
    }
    rd_kafka_message_t *batch[KB_BATCH];
    while (open && *status == SCAN_COMPLETE) {
        int64_t left = remaining(deadline);
        if (!left) {
            *status = SCAN_INCOMPLETE;
            snprintf(why, why_cap, "not finished within obx.lookup.timeout.ms");
            break;
        }
        ssize_t got = rd_kafka_consume_batch_queue(b->reader_q, ms_int(left < 100 ? left : 100),
                                                   batch, KB_BATCH);
        for (ssize_t k = 0; k < got; k++) {
            rd_kafka_message_t *m = batch[k];
            span *sp = NULL;
            for (size_t i = 0; m->rkt && i < n && !sp; i++)
                if (s[i].partition == m->partition &&
                    !strcmp(s[i].topic, rd_kafka_topic_name(m->rkt)))
                    sp = &s[i];
            if (*status != SCAN_COMPLETE || !sp || sp->done) {
                /* after a stop, or not ours */
            } else if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                if (m->offset >= sp->end) { /* the fetch position passed the range */
                    sp->done = true;
                    open--;
                }
            } else if (m->err) {
                *status = SCAN_INCOMPLETE;
                snprintf(why, why_cap, "reading %s/%d: %s", sp->topic, (int)sp->partition,
                         rd_kafka_message_errstr(m));
            } else if (m->offset >= sp->start && m->offset < sp->end) {
                if (--*budget < 0) {
                    *status = SCAN_INCOMPLETE;
                    snprintf(why, why_cap, "over obx.lookup.max.messages");
                } else if (visit(user, m))
                    *status = SCAN_STOPPED;
                if (m->offset >= sp->end - 1 && !sp->done) {
                    sp->done = true;
                    open--;
                }
            }
            rd_kafka_message_destroy(m);
        }
        if (got < 0) {
            *status = SCAN_INCOMPLETE;
            snprintf(why, why_cap, "consume: %s", rd_kafka_err2str(rd_kafka_last_error()));
        }
    }
    rd_kafka_assign(b->reader, NULL);
    return OBX_OK;
}

/* ListOffsets for one partition at `at` (a timestamp, or RD_KAFKA_OFFSET_BEGINNING/END),
 * bounded by the deadline. rd_kafka_offsets_for_times() is used for all three because it
 * honours its timeout; rd_kafka_query_watermark_offsets() in librdkafka 2.0.2 waits for the
 * request's own socket timeout and retries when the leader is down. */
static int list_offset(kafka_broker *b, const char *topic, int32_t p, int64_t at, int64_t deadline,
                       int64_t *out, char *why, size_t why_cap) {
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, p)->offset = at;
    rd_kafka_resp_err_t err = rd_kafka_offsets_for_times(b->reader, l, ms_int(remaining(deadline)));
    if (!err) err = l->elems[0].err;
    *out = l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    if (err) {
        snprintf(why, why_cap, "list offsets (%s) of %s/%d: %s",
                 at == RD_KAFKA_OFFSET_BEGINNING ? "log start"
                 : at == RD_KAFKA_OFFSET_END     ? "high watermark"
                                                 : "by time",
                 topic, (int)p, rd_kafka_err2str(err));
        return -1;
    }
    return 0;
}

/* The partition's log start and high watermark, fresh from its leader. */
static int watermarks(kafka_broker *b, const char *topic, int32_t p, int64_t deadline, int64_t *lo,
                      int64_t *hi, char *why, size_t why_cap) {
    if (list_offset(b, topic, p, RD_KAFKA_OFFSET_BEGINNING, deadline, lo, why, why_cap) ||
        list_offset(b, topic, p, RD_KAFKA_OFFSET_END, deadline, hi, why, why_cap))
        return -1;
    if (*lo < 0 || *hi < *lo) {
        snprintf(why, why_cap, "%s/%d: broker reported offsets [%lld, %lld)", topic, (int)p,
                 (long long)*lo, (long long)*hi);
        return -1;
    }
    return 0;
}

typedef struct ts_visit {
    int64_t ts;
    bool seen;
} ts_visit;

static int visit_ts(void *user, const rd_kafka_message_t *m) {
    ts_visit *v = user;
    rd_kafka_timestamp_type_t tt;
    v->ts = rd_kafka_message_timestamp(m, &tt);
    v->seen = true;
    return 1;
}

/* First offset to read so that every message with timestamp >= ts is covered, and whether
 * absence below it is proven (false when retention may have removed such messages). Returns
 * non-zero with why set when the broker cannot say. */
static int start_offset(kafka_broker *b, const char *topic, int32_t p, int64_t ts, int64_t lo,
                        int64_t hi, int64_t deadline, int64_t *start, bool *absence_ok, char *why,
                        size_t why_cap) {
    int64_t off = -1;
    if (!b->no_time_index) {
        if (list_offset(b, topic, p, ts, deadline, &off, why, why_cap)) return -1;
        if (off < 0 && hi > lo) {
            /* "No message at or after ts": trust it only if the last message is older. The
             * mock cluster answers -1 to every timestamp query (rdkafka_mock_handlers.c: its
             * timestamp lookup is left unfinished upstream); then read from the log start instead.
             */
            ts_visit v = {0, false};
            span sp = {topic, p, hi - 1, hi, false};
            int64_t budget = 1;
            scan_status st;
            char w[128];
            read_spans(b, &sp, 1, deadline, &budget, visit_ts, &v, &st, w, sizeof w);
            if (!v.seen || v.ts >= ts) {
                if (v.seen) b->no_time_index = true;
                off = lo;
            } else
                off = hi;
        }
    } else
        off = lo;
    if (off < lo) off = lo;
    if (off > hi) off = hi;
    *start = off;
    /* Messages before the log start are gone: if the range starts there, an older message
     * with a timestamp >= ts may have been deleted by retention. */
    *absence_ok = !(off == lo && lo > 0);
    return 0;
}

/* The reader must talk to the cluster verified at open. */
static int reader_cluster_ok(kafka_broker *b, int64_t deadline, char *why, size_t why_cap) {
    char id[OBX_NAME_MAX + 1];
    if (read_cluster_id(b->reader, remaining(deadline), id, sizeof id, b->hosts)) {
        snprintf(why, why_cap, "%s", obx_errmsg());
        return -1;
    }
    if (strcmp(id, b->kafka_id)) {
        snprintf(why, why_cap, "the reader reached Kafka cluster %s, not %s", id, b->kafka_id);
        return -1;
    }
    return 0;
}

typedef struct lookup_visit {
    kafka_broker *b;
    const obx__lookup_req *req;
    obx__lookup_res *res;
    int64_t scanned;
} lookup_visit;

/* Every copy of the event ID and generation in the window is considered, not only the first:
 * its body is hashed (obx__lookup_copy), the first copy whose bytes are the event's message is
 * the receipt (later ones are duplicates), the others are counted as corrupt or foreign. */
static int visit_lookup(void *user, const rd_kafka_message_t *m) {
    lookup_visit *v = user;
    v->scanned++;
    rd_kafka_headers_t *h = NULL;
    if (rd_kafka_message_headers(m, &h)) return 0;
    char id[OBX_EVENT_ID_LEN + 1];
    if (!hdr_copy(h, OBX__H_EVENT_ID, id, sizeof id) || strcmp(id, v->req->event_id)) return 0;
    /* the message of this envelope generation (another generation is another target) */
    if (hdr_gen(h, OBX__H_ENVELOPE_GEN) != v->req->envelope_gen) return 0;
    obx__outcome o;
    memset(&o, 0, sizeof o);
    outcome_identity(&o, h);
    obx__strlcpy(o.cluster, v->b->cluster, sizeof o.cluster);
    obx__strlcpy(o.topic, rd_kafka_topic_name(m->rkt), sizeof o.topic);
    o.partition = m->partition;
    o.offset = m->offset;
    rd_kafka_timestamp_type_t tt;
    int64_t ts = rd_kafka_message_timestamp(m, &tt);
    o.broker_ts = ts >= 0 ? ts : 0;
    obx__lookup_copy(v->req, v->res, &o, m->payload, m->len);
    return 0;
}

static obx_err kb_lookup(obx__broker *base, const obx__lookup_req *req, obx__lookup_res *res) {
    kafka_broker *b = (kafka_broker *)base;
    int64_t wall0 = obx__ref_ms(); /* the clock quiet_until is on */
    int64_t deadline = obx__mono_ms() + b->lookup_timeout_ms;
    const char *topic = req->dest->topic;
    int32_t p = req->partition;
    char why[OBX_TEXT_MAX + 1] = "";
    int64_t lo = 0, hi = 0, start = 0, budget = b->lookup_max_msgs;
    bool absence_ok = false;
    res->kind = OBX__LOOKUP_CANNOT_TELL;
    obx_err e = reader_get(b);
    if (e) return e;
    int64_t ts = req->since - b->skew_ms;
    if (reader_cluster_ok(b, deadline, why, sizeof why) ||
        watermarks(b, topic, p, deadline, &lo, &hi, why, sizeof why) ||
        start_offset(b, topic, p, ts < 0 ? 0 : ts, lo, hi, deadline, &start, &absence_ok, why,
                     sizeof why)) {
        snprintf(res->reason, sizeof res->reason, "cannot tell: %s", why);
        return OBX_OK;
    }
    span sp = {topic, p, start, hi, false};
    lookup_visit v = {b, req, res, 0};
    scan_status st;
    e = read_spans(b, &sp, 1, deadline, &budget, visit_lookup, &v, &st, why, sizeof why);
    if (e) return e;
    if (res->kind == OBX__LOOKUP_FOUND) {
        snprintf(res->reason, sizeof res->reason,
                 "found at %s/%d@%lld (read %lld messages from %lld)", topic, (int)p,
                 (long long)res->found.offset, (long long)v.scanned, (long long)start);
        return OBX_OK;
    }
    if (st != SCAN_COMPLETE) {
        snprintf(res->reason, sizeof res->reason, "cannot tell: %s/%d [%lld, %lld): %s", topic,
                 (int)p, (long long)start, (long long)hi, why);
        return OBX_OK;
    }
    if (!absence_ok) {
        snprintf(res->reason, sizeof res->reason,
                 "not in %s/%d [%lld, %lld), but the log start moved past the attempt's start "
                 "(retention): absence cannot be proven",
                 topic, (int)p, (long long)start, (long long)hi);
        return OBX_OK;
    }
    if (req->now < req->quiet_until || wall0 < req->quiet_until) {
        snprintf(res->reason, sizeof res->reason,
                 "not in %s/%d [%lld, %lld) yet; the attempt's quiet time has not passed", topic,
                 (int)p, (long long)start, (long long)hi);
        return OBX_OK;
    }
    res->kind = OBX__LOOKUP_NOT_FOUND;
    snprintf(res->reason, sizeof res->reason,
             "scanned %s/%d [%lld, %lld) after the quiet time: no message with event ID %s gen "
             "%d%s%s",
             topic, (int)p, (long long)start, (long long)hi, req->event_id, (int)req->envelope_gen,
             res->n_bad ? " whose bytes are its message; " : "", res->n_bad ? res->bad.reason : "");
    return OBX_OK;
}

typedef struct scan_visit {
    obx__scan_fn fn;
    void *user;
} scan_visit;

static int visit_scan(void *user, const rd_kafka_message_t *m) {
    scan_visit *v = user;
    rd_kafka_headers_t *h = NULL;
    char id[OBX_EVENT_ID_LEN + 1] = "";
    /* a message without a valid obx event ID is reported with "" (not published by obx) */
    if (!rd_kafka_message_headers(m, &h) && hdr_copy(h, OBX__H_EVENT_ID, id, sizeof id) &&
        obx_event_id_check(id))
        id[0] = '\0';
    rd_kafka_timestamp_type_t tt;
    int64_t ts = rd_kafka_message_timestamp(m, &tt);
    return v->fn(v->user, id, m->partition, m->offset, ts >= 0 ? ts : 0);
}

/* Every message of every partition of topic from the first offset at or after `since` (by the
 * broker's time index) to the high watermarks read at the start. Bounded like lookup; a scan
 * that cannot finish fails rather than returning a partial audit. */
static obx_err kb_scan(obx__broker *base, const char *topic, int64_t since, obx__scan_fn fn,
                       void *user) {
    kafka_broker *b = (kafka_broker *)base;
    int64_t deadline = obx__mono_ms() + b->lookup_timeout_ms;
    kb_topic *t = topic_get(b, topic);
    if (!t) return obx__fail(OBX_ENOMEM, "kafka: topic handle for '%s'", topic);
    int32_t np = 0;
    obx_err e = topic_partitions(b, t, &np);
    if (e || (e = reader_get(b))) return e;
    span *s = calloc((size_t)np, sizeof *s);
    if (!s) return obx__fail(OBX_ENOMEM, "kafka: scan of '%s'", topic);
    char why[OBX_TEXT_MAX + 1] = "";
    for (int32_t p = 0; p < np && !e; p++) {
        int64_t lo = 0, hi = 0, start = 0;
        bool absence_ok; /* an audit reports what is there; retention gaps do not matter */
        if (watermarks(b, topic, p, deadline, &lo, &hi, why, sizeof why) ||
            start_offset(b, topic, p, since < 0 ? 0 : since, lo, hi, deadline, &start, &absence_ok,
                         why, sizeof why))
            e = obx__fail(OBX_EBROKER, "kafka: scan of '%s': %s", topic, why);
        s[p] = (span){t->name, p, start, hi, false};
    }
    if (!e) {
        int64_t budget = b->lookup_max_msgs;
        scan_visit v = {fn, user};
        scan_status st;
        e = read_spans(b, s, (size_t)np, deadline, &budget, visit_scan, &v, &st, why, sizeof why);
        if (!e && st == SCAN_INCOMPLETE)
            e = obx__fail(OBX_EBROKER, "kafka: scan of '%s' incomplete: %s", topic, why);
    }
    free(s);
    return e;
}

/* ---- the inbox consumer --------------------------------------------------------------------- */

/* A subscribed topic the cluster does not have consumes nothing, silently: say so. The cluster's
 * topic list (metadata for all topics: asking for one by name may create it where the brokers
 * auto-create); when the cluster does not answer within 5 s, nothing can be said. */
static void warn_missing_topics(kafka_broker *b, const char *const *topics, size_t n) {
    const struct rd_kafka_metadata *md = NULL;
    if (rd_kafka_metadata(b->cons, 1, NULL, &md, 5000) != RD_KAFKA_RESP_ERR_NO_ERROR) return;
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (int t = 0; t < md->topic_cnt && !found; t++)
            found = !strcmp(md->topics[t].topic, topics[i]) &&
                    md->topics[t].err != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART;
        if (!found)
            obx__backend_log(OBX__BLOG_WARN, "kafka",
                             "%s: topic '%s' does not exist: nothing to consume until it is "
                             "created",
                             b->hosts, topics[i]);
    }
    rd_kafka_metadata_destroy(md);
}

static obx_err kb_consume_open(obx__broker *base, const char *group, const char *const *topics,
                               size_t n) {
    kafka_broker *b = (kafka_broker *)base;
    obx_err e = obx__check_field("group", group, 1, OBX_NAME_MAX, OBX__CS_NAME);
    if (e) return e;
    if (!n) return obx__fail(OBX_EINVAL, "consume_open: no topics");
    for (size_t i = 0; i < n; i++)
        if ((e = obx__check_field("topic", topics[i], 1, OBX_TOPIC_MAX, OBX__CS_NAME))) return e;
    drop_consumer(b);
    rd_kafka_conf_t *c;
    if ((e = make_conf(b, SCOPE_CONSUMER, &c))) return e;
    if ((e = conf_set(c, "group.id", group)) || (e = conf_set(c, "enable.auto.commit", "false")) ||
        (e = conf_set(c, "enable.auto.offset.store", "false")) ||
        (!user_set(b, SCOPE_CONSUMER, "auto.offset.reset") &&
         (e = conf_set(c, "auto.offset.reset", "earliest")))) {
        rd_kafka_conf_destroy(c);
        return e;
    }
    char err[512];
    b->cons = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!b->cons) {
        rd_kafka_conf_destroy(c);
        return obx__fail(OBX_ECONFIG, "kafka: cannot create the consumer: %s", err);
    }
    rd_kafka_poll_set_consumer(b->cons);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
    for (size_t i = 0; i < n; i++)
        rd_kafka_topic_partition_list_add(l, topics[i], RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t rerr = rd_kafka_subscribe(b->cons, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (rerr) {
        drop_consumer(b);
        return obx__fail(OBX_EBROKER, "kafka: subscribe as group '%s': %s", group,
                         rd_kafka_err2str(rerr));
    }
    warn_missing_topics(b, topics, n);
    return OBX_OK;
}

typedef struct hdr_user {
    rd_kafka_headers_t *h;
    char buf[1024];
} hdr_user;

/* obx__headers_parse's accessor. A value that does not fit buf is returned unterminated with
 * its true length: every obx field is far shorter, and the parser rejects it by length before
 * reading it. */
static const char *hdr_get(void *user, const char *name, size_t *len) {
    hdr_user *u = user;
    const void *v = NULL;
    size_t sz = 0;
    if (!u->h || rd_kafka_header_get_last(u->h, name, &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    *len = sz;
    if (sz >= sizeof u->buf) return v;
    if (sz) memcpy(u->buf, v, sz);
    u->buf[sz] = '\0';
    return u->buf;
}

static obx_err fill_delivery(const rd_kafka_message_t *m, obx__delivery *d) {
    memset(d, 0, sizeof *d);
    obx__strlcpy(d->topic, rd_kafka_topic_name(m->rkt), sizeof d->topic);
    d->partition = m->partition;
    d->offset = m->offset;
    rd_kafka_timestamp_type_t tt;
    int64_t ts = rd_kafka_message_timestamp(m, &tt);
    d->broker_ts = ts >= 0 ? ts : 0;
    hdr_user u;
    if (rd_kafka_message_headers(m, &u.h)) u.h = NULL;
    if (!u.h)
        snprintf(d->header_error, sizeof d->header_error, "no headers (not published by obx)");
    else
        obx__headers_parse(hdr_get, &u, d); /* a bad header is reported in the delivery */
    d->payload = malloc(m->len ? m->len : 1);
    if (!d->payload) return obx__fail(OBX_ENOMEM, "kafka: payload of %zu bytes", m->len);
    if (m->len) memcpy(d->payload, m->payload, m->len);
    d->payload_len = m->len;
    return OBX_OK;
}

/* Up to cap deliveries; waits at most timeout_ms for the first. Kafka does not report
 * redelivery, so `redelivered` is always false (the inbox dedupes by event ID). */
static obx_err kb_consume_poll(obx__broker *base, int timeout_ms, obx__delivery *out, size_t cap,
                               size_t *n) {
    kafka_broker *b = (kafka_broker *)base;
    *n = 0;
    if (!b->cons) return obx__fail(OBX_EINVAL, "kafka: consume_poll before consume_open");
    while (*n < cap) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(b->cons, *n ? 0 : timeout_ms);
        if (!m) break;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->err) {
            /* Consumer errors are reports; librdkafka keeps retrying. Return what we have, or
             * the error when there is nothing (retriable). */
            obx_err e = *n ? OBX_OK
                           : obx__fail(OBX_EBROKER, "kafka consumer: %s (%s)",
                                       rd_kafka_message_errstr(m), rd_kafka_err2name(m->err));
            rd_kafka_message_destroy(m);
            return e;
        }
        obx_err e = fill_delivery(m, &out[*n]);
        rd_kafka_message_destroy(m);
        if (e) return e;
        (*n)++;
    }
    return OBX_OK;
}

static kb_committed *committed_get(kafka_broker *b, const char *topic, int32_t p) {
    for (size_t i = 0; i < b->n_committed; i++)
        if (b->committed[i].partition == p && !strcmp(b->committed[i].topic, topic))
            return &b->committed[i];
    kb_committed *c = realloc(b->committed, (b->n_committed + 1) * sizeof *c);
    if (!c) return NULL;
    b->committed = c;
    c = &b->committed[b->n_committed++];
    obx__strlcpy(c->topic, topic, sizeof c->topic);
    c->partition = p;
    c->next = -1;
    return c;
}

/* Commits offset + 1 of the delivery's partition only, synchronously. Kafka positions are
 * cumulative: this also covers earlier offsets of that partition, and an ack below what this
 * consumer already committed changes nothing. A partition that a rebalance took away is not
 * committed (OBX_ESTALE): its new owner reads from the last committed offset and redelivers. */
static obx_err kb_consume_ack(obx__broker *base, const obx__delivery *d) {
    kafka_broker *b = (kafka_broker *)base;
    if (!b->cons) return obx__fail(OBX_EINVAL, "kafka: consume_ack before consume_open");
    rd_kafka_topic_partition_list_t *asg = NULL;
    rd_kafka_resp_err_t err = rd_kafka_assignment(b->cons, &asg);
    bool owned = !err && rd_kafka_topic_partition_list_find(asg, d->topic, d->partition);
    if (asg) rd_kafka_topic_partition_list_destroy(asg);
    if (err) return obx__fail(OBX_EBROKER, "kafka: assignment: %s", rd_kafka_err2str(err));
    if (!owned)
        return obx__fail(OBX_ESTALE,
                         "kafka: %s/%d is no longer assigned to this consumer (rebalanced): "
                         "offset %lld not committed, its new owner will redeliver it",
                         d->topic, (int)d->partition, (long long)d->offset);
    kb_committed *c = committed_get(b, d->topic, d->partition);
    if (!c) return obx__fail(OBX_ENOMEM, "kafka: commit bookkeeping");
    if (c->next >= d->offset + 1) return OBX_OK;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, d->topic, d->partition)->offset = d->offset + 1;
    err = rd_kafka_commit(b->cons, l, 0 /* synchronous */);
    if (!err) err = l->elems[0].err;
    rd_kafka_topic_partition_list_destroy(l);
    if (err == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION || err == RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID ||
        err == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS)
        return obx__fail(OBX_ESTALE,
                         "kafka: commit of %s/%d offset %lld refused by a rebalance (%s): the "
                         "partition's next owner will redeliver it",
                         d->topic, (int)d->partition, (long long)d->offset + 1,
                         rd_kafka_err2name(err));
    if (err)
        return obx__fail(OBX_EBROKER, "kafka: commit of %s/%d offset %lld: %s (%s)", d->topic,
                         (int)d->partition, (long long)d->offset + 1, rd_kafka_err2str(err),
                         rd_kafka_err2name(err));
    c->next = d->offset + 1;
    return OBX_OK;
}

/* After a handler failure: d and everything after it on its partition must come again. The
 * consumer's position for that partition moves back to d's offset (a seek); nothing was
 * committed for it, so a restart would redeliver it as well. */
static obx_err kb_consume_redeliver(obx__broker *base, const obx__delivery *d) {
    kafka_broker *b = (kafka_broker *)base;
    if (!b->cons) return obx__fail(OBX_EINVAL, "kafka: consume_redeliver before consume_open");
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, d->topic, d->partition)->offset = d->offset;
    rd_kafka_error_t *err = rd_kafka_seek_partitions(b->cons, l, 5000);
    obx_err e = OBX_OK;
    if (err) {
        e = obx__fail(OBX_EBROKER, "kafka: seek %s/%d to %lld: %s", d->topic, (int)d->partition,
                      (long long)d->offset, rd_kafka_error_string(err));
        rd_kafka_error_destroy(err);
    } else if (l->elems[0].err && l->elems[0].err != RD_KAFKA_RESP_ERR__STATE) {
        e = obx__fail(OBX_EBROKER, "kafka: seek %s/%d to %lld: %s", d->topic, (int)d->partition,
                      (long long)d->offset, rd_kafka_err2str(l->elems[0].err));
    }
    /* RD_KAFKA_RESP_ERR__STATE: the partition is no longer ours (rebalance); its new owner
     * starts from the committed offset, which is at or before d. */
    rd_kafka_topic_partition_list_destroy(l);
    return e;
}

/* The retry back-off: the partition's fetcher stops (its position, where consume_redeliver
 * sought it, is kept) until it is resumed. A partition this consumer no longer owns (a
 * rebalance) is not an error: its new owner reads it from the committed offset, and the inbox's
 * failure row keeps the retry from running early there. */
static obx_err kb_consume_pause(obx__broker *base, const char *topic, int32_t part, bool paused) {
    kafka_broker *b = (kafka_broker *)base;
    if (!b->cons) return obx__fail(OBX_EINVAL, "kafka: consume_pause before consume_open");
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, part);
    rd_kafka_resp_err_t err =
        paused ? rd_kafka_pause_partitions(b->cons, l) : rd_kafka_resume_partitions(b->cons, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (err)
        return obx__fail(OBX_EBROKER, "kafka: %s %s/%d: %s", paused ? "pause" : "resume", topic,
                         (int)part, rd_kafka_err2str(err));
    return OBX_OK;
}

const obx__broker_methods obx__kafka_broker_methods = {
    .version = OBX__BROKER_METHODS_VERSION,
    .name = "kafka",
    .caps = OBX__BCAP_LOOKUP_AUTHORITATIVE | OBX__BCAP_SCAN | OBX__BCAP_CONSUME | OBX__BCAP_ORDERED,
    .open = kb_open,
    .close = kb_close,
    .cluster_id = kb_cluster_id,
    .partition_for = kb_partition_for,
    .send = kb_send,
    .poll = kb_poll,
    .in_flight = kb_in_flight,
    .wake_fd = kb_wake_fd,
    .lookup = kb_lookup,
    .quiet_time_ms = kb_quiet,
    .scan = kb_scan,
    .consume_open = kb_consume_open,
    .consume_poll = kb_consume_poll,
    .consume_ack = kb_consume_ack,
    .consume_redeliver = kb_consume_redeliver,
    .consume_pause = kb_consume_pause,
};

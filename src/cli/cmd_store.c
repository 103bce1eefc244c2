/*
 * cmd_store.c — `obx init [--roles PREFIX]`, `obx route set|list` (with delivery sets),
 * `obx enqueue` (with --delay / --not-before), `obx cancel` (a delayed event before its claim),
 * `obx inspect`.
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cmd_init(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB, *roles = NULL;
    int js = 0;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"roles", required_argument, 0, 'r'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "d:", opts)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'r')
            roles = optarg;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("init", "usage: obx init [--db URL] [--roles PREFIX] [--json]");
    }
    if (optind < argc) return cli_usage("init", "unexpected argument '%s'", argv[optind]);
    obx_store *s;
    obx_err e = obx_store_open(db, &s);
    if (e) return cli_fail("init", db, e);
    int before = 0, known = 0;
    e = obx_store_schema_version(s, &before, &known);
    if (!e) e = obx_store_init(s);
    if (e) {
        int rc = cli_fail("init", obx_store_url(s), e);
        obx_store_close(s);
        return rc;
    }
    /* PostgreSQL: which body obx.enqueue() runs, and what to do when it is not the C one */
    char body[320] = "";
    if (obx_store_producer_body(s, body, sizeof body)) body[0] = '\0';
    if (js) {
        json_t *doc =
            json_pack("{s:s,s:i,s:i,s:b,s:s?,s:s?}", "db", obx_store_url(s),
                      "schema_version_before", before, "schema_version", known, "migrated",
                      before != known, "producer_body", body[0] ? body : NULL, "roles", roles);
        if (roles && (e = obx_store_create_roles(s, roles))) {
            json_decref(doc);
            int rc = cli_fail("init --roles", roles, e);
            obx_store_close(s);
            return rc;
        }
        cli_print_json(doc);
        obx_store_close(s);
        return 0;
    }
    if (before == known)
        printf("%s: schema version %d is current\n", obx_store_url(s), known);
    else
        printf("%s: schema migrated from version %d to %d\n", obx_store_url(s), before, known);
    if (body[0]) printf("%s: %s\n", obx_store_url(s), body);
    if (roles) {
        /* PostgreSQL: least-privilege group roles (docs/postgres.md) */
        e = obx_store_create_roles(s, roles);
        if (e) {
            int rc = cli_fail("init --roles", roles, e);
            obx_store_close(s);
            return rc;
        }
        printf("%s: roles %s_producer, %s_relay, %s_auditor, %s_consumer granted (NOLOGIN: "
               "grant them to login roles; consumers also need rows in obx.obx_consumer_grant, "
               "docs/security.md)\n",
               obx_store_url(s), roles, roles, roles, roles);
    }
    obx_store_close(s);
    return 0;
}

/* --also CLUSTER/TOPIC[/ROUTING_KEY_TEMPLATE]: a further delivery-set target (split in place; a
 * template may hold slashes, cluster and topic names cannot). */
static int parse_also(char *v, obx_route_target *t) {
    memset(t, 0, sizeof *t);
    char *s1 = strchr(v, '/');
    if (!s1 || s1 == v || !s1[1]) return -1;
    *s1 = '\0';
    char *s2 = strchr(s1 + 1, '/');
    if (s2) {
        *s2 = '\0';
        if (!s2[1] || s2 == s1 + 1) return -1;
        t->routing_key = s2 + 1;
    }
    t->cluster = v;
    t->topic = s1 + 1;
    return 0;
}

/* A route to a cluster no relay has ever served: accepted (its relay may come later), but its
 * events stay PENDING until one runs, so say so (docs/operations.md, "Clusters nobody serves"). */
static void unserved_warning(obx_store *s, const char *cluster) {
    int64_t seen = 0;
    if (obx_cluster_seen(s, cluster, &seen) || seen) return;
    cli_warn("route set", "warn",
             "no relay has ever served cluster '%s': its events stay PENDING until a relay whose "
             "broker is that cluster runs (obx status lists clusters no live relay serves)",
             cluster);
}

static int route_set(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB;
    obx_route r;
    memset(&r, 0, sizeof r);
    obx_route_target also[OBX_SET_MAX];
    size_t n_also = 0;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"cluster", required_argument, 0, 'c'},
                                         {"topic", required_argument, 0, 't'},
                                         {"routing-key", required_argument, 0, 'k'},
                                         {"algorithm", required_argument, 0, 'a'},
                                         {"serializer", required_argument, 0, 's'},
                                         {"durability", required_argument, 0, 'D'},
                                         {"acks", required_argument, 0, 'A'},
                                         {"max-attempts", required_argument, 0, 'm'},
                                         {"blind-retry", no_argument, 0, 'b'},
                                         {"on-unknown", required_argument, 0, 'U'},
                                         {"unordered", no_argument, 0, 'u'},
                                         {"alias", required_argument, 0, 'l'},
                                         {"also", required_argument, 0, 'o'},
                                         {"completion", required_argument, 0, 'C'},
                                         {"encrypt", required_argument, 0, 'E'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int js = 0;
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': db = optarg; break;
        case 'o':
            if (n_also == OBX_SET_MAX - 1)
                return cli_usage("route set",
                                 "--also: more than %d further destinations (a "
                                 "delivery set has at most %d)",
                                 OBX_SET_MAX - 1, OBX_SET_MAX);
            if (parse_also(optarg, &also[n_also]))
                return cli_usage("route set", "--also: '%s' is not CLUSTER/TOPIC[/ROUTING_KEY]",
                                 optarg);
            n_also++;
            break;
        case 'C': r.completion = optarg; break;
        case 'E': r.encrypt = optarg; break;
        case 'c': r.cluster = optarg; break;
        case 't': r.topic = optarg; break;
        case 'k': r.routing_key = optarg; break;
        case 'a': r.algorithm = optarg; break;
        case 's': r.serializer = optarg; break;
        case 'D': r.durability = optarg; break;
        case 'A': r.required_acks = optarg; break;
        case 'm': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 1000)
                return cli_usage("route set", "--max-attempts: '%s' is not in 1..1000", optarg);
            r.max_attempts = (int)v;
            break;
        }
        case 'b': r.on_unknown = "retry"; break; /* kept: the default now */
        case 'U': r.on_unknown = optarg; break;
        case 'u': r.unordered = 1; break;
        case 'l': r.alias = optarg; break;
        case 'j': js = 1; break;
        default:
            return cli_usage("route set", "usage: obx route set EVENT_TYPE --cluster C --topic T "
                                          "[--routing-key TPL] [--algorithm A] [--serializer S] "
                                          "[--durability D] [--acks A] [--max-attempts N] "
                                          "[--on-unknown retry|hold] [--unordered] [--alias A] "
                                          "[--also CLUSTER/TOPIC[/ROUTING_KEY]]... "
                                          "[--completion all|any] [--encrypt KEY_ID] [--db URL] "
                                          "[--json]");
        }
    }
    if (optind != argc - 1) return cli_usage("route set", "expected one EVENT_TYPE argument");
    r.event_type = argv[optind];
    r.targets = also;
    r.n_targets = n_also;
    obx_store *s;
    int rc = cli_open_store("route set", db, &s);
    if (rc) return rc;
    int64_t gen = 0;
    obx_err e = obx_route_set(s, &r, &gen);
    if (e)
        rc = cli_fail("route set", r.event_type, e);
    else if (js) {
        json_t *t = json_array();
        for (size_t i = 0; i < n_also; i++)
            json_array_append_new(
                t, json_pack("{s:s,s:s}", "cluster", also[i].cluster, "topic", also[i].topic));
        json_t *doc =
            json_pack("{s:s,s:I,s:s,s:s,s:o,s:s?}", "event_type", r.event_type, "route_gen",
                      (json_int_t)gen, "cluster", r.cluster, "topic", r.topic, "also", t,
                      "completion", n_also ? (r.completion ? r.completion : "all") : NULL);
        cli_print_json(doc);
    } else {
        printf("route %s -> %s/%s", r.event_type, r.cluster, r.topic);
        for (size_t i = 0; i < n_also; i++) printf(" + %s/%s", also[i].cluster, also[i].topic);
        if (n_also) printf(" (delivery set, complete on %s)", r.completion ? r.completion : "all");
        printf(": generation %lld\n", (long long)gen);
    }
    for (size_t i = 0; !rc && i <= n_also; i++)
        unserved_warning(s, i ? also[i - 1].cluster : r.cluster);
    obx_store_close(s);
    return rc;
}

static int route_list(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB;
    int all = 0, js = 0;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"all", no_argument, 0, 'a'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'a')
            all = 1;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("route list", "usage: obx route list [--all] [--json] [--db URL]");
    }
    obx_store *s;
    int rc = cli_open_store_ro("route list", db, &s);
    if (rc) return rc;
    char *out = NULL;
    obx_err e = obx_route_list(s, all, &out);
    obx_store_close(s);
    if (e) return cli_fail("route list", db, e);
    if (js) {
        printf("%s\n", out);
    } else {
        json_t *arr = json_loads(out, 0, NULL);
        size_t i;
        json_t *r;
        printf("%-6s %-28s %-14s %-24s %-10s %-6s %s\n", "GEN", "EVENT TYPE", "CLUSTER", "TOPIC",
               "ALGORITHM", "ACKS", "OPTIONS");
        json_array_foreach(arr, i, r) {
            json_t *set = json_object_get(r, "delivery_set"), *t;
            char also[1024] = "";
            size_t k, o = 0;
            json_array_foreach(json_object_get(set, "targets"), k, t) {
                int w =
                    snprintf(also + o, sizeof also - o, "%s%s/%s",
                             o ? "," : " set=", json_string_value(json_object_get(t, "cluster")),
                             json_string_value(json_object_get(t, "topic")));
                if (w > 0 && (size_t)w < sizeof also - o) o += (size_t)w;
            }
            if (set && o + 32 < sizeof also)
                snprintf(also + o, sizeof also - o, " complete=%s",
                         json_string_value(json_object_get(set, "completion")));
            const char *enc = json_string_value(json_object_get(r, "encrypt"));
            printf("%-6lld %-28s %-14s %-24s %-10s %-6s max=%lld%s%s alias=%s%s%s%s\n",
                   (long long)json_integer_value(json_object_get(r, "gen")),
                   json_string_value(json_object_get(r, "event_type")),
                   json_string_value(json_object_get(r, "cluster")),
                   json_string_value(json_object_get(r, "topic")),
                   json_string_value(json_object_get(r, "algorithm")),
                   json_string_value(json_object_get(r, "required_acks")),
                   (long long)json_integer_value(json_object_get(r, "max_attempts")),
                   json_is_true(json_object_get(r, "blind_retry")) ? " on-unknown=retry"
                                                                   : " on-unknown=hold",
                   json_is_true(json_object_get(r, "unordered")) ? " unordered" : "",
                   json_string_value(json_object_get(r, "alias")), also, enc ? " encrypt=" : "",
                   enc ? enc : "");
        }
        json_decref(arr);
    }
    obx_free(out);
    return 0;
}

int cmd_route(int argc, char **argv) {
    if (argc < 2) return cli_usage("route", "usage: obx route set|list ...");
    if (!strcmp(argv[1], "set")) return route_set(argc - 1, argv + 1);
    if (!strcmp(argv[1], "list")) return route_list(argc - 1, argv + 1);
    return cli_usage("route", "unknown subcommand '%s' (set or list)", argv[1]);
}

/* "TYPE/ID@VERSION" */
static int parse_aggregate(const char *s, char **type, char **id, long long *ver) {
    const char *slash = strchr(s, '/');
    const char *at = strrchr(s, '@');
    if (!slash || !at || at < slash) return -1;
    char *end;
    *ver = strtoll(at + 1, &end, 10);
    if (*end || at[1] == '\0') return -1;
    *type = strndup(s, (size_t)(slash - s));
    *id = strndup(slash + 1, (size_t)(at - slash - 1));
    return (*type && *id) ? 0 : -1;
}

/* --otel-endpoint (obx enqueue, obx resolve): an exporter for the command's spans; closing it
 * sends them (cli.h). */
obx_err cli_otel_open(const char *endpoint, obx_otel **out) {
    obx_config *c;
    obx_err e = obx_config_new(&c);
    if (!e) e = obx_config_set(c, "otel.endpoint", endpoint);
    if (!e) e = obx_otel_open(c, out);
    obx_config_free(c);
    return e;
}

/* ms since the epoch now (the wall clock). */
static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "90s", "30m", "2h", "1d", "500ms" -> ms; -1 when malformed. A number too big to multiply is
 * OBX_DELAY_MAX_MS + 1 (over the limit either way). */
static long long delay_ms(const char *s) {
    static const struct {
        const char *unit;
        long long ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
    char *end;
    if (*s < '0' || *s > '9') return -1;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 0) return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit))
            return v > OBX_DELAY_MAX_MS / units[i].ms ? OBX_DELAY_MAX_MS + 1 : v * units[i].ms;
    return -1;
}

/* ISO-8601 UTC "2030-01-02T03:04:05[.678]Z" -> ms since the epoch; -1 when malformed. */
static long long utc_ms(const char *s) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *p = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!p) return -1;
    int ms = 0, digits = 0;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++)
            if (digits++ < 3) ms = ms * 10 + (*p - '0');
        if (!digits) return -1;
        while (digits++ < 3) ms *= 10;
    }
    if (strcmp(p, "Z")) return -1;
    time_t t = timegm(&tm);
    return t < 0 ? -1 : (long long)t * 1000 + ms;
}

/* --delay DURATION (d) or --not-before TIME (n) into ev->not_before_ms; 0 or the exit status of
 * the usage error that names the option and the limit (nothing is written then). */
static int enqueue_delay(int opt, const char *arg, obx_event *ev) {
    if (ev->not_before_ms)
        return cli_usage("enqueue", "--delay and --not-before: give one of them, once");
    long long now = now_ms(), v = opt == 'D' ? delay_ms(arg) : utc_ms(arg);
    if (v < 0)
        return cli_usage("enqueue",
                         opt == 'D' ? "--delay: '%s' is not a duration (e.g. 90s, 30m, 2h, 1d)"
                                    : "--not-before: '%s' is not an ISO-8601 UTC time "
                                      "(e.g. 2030-01-02T03:04:05Z)",
                         arg);
    if ((opt == 'D' ? v : v - now) > OBX_DELAY_MAX_MS)
        return cli_usage("enqueue", "%s: '%s' is over the maximum delay of 366 days (%lld s)",
                         opt == 'D' ? "--delay" : "--not-before", arg,
                         (long long)OBX_DELAY_MAX_MS / 1000);
    ev->not_before_ms = opt == 'D' ? now + v : v;
    if (ev->not_before_ms == 0) ev->not_before_ms = 1; /* the epoch itself: a time in the past */
    return 0;
}

/* --json's line: the result, and not_before_ms for a delayed event. */
static void print_enqueued(const obx_enqueue_result *res, long long not_before) {
    json_t *j = json_pack("{s:s,s:b,s:s,s:s,s:I}", "event_id", res->event_id, "existing",
                          res->existing, "dest_digest", res->dest_digest, "payload_digest",
                          res->payload_digest, "route_gen", (json_int_t)res->route_gen);
    if (j && not_before) json_object_set_new(j, "not_before_ms", json_integer(not_before));
    cli_print_json(j);
}

int cmd_enqueue(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB, *payload_file = "-", *aggregate = NULL, *otel_endpoint = NULL;
    obx_event ev;
    memset(&ev, 0, sizeof ev);
    long long limit = OBX_PAYLOAD_DEFAULT_LIMIT;
    int js = 0;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"type", required_argument, 0, 't'},
                                         {"aggregate", required_argument, 0, 'a'},
                                         {"tenant", required_argument, 0, 'T'},
                                         {"payload-file", required_argument, 0, 'p'},
                                         {"idempotency-key", required_argument, 0, 'i'},
                                         {"correlation-id", required_argument, 0, 'c'},
                                         {"causation-id", required_argument, 0, 'C'},
                                         {"traceparent", required_argument, 0, 'P'},
                                         {"schema", required_argument, 0, 's'},
                                         {"payload-limit", required_argument, 0, 'L'},
                                         {"otel-endpoint", required_argument, 0, 'O'},
                                         {"delay", required_argument, 0, 'D'},
                                         {"not-before", required_argument, 0, 'N'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    int c, rc;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': db = optarg; break;
        case 'D':
        case 'N':
            if ((rc = enqueue_delay(c, optarg, &ev))) return rc;
            break;
        case 't': ev.event_type = optarg; break;
        case 'a': aggregate = optarg; break;
        case 'T': ev.tenant = optarg; break;
        case 'p': payload_file = optarg; break;
        case 'i': ev.idempotency_key = optarg; break;
        case 'c': ev.correlation_id = optarg; break;
        case 'C': ev.causation_id = optarg; break;
        case 'P': ev.traceparent = optarg; break;
        case 's': ev.payload_schema = optarg; break;
        case 'O': otel_endpoint = optarg; break;
        case 'L': {
            char *end;
            limit = strtoll(optarg, &end, 10);
            if (*end || limit < 1) return cli_usage("enqueue", "--payload-limit: '%s'", optarg);
            break;
        }
        case 'j': js = 1; break;
        default:
            return cli_usage("enqueue",
                             "usage: obx enqueue --type T --aggregate TYPE/ID@VERSION --tenant X "
                             "[--payload-file F|-] [--idempotency-key K] [--correlation-id C] "
                             "[--causation-id C] [--traceparent TP] [--schema sha256:..] "
                             "[--delay DURATION | --not-before TIME] [--db URL] "
                             "[--otel-endpoint URL]");
        }
    }
    if (optind < argc) return cli_usage("enqueue", "unexpected argument '%s'", argv[optind]);
    if (!ev.event_type) return cli_usage("enqueue", "--type: required (e.g. order.created.v1)");
    if (!ev.tenant) return cli_usage("enqueue", "--tenant: required");
    if (!aggregate)
        return cli_usage("enqueue", "--aggregate: missing (TYPE/ID@VERSION, e.g. order/o-42@17)");
    char *atype = NULL, *aid = NULL;
    long long ver = 0;
    if (parse_aggregate(aggregate, &atype, &aid, &ver)) {
        free(atype);
        free(aid);
        return cli_usage("enqueue", "--aggregate: '%s' is not TYPE/ID@VERSION (e.g. order/o-42@17)",
                         aggregate);
    }
    ev.aggregate_type = atype;
    ev.aggregate_id = aid;
    ev.aggregate_version = ver;
    unsigned char *payload = NULL;
    size_t plen = 0;
    rc = cli_read_file("enqueue", payload_file, &payload, &plen, (size_t)limit);
    if (rc) {
        free(atype);
        free(aid);
        return rc;
    }
    ev.payload = payload;
    ev.payload_len = plen;
    obx_store *s;
    rc = cli_open_store("enqueue", db, &s);
    if (!rc) {
        obx_err e = obx_store_set_payload_limit(s, (size_t)limit);
        obx_otel *ot = NULL;
        if (!e && otel_endpoint) e = cli_otel_open(otel_endpoint, &ot);
        obx_store_set_otel(s, ot);
        obx_enqueue_result res;
        if (!e) e = obx_enqueue(s, &ev, &res);
        obx_otel_close(ot); /* sends the span before the command ends */
        if (e)
            rc = cli_fail("enqueue", "rejected, nothing stored", e);
        else if (js)
            print_enqueued(&res, ev.not_before_ms);
        else
            printf("%s%s\n", res.event_id,
                   res.existing ? " (idempotency key seen before: first event's ID)" : "");
        obx_store_close(s);
    }
    free(payload);
    free(atype);
    free(aid);
    return rc;
}

int cmd_cancel(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB, *who = NULL, *reason = NULL;
    int js = 0, c;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"who", required_argument, 0, 'w'},
                                         {"reason", required_argument, 0, 'r'},
                                         {"json", no_argument, 0, 'j'},
                                         {0, 0, 0, 0}};
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'w')
            who = optarg;
        else if (c == 'r')
            reason = optarg;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("cancel", "usage: obx cancel EVENT_ID --who NAME --reason TEXT "
                                       "[--db URL] [--json]");
    }
    if (optind != argc - 1) return cli_usage("cancel", "expected one EVENT_ID");
    if (!who) return cli_usage("cancel", "--who: required (who decided, for the audit trail)");
    if (!reason) return cli_usage("cancel", "--reason: required (why, for the audit trail)");
    obx_store *s;
    int rc = cli_open_store("cancel", db, &s);
    if (rc) return rc;
    obx_err e = obx_cancel(s, argv[optind], who, reason);
    obx_store_close(s);
    if (e) return cli_fail("cancel", argv[optind], e);
    if (js)
        cli_print_json(json_pack("{s:s,s:s,s:s,s:s,s:s}", "event_id", argv[optind], "from",
                                 "PENDING", "to", "CANCELLED", "who", who, "reason", reason));
    else
        printf("%s: PENDING -> CANCELLED (cancelled by %s: %s)\n", argv[optind], who, reason);
    return 0;
}

/* A time for people: ISO-8601 UTC (the JSON keeps the epoch ms). */
static void print_time(const char *label, json_int_t ms) {
    char t[32];
    cli_iso_ms((long long)ms, t);
    if (ms) printf("  %-18s %s\n", label, t);
}

static bool is_time_key(const char *k) {
    size_t n = strlen(k);
    return n > 6 && !strcmp(k + n - 6, "_at_ms");
}

/* One frozen object's fields, one a line: strings as they are, times (occurred_at_ms) in
 * ISO-8601 UTC under their name without _ms, anything else as an integer. */
static void print_fields(json_t *obj) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        if (json_is_string(v))
            printf("  %-18s %s\n", k, json_string_value(v));
        else if (is_time_key(k)) { /* the label without its _ms: the value is ISO here */
            char label[64];
            snprintf(label, sizeof label, "%.*s", (int)(strlen(k) - 3), k);
            print_time(label, json_integer_value(v));
        } else
            printf("  %-18s %lld\n", k, (long long)json_integer_value(v));
    }
}

/* Report, part 1: the frozen envelope and destination and the event's state. */
static void inspect_print_event(json_t *d) {
    json_t *env = json_object_get(d, "envelope"), *dst = json_object_get(d, "destination"),
           *st = json_object_get(d, "status");
    printf("event %s\n\nenvelope (outboxEnvelope.v1, frozen):\n",
           json_string_value(json_object_get(d, "event_id")));
    print_fields(env);
    printf("\ndestination (destination.v1, frozen):\n");
    print_fields(dst);
    printf("\nstate:\n  %-18s %s\n  %-18s %lld\n  %-18s %s\n", "state",
           json_string_value(json_object_get(st, "state")), "claim_gen",
           (long long)json_integer_value(json_object_get(st, "claim_gen")), "owner",
           json_string_value(json_object_get(st, "owner")));
    if (json_object_get(st, "logical_event_id")) /* a further target's publish slot */
        printf("  %-18s %s\n", "logical_event_id",
               json_string_value(json_object_get(st, "logical_event_id")));
    print_time("committed_at", json_integer_value(json_object_get(st, "committed_at_ms")));
    print_time("published_at", json_integer_value(json_object_get(st, "published_at_ms")));
}

/* Report, part 2: the attempts, the receipts and the delivery set. */
static void inspect_print_delivery(json_t *d) {
    size_t i;
    json_t *a;
    printf("\nattempts:\n");
    json_array_foreach(json_object_get(d, "attempts"), i, a) {
        printf("  %s gen=%lld claim_gen=%lld owner=%s partition=%lld state=%s %s\n",
               json_string_value(json_object_get(a, "attempt_id")),
               (long long)json_integer_value(json_object_get(a, "attempt_gen")),
               (long long)json_integer_value(json_object_get(a, "claim_gen")),
               json_string_value(json_object_get(a, "owner")),
               (long long)json_integer_value(json_object_get(a, "partition")),
               json_string_value(json_object_get(a, "state")),
               json_string_value(json_object_get(a, "detail")));
    }
    printf("\nreceipts:\n");
    json_array_foreach(json_object_get(d, "receipts"), i, a) {
        printf("  %-11s attempt=%s %s/%s partition=%lld offset=%lld %s\n",
               json_string_value(json_object_get(a, "kind")),
               json_string_value(json_object_get(a, "attempt_id")),
               json_string_value(json_object_get(a, "cluster")),
               json_string_value(json_object_get(a, "topic")),
               (long long)json_integer_value(json_object_get(a, "partition")),
               (long long)json_integer_value(json_object_get(a, "offset")),
               json_string_value(json_object_get(a, "reason")));
    }
    json_t *set = json_object_get(d, "delivery_set");
    if (set) {
        printf("\ndelivery set of %s (complete on %s): %s\n",
               json_string_value(json_object_get(set, "event_id")),
               json_string_value(json_object_get(set, "completion")),
               json_is_true(json_object_get(set, "complete")) ? "delivered" : "not delivered yet");
        json_array_foreach(json_object_get(set, "targets"), i, a) {
            printf("  target %lld %s %-16s %s/%s gen=%lld %s\n",
                   (long long)json_integer_value(json_object_get(a, "target")),
                   json_string_value(json_object_get(a, "slot_id")),
                   json_string_value(json_object_get(a, "state")),
                   json_string_value(json_object_get(a, "cluster")),
                   json_string_value(json_object_get(a, "topic")),
                   (long long)json_integer_value(json_object_get(a, "envelope_gen")),
                   json_string_value(json_object_get(a, "origin")));
        }
    }
}

/* Report, part 3: the migrations and the audit trail. */
static void inspect_print_history(json_t *d) {
    size_t i;
    json_t *a;
    if (json_array_size(json_object_get(d, "migrations"))) printf("\nmigrations:\n");
    json_array_foreach(json_object_get(d, "migrations"), i, a) {
        json_t *o = json_object_get(a, "old"), *n = json_object_get(a, "new");
        char at[32];
        cli_iso_ms((long long)json_integer_value(json_object_get(a, "at_ms")), at);
        printf("  %s %s by %s: %s/%s gen %lld (%s) -> %s/%s gen %lld (%s); proof: %s\n", at,
               json_string_value(json_object_get(a, "kind")),
               json_string_value(json_object_get(a, "who")),
               json_string_value(json_object_get(o, "cluster")),
               json_string_value(json_object_get(o, "topic")),
               (long long)json_integer_value(json_object_get(o, "envelope_gen")),
               json_string_value(json_object_get(o, "dest_digest")),
               json_string_value(json_object_get(n, "cluster")),
               json_string_value(json_object_get(n, "topic")),
               (long long)json_integer_value(json_object_get(n, "envelope_gen")),
               json_string_value(json_object_get(n, "dest_digest")),
               json_string_value(json_object_get(json_object_get(a, "proof"), "kind")));
    }
    printf("\naudit:\n");
    json_array_foreach(json_object_get(d, "audit"), i, a) {
        char at[32];
        cli_iso_ms((long long)json_integer_value(json_object_get(a, "at_ms")), at);
        printf("  %s %-10s %-16s %s -> %s claim_gen=%lld %s%s%s\n", at,
               json_string_value(json_object_get(a, "actor")),
               json_string_value(json_object_get(a, "who")),
               json_string_value(json_object_get(a, "from")),
               json_string_value(json_object_get(a, "to")),
               (long long)json_integer_value(json_object_get(a, "claim_gen")),
               json_string_value(json_object_get(a, "attempt_id")),
               *json_string_value(json_object_get(a, "attempt_id")) ? " " : "",
               json_string_value(json_object_get(a, "reason")));
    }
}

int cmd_inspect(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB;
    int js = 0;
    static const struct option opts[] = {
        {"db", required_argument, 0, 'd'}, {"json", no_argument, 0, 'j'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        if (c == 'd')
            db = optarg;
        else if (c == 'j')
            js = 1;
        else
            return cli_usage("inspect", "usage: obx inspect EVENT_ID [--json] [--db URL]");
    }
    if (optind != argc - 1) return cli_usage("inspect", "expected one EVENT_ID");
    obx_store *s;
    int rc = cli_open_store_ro("inspect", db, &s);
    if (rc) return rc;
    char *out = NULL;
    obx_err e = obx_inspect(s, argv[optind], &out);
    obx_store_close(s);
    if (e) return cli_fail("inspect", argv[optind], e);
    if (js) {
        printf("%s\n", out);
        obx_free(out);
        return 0;
    }
    json_t *d = json_loads(out, 0, NULL);
    obx_free(out);
    inspect_print_event(d);
    inspect_print_delivery(d);
    inspect_print_history(d);
    json_decref(d);
    return 0;
}

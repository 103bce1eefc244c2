/*
 * cmd_resolve.c — `obx resolve`: an operator ends UNKNOWN outcomes (obx_resolve, public API):
 * a same-target retry, or acceptance with evidence found at the broker or in a critical
 * consumer's inbox; always with --who and --reason; never to another destination.
 */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define RESOLVE_USAGE                                                                              \
    "usage: obx resolve [EVENT_ID...] [--type T] [--held] [--older-than DURATION] "                \
    "(--retry | --accept (--offset N --payload-digest D [--topic T] [--partition P] "              \
    "[--attempt A] | --from-consumer ID=URL)) --who NAME --reason TEXT [--dry-run] [--json] "      \
    "[--db URL] [--config FILE] [--broker URL] [--broker-prop K=V]... [--otel-endpoint URL]"

/* "90s", "15m", "2h", "1d", "500ms" -> ms; -1 when malformed. */
static int64_t duration_ms(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 0) return -1;
    if (!strcmp(end, "ms")) return v;
    if (!strcmp(end, "s")) return v * 1000;
    if (!strcmp(end, "m")) return v * 60000;
    if (!strcmp(end, "h")) return v * 3600000;
    if (!strcmp(end, "d")) return v * 86400000;
    return -1;
}

/* `obx resolve`'s flags and what --config adds. */
typedef struct resolve_args {
    const char *db, *config;
    obx_resolve_request r;
    const char *props[32]; /* --broker-prop, in order */
    size_t n_props;
    char *cfg_db, *cfg_broker, *cfg_props, *cfg_consumers; /* from --config, split in place */
    const char *consumers[64];
    const char *cfg_prop_v[32];
    const char *otel_endpoint; /* --otel-endpoint, else the --config file's otel.endpoint */
    char *cfg_otel;
    int js, retry, accept, offset_given;
} resolve_args;

static void args_free(resolve_args *a) {
    obx_free(a->cfg_db);
    obx_free(a->cfg_broker);
    obx_free(a->cfg_props);
    obx_free(a->cfg_consumers);
    obx_free(a->cfg_otel);
}

/* Splits a newline-separated list in place into v (at most cap). */
static size_t split_lines(char *list, const char **v, size_t cap) {
    size_t n = 0;
    for (char *save = NULL, *t = strtok_r(list, "\n", &save); t && n < cap;
         t = strtok_r(NULL, "\n", &save))
        v[n++] = t;
    return n;
}

/* --config FILE: the relay's db, broker, broker properties (unless given as flags) and its
 * declared critical consumers (audit.critical_consumers), the only ones --from-consumer takes. */
static int resolve_config(resolve_args *a) {
    if (!a->config) return 0;
    obx_config *cfg;
    obx_err e = obx_config_load(a->config, &cfg);
    if (e) return cli_fail("resolve", a->config, e);
    e = obx_config_get(cfg, "db", &a->cfg_db);
    if (!e) e = obx_config_get(cfg, "broker", &a->cfg_broker);
    if (!e) e = obx_config_get(cfg, "broker_properties", &a->cfg_props);
    if (!e) e = obx_config_get(cfg, "audit.critical_consumers", &a->cfg_consumers);
    if (!e) e = obx_config_get(cfg, "otel.endpoint", &a->cfg_otel);
    obx_config_free(cfg);
    if (e) return cli_fail("resolve", a->config, e);
    if (!a->db) a->db = a->cfg_db;
    if (!a->otel_endpoint && a->cfg_otel && a->cfg_otel[0]) a->otel_endpoint = a->cfg_otel;
    if (!a->r.broker_url) {
        a->r.broker_url = a->cfg_broker;
        if (!a->n_props) {
            a->r.n_broker_props = split_lines(a->cfg_props, a->cfg_prop_v, 32);
            a->r.broker_props = a->cfg_prop_v;
        }
    }
    a->r.n_critical_consumers = split_lines(a->cfg_consumers, a->consumers, 64);
    a->r.critical_consumers = a->consumers;
    return 0;
}

/* Options: parses argv into a (0, or the exit code of a usage error). */
static int resolve_options(resolve_args *a, int argc, char **argv) {
    obx_resolve_request *r = &a->r;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
                                         {"config", required_argument, 0, 'C'},
                                         {"broker", required_argument, 0, 'b'},
                                         {"broker-prop", required_argument, 0, 'P'},
                                         {"type", required_argument, 0, 't'},
                                         {"held", no_argument, 0, 'H'},
                                         {"older-than", required_argument, 0, 'o'},
                                         {"retry", no_argument, 0, 'r'},
                                         {"accept", no_argument, 0, 'a'},
                                         {"topic", required_argument, 0, 'T'},
                                         {"partition", required_argument, 0, 'p'},
                                         {"offset", required_argument, 0, 'O'},
                                         {"payload-digest", required_argument, 0, 'D'},
                                         {"attempt", required_argument, 0, 'A'},
                                         {"from-consumer", required_argument, 0, 'c'},
                                         {"who", required_argument, 0, 'w'},
                                         {"reason", required_argument, 0, 'R'},
                                         {"dry-run", no_argument, 0, 'n'},
                                         {"json", no_argument, 0, 'j'},
                                         {"otel-endpoint", required_argument, 0, 'E'},
                                         {0, 0, 0, 0}};
    int c;
    char *end;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': a->db = optarg; break;
        case 'C': a->config = optarg; break;
        case 'b': r->broker_url = optarg; break;
        case 'P':
            if (a->n_props == 32) return cli_usage("resolve", "--broker-prop: more than 32");
            a->props[a->n_props++] = optarg; /* a property value may hold commas */
            r->broker_props = a->props;
            r->n_broker_props = a->n_props;
            break;
        case 't': r->event_type = optarg; break;
        case 'H': r->held = 1; break;
        case 'o':
            if ((r->older_than_ms = duration_ms(optarg)) < 0)
                return cli_usage("resolve",
                                 "--older-than: '%s' is not a duration (e.g. 90s, 15m, 2h, 1d)",
                                 optarg);
            break;
        case 'r': a->retry = 1; break;
        case 'a': a->accept = 1; break;
        case 'T': r->topic = optarg; break;
        case 'p': {
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 0 || v > 1000000)
                return cli_usage("resolve", "--partition: '%s' is not a partition number", optarg);
            r->has_partition = 1;
            r->partition = (int32_t)v;
            break;
        }
        case 'O': {
            long long v = strtoll(optarg, &end, 10);
            if (*end || end == optarg || v < 0)
                return cli_usage("resolve", "--offset: '%s' is not an offset (>= 0)", optarg);
            r->offset = v;
            a->offset_given = 1;
            break;
        }
        case 'D': r->payload_digest = optarg; break;
        case 'A': r->attempt_id = optarg; break;
        case 'c': r->consumer = optarg; break;
        case 'w': r->who = optarg; break;
        case 'R': r->reason = optarg; break;
        case 'n': r->dry_run = 1; break;
        case 'j': a->js = 1; break;
        case 'E': a->otel_endpoint = optarg; break;
        default: return cli_usage("resolve", RESOLVE_USAGE);
        }
    }
    if (a->retry == a->accept)
        return cli_usage("resolve", "say what to do: --retry (a new attempt to the frozen "
                                    "destination) or --accept (with evidence)");
    if (!r->who || !*r->who)
        return cli_usage("resolve", "--who: required (who decided, for the audit trail)");
    if (!r->reason || !*r->reason)
        return cli_usage("resolve", "--reason: required (why, for the audit trail)");
    if (a->accept && !r->consumer && (!r->payload_digest || !a->offset_given))
        return cli_usage("resolve", "--accept: give the evidence found at the broker (--offset and "
                                    "--payload-digest of the message), or --from-consumer ID=URL");
    return 0;
}

int cmd_resolve(int argc, char **argv) {
    resolve_args a;
    memset(&a, 0, sizeof a);
    int rc = resolve_options(&a, argc, argv);
    if (!rc) rc = resolve_config(&a);
    if (rc) {
        args_free(&a);
        return rc;
    }
    obx_resolve_request r = a.r;
    const char *db = a.db ? a.db : CLI_DEFAULT_DB;
    int js = a.js;
    r.action = a.retry ? "retry" : "accept";
    r.event_ids = (const char *const *)(argv + optind);
    r.n_event_ids = (size_t)(argc - optind);
    obx_store *s;
    /* a dry run opens the outbox read-only: it cannot write, even by a bug */
    rc = cli_open_store_with("resolve", db, r.dry_run ? OBX_STORE_READ_ONLY : 0, "outbox", &s);
    if (rc) {
        args_free(&a);
        return rc;
    }
    char *out = NULL;
    size_t refused = 0;
    obx_otel *ot = NULL; /* a span per resolution, sent when it closes */
    obx_err e = a.otel_endpoint ? cli_otel_open(a.otel_endpoint, &ot) : OBX_OK;
    obx_store_set_otel(s, ot);
    if (!e) e = obx_resolve(s, &r, &out, &refused);
    obx_store_close(s);
    obx_otel_close(ot);
    args_free(&a);
    if (e) return cli_fail("resolve", r.n_event_ids == 1 ? r.event_ids[0] : "events", e);
    if (js) {
        printf("%s\n", out);
    } else {
        json_t *doc = json_loads(out, 0, NULL), *it;
        size_t i;
        json_array_foreach(json_object_get(doc, "events"), i, it) {
            printf("%s: %s: %s\n", json_string_value(json_object_get(it, "event_id")),
                   json_string_value(json_object_get(it, "result")),
                   json_string_value(json_object_get(it, "detail")));
        }
        printf("obx resolve: %lld resolved, %lld refused%s\n",
               (long long)json_integer_value(json_object_get(doc, "resolved")),
               (long long)json_integer_value(json_object_get(doc, "refused")),
               r.dry_run ? " (dry run: nothing changed)" : "");
        json_decref(doc);
    }
    obx_free(out);
    return refused ? 1 : 0;
}

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
    "[--db URL]"

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

int cmd_resolve(int argc, char **argv) {
    const char *db = CLI_DEFAULT_DB;
    obx_resolve_request r;
    memset(&r, 0, sizeof r);
    int js = 0, retry = 0, accept = 0, offset_given = 0;
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},
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
                                         {0, 0, 0, 0}};
    int c;
    char *end;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        switch (c) {
        case 'd': db = optarg; break;
        case 't': r.event_type = optarg; break;
        case 'H': r.held = 1; break;
        case 'o':
            if ((r.older_than_ms = duration_ms(optarg)) < 0)
                return cli_usage("resolve",
                                 "--older-than: '%s' is not a duration (e.g. 90s, 15m, 2h, 1d)",
                                 optarg);
            break;
        case 'r': retry = 1; break;
        case 'a': accept = 1; break;
        case 'T': r.topic = optarg; break;
        case 'p': {
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 0 || v > 1000000)
                return cli_usage("resolve", "--partition: '%s' is not a partition number", optarg);
            r.has_partition = 1;
            r.partition = (int32_t)v;
            break;
        }
        case 'O': {
            long long v = strtoll(optarg, &end, 10);
            if (*end || end == optarg || v < 0)
                return cli_usage("resolve", "--offset: '%s' is not an offset (>= 0)", optarg);
            r.offset = v;
            offset_given = 1;
            break;
        }
        case 'D': r.payload_digest = optarg; break;
        case 'A': r.attempt_id = optarg; break;
        case 'c': r.consumer = optarg; break;
        case 'w': r.who = optarg; break;
        case 'R': r.reason = optarg; break;
        case 'n': r.dry_run = 1; break;
        case 'j': js = 1; break;
        default: return cli_usage("resolve", RESOLVE_USAGE);
        }
    }
    if (retry == accept)
        return cli_usage("resolve", "say what to do: --retry (a new attempt to the frozen "
                                    "destination) or --accept (with evidence)");
    if (!r.who || !*r.who)
        return cli_usage("resolve", "--who: required (who decided, for the audit trail)");
    if (!r.reason || !*r.reason)
        return cli_usage("resolve", "--reason: required (why, for the audit trail)");
    if (accept && !r.consumer && (!r.payload_digest || !offset_given))
        return cli_usage("resolve", "--accept: give the evidence found at the broker (--offset and "
                                    "--payload-digest of the message), or --from-consumer ID=URL");
    r.action = retry ? "retry" : "accept";
    r.event_ids = (const char *const *)(argv + optind);
    r.n_event_ids = (size_t)(argc - optind);
    obx_store *s;
    int rc = cli_open_store("resolve", db, &s);
    if (rc) return rc;
    char *out = NULL;
    size_t refused = 0;
    obx_err e = obx_resolve(s, &r, &out, &refused);
    obx_store_close(s);
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

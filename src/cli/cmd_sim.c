/*
 * cmd_sim.c — `obx sim --traces N --seed S [--jobs J] [--json] [--fault NAME ...]
 *                     [--replay TRACE_ID] [--mutation NAME]`
 * The deterministic simulator and release gate (docs/design.md, "The release gate"). Exit 0 iff
 * the gate passes.
 */
#include "cli.h"
#include "obx_test.h"

#include <getopt.h>
#include <malloc.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void progress(void *user, long done, long total) {
    (void)user;
    if (!isatty(2)) return;
    int w = 40, f = total ? (int)((double)done / (double)total * w) : w;
    fprintf(stderr, "\r  [%.*s%*s] %ld/%ld traces", f, "########################################",
            w - f, "", done, total);
    fflush(stderr);
}

static long num(json_t *j, const char *k) {
    return (long)json_integer_value(json_object_get(j, k));
}

/* Options: parses argv into o and *js; cmdline gets the flags a replay must repeat (0, or the
 * exit code of a usage error). */
static int sim_options(obx_sim_options *o, int *js, char *cmdline, size_t cmdcap, int argc,
                       char **argv) {
    static const struct option opts[] = {
        {"traces", required_argument, 0, 'n'},   {"seed", required_argument, 0, 's'},
        {"jobs", required_argument, 0, 'j'},     {"json", no_argument, 0, 'J'},
        {"fault", required_argument, 0, 'f'},    {"replay", required_argument, 0, 'r'},
        {"mutation", required_argument, 0, 'm'}, {"fail-fast", no_argument, 0, 'F'},
        {"db", required_argument, 0, 'D'},       {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = cli_getopt(argc, argv, "", opts)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'n':
            o->traces = strtol(optarg, &end, 10);
            if (*end || o->traces < 1)
                return cli_usage("sim", "--traces: '%s' is not >= 1", optarg);
            break;
        case 's':
            o->seed = strtoull(optarg, &end, 10);
            if (*end || !*optarg) return cli_usage("sim", "--seed: '%s' is not a number", optarg);
            break;
        case 'j':
            o->jobs = (int)strtol(optarg, &end, 10);
            if (*end || o->jobs < 1 || o->jobs > 64)
                return cli_usage("sim", "--jobs: '%s' is not in 1..64", optarg);
            break;
        case 'J': *js = 1; break;
        case 'f': {
            int i;
            if (obx_sim_fault_index(optarg, &i)) {
                char known[2048] = "";
                for (size_t k = 0, l = 0; k < obx_sim_fault_count() && l < sizeof known; k++)
                    l +=
                        (size_t)snprintf(known + l, sizeof known - l, " %s", obx_sim_fault_name(k));
                return cli_usage("sim", "--fault: unknown class '%s'; known:%s", optarg, known);
            }
            o->faults_mask |= 1ull << i;
            size_t l = strlen(cmdline);
            snprintf(cmdline + l, cmdcap - l, " --fault %s", optarg);
            break;
        }
        case 'r':
            o->replay = strtol(optarg, &end, 10);
            if (*end || o->replay < 0)
                return cli_usage("sim", "--replay: '%s' is not a trace ID", optarg);
            break;
        case 'F': o->fail_fast = 1; break;
        case 'D': {
            if (obx_url_check(optarg, "store")) return cli_fail("sim", "--db", OBX_EURL);
            o->db_url = optarg;
            char *red = NULL;
            if (obx_url_redact(optarg, &red) == OBX_OK) {
                size_t l = strlen(cmdline);
                snprintf(cmdline + l, cmdcap - l, " --db %s", red);
                obx_free(red);
            }
            break;
        }
        case 'm': {
            o->mutation = optarg;
            size_t l = strlen(cmdline);
            snprintf(cmdline + l, cmdcap - l, " --mutation %s", optarg);
            break;
        }
        default:
            return cli_usage("sim", "usage: obx sim --traces N --seed S [--jobs J] [--json] "
                                    "[--fault NAME ...] [--replay TRACE_ID] [--db postgres://...]");
        }
    }
    if (optind < argc) return cli_usage("sim", "unexpected argument '%s'", argv[optind]);
    return 0;
}

/* Report (default): the gate's checks as a table, the faults fired and how to replay the
 * first failing traces. */
static void sim_print(json_t *j, bool passed, unsigned long long seed, const char *cmdline) {
    printf("\nrelease gate: %ld traces in %.1f s (%.0f traces/s, %d jobs), trace hash %.16s\n\n",
           num(j, "traces"), json_real_value(json_object_get(j, "seconds")),
           json_real_value(json_object_get(j, "traces_per_second")), (int)num(j, "jobs"),
           json_string_value(json_object_get(j, "trace_hash")));
    struct {
        const char *label, *key;
    } zero[] = {{"lost events", "lost_events"},
                {"second logical event IDs", "second_event_ids"},
                {"cross-destination retries", "cross_destination_retries"},
                {"same-ID payload/destination divergence", "digest_divergence"},
                {"consumer duplicate effects", "consumer_duplicate_effects"},
                {"sends under a stale claim", "stale_claim_sends"},
                {"UNKNOWN not traceable by attempt", "unknown_untraceable"},
                {"purges without the consumers' evidence", "premature_purges"},
                {"migrations away from a target holding it", "migrated_with_old_copy"},
                {"internal errors", "internal_errors"},
                {"liveness failures", "liveness_failures"}};
    printf("  %-42s %12s  %s\n", "check", "value", "gate");
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++)
        printf("  %-42s %12ld  %s\n", zero[i].label, num(j, zero[i].key),
               num(j, zero[i].key) ? "FAIL (must be 0)" : "ok (0)");
    long lt = num(j, "late_ack_total"), lc = num(j, "late_ack_converged");
    printf("  %-42s %5ld/%-6ld  %s\n", "late valid ACKs in slot or duplicate log", lc, lt,
           lc == lt ? "ok (100%)" : "FAIL (must be 100%)");
    double p99 = json_real_value(json_object_get(j, "unknown_p99_s"));
    printf("  %-42s %10.1f s  %s\n", "UNKNOWN resolution p99 (virtual time)", p99,
           p99 < 900 ? "ok (< 15 min)" : "FAIL (must be < 15 min)");
    printf("  %-42s %12ld\n", "UNKNOWN attempts", num(j, "unknown_total"));
    printf("  %-42s %12ld\n", "quarantined receipts (alarms, not failures)",
           num(j, "quarantined_receipts"));
    printf("  %-42s %12ld\n", "events purged (tombstones)", num(j, "purged"));
    printf("  %-42s %5ld/%-6ld\n", "migrations done / refused (no proof)", num(j, "migrated"),
           num(j, "migration_refused"));
    printf("\n  faults fired:\n");
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(j, "faults_fired"), k, v) {
        printf("    %-30s %10lld%s\n", k, (long long)json_integer_value(v),
               json_integer_value(v) ? "" : "   (never fired)");
    }
    printf("\n  gate: %s\n", passed ? "PASSED" : "FAILED");
    json_t *f = json_object_get(j, "failing_traces");
    if (json_array_size(f)) {
        printf("\n  first failure: %s\n", json_string_value(json_object_get(j, "first_failure")));
        size_t i;
        json_t *t;
        json_array_foreach(f, i, t) {
            printf("  failing trace %lld: replay with  obx sim --seed %llu --replay %lld%s\n",
                   (long long)json_integer_value(t), seed, (long long)json_integer_value(t),
                   cmdline);
            if (i == 4) break;
        }
    }
}

int cmd_sim(int argc, char **argv) {
    obx_sim_options o = {.seed = 1, .traces = 100000, .jobs = 1, .replay = -1};
    int js = 0;
    char cmdline[1024] = "";
    int rc = sim_options(&o, &js, cmdline, sizeof cmdline, argc, argv);
    if (rc) return rc;
    if (!js) {
        o.progress = progress;
        if (o.replay >= 0)
            fprintf(stderr, "obx sim: replaying trace %ld of seed %llu\n", o.replay,
                    (unsigned long long)o.seed);
        else
            fprintf(stderr, "obx sim: %ld traces, seed %llu, %d jobs\n", o.traces,
                    (unsigned long long)o.seed, o.jobs);
    }
    /* The workers allocate and free the same working set for every trace; by default glibc
     * gives freed heap tops back to the kernel and maps large blocks separately, and the
     * resulting page faults and TLB shootdowns between the workers cost ~15% of the run.
     * This process runs nothing else: keep the memory. */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024);
    char *out = NULL;
    obx_err e = obx_sim_run(&o, &out);
    if (!js && isatty(2)) fprintf(stderr, "\n");
    if (e) return cli_fail("sim", "run", e);
    json_t *j = json_loads(out, 0, NULL);
    bool passed = json_is_true(json_object_get(j, "passed"));
    if (js)
        printf("%s\n", out);
    else
        sim_print(j, passed, (unsigned long long)o.seed, cmdline);
    json_decref(j);
    obx_free(out);
    return passed ? 0 : 1;
}

/*
 * bench_scale.c — scenario 5 of bench/run.sh: scale-out. 1, 2 and 4 `obx relay` processes on one
 * PostgreSQL (PostgreSQL + Kafka mock cluster, 8 partitions) drain the same pre-filled backlog;
 * beside them, in the same repetition, the minimal claim-and-mark limit (pgbench, 8 clients) on
 * a copy of the same rows. Then `obx sim` traces/s with 1 and 2 jobs (the simulator's own
 * scale-out; its 1,000,000-traces target is bench/sim_gate.sh).
 *
 *   bench_scale [--events N] [--relays 1,2,4] [--reps R] [--sim-traces T] [--set KEY=VALUE]...
 *               [--dir DIR] [--keep]
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SETS 16
#define MAX_K 6

static long n_events = 200000;
static int reps = 3;
static long sim_traces = 2000;
static bool keep;
static char dir[512];
static const char *sets[MAX_SETS + 1];
static int n_sets;

/* `obx sim` wall time for T traces with `jobs` jobs; traces/s. */
static double sim_rate(int jobs) {
    char t[32], j[16], log[600];
    snprintf(t, sizeof t, "%ld", sim_traces);
    snprintf(j, sizeof j, "%d", jobs);
    snprintf(log, sizeof log, "%s/sim-%d.log", dir, jobs);
    char *argv[] = {(char *)bn_obx_bin(), "sim",    "--traces", t,        "--seed",
                    "20261130",           "--jobs", j,          "--json", NULL};
    double t0 = bn_now();
    int st = bn_run(log, argv);
    double dt = bn_now() - t0;
    if (st != 0) bn_die("obx sim exited %d (log %s)", st, log);
    return (double)sim_traces / dt;
}

int main(int argc, char **argv) {
    char relays_arg[64] = "1,2,4";
    snprintf(dir, sizeof dir, "/tmp/obx-bench-scale-%d", (int)getpid());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--events") && i + 1 < argc)
            n_events = atol(argv[++i]);
        else if (!strcmp(argv[i], "--relays") && i + 1 < argc)
            snprintf(relays_arg, sizeof relays_arg, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sim-traces") && i + 1 < argc)
            sim_traces = atol(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else {
            fprintf(stderr, "usage: bench_scale [--events N] [--relays 1,2,4] [--reps R] "
                            "[--sim-traces T] [--set KEY=VALUE]... [--dir DIR] [--keep]\n");
            return 2;
        }
    }
    if (n_events < 1000 || reps < 1 || reps > BN_MAX_REPS || sim_traces < 0)
        bn_die("--events >= 1000, --reps 1..20, --sim-traces >= 0");
    int ks[MAX_K], nk = 0;
    for (char *t = strtok(relays_arg, ","); t && nk < MAX_K; t = strtok(NULL, ","))
        ks[nk++] = atoi(t);
    mkdir(dir, 0755);
    obx_kafka_mock *mock = NULL;
    char boot[512], broker[700];
    if (obx_kafka_mock_start(3, "orders", 8, boot, sizeof boot, &mock))
        bn_die("kafka mock: %s", obx_errmsg());
    bn_kafka_broker_url(boot, broker, sizeof broker);
    double rate[MAX_K][BN_MAX_REPS], vs1[MAX_K][BN_MAX_REPS], lim[BN_MAX_REPS],
        cpu10k[MAX_K][BN_MAX_REPS], pg10k[MAX_K][BN_MAX_REPS], sim[2][BN_MAX_REPS];
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++) {
        char url[1024], log[700];
        bn_pg_fresh("obx_bench_src", "orders", url, sizeof url);
        PGconn *c = bn_pg_connect(url);
        bn_pg_fill(c, 1, n_events, "PENDING");
        PQfinish(c);
        snprintf(log, sizeof log, "%s/pgbench-claim.log", dir);
        lim[rep] = bn_pg_claim_mark_limit("obx_bench_src", n_events, log, keep, NULL, NULL);
        bn_log("rep %d: claim-and-mark limit %.0f rows/s", rep + 1, lim[rep]);
        for (int x = 0; x < nk; x++) {
            /* alternate the order so that drift in the machine's load falls on every count */
            int k = rep % 2 ? nk - 1 - x : x;
            bn_pg_copy("obx_bench_scale", "obx_bench_src");
            char db[1024], prefix[64];
            bn_pg_url("obx_bench_scale", db, sizeof db);
            snprintf(prefix, sizeof prefix, "scale-r%d-k%d", rep + 1, ks[k]);
            bn_relay_run r;
            bn_pg_relays(db, broker, ks[k], prefix, dir, sets, n_events, 1800, &r);
            rate[k][rep] = r.rate;
            cpu10k[k][rep] = r.cpu_s * 10000.0 / (double)n_events;
            pg10k[k][rep] = r.pg_cpu_s * 10000.0 / (double)n_events;
            bn_log("rep %d: %d relay(s): %.0f ev/s", rep + 1, ks[k], r.rate);
        }
        for (int k = 0; k < nk; k++) vs1[k][rep] = rate[k][rep] / rate[0][rep];
        bn_pg_drop("obx_bench_src");
        if (!keep) bn_pg_drop("obx_bench_scale");
        if (sim_traces) {
            sim[0][rep] = sim_rate(1);
            sim[1][rep] = sim_rate(2);
            bn_log("rep %d: obx sim %.0f traces/s (1 job), %.0f (2 jobs)", rep + 1, sim[0][rep],
                   sim[1][rep]);
        }
    }
    obx_kafka_mock_stop(mock);
    printf("\nscale-out: %ld-event backlog, PostgreSQL + Kafka (mock, 8 partitions), k relay "
           "processes; median of %d reps; load average %.1f before, %.1f after (2 cores)\n\n",
           n_events, reps, load0, bn_loadavg());
    printf("| relays | obx ev/s | vs 1 relay | claim-and-mark limit rows/s | obx/limit | relay "
           "CPU s/10k ev | server CPU s/10k ev |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    double l = bn_median(lim, reps);
    for (int k = 0; k < nk; k++) {
        double ratio[BN_MAX_REPS];
        for (int i = 0; i < reps; i++) ratio[i] = rate[k][i] / lim[i];
        printf("| %d | %.0f | %.2f | %.0f | %.2f | %.2f | %.2f |\n", ks[k],
               bn_median(rate[k], reps), bn_median(vs1[k], reps), l, bn_median(ratio, reps),
               bn_median(cpu10k[k], reps), bn_median(pg10k[k], reps));
    }
    if (sim_traces) {
        double s1 = bn_median(sim[0], reps), s2 = bn_median(sim[1], reps);
        printf("\n| obx sim (%ld traces) | traces/s | vs 1 job | 1,000,000 traces would take "
               "|\n|---|---:|---:|---:|\n",
               sim_traces);
        printf("| --jobs 1 | %.0f | 1.00 | %.0f s |\n", s1, 1e6 / s1);
        printf("| --jobs 2 | %.0f | %.2f | %.0f s (target < 300 s: %s) |\n", s2, s2 / s1, 1e6 / s2,
               1e6 / s2 < 300 ? "met" : "MISSED");
    }
    printf("\nrelay logs: %s\n", dir);
    return 0;
}

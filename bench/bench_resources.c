/*
 * bench_resources.c — scenario 6 of bench/run.sh: what the relay costs. One `obx relay`
 * (PostgreSQL + Kafka mock cluster) starts on a backlog of B pending events (default 10,000 and
 * 1,000,000) and runs until D of them are PUBLISHED (default 100,000, or all of a smaller
 * backlog): its peak RSS (VmHWM) with the whole backlog waiting, its CPU seconds per 10,000
 * events, and the database server's. Each backlog is filled once and copied
 * (CREATE DATABASE ... TEMPLATE) for every repetition.
 *
 *   bench_resources [--backlogs 10000,1000000] [--drain D] [--reps R] [--set KEY=VALUE]...
 *                   [--dir DIR] [--keep]
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SETS 16
#define MAX_B 4

int main(int argc, char **argv) {
    char backlogs_arg[128] = "10000,1000000", dir[512];
    long drain = 100000;
    int reps = 3, n_sets = 0;
    bool keep = false;
    const char *sets[MAX_SETS + 1] = {0};
    snprintf(dir, sizeof dir, "/tmp/obx-bench-res-%d", (int)getpid());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backlogs") && i + 1 < argc)
            snprintf(backlogs_arg, sizeof backlogs_arg, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--drain") && i + 1 < argc)
            drain = atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else {
            fprintf(stderr, "usage: bench_resources [--backlogs 10000,1000000] [--drain D] "
                            "[--reps R] [--set KEY=VALUE]... [--dir DIR] [--keep]\n");
            return 2;
        }
    }
    if (drain < 1000 || reps < 1 || reps > BN_MAX_REPS) bn_die("--drain >= 1000, --reps 1..20");
    long b[MAX_B];
    int nb = 0;
    for (char *t = strtok(backlogs_arg, ","); t && nb < MAX_B; t = strtok(NULL, ","))
        if ((b[nb++] = atol(t)) < 1000) bn_die("--backlogs: sizes >= 1000");
    mkdir(dir, 0755);
    for (int k = 0; k < nb; k++) {
        char name[64], url[1024];
        snprintf(name, sizeof name, "obx_bench_res_src%d", k);
        bn_pg_fresh(name, "orders", url, sizeof url);
        PGconn *c = bn_pg_connect(url);
        double t0 = bn_now();
        bn_pg_fill(c, 1, b[k], "PENDING");
        bn_sql(c, "VACUUM ANALYZE");
        bn_log("%s: %ld pending events in %.0f s", name, b[k], bn_now() - t0);
        PQfinish(c);
    }
    obx_kafka_mock *mock = NULL;
    char boot[512], broker[700];
    if (obx_kafka_mock_start(3, "orders", 8, boot, sizeof boot, &mock))
        bn_die("kafka mock: %s", obx_errmsg());
    bn_kafka_broker_url(boot, broker, sizeof broker);
    double rss[MAX_B][BN_MAX_REPS], cpu[MAX_B][BN_MAX_REPS], pg[MAX_B][BN_MAX_REPS],
        rate[MAX_B][BN_MAX_REPS];
    long n[MAX_B];
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++)
        for (int x = 0; x < nb; x++) {
            int k = rep % 2 ? nb - 1 - x : x;
            n[k] = b[k] < drain ? b[k] : drain;
            char src[64];
            snprintf(src, sizeof src, "obx_bench_res_src%d", k);
            bn_pg_copy("obx_bench_res", src);
            char db[1024], prefix[64];
            bn_pg_url("obx_bench_res", db, sizeof db);
            snprintf(prefix, sizeof prefix, "res-%ld-r%d", b[k], rep + 1);
            bn_relay_run r;
            bn_pg_relays(db, broker, 1, prefix, dir, sets, n[k], 1800, &r);
            rss[k][rep] = (double)r.hwm_kib / 1024.0;
            cpu[k][rep] = r.cpu_s * 10000.0 / (double)n[k];
            pg[k][rep] = r.pg_cpu_s * 10000.0 / (double)n[k];
            rate[k][rep] = r.rate;
            bn_log("rep %d: backlog %ld: peak RSS %.1f MiB, relay CPU %.2f s/10k ev, %.0f ev/s",
                   rep + 1, b[k], rss[k][rep], cpu[k][rep], r.rate);
        }
    obx_kafka_mock_stop(mock);
    printf("\nrelay resources: PostgreSQL + Kafka (mock), 1 relay (2 dispatchers, batch 256, "
           "window 2048 unless --set), run until min(backlog, %ld) events are PUBLISHED; median "
           "of %d reps; load average %.1f before, %.1f after (2 cores)\n\n",
           drain, reps, load0, bn_loadavg());
    printf("| pending backlog | events published | relay peak RSS MiB | target | relay CPU s/10k "
           "ev | server CPU s/10k ev | ev/s |\n|---:|---:|---:|---|---:|---:|---:|\n");
    for (int k = 0; k < nb; k++) {
        double m = bn_median(rss[k], reps);
        printf("| %ld | %ld | %.1f | %s | %.2f | %.2f | %.0f |\n", b[k], n[k], m,
               b[k] >= 1000000 ? (m < 64 ? "< 64 MiB: met" : "< 64 MiB: MISSED") : "",
               bn_median(cpu[k], reps), bn_median(pg[k], reps), bn_median(rate[k], reps));
    }
    printf("\nrelay logs: %s\n", dir);
    for (int k = 0; k < nb; k++) {
        char name[64];
        snprintf(name, sizeof name, "obx_bench_res_src%d", k);
        bn_pg_drop(name);
    }
    if (!keep) bn_pg_drop("obx_bench_res");
    return 0;
}

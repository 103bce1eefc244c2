/*
 * bench_backlog.c — scenario 4 of bench/run.sh: backlog independence. The relay drains the same
 * pending backlog (PostgreSQL + Kafka mock cluster) from outboxes that already hold R rows
 * PUBLISHED and RETAINED (half each, with their attempts, primary receipts and audit rows), for
 * each R given (default 10,000 and 5,000,000), and once more on the largest while `obx purge`
 * runs beside it (a critical consumer whose forced watermark covers the old rows, so the purge
 * retains and purges a fresh slice of old PUBLISHED rows during the run). The ratio column is
 * each figure over the smallest outbox's figure in the same repetition (target: within 10%).
 *
 * The old rows are filled once per size (SQL bulk insert with the real digests); each
 * repetition adds its backlog (and, for the purge row, its slice of purgeable rows) on top.
 *
 *   bench_backlog [--events N] [--retained 10000,5000000] [--reps R] [--purge-rows P]
 *                 [--purge-rate EV_PER_S] [--no-purge] [--set KEY=VALUE]... [--dir DIR] [--keep]
 *
 * --purge-rate runs the purge with retention.max_rate (default 0: unpaced).
 */
#include "bench.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SETS 16
#define MAX_SIZES 4

static long n_events = 100000, purge_rows = 200000, purge_rate; /* 0: unpaced */
static int reps = 3;
static bool keep, do_purge = true;
static char dir[512];
static const char *sets[MAX_SETS + 1];
static int n_sets;

typedef struct outbox {
    long retained;
    char name[64], url[1024];
    long next; /* the next event number to fill */
} outbox;

static void fill_old(outbox *o) {
    bn_pg_fresh(o->name, "orders", o->url, sizeof o->url);
    PGconn *c = bn_pg_connect(o->url);
    double t0 = bn_now();
    long half = o->retained / 2;
    bn_pg_fill(c, 1, half, "PUBLISHED");
    bn_pg_fill(c, 1 + half, o->retained - half, "RETAINED");
    o->next = o->retained + 1;
    bn_sql(c, "VACUUM ANALYZE");
    bn_log("%s: %ld PUBLISHED/RETAINED rows in %.0f s, database %lld MiB", o->name, o->retained,
           bn_now() - t0, bn_sql_ll(c, "SELECT pg_database_size(current_database()) / 1048576"));
    PQfinish(c);
}

static void add_backlog(outbox *o) {
    PGconn *c = bn_pg_connect(o->url);
    bn_pg_fill(c, o->next, n_events, "PENDING");
    o->next += n_events;
    PQfinish(c);
}

static double run(outbox *o, const char *broker, const char *tag, int rep) {
    char prefix[96];
    snprintf(prefix, sizeof prefix, "backlog-%s-r%d", tag, rep + 1);
    bn_relay_run r;
    bn_pg_relays(o->url, broker, 1, prefix, dir, sets, n_events, 1800, &r);
    return r.rate;
}

int main(int argc, char **argv) {
    char sizes_arg[128] = "10000,5000000";
    snprintf(dir, sizeof dir, "/tmp/obx-bench-backlog-%d", (int)getpid());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--events") && i + 1 < argc)
            n_events = atol(argv[++i]);
        else if (!strcmp(argv[i], "--retained") && i + 1 < argc)
            snprintf(sizes_arg, sizeof sizes_arg, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--purge-rows") && i + 1 < argc)
            purge_rows = atol(argv[++i]);
        else if (!strcmp(argv[i], "--purge-rate") && i + 1 < argc)
            purge_rate = atol(argv[++i]);
        else if (!strcmp(argv[i], "--no-purge"))
            do_purge = false;
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else {
            fprintf(stderr, "usage: bench_backlog [--events N] [--retained 10000,5000000] [--reps "
                            "R] [--purge-rows P] [--purge-rate EV_PER_S] [--no-purge] [--set "
                            "KEY=VALUE]... [--dir DIR] "
                            "[--keep]\n");
            return 2;
        }
    }
    if (n_events < 1000 || reps < 1 || reps > BN_MAX_REPS || purge_rows < 1000)
        bn_die("--events >= 1000, --reps 1..20, --purge-rows >= 1000");
    outbox ob[MAX_SIZES];
    int ns = 0;
    for (char *t = strtok(sizes_arg, ","); t && ns < MAX_SIZES; t = strtok(NULL, ",")) {
        ob[ns] = (outbox){.retained = atol(t)};
        snprintf(ob[ns].name, sizeof ob[ns].name, "obx_bench_bl%d", ns);
        if (ob[ns].retained < 2) bn_die("--retained: sizes >= 2");
        ns++;
    }
    mkdir(dir, 0755);
    for (int s = 0; s < ns; s++) fill_old(&ob[s]);
    outbox *big = &ob[ns - 1];
    char consumer[700], cons_arg[800], db_arg[1100];
    snprintf(consumer, sizeof consumer, "sqlite:%s/consumer.db", dir);
    snprintf(cons_arg, sizeof cons_arg, "bench=%s", consumer);
    snprintf(db_arg, sizeof db_arg, "%s", big->url);
    if (do_purge) {
        /* a critical consumer that needs nothing published before 2002 (the old rows) */
        char log[700];
        snprintf(log, sizeof log, "%s/purge.log", dir);
        char *init[] = {(char *)bn_obx_bin(), "init", "--db", consumer, NULL};
        char *force[] = {(char *)bn_obx_bin(),
                         "watermark",
                         "force",
                         "bench",
                         "--until",
                         "1010000000000",
                         "--reason",
                         "bench: old rows",
                         "--db",
                         db_arg,
                         "--consumer",
                         cons_arg,
                         NULL};
        if (bn_run(log, init) || bn_run(log, force)) bn_die("purge setup failed (log %s)", log);
    }
    obx_kafka_mock *mock = NULL;
    char boot[512], broker[700];
    if (obx_kafka_mock_start(3, "orders", 8, boot, sizeof boot, &mock))
        bn_die("kafka mock: %s", obx_errmsg());
    bn_kafka_broker_url(boot, broker, sizeof broker);
    double rate[MAX_SIZES + 1][BN_MAX_REPS], ratio[MAX_SIZES + 1][BN_MAX_REPS], purged[BN_MAX_REPS],
        overlap[BN_MAX_REPS];
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++) {
        for (int x = 0; x < ns; x++) {
            int s = rep % 2 ? ns - 1 - x : x;
            add_backlog(&ob[s]);
            char tag[32];
            snprintf(tag, sizeof tag, "%ld", ob[s].retained);
            rate[s][rep] = run(&ob[s], broker, tag, rep);
            bn_log("rep %d: %ld old rows: %.0f ev/s", rep + 1, ob[s].retained, rate[s][rep]);
        }
        if (do_purge) {
            PGconn *c = bn_pg_connect(big->url);
            bn_pg_fill(c, big->next, purge_rows, "PUBLISHED");
            big->next += purge_rows;
            PQfinish(c);
            add_backlog(big);
            c = bn_pg_connect(big->url);
            long long p0 = bn_sql_ll(c, "SELECT coalesce(sum(CASE key WHEN 'state:RETAINED' THEN "
                                        "n ELSE 2 * n END), 0) FROM obx.obx_stat_delta WHERE key "
                                        "IN ('state:RETAINED', 'state:PURGED')");
            char log[700];
            snprintf(log, sizeof log, "%s/purge-r%d.log", dir, rep + 1);
            char pace[64];
            snprintf(pace, sizeof pace, "retention.max_rate=%ld", purge_rate);
            char *purge[] = {(char *)bn_obx_bin(),
                             "purge",
                             "--db",
                             db_arg,
                             "--consumer",
                             cons_arg,
                             "--set",
                             pace,
                             NULL};
            bn_proc pp;
            bn_spawn(&pp, log, purge);
            usleep(300000); /* the purge has begun */
            double t0 = bn_now();
            rate[ns][rep] = run(big, broker, "purge", rep);
            double t_relay = bn_now() - t0;
            bool still = bn_proc_alive(&pp);
            int st = 0;
            if (still) {
                kill(pp.pid, SIGTERM);
                waitpid(pp.pid, &st, 0);
            } else
                waitpid(pp.pid, &st, WNOHANG);
            double t_purge = bn_now() - pp.started;
            /* the purge's transitions: PUBLISHED -> RETAINED (r) and RETAINED -> PURGED (p);
             * the deltas give RETAINED r - p and PURGED p */
            purged[rep] = (double)(bn_sql_ll(c, "SELECT coalesce(sum(CASE key WHEN "
                                                "'state:RETAINED' THEN n ELSE 2 * n END), 0) FROM "
                                                "obx.obx_stat_delta WHERE key IN "
                                                "('state:RETAINED', 'state:PURGED')") -
                                   p0);
            /* how much of the relay's run the purge was running */
            overlap[rep] = still ? 1.0 : (t_purge - 0.3) / t_relay;
            if (overlap[rep] > 1) overlap[rep] = 1;
            PQfinish(c);
            bn_log("rep %d: during purge: %.0f ev/s, %.0f purge transitions meanwhile (purge ran "
                   "%.0f%% "
                   "of the relay's time)",
                   rep + 1, rate[ns][rep], purged[rep], overlap[rep] * 100);
        }
        for (int s = 0; s <= ns - (do_purge ? 0 : 1); s++)
            ratio[s][rep] = rate[s][rep] / rate[0][rep];
    }
    obx_kafka_mock_stop(mock);
    printf("\nbacklog independence: %ld-event backlog, PostgreSQL + Kafka (mock), 1 relay, on "
           "outboxes already holding R PUBLISHED/RETAINED rows; median of %d reps; load average "
           "%.1f before, %.1f after (2 cores)\n\n",
           n_events, reps, load0, bn_loadavg());
    printf("| old rows in the outbox | obx ev/s | vs %ld rows | target |\n|---|---:|---:|---|\n",
           ob[0].retained);
    for (int s = 0; s < ns; s++) {
        double q = bn_median(ratio[s], reps);
        printf("| %ld | %.0f | %.2f | %s |\n", ob[s].retained, bn_median(rate[s], reps), q,
               s == 0 ? "" : (q >= 0.90 ? "within 10%: met" : "within 10%: MISSED"));
    }
    if (do_purge) {
        double q = bn_median(ratio[ns], reps);
        char paced[64] = "";
        if (purge_rate) snprintf(paced, sizeof paced, ", retention.max_rate=%ld", purge_rate);
        printf("| %ld, during `obx purge`%s (%.0f rows retained or purged meanwhile, purge "
               "running %.0f%% of the time) | %.0f | %.2f | %s |\n",
               big->retained, paced, bn_median(purged, reps), bn_median(overlap, reps) * 100,
               bn_median(rate[ns], reps), q, q >= 0.90 ? "within 10%: met" : "within 10%: MISSED");
    }
    printf("\nrelay logs: %s\n", dir);
    if (!keep)
        for (int s = 0; s < ns; s++) bn_pg_drop(ob[s].name);
    return 0;
}

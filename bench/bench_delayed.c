/*
 * bench_delayed.c — scenario `delayed` of bench/run.sh (issue 51 item 3): a delayed backlog does
 * not slow the relay's claims of due events. Two outboxes per store, one empty and one holding D
 * delayed PENDING events (default 1,000,000, due in 300 days, enqueued before everything else,
 * so that they come first in seq order); each repetition adds the same N due events to both and
 * measures, on each:
 *
 *   claim     the median time of one claim (the relay's: relay.batch = 256 rows, its planner
 *             settings on PostgreSQL) over K claims, each in a transaction rolled back, taken with
 *             the due backlog in place
 *   rate      one `obx relay` draining the N due events to PUBLISHED: events/s from its start
 *             (PostgreSQL + Kafka mock cluster; SQLite + the local log broker)
 *
 * The ratio is the rate with the delayed backlog over the rate without it in the same
 * repetition (target: >= 0.90, within 10 %); the figures are medians over the repetitions.
 * The delayed rows are filled once per store (PostgreSQL: SQL bulk insert, bn_pg_fill_at;
 * SQLite: obx_enqueue with not_before, in transactions of 5,000) and stay for every repetition.
 *
 *   bench_delayed [--delayed D] [--events N] [--reps R] [--claims K] [--stores pg,sqlite]
 *                 [--set KEY=VALUE]... [--dir DIR] [--keep] [--json]
 *
 * --json: one JSON object after the table: delayed_backlog_ratio (the lower of the stores'),
 * pg_delayed_backlog_ratio, sqlite_delayed_backlog_ratio, and per store the rates and median
 * claim times (ms) without and with the backlog.
 *
 * Needs OBX_TEST_PG_URL for the PostgreSQL store.
 */
#include "bench.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SETS 16
#define CLAIM_LIMIT 256 /* relay.batch's default */
#define DAY_MS 86400000LL

static long n_delayed = 1000000, n_events = 50000;
static int reps = 3, n_claims = 200;
static bool keep, json;
static char dir[512];
static const char *sets[MAX_SETS + 1];
static int n_sets;

/* One outbox: its store URL, the next event number to fill, its figures per repetition. */
typedef struct outbox {
    bool pg, delayed;
    char name[64], url[1024], broker[1024];
    long next;
    double rate[BN_MAX_REPS], claim_ms[BN_MAX_REPS];
} outbox;

/* ---- filling ------------------------------------------------------------------------------ */

/* n events of the bench route numbered from first, due now or not before not_before (SQLite:
 * obx_enqueue in transactions of 5,000, one order key per event). */
static void sqlite_enqueue(const char *url, long first, long n, int64_t not_before) {
    obx_store *s;
    if (obx_store_open(url, &s)) bn_die("sqlite open: %s", obx_errmsg());
    bn_msgs pool;
    bn_msgs_make(&pool, 1, "orders", 1);
    for (long i = 0; i < n; i++) {
        if (i % 5000 == 0 && obx__st_begin(s)) bn_die("begin: %s", obx_errmsg());
        char aid[32];
        snprintf(aid, sizeof aid, "o-%ld", first + i);
        obx_event ev = {.event_type = BN_TYPE,
                        .aggregate_type = "order",
                        .aggregate_id = aid,
                        .aggregate_version = 1,
                        .tenant = BN_TENANT,
                        .payload = pool.payload[0],
                        .payload_len = BN_PAYLOAD,
                        .not_before_ms = not_before};
        obx_enqueue_result res;
        if (obx_enqueue(s, &ev, &res)) bn_die("enqueue: %s", obx_errmsg());
        if ((i % 5000 == 4999 || i == n - 1) && obx__st_commit(s))
            bn_die("commit: %s", obx_errmsg());
        if (n > 100000 && i % 250000 == 249999) bn_log("fill: %ld of %ld events", i + 1, n);
    }
    bn_msgs_free(&pool);
    obx_store_close(s);
}

static void outbox_make(outbox *o, bool pg, bool delayed) {
    *o = (outbox){.pg = pg, .delayed = delayed, .next = 1};
    snprintf(o->name, sizeof o->name, "obx_bench_dl_%s%d", pg ? "pg" : "sq", delayed);
    double t0 = bn_now();
    int64_t far = (int64_t)obx__wall_ms() + 300 * DAY_MS;
    if (pg) {
        bn_pg_fresh(o->name, "orders", o->url, sizeof o->url);
        PGconn *c = bn_pg_connect(o->url);
        if (delayed) bn_pg_fill_at(c, 1, n_delayed, "PENDING", far);
        bn_sql(c, "VACUUM ANALYZE");
        PQfinish(c);
    } else {
        char path[700];
        snprintf(path, sizeof path, "%s/%s.db", dir, o->name);
        unlink(path);
        snprintf(o->url, sizeof o->url, "sqlite:%s", path);
        snprintf(o->broker, sizeof o->broker, "log:%s/%s-broker.db?cluster=" BN_CLUSTER, dir,
                 o->name);
        obx_store *s;
        if (obx_store_open(o->url, &s) || obx_store_init(s)) bn_die("init: %s", obx_errmsg());
        obx_route rt = {.event_type = BN_TYPE, .cluster = BN_CLUSTER, .topic = "orders"};
        if (obx_route_set(s, &rt, NULL)) bn_die("route: %s", obx_errmsg());
        obx_store_close(s);
        if (delayed) sqlite_enqueue(o->url, 1, n_delayed, far);
    }
    if (delayed) o->next = n_delayed + 1;
    bn_log("%s: %ld delayed events in %.0f s", o->name, delayed ? n_delayed : 0, bn_now() - t0);
}

static void add_due(outbox *o) {
    if (o->pg) {
        PGconn *c = bn_pg_connect(o->url);
        bn_pg_fill(c, o->next, n_events, "PENDING");
        PQfinish(c);
    } else
        sqlite_enqueue(o->url, o->next, n_events, 0);
    o->next += n_events;
}

/* ---- measuring ---------------------------------------------------------------------------- */

/* The median time (ms) of one claim of CLAIM_LIMIT rows over n_claims, each in its own
 * transaction, rolled back (nothing changes); dies unless each returns a full batch. */
static double claim_median(const outbox *o) {
    obx_store *s;
    if (obx_store_open(o->url, &s)) bn_die("open %s: %s", o->url, obx_errmsg());
    double t[1000];
    int k = n_claims < 1000 ? n_claims : 1000;
    for (int i = 0; i < k; i++) {
        obx__claim_req req = {.now = obx__wall_ms(), .limit = CLAIM_LIMIT, .cluster = BN_CLUSTER};
        obx__rows r = {0};
        double t0 = bn_now();
        if (obx__st_begin(s) ||
            obx__st_read_events(s, &(obx__read_req){.by = OBX__READ_CLAIM, .claim = &req}, &r))
            bn_die("claim: %s", obx_errmsg());
        t[i] = (bn_now() - t0) * 1000;
        if (obx__st_rollback(s)) bn_die("rollback: %s", obx_errmsg());
        if (r.n != CLAIM_LIMIT) bn_die("claim: %zu rows, not %d", r.n, CLAIM_LIMIT);
        obx__rows_free(&r);
    }
    obx_store_close(s);
    return bn_median(t, k);
}

/* PUBLISHED events of a SQLite outbox (obx_event_state_pub). */
static long long sqlite_published(sqlite3 *db) {
    sqlite3_stmt *st;
    long long v = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM obx_event WHERE state = 'PUBLISHED'", -1, &st,
                           NULL) != SQLITE_OK)
        bn_die("sqlite: %s", sqlite3_errmsg(db));
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* One relay (SQLite + log) until target events are PUBLISHED: events/s from its start. */
static double sqlite_relay(outbox *o, const char *id, long long target) {
    sqlite3 *db;
    if (sqlite3_open(o->url + strlen("sqlite:"), &db) != SQLITE_OK) bn_die("open %s", o->url);
    sqlite3_busy_timeout(db, 10000);
    bn_proc p;
    bn_relay_start(&p, dir, id, o->url, o->broker, sets);
    double t_done = -1;
    for (double t0 = bn_now(); bn_now() - t0 < 1800 && bn_proc_alive(&p); usleep(50000))
        if (sqlite_published(db) >= target) {
            t_done = bn_now();
            break;
        }
    bn_proc_stop(&p);
    sqlite3_close(db);
    if (t_done < 0) bn_die("%s: the relay did not publish everything (log %s)", id, p.log);
    return (double)n_events / (t_done - p.started);
}

static void run_one(outbox *o, int rep, const char *kafka_broker) {
    add_due(o);
    o->claim_ms[rep] = claim_median(o);
    char id[96];
    snprintf(id, sizeof id, "dl-%s-r%d", o->name, rep + 1);
    if (o->pg) {
        bn_relay_run r;
        bn_pg_relays(o->url, kafka_broker, 1, id, dir, sets, n_events, 1800, &r);
        o->rate[rep] = r.rate;
    } else
        o->rate[rep] = sqlite_relay(o, id, (long long)(o->next - 1 - (o->delayed ? n_delayed : 0)));
    bn_log("rep %d: %s: claim %.3f ms, %.0f ev/s", rep + 1, o->name, o->claim_ms[rep],
           o->rate[rep]);
}

/* ---- output ------------------------------------------------------------------------------- */

static double ratio_of(const outbox *base, const outbox *dl) {
    double q[BN_MAX_REPS];
    for (int i = 0; i < reps; i++) q[i] = dl->rate[i] / base->rate[i];
    return bn_median(q, reps);
}

static void print_row(const char *store, const outbox *base, const outbox *dl) {
    double q = ratio_of(base, dl);
    printf("| %s | %.0f | %.3f | %.0f | %.3f | %.2f | %s |\n", store, bn_median(base->rate, reps),
           bn_median(base->claim_ms, reps), bn_median(dl->rate, reps),
           bn_median(dl->claim_ms, reps), q, q >= 0.90 ? ">= 0.90: met" : ">= 0.90: MISSED");
}

static void print_json(const outbox ob[4], bool pg, bool sq) {
    double qp = pg ? ratio_of(&ob[0], &ob[1]) : 0, qs = sq ? ratio_of(&ob[2], &ob[3]) : 0;
    double q = pg && sq ? (qp < qs ? qp : qs) : pg ? qp : qs;
    printf("{\"delayed_backlog_ratio\": %.3f, \"delayed_events\": %ld, \"due_events\": %ld", q,
           n_delayed, n_events);
    for (int s = 0; s < 2; s++) {
        if (!(s ? sq : pg)) continue;
        const char *k = s ? "sqlite" : "pg";
        const outbox *b = &ob[2 * s], *d = &ob[2 * s + 1];
        printf(", \"%s_delayed_backlog_ratio\": %.3f, \"%s_rate\": %.0f, \"%s_rate_delayed\": "
               "%.0f, \"%s_claim_ms\": %.3f, \"%s_claim_ms_delayed\": %.3f",
               k, s ? qs : qp, k, bn_median(b->rate, reps), k, bn_median(d->rate, reps), k,
               bn_median(b->claim_ms, reps), k, bn_median(d->claim_ms, reps));
    }
    printf("}\n");
}

static void parse(int argc, char **argv, bool *pg, bool *sq) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--delayed") && i + 1 < argc)
            n_delayed = atol(argv[++i]);
        else if (!strcmp(argv[i], "--events") && i + 1 < argc)
            n_events = atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--claims") && i + 1 < argc)
            n_claims = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stores") && i + 1 < argc) {
            *pg = strstr(argv[i + 1], "pg") != NULL;
            *sq = strstr(argv[++i], "sqlite") != NULL;
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else {
            fprintf(stderr, "usage: bench_delayed [--delayed D] [--events N] [--reps R] [--claims "
                            "K] [--stores pg,sqlite] [--set KEY=VALUE]... [--dir DIR] [--keep] "
                            "[--json]\n");
            exit(2);
        }
    }
    if (n_delayed < 1 || n_events < CLAIM_LIMIT || reps < 1 || reps > BN_MAX_REPS || n_claims < 1 ||
        !(*pg || *sq))
        bn_die("--delayed >= 1, --events >= %d, --reps 1..20, --claims >= 1, --stores pg and/or "
               "sqlite",
               CLAIM_LIMIT);
}

int main(int argc, char **argv) {
    bool pg = true, sq = true;
    snprintf(dir, sizeof dir, "/tmp/obx-bench-delayed-%d", (int)getpid());
    parse(argc, argv, &pg, &sq);
    mkdir(dir, 0755);
    outbox ob[4]; /* pg, pg delayed, sqlite, sqlite delayed */
    for (int i = 0; i < 4; i++)
        if (i < 2 ? pg : sq) outbox_make(&ob[i], i < 2, i % 2);
    obx_kafka_mock *mock = NULL;
    char boot[512], broker[700] = "";
    if (pg) {
        if (obx_kafka_mock_start(3, "orders", 8, boot, sizeof boot, &mock))
            bn_die("kafka mock: %s", obx_errmsg());
        bn_kafka_broker_url(boot, broker, sizeof broker);
    }
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++)
        for (int x = 0; x < 4; x++) {
            int i = rep % 2 ? 3 - x : x; /* alternate which outbox goes first */
            if (i < 2 ? pg : sq) run_one(&ob[i], rep, broker);
        }
    if (mock) obx_kafka_mock_stop(mock);
    printf("\ndelayed backlog: %ld due events, with and without %ld delayed events (due in 300 "
           "days) ahead of them, 1 relay; claim = one claim of %d rows; median of %d reps; load "
           "average %.1f before, %.1f after (2 cores)\n\n",
           n_events, n_delayed, CLAIM_LIMIT, reps, load0, bn_loadavg());
    printf("| store | ev/s | claim ms | ev/s, delayed backlog | claim ms, delayed backlog | "
           "ratio | target |\n|---|---:|---:|---:|---:|---:|---|\n");
    if (pg) print_row("PostgreSQL + Kafka (mock)", &ob[0], &ob[1]);
    if (sq) print_row("SQLite + log", &ob[2], &ob[3]);
    printf("\nrelay logs: %s\n", dir);
    if (json) print_json(ob, pg, sq);
    if (!keep) {
        for (int i = 0; i < 2 && pg; i++) bn_pg_drop(ob[i].name);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -f '%s'/*.db*", dir);
        if (sq && system(cmd)) bn_log("could not remove %s/*.db", dir);
    }
    return 0;
}

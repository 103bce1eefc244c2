/*
 * bench_throughput.c — scenario 1 of bench/run.sh: relay throughput from a pre-filled backlog
 * to all PUBLISHED with receipts, beside the limits measured in the same repetition:
 *
 *   pg-kafka    PostgreSQL + Kafka (librdkafka mock cluster, 3 brokers, 8 partitions, in this
 *               process; the relay is a separate `obx relay` process)
 *   pg-amqp     PostgreSQL + RabbitMQ (durable topic exchange, quorum queue, confirms)
 *   sqlite-log  SQLite + the local log broker
 *
 * Limits: the store's minimal claim-and-mark (PostgreSQL: pgbench, 8 clients, one statement per
 * batch of 100 that locks the oldest PENDING rows with SKIP LOCKED, reads their payload and
 * marks them PUBLISHED; SQLite: the same loop in one connection), on a copy of the same rows;
 * and the broker's raw publish rate of the same messages (plain librdkafka producer, idempotent,
 * acks=all; plain rabbitmq-c loop, persistent + mandatory, confirm window 500; the log broker's
 * own send/poll without a store).
 *
 *   bench_throughput [--events N] [--reps R] [--configs pg-kafka,pg-amqp,sqlite-log]
 *                    [--set KEY=VALUE]... [--dir DIR] [--keep] [--json] [--encrypt]
 *
 * --encrypt: the routes seal payloads (AES-256-GCM, key "bench", docs/security.md) and the relays
 * get the key ring; the table then measures the relay with encryption on, and one more line
 * prints what sealing one BN_PAYLOAD-byte payload costs in this process.
 *
 * --json: after the tables, one JSON object with issue 19's figures (medians over the reps):
 * pg_kafka_store_ratio (obx / claim-and-mark limit), pg_amqp_broker_ratio (obx / raw confirm
 * publish), wal_bytes_per_event (PostgreSQL + Kafka run), and the same for the other configs.
 *
 * Needs OBX_TEST_PG_URL and OBX_TEST_AMQP_URL for the PostgreSQL and RabbitMQ configurations.
 */
#include "bench.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SETS 16

static long n_events = 200000;
static int reps = 3;
static bool keep;
static char dir[512];
static const char *sets[MAX_SETS + 8];
static int n_sets;

typedef struct result {
    double obx, store_lim, broker_lim; /* events/s */
    double cpu_per_10k;                /* relay CPU seconds per 10,000 events */
    long hwm_kib;
    /* CPU microseconds per event: obx = relay + database server, limit = pgbench (or the
     * SQLite loop) + database server. Steadier than rates on a shared machine. */
    double obx_cpu_us, lim_cpu_us;
    /* WAL bytes per event (PostgreSQL): what the database wrote, independent of load */
    double obx_wal, lim_wal;
    /* RabbitMQ node CPU per message (us): in the raw loop and in the relay's run */
    double broker_cpu_raw, broker_cpu_obx;
    /* the relay's minor page faults per event: memory it touched afresh (docs/performance.md,
     * section 2: per-batch buffers faulted in every time were half its CPU) */
    double faults_ev;
} result;

/* The limit in rows/s; *cpu_us gets its CPU cost per row (pgbench + server). */
static double pg_claim_mark_limit(const char *src_db, double *cpu_us, double *wal) {
    char log[600];
    snprintf(log, sizeof log, "%s/pgbench-claim.log", dir);
    return bn_pg_claim_mark_limit(src_db, n_events, log, keep, cpu_us, wal);
}

/* Runs the relay until every event is PUBLISHED; fills r->obx, cpu, hwm. */
static void run_pg_relay(const char *url, const char *broker, const char *id, result *r) {
    PGconn *c = bn_pg_connect(url);
    long long before = 0;
    bn_pg_counts(c, &before, NULL);
    bn_proc p;
    double pg0 = bn_pg_server_cpu(), w0 = bn_pg_wal();
    char lsn0[64], lsn1[64];
    bn_pg_lsn(lsn0, sizeof lsn0);
    bn_pg_stmt_reset();
    bn_relay_start(&p, dir, id, url, broker, sets);
    double t_done = bn_pg_wait_published(c, before + n_events, p.pid, 1800);
    double cpu = 0, pg_cpu = bn_pg_server_cpu() - pg0, wal = bn_pg_wal() - w0;
    long hwm = 0, faults = bn_proc_minflt(&p);
    bn_proc_usage(&p, &hwm, NULL, &cpu);
    bn_proc_stop(&p);
    bn_pg_lsn(lsn1, sizeof lsn1);
    if (t_done < 0) bn_die("%s: the relay did not publish everything (log %s)", id, p.log);
    bn_pg_stmt_detail((double)n_events);
    bn_pg_wal_detail(url, lsn0, lsn1, (double)n_events);
    long long pub = 0, prim = 0;
    bn_pg_counts(c, &pub, &prim);
    if (prim < before + n_events) bn_die("%s: %lld primary receipts", id, prim);
    PQfinish(c);
    r->obx = (double)n_events / (t_done - p.started);
    r->cpu_per_10k = cpu * 10000.0 / (double)n_events;
    r->hwm_kib = hwm;
    r->faults_ev = (double)faults / (double)n_events;
    r->obx_cpu_us = (cpu + pg_cpu) * 1e6 / (double)n_events;
    r->obx_wal = wal / (double)n_events;
}

static void rep_pg_kafka(const char *boot, const result *lim, result *r, int rep) {
    char url[1024], broker[1024], id[64];
    bn_pg_fresh("obx_bench_tp", "orders", url, sizeof url);
    PGconn *c = bn_pg_connect(url);
    bn_pg_fill(c, 1, n_events, "PENDING");
    PQfinish(c);
    r->store_lim = lim->store_lim;
    r->lim_cpu_us = lim->lim_cpu_us;
    r->lim_wal = lim->lim_wal;
    bn_msgs pool;
    bn_msgs_make(&pool, 4096, "orders", 8);
    r->broker_lim = bn_kafka_raw(boot, &pool, n_events);
    bn_msgs_free(&pool);
    snprintf(broker, sizeof broker, "kafka://%s?cluster=" BN_CLUSTER, boot);
    snprintf(id, sizeof id, "tp-kafka-%d", rep);
    run_pg_relay(url, broker, id, r);
    if (!keep) bn_pg_drop("obx_bench_tp");
}

static void rep_pg_amqp(const result *lim, result *r, int rep) {
    const char *amqp = getenv("OBX_TEST_AMQP_URL");
    if (!amqp || !*amqp) bn_die("OBX_TEST_AMQP_URL is not set");
    char url[1024], broker[1400], id[64], ex[64], q[80];
    snprintf(ex, sizeof ex, "obx-bench-%d-%d", (int)getpid(), rep);
    snprintf(q, sizeof q, "%s.q", ex);
    bn_pg_fresh("obx_bench_tp", ex, url, sizeof url);
    PGconn *c = bn_pg_connect(url);
    bn_pg_fill(c, 1, n_events, "PENDING");
    PQfinish(c);
    r->store_lim = lim->store_lim;
    r->lim_cpu_us = lim->lim_cpu_us;
    r->lim_wal = lim->lim_wal;
    bn_msgs pool;
    bn_msgs_make(&pool, 4096, ex, 1);
    bn_amqp_topology(amqp, ex, q, true);
    double b0 = bn_rabbit_cpu();
    r->broker_lim = bn_amqp_raw(amqp, ex, &pool, n_events, 500);
    r->broker_cpu_raw = (bn_rabbit_cpu() - b0) * 1e6 / (double)n_events;
    bn_msgs_free(&pool);
    /* a fresh queue for the relay: the same starting state as the raw loop */
    bn_amqp_topology(amqp, ex, q, false);
    bn_amqp_topology(amqp, ex, q, true);
    snprintf(broker, sizeof broker, "%s%scluster=" BN_CLUSTER "&confirm_window=500", amqp,
             strchr(amqp, '?') ? "&" : "?");
    snprintf(id, sizeof id, "tp-amqp-%d", rep);
    b0 = bn_rabbit_cpu();
    run_pg_relay(url, broker, id, r);
    r->broker_cpu_obx = (bn_rabbit_cpu() - b0) * 1e6 / (double)n_events;
    bn_amqp_topology(amqp, ex, q, false);
    if (!keep) bn_pg_drop("obx_bench_tp");
}

/* ---- --encrypt ---- */

#define BENCH_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

/* What sealing one payload costs (obx__seal, as the relay calls it per sent event), and opening
 * it (the consumer's inbox), in this process: the median of 3 runs of 20,000. */
static void seal_cost(void) {
    obx_keyring *ring;
    if (obx_keyring_open("bench=" BENCH_KEY, &ring)) bn_die("key ring: %s", obx_errmsg());
    bn_msgs pool;
    bn_msgs_make(&pool, 1, "orders", 1);
    char dg[OBX_DIGEST_LEN + 1];
    if (obx_sha256_digest(pool.payload[0], BN_PAYLOAD, dg)) bn_die("digest");
    double seal[3], open[3];
    for (int r = 0; r < 3; r++) {
        unsigned char *b = NULL, *p = NULL;
        size_t bn = 0, pn = 0;
        double t0 = bn_cpu_self();
        for (int i = 0; i < 20000; i++) {
            free(b);
            if (obx__seal(ring, "bench", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1W", 1, pool.payload[0],
                          BN_PAYLOAD, dg, &b, &bn))
                bn_die("seal: %s", obx_errmsg());
        }
        double t1 = bn_cpu_self();
        for (int i = 0; i < 20000; i++) {
            free(p);
            if (obx__open(ring, "bench", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1W", 1, b, bn, &p, &pn))
                bn_die("open: %s", obx_errmsg());
        }
        seal[r] = (t1 - t0) * 1e6 / 20000;
        open[r] = (bn_cpu_self() - t1) * 1e6 / 20000;
        free(b);
        free(p);
    }
    printf("\nsealing one %d-byte payload (AES-256-GCM, nonce derivation included): %.2f us of "
           "CPU; opening it (tag, then the nonce checked): %.2f us (median of 3 x 20,000)\n",
           BN_PAYLOAD, bn_median(seal, 3), bn_median(open, 3));
    bn_msgs_free(&pool);
    obx_keyring_close(ring);
}

/* ---- SQLite + log ---------------------------------------------------------------------------- */

static void sqlite_fill(const char *url) {
    obx_store *s;
    if (obx_store_open(url, &s) || obx_store_init(s)) bn_die("sqlite init: %s", obx_errmsg());
    obx_route rt = {
        .event_type = BN_TYPE, .cluster = BN_CLUSTER, .topic = "orders", .encrypt = bn_encrypt_key};
    if (obx_route_set(s, &rt, NULL)) bn_die("route: %s", obx_errmsg());
    bn_msgs pool;
    bn_msgs_make(&pool, 1, "orders", 1);
    for (long i = 0; i < n_events; i++) {
        if (i % 5000 == 0 && obx__st_begin(s)) bn_die("begin: %s", obx_errmsg());
        char aid[32];
        snprintf(aid, sizeof aid, "o-%ld", i);
        obx_event ev = {.event_type = BN_TYPE,
                        .aggregate_type = "order",
                        .aggregate_id = aid,
                        .aggregate_version = 1,
                        .tenant = BN_TENANT,
                        .payload = pool.payload[0],
                        .payload_len = BN_PAYLOAD};
        obx_enqueue_result res;
        if (obx_enqueue(s, &ev, &res)) bn_die("enqueue: %s", obx_errmsg());
        if ((i % 5000 == 4999 || i == n_events - 1) && obx__st_commit(s))
            bn_die("commit: %s", obx_errmsg());
    }
    bn_msgs_free(&pool);
    obx_store_close(s);
}

static sqlite3 *sq_open(const char *path) {
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK) bn_die("sqlite open %s", path);
    sqlite3_busy_timeout(db, 10000);
    sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL", 0, 0, 0);
    return db;
}

static long long sq_ll(sqlite3 *db, const char *q) {
    sqlite3_stmt *st;
    long long v = -1;
    if (sqlite3_prepare_v2(db, q, -1, &st, NULL) != SQLITE_OK) bn_die("sqlite: %s", q);
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The same claim-and-mark in SQLite: batches of 100, one write transaction each. */
static double sqlite_claim_mark_limit(const char *path, double *cpu_us) {
    sqlite3 *db = sq_open(path);
    sqlite3_stmt *sel, *upd;
    if (sqlite3_prepare_v2(db,
                           "SELECT e.seq, e.event_id, v.dest_routing_key, v.payload FROM obx_event "
                           "e INDEXED BY obx_event_claimable JOIN obx_envelope v ON v.event_id = "
                           "e.event_id AND v.envelope_gen = e.envelope_gen WHERE e.state IN "
                           "('PENDING', 'CLAIMED') ORDER BY e.available_at, e.seq LIMIT 100",
                           -1, &sel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db,
                           "UPDATE obx_event SET state = 'PUBLISHED', published_at = ?1, "
                           "updated_at = ?1 WHERE seq = ?2",
                           -1, &upd, NULL) != SQLITE_OK)
        bn_die("sqlite prepare: %s", sqlite3_errmsg(db));
    double t0 = bn_now(), c0 = bn_cpu_self();
    long done = 0;
    for (;;) {
        sqlite3_exec(db, "BEGIN IMMEDIATE", 0, 0, 0);
        int64_t seqs[100], k = 0;
        size_t bytes = 0;
        while (sqlite3_step(sel) == SQLITE_ROW) {
            seqs[k++] = sqlite3_column_int64(sel, 0);
            bytes += (size_t)sqlite3_column_bytes(sel, 3);
        }
        sqlite3_reset(sel);
        int64_t now = obx__wall_ms();
        for (int64_t i = 0; i < k; i++) {
            sqlite3_bind_int64(upd, 1, now);
            sqlite3_bind_int64(upd, 2, seqs[i]);
            if (sqlite3_step(upd) != SQLITE_DONE) bn_die("sqlite update: %s", sqlite3_errmsg(db));
            sqlite3_reset(upd);
        }
        sqlite3_exec(db, "COMMIT", 0, 0, 0);
        done += (long)k;
        if (k < 100 || !bytes) break;
    }
    double dt = bn_now() - t0;
    *cpu_us = (bn_cpu_self() - c0) * 1e6 / (double)(done ? done : 1);
    sqlite3_finalize(sel);
    sqlite3_finalize(upd);
    sqlite3_close(db);
    if (done != n_events) bn_die("sqlite claim-and-mark: %ld of %ld", done, n_events);
    return (double)done / dt;
}

static double log_raw(const char *path) {
    char url[700];
    snprintf(url, sizeof url, "log:%s?cluster=" BN_CLUSTER, path);
    obx__broker *b;
    if (obx__br_open(url, NULL, 0, &b)) bn_die("log broker: %s", obx_errmsg());
    bn_msgs pool;
    bn_msgs_make(&pool, 4096, "orders", 1);
    for (size_t i = 0; i < pool.n; i++)
        if (obx__br_partition_for(b, &pool.dest[i], &pool.m[i].partition))
            bn_die("partition: %s", obx_errmsg());
    obx__outcome *o = calloc(1024, sizeof *o);
    obx__msg batch[256];
    if (!o) bn_die("out of memory");
    double t0 = bn_now();
    long sent = 0, done = 0;
    while (done < n_events) {
        if (sent < n_events && sent - done < 2048) {
            long k = n_events - sent < 256 ? n_events - sent : 256;
            for (long i = 0; i < k; i++) batch[i] = pool.m[(size_t)(sent + i) % pool.n];
            if (obx__br_send(b, batch, (size_t)k, obx__wall_ms())) bn_die("log send");
            sent += k;
        }
        size_t got = 0;
        if (obx__br_poll(b, obx__wall_ms(), sent < n_events ? 0 : 100, o, 1024, &got))
            bn_die("log poll");
        for (size_t i = 0; i < got; i++)
            if (o[i].kind != OBX__OUT_ACK) bn_die("log broker: %s", o[i].reason);
        done += (long)got;
    }
    double dt = bn_now() - t0;
    free(o);
    bn_msgs_free(&pool);
    obx__br_close(b);
    return (double)n_events / dt;
}

static void rep_sqlite_log(result *r, int rep) {
    char d[600], db[700], lim[700], url[800], broker[800], rawlog[700], id[64], cmd[2000];
    snprintf(d, sizeof d, "%s/sqlite-%d", dir, rep);
    mkdir(d, 0755);
    snprintf(db, sizeof db, "%s/obx.db", d);
    snprintf(lim, sizeof lim, "%s/limit.db", d);
    snprintf(rawlog, sizeof rawlog, "%s/raw-broker.db", d);
    snprintf(url, sizeof url, "sqlite:%s", db);
    sqlite_fill(url);
    sqlite3 *h = sq_open(db);
    sqlite3_exec(h, "PRAGMA wal_checkpoint(TRUNCATE)", 0, 0, 0);
    sqlite3_close(h);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", db, lim);
    if (system(cmd)) bn_die("%s", cmd);
    r->store_lim = sqlite_claim_mark_limit(lim, &r->lim_cpu_us);
    r->broker_lim = log_raw(rawlog);
    snprintf(broker, sizeof broker, "log:%s/broker.db?cluster=" BN_CLUSTER, d);
    snprintf(id, sizeof id, "tp-sqlite-%d", rep);
    sqlite3 *rd = sq_open(db);
    bn_proc p;
    bn_relay_start(&p, dir, id, url, broker, sets);
    double t_done = -1;
    for (double t0 = bn_now(); bn_now() - t0 < 1800;) {
        long long pub = sq_ll(rd, "SELECT count(*) FROM obx_event WHERE state = 'PUBLISHED' AND "
                                  "published_at >= 0");
        if (pub >= n_events) {
            t_done = bn_now();
            break;
        }
        if (!bn_proc_alive(&p)) break;
        usleep(100000);
    }
    double cpu = 0;
    long hwm = 0;
    bn_proc_usage(&p, &hwm, NULL, &cpu);
    bn_proc_stop(&p);
    if (t_done < 0) bn_die("%s: the relay did not publish everything (log %s)", id, p.log);
    long long prim = sq_ll(rd, "SELECT count(*) FROM obx_receipt WHERE kind = 'PRIMARY'");
    sqlite3_close(rd);
    if (prim != n_events) bn_die("%s: %lld primary receipts", id, prim);
    r->obx = (double)n_events / (t_done - p.started);
    r->cpu_per_10k = cpu * 10000.0 / (double)n_events;
    r->hwm_kib = hwm;
    r->obx_cpu_us = cpu * 1e6 / (double)n_events;
    if (!keep) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
        if (system(cmd)) bn_log("could not remove %s", d);
    }
}

static void print_row(const char *name, result *rs, int n, const char *target, double goal,
                      bool vs_broker) {
    double v[11][BN_MAX_REPS];
    for (int i = 0; i < n; i++) {
        v[0][i] = rs[i].obx;
        v[1][i] = rs[i].store_lim;
        v[2][i] = rs[i].obx / rs[i].store_lim;
        v[3][i] = rs[i].broker_lim;
        v[4][i] = rs[i].obx / rs[i].broker_lim;
        v[5][i] = rs[i].obx_cpu_us;
        v[6][i] = rs[i].lim_cpu_us;
        v[7][i] = rs[i].cpu_per_10k;
        v[8][i] = (double)rs[i].hwm_kib / 1024.0;
        v[9][i] = rs[i].obx_wal;
        v[10][i] = rs[i].lim_wal;
    }
    double ratio = bn_median(v[vs_broker ? 4 : 2], n);
    printf("| %s | %.0f | %.0f | %.2f | %.0f | %.2f | %s%s | %.0f | %.0f | %.2f | %.0f | %.0f | "
           "%.2f | %.1f |\n",
           name, bn_median(v[0], n), bn_median(v[1], n), bn_median(v[2], n), bn_median(v[3], n),
           bn_median(v[4], n), target, goal > 0 ? (ratio >= goal ? ": met" : ": MISSED") : "",
           bn_median(v[5], n), bn_median(v[6], n), bn_median(v[6], n) / bn_median(v[5], n),
           bn_median(v[9], n), bn_median(v[10], n), bn_median(v[7], n), bn_median(v[8], n));
    for (int i = 0; i < n; i++)
        fprintf(stderr,
                "  %s rep %d: obx %.0f ev/s, store limit %.0f, broker limit %.0f, obx cpu "
                "%.0f us/ev, limit cpu %.0f us/row, WAL %.0f / %.0f B, relay minor faults "
                "%.2f/ev\n",
                name, i + 1, rs[i].obx, rs[i].store_lim, rs[i].broker_lim, rs[i].obx_cpu_us,
                rs[i].lim_cpu_us, rs[i].obx_wal, rs[i].lim_wal, rs[i].faults_ev);
}

/* The median over reps of obx / limit (store limit, or broker limit when vs_broker), or of
 * the obx run's WAL bytes per event (wal). */
static double med_ratio(const result *rs, int n, bool vs_broker) {
    double v[BN_MAX_REPS];
    for (int i = 0; i < n; i++) v[i] = rs[i].obx / (vs_broker ? rs[i].broker_lim : rs[i].store_lim);
    return bn_median(v, n);
}

static double med_wal(const result *rs, int n) {
    double v[BN_MAX_REPS];
    for (int i = 0; i < n; i++) v[i] = rs[i].obx_wal;
    return bn_median(v, n);
}

static double med_faults(const result *rs, int n) {
    double v[BN_MAX_REPS];
    for (int i = 0; i < n; i++) v[i] = rs[i].faults_ev;
    return bn_median(v, n);
}

/* issue 19's figures as one JSON object (a config that did not run: null) */
static void print_json(bool k, const result *rk, bool a, const result *ra, bool q,
                       const result *rsq, int n) {
    char f[8][32];
    snprintf(f[0], sizeof f[0], k ? "%.3f" : "null", k ? med_ratio(rk, n, false) : 0.0);
    snprintf(f[1], sizeof f[1], a ? "%.3f" : "null", a ? med_ratio(ra, n, true) : 0.0);
    snprintf(f[2], sizeof f[2], k ? "%.0f" : "null", k ? med_wal(rk, n) : 0.0);
    snprintf(f[3], sizeof f[3], a ? "%.0f" : "null", a ? med_wal(ra, n) : 0.0);
    snprintf(f[4], sizeof f[4], a ? "%.3f" : "null", a ? med_ratio(ra, n, false) : 0.0);
    snprintf(f[5], sizeof f[5], q ? "%.3f" : "null", q ? med_ratio(rsq, n, false) : 0.0);
    snprintf(f[6], sizeof f[6], k ? "%.2f" : "null", k ? med_faults(rk, n) : 0.0);
    snprintf(f[7], sizeof f[7], a ? "%.2f" : "null", a ? med_faults(ra, n) : 0.0);
    printf("{\"pg_kafka_store_ratio\": %s, \"pg_amqp_broker_ratio\": %s, "
           "\"wal_bytes_per_event\": %s, \"pg_amqp_wal_bytes_per_event\": %s, "
           "\"pg_amqp_store_ratio\": %s, \"sqlite_log_store_ratio\": %s, "
           "\"pg_kafka_relay_faults_per_event\": %s, \"pg_amqp_relay_faults_per_event\": %s, "
           "\"events\": %ld, \"reps\": %d}\n",
           f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], n_events, n);
}

int main(int argc, char **argv) {
    const char *configs = "pg-kafka,pg-amqp,sqlite-log";
    bool json = false;
    snprintf(dir, sizeof dir, "/tmp/obx-bench-%d", (int)getpid());
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--events") && i + 1 < argc)
            n_events = atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--configs") && i + 1 < argc)
            configs = argv[++i];
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
            sets[n_sets++] = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            snprintf(dir, sizeof dir, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--keep"))
            keep = true;
        else if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--encrypt") && n_sets < MAX_SETS) {
            bn_encrypt_key = "bench";
            setenv("OBX_BENCH_KEYS", "bench=" BENCH_KEY, 1);
            sets[n_sets++] = "encryption.keys=${OBX_BENCH_KEYS}";
        } else {
            fprintf(stderr,
                    "usage: bench_throughput [--events N] [--reps R] [--configs "
                    "pg-kafka,pg-amqp,sqlite-log] [--set KEY=VALUE]... [--dir DIR] [--keep] "
                    "[--json] [--encrypt]\n");
            return 2;
        }
    }
    if (n_events < 1000 || reps < 1 || reps > BN_MAX_REPS) bn_die("--events >= 1000, --reps 1..20");
    mkdir(dir, 0755);
    bool do_kafka = strstr(configs, "pg-kafka"), do_amqp = strstr(configs, "pg-amqp"),
         do_sqlite = strstr(configs, "sqlite-log");
    obx_kafka_mock *mock = NULL;
    char boot[512] = "";
    if (do_kafka && obx_kafka_mock_start(3, "orders", 8, boot, sizeof boot, &mock))
        bn_die("kafka mock: %s", obx_errmsg());
    result rk[BN_MAX_REPS], ra[BN_MAX_REPS], rsq[BN_MAX_REPS];
    double load0 = bn_loadavg();
    for (int rep = 0; rep < reps; rep++) {
        result lim = {0};
        if (do_kafka || do_amqp) {
            /* the limit on a copy of exactly the rows the relay gets */
            char url[1024];
            bn_pg_fresh("obx_bench_src", "orders", url, sizeof url);
            PGconn *c = bn_pg_connect(url);
            bn_pg_fill(c, 1, n_events, "PENDING");
            PQfinish(c);
            lim.store_lim = pg_claim_mark_limit("obx_bench_src", &lim.lim_cpu_us, &lim.lim_wal);
            bn_pg_drop("obx_bench_src");
            bn_log("rep %d: PostgreSQL claim-and-mark limit %.0f rows/s", rep + 1, lim.store_lim);
        }
        if (do_kafka) {
            rep_pg_kafka(boot, &lim, &rk[rep], rep);
            bn_log("rep %d: pg-kafka obx %.0f ev/s, raw librdkafka %.0f msg/s", rep + 1,
                   rk[rep].obx, rk[rep].broker_lim);
        }
        if (do_amqp) {
            rep_pg_amqp(&lim, &ra[rep], rep);
            bn_log("rep %d: pg-amqp obx %.0f ev/s, raw rabbitmq-c %.0f msg/s", rep + 1, ra[rep].obx,
                   ra[rep].broker_lim);
        }
        if (do_sqlite) {
            rep_sqlite_log(&rsq[rep], rep);
            bn_log("rep %d: sqlite-log obx %.0f ev/s, store limit %.0f, log limit %.0f", rep + 1,
                   rsq[rep].obx, rsq[rep].store_lim, rsq[rep].broker_lim);
        }
    }
    obx_kafka_mock_stop(mock);
    printf("\nrelay throughput: %ld-event backlog to all PUBLISHED with receipts; median of %d "
           "reps; load average %.1f before, %.1f after (2 cores)\n\n",
           n_events, reps, load0, bn_loadavg());
    printf("| config | obx ev/s | store limit | obx/store | broker limit | obx/broker | target | "
           "obx CPU us/ev | limit CPU us/ev | CPU ratio | obx WAL B/ev | limit WAL B/ev | relay "
           "CPU s/10k ev | relay peak RSS MiB |\n");
    printf("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    if (do_kafka) print_row("pg-kafka", rk, reps, ">= 0.60 of store limit", 0.60, false);
    if (do_amqp) print_row("pg-amqp", ra, reps, ">= 0.80 of broker limit", 0.80, true);
    if (do_sqlite) print_row("sqlite-log", rsq, reps, "(none)", 0, false);
    if (do_amqp) {
        /* the 2-core budget: in the relay's run the machine also runs PostgreSQL and the
         * relay, so the rate cannot exceed 2 cores / (obx CPU + broker CPU) per event */
        double v[4][BN_MAX_REPS];
        for (int i = 0; i < reps; i++) {
            v[0][i] = ra[i].broker_cpu_raw;
            v[1][i] = ra[i].broker_cpu_obx;
            v[2][i] = 2e6 / (ra[i].obx_cpu_us + ra[i].broker_cpu_obx);
            v[3][i] = ra[i].obx / v[2][i];
        }
        printf("\n| pg-amqp CPU budget | RabbitMQ CPU us/msg, raw loop | RabbitMQ CPU us/msg, obx "
               "run | 2-core ceiling ev/s = 2 / (obx + RabbitMQ CPU per event) | obx / ceiling "
               "|\n|---|---:|---:|---:|---:|\n| median | %.0f | %.0f | %.0f | %.2f |\n",
               bn_median(v[0], reps), bn_median(v[1], reps), bn_median(v[2], reps),
               bn_median(v[3], reps));
    }
    if (bn_encrypt_key) seal_cost();
    printf("\nrelay logs: %s\n", dir);
    if (json) print_json(do_kafka, rk, do_amqp, ra, do_sqlite, rsq, reps);
    return 0;
}

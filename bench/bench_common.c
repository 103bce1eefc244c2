/*
 * bench_common.c — the helpers every bench/ program uses (bench.h): clocks and medians,
 * PostgreSQL fills and counts, relay processes and their /proc figures, pgbench, and the raw
 * librdkafka / rabbitmq-c publishers that give the brokers' limits.
 */
#include "bench.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- clocks, statistics, output ---------------------------------------------------------- */

double bn_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double bn_cpu_self(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bn_median(const double *v, int n) {
    if (n <= 0) return 0;
    double s[BN_MAX_REPS * 4];
    if (n > (int)(sizeof s / sizeof s[0])) n = (int)(sizeof s / sizeof s[0]);
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_d);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

double bn_loadavg(void) {
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

void bn_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

void bn_log(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[%7.1f] ", bn_now());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    va_end(ap);
}

/* ---- PostgreSQL ---------------------------------------------------------------------------- */

const char *bn_pg_base(void) {
    const char *u = getenv("OBX_TEST_PG_URL");
    if (!u || !*u) bn_die("OBX_TEST_PG_URL is not set (bench/run.sh starts the servers)");
    return u;
}

/* Database names get this process's ID appended, so that two bench programs on one server
 * never drop each other's databases. */
static const char *phys(const char *name) {
    static char buf[4][128];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s_%d", name, (int)getpid());
    return b;
}

void bn_pg_url(const char *name, char *out, size_t cap) {
    const char *db = phys(name);
    const char *base = bn_pg_base();
    const char *auth = strstr(base, "://");
    auth = auth ? auth + 3 : base;
    const char *slash = strchr(auth, '/'), *q = strchr(auth, '?');
    size_t head = slash ? (size_t)(slash - base) : (q ? (size_t)(q - base) : strlen(base));
    snprintf(out, cap, "%.*s/%s%s", (int)head, base, db, q ? q : "");
}

PGconn *bn_pg_connect(const char *url) {
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK) bn_die("connect %s: %s", url, PQerrorMessage(c));
    PQclear(PQexec(c, "SET client_min_messages = warning"));
    return c;
}

static PGresult *vsql(PGconn *c, const char *fmt, va_list ap) {
    char *q = NULL;
    if (vasprintf(&q, fmt, ap) < 0) bn_die("out of memory");
    PGresult *r = PQexec(c, q);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        bn_die("SQL failed: %.300s: %s", q, PQerrorMessage(c));
    free(q);
    return r;
}

void bn_sql(PGconn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PQclear(vsql(c, fmt, ap));
    va_end(ap);
}

long long bn_sql_ll(PGconn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = vsql(c, fmt, ap);
    va_end(ap);
    long long v =
        PQntuples(r) && !PQgetisnull(r, 0, 0) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    return v;
}

double bn_sql_d(PGconn *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PGresult *r = vsql(c, fmt, ap);
    va_end(ap);
    double v = PQntuples(r) && !PQgetisnull(r, 0, 0) ? strtod(PQgetvalue(r, 0, 0), NULL) : 0;
    PQclear(r);
    return v;
}

void bn_pg_drop(const char *name) {
    PGconn *a = bn_pg_connect(bn_pg_base());
    bn_sql(a, "DROP DATABASE IF EXISTS %s WITH (FORCE)", phys(name));
    PQfinish(a);
}

void bn_pg_create(const char *name) {
    PGconn *a = bn_pg_connect(bn_pg_base());
    bn_sql(a, "DROP DATABASE IF EXISTS %s WITH (FORCE)", phys(name));
    bn_sql(a, "CREATE DATABASE %s", phys(name));
    PQfinish(a);
}

void bn_pg_copy(const char *dst, const char *src) {
    PGconn *a = bn_pg_connect(bn_pg_base());
    bn_sql(a, "DROP DATABASE IF EXISTS %s WITH (FORCE)", phys(dst));
    bn_sql(a, "CREATE DATABASE %s TEMPLATE %s", phys(dst), phys(src));
    PQfinish(a);
}

const char *bn_encrypt_key;

void bn_pg_fresh(const char *name, const char *topic, char *url, size_t cap) {
    PGconn *a = bn_pg_connect(bn_pg_base());
    bn_sql(a, "DROP DATABASE IF EXISTS %s WITH (FORCE)", phys(name));
    bn_sql(a, "CREATE DATABASE %s", phys(name));
    PQfinish(a);
    bn_pg_url(name, url, cap);
    obx_store *s;
    if (obx_store_open(url, &s) || obx_store_init(s)) bn_die("init %s: %s", name, obx_errmsg());
    obx_route r = {
        .event_type = BN_TYPE, .cluster = BN_CLUSTER, .topic = topic, .encrypt = bn_encrypt_key};
    if (obx_route_set(s, &r, NULL)) bn_die("route: %s", obx_errmsg());
    obx_store_close(s);
}

/* The columns of one generated event i (s.*), shared by the envelope and event inserts. */
#define GEN_ROWS                                                                                   \
    "(SELECT i, 'evt-' || lpad(i::text, 26, '0') AS id, 'o-' || i AS aid, "                        \
    "'" BN_TENANT ".order.o-' || i AS rk, convert_to(rpad('{\"order\":\"o-' || i || "              \
    "'\",\"total\":' || (i %% 10000) || ',\"note\":\"', %d, 'x') || '\"}', 'UTF8') AS p, "         \
    "CASE WHEN %d = 1 THEN 1000000000000 + i ELSE %lld END AS t "                                  \
    "FROM generate_series(%ld, %ld) i) s, "                                                        \
    "(SELECT gen, cluster, topic FROM obx.obx_route WHERE event_type = '" BN_TYPE "' "             \
    "ORDER BY gen DESC LIMIT 1) r, "                                                               \
    "(SELECT 'sha256:' || encode(sha256(convert_to('schema:" BN_TYPE "', 'UTF8')), 'hex') AS "     \
    "schema) c "

static void fill_chunk(PGconn *c, long first, long n, const char *state, bool done,
                       long long avail) {
    long last = first + n - 1;
    long long now = (long long)obx__wall_ms();
    int old = done ? 1 : 0;
    bn_sql(c,
           "INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id, "
           "aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at, "
           "created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
           "envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm, "
           "dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload, "
           "payload_len, created_at) "
           "SELECT id, 1, 'order', aid, 1, '" BN_TYPE "', schema, pd, '" BN_TENANT "', t, "
           "'bench', '', '', '', '', obx.envelope_digest(id, 1, 'order', aid, 1, '" BN_TYPE "', "
           "schema, pd, '" BN_TENANT "', t, 'bench', '', '', '', ''), cluster, topic, rk, "
           "'murmur2', gen, 'raw', 'persistent', 'all', obx.dest_digest(cluster, topic, rk, "
           "'murmur2', gen, 'raw', 'persistent', 'all'), p, octet_length(p), t "
           "FROM (SELECT *, 'sha256:' || encode(sha256(p), 'hex') AS pd FROM " GEN_ROWS
           ") x ORDER BY i",
           BN_PAYLOAD - 2, old, now, first, last);
    bn_sql(
        c,
        "INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, "
        "correlation_id, order_key, envelope_gen, state, claim_gen, owner, lease_until, "
        "attempt_gen, attempt_id, pinned_partition, rejections, available_at, next_check_at, "
        "unknown_since, primary_attempt_id, published_at, committed_at, updated_at, "
        "max_attempts, blind_retry, unordered, alias, dest_cluster) "
        "SELECT id, '" BN_TENANT "', NULL, '" BN_TYPE "', '', r.cluster || chr(31) || r.topic "
        "|| chr(31) || rk, 1, '%s', %d, '', 0, %d, CASE WHEN %d = 1 THEN 'att-' || "
        "lpad(i::text, 26, '0') ELSE '' END, CASE WHEN %d = 1 THEN (i %% 8)::int ELSE -1 END, "
        "0, CASE WHEN %lld > 0 THEN %lld ELSE t END, 0, 0, CASE WHEN %d = 1 THEN 'att-' || "
        "lpad(i::text, 26, '0') ELSE '' END, CASE WHEN %d = 1 THEN t ELSE 0 END, t, t, 8, false, "
        "false, 'obx', r.cluster FROM " GEN_ROWS "ORDER BY i",
        state, old, old, old, old, avail, avail, old, old, BN_PAYLOAD - 2, old, now, first, last);
    /* its statistics delta, as every statement inserting events writes one (schema.sql,
     * obx_stat_delta) */
    bn_sql(c, "INSERT INTO obx.obx_stat_delta (key, n) VALUES ('state:%s', %ld)", state, n);
    if (!done) return;
    /* what a publication leaves behind: the accepted attempt, the primary receipt, an audit
     * row (one of the three a relay writes: enough to give the tables their size) */
    bn_sql(c,
           "INSERT INTO obx.obx_attempt (attempt_id, event_id, envelope_gen, attempt_gen, "
           "claim_gen, owner, dest_digest, partition, state, started_at, unknown_at, ended_at, "
           "offset_before, quiet_until, detail) SELECT e.attempt_id, e.event_id, 1, 1, 1, "
           "'bench/d0', v.dest_digest, e.pinned_partition, 'ACCEPTED', e.published_at, 0, "
           "e.published_at, -1, e.published_at, '' FROM obx.obx_event e JOIN obx.obx_envelope v "
           "ON v.event_id = e.event_id AND v.envelope_gen = 1 WHERE e.event_id BETWEEN "
           "'evt-' || lpad('%ld', 26, '0') AND 'evt-' || lpad('%ld', 26, '0') ORDER BY e.seq",
           first, last);
    bn_sql(c,
           "INSERT INTO obx.obx_receipt (event_id, envelope_gen, attempt_id, kind, cluster, "
           "topic, partition, \"offset\", broker_ts, payload_digest, dest_digest, reason, "
           "created_at) SELECT e.event_id, 1, e.attempt_id, 'PRIMARY', v.dest_cluster, "
           "v.dest_topic, e.pinned_partition, e.seq, e.published_at, v.payload_digest, "
           "v.dest_digest, 'accepted in SENDING', e.published_at FROM obx.obx_event e JOIN "
           "obx.obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = 1 WHERE "
           "e.event_id BETWEEN 'evt-' || lpad('%ld', 26, '0') AND 'evt-' || lpad('%ld', 26, "
           "'0') ORDER BY e.seq",
           first, last);
    bn_sql(c,
           "INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, from_state, "
           "to_state, claim_gen, attempt_id, attempt_gen, reason) SELECT e.published_at, "
           "'acceptor', 'bench/d0', e.event_id, 1, 'SENDING', 'PUBLISHED', 1, e.attempt_id, 1, "
           "'receipt of attempt ' || e.attempt_id || ' filled the slot' FROM obx.obx_event e "
           "WHERE e.event_id BETWEEN 'evt-' || lpad('%ld', 26, '0') AND 'evt-' || lpad('%ld', "
           "26, '0') ORDER BY e.seq",
           first, last);
}

void bn_pg_fill(PGconn *c, long first, long n, const char *state) {
    bn_pg_fill_at(c, first, n, state, 0);
}

void bn_pg_fill_at(PGconn *c, long first, long n, const char *state, long long available_at) {
    bool done = strcmp(state, "PENDING") != 0;
    /* OBX_BENCH_EVENT_FILLFACTOR: obx_event's fillfactor for the rows filled from here on (the
     * WAL/disk trade-off of schema.sql's fillfactor 50, measured; the schema's own value otherwise)
     */
    const char *ff = getenv("OBX_BENCH_EVENT_FILLFACTOR");
    if (ff && *ff) bn_sql(c, "ALTER TABLE obx.obx_event SET (fillfactor = %d)", atoi(ff));
    const long chunk = 250000;
    for (long at = 0; at < n; at += chunk) {
        long k = n - at < chunk ? n - at : chunk;
        fill_chunk(c, first + at, k, state, done, available_at);
        if (n > chunk) bn_log("fill: %ld of %ld %s events", at + k, n, state);
    }
    bn_sql(c, "ANALYZE obx.obx_event");
    bn_sql(c, "ANALYZE obx.obx_envelope");
}

void bn_pg_counts(PGconn *c, long long *published, long long *primary) {
    /* the sums of the statistics deltas (schema.sql, obx._stats): cheap enough to poll, unlike
     * obx._stats(), which also compacts and looks at the unpublished events */
    PGresult *r = PQexec(c, "SELECT key, sum(n) FROM obx.obx_stat_delta WHERE key IN "
                            "('state:PUBLISHED', 'receipt:PRIMARY') GROUP BY key");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) bn_die("stats: %s", PQerrorMessage(c));
    if (published) *published = 0;
    if (primary) *primary = 0;
    for (int i = 0; i < PQntuples(r); i++) {
        long long v = strtoll(PQgetvalue(r, i, 1), NULL, 10);
        if (!strcmp(PQgetvalue(r, i, 0), "state:PUBLISHED") && published) *published = v;
        if (!strcmp(PQgetvalue(r, i, 0), "receipt:PRIMARY") && primary) *primary = v;
    }
    PQclear(r);
}

/* utime + stime (+ cutime + cstime with children) of /proc/PID/stat, in clock ticks; *ppid
 * gets the parent. -1 when the process is gone. */
static long long proc_ticks(const char *pid, bool children, long *ppid) {
    char path[300], buf[2048];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *s = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    long long cut = 0, cst = 0;
    long pp = 0;
    if (!s || sscanf(s + 2, "%*c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %lld %lld", &pp,
                     &ut, &st, &cut, &cst) != 5)
        return -1;
    if (ppid) *ppid = pp;
    return (long long)(ut + st) + (children ? cut + cst : 0);
}

double bn_pg_server_cpu(void) {
    const char *d = getenv("OBX_TEST_SERVICES_DIR");
    char path[600], pm[32] = "";
    if (!d) return 0;
    snprintf(path, sizeof path, "%s/pg/data/postmaster.pid", d);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(pm, sizeof pm, f)) pm[0] = '\0';
    fclose(f);
    pm[strcspn(pm, "\n")] = '\0';
    long pmpid = atol(pm), ppid = 0;
    long long ticks = proc_ticks(pm, true, NULL);
    if (ticks < 0) return 0;
    DIR *dir = opendir("/proc");
    struct dirent *de;
    while (dir && (de = readdir(dir)) != NULL) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9') continue;
        long long t = proc_ticks(de->d_name, false, &ppid);
        if (t > 0 && ppid == pmpid) ticks += t;
    }
    if (dir) closedir(dir);
    return (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

double bn_rabbit_cpu(void) {
    const char *d = getenv("OBX_TEST_RABBIT_DIR");
    char path[600], pid[32] = "";
    if (!d) return 0;
    snprintf(path, sizeof path, "%s/rabbit.pid", d);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (!fgets(pid, sizeof pid, f)) pid[0] = '\0';
    fclose(f);
    pid[strcspn(pid, "\n")] = '\0';
    long long t = proc_ticks(pid, true, NULL);
    return t < 0 ? 0 : (double)t / (double)sysconf(_SC_CLK_TCK);
}

double bn_pg_wal(void) {
    PGconn *c = bn_pg_connect(bn_pg_base());
    double v = bn_sql_d(c, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')");
    PQfinish(c);
    return v;
}

void bn_pg_lsn(char *buf, size_t cap) {
    PGconn *c = bn_pg_connect(bn_pg_base());
    PGresult *r = PQexec(c, "SELECT pg_current_wal_lsn()::text");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) bn_die("lsn: %s", PQerrorMessage(c));
    snprintf(buf, cap, "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
}

/* Where the WAL of a run went: a record is counted against the relation of its first block
 * reference (heap, index, visibility map...), records without one against their resource
 * manager (transaction commits, ...). */
void bn_pg_wal_detail(const char *url, const char *lsn0, const char *lsn1, double per) {
    if (!getenv("OBX_BENCH_WAL_DETAIL") || per <= 0) return;
    PGconn *c = bn_pg_connect(url);
    PQclear(PQexec(c, "CREATE EXTENSION IF NOT EXISTS pg_walinspect"));
    const char *v[2] = {lsn0, lsn1};
    PGresult *r = PQexecParams(
        c,
        "WITH w AS (SELECT record_length, fpi_length, resource_manager, "
        "  record_type, regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)') AS m "
        "  FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)) "
        "SELECT coalesce(CASE WHEN m[1]::oid = (SELECT oid FROM pg_database WHERE datname = "
        "current_database()) THEN pg_filenode_relation(0, m[2]::oid)::regclass::text END, "
        "'(' || resource_manager || ')') || ' ' || record_type, count(*), sum(record_length), "
        "sum(fpi_length) "
        "FROM w GROUP BY 1 ORDER BY 3 DESC",
        2, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) bn_die("wal detail: %s", PQerrorMessage(c));
    fprintf(stderr, "WAL per event by relation (%s .. %s):\n", lsn0, lsn1);
    fprintf(stderr, "  %-52s %10s %10s %10s\n", "relation", "records", "bytes", "fpi bytes");
    for (int i = 0; i < PQntuples(r); i++)
        fprintf(stderr, "  %-52s %10.2f %10.1f %10.1f\n", PQgetvalue(r, i, 0),
                atof(PQgetvalue(r, i, 1)) / per, atof(PQgetvalue(r, i, 2)) / per,
                atof(PQgetvalue(r, i, 3)) / per);
    PQclear(r);
    /* what the fillfactor costs on disk: the event table's heap per event it holds */
    r = PQexec(c, "SELECT pg_relation_size('obx.obx_event'), (SELECT count(*) FROM obx.obx_event), "
                  "coalesce((SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = "
                  "'obx.obx_event'::regclass), '')");
    if (PQresultStatus(r) == PGRES_TUPLES_OK && atof(PQgetvalue(r, 0, 1)) > 0)
        fprintf(stderr, "obx_event heap: %.0f bytes per event (%s)\n",
                atof(PQgetvalue(r, 0, 0)) / atof(PQgetvalue(r, 0, 1)), PQgetvalue(r, 0, 2));
    PQclear(r);
    PQfinish(c);
}

void bn_pg_stmt_reset(void) {
    if (!getenv("OBX_BENCH_WAL_DETAIL")) return;
    PGconn *c = bn_pg_connect(bn_pg_base());
    PQclear(PQexec(c, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"));
    PQclear(PQexec(c, "SELECT pg_stat_statements_reset()"));
    PQfinish(c);
}

void bn_pg_stmt_detail(double per) {
    if (!getenv("OBX_BENCH_WAL_DETAIL") || per <= 0) return;
    PGconn *c = bn_pg_connect(bn_pg_base());
    PGresult *r = PQexec(c, "SELECT calls, total_exec_time, left(regexp_replace(query, "
                            "'\\s+', ' ', 'g'), 90) FROM pg_stat_statements WHERE "
                            "total_exec_time > 0 ORDER BY total_exec_time DESC LIMIT 15");
    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        fprintf(stderr, "server execution time per event by statement (pg_stat_statements):\n");
        for (int i = 0; i < PQntuples(r); i++)
            fprintf(stderr, "  %8.1f us %8s calls  %s\n", atof(PQgetvalue(r, i, 1)) * 1000.0 / per,
                    PQgetvalue(r, i, 0), PQgetvalue(r, i, 2));
    }
    PQclear(r);
    PQfinish(c);
}

double bn_children_cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

double bn_pg_wait_published(PGconn *c, long long target, pid_t relay, double timeout_s) {
    double t0 = bn_now(), last_log = t0;
    for (;;) {
        long long pub = 0;
        bn_pg_counts(c, &pub, NULL);
        double t = bn_now();
        if (pub >= target) return t;
        if (relay > 0 && kill(relay, 0) != 0) {
            bn_log("the relay (pid %d) is gone with %lld of %lld published", (int)relay, pub,
                   target);
            return -1;
        }
        if (t - t0 > timeout_s) {
            bn_log("timeout: %lld of %lld published after %.0f s", pub, target, t - t0);
            return -1;
        }
        if (t - last_log > 10) {
            bn_log("  %lld of %lld published", pub, target);
            last_log = t;
        }
        usleep(100000);
    }
}

/* ---- processes ------------------------------------------------------------------------------ */

void bn_spawn(bn_proc *p, const char *log, char *const argv[]) {
    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "%s", log);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) bn_die("fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    p->pid = pid;
    p->started = bn_now();
}

const char *bn_obx_bin(void) {
    const char *b = getenv("OBX_BENCH_OBX");
    return b && *b ? b : OBX_BIN;
}

void bn_relay_start(bn_proc *p, const char *logdir, const char *id, const char *db,
                    const char *broker, const char *const *sets) {
    char *argv[64];
    int k = 0;
    char idset[128], log[512];
    snprintf(idset, sizeof idset, "relay.id=%s", id);
    snprintf(log, sizeof log, "%s/relay-%s.log", logdir, id);
    argv[k++] = (char *)bn_obx_bin();
    argv[k++] = (char *)"relay";
    argv[k++] = (char *)"--db";
    argv[k++] = (char *)db;
    argv[k++] = (char *)"--broker";
    argv[k++] = (char *)broker;
    argv[k++] = (char *)"--set";
    argv[k++] = idset;
    argv[k++] = (char *)"--set";
    argv[k++] = (char *)"log.level=warn";
    for (int i = 0; sets && sets[i] && k < 60; i++) {
        argv[k++] = (char *)"--set";
        argv[k++] = (char *)sets[i];
    }
    argv[k] = NULL;
    bn_spawn(p, log, argv);
}

/* The minor faults and CPU ticks (user + system) of process pid from /proc/PID/stat; false when
 * it cannot be read. */
static bool proc_stat(int pid, unsigned long *minflt, unsigned long *ticks) {
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *s = strrchr(buf, ')'); /* after the command name */
    unsigned long mf = 0, ut = 0, st = 0;
    /* fields after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt
     * cmajflt utime stime */
    if (!s ||
        sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %lu %*u %*u %*u %lu %lu", &mf, &ut, &st) != 3)
        return false;
    *minflt = mf;
    *ticks = ut + st;
    return true;
}

void bn_proc_usage(const bn_proc *p, long *hwm_kib, long *rss_kib, double *cpu_s) {
    char path[64], line[256];
    if (hwm_kib) *hwm_kib = -1;
    if (rss_kib) *rss_kib = -1;
    if (cpu_s) *cpu_s = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)p->pid);
    FILE *f = fopen(path, "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (hwm_kib && !strncmp(line, "VmHWM:", 6)) *hwm_kib = strtol(line + 6, NULL, 10);
            if (rss_kib && !strncmp(line, "VmRSS:", 6)) *rss_kib = strtol(line + 6, NULL, 10);
        }
        fclose(f);
    }
    unsigned long mf, ticks;
    if (cpu_s && proc_stat((int)p->pid, &mf, &ticks))
        *cpu_s = (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

double bn_proc_runq_ns(const bn_proc *p) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)p->pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    double sum = 0;
    bool any = false;
    struct dirent *t;
    while ((t = readdir(d)) != NULL) {
        if (t->d_name[0] == '.') continue;
        char f[128];
        snprintf(f, sizeof f, "/proc/%d/task/%.16s/schedstat", (int)p->pid, t->d_name);
        FILE *s = fopen(f, "r");
        unsigned long long run, wait;
        if (s && fscanf(s, "%llu %llu", &run, &wait) == 2) {
            sum += (double)wait;
            any = true;
        }
        if (s) fclose(s);
    }
    closedir(d);
    return any ? sum : -1;
}

long bn_proc_minflt(const bn_proc *p) {
    unsigned long mf, ticks;
    return proc_stat((int)p->pid, &mf, &ticks) ? (long)mf : -1;
}

bool bn_proc_alive(const bn_proc *p) {
    int st;
    return p->pid > 0 && waitpid(p->pid, &st, WNOHANG) == 0;
}

int bn_proc_stop(bn_proc *p) {
    if (p->pid <= 0) return -1;
    kill(p->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 400; i++) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        if (r < 0) {
            p->pid = 0;
            return -1;
        }
        usleep(50000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
    return -1;
}

int bn_run(const char *log, char *const argv[]) {
    bn_proc p;
    bn_spawn(&p, log, argv);
    int st = 0;
    if (waitpid(p.pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- pgbench ------------------------------------------------------------------------------- */

double bn_pgbench(const char *url, const char *script, int clients, const char *extra,
                  const char *log) {
    char path[] = "/tmp/obx-bench-XXXXXX.sql";
    int fd = mkstemps(path, 4);
    if (fd < 0) bn_die("mkstemps: %s", strerror(errno));
    size_t len = strlen(script);
    if (write(fd, script, len) != (ssize_t)len) bn_die("write %s", path);
    close(fd);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "pgbench -n -r -c %d -j %d %s -f %s '%s' 2>&1", clients,
             clients < 4 ? clients : 4, extra, path, url);
    FILE *f = popen(cmd, "r");
    if (!f) bn_die("popen pgbench: %s", strerror(errno));
    FILE *lf = log ? fopen(log, "a") : NULL;
    if (lf) fprintf(lf, "$ %s\n", cmd);
    char line[1024];
    double tps = -1;
    while (fgets(line, sizeof line, f)) {
        if (lf) fputs(line, lf);
        const char *t = strstr(line, "tps = ");
        if (t && strstr(line, "without initial connection time")) tps = strtod(t + 6, NULL);
    }
    int st = pclose(f);
    if (lf) fclose(lf);
    unlink(path);
    if (st != 0 || tps < 0) bn_die("pgbench failed (status %d); see %s", st, log ? log : "");
    return tps;
}

/* The minimal claim-and-mark statement: one round trip per batch of 100, in the claim's order
 * (obx_event_claimable: available_at, seq). */
static const char claim_mark[] =
    "WITH c AS (SELECT e.seq, e.event_id, v.dest_routing_key, v.payload FROM obx.obx_event e "
    "JOIN obx.obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen "
    "WHERE e.state = 'PENDING' ORDER BY e.available_at, e.seq LIMIT 100 FOR UPDATE OF e SKIP "
    "LOCKED), "
    "u AS (UPDATE obx.obx_event e SET state = 'PUBLISHED', published_at = "
    "(extract(epoch FROM clock_timestamp()) * 1000)::bigint, updated_at = "
    "(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM c WHERE e.seq = c.seq "
    "RETURNING c.event_id, c.dest_routing_key, c.payload) "
    "SELECT count(*), sum(octet_length(payload)) FROM u;\n";

double bn_pg_claim_mark_limit(const char *src_db, long n, const char *log, bool keep,
                              double *cpu_us, double *wal) {
    char url[1024];
    bn_pg_copy("obx_bench_lim", src_db);
    bn_pg_url("obx_bench_lim", url, sizeof url);
    PGconn *c = bn_pg_connect(url);
    bn_sql(c, "ANALYZE");
    int clients = 8;
    long tx = n / (100L * clients);
    if (tx < 1) tx = 1;
    char extra[64];
    snprintf(extra, sizeof extra, "-t %ld", tx);
    double pg0 = bn_pg_server_cpu(), ch0 = bn_children_cpu(), w0 = bn_pg_wal();
    double tps = bn_pgbench(url, claim_mark, clients, extra, log);
    double cpu = bn_pg_server_cpu() - pg0 + bn_children_cpu() - ch0, w = bn_pg_wal() - w0;
    long long marked = bn_sql_ll(c, "SELECT count(*) FROM obx.obx_event WHERE state = 'PUBLISHED'");
    PQfinish(c);
    if (!keep) bn_pg_drop("obx_bench_lim");
    if (cpu_us) *cpu_us = marked ? cpu * 1e6 / (double)marked : 0;
    if (wal) *wal = marked ? w / (double)marked : 0;
    return tps * (double)marked / (double)(tx * clients);
}

/* ---- messages and raw publishers ----------------------------------------------------------- */

void bn_msgs_make(bn_msgs *b, size_t n, const char *topic, int parts) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->env = calloc(n, sizeof *b->env);
    b->dest = calloc(n, sizeof *b->dest);
    b->dd = calloc(n, sizeof *b->dd);
    b->att = calloc(n, sizeof *b->att);
    b->payload = calloc(n, sizeof *b->payload);
    b->m = calloc(n, sizeof *b->m);
    if (!b->env || !b->dest || !b->dd || !b->att || !b->payload || !b->m) bn_die("out of memory");
    char schema[OBX_DIGEST_LEN + 1];
    obx_sha256_digest("schema:" BN_TYPE, strlen("schema:" BN_TYPE), schema);
    for (size_t i = 0; i < n; i++) {
        obx__envelope *e = &b->env[i];
        char head[128];
        int hl = snprintf(head, sizeof head, "{\"order\":\"o-%zu\",\"total\":%zu,\"note\":\"", i,
                          i % 10000);
        memset(b->payload[i], 'x', BN_PAYLOAD);
        memcpy(b->payload[i], head, (size_t)hl);
        memcpy(b->payload[i] + BN_PAYLOAD - 2, "\"}", 2);
        obx_event_id_new(0, e->event_id);
        e->envelope_gen = 1;
        strcpy(e->aggregate_type, "order");
        snprintf(e->aggregate_id, sizeof e->aggregate_id, "o-%zu", i);
        e->aggregate_version = 1;
        strcpy(e->event_type, BN_TYPE);
        strcpy(e->payload_schema, schema);
        obx_sha256_digest(b->payload[i], BN_PAYLOAD, e->payload_digest);
        strcpy(e->tenant, BN_TENANT);
        e->occurred_at = obx__wall_ms();
        strcpy(e->created_txid, "bench");
        obx__dest *d = &b->dest[i];
        strcpy(d->cluster, BN_CLUSTER);
        obx__strlcpy(d->topic, topic, sizeof d->topic);
        snprintf(d->routing_key, sizeof d->routing_key, BN_TENANT ".order.o-%zu", i);
        strcpy(d->algorithm, "murmur2");
        d->route_gen = 1;
        strcpy(d->serializer, "raw");
        strcpy(d->durability, "persistent");
        strcpy(d->required_acks, "all");
        obx__dest_digest(d, b->dd[i]);
        snprintf(b->att[i], sizeof b->att[i], "att-%s", e->event_id + 4);
        b->m[i] = (obx__msg){.env = e,
                             .dest = d,
                             .dest_digest = b->dd[i],
                             .attempt_id = b->att[i],
                             .attempt_gen = 1,
                             .partition =
                                 parts > 1 ? obx__partition("murmur2", d->routing_key, parts) : 0,
                             .payload = b->payload[i],
                             .payload_len = BN_PAYLOAD};
    }
}

void bn_msgs_free(bn_msgs *b) {
    free(b->env);
    free(b->dest);
    free(b->dd);
    free(b->att);
    free(b->payload);
    free(b->m);
    memset(b, 0, sizeof *b);
}

static long k_acked, k_failed;

static void k_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    (void)rk;
    (void)opaque;
    if (m->err)
        k_failed++;
    else
        k_acked++;
}

double bn_kafka_raw(const char *bootstraps, const bn_msgs *pool, long n) {
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (rd_kafka_conf_set(c, "bootstrap.servers", bootstraps, err, sizeof err) ||
        rd_kafka_conf_set(c, "enable.idempotence", "true", err, sizeof err) ||
        rd_kafka_conf_set(c, "acks", "all", err, sizeof err) ||
        rd_kafka_conf_set(c, "client.id", "bench-raw", err, sizeof err))
        bn_die("kafka conf: %s", err);
    rd_kafka_conf_set_dr_msg_cb(c, k_dr);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    if (!rk) bn_die("kafka producer: %s", err);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, pool->dest[0].topic, NULL);
    k_acked = k_failed = 0;
    double t0 = bn_now();
    for (long i = 0; i < n; i++) {
        const obx__msg *m = &pool->m[(size_t)i % pool->n];
        obx__headers h;
        obx__headers_build(m, &h);
        rd_kafka_headers_t *hd = rd_kafka_headers_new(h.n);
        for (size_t k = 0; k < h.n; k++) rd_kafka_header_add(hd, h.name[k], -1, h.value[k], -1);
        const char *key = m->dest->routing_key;
        for (;;) {
            rd_kafka_resp_err_t e = rd_kafka_producev(
                rk, RD_KAFKA_V_RKT(rkt), RD_KAFKA_V_PARTITION(m->partition),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_KEY(key, strlen(key)),
                RD_KAFKA_V_VALUE((void *)m->payload, m->payload_len), RD_KAFKA_V_HEADERS(hd),
                RD_KAFKA_V_END);
            if (!e) break;
            if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) bn_die("produce: %s", rd_kafka_err2str(e));
            rd_kafka_poll(rk, 10);
        }
        if (i % 256 == 255) rd_kafka_poll(rk, 0);
    }
    rd_kafka_flush(rk, 120000);
    double dt = bn_now() - t0;
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    if (k_acked != n)
        bn_die("raw kafka: %ld of %ld acknowledged, %ld failed", k_acked, n, k_failed);
    return (double)n / dt;
}

static void amqp_connect(const char *amqp_url, amqp_connection_state_t *out) {
    obx__url u;
    if (obx__url_parse(amqp_url, "broker", &u)) bn_die("AMQP URL: %s", obx_errmsg());
    amqp_connection_state_t c = amqp_new_connection();
    amqp_socket_t *s = amqp_tcp_socket_new(c);
    char host[256];
    const char *colon = strrchr(u.hosts, ':');
    if (!colon) bn_die("AMQP URL without a port");
    snprintf(host, sizeof host, "%.*s", (int)(colon - u.hosts), u.hosts);
    if (amqp_socket_open(s, host, atoi(colon + 1)) != AMQP_STATUS_OK) bn_die("AMQP connect");
    if (amqp_login(c, u.vhost[0] ? u.vhost : "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                   u.user[0] ? u.user : "guest", u.user[0] ? u.password : "guest")
            .reply_type != AMQP_RESPONSE_NORMAL)
        bn_die("AMQP login");
    amqp_channel_open(c, 1);
    if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bn_die("AMQP channel");
    *out = c;
}

void bn_amqp_topology(const char *amqp_url, const char *exchange, const char *queue, bool create) {
    amqp_connection_state_t c;
    amqp_connect(amqp_url, &c);
    if (create) {
        amqp_exchange_declare(c, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes("topic"), 0, 1,
                              0, 0, amqp_empty_table);
        if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bn_die("exchange.declare");
        amqp_table_entry_t qt = {
            .key = amqp_cstring_bytes("x-queue-type"),
            .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("quorum")}};
        amqp_queue_declare(c, 1, amqp_cstring_bytes(queue), 0, 1, 0, 0, (amqp_table_t){1, &qt});
        if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bn_die("queue.declare");
        amqp_queue_bind(c, 1, amqp_cstring_bytes(queue), amqp_cstring_bytes(exchange),
                        amqp_cstring_bytes("#"), amqp_empty_table);
        if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bn_die("queue.bind");
    } else {
        amqp_queue_delete(c, 1, amqp_cstring_bytes(queue), 0, 0);
        amqp_get_rpc_reply(c);
        amqp_exchange_delete(c, 1, amqp_cstring_bytes(exchange), 0);
        amqp_get_rpc_reply(c);
    }
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
}

double bn_amqp_raw(const char *amqp_url, const char *exchange, const bn_msgs *pool, long n,
                   int window) {
    amqp_connection_state_t c;
    amqp_connect(amqp_url, &c);
    amqp_confirm_select(c, 1);
    if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bn_die("confirm.select");
    double t0 = bn_now();
    uint64_t published = 0, confirmed = 0;
    while (confirmed < (uint64_t)n) {
        while (published < (uint64_t)n && published - confirmed < (uint64_t)window) {
            const obx__msg *m = &pool->m[published % pool->n];
            obx__headers h;
            obx__headers_build(m, &h);
            amqp_table_entry_t e[18];
            int k = 0;
            for (size_t i = 0; i < h.n; i++)
                e[k++] =
                    (amqp_table_entry_t){.key = amqp_cstring_bytes(h.name[i]),
                                         .value = {.kind = AMQP_FIELD_KIND_UTF8,
                                                   .value.bytes = amqp_cstring_bytes(h.value[i])}};
            amqp_basic_properties_t pr;
            memset(&pr, 0, sizeof pr);
            pr._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                        AMQP_BASIC_HEADERS_FLAG;
            pr.delivery_mode = 2;
            pr.message_id = amqp_cstring_bytes(m->env->event_id);
            pr.headers = (amqp_table_t){k, e};
            amqp_bytes_t body = {m->payload_len, (void *)(uintptr_t)m->payload};
            if (amqp_basic_publish(c, 1, amqp_cstring_bytes(exchange),
                                   amqp_cstring_bytes(m->dest->routing_key), 1, 0, &pr,
                                   body) != AMQP_STATUS_OK)
                bn_die("raw AMQP publish");
            published++;
        }
        amqp_frame_t f;
        if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK) bn_die("raw AMQP wait");
        if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
            const amqp_basic_ack_t *a = f.payload.method.decoded;
            confirmed = a->multiple ? a->delivery_tag : confirmed + 1;
        } else if (f.frame_type == AMQP_FRAME_METHOD)
            bn_die("raw AMQP: unexpected method 0x%08x (nack, return or close)",
                   (unsigned)f.payload.method.id);
        amqp_maybe_release_buffers(c);
    }
    double dt = bn_now() - t0;
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
    return (double)n / dt;
}

/* ---- relays on a PostgreSQL backlog ------------------------------------------------------ */

void bn_kafka_broker_url(const char *boot, char *out, size_t cap) {
    snprintf(out, cap, "kafka://%s?cluster=" BN_CLUSTER, boot);
}

void bn_pg_relays(const char *db, const char *broker, int k, const char *prefix, const char *logdir,
                  const char *const *sets, long n, double timeout_s, bn_relay_run *out) {
    enum { MAXR = 16 };
    if (k < 1 || k > MAXR) bn_die("relays: 1..%d", MAXR);
    PGconn *c = bn_pg_connect(db);
    /* progress = primary receipts (a purge running beside may move PUBLISHED to RETAINED, a
     * primary receipt stays) */
    long long before = 0;
    bn_pg_counts(c, NULL, &before);
    bn_proc p[MAXR];
    double pg0 = bn_pg_server_cpu();
    for (int i = 0; i < k; i++) {
        char id[96];
        snprintf(id, sizeof id, "%s-%d", prefix, i + 1);
        bn_relay_start(&p[i], logdir, id, db, broker, sets);
    }
    double t_done = -1, t0 = p[0].started, last_log = t0;
    long hwm = 0;
    for (;;) {
        long long pub = 0;
        bn_pg_counts(c, NULL, &pub);
        double t = bn_now();
        if (pub >= before + n) {
            t_done = t;
            break;
        }
        bool dead = false;
        for (int i = 0; i < k; i++) {
            long h = 0;
            bn_proc_usage(&p[i], &h, NULL, NULL);
            if (h > hwm) hwm = h;
            if (!bn_proc_alive(&p[i])) dead = true;
        }
        if (dead) {
            bn_log("a relay exited early with %lld of %ld published", pub - before, n);
            break;
        }
        if (t - t0 > timeout_s) {
            bn_log("timeout: %lld of %ld published after %.0f s", pub - before, n, t - t0);
            break;
        }
        if (t - last_log > 10) {
            bn_log("  %lld of %ld published", pub - before, n);
            last_log = t;
        }
        usleep(50000);
    }
    double cpu = 0;
    for (int i = 0; i < k; i++) {
        long h = 0;
        double cs = 0;
        bn_proc_usage(&p[i], &h, NULL, &cs);
        if (h > hwm) hwm = h;
        if (cs > 0) cpu += cs;
    }
    double pg_cpu = bn_pg_server_cpu() - pg0;
    for (int i = 0; i < k; i++) bn_proc_stop(&p[i]);
    if (t_done < 0)
        bn_die("%s: the relays did not publish everything (logs in %s)", prefix, logdir);
    PQfinish(c);
    out->rate = (double)n / (t_done - t0);
    out->cpu_s = cpu;
    out->hwm_kib = hwm;
    out->pg_cpu_s = pg_cpu;
}

/* ---- the producer benches' business transaction (bench_producer, bench_producer_instr) ---- */

static void biz_prep(PGconn *c, const char *name, const char *sql) {
    PGresult *r = PQprepare(c, name, sql, 0, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) bn_die("prepare %s: %s", name, PQerrorMessage(c));
    PQclear(r);
}

void bn_biz_tables(PGconn *c) {
    bn_sql(c, "CREATE TABLE bench_customer (id int PRIMARY KEY, balance bigint NOT NULL, orders "
              "int NOT NULL, name text NOT NULL)");
    bn_sql(c, "INSERT INTO bench_customer SELECT i, 1000000, 0, 'customer ' || i FROM "
              "generate_series(1, 100000) i");
    bn_sql(c, "CREATE TABLE bench_order (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
              "customer_id int NOT NULL, total bigint NOT NULL, created_at timestamptz NOT NULL)");
    bn_sql(c, "CREATE TABLE bench_plain_outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY "
              "KEY, event_id text NOT NULL, event_type text NOT NULL, aggregate_type text NOT "
              "NULL, aggregate_id text NOT NULL, tenant text NOT NULL, payload_digest text NOT "
              "NULL, payload bytea NOT NULL, created_at timestamptz NOT NULL)");
    /* A deployed outbox, not an empty one: statistics gathered on empty tables make each
     * producer session's cached plans of obx.enqueue()'s lookups sequential scans until
     * autovacuum analyzes again (a minute of traffic), which an 8-15 s run would measure
     * instead of the steady state (docs/performance.md, scenario 3). Both outboxes get 20,000
     * rows of the same shape first. */
    bn_sql(c, "SELECT count(obx.enqueue('order.created.v1', 'order', 'w-' || i, 1, 'tenant-7', "
              "convert_to(rpad('{\"order\":\"w-' || i || '\",\"total\":1999,\"note\":\"', "
              "510, 'x') || '\"}', 'UTF8'))) FROM generate_series(1, 20000) i");
    bn_sql(c, "INSERT INTO bench_plain_outbox (event_id, event_type, aggregate_type, "
              "aggregate_id, tenant, payload_digest, payload, created_at) SELECT 'evw-' || "
              "lpad(i::text, 26, '0'), 'order.created.v1', 'order', 'w-' || i, 'tenant-7', "
              "'sha256:' || encode(sha256(p), 'hex'), p, now() FROM (SELECT i, "
              "convert_to(rpad('{\"order\":\"w-' || i || '\",\"total\":1999,\"note\":\"', "
              "510, 'x') || '\"}', 'UTF8') AS p FROM generate_series(1, 20000) i) x");
    bn_sql(c, "VACUUM ANALYZE");
}

void bn_biz_prepare(PGconn *c) {
    biz_prep(c, "begin", "BEGIN");
    biz_prep(c, "commit", "COMMIT");
    biz_prep(c, "rollback", "ROLLBACK");
    biz_prep(c, "debit",
             "UPDATE bench_customer SET balance = balance - 1999, orders = orders + 1 "
             "WHERE id = $1");
    biz_prep(c, "order",
             "INSERT INTO bench_order (customer_id, total, created_at) VALUES ($1, 1999, "
             "now()) RETURNING id");
    biz_prep(c, "plain",
             "INSERT INTO bench_plain_outbox (event_id, event_type, aggregate_type, "
             "aggregate_id, tenant, payload_digest, payload, created_at) VALUES ('evt-' "
             "|| lpad($1, 26, '0'), 'order.created.v1', 'order', $2, 'tenant-7', "
             "'sha256:' || encode(sha256($3), 'hex'), $3, now())");
}

int bn_biz_payload(char *buf, size_t cap, const char *oid) {
    int n = snprintf(buf, cap, "{\"order\":\"o-%s\",\"total\":1999,\"note\":\"", oid);
    while (n < 510 && (size_t)n < cap - 3) buf[n++] = 'x';
    n += snprintf(buf + n, cap - (size_t)n, "\"}");
    return n;
}

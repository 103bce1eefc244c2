/*
 * bench.h — what the bench/ programs share (bench_common.c): clocks and medians, PostgreSQL
 * helpers (fresh databases, SQL bulk fills with the real digests, published counts), relay
 * processes (start, RSS and CPU from /proc, stop), pgbench runs, and the raw publishers that
 * measure the brokers' limits (plain librdkafka and rabbitmq-c loops with obx's messages).
 *
 * Not a test: the programs assert only that every event ended PUBLISHED with its receipt.
 * Numbers from one run are comparable with each other only (the machine is shared and noisy);
 * that is why every program measures obx and its limit in the same run.
 */
#ifndef OBX_BENCH_H
#define OBX_BENCH_H

#include "broker/broker.h"
#include "obx_test.h"
#include "store/store.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define BN_PAYLOAD 512 /* bytes per event payload (JSON-ish text) */
/* The key ID the bench's routes seal payloads with (bench_throughput --encrypt); NULL: none. */
extern const char *bn_encrypt_key;
#define BN_MAX_REPS 20
#define BN_TYPE "order.created.v1"
#define BN_TENANT "tenant-7"
#define BN_CLUSTER "bench"

/* ---- clocks, statistics, output ---------------------------------------------------------- */
double bn_now(void);      /* monotonic seconds */
double bn_cpu_self(void); /* this process's CPU seconds */
double bn_median(const double *v, int n);
double bn_loadavg(void); /* 1-minute load average */
void bn_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void bn_log(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* stderr, flushed */

/* ---- PostgreSQL ---------------------------------------------------------------------------- */
const char *bn_pg_base(void); /* $OBX_TEST_PG_URL, or dies */
/* The URL of database `db` on the server of bn_pg_base(). */
void bn_pg_url(const char *db, char *out, size_t cap);
PGconn *bn_pg_connect(const char *url);
void bn_sql(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
long long bn_sql_ll(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double bn_sql_d(PGconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops and creates database `name`, runs obx init on it and sets the bench route (cluster
 * BN_CLUSTER, topic). Its URL goes to url. */
void bn_pg_fresh(const char *name, const char *topic, char *url, size_t cap);
void bn_pg_drop(const char *name);
/* A new empty database `name` (dropped first if it exists); no schema. */
void bn_pg_create(const char *name);
/* The producer benches' business transaction (bench_producer, bench_producer_instr): debit a
 * customer, insert the order, then the outbox write. bn_biz_tables creates its tables on c (an
 * obx database with the BN_TYPE route) and fills each outbox with 20,000 rows of the shape the
 * runs write, then VACUUM ANALYZE; bn_biz_prepare prepares begin, commit, rollback, debit ($1
 * customer), order ($1 customer, returns the order ID) and plain (the plain outbox row: $1
 * order ID, $2 aggregate ID, $3 payload, binary) on c; bn_biz_payload writes the 512-byte
 * payload of order oid into buf (cap >= 600) and returns its length. */
void bn_biz_tables(PGconn *c);
void bn_biz_prepare(PGconn *c);
int bn_biz_payload(char *buf, size_t cap, const char *oid);
/* DROP DATABASE dst (if it exists), CREATE DATABASE dst TEMPLATE src. Database names are
 * logical: each process's databases are <name>_<pid> on the server. */
void bn_pg_copy(const char *dst, const char *src);
/* Bulk-inserts n events of the bench route numbered from first (aggregate o-<i>, routing key
 * tenant-7.order.o-<i>: one order key per event), with the digests obx computes (SQL
 * functions obx.dest_digest/envelope_digest), BN_PAYLOAD-byte payloads, in state `state`
 * ("PENDING", or "PUBLISHED"/"RETAINED" with an attempt, a primary receipt and the audit rows
 * of a publication, published long ago). Then ANALYZE. */
void bn_pg_fill(PGconn *c, long first, long n, const char *state);
/* bn_pg_fill with available_at set (0: the event's time): PENDING events of a delayed backlog,
 * not claimable before available_at (the envelope's own not_before is left 0: such rows are
 * the claim's load, never sent in a bench run). */
void bn_pg_fill_at(PGconn *c, long first, long n, const char *state, long long available_at);
/* Events PUBLISHED (and primary receipts) per the O(1) statistics (obx._stats()). */
void bn_pg_counts(PGconn *c, long long *published, long long *primary);
/* CPU seconds the PostgreSQL server of $OBX_TEST_SERVICES_DIR has used so far: the
 * postmaster, its live children and the children it has reaped (backends, autovacuum, WAL
 * writer). The difference over a run is the database's CPU cost of that run. */
double bn_pg_server_cpu(void);
/* The server's WAL position in bytes (pg_current_wal_lsn): the difference over a run is how
 * much it wrote, a measure of work that load on the machine does not change. */
double bn_pg_wal(void);
/* The server's current WAL position as text (e.g. "0/1A2B3C"), into buf. */
void bn_pg_lsn(char *buf, size_t cap);
/* With OBX_BENCH_WAL_DETAIL set: prints, per relation of database `url`, the WAL records and
 * bytes written between lsn0 and lsn1 divided by `per` (pg_walinspect; the extension is
 * created in that database). Without the variable it does nothing. */
void bn_pg_wal_detail(const char *url, const char *lsn0, const char *lsn1, double per);
/* With OBX_BENCH_WAL_DETAIL set and pg_stat_statements loaded by the server: bn_pg_stmt_reset
 * forgets the statements so far, bn_pg_stmt_detail prints the server's execution time per
 * statement since then divided by `per` (microseconds), largest first. */
void bn_pg_stmt_reset(void);
void bn_pg_stmt_detail(double per);
/* CPU seconds the RabbitMQ node of $OBX_TEST_RABBIT_DIR (its pid file) has used so far; 0 when
 * unknown. */
double bn_rabbit_cpu(void);
/* CPU seconds of this process's waited-for children (pgbench, obx purge ...). */
double bn_children_cpu(void);
/* Waits until `target` events are PUBLISHED or the relay process dies / timeout; returns the
 * time (bn_now) it saw the target, or -1. */
double bn_pg_wait_published(PGconn *c, long long target, pid_t relay, double timeout_s);

/* ---- processes ------------------------------------------------------------------------------ */
typedef struct bn_proc {
    pid_t pid;
    char log[512];
    double started;
} bn_proc;

/* Starts argv[0] (a path) with argv, stdout+stderr to log (appended). */
void bn_spawn(bn_proc *p, const char *log, char *const argv[]);
/* The obx binary the programs run: $OBX_BENCH_OBX (to compare two builds in one run), else the
 * one built with them. */
const char *bn_obx_bin(void);
/* `obx relay --db db --broker broker --set relay.id=ID --set http.listen= ... --set <sets>`. */
void bn_relay_start(bn_proc *p, const char *logdir, const char *id, const char *db,
                    const char *broker, const char *const *sets);
/* Peak RSS (VmHWM, KiB) and CPU seconds (user + system) of a live process. */
void bn_proc_usage(const bn_proc *p, long *hwm_kib, long *rss_kib, double *cpu_s);
/* Nanoseconds the process's threads have spent waiting on a run queue for a CPU, summed
 * (/proc/PID/task/TID/schedstat, second field; threads that have exited are not counted), -1
 * when it cannot be read. The difference over an interval shows whether a slow process was
 * slow itself or waited for a busy machine. */
double bn_proc_runq_ns(const bn_proc *p);
/* The process's minor page faults so far (/proc/PID/stat), -1 when it cannot be read. */
long bn_proc_minflt(const bn_proc *p);
bool bn_proc_alive(const bn_proc *p);
/* SIGTERM, wait up to 20 s, then SIGKILL. Returns the exit status (-1 when killed). */
int bn_proc_stop(bn_proc *p);
/* Runs a command to completion with output to log; returns its exit status. */
int bn_run(const char *log, char *const argv[]);

/* ---- relays on a PostgreSQL backlog ------------------------------------------------------ */
typedef struct bn_relay_run {
    double rate;     /* events/s from the first relay's start to the last event PUBLISHED */
    double cpu_s;    /* CPU seconds of all relays */
    long hwm_kib;    /* the largest relay's peak RSS */
    double pg_cpu_s; /* the database server's CPU seconds over the run */
} bn_relay_run;
/* Starts k relays (ids <prefix>-1..k) on db/broker, waits until `n` more events are PUBLISHED
 * than before, stops them; dies when one exits early or after timeout_s. */
void bn_pg_relays(const char *db, const char *broker, int k, const char *prefix, const char *logdir,
                  const char *const *sets, long n, double timeout_s, bn_relay_run *out);
/* The mock cluster's broker URL for `obx relay` (cluster BN_CLUSTER). */
void bn_kafka_broker_url(const char *boot, char *out, size_t cap);

/* ---- pgbench ------------------------------------------------------------------------------- */
/* Runs pgbench with the script text (written to a temp file) against url; returns the tps
 * pgbench reports (excluding connection time). -t or -T as given in extra (e.g. "-t 250"). */
double bn_pgbench(const char *url, const char *script, int clients, const char *extra,
                  const char *log);

/* The PostgreSQL limit: pgbench, 8 clients, a script that claims the 100 oldest PENDING rows
 * with SKIP LOCKED, reads their routing key and payload and marks them PUBLISHED, in one
 * statement, on a copy (CREATE DATABASE ... TEMPLATE src_db) of n PENDING rows. Returns rows/s;
 * *cpu_us and *wal get the CPU (pgbench + server) and WAL bytes per row. */
double bn_pg_claim_mark_limit(const char *src_db, long n, const char *log, bool keep,
                              double *cpu_us, double *wal);

/* ---- messages and raw publishers (the broker limits) ------------------------------------- */
/* n distinct messages of the bench route shape: envelope, destination (cluster BN_CLUSTER,
 * topic, routing key per order), BN_PAYLOAD-byte payload, attempt ID, partition for `parts`
 * partitions (murmur2). */
typedef struct bn_msgs {
    size_t n;
    obx__envelope *env;
    obx__dest *dest;
    char (*dd)[OBX_DIGEST_LEN + 1];
    char (*att)[OBX_EVENT_ID_LEN + 1];
    unsigned char (*payload)[BN_PAYLOAD];
    obx__msg *m;
} bn_msgs;
void bn_msgs_make(bn_msgs *b, size_t n, const char *topic, int parts);
void bn_msgs_free(bn_msgs *b);
/* A plain librdkafka producer (idempotent, acks=all, like obx's) sending n messages (cycling
 * through pool) with the obx headers to their partitions; waits for every delivery report.
 * Returns messages/s. */
double bn_kafka_raw(const char *bootstraps, const bn_msgs *pool, long n);
/* A plain rabbitmq-c publisher with confirms (window), persistent + mandatory, the obx headers,
 * to exchange; returns messages/s once every confirm is back. */
double bn_amqp_raw(const char *amqp_url, const char *exchange, const bn_msgs *pool, long n,
                   int window);
/* Declares (durable topic exchange, quorum queue bound with '#') or deletes them. */
void bn_amqp_topology(const char *amqp_url, const char *exchange, const char *queue, bool create);

/* For bn_sql on a bench database's connection: every session opened on that database from then
 * on has obx.notify = off (the producers' --notify-off; docs/postgres.md, "NOTIFY"). */
#define NOTIFY_OFF_SQL                                                                             \
    "DO $$BEGIN EXECUTE format('ALTER DATABASE %%I SET obx.notify = off', current_database()); "   \
    "END $$"

#endif /* OBX_BENCH_H */

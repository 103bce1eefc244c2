/*
 * sim.c — the deterministic simulator and the release gate (docs/design.md, "The release gate"):
 * `obx sim`.
 *
 * It runs the production engine code (the real store — SQLite in memory, or PostgreSQL with
 * --db — the real engine step functions, the real inbox) against the simulated broker
 * (src/broker/sim) under a virtual clock, over seeded traces. A trace:
 *   1. a fault phase: a seeded scheduler interleaves actors one step at a time — a producer
 *      (business transactions with their envelopes, retrying commands with the same
 *      idempotency key after it crashes), two dispatchers, a reconciler, a purger, one or two
 *      consumers with the inbox — and injects the fault classes (docs/design.md, "The release
 *      gate") between any two steps in the actors (crashes: an actor loses its memory; pauses
 *      past a lease), in the broker and the network (lost,
 *      late, timed-out, duplicated and mangled ACKs, lost requests, rejections, unqueryable
 *      target, duplicated and reordered deliveries, lost consumer commits) and in the store
 *      (acceptance rolled back), plus a route policy revision;
 *   2. a liveness phase: faults stop, every actor runs until the system is quiescent;
 *   3. the checkers: lost events, second logical event IDs, cross-destination retries, digest
 *      divergence, duplicate consumer effects, sends under a stale claim, late valid ACKs
 *      converged to the publish slot or the duplicate log, UNKNOWNs traceable by attempt, and
 *      UNKNOWN resolution times.
 *
 * Timings (docs/design.md, "The release gate"): every trace runs on the relay's shipped defaults
 * (leases, recheck back-off, backoff, sweep and reconcile intervals: obx_config_new()) and on
 * the timings of one adapter drawn per trace as production would have it — Kafka (authoritative
 * lookup, UNKNOWN after message.timeout.ms, quiet time message.timeout.ms + request.timeout.ms),
 * RabbitMQ without and with an audit stream (no lookup / best effort, confirm timeout, quiet
 * time confirm timeout + 2 heartbeats) or the local log — with the route's UNKNOWN policy drawn
 * too (retry, the default, or hold). An on-call operator is an actor: held UNKNOWNs older than
 * their reaction time are resolved with `obx resolve` (evidence found at the broker, or a
 * same-target retry). Virtual time jumps to the next due lease, check or network event when
 * nothing else is due, so a trace covers hours of production time in a few milliseconds.
 *
 * Determinism: trace i is a pure function of (seed, i): its own RNG, virtual clock, seeded IDs.
 * Each worker thread owns a world (databases, a simulated cluster) and runs a trace inside
 * outer transactions that are rolled back afterwards, so traces do not see each other: on
 * PostgreSQL each worker has its own connection, every engine transaction is a savepoint of
 * the trace's transaction, and the checkers read the outbox through the same connection.
 * The trace hash combines per-trace digests in trace order, so --jobs does not change it.
 */
#include "broker/sim/sim.h"
#include "drivers/drivers.h"

#include <jansson.h>
#ifdef OBX_WITH_POSTGRES
#include <libpq-fe.h>
#else
#include "pq_off.h" /* OBX_WITH_POSTGRES=OFF: a PostgreSQL URL fails to connect */
#endif
#include <openssl/evp.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

obx_err obx__inbox_process_at(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                              void *conn, int64_t now, int64_t mono_us_start,
                              int64_t (*mono_us)(void), obx_inbox_result *out);

/* ---- fault classes --------------------------------------------------------------------------- */

#define FAULT_LIST(X)                                                                              \
    X(KILL_BEFORE_COMMIT, "kill-before-commit")                                                    \
    X(KILL_AFTER_COMMIT, "kill-after-commit")                                                      \
    X(CLAIM_EXPIRY_LATE_ACK, "claim-expiry-late-ack")                                              \
    X(UNKNOWN_RACING_RETRY, "unknown-racing-retry-claim")                                          \
    X(BOTH_ATTEMPTS_ACKED, "both-attempts-acked")                                                  \
    X(TARGET_UNQUERYABLE, "target-unqueryable")                                                    \
    X(ROUTE_REVISION, "route-policy-revision")                                                     \
    X(ACCEPTANCE_ROLLBACK, "acceptance-rollback")                                                  \
    X(DUPLICATED_DELIVERY, "duplicated-delivery")                                                  \
    X(REORDERED_DELIVERY, "reordered-delivery")                                                    \
    X(CONSUMER_COMMIT_LOST_ACK, "consumer-commit-lost-ack")                                        \
    X(ACTOR_CRASH, "actor-crash")                                                                  \
    X(PAUSE_PAST_LEASE, "pause-past-lease")                                                        \
    X(LOST_ACK, "lost-ack")                                                                        \
    X(TIMED_OUT_ACK, "timed-out-ack")                                                              \
    X(DELAYED_ACK, "delayed-ack")                                                                  \
    X(DUPLICATE_APPEND, "duplicate-append")                                                        \
    X(LOST_REQUEST, "lost-request")                                                                \
    X(REJECTION, "rejection")                                                                      \
    X(MANGLED_RECEIPT, "mangled-receipt")                                                          \
    X(HANDLER_FAILURE, "handler-failure")                                                          \
    X(PREMATURE_PURGE, "premature-purge-attempt")                                                  \
    X(MIGRATION_UNQUERYABLE, "old-target-unqueryable-during-migration")

enum {
#define F(n, s) F_##n,
    FAULT_LIST(F)
#undef F
        F_COUNT
};

static const char *const fault_names[F_COUNT] = {
#define F(n, s) s,
    FAULT_LIST(F)
#undef F
};

/* ---- results ----------------------------------------------------------------------------------
 */

typedef struct results {
    long traces;
    long lost_events, second_event_ids, cross_destination_retries, digest_divergence,
        consumer_duplicate_effects, stale_claim_sends, late_ack_total, late_ack_converged,
        unknown_total, unknown_untraceable, internal_errors, liveness_failures, quarantined,
        premature_purges, purged, migrated, migration_refused, migrated_with_old_copy,
        unknown_unresolved, held, op_retries, op_accepts, racing_observed, both_acked_observed;
    long adapter_traces[4], hold_traces;
    long fired[F_COUNT];
    long failing[16];
    long nfailing;
    char first_failure[512];
} results;

static void results_add(results *a, const results *b) {
    a->traces += b->traces;
#define ADD(f) a->f += b->f
    ADD(lost_events);
    ADD(second_event_ids);
    ADD(cross_destination_retries);
    ADD(digest_divergence);
    ADD(consumer_duplicate_effects);
    ADD(stale_claim_sends);
    ADD(late_ack_total);
    ADD(late_ack_converged);
    ADD(unknown_total);
    ADD(unknown_untraceable);
    ADD(internal_errors);
    ADD(liveness_failures);
    ADD(quarantined);
    ADD(premature_purges);
    ADD(purged);
    ADD(migrated);
    ADD(migration_refused);
    ADD(migrated_with_old_copy);
    ADD(unknown_unresolved);
    ADD(held);
    ADD(op_retries);
    ADD(op_accepts);
    ADD(racing_observed);
    ADD(both_acked_observed);
    ADD(hold_traces);
    for (int i = 0; i < 4; i++) ADD(adapter_traces[i]);
#undef ADD
    for (int i = 0; i < F_COUNT; i++) a->fired[i] += b->fired[i];
}

/* ---- actors ------------------------------------------------------------------------------------
 */

enum { A_PRODUCER, A_DISPATCHER, A_RECONCILER, A_CONSUMER, A_PURGER, A_MIGRATOR, A_OPERATOR };

/* The adapters a trace may run on, with their shipped timings (docs/kafka.md, docs/amqp.md). */
typedef struct adapter {
    const char *name;
    obx__sim_lookup lookup;
    int64_t ack_timeout_ms; /* when the backend reports UNKNOWN for an ACK that never came */
    int64_t quiet_ms;       /* its quiet time */
} adapter;

static const adapter adapters[4] = {
    /* message.timeout.ms 300 s; quiet = that + request.timeout.ms 30 s */
    {"kafka", OBX__SIM_LOOKUP_AUTHORITATIVE, 300000, 330000},
    /* confirm_timeout_ms 30 s; quiet = that + 2 x heartbeat 30 s */
    {"amqp", OBX__SIM_LOOKUP_NONE, 30000, 90000},
    {"amqp-stream", OBX__SIM_LOOKUP_BEST_EFFORT, 30000, 90000},
    /* the local log broker: a synchronous append, no late write after the deadline */
    {"log", OBX__SIM_LOOKUP_AUTHORITATIVE, 1000, 0},
};

/* An on-call operator reacts to a held UNKNOWN (alert, look, `obx resolve`) after this long
 * (drawn per trace), and looks again every OP_POLL_MS. */
#define OP_REACT_MIN_MS 120000
#define OP_REACT_MAX_MS 600000
#define OP_POLL_MS 60000
/* The resolution time an unresolved UNKNOWN counts with (a thousand years). */
#define UNRESOLVED_MS (INT64_C(1000) * 365 * 86400000)

#define MAX_DL 16

typedef struct actor {
    int kind, index, incarnation;
    char owner[48];
    obx__engine e;
    obx__broker *b;
    int64_t paused_until;
    obx__rows held;
    size_t held_pos;
    /* producer */
    int next_cmd, retry_cmd;
    obx__ulid_gen gen;
    /* consumer */
    /* purger: retention with the trace's consumers as critical consumers; reconciler: the
     * same consumers as evidence (traces with evidence on) */
    obx__critical crit[2];
    obx__retention_cfg rcfg;
    obx__purge_cursor cur;
    /* consumer (the delivery slots stay last: actor setup zeroes what comes before) */
    obx__delivery dl[MAX_DL];
    size_t ndl, posdl;
    bool to_ack[MAX_DL];
} actor;

#define MAX_ACTORS 9
#define MAX_EVENTS 8

typedef struct wk {
    int id;
    const obx_sim_options *o;
    char wname[48], wurl[64];
    obx__sim_world *w;
    sqlite3 *odb;            /* the outbox: SQLite in memory ... */
    PGconn *opg;             /* ... or PostgreSQL (--db) */
    sqlite3_stmt *oq_st[32]; /* outbox queries (SQLite); PostgreSQL: prepared by name */
    bool oq_pg_ready[32];
    obx_store *os;
    sqlite3 *cdb[2];
    obx_store *cs[2];
    obx_inbox *in[2];
    sqlite3_stmt *st_effect[2], *st_inbox_at[2];
    sqlite3_stmt *st_tx[3][2]; /* BEGIN, ROLLBACK on the outbox and each consumer database */
    /* the trace */
    long idx;
    uint64_t rng;
    int64_t now;
    uint64_t hash;
    bool verbose;
    actor a[MAX_ACTORS];
    int na, nconsumers;
    int n_events;
    char orders[MAX_EVENTS][32];
    char event_ids[MAX_EVENTS][2][OBX_EVENT_ID_LEN + 1]; /* what the producer was told */
    int n_ids[MAX_EVENTS];
    double p[F_COUNT]; /* fault probabilities of this trace */
    /* timings: the relay's shipped defaults (obx_config_new), the trace's adapter, the
     * route's UNKNOWN policy, whether the reconciler consults the consumers, the operator */
    obx__engine_cfg base;
    int64_t sweep_ms, reconcile_ms;
    const adapter *ad;
    bool hold, evidence;
    int64_t op_react_ms, op_next_at;
    int64_t replay_window_ms; /* retention of this trace (purger actor) */
    char tenant[24];          /* per trace: concurrent traces on one PostgreSQL never share a key */
    size_t purge_batch;
    bool revised; /* the route policy was revised in this trace (a migration target) */
    bool faults_on;
    bool handler_fail_next;
    results r;
    char failure[512];
    int64_t *res_ms;
    size_t nres, capres;
} wk;

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rnd(wk *k) {
    k->rng = mix(k->rng);
    return k->rng;
}

static bool chance(wk *k, double p) {
    return p > 0 && (double)(rnd(k) >> 11) / (double)(1ull << 53) < p;
}

static void h_add(wk *k, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        k->hash ^= (v >> (i * 8)) & 0xff;
        k->hash *= 0x100000001b3ull;
    }
}

static void h_str(wk *k, const char *s) {
    for (; *s; s++) {
        k->hash ^= (unsigned char)*s;
        k->hash *= 0x100000001b3ull;
    }
}

static void logv(wk *k, const char *fmt, ...) OBX__PRINTF(2, 3);
static void logv(wk *k, const char *fmt, ...) {
    if (!k->verbose) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  t=%-8lld ", (long long)(k->now - 1700000000000LL));
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void fail(wk *k, const char *fmt, ...) OBX__PRINTF(2, 3);
static void fail(wk *k, const char *fmt, ...) {
    if (k->failure[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->failure, sizeof k->failure, fmt, ap);
    va_end(ap);
    logv(k, "VIOLATION: %s", k->failure);
}

/* Cached one-integer query (the checker's statements are prepared once per worker). */
typedef struct qc {
    const char *sql;
    sqlite3_stmt *st;
} qc;

/* Cached statements of this worker thread, finalized when the worker ends (the connections
 * cannot close while statements are open). */
static _Thread_local qc *cached[32];
static _Thread_local int ncached;

static void qcached_free(void) {
    for (int i = 0; i < ncached; i++) {
        sqlite3_finalize(cached[i]->st);
        cached[i]->st = NULL;
    }
    ncached = 0;
}

static long qcached(sqlite3 *db, qc *q) {
    if (!q->st) {
        if (sqlite3_prepare_v3(db, q->sql, -1, SQLITE_PREPARE_PERSISTENT, &q->st, NULL)) return -1;
        if (ncached < 32) cached[ncached++] = q;
    }
    long v = -1;
    if (sqlite3_step(q->st) == SQLITE_ROW) v = (long)sqlite3_column_int64(q->st, 0);
    sqlite3_reset(q->st);
    return v;
}

/* ---- worker setup ---------------------------------------------------------------------------- */

static obx_err effect_handler(void *user, void *conn, const obx_message *m, const char *key,
                              char *res, size_t cap);

static obx_err open_mem(sqlite3 **db, obx_store **s) {
    if (sqlite3_open_v2(":memory:", db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK)
        return obx__fail(OBX_ESTORE, "sim: cannot open an in-memory database");
    /* a trace's databases hold a few dozen rows: small pages mean less to journal for every
     * page a trace touches (measured: ~5% fewer instructions than 4096) */
    sqlite3_exec(*db, "PRAGMA page_size=1024; PRAGMA synchronous=OFF", NULL, NULL, NULL);
    obx_err e = obx_store_wrap_sqlite(*db, s);
    if (!e) e = obx_store_init(*s);
    return e;
}

/* ---- the outbox, as the checkers and the business service see it ---------------------------
 * The same SQL runs on SQLite and PostgreSQL ($n placeholders bind by position in both; the
 * PostgreSQL connection's search_path is obx, public). sim_orders is the business table: a
 * temporary table, so nothing of it outlives the worker's connection. */
enum {
    OQ_ORDER,
    OQ_RECEIPT_FOR,
    OQ_ENV_OF,
    OQ_ATT_PART,
    OQ_PURGED,
    OQ_BEFORE,
    OQ_UNPUBLISHED,
    OQ_EVENTS,
    OQ_ORPHANS,
    OQ_REFERENCED,
    OQ_DIVERGENT,
    OQ_MULTI_PRIMARY,
    OQ_STALE,
    OQ_UNKNOWN_TOTAL,
    OQ_UNTRACEABLE,
    OQ_RACING,
    OQ_BOTH_ACKED,
    OQ_QUARANTINED,
    OQ_STUCK,
    OQ_MIGRATIONS,
    OQ_NEXT_DUE,
    OQ_UNRESOLVED,
    OQ_HELD_EVER,
    OQ_COUNT
};

static const char *const oq_sql[OQ_COUNT] = {
    [OQ_ORDER] = "INSERT INTO sim_orders VALUES ($1, $2) ON CONFLICT DO NOTHING",
    [OQ_RECEIPT_FOR] = "SELECT count(*) FROM obx_receipt WHERE attempt_id = $1 AND "
                       "(kind = 'PRIMARY' OR kind = 'DUPLICATE')",
    [OQ_ENV_OF] = "SELECT dest_topic, dest_digest FROM obx_envelope WHERE event_id = $1 AND "
                  "envelope_gen = $2",
    [OQ_ATT_PART] = "SELECT partition FROM obx_attempt WHERE attempt_id = $1",
    /* each purge: the event, its publication place, and when it was purged */
    [OQ_PURGED] = "SELECT e.event_id, e.published_at, e.seq, (SELECT max(a.at) FROM obx_audit a "
                  "WHERE a.event_id = e.event_id AND a.to_state = 'PURGED') FROM obx_event e "
                  "WHERE e.state = 'PURGED' ORDER BY e.seq",
    /* every published event at or before a place in publication order */
    [OQ_BEFORE] = "SELECT event_id FROM obx_event WHERE published_at > 0 AND (published_at < $1 "
                  "OR (published_at = $1 AND seq <= $2)) ORDER BY seq",
    [OQ_UNPUBLISHED] = "SELECT count(*) FROM obx_event WHERE state <> 'PUBLISHED' AND state <> "
                       "'RETAINED' AND state <> 'PURGED'",
    [OQ_EVENTS] = "SELECT count(*) FROM obx_event",
    [OQ_ORPHANS] = "SELECT count(*) FROM sim_orders o WHERE NOT EXISTS (SELECT 1 FROM obx_event e "
                   "WHERE e.event_id = o.event_id)",
    [OQ_REFERENCED] = "SELECT count(*) FROM obx_event e WHERE EXISTS (SELECT 1 FROM sim_orders o "
                      "WHERE o.event_id = e.event_id)",
    [OQ_DIVERGENT] = "SELECT count(*) FROM obx_receipt r JOIN obx_envelope v ON v.event_id = "
                     "r.event_id AND v.envelope_gen = r.envelope_gen WHERE r.kind = 'PRIMARY' AND "
                     "(r.payload_digest <> v.payload_digest OR r.dest_digest <> v.dest_digest)",
    [OQ_MULTI_PRIMARY] = "SELECT count(*) FROM (SELECT 1 FROM obx_receipt WHERE kind = 'PRIMARY' "
                         "GROUP BY event_id, envelope_gen HAVING count(*) > 1) x",
    [OQ_STALE] = "SELECT count(*) FROM obx_attempt t WHERE NOT EXISTS (SELECT 1 FROM obx_audit a "
                 "WHERE a.event_id = t.event_id AND a.claim_gen = t.claim_gen AND a.who = t.owner "
                 "AND (a.to_state = 'CLAIMED' OR a.to_state = 'RECONCILING' OR a.to_state = "
                 "'RETRY_CLAIMED'))",
    [OQ_UNKNOWN_TOTAL] = "SELECT count(*) FROM obx_attempt WHERE unknown_at > 0",
    [OQ_UNTRACEABLE] = "SELECT count(*) FROM obx_audit a WHERE a.to_state = 'DISPATCH_UNKNOWN' AND "
                       "NOT EXISTS (SELECT 1 FROM obx_attempt t WHERE t.attempt_id = a.attempt_id "
                       "AND t.event_id = a.event_id AND t.unknown_at > 0)",
    [OQ_RACING] = "SELECT count(*) FROM obx_audit WHERE (from_state = 'RETRY_CLAIMED' AND to_state "
                  "= 'PUBLISHED') OR (actor = 'reconciler' AND reason LIKE 'stale claim refused%')",
    [OQ_BOTH_ACKED] = "SELECT count(*) FROM obx_receipt r JOIN obx_event e ON e.event_id = "
                      "r.event_id WHERE r.kind = 'DUPLICATE' AND r.attempt_id <> "
                      "e.primary_attempt_id",
    [OQ_QUARANTINED] = "SELECT count(*) FROM obx_receipt WHERE kind = 'QUARANTINED'",
    [OQ_STUCK] = "SELECT event_id, state, claim_gen, owner, lease_until, next_check_at FROM "
                 "obx_event ORDER BY seq",
    /* every move: the event and the generation it left */
    [OQ_MIGRATIONS] = "SELECT event_id, envelope_gen - 1 FROM obx_receipt WHERE kind = "
                      "'MIGRATION' ORDER BY receipt_id",
    /* the liveness phase's clock: the earliest lease end, check or backoff end of an
     * unpublished event, and when the earliest held event is old enough for the operator */
    [OQ_NEXT_DUE] = "SELECT (SELECT min(t) FROM (SELECT lease_until AS t FROM obx_event WHERE "
                    "state IN ('CLAIMED', 'SENDING', 'RECONCILING', 'RETRY_CLAIMED') UNION ALL "
                    "SELECT next_check_at FROM obx_event WHERE state = 'DISPATCH_UNKNOWN' UNION "
                    "ALL SELECT available_at FROM obx_event WHERE state = 'PENDING') x), "
                    "(SELECT min(held_at) + $1 FROM obx_event WHERE held_at > 0)",
    /* UNKNOWN episodes that never ended: the event was UNKNOWN and is not published */
    [OQ_UNRESOLVED] = "SELECT count(*) FROM obx_event WHERE unknown_since > 0 AND state <> "
                      "'PUBLISHED' AND state <> 'RETAINED' AND state <> 'PURGED'",
    /* events the reconciler ever held for an operator */
    [OQ_HELD_EVER] = "SELECT count(DISTINCT event_id) FROM obx_audit WHERE actor = 'reconciler' "
                     "AND (reason LIKE 'held for an operator%' OR reason LIKE 'cannot tell past "
                     "the quiet time; the route''s UNKNOWN policy is hold%')",
};

typedef struct oparam {
    const char *s; /* text, or NULL: the integer i */
    int64_t i;
} oparam;

#define OP_S(x) ((oparam){.s = (x)})
#define OP_I(x) ((oparam){.i = (x)})

/* A result being read: rows of a SQLite statement or of a PostgreSQL result. */
typedef struct ocur {
    sqlite3_stmt *st;
    PGresult *res;
    int row, nrows;
    bool ok;
} ocur;

static bool oq_run(wk *k, int q, const oparam *p, int n, ocur *c) {
    memset(c, 0, sizeof *c);
    c->row = -1;
    if (k->opg) {
        char name[16];
        snprintf(name, sizeof name, "obx_sim_%d", q);
        if (!k->oq_pg_ready[q]) {
            PGresult *r = PQprepare(k->opg, name, oq_sql[q], 0, NULL);
            bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
            if (!ok) fail(k, "sim: prepare: %s", PQerrorMessage(k->opg));
            PQclear(r);
            if (!ok) return false;
            k->oq_pg_ready[q] = true;
        }
        char nums[8][24];
        const char *vals[8];
        for (int i = 0; i < n && i < 8; i++) {
            if (p[i].s)
                vals[i] = p[i].s;
            else {
                snprintf(nums[i], sizeof nums[i], "%lld", (long long)p[i].i);
                vals[i] = nums[i];
            }
        }
        c->res = PQexecPrepared(k->opg, name, n, vals, NULL, NULL, 0);
        ExecStatusType t = PQresultStatus(c->res);
        c->ok = t == PGRES_TUPLES_OK || t == PGRES_COMMAND_OK;
        if (!c->ok) fail(k, "sim: query %d: %s", q, PQerrorMessage(k->opg));
        c->nrows = c->ok ? PQntuples(c->res) : 0;
        return c->ok;
    }
    if (!k->oq_st[q] &&
        sqlite3_prepare_v3(k->odb, oq_sql[q], -1, SQLITE_PREPARE_PERSISTENT, &k->oq_st[q], NULL)) {
        fail(k, "sim: prepare: %s", sqlite3_errmsg(k->odb));
        return false;
    }
    c->st = k->oq_st[q];
    sqlite3_reset(c->st);
    for (int i = 0; i < n; i++) {
        if (p[i].s)
            sqlite3_bind_text(c->st, i + 1, p[i].s, -1, SQLITE_TRANSIENT);
        else
            sqlite3_bind_int64(c->st, i + 1, p[i].i);
    }
    c->ok = true;
    return true;
}

static bool oq_next(wk *k, ocur *c) {
    if (!c->ok) return false;
    if (c->res) return ++c->row < c->nrows;
    int rc = sqlite3_step(c->st);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) {
        fail(k, "sim: step: %s", sqlite3_errmsg(k->odb));
        c->ok = false;
    }
    return false;
}

static bool oq_null(const ocur *c, int col) {
    return c->res ? PQgetisnull(c->res, c->row, col)
                  : sqlite3_column_type(c->st, col) == SQLITE_NULL;
}

static const char *oq_text(const ocur *c, int col) {
    const char *v =
        c->res ? PQgetvalue(c->res, c->row, col) : (const char *)sqlite3_column_text(c->st, col);
    return v ? v : "";
}

static int64_t oq_int(const ocur *c, int col) {
    return c->res ? strtoll(PQgetvalue(c->res, c->row, col), NULL, 10)
                  : sqlite3_column_int64(c->st, col);
}

static void oq_close(ocur *c) {
    if (c->res) PQclear(c->res);
    if (c->st) sqlite3_reset(c->st);
    memset(c, 0, sizeof *c);
}

/* The first column of the first row as an integer; -1 when the query failed or had no row. */
static long oq_long(wk *k, int q, const oparam *p, int n) {
    ocur c;
    long v = -1;
    if (oq_run(k, q, p, n, &c) && oq_next(k, &c)) v = (long)oq_int(&c, 0);
    oq_close(&c);
    return v;
}

/* A statement with no result rows (the business insert); false on failure. */
static bool oq_exec(wk *k, int q, const oparam *p, int n) {
    ocur c;
    bool ok = oq_run(k, q, p, n, &c);
    if (ok) oq_next(k, &c);
    ok = ok && c.ok;
    oq_close(&c);
    return ok;
}

/* BEGIN (which = 0) or ROLLBACK (1) of a trace's outer transaction on SQLite database db_i (0:
 * the outbox, 1 and 2: the consumers), prepared once per worker: parsing them twice per trace
 * and database cost about 1.5% of a trace. */
static int sq_tx(wk *k, int db_i, int which) {
    sqlite3 *db = db_i ? k->cdb[db_i - 1] : k->odb;
    sqlite3_stmt **st = &k->st_tx[db_i][which];
    if (!*st && sqlite3_prepare_v3(db, which ? "ROLLBACK" : "BEGIN", -1, SQLITE_PREPARE_PERSISTENT,
                                   st, NULL) != SQLITE_OK)
        return sqlite3_errcode(db);
    int rc = sqlite3_step(*st);
    sqlite3_reset(*st);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* BEGIN / ROLLBACK of the trace's outer transaction on the outbox connection. */
static void o_simple(wk *k, const char *sql) {
    if (k->opg) {
        PGresult *r = PQexec(k->opg, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            fail(k, "sim: %s: %s", sql, PQerrorMessage(k->opg));
        PQclear(r);
    } else if (sq_tx(k, 0, strcmp(sql, "BEGIN") != 0) != SQLITE_OK)
        fail(k, "sim: %s: %s", sql, sqlite3_errmsg(k->odb));
}

static obx_err open_pg(wk *k, const char *url) {
    k->opg = PQconnectdb(url);
    if (PQstatus(k->opg) != CONNECTION_OK)
        return obx__fail(OBX_ESTORE, "sim: postgres: %s", PQerrorMessage(k->opg));
    const char *setup[] = {"SET search_path = obx, public", "SET client_min_messages = warning",
                           ("CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id "
                            "TEXT NOT NULL)")};
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++) {
        PGresult *r = PQexec(k->opg, setup[i]);
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) return obx__fail(OBX_ESTORE, "sim: postgres: %s", PQerrorMessage(k->opg));
    }
    return obx_store_wrap_pg(k->opg, &k->os);
}

/* The relay's shipped defaults: what `obx relay` runs with when nobody configured anything. */
static obx_err shipped_timings(wk *k) {
    obx_config *c = NULL;
    obx_err e = obx_config_new(&c);
    if (e) return e;
    obx__engine_cfg_defaults(&k->base);
    k->base.lease_ms = c->lease_ms;
    k->base.reconcile_lease_ms = c->reconcile_lease_ms;
    k->base.recheck_ms = c->recheck_ms;
    k->base.recheck_max_ms = c->recheck_max_ms;
    k->base.backoff_base_ms = c->backoff_base_ms;
    k->base.backoff_max_ms = c->backoff_max_ms;
    k->base.batch = (size_t)c->batch;
    k->sweep_ms = c->sweep_ms;
    k->reconcile_ms = c->reconcile_ms;
    obx_config_free(c);
    return OBX_OK;
}

static obx_err wk_init(wk *k, int id, const obx_sim_options *o) {
    memset(k, 0, sizeof *k);
    k->id = id;
    k->o = o;
    obx_err se = shipped_timings(k);
    if (se) return se;
    snprintf(k->wname, sizeof k->wname, "simworld-%p-%d", (void *)k, id);
    snprintf(k->wurl, sizeof k->wurl, "sim:%s", k->wname);
    obx_err e = obx__sim_world_new(k->wname, &k->w);
    if (e) return e;
    if (o->db_url) {
        if ((e = open_pg(k, o->db_url))) return e;
    } else {
        if ((e = open_mem(&k->odb, &k->os))) return e;
        if (sqlite3_exec(k->odb,
                         "CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id TEXT "
                         "NOT NULL)",
                         NULL, NULL, NULL) != SQLITE_OK)
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->odb));
    }
    for (int i = 0; i < 2; i++) {
        if ((e = open_mem(&k->cdb[i], &k->cs[i]))) return e;
        if (sqlite3_exec(k->cdb[i], "CREATE TABLE sim_effects (event_id TEXT NOT NULL)", NULL, NULL,
                         NULL) != SQLITE_OK)
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->cdb[i]));
        char cid[16];
        snprintf(cid, sizeof cid, "consumer-%d", i);
        obx_inbox_options io = {.consumer_id = cid, .max_failures = 100};
        if ((e = obx_inbox_open(k->cs[i], &io, &k->in[i]))) return e;
        if (sqlite3_prepare_v3(k->cdb[i],
                               "SELECT min(consumed_at) FROM obx_inbox WHERE consumer_id = ? AND "
                               "event_id = ?",
                               -1, SQLITE_PREPARE_PERSISTENT, &k->st_inbox_at[i], NULL))
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->cdb[i]));
    }
    return OBX_OK;
}

static void wk_free(wk *k) {
    qcached_free();
    for (int i = 0; i < OQ_COUNT; i++) sqlite3_finalize(k->oq_st[i]);
    for (int i = 0; i < 2; i++) sqlite3_finalize(k->st_effect[i]);
    for (int i = 0; i < 2; i++) sqlite3_finalize(k->st_inbox_at[i]);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) sqlite3_finalize(k->st_tx[i][j]);
    for (int i = 0; i < 2; i++) {
        obx_inbox_close(k->in[i]);
        obx_store_close(k->cs[i]);
        sqlite3_close(k->cdb[i]);
    }
    obx_store_close(k->os);
    if (k->odb) sqlite3_close(k->odb);
    if (k->opg) PQfinish(k->opg);
    obx__sim_world_free(k->w);
    free(k->res_ms);
}

/* ---- actor lifecycle ------------------------------------------------------------------------- */

static obx_err actor_start(wk *k, actor *a) {
    a->incarnation++;
    snprintf(a->owner, sizeof a->owner, "%s%d.i%d",
             a->kind == A_PRODUCER     ? "p"
             : a->kind == A_DISPATCHER ? "d"
             : a->kind == A_RECONCILER ? "r"
             : a->kind == A_PURGER     ? "g"
             : a->kind == A_MIGRATOR   ? "m"
             : a->kind == A_OPERATOR   ? "o"
                                       : "c",
             a->index, a->incarnation);
    obx_err e = OBX_OK;
    if (a->kind != A_PRODUCER && a->kind != A_PURGER && a->kind != A_OPERATOR)
        e = obx__br_open(k->wurl, NULL, 0, &a->b);
    if (e) return e;
    if (a->kind == A_DISPATCHER || a->kind == A_RECONCILER || a->kind == A_MIGRATOR ||
        a->kind == A_OPERATOR) {
        obx__engine_cfg c = k->base; /* the shipped timings */
        obx__strlcpy(c.owner, a->owner, sizeof c.owner);
        c.seed = rnd(k) | 1;
        if (a->kind == A_RECONCILER && k->evidence) {
            for (int i = 0; i < k->nconsumers; i++) {
                memset(&a->crit[i], 0, sizeof a->crit[i]);
                snprintf(a->crit[i].id, sizeof a->crit[i].id, "consumer-%d", i);
                a->crit[i].s = k->cs[i];
            }
            c.evidence = a->crit;
            c.n_evidence = (size_t)k->nconsumers;
        }
        e = obx__engine_init(&a->e, k->os, a->b, &c);
    } else if (a->kind == A_CONSUMER) {
        char group[16];
        snprintf(group, sizeof group, "group-%d", a->index);
        const char *topics[] = {"orders", "orders-v2"}; /* v2: after a route revision */
        e = obx__br_consume_open(a->b, group, topics, 2);
    } else if (a->kind == A_PURGER) {
        /* every consumer of the trace is critical: an event is purged only with evidence from
         * each (its inbox receipt), behind the forced consumer watermark, after the window */
        for (int i = 0; i < k->nconsumers && !e; i++) {
            memset(&a->crit[i], 0, sizeof a->crit[i]);
            snprintf(a->crit[i].id, sizeof a->crit[i].id, "consumer-%d", i);
            a->crit[i].s = k->cs[i];
            e = obx__critical_load(&a->crit[i]);
        }
        a->rcfg = (obx__retention_cfg){.consumers = a->crit,
                                       .n_consumers = (size_t)k->nconsumers,
                                       .replay_window_ms = k->replay_window_ms,
                                       .batch = k->purge_batch,
                                       .who = a->owner,
                                       .max_listed = 0};
        obx__purge_cursor_init(&a->cur);
    } else {
        memset(&a->gen, 0, sizeof a->gen);
        a->gen.seed = rnd(k) | 1;
    }
    return e;
}

/* The actor loses its memory: held claims, unacknowledged deliveries, its broker session (and
 * every outcome on its way to it). What it committed stays; what it was doing rolls back. */
static void actor_crash(wk *k, actor *a) {
    obx__rows_free(&a->held);
    a->held_pos = 0;
    for (size_t i = 0; i < a->ndl; i++) obx__delivery_free(&a->dl[i]);
    a->ndl = a->posdl = 0;
    obx__br_close(a->b);
    a->b = NULL;
    if (actor_start(k, a)) {
        k->r.internal_errors++;
        fail(k, "actor %s could not restart: %s", a->owner, obx_errmsg());
    }
}

static void actor_stop(actor *a) {
    obx__rows_free(&a->held);
    for (size_t i = 0; i < a->ndl; i++) obx__delivery_free(&a->dl[i]);
    a->ndl = 0;
    obx__br_close(a->b);
    a->b = NULL;
}

/* An engine error is expected only where a fault was injected; anything else is a defect. */
static void check_err(wk *k, actor *a, obx_err e, const char *what) {
    if (!e) return;
    k->r.internal_errors++;
    fail(k, "%s: %s failed: %s: %s", a->owner, what, obx_errname(e), obx_errmsg());
}

/* ---- steps --------------------------------------------------------------------------------- */

static void producer_step(wk *k, actor *a) {
    int c = a->retry_cmd >= 0 ? a->retry_cmd : a->next_cmd;
    if (c >= k->n_events) return;
    bool kill_before = k->faults_on && chance(k, k->p[F_KILL_BEFORE_COMMIT]);
    bool kill_after = !kill_before && k->faults_on && chance(k, k->p[F_KILL_AFTER_COMMIT]);
    char payload[96];
    snprintf(payload, sizeof payload, "{\"order\":\"%s\",\"total\":%d}", k->orders[c], 100 + c);
    char agg[16];
    snprintf(agg, sizeof agg, "o-%d", c % (1 + (int)(k->idx % 3))); /* shared keys: order rule */
    /* the business transaction's ID, named here (not minted by SQLite's store or read from
     * PostgreSQL's txid_current): the same trace is then the same on both stores */
    char txid[48];
    snprintf(txid, sizeof txid, "sim-%ld-%d-%s", k->idx, c, a->owner);
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = agg,
                    .aggregate_version = c,
                    .tenant = k->tenant,
                    .txid = txid,
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .idempotency_key = k->orders[c],
                    .correlation_id = k->orders[c]};
    obx_enqueue_result res;
    obx_err e = obx__st_begin(k->os);
    if (!e) e = obx__enqueue_at(k->os, &ev, k->now, &a->gen, &res);
    if (!e) { /* the business row, in the same transaction (idempotent: a retried command) */
        oparam op[] = {OP_S(k->orders[c]), OP_S(res.event_id)};
        if (!oq_exec(k, OQ_ORDER, op, 2)) e = OBX_ESTORE;
    }
    if (e || kill_before) {
        obx__st_rollback(k->os);
        if (e) check_err(k, a, e, "enqueue");
        if (kill_before) {
            k->r.fired[F_KILL_BEFORE_COMMIT]++;
            logv(k, "%s: killed before committing %s", a->owner, k->orders[c]);
        }
        a->retry_cmd = c; /* the client retries the command */
        actor_crash(k, a);
        return;
    }
    if ((e = obx__st_commit(k->os))) {
        check_err(k, a, e, "commit");
        return;
    }
    logv(k, "%s: committed %s -> %s%s", a->owner, k->orders[c], res.event_id,
         res.existing ? " (idempotency key: existing)" : "");
    h_str(k, res.event_id);
    bool known = false;
    for (int i = 0; i < k->n_ids[c]; i++)
        known = known || !strcmp(k->event_ids[c][i], res.event_id);
    if (!known && k->n_ids[c] < 2) obx__strlcpy(k->event_ids[c][k->n_ids[c]++], res.event_id, 31);
    if (kill_after) { /* committed, but the client never heard: it retries the same command */
        k->r.fired[F_KILL_AFTER_COMMIT]++;
        logv(k, "%s: killed after committing %s", a->owner, k->orders[c]);
        a->retry_cmd = c;
        actor_crash(k, a);
        return;
    }
    a->retry_cmd = -1;
    if (c == a->next_cmd) a->next_cmd++;
}

static void poll_outcomes(wk *k, actor *a) {
    size_t n = 0;
    bool rollback = k->faults_on && chance(k, k->p[F_ACCEPTANCE_ROLLBACK]);
    if (rollback) k->os->fail_commits = 8; /* every retry of this step's transactions fails */
    obx_err e = obx__engine_poll(&a->e, k->now, 0, &n);
    k->os->fail_commits = 0;
    if (e && rollback) {
        /* the acceptance rolled back: those ACKs never reached a committed acceptance; their
         * attempts stay SENDING/UNKNOWN to be reconciled */
        obx__sim_handle_unrecord_acks(a->b);
        k->r.fired[F_ACCEPTANCE_ROLLBACK]++;
        logv(k, "%s: acceptance of %s rolled back", a->owner, "a batch");
        return;
    }
    check_err(k, a, e, "poll");
    if (n) logv(k, "%s: applied %zu outcomes", a->owner, n);
    h_add(k, n);
}

static void dispatcher_step(wk *k, actor *a) {
    obx_err e;
    size_t n = 0;
    switch (rnd(k) % 4) {
    case 0: /* claim (held in memory until sent) */
        if (a->held.n) break;
        e = obx__engine_claim(&a->e, k->now, &a->held);
        check_err(k, a, e, "claim");
        if (a->held.n) logv(k, "%s: claimed %zu", a->owner, a->held.n);
        h_add(k, a->held.n);
        break;
    case 1: /* register attempts and send what was claimed */
        if (!a->held.n) break;
        e = obx__engine_begin_attempts(&a->e, k->now, a->held.v, a->held.n, OBX__ACT_DISPATCHER,
                                       &n);
        check_err(k, a, e, "begin attempts");
        logv(k, "%s: sent %zu of %zu claimed", a->owner, n, a->held.n);
        h_add(k, n);
        obx__rows_free(&a->held);
        break;
    case 2: poll_outcomes(k, a); break;
    default:
        e = obx__engine_sweep(&a->e, k->now, &n);
        check_err(k, a, e, "sweep");
        if (n) logv(k, "%s: swept %zu expired SENDING leases", a->owner, n);
        h_add(k, n);
    }
}

/* Sends the retry the reconciler decided (a row it holds as RETRY_CLAIMED), with the seed's two
 * races injected around it when the trace has them on (also in the liveness phase: they are
 * orderings, not faults). */
static void retry_send(wk *k, actor *a, obx__event_row *row) {
    char old_att[OBX__ATTEMPT_ID_LEN + 1];
    obx__strlcpy(old_att, row->attempt_id, sizeof old_att);
    /* the older attempt's true ACK arrives while the retry is claimed and not yet sent: the
     * acceptance fills the slot and the retry is fenced (never sent) */
    if (old_att[0] && chance(k, k->p[F_UNKNOWN_RACING_RETRY]) &&
        obx__sim_world_release_ack(k->w, old_att, k->now)) {
        k->r.fired[F_UNKNOWN_RACING_RETRY]++;
        logv(k, "%s: the late ACK of %s races the retry claim", a->owner, old_att);
        obx__sim_world_tick(k->w, k->now);
        for (int i = 0; i < k->na; i++)
            if (k->a[i].kind == A_DISPATCHER || k->a[i].kind == A_RECONCILER)
                poll_outcomes(k, &k->a[i]);
    }
    size_t sent = 0;
    obx_err e = obx__engine_begin_attempts(&a->e, k->now, row, 1, OBX__ACT_RECONCILER, &sent);
    check_err(k, a, e, "retry");
    logv(k, "%s: retry of %s %s", a->owner, row->env.event_id, sent ? "sent" : "refused (fenced)");
    h_add(k, sent);
    /* the new attempt is on its way and the old one's true ACK arrives well after it (the new
     * one has been accepted by then): one primary receipt, one late duplicate */
    if (sent && old_att[0] && chance(k, k->p[F_BOTH_ATTEMPTS_ACKED]) &&
        obx__sim_world_release_ack(k->w, old_att, k->now + 10000)) {
        k->r.fired[F_BOTH_ATTEMPTS_ACKED]++;
        logv(k, "%s: the old attempt %s will be ACKed too", a->owner, old_att);
    }
}

/* The reconciler's whole step in the liveness phase (obx__reconcile_step's sequence, with the
 * retries sent through retry_send). */
static void reconcile_all(wk *k, actor *a) {
    obx__rows_free(&a->held);
    a->held_pos = 0;
    obx_err e = obx__reconcile_begin(&a->e, k->now, &a->held);
    check_err(k, a, e, "reconcile begin");
    for (size_t i = 0; !e && i < a->held.n; i++) {
        obx__event_row *row = &a->held.v[i];
        if (row->state != OBX__ST_RETRY_CLAIMED) {
            obx__lookup_res res;
            e = obx__reconcile_lookup(&a->e, k->now, row, &res);
            if (!e) e = obx__reconcile_apply(&a->e, k->now, row, &res);
            check_err(k, a, e, "reconcile");
        }
        if (!e && row->state == OBX__ST_RETRY_CLAIMED) retry_send(k, a, row);
    }
    obx__rows_free(&a->held);
}

static void reconciler_step(wk *k, actor *a) {
    obx_err e;
    switch (rnd(k) % 3) {
    case 0:
        if (a->held_pos < a->held.n) break;
        obx__rows_free(&a->held);
        a->held_pos = 0;
        e = obx__reconcile_begin(&a->e, k->now, &a->held);
        check_err(k, a, e, "reconcile begin");
        if (a->held.n) logv(k, "%s: reconciling %zu", a->owner, a->held.n);
        h_add(k, a->held.n);
        break;
    case 1: {
        if (a->held_pos >= a->held.n) break;
        obx__event_row *row = &a->held.v[a->held_pos];
        if (row->state == OBX__ST_RETRY_CLAIMED) { /* a separate step: the race window */
            retry_send(k, a, row);
            a->held_pos++;
            break;
        }
        obx__lookup_res res;
        e = obx__reconcile_lookup(&a->e, k->now, row, &res);
        if (!e) e = obx__reconcile_apply(&a->e, k->now, row, &res);
        check_err(k, a, e, "reconcile");
        logv(k, "%s: %s: lookup %s -> %s", a->owner, row->env.event_id,
             res.kind == OBX__LOOKUP_FOUND       ? "FOUND"
             : res.kind == OBX__LOOKUP_NOT_FOUND ? "NOT_FOUND"
                                                 : "CANNOT_TELL",
             obx__state_name(row->state));
        h_add(k, (uint64_t)res.kind * 16 + row->state);
        if (row->state != OBX__ST_RETRY_CLAIMED) a->held_pos++;
        break;
    }
    default: poll_outcomes(k, a);
    }
}

typedef struct effect_ctx {
    wk *k;
    int consumer;
} effect_ctx;

static obx_err effect_handler(void *user, void *conn, const obx_message *m, const char *key,
                              char *res, size_t cap) {
    effect_ctx *c = user;
    (void)conn;
    (void)key;
    if (c->k->handler_fail_next) {
        c->k->handler_fail_next = false;
        return obx__fail(OBX_EHANDLER, "sim: a flaky downstream");
    }
    sqlite3_stmt **st = &c->k->st_effect[c->consumer];
    if (!*st && sqlite3_prepare_v3(c->k->cdb[c->consumer], "INSERT INTO sim_effects VALUES (?)", -1,
                                   SQLITE_PREPARE_PERSISTENT, st, NULL))
        return OBX_ESTORE;
    sqlite3_bind_text(*st, 1, m->event_id, -1, SQLITE_STATIC);
    int rc = sqlite3_step(*st);
    sqlite3_reset(*st);
    snprintf(res, cap, "applied");
    return rc == SQLITE_DONE ? OBX_OK : OBX_ESTORE;
}

static void drop_deliveries(actor *a) {
    for (size_t i = 0; i < a->ndl; i++) obx__delivery_free(&a->dl[i]);
    a->ndl = a->posdl = 0;
}

static void consumer_fetch(wk *k, actor *a) {
    if (a->ndl) return;
    obx_err e = obx__br_consume_poll(a->b, 0, a->dl, MAX_DL, &a->ndl);
    check_err(k, a, e, "consume poll");
    memset(a->to_ack, 0, sizeof a->to_ack);
    a->posdl = 0;
    if (a->ndl) logv(k, "%s: fetched %zu deliveries", a->owner, a->ndl);
    h_add(k, a->ndl);
}

/* One delivery through the inbox (its commit); the broker ack is a later step, so a crash in
 * between is "consumer commit then lost broker ACK". */
static void consumer_process_one(wk *k, actor *a) {
    if (a->posdl >= a->ndl) return;
    int ci = a->index;
    obx__delivery *d = &a->dl[a->posdl];
    obx_message m = {.event_id = d->env.event_id,
                     .envelope_gen = d->env.envelope_gen,
                     .event_type = d->env.event_type,
                     .tenant = d->env.tenant,
                     .aggregate_type = d->env.aggregate_type,
                     .aggregate_id = d->env.aggregate_id,
                     .aggregate_version = d->env.aggregate_version,
                     .correlation_id = d->env.correlation_id,
                     .occurred_at = d->env.occurred_at,
                     .payload_digest = d->env.payload_digest,
                     .attempt_id = d->attempt_id,
                     .dest_digest = d->dest_digest,
                     .payload = d->payload,
                     .payload_len = d->payload_len,
                     .topic = d->topic,
                     .partition = d->partition,
                     .offset = d->offset,
                     .redelivered = d->redelivered,
                     .header_error = d->header_error};
    if (k->faults_on && chance(k, k->p[F_HANDLER_FAILURE])) {
        k->handler_fail_next = true;
        k->r.fired[F_HANDLER_FAILURE]++;
    }
    effect_ctx ec = {k, ci};
    obx_inbox_result r;
    obx_err e =
        obx__inbox_process_at(k->in[ci], &m, effect_handler, &ec, k->cdb[ci], k->now, 0, NULL, &r);
    k->handler_fail_next = false;
    check_err(k, a, e, "inbox");
    if (e) return;
    logv(k, "%s: %s -> %s", a->owner, m.event_id,
         r.outcome == OBX_INBOX_APPLIED       ? "APPLIED"
         : r.outcome == OBX_INBOX_DUPLICATE   ? "DUPLICATE"
         : r.outcome == OBX_INBOX_QUARANTINED ? "QUARANTINED"
         : r.outcome == OBX_INBOX_FAILED      ? "FAILED"
                                              : "POISONED");
    h_add(k, (uint64_t)r.outcome);
    if (r.outcome == OBX_INBOX_QUARANTINED || r.outcome == OBX_INBOX_POISONED) {
        k->r.internal_errors++;
        fail(k, "%s: %s was %s: %s", a->owner, m.event_id,
             r.outcome == OBX_INBOX_QUARANTINED ? "quarantined" : "parked as poison", r.detail);
    }
    if (r.ack) {
        a->to_ack[a->posdl] = true;
        a->posdl++;
        return;
    }
    /* failed: this delivery and everything after it come again */
    check_err(k, a, obx__br_consume_redeliver(a->b, d), "redeliver");
    drop_deliveries(a);
}

static void consumer_ack_all(wk *k, actor *a) {
    for (size_t i = 0; i < a->posdl; i++)
        if (a->to_ack[i]) {
            check_err(k, a, obx__br_consume_ack(a->b, &a->dl[i]), "ack");
            a->to_ack[i] = false;
        }
    if (a->posdl >= a->ndl) drop_deliveries(a);
}

static void consumer_step(wk *k, actor *a) {
    switch (rnd(k) % 3) {
    case 0: consumer_fetch(k, a); break;
    case 1: consumer_process_one(k, a); break;
    default: consumer_ack_all(k, a);
    }
}

/* One bounded retention step; or, as the fault "premature purge attempt", an operator's
 * `obx purge EVENT_ID` of any event at any time: obx must refuse it unless every condition
 * holds (the checker verifies each purge against the consumers' receipts afterwards). */
static void purger_step(wk *k, actor *a) {
    obx__ret_result res = {0};
    obx_err e;
    if (k->faults_on && chance(k, k->p[F_PREMATURE_PURGE])) {
        int c = (int)(rnd(k) % (uint64_t)k->n_events);
        if (!k->n_ids[c]) return;
        e = obx__purge_event(k->os, &a->rcfg, k->now, k->event_ids[c][0], &res);
        logv(k, "%s: purge %s -> %s", a->owner, k->event_ids[c][0],
             e == OBX_EREFUSED ? "refused"
             : e               ? obx_errname(e)
                               : "purged");
        if (e == OBX_EREFUSED) {
            k->r.fired[F_PREMATURE_PURGE]++;
            e = OBX_OK;
        }
    } else {
        e = obx__purge_step(k->os, &a->rcfg, k->now, &a->cur, &res);
        if (res.retained || res.purged)
            logv(k, "%s: retained %lld, purged %lld", a->owner, (long long)res.retained,
                 (long long)res.purged);
        if (a->cur.phase == 2) obx__purge_cursor_init(&a->cur);
    }
    h_add(k, (uint64_t)(res.retained * 64 + res.purged));
    obx__ret_result_free(&res);
    check_err(k, a, e, "purge");
}

/* An operator moving one event of the backlog to the current route generation (after a route
 * policy revision) with `obx migrate`: it must move only with proof that the old target did not
 * accept the event, and is refused otherwise — in particular while the old target cannot be
 * queried (the fault). The checker verifies every move against the broker's log. */
static void migrator_step(wk *k, actor *a) {
    if (!k->revised) return; /* nothing to migrate to yet */
    int c = (int)(rnd(k) % (uint64_t)k->n_events);
    if (!k->n_ids[c]) return;
    obx__sim_faults *wf = obx__sim_world_faults(k->w);
    bool was_down = wf->lookup_down;
    bool down = k->faults_on && chance(k, k->p[F_MIGRATION_UNQUERYABLE]);
    if (down) wf->lookup_down = true;
    const char *ids[] = {k->event_ids[c][0]};
    obx__migrate_req req = {.ids = ids, .n_ids = 1, .who = a->owner, .reason = "sim"};
    json_t *out = NULL;
    size_t refused = 0;
    obx_err e = obx__migrate(&a->e, k->now, &req, &out, &refused);
    wf->lookup_down = was_down;
    if (e == OBX_EREFUSED) e = OBX_OK;
    if (!e) {
        k->r.migrated += refused ? 0 : 1;
        k->r.migration_refused += (long)refused;
        if (down) k->r.fired[F_MIGRATION_UNQUERYABLE]++;
        logv(k, "%s: migrate %s -> %s%s%s", a->owner, ids[0], refused ? "refused: " : "moved",
             refused ? obx_errmsg() : "", down ? " (old target unqueryable)" : "");
    }
    h_add(k, refused ? 7 : 9);
    json_decref(out);
    check_err(k, a, e, "migrate");
}

/* The on-call operator: held UNKNOWNs (an alert) older than the reaction time are resolved with
 * `obx resolve`. An operator first reads the broker (kcat, a queue browser): a message of the
 * event's generation there is accepted as evidence (offset and the payload digest it carries);
 * otherwise the event is retried to its frozen destination. */
static void operator_step(wk *k, actor *a) {
    if (k->now < k->op_next_at) return;
    k->op_next_at = k->now + OP_POLL_MS;
    obx__event_filter f = {.held = true, .limit = 32};
    obx__rows rows = {0};
    obx_err e = obx__st_find_events(k->os, &f, &rows);
    check_err(k, a, e, "operator: list held");
    for (size_t i = 0; !e && i < rows.n; i++) {
        obx__event_row *r = &rows.v[i];
        if (!r->held_at || r->held_at + k->op_react_ms > k->now) continue;
        const obx__sim_msg *m = obx__sim_world_find(k->w, obx__wire_id(r), r->envelope_gen);
        const char *ids[] = {r->env.event_id};
        obx__resolve_req q = {.ids = ids,
                              .n_ids = 1,
                              .partition = -1,
                              .who = a->owner,
                              .reason = "on-call: held UNKNOWN past the alert"};
        if (m) {
            q.accept = true;
            q.topic = m->topic;
            q.partition = m->partition;
            q.offset = m->offset;
            q.payload_digest = m->env.payload_digest;
            q.attempt_id = m->attempt_id;
        }
        json_t *out = NULL;
        size_t refused = 0;
        e = obx__resolve(&a->e, k->now, &q, &out, &refused);
        json_decref(out);
        check_err(k, a, e, "operator: resolve");
        if (!e && !refused) {
            if (m)
                k->r.op_accepts++;
            else
                k->r.op_retries++;
        }
        logv(k, "%s: resolved held %s: %s%s", a->owner, r->env.event_id,
             m ? "accepted the broker's copy" : "same-target retry", refused ? " (refused)" : "");
        h_add(k, m ? 31 : 37);
    }
    obx__rows_free(&rows);
}

static void step(wk *k, actor *a) {
    if (a->paused_until > k->now) return;
    switch (a->kind) {
    case A_PRODUCER: producer_step(k, a); break;
    case A_DISPATCHER: dispatcher_step(k, a); break;
    case A_RECONCILER: reconciler_step(k, a); break;
    case A_PURGER: purger_step(k, a); break;
    case A_MIGRATOR: migrator_step(k, a); break;
    case A_OPERATOR: operator_step(k, a); break;
    default: consumer_step(k, a);
    }
}

/* ---- the trace ------------------------------------------------------------------------------- */

static void route(wk *k, const char *topic, bool unordered) {
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "sim",
                   .topic = topic,
                   .routing_key = "{tenant}.{aggregate_id}",
                   .on_unknown = k->hold ? "hold" : "retry",
                   .unordered = unordered,
                   .max_attempts = 50};
    obx_err e = obx__route_set_at(k->os, &r, k->now, NULL);
    if (e) {
        k->r.internal_errors++;
        fail(k, "route set: %s", obx_errmsg());
    }
}

/* When the next thing is due: a lease ends, a check or a backoff is due, a network event
 * arrives, the operator's next look at held events. INT64_MAX: nothing scheduled. */
static int64_t next_due(wk *k) {
    int64_t t = obx__sim_world_next_at(k->w);
    oparam op[] = {OP_I(k->op_react_ms)};
    ocur c;
    if (oq_run(k, OQ_NEXT_DUE, op, 1, &c) && oq_next(k, &c)) {
        if (!oq_null(&c, 0) && oq_int(&c, 0) < t) t = oq_int(&c, 0);
        if (!oq_null(&c, 1)) { /* held: the operator reacts, on its round */
            int64_t op_at = oq_int(&c, 1) > k->op_next_at ? oq_int(&c, 1) : k->op_next_at;
            if (op_at < t) t = op_at;
        }
    }
    oq_close(&c);
    return t;
}

static bool quiescent(wk *k) {
    static _Thread_local qc consumed[2] = {
        {"SELECT count(DISTINCT event_id) FROM sim_effects", NULL},
        {"SELECT count(DISTINCT event_id) FROM sim_effects", NULL}};
    if (k->a[0].next_cmd < k->n_events || k->a[0].retry_cmd >= 0) return false;
    if (oq_long(k, OQ_UNPUBLISHED, NULL, 0) != 0) return false;
    long n = oq_long(k, OQ_EVENTS, NULL, 0);
    for (int i = 0; i < k->nconsumers; i++)
        if (qcached(k->cdb[i], &consumed[i]) < n) return false;
    return true;
}

static void check_trace(wk *k);

static void run_trace(wk *k, long idx) {
    const obx_sim_options *o = k->o;
    k->idx = idx;
    k->rng = mix(o->seed ^ mix((uint64_t)idx + 1));
    k->hash = 0xcbf29ce484222325ull;
    k->now = 1700000000000LL;
    k->failure[0] = '\0';
    memset(&k->r, 0, sizeof k->r);
    k->r.traces = 1;
    /* this trace's world */
    k->n_events = 2 + (int)(rnd(k) % 4);
    snprintf(k->tenant, sizeof k->tenant, "t%ld", idx);
    for (int i = 0; i < k->n_events; i++) {
        snprintf(k->orders[i], sizeof k->orders[i], "order-%d", i);
        k->n_ids[i] = 0;
    }
    /* the adapter and the route's UNKNOWN policy, as production would have them: the default
     * policy (retry) in most traces, hold in a fifth */
    uint64_t pick = rnd(k) % 20;
    int ai = pick < 7 ? 0 : pick < 14 ? 1 : pick < 17 ? 2 : 3;
    k->ad = &adapters[ai];
    k->r.adapter_traces[ai] = 1;
    k->hold = rnd(k) % 5 == 0;
    k->r.hold_traces = k->hold;
    k->evidence = rnd(k) % 2; /* the reconciler consults the consumers in half of them */
    k->op_react_ms = OP_REACT_MIN_MS + (int64_t)(rnd(k) % (OP_REACT_MAX_MS - OP_REACT_MIN_MS));
    k->op_next_at = 0;
    bool unordered = rnd(k) % 4 == 0;
    for (int f = 0; f < F_COUNT; f++) {
        bool on = o->faults_mask ? (o->faults_mask >> f & 1) : true;
        k->p[f] = on && rnd(k) % 4 ? 1.0 : 0.0; /* each class on in ~3/4 of the traces */
    }
    int64_t lease = k->base.lease_ms;
    obx__sim_faults sf = {.drop_ack = k->p[F_TIMED_OUT_ACK] * 0.15,
                          .lose_ack = k->p[F_LOST_ACK] * 0.10,
                          .delay_ack = (k->p[F_DELAYED_ACK] + k->p[F_CLAIM_EXPIRY_LATE_ACK]) * 0.12,
                          .dup_append = k->p[F_DUPLICATE_APPEND] * 0.10,
                          .blackhole = k->p[F_LOST_REQUEST] * 0.08,
                          .reject = k->p[F_REJECTION] * 0.05,
                          .corrupt = k->p[F_MANGLED_RECEIPT] * 0.05,
                          .dup_deliver = k->p[F_DUPLICATED_DELIVERY] * 0.20,
                          .lose_commit = k->p[F_CONSUMER_COMMIT_LOST_ACK] * 0.15,
                          /* a delayed ACK arrives after the sender's lease: a late ACK */
                          .delay_ack_ms = lease + 5000,
                          .ack_timeout_ms = k->ad->ack_timeout_ms,
                          .max_net_delay_ms = 150,
                          .quiet_ms = k->ad->quiet_ms};
    obx__sim_world_reset(k->w, rnd(k), &sf, 1 + (int32_t)(rnd(k) % 4), k->ad->lookup, "sim");
    for (int f = 0; f < F_COUNT; f++) k->p[f] *= 0.03; /* per-step injection probabilities */
    k->p[F_KILL_BEFORE_COMMIT] *= 3;
    k->p[F_KILL_AFTER_COMMIT] *= 3;
    k->p[F_ACCEPTANCE_ROLLBACK] *= 2;
    k->p[F_HANDLER_FAILURE] *= 3;
    /* the two races are injected where their window opens (a retry claimed, a retry sent):
     * often, since the window is rare */
    k->p[F_UNKNOWN_RACING_RETRY] = k->p[F_UNKNOWN_RACING_RETRY] > 0 ? 0.5 : 0;
    k->p[F_BOTH_ATTEMPTS_ACKED] = k->p[F_BOTH_ATTEMPTS_ACKED] > 0 ? 0.5 : 0;
    o_simple(k, "BEGIN");
    for (int i = 0; i < 2; i++) sq_tx(k, i + 1, 0);
    route(k, "orders", unordered);
    /* actors */
    k->nconsumers = 1 + (int)(rnd(k) % 2);
    k->na = 0;
    bool retention = rnd(k) % 4 != 0; /* a purger runs in 3 of 4 traces */
    bool migration = rnd(k) % 2 == 0; /* an operator migrating the backlog in half of them */
    k->replay_window_ms = (int64_t)(rnd(k) % 1500);
    k->purge_batch = 1 + (size_t)(rnd(k) % 3);
    int kinds[] = {A_PRODUCER, A_DISPATCHER, A_DISPATCHER, A_RECONCILER, A_PURGER,
                   A_MIGRATOR, A_OPERATOR,   A_CONSUMER,   A_CONSUMER};
    int index[] = {0, 1, 2, 0, 0, 0, 0, 0, 1};
    for (int i = 0; i < 7 + k->nconsumers; i++) {
        if ((kinds[i] == A_PURGER && !retention) || (kinds[i] == A_MIGRATOR && !migration))
            continue;
        actor *a = &k->a[k->na++];
        /* everything but the delivery slots (~40 KB an actor, valid below ndl only): zeroing
         * them for every actor of every trace was 5% of the simulator's instructions */
        memset(a, 0, offsetof(actor, dl));
        a->ndl = a->posdl = 0;
        memset(a->to_ack, 0, sizeof a->to_ack);
        a->kind = kinds[i];
        a->index = index[i];
        a->retry_cmd = -1;
        if (actor_start(k, a)) {
            k->r.internal_errors++;
            fail(k, "actor start: %s", obx_errmsg());
        }
    }
    if (k->verbose)
        fprintf(stderr,
                "trace %ld: %d events, adapter %s (quiet %lld ms), UNKNOWN policy %s, %s, %d "
                "consumers%s, operator reacts after %lld s\n",
                idx, k->n_events, k->ad->name, (long long)k->ad->quiet_ms,
                k->hold ? "hold" : "retry", unordered ? "unordered" : "ordered per key",
                k->nconsumers, k->evidence ? " (evidence)" : "",
                (long long)(k->op_react_ms / 1000));
    /* 1. fault phase */
    k->faults_on = true;
    int steps = 60 + (int)(rnd(k) % 90);
    k->revised = false;
    for (int s = 0; s < steps && !k->failure[0]; s++) {
        actor *a = &k->a[rnd(k) % (uint64_t)k->na];
        h_add(k, (uint64_t)(a - k->a));
        step(k, a);
        obx__sim_world_tick(k->w, k->now);
        /* faults between two steps */
        if (chance(k, k->p[F_ACTOR_CRASH])) {
            actor *v = &k->a[1 + rnd(k) % (uint64_t)(k->na - 1)];
            logv(k, "%s crashes", v->owner);
            actor_crash(k, v);
            k->r.fired[F_ACTOR_CRASH]++;
        }
        if (chance(k, k->p[F_PAUSE_PAST_LEASE] + k->p[F_CLAIM_EXPIRY_LATE_ACK])) {
            actor *v = &k->a[1 + rnd(k) % (uint64_t)(k->na - 1)];
            v->paused_until = k->now + lease + 200 + (int64_t)(rnd(k) % (uint64_t)(lease * 3 / 2));
            logv(k, "%s pauses until t=%lld", v->owner,
                 (long long)(v->paused_until - 1700000000000LL));
            k->r.fired[F_PAUSE_PAST_LEASE]++;
        }
        if (!k->revised && chance(k, k->p[F_ROUTE_REVISION])) {
            /* only later events may use it (the same UNKNOWN policy) */
            route(k, "orders-v2", unordered);
            k->revised = true;
            k->r.fired[F_ROUTE_REVISION]++;
            logv(k, "route policy revised: later events go to orders-v2");
        }
        obx__sim_faults *wf = obx__sim_world_faults(k->w);
        bool down = chance(k, k->p[F_TARGET_UNQUERYABLE] * 3);
        if (down != wf->lookup_down) {
            wf->lookup_down = down;
            if (down) k->r.fired[F_TARGET_UNQUERYABLE]++;
        }
        /* time between two steps, on the scale of the shipped lease: mostly a fraction of a
         * second, sometimes a good part of a lease */
        k->now += (int64_t)(rnd(k) % (uint64_t)(lease / 25));
        if (rnd(k) % 20 == 0) k->now += lease / 5 + (int64_t)(rnd(k) % (uint64_t)lease);
    }
    /* 2. liveness: faults stop, everybody runs until quiescent */
    k->faults_on = false;
    obx__sim_faults none = {.delay_ack_ms = lease + 5000,
                            .ack_timeout_ms = k->ad->ack_timeout_ms,
                            .max_net_delay_ms = 150,
                            .quiet_ms = k->ad->quiet_ms};
    *obx__sim_world_faults(k->w) = none;
    for (int i = 0; i < k->na; i++) k->a[i].paused_until = 0;
    bool done = false;
    for (int round = 0; round < 1000 && !done && !k->failure[0]; round++) {
        for (int i = 0; i < k->na; i++) {
            actor *a = &k->a[i];
            switch (a->kind) {
            case A_PRODUCER:
                while (a->next_cmd < k->n_events || a->retry_cmd >= 0) producer_step(k, a);
                break;
            case A_DISPATCHER: {
                size_t n = 0;
                poll_outcomes(k, a);
                if (i == 1) check_err(k, a, obx__engine_sweep(&a->e, k->now, &n), "sweep");
                if (a->held.n) {
                    check_err(k, a,
                              obx__engine_begin_attempts(&a->e, k->now, a->held.v, a->held.n,
                                                         OBX__ACT_DISPATCHER, &n),
                              "begin attempts");
                    obx__rows_free(&a->held);
                }
                check_err(k, a, obx__engine_dispatch(&a->e, k->now, &n), "dispatch");
                break;
            }
            case A_RECONCILER:
                reconcile_all(k, a);
                poll_outcomes(k, a);
                break;
            case A_PURGER: purger_step(k, a); break;
            case A_MIGRATOR: break; /* the migrating operator is done */
            case A_OPERATOR: operator_step(k, a); break;
            default:
                for (int rep = 0; rep < 4; rep++) {
                    consumer_fetch(k, a);
                    while (a->posdl < a->ndl) consumer_process_one(k, a);
                    consumer_ack_all(k, a);
                }
            }
        }
        obx__sim_world_tick(k->w, k->now);
        done = quiescent(k) && obx__sim_world_pending(k->w) == 0;
        /* the relay sweeps and reconciles every second; when nothing is due sooner, virtual
         * time jumps to the next lease end, check, backoff end, network event or operator
         * round (a Kafka UNKNOWN waits out a quiet time of 5.5 minutes) */
        int64_t due = next_due(k), stepms = k->sweep_ms;
        if (due > k->now + stepms && due != INT64_MAX) stepms = due - k->now;
        k->now += stepms;
    }
    if (!done && !k->failure[0]) {
        k->r.liveness_failures++;
        fail(k, "not quiescent after the liveness phase (%zu network events pending)",
             obx__sim_world_pending(k->w));
        if (k->verbose) { /* narrate what is stuck */
            ocur c;
            if (oq_run(k, OQ_STUCK, NULL, 0, &c))
                while (oq_next(k, &c))
                    fprintf(stderr,
                            "    %s %s claim_gen=%lld owner=%s lease_until=%lld next=%lld\n",
                            oq_text(&c, 0), oq_text(&c, 1), (long long)oq_int(&c, 2),
                            oq_text(&c, 3), (long long)(oq_int(&c, 4) - 1700000000000LL),
                            (long long)(oq_int(&c, 5) - 1700000000000LL));
            oq_close(&c);
        }
    }
    check_trace(k);
    /* 3. leave no trace behind for the next one */
    for (int i = 0; i < k->na; i++) actor_stop(&k->a[i]);
    o_simple(k, "ROLLBACK");
    for (int i = 0; i < 2; i++) sq_tx(k, i + 1, 1);
}

/* ---- the checkers ------------------------------------------------------------------------------
 */

/* When consumer i applied event_id (virtual ms), or -1: never. */
static int64_t consumed_at(wk *k, int i, const char *event_id) {
    char cid[16];
    snprintf(cid, sizeof cid, "consumer-%d", i);
    sqlite3_stmt *st = k->st_inbox_at[i];
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, cid, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, event_id, -1, SQLITE_TRANSIENT);
    int64_t at = sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL
                     ? sqlite3_column_int64(st, 0)
                     : -1;
    sqlite3_reset(st);
    return at;
}

/* Retention (docs/retention.md): each PURGED event was purged after its replay window, and at that
 * moment every consumer (all critical) had applied it and every event published before it:
 * nothing a consumer still needed lost its payload. The payload is gone, the envelope stays. */
static void check_purges(wk *k) {
    results *r = &k->r;
    ocur p;
    if (!oq_run(k, OQ_PURGED, NULL, 0, &p)) return;
    while (oq_next(k, &p)) {
        char id[OBX_EVENT_ID_LEN + 1];
        obx__strlcpy(id, oq_text(&p, 0), sizeof id);
        int64_t pub = oq_int(&p, 1), seq = oq_int(&p, 2), tp = oq_null(&p, 3) ? 0 : oq_int(&p, 3);
        r->purged++;
        if (pub <= 0 || pub + k->replay_window_ms > tp) {
            r->premature_purges++;
            fail(k, "%s was purged %lld ms after publication, inside the %lld ms replay window", id,
                 (long long)(tp - pub), (long long)k->replay_window_ms);
            continue;
        }
        ocur b;
        oparam op[] = {OP_I(pub), OP_I(seq)};
        if (oq_run(k, OQ_BEFORE, op, 2, &b))
            while (oq_next(k, &b)) {
                const char *e = oq_text(&b, 0);
                for (int i = 0; i < k->nconsumers; i++) {
                    int64_t at = consumed_at(k, i, e);
                    if (at < 0 || at > tp) {
                        r->premature_purges++;
                        fail(k, "%s was purged at t=%lld while consumer %d %s %s", id,
                             (long long)(tp - 1700000000000LL), i,
                             at < 0 ? "never applied" : "had not yet applied", e);
                        break;
                    }
                }
            }
        oq_close(&b);
    }
    oq_close(&p);
}

/* Migration (docs/migration.md): an event left a generation's destination only when that target did
 * not have it — so the broker's log holds no message of a generation an event migrated away
 * from (it would reach consumers from two destinations). */
static void check_migrations(wk *k) {
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    ocur c;
    if (!oq_run(k, OQ_MIGRATIONS, NULL, 0, &c)) return;
    while (oq_next(k, &c)) {
        const char *id = oq_text(&c, 0);
        int64_t old = oq_int(&c, 1);
        for (size_t i = 0; i < nlog; i++) {
            const obx__sim_msg *m =
                (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
            if (!strcmp(m->env.event_id, id) && m->env.envelope_gen == old) {
                k->r.migrated_with_old_copy++;
                fail(k,
                     "%s migrated away from generation %lld while its old target held it "
                     "(%s/%d, attempt %s)",
                     id, (long long)old, m->topic, (int)m->partition, m->attempt_id);
                break;
            }
        }
    }
    oq_close(&c);
}

static void check_trace(wk *k) {
    results *r = &k->r;
    static _Thread_local qc dup_effects[2] = {
        {"SELECT count(*) FROM (SELECT 1 FROM sim_effects GROUP BY event_id HAVING count(*) > 1)",
         NULL},
        {"SELECT count(*) FROM (SELECT 1 FROM sim_effects GROUP BY event_id HAVING count(*) > 1)",
         NULL}};
    static _Thread_local qc consumed[2] = {
        {"SELECT count(DISTINCT event_id) FROM sim_effects", NULL},
        {"SELECT count(DISTINCT event_id) FROM sim_effects", NULL}};
    long v;
    /* lost: committed but not published, a business row without its event, or an event a
     * consumer never applied */
    long n_events = oq_long(k, OQ_EVENTS, NULL, 0);
    if ((v = oq_long(k, OQ_UNPUBLISHED, NULL, 0)) > 0) {
        r->lost_events += v;
        fail(k, "%ld committed events were never published", v);
    }
    if ((v = oq_long(k, OQ_ORPHANS, NULL, 0)) > 0) {
        r->lost_events += v;
        fail(k, "%ld business orders committed without their event", v);
    }
    for (int i = 0; i < k->nconsumers; i++)
        if ((v = n_events - qcached(k->cdb[i], &consumed[i])) > 0) {
            r->lost_events += v;
            fail(k, "consumer %d never applied %ld events", i, v);
        }
    /* second logical event IDs: events no business row points at, or a command answered with
     * two different IDs */
    if ((v = n_events - oq_long(k, OQ_REFERENCED, NULL, 0)) > 0) {
        r->second_event_ids += v;
        fail(k, "%ld events belong to no business command (second event IDs)", v);
    }
    for (int c = 0; c < k->n_events; c++)
        if (k->n_ids[c] > 1) {
            r->second_event_ids++;
            fail(k, "command %s was answered with two event IDs", k->orders[c]);
        }
    if ((v = oq_long(k, OQ_DIVERGENT, NULL, 0)) > 0 ||
        (v = oq_long(k, OQ_MULTI_PRIMARY, NULL, 0)) > 0) {
        r->digest_divergence += v;
        fail(k, "%ld primary receipts diverge from their frozen envelope or are doubled", v);
    }
    for (int i = 0; i < k->nconsumers; i++)
        if ((v = qcached(k->cdb[i], &dup_effects[i])) > 0) {
            r->consumer_duplicate_effects += v;
            fail(k, "consumer %d applied %ld events twice", i, v);
        }
    check_purges(k);
    check_migrations(k);
    if ((v = oq_long(k, OQ_STALE, NULL, 0)) > 0) {
        r->stale_claim_sends += v;
        fail(k, "%ld attempts were sent under a claim their owner did not hold", v);
    }
    /* cross-destination: every message on the broker went to its event's frozen destination
     * (of that envelope generation) and the attempt's pinned partition */
    size_t nlog;
    const obx__sim_msg *log = obx__sim_world_log(k->w, &nlog);
    size_t stride = obx__sim_world_log_stride();
    for (size_t i = 0; i < nlog; i++) {
        const obx__sim_msg *m =
            (const obx__sim_msg *)(const void *)((const char *)log + i * stride);
        ocur c;
        oparam ev[] = {OP_S(m->env.event_id), OP_I(m->env.envelope_gen)};
        bool ok = oq_run(k, OQ_ENV_OF, ev, 2, &c) && oq_next(k, &c) &&
                  !strcmp(oq_text(&c, 0), m->topic) && !strcmp(oq_text(&c, 1), m->dest_digest);
        oq_close(&c);
        oparam at[] = {OP_S(m->attempt_id)};
        ok = ok && oq_long(k, OQ_ATT_PART, at, 1) == m->partition;
        if (!ok) {
            r->cross_destination_retries++;
            fail(k, "%s (attempt %s) reached %s/%d, not its frozen destination", m->env.event_id,
                 m->attempt_id, m->topic, (int)m->partition);
        }
    }
    /* every valid late ACK that reached a committed acceptance is the primary receipt or a
     * duplicate transport receipt */
    size_t nacks;
    const obx__sim_ack *acks = obx__sim_world_acks(k->w, &nacks);
    for (size_t i = 0; i < nacks; i++) {
        if (!acks[i].late || !acks[i].valid || !acks[i].attempt_id[0]) continue;
        r->late_ack_total++;
        k->r.fired[F_CLAIM_EXPIRY_LATE_ACK]++;
        oparam at[] = {OP_S(acks[i].attempt_id)};
        bool conv = oq_long(k, OQ_RECEIPT_FOR, at, 1) > 0;
        if (conv)
            r->late_ack_converged++;
        else
            fail(k, "the late ACK of attempt %s left no receipt", acks[i].attempt_id);
    }
    r->unknown_total += oq_long(k, OQ_UNKNOWN_TOTAL, NULL, 0);
    if ((v = oq_long(k, OQ_UNTRACEABLE, NULL, 0)) > 0) {
        r->unknown_untraceable += v;
        fail(k, "%ld UNKNOWN transitions name no UNKNOWN attempt", v);
    }
    /* the two races, as they happened (injected or not): a retry claim overtaken by a late
     * ACK, and a duplicate receipt of another attempt than the primary */
    r->racing_observed += oq_long(k, OQ_RACING, NULL, 0);
    r->both_acked_observed += oq_long(k, OQ_BOTH_ACKED, NULL, 0);
    /* every UNKNOWN ends: an episode still open here counts as never resolved */
    long unresolved = oq_long(k, OQ_UNRESOLVED, NULL, 0);
    if (unresolved > 0) {
        r->unknown_unresolved += unresolved;
        fail(k, "%ld UNKNOWN outcomes were never resolved", unresolved);
    }
    r->held += oq_long(k, OQ_HELD_EVER, NULL, 0);
    r->quarantined += oq_long(k, OQ_QUARANTINED, NULL, 0);
    const obx__sim_fired *wf = obx__sim_world_fired(k->w);
    r->fired[F_LOST_ACK] += wf->lose_ack;
    r->fired[F_TIMED_OUT_ACK] += wf->drop_ack;
    r->fired[F_DELAYED_ACK] += wf->delay_ack;
    r->fired[F_DUPLICATE_APPEND] += wf->dup_append;
    r->fired[F_LOST_REQUEST] += wf->blackhole;
    r->fired[F_REJECTION] += wf->reject;
    r->fired[F_MANGLED_RECEIPT] += wf->corrupt;
    r->fired[F_DUPLICATED_DELIVERY] += wf->dup_deliver;
    r->fired[F_REORDERED_DELIVERY] += wf->reorder;
    r->fired[F_CONSUMER_COMMIT_LOST_ACK] += wf->lose_commit;
    /* UNKNOWN resolution times (virtual) */
    int64_t *ms = NULL;
    size_t n = 0;
    if (!obx__st_unknown_resolutions(k->os, &ms, &n)) {
        /* unresolved episodes take part in the percentile as never resolved */
        int64_t *grown = unresolved > 0 ? realloc(ms, (n + (size_t)unresolved) * sizeof *ms) : ms;
        if (grown) {
            ms = grown;
            for (long i = 0; i < unresolved; i++) ms[n++] = UNRESOLVED_MS;
        }
        for (size_t i = 0; i < n; i++) {
            if (k->nres == k->capres) {
                size_t c = k->capres ? k->capres * 2 : 4096;
                int64_t *p = realloc(k->res_ms, c * sizeof *p);
                if (!p) break;
                k->res_ms = p;
                k->capres = c;
            }
            k->res_ms[k->nres++] = ms[i];
        }
        free(ms);
    }
    h_add(k, (uint64_t)n_events);
    h_add(k, (uint64_t)nlog);
    if (k->failure[0]) {
        if (r->nfailing < 16) r->failing[r->nfailing++] = k->idx;
        obx__strlcpy(r->first_failure, k->failure, sizeof r->first_failure);
    }
}

/* ---- running many traces ------------------------------------------------------------------------
 */

typedef struct run {
    const obx_sim_options *o;
    long next; /* atomic */
    long done; /* atomic */
    int stop;  /* atomic: fail_fast saw a failure */
    uint64_t *hashes;
    results total;
    int64_t *res_ms;
    size_t nres;
    pthread_mutex_t mu;
    obx_err err;
    char errmsg[512];
} run;

typedef struct thr {
    run *r;
    int id;
    pthread_t th;
} thr;

static void *worker_main(void *arg) {
    thr *t = arg;
    run *r = t->r;
    wk *k = calloc(1, sizeof *k);
    obx_err e = k ? wk_init(k, t->id, r->o) : obx__fail(OBX_ENOMEM, "sim: out of memory");
    results acc;
    memset(&acc, 0, sizeof acc);
    if (!e) {
        k->verbose = r->o->replay >= 0;
        for (;;) {
            long i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
            long idx = r->o->replay >= 0 ? r->o->replay : i;
            if (r->o->replay >= 0 ? i > 0 : i >= r->o->traces) break;
            if (__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) break;
            run_trace(k, idx);
            if (r->o->fail_fast && k->failure[0]) __atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
            r->hashes[r->o->replay >= 0 ? 0 : i] = k->hash;
            long nf = acc.nfailing;
            results_add(&acc, &k->r);
            for (long j = 0; j < k->r.nfailing && nf + j < 16; j++)
                acc.failing[acc.nfailing++] = k->r.failing[j];
            if (k->r.first_failure[0] && !acc.first_failure[0])
                obx__strlcpy(acc.first_failure, k->r.first_failure, sizeof acc.first_failure);
            long d = __atomic_add_fetch(&r->done, 1, __ATOMIC_RELAXED);
            if (r->o->progress && (d % 1000 == 0 || d == r->o->traces))
                r->o->progress(r->o->progress_user, d, r->o->replay >= 0 ? 1 : r->o->traces);
        }
    }
    pthread_mutex_lock(&r->mu);
    if (e && !r->err) {
        r->err = e;
        obx__strlcpy(r->errmsg, obx_errmsg(), sizeof r->errmsg);
    }
    long nf = r->total.nfailing;
    results_add(&r->total, &acc);
    for (long j = 0; j < acc.nfailing && nf + j < 16; j++)
        r->total.failing[r->total.nfailing++] = acc.failing[j];
    if (acc.first_failure[0] && !r->total.first_failure[0])
        obx__strlcpy(r->total.first_failure, acc.first_failure, sizeof r->total.first_failure);
    if (k && k->nres) {
        int64_t *p = realloc(r->res_ms, (r->nres + k->nres) * sizeof *p);
        if (p) {
            memcpy(p + r->nres, k->res_ms, k->nres * sizeof *p);
            r->res_ms = p;
            r->nres += k->nres;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (k) wk_free(k);
    free(k);
    return NULL;
}

size_t obx_sim_fault_count(void) { return F_COUNT; }

const char *obx_sim_fault_name(size_t i) { return i < F_COUNT ? fault_names[i] : NULL; }

obx_err obx_sim_fault_index(const char *name, int *out) {
    for (int i = 0; i < F_COUNT; i++)
        if (name && !strcmp(name, fault_names[i])) {
            *out = i;
            return OBX_OK;
        }
    return obx__fail(OBX_EINVAL, "fault: unknown class '%s'", name ? name : "(null)");
}

/* The timings the gate ran on: the relay's shipped defaults, each adapter's, the operator's,
 * and how many traces each adapter and UNKNOWN policy had. */
static json_t *timing_json(const results *x) {
    wk tmp;
    memset(&tmp, 0, sizeof tmp);
    json_t *t = json_object();
    if (shipped_timings(&tmp)) return t;
    json_object_set_new(t, "profile", json_string("production"));
    json_object_set_new(
        t, "relay",
        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "lease_ms", (json_int_t)tmp.base.lease_ms,
                  "reconcile_lease_ms", (json_int_t)tmp.base.reconcile_lease_ms, "recheck_ms",
                  (json_int_t)tmp.base.recheck_ms, "recheck_max_ms",
                  (json_int_t)tmp.base.recheck_max_ms, "backoff_base_ms",
                  (json_int_t)tmp.base.backoff_base_ms, "backoff_max_ms",
                  (json_int_t)tmp.base.backoff_max_ms, "sweep_ms", (json_int_t)tmp.sweep_ms,
                  "reconcile_ms", (json_int_t)tmp.reconcile_ms));
    json_t *ads = json_object();
    static const char *const lookups[] = {"none", "best_effort", "authoritative"};
    for (int i = 0; i < 4; i++)
        json_object_set_new(ads, adapters[i].name,
                            json_pack("{s:s,s:I,s:I,s:I}", "lookup", lookups[adapters[i].lookup],
                                      "ack_timeout_ms", (json_int_t)adapters[i].ack_timeout_ms,
                                      "quiet_ms", (json_int_t)adapters[i].quiet_ms, "traces",
                                      (json_int_t)x->adapter_traces[i]));
    json_object_set_new(t, "adapters", ads);
    json_object_set_new(t, "unknown_policy",
                        json_pack("{s:I,s:I}", "retry", (json_int_t)(x->traces - x->hold_traces),
                                  "hold", (json_int_t)x->hold_traces));
    json_object_set_new(t, "operator",
                        json_pack("{s:I,s:I,s:I}", "react_min_ms", (json_int_t)OP_REACT_MIN_MS,
                                  "react_max_ms", (json_int_t)OP_REACT_MAX_MS, "poll_ms",
                                  (json_int_t)OP_POLL_MS));
    return t;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

obx_err obx_sim_run(const obx_sim_options *o, char **out) {
    if (!o || !out) return obx__fail(OBX_EINVAL, "sim: NULL argument");
    obx__clear_error();
    *out = NULL;
    if (o->traces < 1 && o->replay < 0)
        return obx__fail(OBX_EINVAL, "traces: %ld is below 1", o->traces);
    if (o->jobs < 1 || o->jobs > 64)
        return obx__fail(OBX_EINVAL, "jobs: %d outside 1..64", o->jobs);
    obx_err e = obx__mutation_set(o->mutation);
    if (e) return e;
    if (o->db_url) { /* PostgreSQL: the schema once, before the workers' trace transactions */
        if (strncmp(o->db_url, "postgres://", 11) && strncmp(o->db_url, "postgresql://", 13))
            return obx__fail(OBX_EINVAL,
                             "db: the simulator runs on SQLite in memory (default) or a "
                             "postgres:// URL, not '%.40s'",
                             o->db_url);
        obx_store *s;
        if ((e = obx_store_open(o->db_url, &s))) return e;
        e = obx_store_init(s);
        obx_store_close(s);
        if (e) return e;
    }
    /* SQLite's memory statistics take a process-wide mutex on every allocation; the workers
     * share nothing else. Fails harmlessly (SQLITE_MISUSE) if SQLite is already initialized. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    obx__sim_malloc_install(); /* small blocks recycled per thread (sim_malloc.c) */
    run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    pthread_mutex_init(&r.mu, NULL);
    long n = o->replay >= 0 ? 1 : o->traces;
    r.hashes = calloc((size_t)n, sizeof *r.hashes);
    int jobs = o->replay >= 0 ? 1 : o->jobs;
    thr *t = calloc((size_t)jobs, sizeof *t);
    if (!r.hashes || !t) {
        free(r.hashes);
        free(t);
        return obx__fail(OBX_ENOMEM, "sim: out of memory");
    }
    int64_t t0 = obx__mono_ms();
    for (int i = 0; i < jobs; i++) {
        t[i].r = &r;
        t[i].id = i;
        pthread_create(&t[i].th, NULL, worker_main, &t[i]);
    }
    for (int i = 0; i < jobs; i++) pthread_join(t[i].th, NULL);
    int64_t t1 = obx__mono_ms();
    obx__mutation_set(NULL);
    free(t);
    if (r.err) {
        free(r.hashes);
        free(r.res_ms);
        pthread_mutex_destroy(&r.mu);
        return obx__fail(r.err, "%s", r.errmsg);
    }
    /* the trace hash: per-trace digests in trace order (independent of --jobs) */
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(r.hashes, (size_t)n * sizeof *r.hashes, md, &mdlen, EVP_sha256(), NULL);
    char hash[65];
    obx__hex(md, 32, hash);
    free(r.hashes);
    /* UNKNOWN resolution p99, virtual seconds */
    double p99 = 0, p50 = 0, maxs = 0;
    if (r.nres) {
        qsort(r.res_ms, r.nres, sizeof *r.res_ms, cmp_i64);
        p50 = (double)r.res_ms[(size_t)(0.50 * (double)(r.nres - 1))] / 1000.0;
        p99 = (double)r.res_ms[(size_t)(0.99 * (double)(r.nres - 1) + 0.5)] / 1000.0;
        maxs = (double)r.res_ms[r.nres - 1] / 1000.0;
    }
    free(r.res_ms);
    results *x = &r.total;
    bool all_fired = true;
    json_t *fired = json_object();
    for (int i = 0; i < F_COUNT; i++) {
        bool wanted = !o->faults_mask || (o->faults_mask >> i & 1);
        json_object_set_new(fired, fault_names[i], json_integer(x->fired[i]));
        if (wanted && n >= 2000 && x->fired[i] == 0) all_fired = false;
    }
    bool passed = x->unknown_unresolved == 0 && x->lost_events == 0 && x->second_event_ids == 0 &&
                  x->cross_destination_retries == 0 && x->digest_divergence == 0 &&
                  x->consumer_duplicate_effects == 0 && x->stale_claim_sends == 0 &&
                  x->late_ack_converged == x->late_ack_total && x->unknown_untraceable == 0 &&
                  x->internal_errors == 0 && x->liveness_failures == 0 &&
                  x->premature_purges == 0 && x->migrated_with_old_copy == 0 && p99 < 900.0 &&
                  all_fired;
    json_t *failing = json_array();
    for (long i = 0; i < x->nfailing; i++)
        json_array_append_new(failing, json_integer(x->failing[i]));
    double secs = (double)(t1 - t0) / 1000.0;
    json_t *j = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:o,s:s,s:b,s:I,s:I,s:I,s:I,s:f,"
        "s:f,s:f,s:f,s:i,s:o,s:s,s:s,s:b}",
        "traces", (json_int_t)x->traces, "seed", (json_int_t)o->seed, "lost_events",
        (json_int_t)x->lost_events, "second_event_ids", (json_int_t)x->second_event_ids,
        "cross_destination_retries", (json_int_t)x->cross_destination_retries, "digest_divergence",
        (json_int_t)x->digest_divergence, "consumer_duplicate_effects",
        (json_int_t)x->consumer_duplicate_effects, "late_ack_total", (json_int_t)x->late_ack_total,
        "late_ack_converged", (json_int_t)x->late_ack_converged, "unknown_total",
        (json_int_t)x->unknown_total, "unknown_untraceable", (json_int_t)x->unknown_untraceable,
        "unknown_resolved", (json_int_t)(r.nres - (size_t)x->unknown_unresolved), "unknown_p99_s",
        p99, "faults_fired", fired, "trace_hash", hash, "passed", (int)passed, "stale_claim_sends",
        (json_int_t)x->stale_claim_sends, "internal_errors", (json_int_t)x->internal_errors,
        "liveness_failures", (json_int_t)x->liveness_failures, "quarantined_receipts",
        (json_int_t)x->quarantined, "unknown_p50_s", p50, "unknown_max_s", maxs, "seconds", secs,
        "traces_per_second", secs > 0 ? (double)x->traces / secs : 0.0, "jobs", jobs,
        "failing_traces", failing, "first_failure", x->first_failure, "mutation",
        o->mutation ? o->mutation : "none", "every_fault_fired", (int)all_fired);
    json_object_set_new(j, "premature_purges", json_integer(x->premature_purges));
    json_object_set_new(j, "purged", json_integer(x->purged));
    json_object_set_new(j, "migrated", json_integer(x->migrated));
    json_object_set_new(j, "migration_refused", json_integer(x->migration_refused));
    json_object_set_new(j, "migrated_with_old_copy", json_integer(x->migrated_with_old_copy));
    json_object_set_new(j, "store", json_string(o->db_url ? "postgres" : "sqlite"));
    /* every UNKNOWN ends: the open ones (they count in the percentile as never resolved), the
     * events held for an operator and what the operator actor did */
    json_object_set_new(j, "unknown_unresolved", json_integer(x->unknown_unresolved));
    json_object_set_new(j, "unknown_held", json_integer(x->held));
    json_object_set_new(j, "operator_resolutions",
                        json_pack("{s:I,s:I}", "retry", (json_int_t)x->op_retries, "accept",
                                  (json_int_t)x->op_accepts));
    json_object_set_new(j, "races_observed",
                        json_pack("{s:I,s:I}", "unknown_racing_retry_claim",
                                  (json_int_t)x->racing_observed, "both_attempts_acked",
                                  (json_int_t)x->both_acked_observed));
    json_object_set_new(j, "timing", timing_json(x));
    pthread_mutex_destroy(&r.mu);
    return obx__json_out(j, out);
}

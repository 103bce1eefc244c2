/*
 * sim.h — what the simulator's files share (internal to src/sim; the entry points are in
 * include/obx_test.h): the fault classes, a worker's world and trace state (wk), the actors, the
 * per-trace results, the seeded RNG and trace-hash helpers, and the functions each file
 * offers the others. The files:
 *   scheduler.c  the trace's phases under the virtual clock, the worker threads, obx_sim_run
 *   faults.c     the fault classes: which are on in a trace, their injection between steps
 *   actors.c     producer, dispatchers, reconciler, consumers, purger, migrator, operator
 *   checkers.c   the invariants checked after each trace
 *   snapshot.c   what the outbox holds, read through the store interface (checkers, clock)
 *   world.c      a worker's stores, inboxes and simulated cluster, the trace's outer
 *                transactions
 *   report.c     the per-trace results summed and the JSON report
 *   sim_malloc.c SQLite's allocator while the simulator runs
 * The simulator runs no SQL: the outbox and the inboxes are read and written through the store
 * interface, the business tables through the application doubles (src/app/app.h).
 * Determinism: everything a trace draws comes from its wk's RNG (rnd) in a fixed order; a
 * change of that order changes the trace_hash.
 */
#ifndef OBX_SIM_INTERNAL_H
#define OBX_SIM_INTERNAL_H

#include "broker/sim/sim.h"
#include "drivers/drivers.h"
#include "obx_test.h"

#include "app/app.h"

#include <stdarg.h>
#include <stdio.h>

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
    X(MIGRATION_UNQUERYABLE, "old-target-unqueryable-during-migration")                            \
    X(FORGED_BODY, "copy-good-headers-other-body")                                                 \
    X(CORRUPT_BEFORE_GENUINE, "corrupt-copy-before-genuine")                                       \
    X(FOREIGN_COPY, "foreign-copy")                                                                \
    X(LATE_REJECTION, "late-rejection")                                                            \
    X(CONCURRENT_INSTANCES, "concurrent-consumer-instances")                                       \
    X(RELAY_CLOCK_STEP, "relay-clock-step")                                                        \
    X(DELAYED_EVENT, "delayed-event")                                                              \
    X(HANDLER_BACKOFF, "handler-backoff")

enum {
#define F(n, s) F_##n,
    FAULT_LIST(F)
#undef F
        F_COUNT
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
    /* issue 46: the operator's paths, the evidence, the consumers' instances */
    long published_without_evidence, route_changed_by_dry_run_or_refusal, genuine_copy_parked,
        attempts_left_open, handler_runs_twice, purged_without_matching_evidence;
    long op_dry_runs, op_refusals, op_false_accepts, op_false_refused, op_redrives;
    /* issue 51 (item 3): delayed events and handler retries with back-off */
    long published_before_not_before, retry_before_due, delayed_events, retries_delayed;
    long adapter_traces[4], hold_traces;
    long fired[F_COUNT];
    long failing[16];
    long nfailing;
    char first_failure[512];
} results;

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

/* The adapters a trace may run on (scheduler.c). */
extern const adapter obx__sim_adapters[4];

/* An on-call operator reacts to a held UNKNOWN (alert, look, `obx resolve`) after this long
 * (drawn per trace), and looks again every OP_POLL_MS. */
#define OP_REACT_MIN_MS 120000
#define OP_REACT_MAX_MS 600000
#define OP_POLL_MS 60000
/* The resolution time an unresolved UNKNOWN counts with (a thousand years). */
#define UNRESOLVED_MS (INT64_C(1000) * 365 * 86400000)

#define MAX_DL 16

/* The relay's simulated round trip to the database server (actors.c, clock_sync): the relay's
 * reference clock is off the server's by up to half of it ("One clock"), so a delayed event may
 * be claimed that much before its time, and no more (checkers.c). */
#define SIM_DB_RTT_MS 10

typedef struct actor {
    int kind, index, incarnation;
    int instance; /* consumers: two instances share a consumer ID (index), its inbox and group */
    char owner[48];
    obx__engine e;
    obx__broker *b;
    int64_t paused_until;
    obx__rows held;
    size_t held_pos;
    /* producer */
    int next_cmd, retry_cmd;
    obx__ulid_gen gen;
    /* dispatchers and the reconciler (the relay's actors): their host's clocks, read as
     * k->now + mono_base (monotonic) and k->now + host_off (wall: relay-clock-step steps it),
     * and the reference clock they decide on (actors.c, relay_now): the monotonic clock plus
     * ref_off, measured at the last read of the database server's clock (at mono synced_at) */
    int64_t mono_base, host_off, ref_off, synced_at;
    bool clock_synced;
    /* consumer: a failed message's retry is not due before wait_until (ms, the inbox's
     * retry_at): the consumer fetches nothing until then (a paused partition), in memory only */
    int64_t wait_until;
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

#define MAX_ACTORS 11
#define MAX_EVENTS 8

typedef struct wk {
    int id;
    const obx_sim_options *o;
    char wname[48], wurl[64];
    obx__sim_world *w;
    obx__app_producer *shop;   /* the producing service: its database (SQLite in memory, or
                                  PostgreSQL with --db), business rows and the outbox ... */
    obx_store *os;             /* ... whose store this is (borrowed from shop) */
    obx__app_consumer *app[2]; /* the consuming services: databases, effects ... */
    obx_store *cs[2];          /* ... and inbox stores (borrowed from app[i]) */
    obx_inbox *in[2];
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
    /* issue 51 (item 3), drawn in faults.c: each command's delay (0: none) and the not_before
     * its event was committed with, per event ID the producer was told (event_ids); per consumer
     * ID and command the handler failures still to come and when the inbox said its retry is
     * due (0: no failure seen; cleared when applied); the inboxes' back-off */
    int64_t delay_ms[MAX_EVENTS], not_before[MAX_EVENTS][2];
    unsigned char fail_left[2][MAX_EVENTS];
    int64_t retry_at[2][MAX_EVENTS];
    int64_t backoff_ms, backoff_max_ms;
    /* handler runs per consumer ID and command (event_ids[c][0]), counted from outside the
     * transaction: an effect outside the database runs once (issue 46, item 7) */
    unsigned char runs[2][MAX_EVENTS];
    results r;
    char failure[512];
    int64_t *res_ms;
    size_t nres, capres;
    /* the checkers' envelope reads of one check (checkers.c, envelope_of): the outbox does not
     * change while they run, and they read one generation for each receipt and message of it */
    struct env_memo {
        char id[OBX_EVENT_ID_LEN + 1];
        int32_t gen;
        obx_err err;
        obx__envelope_at_row env;
    } env_memo[8];
    size_t n_env_memo;
} wk;

/* ---- the trace's RNG, its hash and its narration (tiny: inline in every file) ---- */

static inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t rnd(wk *k) {
    k->rng = mix(k->rng);
    return k->rng;
}

static inline bool chance(wk *k, double p) {
    return p > 0 && (double)(rnd(k) >> 11) / (double)(1ull << 53) < p;
}

static inline void h_add(wk *k, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        k->hash ^= (v >> (i * 8)) & 0xff;
        k->hash *= 0x100000001b3ull;
    }
}

static inline void h_str(wk *k, const char *s) {
    for (; *s; s++) {
        k->hash ^= (unsigned char)*s;
        k->hash *= 0x100000001b3ull;
    }
}

static inline void logv(wk *k, const char *fmt, ...) OBX__PRINTF(2, 3);
static inline void logv(wk *k, const char *fmt, ...) {
    if (!k->verbose) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  t=%-8lld ", (long long)(k->now - 1700000000000LL));
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static inline void fail(wk *k, const char *fmt, ...) OBX__PRINTF(2, 3);
static inline void fail(wk *k, const char *fmt, ...) {
    if (k->failure[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->failure, sizeof k->failure, fmt, ap);
    va_end(ap);
    logv(k, "VIOLATION: %s", k->failure);
}

/* An engine error is expected only where a fault was injected; anything else is a defect. */
static inline void check_err(wk *k, const actor *a, obx_err e, const char *what) {
    if (!e) return;
    k->r.internal_errors++;
    fail(k, "%s: %s failed: %s: %s", a->owner, what, obx_errname(e), obx_errmsg());
}

/* ---- the business rows as the checkers read them (src/app) ---- */
typedef struct obx__sim_orders { /* the event IDs the business rows point at */
    char event_id[MAX_EVENTS][OBX_EVENT_ID_LEN + 1];
    size_t n;
} obx__sim_orders;

/* ---- world.c: a worker's world ---- */
/* The relay's shipped defaults into k->base, k->sweep_ms, k->reconcile_ms. */
obx_err obx__sim_shipped_timings(wk *k);
obx_err obx__sim_wk_init(wk *k, int id, const obx_sim_options *o);
void obx__sim_wk_free(wk *k);
/* BEGIN / ROLLBACK of the trace's outer transactions (the outbox and each consumer). */
void obx__sim_trace_begin(wk *k);
void obx__sim_trace_end(wk *k);

/* ---- snapshot.c: the outbox read through the store interface ---- */
typedef struct obx__sim_snap_event { /* one event's rows (owned) */
    obx__attempt_row *att;
    size_t natt;
    obx__receipt_row *rc;
    size_t nrc;
    obx__audit_row *au;
    size_t nau;
} obx__sim_snap_event;
typedef struct obx__sim_snap {
    obx__rows ev;           /* every event, in commit order (seq) */
    obx__sim_snap_event *x; /* full snapshots: x[i] belongs to ev.v[i]; else NULL */
} obx__sim_snap;
/* Reads every event (full: with its attempts, receipts and audit) into s; on failure s is
 * empty. Free with obx__sim_snap_free. */
obx_err obx__sim_snap_load(wk *k, bool full, obx__sim_snap *s);
void obx__sim_snap_free(obx__sim_snap *s);
/* The states an event is done in: published, retained, purged. */
bool obx__sim_published(obx__state st);

/* ---- faults.c ---- */
/* Draws which fault classes are on in this trace and resets the simulated cluster with them;
 * leaves k->p[] as per-step injection probabilities. */
void obx__sim_faults_draw(wk *k);
/* The faults injected between two steps of the fault phase (crash, pause, route revision,
 * an unqueryable target). */
void obx__sim_faults_between(wk *k, bool unordered);
/* Faults stop: the cluster's network keeps its timings and loses its faults; nobody paused. */
void obx__sim_faults_stop(wk *k);
/* Adds the cluster's fired faults to the trace's results. */
void obx__sim_faults_collect(wk *k);

/* ---- actors.c ---- */
/* The trace's actors drawn and started. */
void obx__sim_actors_setup(wk *k);
/* One step of actor a (the fault phase's unit of interleaving). */
void obx__sim_step(wk *k, actor *a);
/* Actor i's turn in a liveness round: it runs everything it has to do. */
void obx__sim_actor_live(wk *k, int i);
/* The actor loses its memory and restarts. */
void obx__sim_actor_crash(wk *k, actor *a);
void obx__sim_actor_stop(actor *a);
/* The route of order.created.v1 to topic, with the trace's UNKNOWN policy. */
void obx__sim_route(wk *k, const char *topic, bool unordered);
/* The earliest time a consumer's failed message is due to be retried (its failure row's next_at,
 * as the inbox answered), after k->now; INT64_MAX: none. The scheduler wakes the consumers then
 * (scheduler.c, next_due), as it wakes the relay at a delayed event's not_before (available_at). */
int64_t obx__sim_retry_next_at(const wk *k);
/* The command event_id answers (k->event_ids), or -1. */
int obx__sim_cmd_of(const wk *k, const char *event_id, int *slot);

/* ---- checkers.c ---- */
/* The invariants after a trace; violations go to k->r and k->failure. */
void obx__sim_check_trace(wk *k);
/* Everything committed, published and applied by every consumer. */
bool obx__sim_quiescent(wk *k, const obx__sim_snap *s);

/* ---- report.c ---- */
void obx__sim_results_add(results *a, const results *b);
/* The JSON report of a run (obx_sim_run's output); secs: its wall time. */
typedef struct obx__sim_summary {
    const obx_sim_options *o;
    const results *x;
    const char *hash;
    size_t nres; /* UNKNOWN resolution times */
    double p50, p99, maxs, secs;
    int jobs;
    long n;
} obx__sim_summary;
json_t *obx__sim_report(const obx__sim_summary *s);

/* The simulator's SQLite allocator (sim_malloc.c): installs per-thread small-block recycling
 * as SQLite's allocator, once per process, before SQLite is initialized; false (nothing
 * changed) when SQLite already runs or in an ASan build. */
bool obx__sim_malloc_install(void);

#endif

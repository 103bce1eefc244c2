/*
 * engine.h — the protocol as step functions over a store and a broker (DESIGN.md §2-§8).
 * No threads, no sleeps, no clock reads: every function takes `now` (ms) from its driver, so
 * the simulator runs exactly this code under a virtual clock.
 *
 * An obx__engine is one actor's view: one store connection, one broker connection (may be
 * NULL for actors that never send), an owner name, and counters. Drivers (relay threads,
 * the simulator's actors) each own one.
 */
#ifndef OBX_ENGINE_H
#define OBX_ENGINE_H

#include "broker/broker.h"
#include "store/store.h"

#include <jansson.h>
#include <pthread.h>

/* "<prefix><ULID>" with time now; gen NULL = the process-wide generator. */
obx_err obx__new_id(obx__ulid_gen *gen, const char *prefix, int64_t now, char *out, size_t cap);

/* ---- producer (enqueue.c) ---- */
obx_err obx__route_validate(const obx_route *r, obx__route_row *row, int64_t now);
obx_err obx__route_set_at(obx__store *s, const obx_route *r, int64_t now, int64_t *gen);
obx_err obx__enqueue_at(obx__store *s, const obx_event *ev, int64_t now, obx__ulid_gen *gen,
                        obx_enqueue_result *out);
void obx__dest_from_route(const obx__route_row *route, const obx__envelope *env, obx__dest *d,
                          const char *routing_key);
json_t *obx__route_json(const obx__route_row *r);

/* ---- JSON helpers (inspect.c) ---- */
obx_err obx__json_out(json_t *j, char **out);
json_t *obx__event_json(const obx__event_row *r);
json_t *obx__attempt_json(const obx__attempt_row *a);
json_t *obx__receipt_json(const obx__receipt_row *r);
json_t *obx__audit_json(const obx__audit_row *a);
obx_err obx__inspect_json(obx__store *s, const char *event_id, json_t **out);

/* ---- mutations (test-only builds: OBX_MUTATIONS) ------------------------------------------
 * Deliberate protocol bugs, selected at run time by name, so that tests can prove the
 * simulator's gate and the invariant checkers catch each of them. In normal builds
 * OBX__MUTANT(x) is the constant false and the compiler removes the branch. */
#define OBX__MUTATION_LIST(X)                                                                      \
    X(ACCEPT_STALE_DIGEST, "accept-stale-digest")                                                  \
    X(STALE_CLAIM_SENDS, "stale-claim-sends")                                                      \
    X(RETRY_OTHER_DESTINATION, "retry-other-destination")                                          \
    X(SKIP_INBOX_DEDUPE, "skip-inbox-dedupe")                                                      \
    X(PURGE_BEFORE_WATERMARK, "purge-before-watermark")                                            \
    X(ACCEPT_SUPERSEDED_GEN, "accept-superseded-generation")                                       \
    X(IGNORE_IDEMPOTENCY_KEY, "ignore-idempotency-key")                                            \
    X(DROP_DUPLICATE_RECEIPT, "drop-duplicate-receipt")                                            \
    X(MIGRATE_WHILE_UNKNOWN, "migrate-while-unknown")

typedef enum obx__mutation {
    OBX__MUT_NONE,
#define OBX__M(n, s) OBX__MUT_##n,
    OBX__MUTATION_LIST(OBX__M)
#undef OBX__M
        OBX__MUT_COUNT
} obx__mutation;

#ifdef OBX_MUTATIONS
extern obx__mutation obx__active_mutation;
#define OBX__MUTANT(name) (obx__active_mutation == OBX__MUT_##name)
#else
#define OBX__MUTANT(name) 0
#endif
/* Selects a mutation by name ("" or NULL = none). OBX_EUNSUPPORTED without OBX_MUTATIONS. */
obx_err obx__mutation_set(const char *name);
const char *obx__mutation_name(obx__mutation m);

/* ---- the engine ----------------------------------------------------------------------------- */

typedef struct obx__engine_cfg {
    char owner[OBX__OWNER_MAX + 1]; /* who, in audit rows and claims */
    int64_t lease_ms;               /* claim and SENDING lease */
    int64_t reconcile_lease_ms;     /* RECONCILING / RETRY_CLAIMED lease */
    int64_t recheck_ms;             /* CANNOT_TELL: next lookup after this (doubles, capped) */
    int64_t recheck_max_ms;
    int64_t backoff_base_ms; /* definite rejection: retry after base * 2^(n-1), +-20% jitter */
    int64_t backoff_max_ms;
    size_t batch;     /* events per claim / sweep / reconcile step */
    bool own_cluster; /* only claim events whose frozen cluster is the broker's (default) */
    const char *const *aliases; /* dispatcher aliases served (NULL = all) */
    size_t n_aliases;
    uint64_t seed; /* jitter RNG and ID generator seed; 0 = from the OS */
} obx__engine_cfg;

void obx__engine_cfg_defaults(obx__engine_cfg *c);

typedef struct obx__engine_stats {
    int64_t claimed, sent, stale_refused, accepted, duplicates, quarantined, rejected, not_sent,
        unknown, swept, retries, parked, reconciled_found, reconciled_not_found,
        reconciled_cannot_tell, released, store_errors, broker_errors;
    /* resolution time of UNKNOWN episodes (unknown_since -> PUBLISHED), ms */
    int64_t unknown_resolved;
    int64_t unknown_resolve_ms_max;
} obx__engine_stats;

/* Per-event notes for logs and metrics (the relay's), delivered after the transaction that
 * made the change committed, so a rolled-back or retried transaction never reports. Strings
 * are borrowed for the duration of the call. */
typedef enum obx__note_kind {
    OBX__NOTE_PUBLISHED,   /* a receipt filled the publish slot */
    OBX__NOTE_DUPLICATE,   /* a valid receipt after the slot was full (kept as evidence) */
    OBX__NOTE_QUARANTINED, /* a receipt contradicting the frozen event (alarm) */
    OBX__NOTE_UNKNOWN,     /* an attempt's outcome became unknown (timeout, lost ACK, sweep) */
    OBX__NOTE_REJECTED,    /* a definite rejection (back to PENDING with backoff) */
    OBX__NOTE_NOT_SENT,    /* definitely not sent (broker down before the send) */
    OBX__NOTE_PARKED,      /* rejected max_attempts times: an operator must requeue it */
    OBX__NOTE_RETRY,       /* the reconciler retries to the frozen target */
} obx__note_kind;

typedef struct obx__note {
    obx__note_kind kind;
    const char *event_id;
    const char *attempt_id;
    const char *correlation_id; /* "" when unknown (a receipt for an event never committed) */
    int64_t latency_ms;         /* PUBLISHED: from the event's commit to its acceptance; else -1 */
    int64_t unknown_ms;         /* PUBLISHED ending an UNKNOWN episode: its length; else -1 */
    const char *detail;         /* reason or the broker's words; never NULL */
} obx__note;

const char *obx__note_kind_name(obx__note_kind k);

typedef struct obx__engine {
    obx__store *s;
    obx__broker *b; /* may be NULL: actors that never send or look up */
    obx__engine_cfg cfg;
    char cluster[OBX_NAME_MAX + 1]; /* the broker's cluster identity */
    obx__ulid_gen gen;
    uint64_t rng;
    obx__engine_stats st;
    /* Optional observer of resolution times (simulator, metrics): called for every event whose
     * UNKNOWN episode ended in PUBLISHED, with the episode's length in ms. */
    void (*on_unknown_resolved)(void *user, const char *event_id, int64_t ms);
    void *on_unknown_resolved_user;
    /* Optional observer of quarantines and alarms (log line, counter). */
    void (*on_alarm)(void *user, const char *event_id, const char *what);
    void *on_alarm_user;
    /* Optional observer of per-event notes (see obx__note). */
    void (*on_note)(void *user, const obx__note *n);
    void *on_note_user;
} obx__engine;

/* Binds an engine to a store and a broker (both borrowed; they must outlive the engine). */
obx_err obx__engine_init(obx__engine *e, obx__store *s, obx__broker *b, const obx__engine_cfg *c);

/* One dispatcher cycle: claim a batch, register attempts, hand them to the broker. Returns the
 * number of messages sent in *sent. (dispatch.c) */
obx_err obx__engine_dispatch(obx__engine *e, int64_t now, size_t *sent);
/* Sub-steps, exposed for the simulator and fault tests. */
obx_err obx__engine_claim(obx__engine *e, int64_t now, obx__rows *claimed);
/* Registers attempts for the given rows (CLAIMED or RETRY_CLAIMED under this engine's claim)
 * and sends those whose registration succeeded. Stale ones get an audit row and are not sent.
 * actor is DISPATCHER or RECONCILER. */
obx_err obx__engine_begin_attempts(obx__engine *e, int64_t now, obx__event_row *rows, size_t n,
                                   obx__actor actor, size_t *sent);
/* Collects broker outcomes (waiting up to timeout_ms for the first) and applies them. */
obx_err obx__engine_poll(obx__engine *e, int64_t now, int timeout_ms, size_t *applied);
obx_err obx__engine_apply_outcomes(obx__engine *e, int64_t now, const obx__outcome *o, size_t n);
/* SENDING past its lease -> DISPATCH_UNKNOWN (attempt UNKNOWN). */
obx_err obx__engine_sweep(obx__engine *e, int64_t now, size_t *swept);
/* CLAIMED by this engine and not yet sent -> PENDING (clean shutdown). */
obx_err obx__engine_release(obx__engine *e, int64_t now, const char *const *ids, size_t n);

/* The single acceptance point (accept.c): the only code that sets PUBLISHED. One transaction
 * for the batch; results[i] (may be NULL) gets the receipt kind each outcome ended as. */
obx_err obx__accept_receipts(obx__engine *e, int64_t now, const obx__outcome *acks, size_t n,
                             obx__receipt_kind *results);

/* Reconciler (reconcile.c): DISPATCH_UNKNOWN -> RECONCILING -> lookup -> PUBLISHED |
 * RETRY_CLAIMED (-> SENDING) | DISPATCH_UNKNOWN. */
obx_err obx__reconcile_step(obx__engine *e, int64_t now, size_t *handled);
/* Its sub-steps (the simulator interleaves them with other actors):
 *   begin  — take due events as RECONCILING (or take over an expired RETRY_CLAIMED), rows with
 *            payload into *held (the caller frees);
 *   lookup — ask the broker about one held event (no store writes);
 *   apply  — FOUND: the acceptance point; NOT_FOUND / CANNOT_TELL: the fenced decision. On
 *            return row->state is RETRY_CLAIMED when a retry must be sent next with
 *            obx__engine_begin_attempts(..., OBX__ACT_RECONCILER, ...). */
obx_err obx__reconcile_begin(obx__engine *e, int64_t now, obx__rows *held);
obx_err obx__reconcile_lookup(obx__engine *e, int64_t now, const obx__event_row *row,
                              obx__lookup_res *res);
obx_err obx__reconcile_apply(obx__engine *e, int64_t now, obx__event_row *row,
                             obx__lookup_res *res);

/* Operator (ops.c). */
obx_err obx__requeue(obx__store *s, const char *event_id, const char *who, int64_t now);

#endif /* OBX_ENGINE_H */

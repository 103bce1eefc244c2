/*
 * engine.h — the protocol as step functions over a store and a broker (docs/design.md, from
 * "States" to "Audit and retention"). No threads, no sleeps, no clock reads: every function
 * takes `now` (ms) from its driver, so the simulator runs exactly this code under a virtual
 * clock.
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
/* Validates r and checks its contracts against the cluster registry (nothing written): the rows
 * obx__route_put_rows writes. */
obx_err obx__route_prepare(obx__store *s, const obx_route *r, int64_t now, obx__route_row *row,
                           obx__route_set_row *set);
obx_err obx__enqueue_at(obx__store *s, const obx_event *ev, int64_t now, obx__ulid_gen *gen,
                        obx_enqueue_result *out);
void obx__dest_from_route(const obx__route_row *route, const obx__envelope *env, obx__dest *d,
                          const char *routing_key);
json_t *obx__route_json(const obx__route_row *r);
/* A message's header fields from the JSON a poison row or a kept copy stores them as (name ->
 * value; the strings point into hj); the caller sets the event ID, bytes and position. */
obx_message obx__message_of_headers(const json_t *hj);

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
 * OBX__MUTANT(x) is the constant false and the compiler removes the branch. relay-host-clock is
 * in the simulator's model of the relay's clock (src/sim/actors.c; the driver's clock_sync). */
#define OBX__MUTATION_LIST(X)                                                                      \
    X(ACCEPT_STALE_DIGEST, "accept-stale-digest")                                                  \
    X(STALE_CLAIM_SENDS, "stale-claim-sends")                                                      \
    X(RETRY_OTHER_DESTINATION, "retry-other-destination")                                          \
    X(SKIP_INBOX_DEDUPE, "skip-inbox-dedupe")                                                      \
    X(PURGE_BEFORE_WATERMARK, "purge-before-watermark")                                            \
    X(ACCEPT_SUPERSEDED_GEN, "accept-superseded-generation")                                       \
    X(IGNORE_IDEMPOTENCY_KEY, "ignore-idempotency-key")                                            \
    X(DROP_DUPLICATE_RECEIPT, "drop-duplicate-receipt")                                            \
    X(MIGRATE_WHILE_UNKNOWN, "migrate-while-unknown")                                              \
    X(RECONCILE_GUESS, "reconcile-guess-published")                                                \
    X(SWEEP_FORGETS_ATTEMPT, "sweep-forgets-attempt")                                              \
    X(STAY_UNKNOWN, "stay-unknown")                                                                \
    X(LOOKUP_TRUSTS_HEADER, "lookup-trusts-header")                                                \
    X(ROUTE_BEFORE_DECISION, "route-before-decision")                                              \
    X(PARK_BY_EVENT_ID, "park-by-event-id")                                                        \
    X(SUPERSEDED_STAY_OPEN, "superseded-stay-open")                                                \
    X(HANDLER_BEFORE_CLAIM, "handler-before-claim")                                                \
    X(PURGE_ANY_INBOX_ROW, "purge-any-inbox-row")                                                  \
    X(ACCEPT_UNREAD_OFFSET, "accept-unread-offset")                                                \
    X(RELAY_HOST_CLOCK, "relay-host-clock")                                                        \
    X(CLAIM_DELAYED_EARLY, "claim-delayed-early")                                                  \
    X(INBOX_IGNORES_NEXT_AT, "inbox-ignores-next-at")

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
    size_t batch; /* events per claim / sweep / reconcile step */
    /* the largest payload a claim reads, in bytes (0: the outbox's payload limit); a larger
     * event is parked with an alarm, never read whole nor sent (relay.max_payload) */
    size_t max_payload;
    bool own_cluster; /* only claim events whose frozen cluster is the broker's (default) */
    const char *const *aliases; /* dispatcher aliases served (NULL = all) */
    size_t n_aliases;
    uint64_t seed; /* jitter RNG and ID generator seed; 0 = from the OS */
    /* The critical consumers whose inboxes the reconciler consults before a same-target retry
     * or a hold (consumer evidence, resolve.c). Borrowed; their stores may change between
     * steps (the driver reopens lost connections); a consumer whose query fails is skipped
     * and gets failed = true. NULL/0: none. */
    struct obx__critical *evidence;
    size_t n_evidence;
    /* The key ring payloads of encrypted routes are sealed with before the send and their
     * broker copies opened with by lookups (seal.c). Borrowed; NULL: no key (an event of an
     * encrypted route is then parked, never sent in the clear). */
    const obx_keyring *keys;
} obx__engine_cfg;

void obx__engine_cfg_defaults(obx__engine_cfg *c);

typedef struct obx__engine_stats {
    int64_t claimed, sent, stale_refused, accepted, duplicates, quarantined, rejected, not_sent,
        unknown, swept, retries, parked, reconciled_found, reconciled_not_found,
        reconciled_cannot_tell, reconciled_evidence, released, store_errors, broker_errors;
    /* resolution time of UNKNOWN episodes (unknown_since -> PUBLISHED), ms */
    int64_t unknown_resolved;
    int64_t held; /* UNKNOWN events this engine held for an operator */
    int64_t unknown_resolve_ms_max;
    /* claim transactions of obx__engine_dispatch that committed, and those that found nothing
     * (a look for work in vain: what polling and wake-ups cost the store) */
    int64_t claims, empty_claims;
    /* copies a lookup found under an event's ID whose bytes are not its message (corrupt or
     * foreign): each is quarantined with an alarm and never fills the publish slot */
    int64_t corrupt_copies;
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
    OBX__NOTE_HELD,        /* an UNKNOWN was held for an operator (obx resolve) */
    OBX__NOTE_RESOLVED,    /* an operator resolved an UNKNOWN (retry or accept) */
} obx__note_kind;

typedef struct obx__note {
    obx__note_kind kind;
    const char *event_id;
    const char *attempt_id;
    const char *correlation_id; /* "" when unknown (a receipt for an event never committed) */
    int64_t latency_ms;         /* PUBLISHED: from the event's commit to its acceptance; else -1 */
    int64_t unknown_ms;         /* PUBLISHED ending an UNKNOWN episode: its length; else -1 */
    const char *detail;         /* reason or the broker's words; never NULL */
    /* For spans (drivers/otel.c): the event row as the committed transaction left it, and the
     * number of the attempt the note is about (0 and NULL when not known); PUBLISHED,
     * DUPLICATE, QUARANTINED: what proved the receipt. */
    const obx__event_row *ev;
    int32_t attempt_gen;
    obx__receipt_source source;
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
    /* seal.c: the key ID ("" none) of the route generations seen, most recent 32 */
    struct {
        int64_t gen;
        char key[OBX_KEY_ID_MAX + 1];
    } key_cache[32];
    size_t n_keys_cached, key_cache_next;
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
/* The same, for receipts proved by something other than the broker's confirm of a send: a
 * lookup, a critical consumer's inbox row, an operator's evidence. The rules do not change;
 * the receipts record their source, the audit rows the note (may be NULL). */
obx_err obx__accept_receipts_from(obx__engine *e, int64_t now, const obx__outcome *acks, size_t n,
                                  obx__receipt_kind *results, obx__receipt_source source,
                                  const char *note);

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
obx_err obx__cancel(obx__store *s, const char *event_id, const char *who, const char *reason,
                    int64_t now);

/* ---- retention (purge.c) and the three-set audit (audit.c), docs/retention.md
 * -------------------- Definitions (docs/retention.md has them with examples): critical consumer C
 * declared in configuration (audit.critical_consumers, "ID=URL"): its inbox in the database at URL
 * is evidence of what it consumed. evidence(C, E)        C's inbox holds a consume receipt for E,
 * or E was published at or before C's forced watermark F_C (an operator's signed-off declaration
 *                         that C needs nothing published up to then: a decommissioned or
 *                         rebuilt consumer). Offsets are never evidence: a consumer's offset
 *                         moves past events it parked as poison, and AMQP queues have none.
 *   publication order     (published_at, seq).
 *   forced consumer watermark
 *                         the place, in publication order, of the oldest event that is
 *                         PUBLISHED or RETAINED and lacks evidence from some critical consumer
 *                         (none: no limit). It is the minimum over the critical consumers of
 *                         each one's own watermark (its oldest gap), and F_C moves a consumer's
 *                         own watermark forward. Events strictly before it are "behind" it.
 *   PUBLISHED -> RETAINED evidence from every critical consumer.
 *   RETAINED -> PURGED    (1) the replay window is over: published_at + replay_window_ms <= now;
 *                         (2) the event is behind the forced consumer watermark;
 *                         (3) evidence from every critical consumer, checked again in the purge
 *                         transaction (a consumer restored from a backup may have lost it).
 *   No critical consumer declared: nothing is retained — an ACK alone never purges.
 * So for every critical consumer, everything published after its watermark still has its
 * payload: an operator can always replay a consumer from its watermark. */

/* The forced watermark lives in the consumer's own database, as a marker row of
 * obx_consumer_watermark (this topic, this partition; offset = the forced time in ms, kept
 * monotonic by the store like any watermark) plus a consume audit row (outcome
 * WATERMARK_FORCED: who, why, the previous value). No real delivery has partition -1. */
#define OBX__FORCED_TOPIC "(forced)"
#define OBX__FORCED_PARTITION (-1)
#define OBX__FORCED_OUTCOME "WATERMARK_FORCED"

typedef struct obx__critical {
    char id[OBX_NAME_MAX + 1]; /* consumer_id in its inbox */
    obx__store *s;             /* its database (borrowed) */
    int64_t forced;            /* F_C, ms since the epoch; 0: never forced (obx__critical_load) */
    int64_t forced_at;         /* when it was last forced */
    bool failed;               /* consumer evidence: the last query of its database failed */
} obx__critical;

/* Reads c->forced and c->forced_at from the consumer's database. */
obx_err obx__critical_load(obx__critical *c);
/* Moves C's forced watermark to `until` (<= now; only forward), with who and why, in one
 * transaction on the consumer's database. OBX_EREFUSED when it would not move forward. */
obx_err obx__critical_force(obx__critical *c, int64_t until, int64_t now, const char *who,
                            const char *reason);

/* Evidence that the broker accepted event `row` (its current envelope generation) from the
 * critical consumers' inboxes (resolve.c): the first consumer whose consume receipt carries
 * the event's wire ID, generation, an attempt and the frozen destination digest. *out (kind
 * ACK) is a receipt for the acceptance point; *found false when none has one. who (may be
 * NULL) gets the consumer's ID. */
obx_err obx__consumer_evidence(obx__critical *cs, size_t n, const obx__event_row *row,
                               obx__outcome *out, bool *found, char *who, size_t who_cap);

/* An operator's resolution of UNKNOWN outcomes (resolve.c; docs/operations.md). */
typedef struct obx__resolve_req {
    const char *const *ids; /* by event ID (slot ID for a delivery-set target), or: */
    size_t n_ids;
    obx__event_filter filter; /* a selector (n_ids == 0): event_type, held, unknown_before;
                                 states are always DISPATCH_UNKNOWN */
    bool accept;              /* false: retry to the frozen destination; true: accept evidence */
    /* accept, evidence found at the broker (exactly one event ID): */
    const char *topic;          /* NULL/"" = the frozen topic; another one is refused */
    int32_t partition;          /* -1 = the pinned partition; another one is refused */
    int64_t offset;             /* >= 0 */
    const char *payload_digest; /* the digest the message carries; must be the frozen one */
    const char *attempt_id;     /* NULL/"" = the newest outstanding attempt */
    /* accept, evidence from a consumer's inbox instead (selector allowed): */
    obx__critical *consumer;
    const char *who;    /* required: audit rows and receipts */
    const char *reason; /* required */
    bool dry_run;       /* decide and report, write nothing */
} obx__resolve_req;

/* One decision per event into *out ({"action", "dry_run", "resolved", "refused", "events":
 * [{"event_id", "result": retry|published|duplicate|refused|quarantined|dry-run, "detail"}]});
 * *n_refused counts the events nothing could be done for (each item says why). Bad arguments
 * are an error naming the field, with nothing changed. Each event is its own transaction. */
obx_err obx__resolve(obx__engine *e, int64_t now, const obx__resolve_req *req, json_t **out,
                     size_t *n_refused);

typedef struct obx__retention_cfg {
    obx__critical *consumers; /* with forced watermarks loaded */
    size_t n_consumers;
    int64_t replay_window_ms; /* >= 0 */
    size_t batch;             /* rows per transaction, >= 1 */
    bool dry_run;             /* decide and report, write nothing, lock nothing */
    const char *who;          /* audit rows' who (OBX__CS_OWNER) */
    size_t max_listed;        /* decisions kept in the result; the counts are always exact */
} obx__retention_cfg;

typedef struct obx__ret_item {
    char event_id[OBX_EVENT_ID_LEN + 1];
    obx__state from, to; /* to == from: refused (nothing changed) */
    int64_t published_at;
    char reason[OBX_TEXT_MAX + 1];
} obx__ret_item;

typedef struct obx__ret_result {
    int64_t retained, purged, refused, bytes_freed, batches;
    /* the forced consumer watermark found by the run (hole = false: no event lacks evidence) */
    bool hole;
    char hole_event[OBX_EVENT_ID_LEN + 1];
    obx__pub_pos hole_pos;
    char hole_why[OBX_TEXT_MAX + 1];
    obx__ret_item *items; /* decisions in the order taken, at most cfg.max_listed */
    size_t n_items, cap_items, items_dropped;
} obx__ret_result;

void obx__ret_result_free(obx__ret_result *r);

/* Where a run is: phase 0 retains PUBLISHED events in publication order, phase 1 purges
 * RETAINED events up to `limit` (the forced consumer watermark or the replay window, whichever
 * comes first), phase 2 is done. Start from obx__purge_cursor_init(). */
typedef struct obx__purge_cursor {
    int phase;
    obx__pub_pos pos;   /* last place handled in this phase */
    obx__pub_pos limit; /* phase 1: exclusive end */
} obx__purge_cursor;

void obx__purge_cursor_init(obx__purge_cursor *cur);
/* One bounded step: at most cfg->batch events in one transaction (PostgreSQL: rows locked with
 * SKIP LOCKED, so concurrent purgers share the work). Every transition is a compare-and-set
 * with an audit row; a row another purger changed meanwhile is left to it. Advances *cur;
 * cur->phase == 2 when the run is complete. */
obx_err obx__purge_step(obx__store *s, const obx__retention_cfg *cfg, int64_t now,
                        obx__purge_cursor *cur, obx__ret_result *res);
/* Steps until the run is complete. */
obx_err obx__purge_run(obx__store *s, const obx__retention_cfg *cfg, int64_t now,
                       obx__ret_result *res);
/* One event, all or nothing: retains (if PUBLISHED) and purges it in one transaction, or
 * changes nothing and returns OBX_EREFUSED with every unmet condition in obx_errmsg() and in
 * res->items. An event already PURGED is OBX_OK with nothing to do. */
obx_err obx__purge_event(obx__store *s, const obx__retention_cfg *cfg, int64_t now,
                         const char *event_id, obx__ret_result *res);
/* The result as JSON (for obx_purge and the relay's log). */
json_t *obx__ret_result_json(const obx__retention_cfg *cfg, const obx__ret_result *res,
                             int64_t now);

/* The three-set audit: committed outbox events, accepted publish receipts, and each critical
 * consumer's receipts. Every finding names the event IDs involved (at most max_ids), counts
 * them, and gives the oldest age. */
#define OBX__FINDING_LIST(X)                                                                       \
    X(PENDING, "pending_overdue") /* PENDING/CLAIMED past its age: dispatcher not scanning */      \
    X(UNCONSUMED, "unconsumed")   /* PUBLISHED, no evidence from a critical consumer */            \
    X(BYPASS, "bypass")           /* on the broker, never committed by this outbox */              \
    X(UNKNOWN, "unknown_overdue") /* publish outcome UNKNOWN past its age */                       \
    X(QUARANTINED, "quarantined_receipt")         /* publish receipts quarantined at acceptance */ \
    X(CONSUMER_QUARANTINE, "consumer_quarantine") /* a consumer's inbox quarantined an event */    \
    X(PARKED, "parked")                 /* definitely rejected max attempts times: operator */     \
    X(ASSERTED, "asserted_unconfirmed") /* published on an operator's word alone */                \
    X(UNSERVED, "pending_unserved") /* PENDING past its age, and no live relay serves its cluster  \
                                     */

typedef enum obx__finding_kind {
#define OBX__F(n, s) OBX__FK_##n,
    OBX__FINDING_LIST(OBX__F)
#undef OBX__F
        OBX__FK_COUNT
} obx__finding_kind;

const char *obx__finding_name(obx__finding_kind k);

typedef struct obx__audit_cfg {
    const obx__critical *consumers; /* with forced watermarks loaded */
    size_t n_consumers;
    int64_t pending_max_age_ms, unconsumed_max_age_ms, unknown_max_age_ms; /* 0: check off */
    int64_t broker_scan_window_ms; /* scan messages since now - window (0: the whole topic) */
    size_t max_ids;                /* event IDs listed per finding */
    size_t max_scan;               /* PUBLISHED events checked against the inboxes per run */
} obx__audit_cfg;

/* Runs every check. b may be NULL (no bypass check). *doc gets the audit document (the
 * caller owns it); counts[k] the number of events (bypass: messages) of each finding kind.
 * Store and broker errors fail the whole audit: an audit that cannot see a set vouches for
 * nothing. */
obx_err obx__audit_run(obx__store *s, obx__broker *b, const obx__audit_cfg *cfg, int64_t now,
                       json_t **doc, int64_t counts[OBX__FK_COUNT]);
/* ---- delivery sets (enqueue.c) --------------------------------------------------------------
 * A route's delivery set: validated like the route (errors name "targets[i].field"), then
 * stored with the route generation in one transaction. */
obx_err obx__route_set_validate(const obx_route *r, const obx__route_row *primary,
                                obx__route_set_row *set);
/* Stores a route generation (and its delivery set when set != NULL) in one transaction. */
obx_err obx__route_put_rows(obx__store *s, obx__route_row *row, obx__route_set_row *set,
                            int64_t *gen);
/* The frozen destination of a route target for an envelope (routing key expanded). */
obx_err obx__dest_for(const obx__route_row *route, const obx__route_target_row *t,
                      const obx__envelope *env, obx__dest *d, char digest[OBX_DIGEST_LEN + 1]);
/* Whether one event counts as delivered under its delivery set's rule (an event outside a set:
 * whether its own slot is published). */
typedef struct obx__delivery_status {
    bool in_set;
    obx__delivery_row set;
    int32_t published;    /* slots published */
    bool complete;        /* under the rule */
    int64_t completed_at; /* the publication that completed it (0 while incomplete) */
    obx__rows slots;      /* the slots' rows, in target order (caller frees) */
} obx__delivery_status;
obx_err obx__delivery_status_of(obx__store *s, const char *event_id, obx__delivery_status *out);

/* ---- destination migration (migrate.c, docs/migration.md)
 * ---------------------------------------- Moves undelivered events to a new destination, each only
 * with proof that the old target did not accept it, or adds a delivery-set target to events
 * (docs/migration.md). Each event is its own transaction; *out lists every event's outcome;
 * *n_refused counts refusals, and the first refusal's reason (naming the blocking attempt) is the
 * thread's error message. Lookups go through e->b (may be NULL: then nothing that needs one can be
 * proven). */
typedef struct obx__migrate_req {
    const char *const *ids; /* by event ID (or slot ID), or: */
    size_t n_ids;
    obx__event_filter filter; /* a selector (when n_ids == 0) */
    int64_t route_gen;        /* destination: this route generation; 0 = the type's current */
    int32_t target_no;        /* add_target: which target of the generation (0 = first new) */
    bool add_target;          /* add a delivery-set target instead of moving */
    const char *completion;   /* add_target to an event without a set: "all" (NULL) or "any" */
    const char *who;          /* receipts and audit rows; also the engine's owner */
    const char *reason;       /* recorded; may be NULL */
    bool dry_run;             /* decide and report, write nothing */
    const obx_route *route;   /* a new route generation written with the changes (or NULL) */
} obx__migrate_req;

obx_err obx__migrate(obx__engine *e, int64_t now, const obx__migrate_req *req, json_t **out,
                     size_t *n_refused);

/* ---- shadow mode (shadow.c) -----------------------------------------------------------------
 * Computes what this relay would send for the events another dispatcher owns and compares it
 * with what was actually published. Claims nothing, sends nothing, writes nothing. */
typedef struct obx__observed { /* one publication seen on a broker or in a receipts feed */
    char event_id[OBX_EVENT_ID_LEN + 1];
    int32_t envelope_gen; /* 0 = not given */
    char cluster[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    char payload_digest[OBX_DIGEST_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1]; /* "" = not given */
    char key[OBX_KEY_MAX + 1];            /* "" = not given */
    int64_t ts;
} obx__observed;

typedef struct obx__shadow_req {
    const char *const *aliases; /* the events these dispatcher aliases own (NULL = any) */
    size_t n_aliases;
    const char *const *types; /* and/or of these event types (NULL = any) */
    size_t n_types;
    const char *const *topics; /* observe these topics too (besides the expected ones) */
    size_t n_topics;
    int64_t since;    /* events committed at or after this time */
    int64_t grace_ms; /* an event younger than this is not MISSING yet */
    size_t limit;     /* events compared at most */
} obx__shadow_req;

/* Everything on the given topics, through a consumer group of its own that never commits. */
obx_err obx__shadow_observe_broker(obx__engine *e, const char *const *topics, size_t n,
                                   int64_t since, obx__observed **out, size_t *n_out);
/* A receipts feed: one JSON object per line ({"event_id", "topic", "partition", "offset",
 * "payload_digest"} required; "cluster", "dest_digest", "key", "envelope_gen", "ts" optional).
 * Errors name the line and the field. */
obx_err obx__shadow_parse_feed(const char *text, size_t len, obx__observed **out, size_t *n);
/* The topics the expected events go to (observe them), malloc'ed strings. */
obx_err obx__shadow_topics(obx__engine *e, int64_t now, const obx__shadow_req *req, char ***topics,
                           size_t *n);
obx_err obx__shadow_compare(obx__engine *e, int64_t now, const obx__shadow_req *req,
                            const obx__observed *obs, size_t n_obs, json_t **report,
                            size_t *differences);

/* ---- scoped takeover (takeover.c) -----------------------------------------------------------
 * Hands event types to a dispatcher alias (a new route generation per type, destination and
 * delivery set unchanged), optionally with their unclaimed backlog. Rollback is the same call
 * back to the old alias: what was sent stays with its attempts and keeps being reconciled. */
typedef struct obx__takeover_req {
    const char *to;           /* the alias that owns the types afterwards */
    const char *const *types; /* these types, or: */
    size_t n_types;
    const char *from; /* the types this alias owns now ... */
    int percent;      /* ... this share of them, chosen stably (1..100; 0 = all) */
    bool backlog;     /* also re-own PENDING/PARKED events of those types */
    const char *who;
    bool dry_run;
} obx__takeover_req;

obx_err obx__takeover(obx__store *s, int64_t now, const obx__takeover_req *req, json_t **out);

/* ---- the inbox (inbox.c) ----------------------------------------------------------------- */

/* obx_inbox_process on the caller's clocks: now (wall ms) and mono_us (the handler's duration).
 * The consumer loop, the simulator and the suites call it. */
obx_err obx__inbox_process_at(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                              void *conn, int64_t now, int64_t mono_us_start,
                              int64_t (*mono_us)(void), obx_inbox_result *out);
/* The simulator's inbox schedule: back-off base and max (ms; base 0: no back-off) and the jitter's
 * seed, so that a trace's retry times are a function of its seed (obx_inbox_open seeds the
 * jitter from the clock). */
void obx__inbox_set_backoff(obx_inbox *in, int64_t base_ms, int64_t max_ms, uint64_t seed);
/* The inbox's view of a broker delivery: every envelope field, the attempt and destination,
 * the position and the redelivery and header-error flags. The strings and the payload point
 * into d, which must outlive the message. */
obx_message obx__message_of(const obx__delivery *d);
/* An unordered consumer (obx_consumer_options.unordered) keeps a copy of m, a delivery whose
 * handler failed or whose retry is not due, in the consumer's database (obx_inbox_retry: the
 * bytes as received, their SHA-256, the headers and the position) before the broker is
 * acknowledged past it; the first copy of an event stays. */
obx_err obx__inbox_keep_copy(obx_inbox *in, const obx_message *m, int64_t now);
/* Runs the retry of a kept copy: its bytes are hashed and checked against the digest taken when
 * it was kept (a copy whose bytes changed is parked, never run), then it goes through
 * obx__inbox_process_at as a delivery of its original position. The copy is deleted once the
 * outcome is final (out->ack: applied, duplicate, parked, quarantined); a failure keeps it for
 * the next retry (the failure row's next_at). */
obx_err obx__inbox_retry_copy(obx_inbox *in, const obx__retry_copy_row *row, obx_inbox_handler h,
                              void *user, void *conn, int64_t now, int64_t mono_us_start,
                              int64_t (*mono_us)(void), obx_inbox_result *out);

#endif /* OBX_ENGINE_H */

/*
 * store.h — the outbox store backend interface (one vtable, SQLite-vfs style).
 *
 * A backend is a `static const obx__store_methods` with a version; an instance struct starts
 * with `const obx__store_methods *m`. The engine never calls methods directly: it goes through
 * the obx__st_* wrappers in store.c (the one place for argument checks, tracing and fault
 * injection).
 *
 * One path per operation: every operation the engine asks of a store is one required method,
 * and the engine runs the same sequence of calls on every backend (so the simulator, on SQLite,
 * runs what PostgreSQL users run). Where PostgreSQL does an operation in one round trip,
 * SQLite carries out its own sequence of statements inside sqlite_store.c. What a backend may
 * leave NULL is a capability its database lacks (the last group of obx__store_methods), asked
 * through obx__st_has_<name> by the drivers only.
 *
 * Division of labour: stores are typed row stores with batch operations; the protocol's
 * decisions (who may move an event where, the six rules of acceptance) live in the engine,
 * once, and are checked against core/states.c. Every method that takes n rows does them all
 * or reports failure; inside a transaction a failure leaves the transaction to be rolled back
 * by the caller.
 *
 * Transactions: begin/commit/rollback nest. The outermost begin on a connection that is not
 * in a transaction opens a write transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: BEGIN);
 * inner ones (and any begin on a caller's connection that is already in a transaction) use
 * savepoints, so obx can run inside a producer's or consumer's own transaction.
 */
#ifndef OBX_STORE_H
#define OBX_STORE_H

#include "core/core.h"

/* The versions of the three method tables (a backend built for another is refused at open). */
#define OBX__STORE_METHODS_VERSION 6
#define OBX__STORE_INBOX_VERSION 1
#define OBX__STORE_READ_VERSION 4
/* The schema version of both stores' tables: 1, the baseline (sqlite/schema.sql,
 * postgres/schema.sql). Until the first release a schema change edits the baselines; after it,
 * a change adds an upgrade script to each store's migrations table and raises this number
 * (shared.c, obx__migrate_run). The obx_pg extension's version is this number (CMakeLists.txt). */
#define OBX__SCHEMA_VERSION 1

#define OBX__ATTEMPT_ID_LEN 30 /* "att-" + ULID */
#define OBX__OWNER_MAX OBX_TEXT_MAX

/* The public obx_store handle is the backend instance's base struct. */
typedef struct obx_store obx__store;

/* ---- rows ------------------------------------------------------------------------------- */

typedef struct obx__route_row {
    int64_t gen;
    char event_type[OBX_NAME_MAX + 1];
    char cluster[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    char routing_key[OBX_KEY_MAX + 1]; /* template */
    char algorithm[OBX_NAME_MAX + 1];
    char serializer[OBX_NAME_MAX + 1];
    char durability[OBX_NAME_MAX + 1];
    char required_acks[OBX_NAME_MAX + 1];
    int32_t max_attempts;
    bool blind_retry;
    bool unordered;
    char alias[OBX_NAME_MAX + 1];
    int64_t created_at;
    int32_t targets; /* destinations of its delivery set (route_set_get), 0 = a single one */
    char encrypt_key[OBX_KEY_ID_MAX + 1]; /* "" or the key ID payloads are sealed with */
    /* Which table the row was read from, where the store can tell (PostgreSQL: obx_route's
     * OID; 0 = not known). A generation number identifies a route only within one table: a
     * schema dropped and made again numbers its routes from 1 again, so the producer's cached
     * route is current only while this is still the table's (enqueue_write). */
    uint32_t rel;
} obx__route_row;

/* One event: its mutable protocol state plus the frozen envelope and destination of its current
 * envelope generation. */
typedef struct obx__event_row {
    int64_t seq; /* commit-order surrogate; per-key order */
    /* mutable state (compare-and-set on state + claim_gen) */
    obx__state state;
    int32_t envelope_gen;
    int64_t claim_gen;
    char owner[OBX__OWNER_MAX + 1];
    int64_t lease_until;
    int32_t attempt_gen;
    char attempt_id[OBX__ATTEMPT_ID_LEN + 1]; /* latest attempt, "" none */
    int32_t pinned_partition;                 /* -1 until the first attempt chose one */
    int32_t rejections;
    int64_t available_at;  /* backoff: not claimable before */
    int64_t next_check_at; /* reconciler: next lookup */
    int64_t unknown_since; /* first UNKNOWN of the current episode; 0 none */
    /* held for an operator since: an UNKNOWN whose route's policy is hold, or
     * whose broker copy obx cannot accept, once nothing could prove its outcome past the
     * attempts' quiet time. 0 = not held. Only DISPATCH_UNKNOWN / RECONCILING events are held:
     * every transition out of them clears it. */
    int64_t held_at;
    char primary_attempt_id[OBX__ATTEMPT_ID_LEN + 1];
    int64_t published_at;
    int64_t committed_at;
    int64_t updated_at;
    /* frozen at enqueue with the route */
    int32_t max_attempts;
    /* the route's UNKNOWN policy (DB column blind_retry): true = "retry": a same-target retry
     * once the lookup cannot tell past the quiet time; false = "hold" for an operator */
    bool blind_retry;
    bool unordered;
    char alias[OBX_NAME_MAX + 1];
    /* frozen envelope and destination (of envelope_gen) */
    obx__envelope env;
    obx__dest dest;
    char dest_digest[OBX_DIGEST_LEN + 1];
    char envelope_digest[OBX_DIGEST_LEN + 1];
    /* payload, when loaded with OBX__LOAD_PAYLOAD; owned by the obx__rows */
    unsigned char *payload;
    size_t payload_len;
    bool payload_purged;
    /* claims: the payload is over the claim's max_payload and was not read (payload NULL,
     * payload_len the stored length) */
    bool payload_unread;
    /* Delivery sets (docs/migration.md). A row is one publish slot. env.event_id is the slot's
     * key in the store; logical_id is the event ID brokers and consumers see: the same for an
     * ordinary event, the set's event ID for the slot of a further target. target_no is the
     * slot's place in its set (1 = the event's own row), 0 outside a set. Read-only here: the
     * store fills both from obx_delivery_target; use obx__wire_id(). */
    char logical_id[OBX_EVENT_ID_LEN + 1];
    int32_t target_no;
    /* enqueue_write only: the rel of the route row the event was built from (0 = not known) */
    uint32_t route_rel;
    /* the producer's write only (insert_event, insert_event_audit, enqueue_write): a store with
     * a server clock writes its now for committed_at, updated_at, the envelope's created_at (the
     * producer's audit row's at) and available_at = max(env.not_before, its now), in place of
     * the row's (docs/design.md, "One clock"); the row keeps the host's */
    bool at_server;
} obx__event_row;

/* The event ID a slot is sent, looked up and consumed under (logical_id, or the row's own ID
 * when it was never loaded from a store). */
const char *obx__wire_id(const obx__event_row *r);

typedef struct obx__rows {
    obx__event_row *v;
    size_t n, cap;
} obx__rows;

void obx__rows_free(obx__rows *r);
obx__event_row *obx__rows_push(obx__rows *r); /* zeroed row, NULL on ENOMEM */

/* The columns an event update writes, one bit each (obx__event_update.same). */
enum {
    OBX__EVC_ENVELOPE_GEN = 1u << 0,
    OBX__EVC_STATE = 1u << 1,
    OBX__EVC_CLAIM_GEN = 1u << 2,
    OBX__EVC_OWNER = 1u << 3,
    OBX__EVC_LEASE_UNTIL = 1u << 4,
    OBX__EVC_ATTEMPT_GEN = 1u << 5,
    OBX__EVC_ATTEMPT_ID = 1u << 6,
    OBX__EVC_PINNED_PARTITION = 1u << 7,
    OBX__EVC_REJECTIONS = 1u << 8,
    OBX__EVC_AVAILABLE_AT = 1u << 9,
    OBX__EVC_NEXT_CHECK_AT = 1u << 10,
    OBX__EVC_UNKNOWN_SINCE = 1u << 11,
    OBX__EVC_PRIMARY_ATTEMPT_ID = 1u << 12,
    OBX__EVC_PUBLISHED_AT = 1u << 13,
    OBX__EVC_UPDATED_AT = 1u << 14,
    OBX__EVC_ORDER_KEY = 1u << 15, /* dest.cluster, dest.topic, dest.routing_key */
    OBX__EVC_DEST_CLUSTER = 1u << 16,
    OBX__EVC_HELD_AT = 1u << 17,
    OBX__EVC_COUNT = 18
};

typedef struct obx__event_update {
    const obx__event_row *row; /* new values of the mutable fields (and envelope_gen) */
    obx__state expect_state;
    int64_t expect_claim_gen;
    /* OBX__EVC_* bits of the columns whose value in row is the one stored (the caller loaded
     * the row in this transaction and left them as they were): a store may leave them out of
     * its UPDATE (SQLite then touches only the indexes and triggers of the columns it sets).
     * 0: every column is written. */
    uint32_t same;
} obx__event_update;

/* The values of the columns an event update writes (OBX__EVC_*), as a row held them: what a
 * transaction that changes its loaded rows in place keeps of each (about 1 KB of a 3.9 KB row). */
typedef struct obx__event_cols {
    obx__state state;
    int32_t envelope_gen, attempt_gen, pinned_partition, rejections;
    int64_t claim_gen, lease_until, available_at, next_check_at, unknown_since, published_at,
        updated_at, held_at;
    char owner[OBX__OWNER_MAX + 1];
    char attempt_id[OBX__ATTEMPT_ID_LEN + 1], primary_attempt_id[OBX__ATTEMPT_ID_LEN + 1];
    char cluster[OBX_NAME_MAX + 1], topic[OBX_TOPIC_MAX + 1], routing_key[OBX_KEY_MAX + 1];
} obx__event_cols;

void obx__event_cols_of(const obx__event_row *r, obx__event_cols *out);
/* The OBX__EVC_* bits of the columns whose values are equal in cur and next. */
uint32_t obx__event_same(const obx__event_row *cur, const obx__event_row *next);
uint32_t obx__event_cols_same(const obx__event_cols *cur, const obx__event_row *next);

typedef struct obx__attempt_row {
    char attempt_id[OBX__ATTEMPT_ID_LEN + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    int32_t envelope_gen;
    int32_t attempt_gen;
    int64_t claim_gen;
    char owner[OBX__OWNER_MAX + 1];
    char dest_digest[OBX_DIGEST_LEN + 1];
    int32_t partition;
    obx__attempt_state state;
    int64_t started_at;
    int64_t unknown_at;
    int64_t ended_at;
    int64_t offset_before; /* broker position before the send (Kafka lookup start), -1 none */
    int64_t quiet_until;   /* a lookup may be authoritative only after this time */
    char detail[OBX_TEXT_MAX + 1];
} obx__attempt_row;

typedef enum obx__receipt_kind {
    OBX__RK_PRIMARY,
    OBX__RK_DUPLICATE,
    OBX__RK_QUARANTINED,
    OBX__RK_MIGRATION,
} obx__receipt_kind;

const char *obx__receipt_kind_name(obx__receipt_kind k);

/* What proved a receipt. The kind says
 * what the receipt did to the publish slot; the source says where the evidence came from. */
typedef enum obx__receipt_source {
    OBX__RS_BROKER,   /* the broker's confirm of a send */
    OBX__RS_LOOKUP,   /* a reconciler's lookup found the message */
    OBX__RS_CONSUMER, /* a critical consumer's inbox row (docs/design.md: consumer evidence) */
    OBX__RS_OPERATOR, /* an operator's audited `obx resolve --accept`, verified at the broker */
    /* an operator's `obx resolve --accept` on a cluster that cannot be asked: an assertion,
     * counted and reported by obx audit until a critical consumer's receipt confirms it */
    OBX__RS_ASSERTED,
    OBX__RS_COUNT
} obx__receipt_source;

const char *obx__receipt_source_name(obx__receipt_source s);
obx__receipt_source obx__receipt_source_parse(const char *s); /* OBX__RS_COUNT: unknown */

typedef struct obx__receipt_row {
    char event_id[OBX_EVENT_ID_LEN + 1];
    int32_t envelope_gen;
    char attempt_id[OBX__ATTEMPT_ID_LEN + 1];
    obx__receipt_kind kind;
    char cluster[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t broker_ts;
    char payload_digest[OBX_DIGEST_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1];
    char reason[OBX_TEXT_MAX + 1];
    const char *detail; /* optional JSON (migration proof); borrowed */
    int64_t created_at;
    obx__receipt_source source;
} obx__receipt_row;

/* The reason of the producer's audit row (NONE -> PENDING), from the event's route generation.
 * PostgreSQL records that row in the envelope (created_by) and writes this text again in SQL
 * when it reads the row back (pg_sql.c's Q_LOAD_AUDIT). */
#define OBX__PRODUCER_REASON "enqueued under route generation %lld"

typedef struct obx__audit_row {
    int64_t at;
    obx__actor actor;
    char who[OBX__OWNER_MAX + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    int32_t envelope_gen;
    obx__state from, to;
    int64_t claim_gen;
    char attempt_id[OBX__ATTEMPT_ID_LEN + 1];
    int32_t attempt_gen;
    char reason[OBX_TEXT_MAX + 1];
    /* The named event's seq (obx__event_row.seq) when the writer has it, else 0. PostgreSQL
     * files a batch of rows under the range of their seqs (obx_audit_batch), so a non-zero seq
     * must be the named event's: a row filed under another event's seq is not found by
     * load_audit. With any seq 0 the store looks them up. Not read back (load_audit: 0). */
    int64_t seq;
} obx__audit_row;

/* ---- consumer side (inbox, docs/design.md, "Consumers and the inbox")
 * ------------------------------------------------- */

typedef struct obx__inbox_row {
    char consumer_id[OBX_NAME_MAX + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    char payload_digest[OBX_DIGEST_LEN + 1];
    char event_type[OBX_NAME_MAX + 1];
    char tenant[OBX_NAME_MAX + 1];
    char outcome[32]; /* APPLIED | SKIPPED (handler chose no effect) */
    char result[OBX_TEXT_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t consumed_at;
    int64_t duration_us;
    /* what makes the row evidence that the broker accepted the message:
     * the envelope generation, attempt and destination digest the delivery carried. Rows
     * written before have envelope_gen 0 and are never evidence. */
    int32_t envelope_gen;
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1];
} obx__inbox_row;

/* What a consumer's inbox row must match to count (inbox_has). For retention, evidence that a
 * critical consumer holds the event (docs/retention.md, "Evidence"): the row for event_id (the
 * wire ID the consumer saw) with the event's frozen payload digest, envelope generation and
 * destination digest, and no quarantine of event_id in that inbox (an open alarm: the consumer
 * saw another body under this ID). A row for a corrupt copy, an older generation, another
 * destination or a hand-made row is not evidence. payload_digest NULL: any row for event_id
 * counts (consumer lag and monitoring, never retention). dest_digest NULL: any destination
 * (a delivery set's slot: the consumer saw the set's event ID from one of its targets).
 * Pointers borrowed. */
typedef struct obx__inbox_key {
    const char *event_id;
    const char *payload_digest;
    int32_t envelope_gen;
    const char *dest_digest;
} obx__inbox_key;

typedef struct obx__watermark_row {
    char consumer_id[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset; /* highest consumed offset (kept monotonic by the store) */
    char event_id[OBX_EVENT_ID_LEN + 1];
    int64_t occurred_at;
    int64_t committed_at;
} obx__watermark_row;

typedef struct obx__poison_row {
    char consumer_id[OBX_NAME_MAX + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    char state[16]; /* PARKED | REDRIVE | DONE */
    /* the SHA-256 of the parked copy's bytes (payload): with event_id, the row's key, so that a
     * corrupt copy never blocks the genuine one (the caller fills it: obx__poison_digest) */
    char payload_digest[OBX_DIGEST_LEN + 1];
    int32_t failures;
    char last_error[OBX_TEXT_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    char *headers_json;     /* owned (obx__poison_rows_free); may be NULL */
    unsigned char *payload; /* owned; loaded only by poison_get */
    size_t payload_len;
    int64_t parked_at;
    int64_t updated_at;
} obx__poison_row;

void obx__poison_rows_free(obx__poison_row *rows, size_t n);

/* An unordered consumer's copy of a failed message (obx_inbox_retry), kept until its retry. */
typedef struct obx__retry_copy_row {
    char consumer_id[OBX_NAME_MAX + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    char payload_digest[OBX_DIGEST_LEN + 1]; /* SHA-256 of payload as kept */
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    char *headers_json;     /* owned (obx__retry_copy_rows_free) */
    unsigned char *payload; /* owned; NULL when empty */
    size_t payload_len;
    int64_t kept_at;
    int64_t due_at; /* read only: the failure row's next_at, 0 when it has none */
} obx__retry_copy_row;

void obx__retry_copy_rows_free(obx__retry_copy_row *rows, size_t n);
/* The poison key's digest of a copy's bytes: "sha256:<hex>" over payload (NULL: no bytes), as
 * the SQL inbox's obx._inbox_park computes it. */
obx_err obx__poison_digest(const void *payload, size_t len, char out[OBX_DIGEST_LEN + 1]);

typedef struct obx__consume_audit_row {
    int64_t at;
    char consumer_id[OBX_NAME_MAX + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    char outcome[32]; /* APPLIED DUPLICATE QUARANTINED FAILED POISONED REJECTED_CONTRACT ... */
    int64_t duration_us;
    char detail[OBX_TEXT_MAX + 1];
    int64_t id; /* set by consume_audit_list (ignored by consume_audit_put): insertion order */
} obx__consume_audit_row;

/* A published event as the consumer-lag window sees it (recent_published). */
typedef struct obx__published_ref {
    char event_id[OBX_EVENT_ID_LEN + 1];
    char topic[OBX_TOPIC_MAX + 1]; /* frozen destination topic */
    int64_t published_at;
} obx__published_ref;

/* One envelope generation as it was frozen (envelope_at): its destination and the digests a
 * receipt or a message of that generation must carry. */
typedef struct obx__envelope_at_row {
    obx__dest dest;
    char dest_digest[OBX_DIGEST_LEN + 1];
    char payload_digest[OBX_DIGEST_LEN + 1];
    char envelope_digest[OBX_DIGEST_LEN + 1];
} obx__envelope_at_row;

/* Outbox statistics for metrics, status and audit. */
typedef struct obx__store_stats {
    int64_t by_state[OBX__ST_COUNT];
    int64_t oldest_pending_committed_at; /* 0: none */
    int64_t oldest_unknown_since;        /* 0: none */
    int64_t receipts_primary, receipts_duplicate, receipts_quarantined, receipts_migration;
    int64_t receipts_asserted; /* primary receipts whose source is an operator's assertion */
    int64_t attempts_unknown;  /* UNKNOWN attempts of events whose slot is still empty */
    int64_t held;              /* UNKNOWN events held for an operator (held_at > 0) */
    int64_t oldest_held;       /* the earliest held_at; 0: none */
} obx__store_stats;

/* Whole-table invariant checks (all must be 0): scans, so only for reports and audits. */
typedef struct obx__store_invariants {
    int64_t published_without_primary; /* PUBLISHED/RETAINED/PURGED with no primary receipt */
    int64_t primary_not_published;     /* a primary receipt on an event that is not published */
    int64_t multi_primary;             /* events with more than one primary per generation */
    int64_t cancelled_with_attempt;    /* CANCELLED events that have an attempt (were sent) */
} obx__store_invariants;

/* ---- delivery sets, selections ------------------------------------------------------------ */

#define OBX__SET_MAX 8 /* destinations of one delivery set, the event's own included */

/* One further destination of a route's delivery set (target 2..OBX__SET_MAX). */
typedef struct obx__route_target_row {
    int32_t target_no;
    char cluster[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    char routing_key[OBX_KEY_MAX + 1]; /* template */
    char algorithm[OBX_NAME_MAX + 1];
    char serializer[OBX_NAME_MAX + 1];
    char durability[OBX_NAME_MAX + 1];
    char required_acks[OBX_NAME_MAX + 1];
} obx__route_target_row;

/* A route generation's delivery set: the route row's own destination is target 1. */
typedef struct obx__route_set_row {
    int64_t route_gen;
    char completion[8]; /* "all" | "any" */
    int32_t n;          /* further targets in t[] (1..OBX__SET_MAX-1) */
    obx__route_target_row t[OBX__SET_MAX - 1];
} obx__route_set_row;

/* One event's delivery set: the contract (completion rule) and its slots. Target 1's slot is
 * the logical event's own row. */
typedef struct obx__delivery_target_row {
    int32_t target_no;
    char slot_id[OBX_EVENT_ID_LEN + 1];
    char origin[16]; /* "enqueue" | "migration" (a target added later, with its receipt) */
    int64_t created_at;
} obx__delivery_target_row;

typedef struct obx__delivery_row {
    char event_id[OBX_EVENT_ID_LEN + 1];
    char completion[8];
    int64_t route_gen; /* the route generation that declared it; 0 = formed by a migration */
    int64_t created_at;
    int32_t n;
    obx__delivery_target_row t[OBX__SET_MAX];
} obx__delivery_row;

/* Events by attributes (migration selectors, shadow comparisons, takeover backlogs): every
 * given criterion must hold; NULL / 0 = any. Ordered by seq; after_seq pages. */
typedef struct obx__event_filter {
    const char *event_type;
    const char *cluster; /* current frozen destination */
    const char *topic;
    const char *const *aliases;
    size_t n_aliases;
    const obx__state *states;
    size_t n_states;
    int64_t committed_from; /* committed_at >= this */
    int64_t committed_to;   /* committed_at < this (0 = no bound) */
    int64_t after_seq;
    size_t limit;           /* 0 = 1000 */
    bool held;              /* only events held for an operator (held_at > 0) */
    int64_t unknown_before; /* only events whose UNKNOWN episode began before this (0 = any) */
} obx__event_filter;

/* A cluster as a relay registered it: the broker backend behind the cluster
 * identity and what it can honour of a frozen destination contract (docs/design.md,
 * "Destination contract"). The value lists are comma-separated; serializer "*" = any. */
typedef struct obx__cluster_row {
    char cluster[OBX_NAME_MAX + 1];
    char backend[32];
    char lookup[16]; /* authoritative | best_effort | none */
    char durability[OBX_TEXT_MAX + 1];
    char required_acks[OBX_TEXT_MAX + 1];
    char serializer[OBX_TEXT_MAX + 1];
    char relay[OBX__OWNER_MAX + 1];
    int64_t seen_at;
    /* the relay's heartbeat: until when this relay counts as serving the cluster; cluster_put
     * writes it to obx_relay_cluster beside the registry row (cluster_get leaves it 0) */
    int64_t live_until;
} obx__cluster_row;

/* One sample of the dashboard's charts (drivers/series.c), kept in the outbox so that the
 * charts survive a relay restart: its slot (a multiple of the interval near when it was taken,
 * ms since the epoch; one sample a slot), when it was taken (ms), and its values as series.c
 * encodes them (JSON text the store does not read, malloc'ed: obx__series_rows_free). */
typedef struct obx__series_row {
    int64_t slot;
    int64_t at;
    char *sample;
} obx__series_row;
void obx__series_rows_free(obx__series_row *rows, size_t n);

/* PENDING events of one cluster that no live relay serves (no obx_relay_cluster row whose
 * live_until is at or after now). */
typedef struct obx__unserved_row {
    char cluster[OBX_NAME_MAX + 1];
    int64_t pending;
    int64_t oldest_committed_at;
} obx__unserved_row;

/* ---- requests ---------------------------------------------------------------------------- */

/* Claim candidates (docs/design.md, "Claims, attempts and fencing"): PENDING with
 * available_at <= now, or CLAIMED with an expired lease; oldest first; never one behind an
 * unpublished earlier event with the same order key unless its route is unordered; only the given
 * clusters/aliases (NULL = any).
 * Rows are locked for the enclosing transaction (PostgreSQL: FOR UPDATE SKIP LOCKED). */
typedef struct obx__claim_req {
    int64_t now;
    size_t limit;
    const char *cluster; /* NULL: any */
    const char *const *aliases;
    size_t n_aliases; /* 0: any */
    /* the largest payload read, in bytes; a larger one is not read (payload_unread). 0: the
     * outbox's payload limit (PostgreSQL: obx_meta's payload_limit; SQLite: the default) */
    size_t max_payload;
} obx__claim_req;

typedef enum obx__select_kind {
    OBX__SEL_EXPIRED_SENDING,  /* SENDING with lease_until <= now */
    OBX__SEL_RECONCILE,        /* DISPATCH_UNKNOWN due (next_check_at <= now), or RECONCILING /
                                  RETRY_CLAIMED with lease_until <= now */
    OBX__SEL_STATE,            /* state == req.state, any time */
    OBX__SEL_PUBLISHED_BEFORE, /* state == req.state and published_at <= now */
} obx__select_kind;

typedef struct obx__select_req {
    obx__select_kind kind;
    int64_t now;
    obx__state state;
    size_t limit;
    bool lock; /* lock rows for the transaction (SKIP LOCKED where supported) */
    bool payload;
    const char *cluster; /* NULL: any */
} obx__select_req;

#define OBX__LOAD_LOCK 1u
#define OBX__LOAD_PAYLOAD 2u

/* ---- retention and audit requests (docs/retention.md) -----------------------------------------
 */

/* A place in publication order: events are ordered by (published_at, seq); seq breaks ties of
 * one millisecond. The forced consumer watermark and the retention cursors are such places. */
typedef struct obx__pub_pos {
    int64_t at;  /* published_at */
    int64_t seq; /* obx__event_row.seq */
} obx__pub_pos;

#define OBX__PUB_POS_MIN ((obx__pub_pos){INT64_MIN, INT64_MIN})
#define OBX__PUB_POS_MAX ((obx__pub_pos){INT64_MAX, INT64_MAX})

/* Retention candidates: events in `state` (PUBLISHED or RETAINED) whose place is strictly after
 * `after` and strictly before `before`, in publication order, at most `limit` (>= 1). With
 * lock, the rows are locked for the enclosing transaction and rows another transaction holds
 * are skipped (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: the write transaction is exclusive
 * already). Without payloads. */
typedef struct obx__retention_req {
    obx__state state;
    obx__pub_pos after, before;
    size_t limit;
    bool lock;
} obx__retention_req;

/* ---- the one way to read event rows (read_events) ---------------------------------------------
 * Every read of event rows, whoever asks (the claim, acceptance, the reconciler's sweeps,
 * migration selectors, retention, trace, the audit), is one request: how the rows are found
 * (`by`, and the selector that goes with it), and for each selector its own order, limit and
 * locking, as documented at the selector. The rows come back decoded by the shared row codec
 * (store/shared.h), appended to the caller's obx__rows. */
typedef enum obx__read_by {
    /* ids[0..n_ids), in that order; IDs not in the outbox are skipped (out->n may be < n_ids).
     * flags: OBX__LOAD_LOCK locks the rows for the enclosing transaction and waits for them
     * (acceptance, registration: never skip a row), OBX__LOAD_PAYLOAD loads the payload.
     * PostgreSQL: one round trip for the batch. */
    OBX__READ_IDS,
    OBX__READ_CLAIM,     /* *claim: claim candidates, with payload, locked (obx__claim_req) */
    OBX__READ_SELECT,    /* *select: sweeps and state lists (obx__select_req) */
    OBX__READ_FILTER,    /* *filter: by attributes, without payload, not locked */
    OBX__READ_RETENTION, /* *retention: retention candidates (obx__retention_req) */
    /* correlation_id: its events oldest first (by seq), at most limit (>= 1), without payload,
     * not locked */
    OBX__READ_CORRELATION,
    OBX__READ_BY_COUNT
} obx__read_by;

typedef struct obx__read_req {
    obx__read_by by;
    const char *const *ids; /* IDS */
    size_t n_ids;
    unsigned flags;             /* IDS: OBX__LOAD_* */
    const char *correlation_id; /* CORRELATION */
    size_t limit;               /* CORRELATION */
    const obx__claim_req *claim;
    const obx__select_req *select;
    const obx__event_filter *filter;
    const obx__retention_req *retention;
} obx__read_req;

/* What the audit looks for, each a bounded, indexed query. `at` is the time the row's age
 * counts from; `key` breaks ties and pages (seq, receipt_id, quarantine_id). */
typedef enum obx__aged_kind {
    OBX__AGED_PENDING,     /* events PENDING or CLAIMED; at = committed_at, key = seq */
    OBX__AGED_UNKNOWN,     /* DISPATCH_UNKNOWN, RECONCILING, RETRY_CLAIMED; at = unknown_since
                              (updated_at when unset), key = seq */
    OBX__AGED_PUBLISHED,   /* PUBLISHED (not yet RETAINED); at = published_at, key = seq */
    OBX__AGED_PARKED,      /* PARKED; at = updated_at, key = seq */
    OBX__AGED_QUARANTINED, /* receipts of kind QUARANTINED; at = created_at, key = receipt_id */
    OBX__AGED_INBOX_QUARANTINED, /* consumer side: inbox quarantines of req.consumer; at = at,
                                    key = quarantine_id */
    OBX__AGED_ASSERTED,          /* PRIMARY receipts an operator asserted (source 'asserted'); at =
                                    created_at, key = receipt_id */
    OBX__AGED_UNSERVED,          /* PENDING events of a cluster no live relay serves at req.now;
                                    at = committed_at, key = seq, detail = "cluster NAME" */
    OBX__AGED_COUNT
} obx__aged_kind;

typedef struct obx__aged_req {
    obx__aged_kind kind;
    int64_t until;               /* rows with at <= until */
    int64_t after_at, after_key; /* paging: rows strictly after (after_at, after_key) */
    size_t limit;                /* rows returned, oldest first (0: none, only the count) */
    const char *consumer;        /* OBX__AGED_INBOX_QUARANTINED: the consumer ID */
    int64_t now;                 /* OBX__AGED_UNSERVED: the time relays must be live at */
    bool count;                  /* also count every matching row and find the oldest at */
} obx__aged_req;

typedef struct obx__aged_row {
    char event_id[OBX_EVENT_ID_LEN + 1];
    int64_t at, key;
    char detail[OBX_TEXT_MAX + 1]; /* events: state; receipts and quarantines: reason */
} obx__aged_row;

/* With req.count: how many rows match (ignoring paging and limit) and the oldest `at`. */
typedef struct obx__aged_count {
    int64_t total;
    int64_t oldest; /* 0 when total is 0 */
} obx__aged_count;

/* The rows one transaction writes, in the order they are written: event compare-and-sets,
 * new attempts, attempt updates, receipts, audit rows (the engine's obx__batch_write). The
 * arrays are the caller's, read during the call; applied (n_upd entries) is filled. */
typedef struct obx__write_set {
    const obx__event_update *upd;
    size_t n_upd;
    bool *applied;
    const obx__attempt_row *att_new;
    size_t n_att_new;
    const obx__attempt_row *att;
    size_t n_att;
    const obx__receipt_row *rc;
    size_t n_rc;
    const obx__audit_row *au;
    size_t n_au;
} obx__write_set;

/* ---- methods ---------------------------------------------------------------------------- */

/* The inbox: what a consumer's database does for obx_inbox_process() and the consumer loop
 * (receipts, watermarks, failures, poison, consume audit). Its own version: a consumer's
 * database may be a store whose outbox side nobody uses. */
typedef struct obx__store_inbox_methods {
    int version; /* OBX__STORE_INBOX_VERSION */

    /* inbox: the consumer's database */
    obx_err (*inbox_get)(obx__store *s, const char *consumer, const char *event_id,
                         obx__inbox_row *out);                    /* OBX_ENOTFOUND when absent */
    obx_err (*inbox_put)(obx__store *s, const obx__inbox_row *r); /* OBX_ECONFLICT if present */
    /* The handler's result text and run time into the receipt inbox_put inserted (the claim,
     * written before the handler runs). */
    obx_err (*inbox_finish)(obx__store *s, const char *consumer, const char *event_id,
                            const char *result, int64_t duration_us);
    /* present[i] = the consumer's inbox holds a receipt matching keys[i] (obx__inbox_key) */
    obx_err (*inbox_has)(obx__store *s, const char *consumer, const obx__inbox_key *keys, size_t n,
                         bool *present);
    obx_err (*watermark_put)(obx__store *s, const obx__watermark_row *w);
    obx_err (*watermark_list)(obx__store *s, const char *consumer, obx__watermark_row **out,
                              size_t *n);
    /* Counts one more handler failure, the next try due at next_at (ms); *failures gets the new
     * count. */
    obx_err (*failure_bump)(obx__store *s, const char *consumer, const char *event_id,
                            const char *error, int64_t now, int64_t next_at, int32_t *failures);
    /* The failure row of event_id (NULL: the consumer's with the earliest next_at among the
     * messages not parked): its count and when its next try is due. OBX_ENOTFOUND when there is
     * none. */
    obx_err (*failure_get)(obx__store *s, const char *consumer, const char *event_id,
                           int32_t *failures, int64_t *next_at);
    obx_err (*failure_clear)(obx__store *s, const char *consumer, const char *event_id);
    /* An unordered consumer's copy of a failed message: inserted unless one of the event is
     * kept already (the first copy stays). */
    obx_err (*retry_copy_put)(obx__store *s, const obx__retry_copy_row *r);
    /* The consumer's kept copies whose retry is due at due_by (the failure row's next_at, a copy
     * without one at once), earliest first, at most limit, with payload; *out is the caller's
     * (obx__retry_copy_rows_free). */
    obx_err (*retry_copy_list)(obx__store *s, const char *consumer, int64_t due_by, size_t limit,
                               obx__retry_copy_row **out, size_t *n);
    obx_err (*retry_copy_del)(obx__store *s, const char *consumer, const char *event_id);
    obx_err (*poison_put)(obx__store *s, const obx__poison_row *p);
    /* Without payload; consumer/state NULL = all. */
    obx_err (*poison_list)(obx__store *s, const char *consumer, const char *state,
                           obx__poison_row **out, size_t *n);
    /* With payload; OBX_ENOTFOUND. digest: that copy; NULL: the event's parked copy (else its
     * most recently updated one). */
    obx_err (*poison_get)(obx__store *s, const char *consumer, const char *event_id,
                          const char *digest, obx__poison_row *out);
    obx_err (*poison_set_state)(obx__store *s, const char *consumer, const char *event_id,
                                const char *state, int64_t now);
    obx_err (*inbox_quarantine_put)(obx__store *s, const char *consumer, const char *event_id,
                                    const char *digest, const char *first_digest,
                                    const char *reason, int64_t at);
    obx_err (*consume_audit_put)(obx__store *s, const obx__consume_audit_row *a, size_t n);
    /* Consume audit rows (the consumer's database), each with its id. consumer and event_id
     * filter (NULL = any). after_id >= 0: rows with id > after_id, oldest first (a cursor);
     * after_id < 0: the newest rows, newest first. At most limit rows. */
    obx_err (*consume_audit_list)(obx__store *s, const char *consumer, const char *event_id,
                                  int64_t after_id, size_t limit, obx__consume_audit_row **out,
                                  size_t *n);
} obx__store_inbox_methods;

/* The read model: what operations read (metrics, status, dashboard, trace, the three-set audit):
 * statistics, invariants and bounded lookups, never a change. Its own version. */
typedef struct obx__store_read_methods {
    int version; /* OBX__STORE_READ_VERSION */
    obx_err (*counter_get)(obx__store *s, const char *name, int64_t *value);

    /* statistics and search */
    obx_err (*stats)(obx__store *s, obx__store_stats *out);
    /* For every published event that had an UNKNOWN attempt: published_at - first unknown_at
     * (ms). *ms is malloc'ed. */
    obx_err (*unknown_resolutions)(obx__store *s, int64_t **ms, size_t *n);
    obx_err (*invariants)(obx__store *s, obx__store_invariants *out);
    /* Audit queries (obx__aged_req). *out (malloc'ed, may be NULL when *n is 0) gets at most
     * req->limit rows oldest first; *count (may be NULL) the totals when req->count. */
    obx_err (*aged)(obx__store *s, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                    obx__aged_count *count);
    /* Delivery sets, and those complete under their rule (every slot / any slot published). */
    obx_err (*delivery_stats)(obx__store *s, int64_t *sets, int64_t *complete);
    /* The detail (JSON text) of every receipt of this kind of event_id, oldest first; each
     * string and the array are malloc'ed (freed by the caller). */
    obx_err (*receipt_details)(obx__store *s, const char *event_id, obx__receipt_kind kind,
                               char ***out, size_t *n);
    /* The next three read a bounded number of rows through an index: a scrape or a page view
     * never scans the published bulk. */
    /* Receipts of one kind, newest first, at most limit (QUARANTINED and MIGRATION use the
     * partial index on kind). */
    obx_err (*receipts_by_kind)(obx__store *s, obx__receipt_kind kind, size_t limit,
                                obx__receipt_row **out, size_t *n);
    /* The newest PUBLISHED events, newest first, at most limit (index on state, published_at).
     * RETAINED and PURGED are left out on purpose: every critical consumer has covered them. */
    obx_err (*recent_published)(obx__store *s, size_t limit, obx__published_ref **out, size_t *n);
    /* Delivery sets that are not delivered yet under their rule, from the unpublished slots (a
     * read bounded by the backlog, cheap enough for a scrape): out[0] sets of rule `all` with
     * a target still unpublished, out[1] sets of rule `any` with none published yet, out[2]
     * unpublished slots of `any` sets already delivered (trailing targets, still sent). */
    obx_err (*delivery_open)(obx__store *s, int64_t out[3]);
    /* Generation gen of event (or slot) id's envelope as it was frozen, whichever generation is
     * current (a message on the broker, a receipt may be of any): OBX_ENOTFOUND when the event
     * has no such generation. A purged payload leaves the digests. */
    obx_err (*envelope_at)(obx__store *s, const char *id, int32_t gen, obx__envelope_at_row *out);
    /* Per cluster that no live relay serves at now and that has PENDING events: their count and
     * the oldest commit time, by cluster name; *out malloc'ed (NULL when *n is 0). Bounded by
     * the backlog (the claimable index), cheap enough for a scrape. */
    obx_err (*unserved)(obx__store *s, int64_t now, obx__unserved_row **out, size_t *n);
} obx__store_read_methods;

typedef struct obx__store_methods {
    int version; /* OBX__STORE_METHODS_VERSION */
    const char *name;

    /* ---- connection and schema ---- */
    obx_err (*open)(const obx__url *u, obx__store **out);
    obx_err (*wrap)(void *conn, obx__store **out);
    void (*close)(obx__store *s);
    obx_err (*schema_version)(obx__store *s, int *found);
    obx_err (*migrate)(obx__store *s);

    /* ---- transactions (nesting: the top of this file) ---- */
    obx_err (*begin)(obx__store *s);
    obx_err (*commit)(obx__store *s);
    obx_err (*rollback)(obx__store *s);

    /* ---- routes ---- */
    obx_err (*route_put)(obx__store *s, const obx__route_row *r, int64_t *gen);
    obx_err (*route_get)(obx__store *s, const char *event_type, obx__route_row *out);
    obx_err (*route_list)(obx__store *s, bool all, obx__route_row **out, size_t *n);
    /* Declares the delivery set of route generation r->route_gen (same transaction as its
     * route_put). */
    obx_err (*route_set_put)(obx__store *s, const obx__route_set_row *r);
    /* OBX_ENOTFOUND when the generation declares none. */
    obx_err (*route_set_get)(obx__store *s, int64_t route_gen, obx__route_set_row *out);

    /* ---- the producer (enqueue.c: one sequence of these on every store) ---- */
    /* OBX_OK with existing_id set when (tenant, key) exists, else OBX_ENOTFOUND. */
    obx_err (*idem_lookup)(obx__store *s, const char *tenant, const char *key,
                           char existing_id[OBX_EVENT_ID_LEN + 1]);
    /* The producer's read inside its transaction: route_get's answer, and the identity of the
     * current transaction into txid (cap bytes) when there is a route. PostgreSQL: one round
     * trip, the top-level transaction's ID; SQLite, which cannot name its transactions: a new
     * "tx-" + ULID (documented in obx.h). */
    obx_err (*route_get_txid)(obx__store *s, const char *event_type, obx__route_row *out,
                              char *txid, size_t cap);
    /* Inserts the envelope (generation row->envelope_gen) and the event row. */
    obx_err (*insert_event)(obx__store *s, const obx__event_row *row, const void *payload,
                            size_t len);
    /* The producer's write: the envelope and event row as insert_event, and the audit row a
     * (one); after a failure the caller rolls back (the engine writes inside its savepoint).
     * load_audit gives a back as given. PostgreSQL: one statement, both or neither, that
     * records the producer's row in the envelope; SQLite: the two inserts. */
    obx_err (*insert_event_audit)(obx__store *s, const obx__event_row *row, const void *payload,
                                  size_t len, const obx__audit_row *a);
    /* The producer's whole enqueue when it knows the route from an earlier one (the route
     * cache, enqueue.c): opens a savepoint, writes as insert_event_audit does (row and a) only
     * if the current route of row->env.event_type is still the one row was built from
     * (generation row->dest.route_gen of the same table, without a delivery set), and releases
     * it; on a connection with no transaction open, a transaction of its own instead of the
     * savepoint. The store supplies created_txid when row->env.created_txid is "" (as
     * route_get_txid does), and then the envelope digest (row->envelope_digest is read only
     * when created_txid is given). *written: the event was written (and, in its own
     * transaction, committed). false with OBX_OK: nothing was written (the route changed, or
     * the store leaves this row to the long way). An error: nothing written, the caller's
     * transaction as before the call; in its own transaction OBX_EUNKNOWN when the connection
     * broke while COMMIT ran. PostgreSQL: one round trip (issue 19); SQLite: the route read
     * and compared field by field (its generations are row IDs, which a rolled-back route
     * gives out again), then the two inserts. */
    obx_err (*enqueue_write)(obx__store *s, const obx__event_row *row, const void *payload,
                             size_t len, const obx__audit_row *a, bool *written);
    /* One line into buf (cap bytes, cut to fit) on how the database's SQL producer function
     * runs (obx_store_producer_body). PostgreSQL: C or PL/pgSQL, and why; SQLite has none: "". */
    obx_err (*producer_body)(obx__store *s, char *buf, size_t cap);

    /* ---- events, attempts, receipts and audit rows ---- */
    /* Every read of event rows (obx__read_req): appends the rows to out. */
    obx_err (*read_events)(obx__store *s, const obx__read_req *req, obx__rows *out);
    /* Compare-and-set each update on (event_id, expect_state, expect_claim_gen). applied[i]
     * tells which ones matched. */
    obx_err (*update_events)(obx__store *s, const obx__event_update *u, size_t n, bool *applied);
    obx_err (*insert_attempts)(obx__store *s, const obx__attempt_row *a, size_t n);
    obx_err (*update_attempts)(obx__store *s, const obx__attempt_row *a, size_t n);
    /* Attempts by attempt ID (ids != NULL) or all attempts of one event (event_id != NULL). */
    obx_err (*load_attempts)(obx__store *s, const char *const *ids, size_t n, const char *event_id,
                             obx__attempt_row **out, size_t *n_out);
    /* The attempts attempt_ids[0..n) name, as load_attempts, and the events of the slots they
     * fill, as read_events by IDS with flags (OBX__LOAD_*): for each i the event that
     * registered attempt attempt_ids[i], or event_ids[i] when no attempt has that ID. What
     * acceptance and the outcomes of sends load first. PostgreSQL: one round trip; SQLite:
     * the two reads. */
    obx_err (*load_slots)(obx__store *s, const char *const *attempt_ids,
                          const char *const *event_ids, size_t n, unsigned flags,
                          obx__attempt_row **att, size_t *n_att, obx__rows *ev);
    obx_err (*insert_receipts)(obx__store *s, const obx__receipt_row *r, size_t n);
    obx_err (*load_receipts)(obx__store *s, const char *event_id, obx__receipt_row **out,
                             size_t *n_out);
    obx_err (*insert_audit)(obx__store *s, const obx__audit_row *a, size_t n);
    obx_err (*load_audit)(obx__store *s, const char *event_id, obx__audit_row **out, size_t *n_out);
    /* Every part of w (obx__write_set), in its order and with the effects of update_events,
     * insert_attempts, update_attempts, insert_receipts and insert_audit one after the other.
     * When an update did not apply, the later parts may or may not have been written and the
     * call returns OBX_ECONFLICT, or OBX_OK with applied false: the caller rolls the
     * transaction back either way. Any other failure of a part is returned. A backend may hold
     * the writes back until the transaction's next statement or its COMMIT (PostgreSQL, a
     * relay transaction: one round trip fewer), and then fills applied with true: it then
     * fails that statement, or the COMMIT (the transaction rolled back), when an update did
     * not apply. SQLite: the five writes, stopping after an update that did not apply. */
    obx_err (*write_set)(obx__store *s, const obx__write_set *w);
    /* Adds delta to a named counter (alarms, quarantines). */
    obx_err (*counter_add)(obx__store *s, const char *name, int64_t delta);

    /* ---- migration, delivery sets, takeover ---- */
    /* Inserts a further envelope generation (migration); the event row is updated separately. */
    obx_err (*insert_envelope)(obx__store *s, const obx__event_row *row, const void *payload,
                               size_t len);
    /* Inserts the set row d unless the event has one already (a set row is written once: its
     * completion rule stays; whether d may join that set is the engine's decision, migrate.c),
     * and the target rows d->t[0..n) (each new: a taken target number or slot is
     * OBX_ECONFLICT). The slots' event rows are inserted with insert_event. */
    obx_err (*delivery_put)(obx__store *s, const obx__delivery_row *d);
    /* The set that event or slot `id` belongs to, targets ordered; OBX_ENOTFOUND when none. */
    obx_err (*delivery_get)(obx__store *s, const char *id, obx__delivery_row *out);
    /* Hands unclaimed events to another dispatcher alias: sets alias = to where the event is
     * ids[i], its alias is `from` and its state PENDING or PARKED (nothing in flight).
     * applied[i] tells which ones changed. */
    obx_err (*set_alias)(obx__store *s, const char *const *ids, size_t n, const char *from,
                         const char *to, bool *applied);

    /* ---- retention (docs/retention.md) ---- */
    /* The purge: drops the payload of every envelope generation of these events (payload ->
     * NULL, the only change the frozen-envelope triggers allow); everything else stays as a
     * tombstone. *bytes (may be NULL) gets the payload bytes dropped; an event whose payload is
     * gone already adds nothing. Batch: one statement per batch on PostgreSQL. */
    obx_err (*purge_payloads)(obx__store *s, const char *const *ids, size_t n, int64_t *bytes);

    /* ---- the cluster registry and the dashboard's chart history ---- */
    /* Inserts or replaces the registration of c->cluster. */
    obx_err (*cluster_put)(obx__store *s, const obx__cluster_row *c);
    /* OBX_ENOTFOUND when no relay registered the cluster. */
    obx_err (*cluster_get)(obx__store *s, const char *cluster, obx__cluster_row *out);
    /* Keeps r (obx_series, a row per slot: the first relay to write a slot keeps it, a second
     * writer changes nothing) and deletes the rows of slots before keep_from (a range of the
     * primary key). */
    obx_err (*series_put)(obx__store *s, const obx__series_row *r, int64_t keep_from);
    /* The rows of slots >= from, oldest first, at most limit (a range of the primary key). */
    obx_err (*series_list)(obx__store *s, int64_t from, size_t limit, obx__series_row **out,
                           size_t *n);

    /* ---- capabilities: optional, NULL where the database has no such thing ----
     * Each is something a database has or lacks, never a faster way to do an operation: every
     * operation above is one required method, and a backend without a fast path runs its own
     * sequence of statements inside its own file (scripts/check_layers.sh refuses an
     * obx__st_has_ branch in src/engine). */
    /* Wake-ups (SQLite has no notification channel: the relay polls). Waits up to timeout_ms
     * for a hint that new work was committed (PostgreSQL: NOTIFY, or with obx_pg the relay's
     * latch, set by the producers; docs/postgres.md). A hint is only a reason to look now: the
     * relay always finds work by querying committed rows. Must not be called inside a
     * transaction. Also returns at once with *notified when it has just armed its wake-up
     * (PostgreSQL: took the cluster's wake lock of the connection's last claim): what committed
     * before then may have sent no hint, so the caller looks once more before it waits again.
     * also_fd >= 0: returns as well as soon as that descriptor is readable (not read here: a
     * broker's wake_fd, so that one poll(2) waits for a hint and for outcomes), and then only
     * waits for its wake-up to be armed up to a few milliseconds, not timeout_ms (the caller
     * collects the outcomes that come meanwhile and calls again). */
    obx_err (*wait_for_work)(obx__store *s, int timeout_ms, int also_fd, bool *notified);
    /* Planner settings (SQLite has no planner to tune). Declares that this connection serves
     * a relay's dispatcher or reconciler from now on: every transaction it begins finds rows
     * by key or by a partial index and touches a batch of them (claims, registrations,
     * acceptance, sweeps, lookups by attempt). PostgreSQL: such transactions plan once,
     * without sequential scans, hash or merge joins, sorts or bitmap scans (see relay_plans in
     * pg_read.c). */
    void (*serve_dispatch)(obx__store *s);
    /* Database roles (SQLite has none: OBX_EUNSUPPORTED). Creates, or re-grants, the
     * least-privilege roles <prefix>_producer, <prefix>_relay and <prefix>_auditor
     * (docs/postgres.md). Runs in its own transaction or a savepoint of the caller's. */
    obx_err (*create_roles)(obx__store *s, const char *prefix);
    /* A schema lock a session holds (SQLite has none: the relay reads schema_version). The
     * schema_version for a process that keeps running on this connection (a relay): the
     * connection also holds the schema it read until it closes, so that a migration does not
     * run under it and one that is running finishes before the version is read
     * (docs/operations.md, "Upgrading obx"). PostgreSQL: a session advisory lock, shared. */
    obx_err (*schema_hold)(obx__store *s, int *found);
    /* A server clock (SQLite has no server: its relays share a host and its clock). The
     * database server's clock, ms since the epoch (PostgreSQL: clock_timestamp()), outside a
     * transaction: what the relays of one database decide leases and deadlines on
     * (obx__ref_sync, docs/design.md "One clock"). */
    obx_err (*server_ms)(obx__store *s, int64_t *out);

    /* the consumer side and the operations reads: tables of their own (above) */
    const obx__store_inbox_methods *inbox;
    const obx__store_read_methods *read;
} obx__store_methods;

struct obx_store {
    const obx__store_methods *m;
    char url_redacted[1024];
    size_t payload_limit;
    int tx_depth; /* maintained by the wrappers */
    /* The producer's routes (enqueue.c): the last ones read on this handle, so that the next
     * enqueue of their event types can be the store's enqueue_write, which checks that the route
     * is still current). NULL until the first; owned, freed by obx__st_close. */
    struct obx__route_cache *routes;
    /* The producer span (drivers/otel.c, obx_store_set_otel): called after each enqueue that
     * wrote an event, with its row and the enqueue's start (ms). NULL: none. */
    void (*on_enqueued)(void *user, const obx__event_row *row, int64_t start_ms);
    void *on_enqueued_user;
    /* The resolution span (the same): called after each UNKNOWN an operator resolved through
     * this handle (obx_resolve, not a dry run), with the event's row as it was (the attempt it
     * resolved, the episode's start), "accept" or "retry", and who resolved it. NULL: none. */
    void (*on_resolved)(void *user, const obx__event_row *row, const char *action, const char *who);
    void *on_resolved_user;
    /* Test hook (simulator): the next fail_commits outermost-or-inner commits through the
     * wrapper roll back and return OBX_EIO, on this handle only. */
    int fail_commits;
};

/* Registry: the backend for a URL scheme, or NULL. */
const obx__store_methods *obx__store_backend(obx__url_scheme scheme);
extern const obx__store_methods obx__sqlite_store_methods;
#ifdef OBX_WITH_POSTGRES
extern const obx__store_methods obx__pg_store_methods;
#endif
/* The PostgreSQL store's migrate (`obx init`) with another script table (built with PostgreSQL
 * only): scripts[v] takes a database from v-1 to v, up to version last (the store's migrate
 * passes its own, up to OBX__SCHEMA_VERSION). For the tests of an upgrade to a later version
 * before one exists: the refusal under a running relay, the schema-in-use lock. */
obx_err obx__pg_migrate_to(obx__store *s, const char *const *scripts, int last);

/* ---- wrappers: the engine's only way in ----------------------------------------------------
 * Every method of obx__store_methods has exactly one entry in one of the lists below, and a
 * static assertion in store.c checks the count against the struct, so a method added to the
 * struct without a wrapper does not compile. Nothing outside store.c calls through `->m->`
 * (the `check` target fails on it): every call counts for fault injection (the k-th call
 * fails, see obx__st_fault_after) and gets the wrapper's argument checks.
 *
 * OBX__STORE_FORWARD: X(name, params, args). obx__st_<name>(params) counts the call, refuses
 * a NULL store, and returns s->m->name(args). Same contract as the method above.
 * OBX__STORE_INBOX_FORWARD, OBX__STORE_READ_FORWARD: the same for the inbox and read-model
 * tables (s->m->inbox->name, s->m->read->name); OBX__STORE_READ_CUSTOM: the read model's
 * hand-written wrappers.
 * OBX__STORE_OPTIONAL: as FORWARD, for the capabilities; the wrapper returns
 * OBX_EUNSUPPORTED when the backend has none, and obx__st_has_<name>(s) says whether it does
 * (for the drivers: check_layers.sh refuses it in src/engine).
 * OBX__STORE_CUSTOM: X(name): methods whose wrapper is written by hand in store.c (checks of
 * their own, a different signature, or no obx_err to return); declared below.
 * OBX__STORE_OPTIONAL_CUSTOM: the same for a capability (serve_dispatch). */
#define OBX__STORE_FORWARD(X)                                                                      \
    X(schema_version, (obx__store * s, int *found), (s, found))                                    \
    X(migrate, (obx__store * s), (s))                                                              \
    X(route_put, (obx__store * s, const obx__route_row *r, int64_t *gen), (s, r, gen))             \
    X(route_get, (obx__store * s, const char *event_type, obx__route_row *out),                    \
      (s, event_type, out))                                                                        \
    X(route_list, (obx__store * s, bool all, obx__route_row **out, size_t *n), (s, all, out, n))   \
    X(idem_lookup,                                                                                 \
      (obx__store * s, const char *tenant, const char *key,                                        \
       char existing_id[OBX_EVENT_ID_LEN + 1]),                                                    \
      (s, tenant, key, existing_id))                                                               \
    X(route_get_txid,                                                                              \
      (obx__store * s, const char *event_type, obx__route_row *out, char *txid, size_t cap),       \
      (s, event_type, out, txid, cap))                                                             \
    X(insert_event, (obx__store * s, const obx__event_row *row, const void *payload, size_t len),  \
      (s, row, payload, len))                                                                      \
    X(insert_event_audit,                                                                          \
      (obx__store * s, const obx__event_row *row, const void *payload, size_t len,                 \
       const obx__audit_row *a),                                                                   \
      (s, row, payload, len, a))                                                                   \
    X(enqueue_write,                                                                               \
      (obx__store * s, const obx__event_row *row, const void *payload, size_t len,                 \
       const obx__audit_row *a, bool *written),                                                    \
      (s, row, payload, len, a, written))                                                          \
    X(producer_body, (obx__store * s, char *buf, size_t cap), (s, buf, cap))                       \
    X(insert_envelope,                                                                             \
      (obx__store * s, const obx__event_row *row, const void *payload, size_t len),                \
      (s, row, payload, len))                                                                      \
    X(load_receipts,                                                                               \
      (obx__store * s, const char *event_id, obx__receipt_row **out, size_t *n_out),               \
      (s, event_id, out, n_out))                                                                   \
    X(load_audit, (obx__store * s, const char *event_id, obx__audit_row **out, size_t *n_out),     \
      (s, event_id, out, n_out))                                                                   \
    X(counter_add, (obx__store * s, const char *name, int64_t delta), (s, name, delta))            \
    X(route_set_put, (obx__store * s, const obx__route_set_row *r), (s, r))                        \
    X(route_set_get, (obx__store * s, int64_t route_gen, obx__route_set_row * out),                \
      (s, route_gen, out))                                                                         \
    X(delivery_get, (obx__store * s, const char *id, obx__delivery_row *out), (s, id, out))        \
    X(cluster_put, (obx__store * s, const obx__cluster_row *c), (s, c))                            \
    X(cluster_get, (obx__store * s, const char *cluster, obx__cluster_row *out),                   \
      (s, cluster, out))                                                                           \
    X(series_put, (obx__store * s, const obx__series_row *r, int64_t keep_from),                   \
      (s, r, keep_from))                                                                           \
    X(series_list,                                                                                 \
      (obx__store * s, int64_t from, size_t limit, obx__series_row * *out, size_t * n),            \
      (s, from, limit, out, n))

#define OBX__STORE_INBOX_FORWARD(X)                                                                \
    X(inbox_get,                                                                                   \
      (obx__store * s, const char *consumer, const char *event_id, obx__inbox_row *out),           \
      (s, consumer, event_id, out))                                                                \
    X(inbox_put, (obx__store * s, const obx__inbox_row *r), (s, r))                                \
    X(inbox_finish,                                                                                \
      (obx__store * s, const char *consumer, const char *event_id, const char *result,             \
       int64_t duration_us),                                                                       \
      (s, consumer, event_id, result, duration_us))                                                \
    X(inbox_has,                                                                                   \
      (obx__store * s, const char *consumer, const obx__inbox_key *keys, size_t n, bool *present), \
      (s, consumer, keys, n, present))                                                             \
    X(watermark_put, (obx__store * s, const obx__watermark_row *w), (s, w))                        \
    X(watermark_list, (obx__store * s, const char *consumer, obx__watermark_row **out, size_t *n), \
      (s, consumer, out, n))                                                                       \
    X(failure_bump,                                                                                \
      (obx__store * s, const char *consumer, const char *event_id, const char *error, int64_t now, \
       int64_t next_at, int32_t *failures),                                                        \
      (s, consumer, event_id, error, now, next_at, failures))                                      \
    X(failure_get,                                                                                 \
      (obx__store * s, const char *consumer, const char *event_id, int32_t *failures,              \
       int64_t *next_at),                                                                          \
      (s, consumer, event_id, failures, next_at))                                                  \
    X(failure_clear, (obx__store * s, const char *consumer, const char *event_id),                 \
      (s, consumer, event_id))                                                                     \
    X(retry_copy_put, (obx__store * s, const obx__retry_copy_row *r), (s, r))                      \
    X(retry_copy_list,                                                                             \
      (obx__store * s, const char *consumer, int64_t due_by, size_t limit,                         \
       obx__retry_copy_row **out, size_t *n),                                                      \
      (s, consumer, due_by, limit, out, n))                                                        \
    X(retry_copy_del, (obx__store * s, const char *consumer, const char *event_id),                \
      (s, consumer, event_id))                                                                     \
    X(poison_put, (obx__store * s, const obx__poison_row *p), (s, p))                              \
    X(poison_list,                                                                                 \
      (obx__store * s, const char *consumer, const char *state, obx__poison_row **out, size_t *n), \
      (s, consumer, state, out, n))                                                                \
    X(poison_get,                                                                                  \
      (obx__store * s, const char *consumer, const char *event_id, const char *digest,             \
       obx__poison_row *out),                                                                      \
      (s, consumer, event_id, digest, out))                                                        \
    X(poison_set_state,                                                                            \
      (obx__store * s, const char *consumer, const char *event_id, const char *state,              \
       int64_t now),                                                                               \
      (s, consumer, event_id, state, now))                                                         \
    X(inbox_quarantine_put,                                                                        \
      (obx__store * s, const char *consumer, const char *event_id, const char *digest,             \
       const char *first_digest, const char *reason, int64_t at),                                  \
      (s, consumer, event_id, digest, first_digest, reason, at))                                   \
    X(consume_audit_put, (obx__store * s, const obx__consume_audit_row *a, size_t n), (s, a, n))   \
    X(consume_audit_list,                                                                          \
      (obx__store * s, const char *consumer, const char *event_id, int64_t after_id, size_t limit, \
       obx__consume_audit_row **out, size_t *n),                                                   \
      (s, consumer, event_id, after_id, limit, out, n))

#define OBX__STORE_READ_FORWARD(X)                                                                 \
    X(counter_get, (obx__store * s, const char *name, int64_t *value), (s, name, value))           \
    X(envelope_at, (obx__store * s, const char *id, int32_t gen, obx__envelope_at_row *out),       \
      (s, id, gen, out))                                                                           \
    X(stats, (obx__store * s, obx__store_stats * out), (s, out))                                   \
    X(unknown_resolutions, (obx__store * s, int64_t * *ms, size_t * n), (s, ms, n))                \
    X(invariants, (obx__store * s, obx__store_invariants * out), (s, out))                         \
    X(delivery_stats, (obx__store * s, int64_t * sets, int64_t * complete), (s, sets, complete))   \
    X(receipt_details,                                                                             \
      (obx__store * s, const char *event_id, obx__receipt_kind kind, char ***out, size_t *n),      \
      (s, event_id, kind, out, n))                                                                 \
    X(receipts_by_kind,                                                                            \
      (obx__store * s, obx__receipt_kind kind, size_t limit, obx__receipt_row * *out, size_t * n), \
      (s, kind, limit, out, n))                                                                    \
    X(recent_published, (obx__store * s, size_t limit, obx__published_ref * *out, size_t * n),     \
      (s, limit, out, n))                                                                          \
    X(delivery_open, (obx__store * s, int64_t out[3]), (s, out))                                   \
    X(unserved, (obx__store * s, int64_t now, obx__unserved_row * *out, size_t * n),               \
      (s, now, out, n))

#define OBX__STORE_READ_CUSTOM(X) X(aged)

/* The capabilities, the only methods a backend may leave NULL, each something the database
 * itself has or lacks (never a faster way to do an operation):
 *   wait_for_work   wake-ups on commit; SQLite has no notification channel: the relay polls
 *   create_roles    database roles; SQLite has none
 *   schema_hold     a schema lock a session holds; SQLite has none: the relay reads the version
 *   server_ms       a server clock; SQLite has no server: its relays share the host's clock
 *   serve_dispatch  planner settings for relay connections; SQLite has no planner to tune
 *                   (OBX__STORE_OPTIONAL_CUSTOM) */
#define OBX__STORE_OPTIONAL(X)                                                                     \
    X(wait_for_work, (obx__store * s, int timeout_ms, int also_fd, bool *notified),                \
      (s, timeout_ms, also_fd, notified))                                                          \
    X(create_roles, (obx__store * s, const char *prefix), (s, prefix))                             \
    X(schema_hold, (obx__store * s, int *found), (s, found))                                       \
    X(server_ms, (obx__store * s, int64_t * out), (s, out))

#define OBX__STORE_CUSTOM(X)                                                                       \
    X(open)                                                                                        \
    X(wrap)                                                                                        \
    X(close)                                                                                       \
    X(begin)                                                                                       \
    X(commit)                                                                                      \
    X(rollback)                                                                                    \
    X(read_events)                                                                                 \
    X(update_events)                                                                               \
    X(insert_attempts)                                                                             \
    X(update_attempts)                                                                             \
    X(load_attempts)                                                                               \
    X(insert_receipts)                                                                             \
    X(insert_audit)                                                                                \
    X(write_set)                                                                                   \
    X(load_slots)                                                                                  \
    X(purge_payloads)                                                                              \
    X(delivery_put)                                                                                \
    X(set_alias)

/* hand-written wrapper of a capability (NULL when the backend has none) */
#define OBX__STORE_OPTIONAL_CUSTOM(X) X(serve_dispatch)

#define OBX__ST_DECLARE(name, params, args) obx_err obx__st_##name params;
#define OBX__ST_DECLARE_HAS(name, params, args) bool obx__st_has_##name(const obx__store *s);
OBX__STORE_FORWARD(OBX__ST_DECLARE)
OBX__STORE_INBOX_FORWARD(OBX__ST_DECLARE)
OBX__STORE_READ_FORWARD(OBX__ST_DECLARE)
OBX__STORE_OPTIONAL(OBX__ST_DECLARE)
OBX__STORE_OPTIONAL(OBX__ST_DECLARE_HAS)
#undef OBX__ST_DECLARE
#undef OBX__ST_DECLARE_HAS

/* The time an operator's command decides on (docs/design.md, "One clock"): where the store has
 * a server clock, it is read now and the process's reference clock synchronised with it
 * (obx__ref_sync), so that `obx migrate`'s quiet times, `obx takeover`'s lease expiry and
 * `obx resolve`'s and retention's decisions are the database server's time, not the
 * operator's host clock; else (SQLite, one host) the reference clock as it is. A failed read
 * keeps the last synchronisation. */
int64_t obx__st_now_ms(obx__store *s);

/* the backend's name ("sqlite", "postgres") */
const char *obx__st_name(const obx__store *s);
/* Opens the backend for url (secret references expanded here, at the connection, and nowhere
 * else: the handle keeps the URL redacted). *out is the caller's, closed with obx__st_close. */
obx_err obx__st_open(const char *url, obx__store **out);
/* obx__st_open with OBX_STORE_READ_ONLY and the like (obx.h). */
obx_err obx__st_open_with(const char *url, unsigned flags, obx__store **out);
void obx__st_close(obx__store *s);
obx_err obx__st_begin(obx__store *s);
obx_err obx__st_commit(obx__store *s);
obx_err obx__st_rollback(obx__store *s);
/* Checks req (a known selector, its request present, a retention request's state and limit)
 * and reads; an IDS read of no IDs reads nothing. */
obx_err obx__st_read_events(obx__store *s, const obx__read_req *req, obx__rows *out);
/* Shorthand for the commonest read: read_events by ids[0..n) with flags (OBX__LOAD_*). */
obx_err obx__st_load_events(obx__store *s, const char *const *ids, size_t n, unsigned flags,
                            obx__rows *out);
obx_err obx__st_update_events(obx__store *s, const obx__event_update *u, size_t n, bool *applied);
obx_err obx__st_insert_attempts(obx__store *s, const obx__attempt_row *a, size_t n);
obx_err obx__st_update_attempts(obx__store *s, const obx__attempt_row *a, size_t n);
obx_err obx__st_load_attempts(obx__store *s, const char *const *ids, size_t n, const char *event_id,
                              obx__attempt_row **out, size_t *n_out);
obx_err obx__st_insert_receipts(obx__store *s, const obx__receipt_row *r, size_t n);
obx_err obx__st_insert_audit(obx__store *s, const obx__audit_row *a, size_t n);
/* All of w (the backend's write_set); the same checks and fault points as the five wrappers
 * of its parts. */
obx_err obx__st_write_set(obx__store *s, const obx__write_set *w);
/* The attempts attempt_ids[0..n) name (*att, *n_att: the caller's, free()) and, read by IDS
 * with flags, the events of their slots (*ev: the caller's, obx__rows_free): per i, the event
 * of the attempt attempt_ids[i], else event_ids[i] (the backend's load_slots); the same fault
 * points as the two wrappers of its reads. */
obx_err obx__st_load_slots(obx__store *s, const char *const *attempt_ids,
                           const char *const *event_ids, size_t n, unsigned flags,
                           obx__attempt_row **att, size_t *n_att, obx__rows *ev);
/* The backend's serve_dispatch when it has one; nothing otherwise. */
void obx__st_serve_dispatch(obx__store *s);
obx_err obx__st_purge_payloads(obx__store *s, const char *const *ids, size_t n, int64_t *bytes);
obx_err obx__st_aged(obx__store *s, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                     obx__aged_count *count);
obx_err obx__st_delivery_put(obx__store *s, const obx__delivery_row *d);
obx_err obx__st_set_alias(obx__store *s, const char *const *ids, size_t n, const char *from,
                          const char *to, bool *applied);

/* Fault injection for tests (SQLite's xSetSystemCall idea): when set, the k-th wrapper call
 * (1-based, counting all wrappers on all stores of the process) fails with OBX_EIO. 0 = off. */
void obx__st_fault_after(long k);
/* Like obx__st_fault_after, but every call from the k-th on fails (until reset with 0). */
void obx__st_fault_from(long k);
long obx__st_calls(void);
/* The wrapper (method name) the armed fault failed first since it was armed, or NULL. */
const char *obx__st_fault_hit(void);

#endif /* OBX_STORE_H */

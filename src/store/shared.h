/*
 * shared.h — what the SQLite and PostgreSQL stores share (shared.c), so that the two cannot
 * drift apart:
 *   - the row codec: the event row's column list (both select the same columns under the same
 *     aliases) and one decoder per row type (event, attempt, receipt, route, envelope
 *     generation), read through a backend's column reader over its own result (sqlite3_stmt, a
 *     PGresult row);
 *   - read_events: the request's selector dispatched to the backend's query for it;
 *   - the migration runner: the newer-schema refusal and the version-by-version upgrade;
 *   - transaction nesting: depth counting, our own BEGIN or the caller's transaction, savepoints.
 */
#ifndef OBX_STORE_SHARED_H
#define OBX_STORE_SHARED_H

#include "store/store.h"

/* The event row's columns, in the order obx__event_decode reads them: e = obx_event,
 * v = obx_envelope (the event's current generation), t = obx_delivery_target (LEFT JOIN: a
 * delivery-set slot's logical event ID and target number). A query may append the payload as
 * column OBX__EVENT_NCOLS. The payload itself is never read here: length(v.payload) IS NULL
 * (purged) reads its size only (SQLite: the record header; PostgreSQL: the TOAST pointer), where
 * v.payload IS NULL would read it whole. */
#define OBX__EVENT_COLS                                                                            \
    "e.seq, e.event_id, e.envelope_gen, e.state, e.claim_gen, e.owner, e.lease_until, "            \
    "e.attempt_gen, e.attempt_id, e.pinned_partition, e.rejections, e.available_at, "              \
    "e.next_check_at, e.unknown_since, e.primary_attempt_id, e.published_at, e.committed_at, "     \
    "e.updated_at, e.max_attempts, e.blind_retry, e.unordered, e.alias, "                          \
    "v.aggregate_type, v.aggregate_id, v.aggregate_version, v.event_type, v.payload_schema, "      \
    "v.payload_digest, v.tenant, v.occurred_at, v.created_txid, v.correlation_id, "                \
    "v.causation_id, v.traceparent, v.idempotency_key, v.envelope_digest, v.dest_cluster, "        \
    "v.dest_topic, v.dest_routing_key, v.dest_algorithm, v.dest_route_gen, v.dest_serializer, "    \
    "v.dest_durability, v.dest_acks, v.dest_digest, v.payload_len, length(v.payload) IS NULL, "    \
    "coalesce(t.event_id, e.event_id), coalesce(t.target_no, 0), e.held_at, v.not_before"
#define OBX__EVENT_NCOLS 51

/* A delayed event no relay has sent yet (PENDING since its enqueue, due at available_at): not
 * counted in the oldest PENDING age of the stats (obx status, /metrics), as it waits by design;
 * the audit's aged PENDING check ages it from its time (PENDING_AT). */
#define OBX__DELAYED_WAITING                                                                       \
    "(state = 'PENDING' AND attempt_gen = 0 AND available_at > committed_at)"

/* A backend's view of one result row. NULL reads as 0, false or "" (the backends' own rule). */
typedef struct obx__col_reader {
    int64_t (*i64)(void *ctx, int col);
    bool (*flag)(void *ctx, int col); /* a boolean column (SQLite: an integer, PostgreSQL: t/f) */
    /* copies the column's text into out (cap bytes, truncated, NUL-terminated) */
    void (*text)(void *ctx, int col, char *out, size_t cap);
    void *ctx;
} obx__col_reader;

/* Columns 0..OBX__EVENT_NCOLS-1 into r (every field but the payload, which the backend reads). */
void obx__event_decode(const obx__col_reader *rd, obx__event_row *r);
/* Columns attempt_id, event_id, envelope_gen, attempt_gen, claim_gen, owner, dest_digest,
 * partition, state, started_at, unknown_at, ended_at, offset_before, quiet_until, detail. a is
 * zeroed first. */
void obx__attempt_decode(const obx__col_reader *rd, obx__attempt_row *a);
/* Columns event_id, envelope_gen, attempt_id, kind, cluster, topic, partition, offset,
 * broker_ts, payload_digest, dest_digest, reason, created_at, source (an unknown source reads
 * as broker). r is zeroed first. */
void obx__receipt_decode(const obx__col_reader *rd, obx__receipt_row *r);
/* An envelope generation's frozen destination and digests (envelope_at), from obx_envelope. */
#define OBX__ENVELOPE_AT_COLS                                                                      \
    "dest_cluster, dest_topic, dest_routing_key, dest_algorithm, dest_route_gen, "                 \
    "dest_serializer, dest_durability, dest_acks, dest_digest, payload_digest, envelope_digest"
/* Columns OBX__ENVELOPE_AT_COLS into r (zeroed first). */
void obx__envelope_at_decode(const obx__col_reader *rd, obx__envelope_at_row *r);
/* Columns gen, event_type, cluster, topic, routing_key, algorithm, serializer, durability,
 * required_acks, max_attempts, blind_retry, unordered, alias, created_at, targets. r is zeroed
 * first. */
void obx__route_decode(const obx__col_reader *rd, obx__route_row *r);

/* A backend's query for each selector of obx__read_req (store.h, read_events). */
typedef struct obx__event_readers {
    obx_err (*ids)(obx__store *s, const char *const *ids, size_t n, unsigned flags, obx__rows *out);
    obx_err (*claim)(obx__store *s, const obx__claim_req *req, obx__rows *out);
    obx_err (*select)(obx__store *s, const obx__select_req *req, obx__rows *out);
    obx_err (*filter)(obx__store *s, const obx__event_filter *f, obx__rows *out);
    obx_err (*retention)(obx__store *s, const obx__retention_req *req, obx__rows *out);
    obx_err (*correlation)(obx__store *s, const char *correlation_id, size_t limit, obx__rows *out);
} obx__event_readers;

/* read_events over a backend's readers. */
obx_err obx__read_events(obx__store *s, const obx__read_req *req, const obx__event_readers *r,
                         obx__rows *out);

/* The migration runner, inside the caller's transaction: from is the schema version the caller
 * read in that transaction (the backend's schema_version; 0: none yet). scripts[v] takes a
 * database from version v-1 to v: scripts[1] is the store's baseline (schema.sql), scripts[2..]
 * the upgrade scripts of later versions; last is the highest (the stores pass
 * OBX__SCHEMA_VERSION). Refuses a database newer than last (OBX_ESCHEMA, naming both versions),
 * then for every version v after from up to last runs scripts[v] and records v in meta_table
 * (the backend's obx_meta, schema-qualified as it needs), each through exec(s, sql). A failing
 * script's error is prefixed "migration to schema version v"; what ran before it stays for the
 * caller's transaction to roll back. */
typedef obx_err (*obx__exec_fn)(obx__store *s, const char *sql);
obx_err obx__migrate_run(obx__store *s, int from, const char *const *scripts, int last,
                         const char *meta_table, obx__exec_fn exec);

/* Transaction nesting (store.h, "Transactions"), once for both stores. The outermost begin on
 * a connection that is not in a transaction opens one (the backend's begin: SQLite BEGIN
 * IMMEDIATE, PostgreSQL BEGIN); every other begin, including the first one on a connection the
 * caller (an application, the simulator) has already put in a transaction, opens savepoint
 * obx_sp<d>, d = the depth before it. Commit and rollback undo one level: our own outermost
 * transaction is committed or rolled back, a savepoint released or rolled back to; the caller's
 * transaction is never ended here. A commit without a begin is OBX_EINTERNAL; a rollback
 * without one does nothing. */
typedef struct obx__tx_nest {
    int depth;        /* open levels */
    bool outer_begin; /* level 1 is our BEGIN (not a savepoint in the caller's transaction) */
} obx__tx_nest;

typedef enum { OBX__SP_OPEN, OBX__SP_RELEASE, OBX__SP_ROLLBACK } obx__sp_op;

/* What a backend supplies: the primitive statements, nothing of the counting. */
typedef struct obx__tx_ops {
    /* Depth 0 only: *in_tx = the connection is in a transaction already (the caller's). May
     * refuse (PostgreSQL: a failed or busy connection). */
    obx_err (*in_tx)(obx__store *s, bool *in_tx);
    obx_err (*begin)(obx__store *s);    /* opens the outermost transaction */
    obx_err (*commit)(obx__store *s);   /* commits it */
    obx_err (*rollback)(obx__store *s); /* rolls it back */
    /* SAVEPOINT obx_sp<d>; RELEASE obx_sp<d>; ROLLBACK TO obx_sp<d> and RELEASE it */
    obx_err (*savepoint)(obx__store *s, int d, obx__sp_op op);
    /* Optional: the connection is gone, so nothing of the transaction survives it (the server
     * rolled it back): a rollback only counts down. */
    bool (*gone)(obx__store *s);
    /* Optional: called whenever the depth returns to 0 (after the statement). */
    void (*idle)(obx__store *s);
} obx__tx_ops;

obx_err obx__tx_begin(obx__store *s, obx__tx_nest *t, const obx__tx_ops *ops);
obx_err obx__tx_commit(obx__store *s, obx__tx_nest *t, const obx__tx_ops *ops);
obx_err obx__tx_rollback(obx__store *s, obx__tx_nest *t, const obx__tx_ops *ops);

/* A backend's begin, commit and rollback methods (prefix_begin, ...): its struct `type` keeps
 * the nesting in member `tx`, its statements are `ops`. */
#define OBX__TX_METHODS(prefix, type, ops)                                                         \
    static obx_err prefix##_begin(obx__store *s) {                                                 \
        return obx__tx_begin(s, &((type *)s)->tx, &ops);                                           \
    }                                                                                              \
    static obx_err prefix##_commit(obx__store *s) {                                                \
        return obx__tx_commit(s, &((type *)s)->tx, &ops);                                          \
    }                                                                                              \
    static obx_err prefix##_rollback(obx__store *s) {                                              \
        return obx__tx_rollback(s, &((type *)s)->tx, &ops);                                        \
    }

#endif /* OBX_STORE_SHARED_H */

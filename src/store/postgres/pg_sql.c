/*
 * pg_sql.c — the PostgreSQL store's statements: their text (sql_text, indexed by Q_* of
 * pg_int.h) and which of them only read (obx__pg_q_readonly), their names on a connection and
 * their preparing, and the framing of their array and record parameters (frame_arrays).
 *
 * Contracts (numbered as in pg_store.c):
 *   1. Every object lives in schema obx and every statement names it: obx works whatever the
 *      connection's search_path.
 *   2. Statements are prepared once per connection, on first use, under names derived from a
 *      hash of all statement texts ("obx_<hash>_<n>"). On a borrowed connection the names an
 *      earlier wrapper already prepared are read once from pg_prepared_statements: preparing a
 *      name twice would fail and abort the caller's transaction.
 *   7. Per order key (cluster, topic, routing key), seq order is commit order: see Q_INS_EVENT.
 */
#include "store/postgres/pg_int.h"

/* A delivery-set slot carries its logical event ID and target number (docs/migration.md). */
#define SLOT_JOIN " LEFT JOIN obx.obx_delivery_target t ON t.slot_id = e.event_id "
#define EVENT_FROM                                                                                 \
    " FROM obx.obx_event e JOIN obx.obx_envelope v ON v.event_id = e.event_id AND "                \
    "v.envelope_gen = e.envelope_gen" SLOT_JOIN
/* The same settings as one prepared statement each (set_config(.., true) is SET LOCAL), to go in
 * a pipeline, where a statement list cannot. */
#define RELAY_PLANS_SEL                                                                            \
    "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', "      \
    "true), set_config('enable_mergejoin', 'off', true), set_config('jit', 'off', true), "         \
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
#define CLAIM_PLANS_SEL                                                                            \
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)"
/* Written exactly as the predicate of index obx_event_unpublished. */
#define UNPUBLISHED                                                                                \
    "('PENDING','CLAIMED','SENDING','DISPATCH_UNKNOWN','RECONCILING','RETRY_CLAIMED','PARKED')"
#define ROUTE_COLS                                                                                 \
    "gen, event_type, cluster, topic, routing_key, algorithm, serializer, durability, "            \
    "required_acks, max_attempts, blind_retry, unordered, alias, created_at, "                     \
    "coalesce((SELECT s.targets FROM obx.obx_route_set s WHERE s.route_gen = obx_route.gen), 0), " \
    "encrypt_key"
#define ENV_COLS_LIST                                                                              \
    "(event_id, envelope_gen, aggregate_type, aggregate_id, aggregate_version, event_type, "       \
    "payload_schema, payload_digest, tenant, occurred_at, created_txid, correlation_id, "          \
    "causation_id, traceparent, idempotency_key, envelope_digest, dest_cluster, dest_topic, "      \
    "dest_routing_key, dest_algorithm, dest_route_gen, dest_serializer, dest_durability, "         \
    "dest_acks, dest_digest, payload, payload_len, created_at, not_before"
#define ENV_INS_COLS ENV_COLS_LIST ")"
/* the producer's envelope: also who enqueued ($50), its first audit row (created_by) */
#define ENV_INS_COLS_BY ENV_COLS_LIST ", created_by)"
/* The envelope's created_at (the producer's audit row's at, see PRODUCER_CTES_WITH): $28, or
 * where the client sends none (obx__event_row.at_server: obx_enqueue() on its host's clock) the
 * server's now, floored as obx.enqueue()'s now_ms, so that a producer whose host clock is off
 * writes no time relays decide on (docs/design.md, "One clock"). The statement's start, not
 * clock_timestamp(): a volatile function kept the INSERT's SELECT from being flattened, 42,000
 * more server instructions per enqueue than this (bench/producer_instr.sh, C variant) */
#define SERVER_AT                                                                                  \
    "coalesce($28::bigint, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)"
/* ENV_INS_VALS_WITH(txid, digest, nb): the envelope's values, created_txid and envelope_digest as
 * given (ENV_INS_VALS: parameters $11 and $16; Q_ENQ_WRITE: the server's), not_before the
 * statement's last parameter nb (after those the statement had before it: Q_INS_ENV $29,
 * Q_INS_EVENT $50, Q_INS_EVENT_AUDIT $51, Q_ENQ_WRITE and Q_ENQ_TRY $54: bound last) */
#define ENV_INS_VALS_WITH(txid, digest, nb)                                                        \
    "$1::text, $2::int, $3::text, $4::text, $5::bigint, $6::text, $7::text, $8::text, $9::text, "  \
    "$10::bigint, " txid ", $12::text, $13::text, $14::text, $15::text, " digest ", $17::text, "   \
    "$18::text, $19::text, $20::text, $21::bigint, $22::text, $23::text, $24::text, $25::text, "   \
    "$26::bytea, $27::bigint, " SERVER_AT ", " nb "::bigint"
#define ENV_INS_VALS(nb) ENV_INS_VALS_WITH("$11::text", "$16::text", nb)
#define ATT_COLS                                                                                   \
    "attempt_id, event_id, envelope_gen, attempt_gen, claim_gen, owner, dest_digest, partition, "  \
    "state, started_at, unknown_at, ended_at, offset_before, quiet_until, detail"
#define SEL(where, order)                                                                          \
    "SELECT " EVENT_COLS ", CASE WHEN $4::bool THEN v.payload END" EVENT_FROM where                \
    " AND ($2::text IS NULL OR e.dest_cluster = $2::text) ORDER BY " order " LIMIT $3::bigint"
#define SKIP_LOCKED " FOR UPDATE OF e SKIP LOCKED"
#define SEL_EXPIRED                                                                                \
    SEL("WHERE e.state = 'SENDING' AND e.lease_until <= $1::bigint", "e.lease_until, e.seq")
/* seq + 0, as in SEL_UNPUB_STATE: a generic plan (the relay's) could otherwise walk the primary
 * key in seq order through every published row, looking for the few in reconciliation (347 ms
 * at a million rows instead of 0.2 ms through obx_event_inflight). */
#define SEL_RECONCILE                                                                              \
    SEL("WHERE ((e.state = 'DISPATCH_UNKNOWN' AND e.next_check_at <= $1::bigint) OR "              \
        "(e.state IN ('RECONCILING','RETRY_CLAIMED') AND e.lease_until <= $1::bigint))",           \
        "e.seq + 0")
/* every statement of the select family binds the same first four parameters; this one has no
 * use for now ($1), but an unreferenced parameter would have no type when prepared */
#define SEL_STATE SEL("WHERE e.state = $5::text AND $1::bigint IS NOT NULL", "e.seq")
/* An unpublished state (operators' lists: UNKNOWN, PARKED): the literal list proves the
 * partial index obx_event_unpublished's predicate, and ordering by seq + 0 keeps the planner
 * from walking the primary key in seq order hoping to meet the rare state soon (the unpublished
 * rows are the newest: a generic plan of "state = $5 ORDER BY seq" read 200k rows for 50). The
 * read is bounded by the backlog, whatever the plan cache decides. */
#define SEL_UNPUB_STATE                                                                            \
    SEL("WHERE e.state = $5::text AND e.state IN ('PENDING','CLAIMED','SENDING',"                  \
        "'DISPATCH_UNKNOWN','RECONCILING','RETRY_CLAIMED','PARKED') AND $1::bigint IS NOT NULL",   \
        "e.seq + 0")
#define SEL_PUBBEFORE                                                                              \
    SEL("WHERE e.state = $5::text AND e.published_at <= $1::bigint", "e.published_at, e.seq")
#define LOAD(lock)                                                                                 \
    "SELECT " EVENT_COLS ", CASE WHEN $2::bool THEN v.payload END FROM unnest($1::text[]) WITH "   \
    "ORDINALITY AS k(id, ord) JOIN obx.obx_event e ON e.event_id = k.id JOIN obx.obx_envelope v "  \
    "ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen" SLOT_JOIN                     \
    "ORDER BY k.ord" lock

/* load_slots' events: per (attempt ID, event ID) pair, the event that registered the attempt,
 * else the one named (the attempts are read in the same pipeline, Q_LOAD_ATT) */
#define LOAD_SLOTS(lock)                                                                           \
    "SELECT " EVENT_COLS ", CASE WHEN $3::bool THEN v.payload END FROM unnest($1::text[], "        \
    "$2::text[]) WITH ORDINALITY AS k(aid, id, ord) LEFT JOIN obx.obx_attempt a ON "               \
    "a.attempt_id = k.aid JOIN obx.obx_event e ON e.event_id = coalesce(a.event_id, k.id) JOIN "   \
    "obx.obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen" SLOT_JOIN  \
    "ORDER BY k.ord" lock

#define RET_CANDIDATES                                                                             \
    "SELECT " EVENT_COLS EVENT_FROM "WHERE e.state = $1::text AND e.state IN ('PUBLISHED', "       \
    "'RETAINED', 'PURGED') AND e.published_at >= $2::bigint AND (e.published_at, e.seq) > "        \
    "($2::bigint, $3::bigint) AND e.published_at <= $4::bigint AND (e.published_at, e.seq) < "     \
    "($4::bigint, $5::bigint) ORDER BY e.published_at, e.seq LIMIT $6::bigint"
/* Audit queries (obx__aged_kind): the state predicates are written as the partial indexes'
 * (obx_event_claimable, obx_event_inflight, obx_event_state_pub, obx_event_unpublished,
 * obx_receipt_kind), so each scans only its small set, never the published bulk. */
#define AGED_LIST(cols, from_where, at, key, extra)                                                \
    "SELECT " cols " FROM " from_where extra " AND " at " <= $1::bigint AND (" at ", " key         \
    ") > ($2::bigint, $3::bigint) ORDER BY " at ", " key " LIMIT $4::bigint"
#define AGED_COUNT(from_where, at, extra)                                                          \
    "SELECT count(*), coalesce(min(" at "), 0) FROM " from_where extra " AND " at " <= $1::bigint"
#define UNKNOWN_AT "(CASE WHEN unknown_since > 0 THEN unknown_since ELSE updated_at END)"
/* a PENDING event ages from when it became due: a delayed one from its time, not its commit */
#define PENDING_AT "greatest(committed_at, available_at)"
#define EV_AGED(at) "event_id, " at ", seq, state"
/* The event ID consumers see (a delivery-set slot's logical event ID): what an inbox holds. */
#define EV_AGED_WIRE(at)                                                                           \
    "coalesce((SELECT t.event_id FROM obx.obx_delivery_target t WHERE t.slot_id = "                \
    "obx_event.event_id), event_id), " at ", seq, state"
/* Not a further target of a delivery set that its rule already counts as delivered (`any`, one
 * target published): that slot is still dispatched, but it is no overdue event (docs/migration.md,
 * "The contract"). */
#define NOT_TRAILING                                                                               \
    " AND NOT EXISTS (SELECT 1 FROM obx.obx_delivery_target t JOIN obx.obx_delivery_set d ON "     \
    "d.event_id = t.event_id AND d.completion = 'any' JOIN obx.obx_delivery_target t2 ON "         \
    "t2.event_id = t.event_id AND t2.slot_id <> t.slot_id JOIN obx.obx_event p ON p.event_id = "   \
    "t2.slot_id AND p.state IN ('PUBLISHED', 'RETAINED', 'PURGED') WHERE t.slot_id = "             \
    "obx_event.event_id)"
#define PENDING_W "obx.obx_event WHERE state IN ('PENDING', 'CLAIMED')"
#define UNKNOWN_W                                                                                  \
    "obx.obx_event WHERE state IN ('SENDING', 'DISPATCH_UNKNOWN', 'RECONCILING', "                 \
    "'RETRY_CLAIMED') AND state <> 'SENDING'"
#define PUBLISHED_W                                                                                \
    "obx.obx_event WHERE state IN ('PUBLISHED', 'RETAINED', 'PURGED') AND state = 'PUBLISHED'"
#define PARKED_W "obx.obx_event WHERE state IN " UNPUBLISHED " AND state = 'PARKED'"
#define ASSERTED_W "obx.obx_receipt WHERE source = 'asserted' AND kind = 'PRIMARY'"
#define QUAR_W "obx.obx_receipt WHERE kind IN ('QUARANTINED', 'MIGRATION') AND kind = 'QUARANTINED'"
#define IQUAR_W "obx.obx_inbox_quarantine WHERE true"
/* PENDING of a cluster without a live relay at `now` (a parameter: $2 in counts, $5 in lists) */
#define UNSERVED_W "obx.obx_event WHERE state IN ('PENDING', 'CLAIMED') AND state = 'PENDING'"
#define EV_UNSERVED "event_id, committed_at, seq, 'cluster ' || dest_cluster"
#define NO_LIVE_RELAY(now)                                                                         \
    " AND NOT EXISTS (SELECT 1 FROM obx.obx_relay_cluster h WHERE h.cluster = "                    \
    "obx_event.dest_cluster AND h.live_until >= " now ")"

/* The write set's own check (obx._ws_fail): when the CTE `cte` did not return `expected` rows
 * (-1: no check), obx._ws_fail() raises and fails the transaction, so that a COMMIT in the same
 * pipeline cannot commit a write set that did not apply whole (obx__pg_write_set). Its own UNION
 * ALL branch, evaluated even when `cte` is empty; `ids` (the rows that did not apply) and the
 * function run only then. type: the other branch's column type. */
#define WS_CHECK(expected, cte, what, ids, missing, type)                                          \
    "SELECT obx._ws_fail('" what "', " ids ", " missing ")::" type " FROM (SELECT count(*) AS "    \
    "c FROM " cte ") ck WHERE " expected "::int >= 0 AND ck.c <> " expected "::int"

/* The rows of Q_UPD_EVENTS / Q_UPD_ATT that did not apply, for WS_CHECK's message. */
#define UPD_EVENTS_MISSING                                                                         \
    "(SELECT string_agg(i.event_id, ', ') FROM unnest($1::obx._event_update[]) WITH ORDINALITY "   \
    "AS i WHERE i.ordinality NOT IN (SELECT ord FROM up))"
#define UPD_ATT_MISSING                                                                            \
    "(SELECT string_agg(i.attempt_id, ', ') FROM unnest($1::obx._attempt_update[]) AS i WHERE "    \
    "i.attempt_id NOT IN (SELECT attempt_id FROM ua))"

/* The statistics delta of a statement that moves events between states or inserts receipts:
 * no trigger counts them (schema.sql, obx_stat_delta). `moves` is a query of (k, d)
 * rows, one per key a row leaves (-1) or enters (+1); CTE `st` appends their net per key, CTE
 * `cp` (to be LEFT JOINed, one row) compacts the deltas in one statement of 256, as the
 * triggers did. */
#define STAT_DELTA(moves)                                                                          \
    "st AS (INSERT INTO obx.obx_stat_delta (key, n) SELECT k, sum(d) FROM (" moves ") x "          \
    "GROUP BY k HAVING sum(d) <> 0), cp AS MATERIALIZED (SELECT CASE WHEN random() < 1.0 / 256 "   \
    "THEN obx._compact_stats()::text END AS c)"

/* The statistics delta of the event a statement inserts (CTE `ev` returning its state): no
 * trigger counts inserts, every inserting statement does (schema.sql, obx_stat_delta).
 * Each of them inserts one event (scalar parameters, no arrays), so the delta is that row's,
 * without an aggregate (a hash table set up per statement). */
#define STAT_INSERTED                                                                              \
    "st AS (INSERT INTO obx.obx_stat_delta (key, n) SELECT 'state:' || state, 1 FROM ev)"

/* Per order key, seq order must be commit order: otherwise a producer that drew seq 10 and
 * commits after a producer that drew seq 11 lets a relay claim 11 while 10 is still
 * invisible, and the claim rule (no event behind an unpublished earlier one of its key)
 * cannot see the violation. So the transaction first takes a transaction-scoped advisory
 * lock on the order key's hash, and only then draws seq (the event INSERT consumes the
 * envelope CTE, which consumes the lock CTE). The lock is held until the producer's
 * transaction ends, and PostgreSQL makes a commit visible before it releases the
 * transaction's locks, so the next producer of that key draws a higher seq only after the
 * earlier event is visible. The lock is the key's own (a 64-bit hash of it), with its
 * bucket (one of 1024 of the key's 32-bit hash) taken shared: producers of unrelated keys never
 * wait for each other. A transaction's first ORDER_KEYS (64) events lock so; its later ones
 * lock their bucket exclusively instead, which holds back every key of the bucket (the shared
 * locks of the others) and bounds a bulk transaction to 64 + 1024 locks: a lock per key would
 * let one transaction of 10k keys exhaust the server's shared lock table, for every session.
 * The count is the transaction-local setting obx.order_locks (a subtransaction rolled back
 * takes its locks and its count with it). Cost: producers of one key serialize on their
 * commits; a bulk transaction past 64 events serializes with the keys of its buckets until it
 * commits. Taken for unordered routes too: an ordered event may follow an unordered one of the
 * same key, and the claim rule orders it behind it. Transactions that lock several keys in
 * different orders can deadlock: PostgreSQL detects it (40P01 -> OBX_EBUSY). obx.enqueue()
 * takes the same locks (schema.sql, obx_pg.c). */
#define ORDER_N "coalesce(nullif(current_setting('obx.order_locks', true), ''), '0')::int"
#define ORDER_BUCKET LOCK_CLASS_ORDER ", hashtext($29::text) & 1023"
#define ORDER_KEY "hashtextextended($29::text, " LOCK_CLASS_ORDER ")"
#define ORDER_COUNT "set_config('obx.order_locks', (" ORDER_N " + 1)::text, true)"
#define ORDER_LOCK                                                                                 \
    "CASE WHEN " ORDER_N " < 64 THEN pg_advisory_xact_lock_shared(" ORDER_BUCKET ")::text || "     \
    "pg_advisory_xact_lock(" ORDER_KEY ")::text || " ORDER_COUNT                                   \
    " ELSE pg_advisory_xact_lock(" ORDER_BUCKET ")::text END"
/* the same locks if they are free now (Q_ENQ_TRY): true when taken (or already held) */
#define ORDER_TRY_LOCK                                                                             \
    "CASE WHEN " ORDER_N " < 64 THEN pg_try_advisory_xact_lock_shared(" ORDER_BUCKET ") AND "      \
    "pg_try_advisory_xact_lock(" ORDER_KEY ") AND " ORDER_COUNT                                    \
    " IS NOT NULL ELSE pg_try_advisory_xact_lock(" ORDER_BUCKET ") END"
/* The event's times where the server supplied the envelope's created_at (SERVER_AT: $28 NULL):
 * committed_at and updated_at that now, available_at the later of not_before and it (a delayed
 * event); else the row's ($38, $43, $44) */
#define EV_AVAILABLE                                                                               \
    "CASE WHEN $28::bigint IS NULL THEN greatest(env.not_before, env.created_at) ELSE "            \
    "$38::bigint END"
#define EV_AT(p) "CASE WHEN $28::bigint IS NULL THEN env.created_at ELSE " p "::bigint END"
/* the event's $38..$44 */
#define EV_TIMES                                                                                   \
    EV_AVAILABLE                                                                                   \
    ", $39::bigint, $40::bigint, $41::text, $42::bigint, " EV_AT("$43") ", " EV_AT("$44")
/* INS_EVENT_CTES_WITH(head, cols, vals, src): the envelope's columns `cols` and values `vals`
 * selected from CTE `src`, which the CTEs in `head` end with (the order lock taken in it) */
#define INS_EVENT_CTES_WITH(head, cols, vals, src)                                                 \
    head                                                                                           \
        ", env AS (INSERT INTO obx.obx_envelope " cols " SELECT " vals " FROM " src                \
        " RETURNING event_id, created_at, not_before), "                                           \
        "ev AS (INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, "        \
        "correlation_id, "                                                                         \
        "order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen, attempt_id, " \
        "pinned_partition, rejections, available_at, next_check_at, unknown_since, "               \
        "primary_attempt_id, published_at, committed_at, updated_at, max_attempts, blind_retry, "  \
        "unordered, alias, dest_cluster) "                                                         \
        "SELECT env.event_id, $9::text, CASE WHEN $49::int >= 2 THEN NULL ELSE "                   \
        "nullif($15::text, '') END, $6::text, $12::text, $29::text, "                              \
        "$2::int, $30::text, $31::bigint, $32::text, $33::bigint, $34::int, $35::text, $36::int, " \
        "$37::int, " EV_TIMES ", $45::int, $46::bool, $47::bool, $48::text, $17::text FROM env "   \
        "RETURNING state), " STAT_INSERTED
#define INS_EVENT_CTES                                                                             \
    INS_EVENT_CTES_WITH("WITH lk AS MATERIALIZED (SELECT " ORDER_LOCK ")", ENV_INS_COLS,           \
                        ENV_INS_VALS("$50"), "lk")

#define RCPT_COLS                                                                                  \
    "event_id, envelope_gen, attempt_id, kind, cluster, topic, partition, \"offset\", "            \
    "broker_ts, payload_digest, dest_digest, reason, created_at, source"
#define CAUDIT_COLS "audit_id, at, consumer_id, event_id, outcome, duration_us, detail"

/* The producer's NOTIFY (delivered at commit, coalesced per transaction), only while a relay
 * of the event's cluster ($17) waits for work, and never where the session's obx.notify is 'off'
 * (the wake lock; schema.sql, obx._enqueue_sql). PostgreSQL commits the transactions that notified
 * one at a time, WAL flush included, which with fsync on costs producers up to half their commit
 * rate (docs/performance.md, section 3), so a statement notifies only when it cannot take the
 * cluster's wake lock shared: a waiting relay holds it exclusively. When it can, it holds the
 * lock until its transaction ends, after its commit is visible, and a relay that takes the lock
 * after that (obx__pg_wait_for_work) claims once more before it waits: either the relay is told, or
 * its next claim sees the event (docs/postgres.md, "NOTIFY"). CASE keeps the order: no lock for
 * a session that never notifies. */
#define NOTIFY_EXPR_BY(wake)                                                                       \
    "CASE WHEN current_setting('obx.notify', true) IS NOT DISTINCT FROM 'off' THEN NULL "          \
    "WHEN pg_try_advisory_xact_lock_shared(" LOCK_CLASS_WAKE ", hashtext($17::text)) THEN NULL "   \
    "ELSE " wake "($17::text) END"
/* obx._wake() calls obx._wake_c() where the extension is, else sends the NOTIFY; the cached-route
 * statements of a connection that has seen obx._wake_c() (pg_store.wake_c) call it directly: the
 * PL/pgSQL call, its search_path and its lookup were 49,000 of the server's instructions per
 * enqueue while a relay waits (docs/performance.md, section 3) */
#define NOTIFY_EXPR NOTIFY_EXPR_BY("obx._wake")
/* The end of every event-inserting statement: NOTIFY_EXPR, one row when the event was written. */
#define NOTIFY_TAIL_BY(wake) " SELECT " NOTIFY_EXPR_BY(wake) " FROM ev"
#define NOTIFY_TAIL NOTIFY_TAIL_BY("obx._wake")

/* The head of the producer's one-statement write (Q_INS_EVENT_AUDIT, Q_ENQ_WRITE) from CTE
 * `src`: the envelope records who enqueued ($50), which is the event's first audit row
 * (NONE -> PENDING; see producer_row) */
#define PRODUCER_CTES_WITH(head, vals, src)                                                        \
    INS_EVENT_CTES_WITH(head, ENV_INS_COLS_BY, vals ", $50::text", src)

/* Q_ENQ_WRITE and Q_ENQ_TRY: the route generation $21 the client built the row from is still
 * the type's current one, in the same table ($53, the route row's tableoid: a schema made again
 * numbers its generations from 1 again, test_enqueue_route_schema_remade), and has no delivery
 * set (see Q_ENQ_WRITE); created_txid and the envelope digest by the server (CTE f) */
#define ROUTE_STILL                                                                                \
    "$21::bigint = (SELECT max(r.gen) FROM obx.obx_route r WHERE r.event_type = $6::text AND "     \
    "r.tableoid = $53::oid) AND "                                                                  \
    "NOT EXISTS (SELECT 1 FROM obx.obx_route_set x WHERE x.route_gen = $21::bigint)"
#define TXID_FROM                                                                                  \
    "f AS MATERIALIZED (SELECT coalesce(nullif($11::text, ''), pg_current_xact_id()::text) AS "    \
    "txid FROM "
#define ENQ_VALS                                                                                   \
    ENV_INS_VALS_WITH("f.txid",                                                                    \
                      "coalesce(nullif($16::text, ''), 'sha256:' || "                              \
                      "encode(sha256($51::bytea || int4send(octet_length(f.txid)) "                \
                      "|| convert_to(f.txid, 'UTF8') || $52::bytea), 'hex'))",                     \
                      "$54")
/* Q_ENQ_WRITE and Q_ENQ_TRY, waking a waiting relay by the function wake (NOTIFY_EXPR_BY) */
#define ENQ_WRITE_BY(wake)                                                                         \
    PRODUCER_CTES_WITH("WITH lk AS MATERIALIZED (SELECT " ORDER_LOCK " WHERE " ROUTE_STILL         \
                       "), " TXID_FROM "lk)",                                                      \
                       ENQ_VALS, "f")                                                              \
    NOTIFY_TAIL_BY(wake)
#define ENQ_TRY_BY(wake)                                                                           \
    PRODUCER_CTES_WITH("WITH lk AS MATERIALIZED (SELECT " ORDER_TRY_LOCK                           \
                       " AS got WHERE " ROUTE_STILL "), " TXID_FROM "lk WHERE lk.got)",            \
                       ENQ_VALS, "f")                                                              \
    " SELECT lk.got, (SELECT " NOTIFY_EXPR_BY(wake) " FROM ev) FROM lk"

static const char *const sql_text[Q_COUNT] = {
    [Q_ROUTE_PUT] = "INSERT INTO obx.obx_route (event_type, cluster, topic, routing_key, "
                    "algorithm, serializer, durability, required_acks, max_attempts, blind_retry, "
                    "unordered, alias, created_at, encrypt_key) VALUES ($1::text, $2::text, "
                    "$3::text, $4::text, $5::text, $6::text, $7::text, $8::text, $9::int, "
                    "$10::bool, $11::bool, $12::text, $13::bigint, $14::text) RETURNING gen",
    [Q_ROUTE_GET] = "SELECT " ROUTE_COLS ", tableoid::bigint FROM obx.obx_route WHERE "
                    "event_type = $1::text "
                    "ORDER BY gen DESC LIMIT 1",
    [Q_ROUTE_LIST_CUR] = "SELECT DISTINCT ON (event_type) " ROUTE_COLS
                         " FROM obx.obx_route ORDER BY event_type, gen DESC",
    [Q_ROUTE_LIST_ALL] = "SELECT " ROUTE_COLS " FROM obx.obx_route ORDER BY event_type, gen",
    [Q_IDEM] = "SELECT event_id FROM obx.obx_event WHERE tenant = $1::text AND "
               "idempotency_key = $2::text",
    /* route_get and the producer's created_txid, the top-level transaction's ID (also from
     * inside a savepoint), in one round trip (route_get_txid); last, whether obx._wake_c() is
     * there (pg_store.wake_c) */
    [Q_ROUTE_GET_TXID] = "SELECT " ROUTE_COLS ", tableoid::bigint, pg_current_xact_id()::text, "
                         "to_regprocedure('obx._wake_c(text)') IS NOT NULL FROM obx.obx_route "
                         "WHERE event_type = $1::text ORDER BY gen DESC LIMIT 1",
    [Q_INS_ENV] = "INSERT INTO obx.obx_envelope " ENV_INS_COLS " VALUES (" ENV_INS_VALS("$29") ")",
    /* Q_INS_EVENT: see INS_EVENT_CTES (per order key, seq order is commit order) */
    [Q_INS_EVENT] = INS_EVENT_CTES NOTIFY_TAIL,
    /* the same, and the producer's audit row of the insert, recorded in the envelope
     * (insert_event_audit: the producer's write in one round trip; see producer_row) */
    [Q_INS_EVENT_AUDIT] = PRODUCER_CTES_WITH("WITH lk AS MATERIALIZED (SELECT " ORDER_LOCK ")",
                                             ENV_INS_VALS("$51"), "lk") NOTIFY_TAIL,
    /* Q_INS_EVENT_AUDIT when the client has the route from an earlier enqueue (enqueue_write):
     * written only while the current route of the event type $6 is still the one the row
     * was built from, generation $21 without a delivery set, else nothing (no row: the client
     * reads the route again). The generation (in its table, $53) is the whole comparison:
     * a generation's row cannot change (obx_route_frozen), so its
     * number stands for every field the row copied; comparing each of them in a CTE over the route
     * row cost 34,000 instructions per enqueue (docs/performance.md, section 3). The server
     * supplies what the client could only learn by another round trip: created_txid (unless $11
     * names one) and so the envelope digest (unless $16 is the client's, over $11). The client
     * sends the canonical encoding (src/core/canon.c) up to created_txid's field ($51) and after it
     * ($52); the server adds the field and takes the SHA-256 (test_store_pg recomputes it in
     * C). obx.envelope_digest inlined here, encoding all sixteen fields, was a
     * quarter of the server's instructions per enqueue (docs/performance.md, section 3). */
    [Q_ENQ_WRITE] = ENQ_WRITE_BY("obx._wake"),
    /* Q_ENQ_WRITE without a savepoint around it (enqueue_try): the order-key bucket's lock
     * only if it is free now, so that the statement never waits for a lock and so cannot fail
     * on a lock timeout or a deadlock. One row when the cached route is still current: got is
     * true when the event was written, false when the bucket was busy (nothing written: the
     * savepoint pipeline follows and waits for it); no row when the route changed. */
    [Q_ENQ_TRY] = ENQ_TRY_BY("obx._wake"),
    /* the same two where the connection saw obx._wake_c() at its last route read (NOTIFY_EXPR_BY;
     * pg_enqueue.c, enqueue_write) */
    [Q_ENQ_WRITE_WC] = ENQ_WRITE_BY("obx._wake_c"),
    [Q_ENQ_TRY_WC] = ENQ_TRY_BY("obx._wake_c"),
    /* docs/design.md, "Claims, attempts and fencing": earliest due first (available_at, then
     * seq); PENDING when available, CLAIMED when its lease expired; never behind an unpublished
     * earlier event of the same order key unless unordered. The walk of obx_event_claimable
     * (available_at, seq) reads the due rows only and stops at the limit or at the first row not
     * yet due, so a delayed backlog costs a claim nothing (issue 51). available_at <= $1 holds
     * for every CLAIMED row whose lease expired: a claim needs available_at <= now and sets
     * lease_until past that now, and only a claim makes a row CLAIMED. Rows locked by another
     * relay's claim are skipped, but the NOT EXISTS still sees them as unpublished, so a locked
     * head of a key holds back the rest of the key, and so does a delayed one not yet due.
     * $5: a payload over the relay's ceiling (NULL: obx_meta's payload_limit) is not read:
     * octet_length() of a TOASTed value reads its header, not its bytes. */
    [Q_CLAIM] =
        "SELECT " EVENT_COLS ", CASE WHEN octet_length(v.payload) <= coalesce($5::bigint, "
        "(SELECT m.value::bigint FROM obx.obx_meta m WHERE m.key = 'payload_limit'), 1048576) "
        "THEN v.payload END" EVENT_FROM "WHERE e.state IN ('PENDING','CLAIMED') "
        "AND e.available_at <= $1::bigint "
        "AND (e.state = 'PENDING' OR e.lease_until <= $1::bigint) "
        "AND ($2::text IS NULL OR e.dest_cluster = $2::text) "
        "AND ($4::text[] IS NULL OR e.alias = ANY ($4::text[])) "
        "AND (e.unordered OR NOT EXISTS (SELECT 1 FROM obx.obx_event p "
        "     WHERE p.order_key = e.order_key AND p.seq < e.seq AND p.state IN " UNPUBLISHED
        ")) ORDER BY e.available_at, e.seq LIMIT $3::bigint" SKIP_LOCKED,
    [Q_SEL_EXPIRED] = SEL_EXPIRED,
    [Q_SEL_EXPIRED_LOCK] = SEL_EXPIRED SKIP_LOCKED,
    [Q_SEL_RECONCILE] = SEL_RECONCILE,
    [Q_SEL_RECONCILE_LOCK] = SEL_RECONCILE SKIP_LOCKED,
    [Q_SEL_STATE] = SEL_STATE,
    [Q_SEL_STATE_LOCK] = SEL_STATE SKIP_LOCKED,
    [Q_SEL_PUBBEFORE] = SEL_PUBBEFORE,
    [Q_SEL_PUBBEFORE_LOCK] = SEL_PUBBEFORE SKIP_LOCKED,
    [Q_LOAD] = LOAD(""),
    /* acceptance locks the event row (docs/design.md, "The single acceptance point"): wait for
       it, never skip it */
    [Q_LOAD_LOCK] = LOAD(" FOR UPDATE OF e"),
    [Q_LOAD_SLOTS] = LOAD_SLOTS(""),
    [Q_LOAD_SLOTS_LOCK] = LOAD_SLOTS(" FOR UPDATE OF e"),
    [Q_UPD_EVENTS] =
        "WITH up AS (UPDATE obx.obx_event e SET envelope_gen = u.envelope_gen, state = u.state, "
        "claim_gen = u.claim_gen, owner = u.owner, lease_until = u.lease_until, "
        "attempt_gen = u.attempt_gen, attempt_id = u.attempt_id, "
        "pinned_partition = u.pinned_partition, rejections = u.rejections, "
        "available_at = u.available_at, next_check_at = u.next_check_at, "
        "unknown_since = u.unknown_since, primary_attempt_id = u.primary_attempt_id, "
        "published_at = u.published_at, updated_at = u.updated_at, order_key = u.order_key, "
        "dest_cluster = u.dest_cluster, held_at = u.held_at "
        "FROM unnest($1::obx._event_update[]) WITH ORDINALITY AS u(event_id, envelope_gen, "
        "state, claim_gen, owner, lease_until, attempt_gen, attempt_id, pinned_partition, "
        "rejections, available_at, next_check_at, unknown_since, primary_attempt_id, "
        "published_at, updated_at, order_key, dest_cluster, expect_state, expect_claim_gen, "
        "held_at, ord) "
        "WHERE e.event_id = u.event_id AND e.state = u.expect_state "
        "AND e.claim_gen = u.expect_claim_gen RETURNING u.ord, u.expect_state, "
        "u.state), " STAT_DELTA(
            "SELECT 'state:' || expect_state AS k, -1 AS d FROM up UNION ALL "
            "SELECT 'state:' || state, 1 FROM up") " SELECT up.ord FROM up LEFT JOIN cp ON true"
                                                   " UNION ALL " WS_CHECK("$2", "up", "event",
                                                                          UPD_EVENTS_MISSING,
                                                                          "false", "bigint"),
    [Q_INS_ATT] = "INSERT INTO obx.obx_attempt (" ATT_COLS ") SELECT " ATT_COLS
                  " FROM unnest($1::obx._attempt_insert[]) AS t(" ATT_COLS ")",
    [Q_UPD_ATT] = "WITH ua AS (UPDATE obx.obx_attempt a SET partition = u.partition, "
                  "state = u.state, "
                  "unknown_at = u.unknown_at, ended_at = u.ended_at, "
                  "offset_before = u.offset_before, quiet_until = u.quiet_until, "
                  "detail = u.detail FROM unnest($1::obx._attempt_update[]) AS "
                  "u(attempt_id, partition, state, unknown_at, ended_at, offset_before, "
                  "quiet_until, detail) WHERE a.attempt_id = u.attempt_id RETURNING "
                  "a.attempt_id) SELECT attempt_id FROM ua UNION ALL " WS_CHECK(
                      "$2", "ua", "attempt", UPD_ATT_MISSING, "true", "text"),
    [Q_LOAD_ATT] = "SELECT a.attempt_id, a.event_id, a.envelope_gen, a.attempt_gen, a.claim_gen, "
                   "a.owner, a.dest_digest, a.partition, a.state, a.started_at, a.unknown_at, "
                   "a.ended_at, a.offset_before, a.quiet_until, a.detail FROM "
                   "unnest($1::text[]) WITH ORDINALITY AS k(id, ord) JOIN obx.obx_attempt a ON "
                   "a.attempt_id = k.id ORDER BY k.ord",
    [Q_LOAD_ATT_EVENT] = "SELECT " ATT_COLS " FROM obx.obx_attempt WHERE event_id = $1::text "
                         "ORDER BY started_at, attempt_gen, attempt_id",
    [Q_INS_RCPT] =
        "WITH t AS MATERIALIZED (SELECT * FROM unnest($1::obx._receipt_insert[]) WITH "
        "ORDINALITY AS t(event_id, envelope_gen, attempt_id, kind, cluster, topic, "
        "partition, off, broker_ts, payload_digest, dest_digest, reason, detail, "
        "created_at, source, ord)), " STAT_DELTA(
            "SELECT 'receipt:' || kind AS k, 1 AS d FROM t") " INSERT INTO obx.obx_receipt "
                                                             "(event_id, envelope_gen, attempt_id, "
                                                             "kind, "
                                                             "cluster, topic, partition, "
                                                             "\"offset\", broker_ts, "
                                                             "payload_digest, "
                                                             "dest_digest, reason, detail, "
                                                             "created_at, source) "
                                                             "SELECT event_id, envelope_gen, "
                                                             "attempt_id, kind, cluster, topic, "
                                                             "partition, "
                                                             "off, broker_ts, payload_digest, "
                                                             "dest_digest, reason, detail, "
                                                             "created_at, "
                                                             "source FROM t LEFT JOIN cp ON true "
                                                             "ORDER BY ord",
    [Q_LOAD_RCPT] = "SELECT " RCPT_COLS " FROM obx.obx_receipt WHERE event_id = $1::text "
                    "ORDER BY receipt_id",
    /* One obx_audit_batch row, the arrays as given, filed under the range of
     * the rows' seqs ($12, $13; every row's seq known). */
    [Q_INS_AUDIT] = "INSERT INTO obx.obx_audit_batch (seqs, at, actor, who, event_id, "
                    "envelope_gen, from_state, to_state, claim_gen, attempt_id, attempt_gen, "
                    "reason) VALUES (int8range($12::bigint, $13::bigint, '[]'), $1::bigint[], "
                    "$2::text[], $3::text[], $4::text[], $5::int[], $6::text[], $7::text[], "
                    "$8::bigint[], $9::text[], $10::int[], $11::text[])",
    /* The same when some seq is not known: looked up; a row whose event does not exist (none
     * is expected) becomes an obx_audit row. */
    [Q_INS_AUDIT_FIND] =
        "WITH t AS MATERIALIZED (SELECT t.*, e.seq FROM unnest($1::bigint[], "
        "$2::text[], $3::text[], $4::text[], $5::int[], $6::text[], $7::text[], "
        "$8::bigint[], $9::text[], $10::int[], $11::text[]) WITH ORDINALITY AS t(at, "
        "actor, who, event_id, envelope_gen, from_state, to_state, claim_gen, "
        "attempt_id, attempt_gen, reason, ord) LEFT JOIN obx.obx_event e ON "
        "e.event_id = t.event_id), b AS (INSERT INTO obx.obx_audit_batch (seqs, "
        "at, actor, who, event_id, envelope_gen, from_state, to_state, claim_gen, "
        "attempt_id, attempt_gen, reason) SELECT int8range(min(seq), max(seq), '[]'), "
        "array_agg(at ORDER BY ord), array_agg(actor ORDER BY ord), "
        "array_agg(who ORDER BY ord), array_agg(event_id ORDER BY ord), "
        "array_agg(envelope_gen ORDER BY ord), array_agg(from_state ORDER BY ord), "
        "array_agg(to_state ORDER BY ord), array_agg(claim_gen ORDER BY ord), "
        "array_agg(attempt_id ORDER BY ord), array_agg(attempt_gen ORDER BY ord), "
        "array_agg(reason ORDER BY ord) FROM t WHERE seq IS NOT NULL "
        "HAVING count(*) > 0) "
        "INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, "
        "from_state, to_state, claim_gen, attempt_id, attempt_gen, reason) "
        "SELECT at, actor, who, event_id, envelope_gen, from_state, to_state, "
        "claim_gen, attempt_id, attempt_gen, reason FROM t WHERE seq IS NULL "
        "ORDER BY ord",
    /* An event's rows in the order written: its first row when its envelope records it
     * (created_by, as producer_row writes it), then its rows of both tables (obx_audit,
     * obx_audit_batch): its batches are those whose seq range holds its seq (GiST) and whose event
     * IDs name it. */
    [Q_LOAD_AUDIT] = "SELECT at, actor, who, event_id, envelope_gen, from_state, to_state, "
                     "claim_gen, attempt_id, attempt_gen, reason FROM (SELECT audit_id, "
                     "1::bigint AS ord, at, actor, who, event_id, envelope_gen, from_state, "
                     "to_state, claim_gen, attempt_id, attempt_gen, reason FROM obx.obx_audit "
                     "WHERE event_id = $1::text UNION ALL SELECT 0, 1, v.created_at, "
                     "'producer', v.created_by, v.event_id, 1, 'NONE', 'PENDING', 0, '', 0, "
                     "'enqueued under route generation ' || v.dest_route_gen FROM "
                     "obx.obx_envelope v WHERE v.event_id = $1::text AND v.envelope_gen = 1 AND "
                     "v.created_by IS NOT NULL UNION ALL SELECT b.audit_id, u.ord, u.at, "
                     "u.actor, u.who, u.event_id, u.envelope_gen, u.from_state, u.to_state, "
                     "u.claim_gen, u.attempt_id, u.attempt_gen, u.reason FROM obx.obx_event e "
                     "JOIN obx.obx_audit_batch b ON b.seqs @> e.seq AND $1::text = ANY "
                     "(b.event_id) CROSS JOIN LATERAL unnest(b.at, b.actor, b.who, b.event_id, "
                     "b.envelope_gen, b.from_state, b.to_state, b.claim_gen, b.attempt_id, "
                     "b.attempt_gen, b.reason) WITH ORDINALITY AS u(at, actor, who, event_id, "
                     "envelope_gen, from_state, to_state, claim_gen, attempt_id, attempt_gen, "
                     "reason, ord) WHERE e.event_id = $1::text AND u.event_id = $1::text) x "
                     "ORDER BY audit_id, ord",
    [Q_COUNTER_ADD] = "INSERT INTO obx.obx_counter AS c (name, value) VALUES ($1::text, "
                      "$2::bigint) ON CONFLICT (name) DO UPDATE SET value = c.value + "
                      "EXCLUDED.value",
    [Q_COUNTER_GET] = "SELECT value FROM obx.obx_counter WHERE name = $1::text",
    /* the registry row and this relay's heartbeat row in one statement */
    [Q_CLUSTER_PUT] = "WITH h AS (INSERT INTO obx.obx_relay_cluster AS h (relay, cluster, seen_at, "
                      "live_until) VALUES ($7::text, $1::text, $8::bigint, $9::bigint) ON CONFLICT "
                      "(relay, cluster) DO UPDATE SET seen_at = EXCLUDED.seen_at, live_until = "
                      "EXCLUDED.live_until) "
                      "INSERT INTO obx.obx_cluster AS c (cluster, backend, lookup, durability, "
                      "required_acks, serializer, relay, seen_at) VALUES ($1::text, $2::text, "
                      "$3::text, $4::text, $5::text, $6::text, $7::text, $8::bigint) ON CONFLICT "
                      "(cluster) DO UPDATE SET backend = EXCLUDED.backend, lookup = "
                      "EXCLUDED.lookup, durability = EXCLUDED.durability, required_acks = "
                      "EXCLUDED.required_acks, serializer = EXCLUDED.serializer, relay = "
                      "EXCLUDED.relay, seen_at = EXCLUDED.seen_at",
    [Q_CLUSTER_GET] = "SELECT cluster, backend, lookup, durability, required_acks, serializer, "
                      "relay, seen_at FROM obx.obx_cluster WHERE cluster = $1::text",
    /* the dashboard's charts: one row per slot, the first writer keeps it; older slots go */
    [Q_SERIES_PUT] = "WITH d AS (DELETE FROM obx.obx_series WHERE slot < $4::bigint) INSERT INTO "
                     "obx.obx_series (slot, at, sample) VALUES ($1::bigint, $2::bigint, $3::text) "
                     "ON CONFLICT (slot) DO NOTHING",
    [Q_SERIES_LIST] = "SELECT slot, at, sample FROM obx.obx_series WHERE slot >= $1::bigint "
                      "ORDER BY slot LIMIT $2::bigint",
    [Q_ENV_AT] = "SELECT " OBX__ENVELOPE_AT_COLS " FROM obx.obx_envelope WHERE event_id = "
                 "$1::text AND envelope_gen = $2::integer",
    /* from the unpublished slots (index obx_event_unpublished), never the published bulk */
    [Q_DOPEN] = "WITH u AS (SELECT t.event_id FROM obx.obx_event e JOIN obx.obx_delivery_target t "
                "ON t.slot_id = e.event_id WHERE e.state IN " UNPUBLISHED "), "
                "s AS (SELECT x.event_id, d.completion, EXISTS (SELECT 1 FROM "
                "obx.obx_delivery_target t2 JOIN obx.obx_event p ON p.event_id = t2.slot_id "
                "WHERE t2.event_id = x.event_id AND p.state IN ('PUBLISHED','RETAINED','PURGED')) "
                "AS delivered_one FROM (SELECT DISTINCT event_id FROM u) x JOIN "
                "obx.obx_delivery_set d ON d.event_id = x.event_id) "
                "SELECT (SELECT count(*) FROM s WHERE completion = 'all'), "
                "(SELECT count(*) FROM s WHERE completion = 'any' AND NOT delivered_one), "
                "(SELECT count(*) FROM u JOIN s ON s.event_id = u.event_id WHERE s.completion = "
                "'any' AND s.delivered_one)",
    [Q_STATS] = "SELECT k, v FROM obx._stats()",
    [Q_STATS_INV] =
        "SELECT (SELECT count(*) FROM obx.obx_event e WHERE e.state IN ('PUBLISHED','RETAINED',"
        "'PURGED') AND NOT EXISTS (SELECT 1 FROM obx.obx_receipt r WHERE r.event_id = e.event_id "
        "AND r.envelope_gen = e.envelope_gen AND r.kind = 'PRIMARY')), "
        "(SELECT count(*) FROM obx.obx_receipt r JOIN obx.obx_event e ON e.event_id = r.event_id "
        "WHERE r.kind = 'PRIMARY' AND (e.state NOT IN ('PUBLISHED','RETAINED','PURGED') OR "
        "r.envelope_gen <> e.envelope_gen)), "
        "(SELECT count(*) FROM (SELECT 1 FROM obx.obx_receipt WHERE kind = 'PRIMARY' GROUP BY "
        "event_id, envelope_gen HAVING count(*) > 1) x), "
        "(SELECT count(*) FROM obx.obx_event e WHERE e.state = 'CANCELLED' AND EXISTS (SELECT 1 "
        "FROM obx.obx_attempt a WHERE a.event_id = e.event_id))",
    [Q_UNKNOWN_RES] = "SELECT e.published_at - min(a.unknown_at) FROM obx.obx_event e JOIN "
                      "obx.obx_attempt a ON a.event_id = e.event_id WHERE a.unknown_at > 0 AND "
                      "e.published_at > 0 GROUP BY e.event_id, e.published_at",
    /* correlation_id <> '' lets the planner use the partial index obx_event_corr for any
     * parameter (an empty correlation ID means "none" and finds nothing) */
    [Q_FIND_CORR] = "SELECT " EVENT_COLS EVENT_FROM "WHERE e.correlation_id = $1::text AND "
                    "e.correlation_id <> '' ORDER BY e.seq LIMIT $2::bigint",
    [Q_INBOX_GET] = "SELECT consumer_id, event_id, payload_digest, event_type, tenant, outcome, "
                    "result, topic, partition, \"offset\", consumed_at, duration_us, "
                    "envelope_gen, attempt_id, dest_digest FROM obx.obx_inbox WHERE "
                    "consumer_id = $1::text AND event_id = $2::text",
    [Q_INBOX_PUT] = "INSERT INTO obx.obx_inbox (consumer_id, event_id, payload_digest, "
                    "event_type, tenant, outcome, result, topic, partition, \"offset\", "
                    "consumed_at, duration_us, envelope_gen, attempt_id, dest_digest) VALUES "
                    "($1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text, "
                    "$8::text, $9::int, $10::bigint, $11::bigint, $12::bigint, $13::int, "
                    "$14::text, $15::text)",
    [Q_INBOX_FINISH] = "UPDATE obx.obx_inbox SET result = $1::text, duration_us = $2::bigint "
                       "WHERE consumer_id = $3::text AND event_id = $4::text",
    /* obx__inbox_key: a digest '' matches on the ID alone */
    [Q_INBOX_HAS] =
        "SELECT k.ord FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[]) "
        "WITH ORDINALITY AS k(id, pd, gen, dd, ord) WHERE EXISTS (SELECT 1 FROM "
        "obx.obx_inbox i WHERE i.consumer_id = $1::text AND i.event_id = k.id AND "
        "(k.pd = '' OR (i.payload_digest = k.pd AND i.envelope_gen = k.gen AND k.gen > 0 AND "
        "(k.dd = '' OR i.dest_digest = k.dd) AND NOT EXISTS (SELECT 1 FROM "
        "obx.obx_inbox_quarantine q WHERE q.consumer_id = $1::text AND "
        "q.event_id = k.id))))",
    [Q_WM_PUT] = "INSERT INTO obx.obx_consumer_watermark AS w (consumer_id, topic, partition, "
                 "\"offset\", event_id, occurred_at, committed_at) VALUES ($1::text, $2::text, "
                 "$3::int, $4::bigint, $5::text, $6::bigint, $7::bigint) "
                 "ON CONFLICT (consumer_id, topic, partition) DO UPDATE SET "
                 "event_id = CASE WHEN EXCLUDED.\"offset\" >= w.\"offset\" THEN EXCLUDED.event_id "
                 "ELSE w.event_id END, "
                 "occurred_at = CASE WHEN EXCLUDED.\"offset\" >= w.\"offset\" THEN "
                 "EXCLUDED.occurred_at ELSE w.occurred_at END, "
                 "\"offset\" = greatest(w.\"offset\", EXCLUDED.\"offset\"), "
                 "committed_at = EXCLUDED.committed_at",
    [Q_WM_LIST] = "SELECT consumer_id, topic, partition, \"offset\", event_id, occurred_at, "
                  "committed_at FROM obx.obx_consumer_watermark WHERE consumer_id = $1::text "
                  "ORDER BY topic, partition",
    [Q_WM_LIST_ALL] = "SELECT consumer_id, topic, partition, \"offset\", event_id, occurred_at, "
                      "committed_at FROM obx.obx_consumer_watermark "
                      "ORDER BY consumer_id, topic, partition",
    [Q_FAIL_BUMP] = "INSERT INTO obx.obx_inbox_failure AS f (consumer_id, event_id, failures, "
                    "last_error, first_at, last_at, next_at) VALUES ($1::text, $2::text, 1, "
                    "$3::text, $4::bigint, $4::bigint, $5::bigint) ON CONFLICT (consumer_id, "
                    "event_id) DO UPDATE SET failures = f.failures + 1, last_error = "
                    "EXCLUDED.last_error, last_at = EXCLUDED.last_at, next_at = EXCLUDED.next_at "
                    "RETURNING failures",
    [Q_FAIL_GET] = "SELECT failures, next_at FROM obx.obx_inbox_failure f WHERE consumer_id = "
                   "$1::text AND ($2::text IS NULL OR event_id = $2::text) AND ($2::text IS NOT "
                   "NULL OR NOT EXISTS (SELECT 1 FROM obx.obx_poison p WHERE p.consumer_id = "
                   "f.consumer_id AND p.event_id = f.event_id AND p.state = 'PARKED')) ORDER BY "
                   "next_at LIMIT 1",
    [Q_FAIL_CLEAR] = "DELETE FROM obx.obx_inbox_failure WHERE consumer_id = $1::text AND "
                     "event_id = $2::text",
    [Q_RETRY_PUT] = "INSERT INTO obx.obx_inbox_retry (consumer_id, event_id, payload_digest, "
                    "topic, partition, \"offset\", headers, payload, kept_at) VALUES ($1::text, "
                    "$2::text, $3::text, $4::text, $5::int, $6::bigint, $7::text, $8::bytea, "
                    "$9::bigint) ON CONFLICT (consumer_id, event_id) DO NOTHING",
    [Q_RETRY_LIST] = "SELECT r.consumer_id, r.event_id, r.payload_digest, r.topic, r.partition, "
                     "r.\"offset\", r.headers, r.payload, r.kept_at, coalesce(f.next_at, 0) AS due "
                     "FROM obx.obx_inbox_retry r LEFT JOIN obx.obx_inbox_failure f ON "
                     "f.consumer_id = r.consumer_id AND f.event_id = r.event_id WHERE "
                     "r.consumer_id = $1::text AND coalesce(f.next_at, 0) <= $2::bigint "
                     "ORDER BY due, r.kept_at LIMIT $3::bigint",
    [Q_RETRY_DEL] = "DELETE FROM obx.obx_inbox_retry WHERE consumer_id = $1::text AND "
                    "event_id = $2::text",
    [Q_POISON_PUT] = "INSERT INTO obx.obx_poison (consumer_id, event_id, state, failures, "
                     "last_error, topic, partition, \"offset\", headers, payload, parked_at, "
                     "updated_at, payload_digest) VALUES ($1::text, $2::text, $3::text, $4::int, "
                     "$5::text, $6::text, $7::int, $8::bigint, $9::text, $10::bytea, "
                     "$11::bigint, $12::bigint, $13::text) "
                     "ON CONFLICT (consumer_id, event_id, payload_digest) DO UPDATE SET "
                     "state = EXCLUDED.state, failures = EXCLUDED.failures, "
                     "last_error = EXCLUDED.last_error, updated_at = EXCLUDED.updated_at",
    [Q_POISON_LIST] = "SELECT consumer_id, event_id, state, failures, last_error, topic, "
                      "partition, \"offset\", headers, parked_at, updated_at, payload_digest "
                      "FROM obx.obx_poison WHERE ($1::text IS NULL OR consumer_id = $1::text) "
                      "AND ($2::text IS NULL OR state = $2::text) "
                      "ORDER BY parked_at, event_id, payload_digest",
    [Q_POISON_GET] = "SELECT consumer_id, event_id, state, failures, last_error, topic, "
                     "partition, \"offset\", headers, parked_at, updated_at, payload_digest, "
                     "payload FROM obx.obx_poison WHERE consumer_id = $1::text AND "
                     "event_id = $2::text AND ($3::text IS NULL OR payload_digest = $3::text) "
                     "ORDER BY state = 'PARKED' DESC, updated_at DESC LIMIT 1",
    [Q_POISON_STATE] = "UPDATE obx.obx_poison SET state = $1::text, updated_at = $2::bigint "
                       "WHERE consumer_id = $3::text AND event_id = $4::text",
    [Q_INBOX_QUAR] = "INSERT INTO obx.obx_inbox_quarantine (consumer_id, event_id, "
                     "payload_digest, first_digest, reason, at) VALUES ($1::text, $2::text, "
                     "$3::text, $4::text, $5::text, $6::bigint)",
    [Q_CONSUME_AUDIT] = "INSERT INTO obx.obx_consume_audit (at, consumer_id, event_id, outcome, "
                        "duration_us, detail) SELECT at, consumer_id, event_id, outcome, "
                        "duration_us, detail FROM unnest($1::bigint[], $2::text[], $3::text[], "
                        "$4::text[], $5::bigint[], $6::text[]) WITH ORDINALITY AS t(at, "
                        "consumer_id, event_id, outcome, duration_us, detail, ord) ORDER BY ord",
    /* Publication order between two exclusive places. The redundant state IN (...) is the
     * predicate of the partial index obx_event_state_pub, so that a generic plan (state is a
     * parameter) can still use it; the plain bounds on published_at give the range scan. */
    [Q_RET_CANDIDATES] = RET_CANDIDATES,
    [Q_RET_CANDIDATES_LOCK] = RET_CANDIDATES SKIP_LOCKED,
    /* every envelope generation of each event; the trigger allows exactly payload -> NULL */
    [Q_PURGE_PAYLOADS] = "UPDATE obx.obx_envelope v SET payload = NULL FROM unnest($1::text[]) AS "
                         "k(id) WHERE v.event_id = k.id AND v.payload IS NOT NULL RETURNING "
                         "v.payload_len",
    [Q_AGED_LIST + OBX__AGED_PENDING] =
        AGED_LIST(EV_AGED(PENDING_AT), PENDING_W, PENDING_AT, "seq", NOT_TRAILING),
    [Q_AGED_LIST + OBX__AGED_UNKNOWN] =
        AGED_LIST(EV_AGED(UNKNOWN_AT), UNKNOWN_W, UNKNOWN_AT, "seq", NOT_TRAILING),
    [Q_AGED_LIST + OBX__AGED_PUBLISHED] =
        AGED_LIST(EV_AGED_WIRE("published_at"), PUBLISHED_W, "published_at", "seq", ""),
    [Q_AGED_LIST + OBX__AGED_PARKED] =
        AGED_LIST(EV_AGED("updated_at"), PARKED_W, "updated_at", "seq", ""),
    [Q_AGED_LIST + OBX__AGED_QUARANTINED] = AGED_LIST("event_id, created_at, receipt_id, reason",
                                                      QUAR_W, "created_at", "receipt_id", ""),
    [Q_AGED_LIST + OBX__AGED_INBOX_QUARANTINED] =
        AGED_LIST("event_id, at, quarantine_id, reason", IQUAR_W, "at", "quarantine_id",
                  " AND consumer_id = $5::text"),
    [Q_AGED_COUNT + OBX__AGED_PENDING] = AGED_COUNT(PENDING_W, PENDING_AT, NOT_TRAILING),
    [Q_AGED_COUNT + OBX__AGED_UNKNOWN] = AGED_COUNT(UNKNOWN_W, UNKNOWN_AT, NOT_TRAILING),
    [Q_AGED_COUNT + OBX__AGED_PUBLISHED] = AGED_COUNT(PUBLISHED_W, "published_at", ""),
    [Q_AGED_COUNT + OBX__AGED_PARKED] = AGED_COUNT(PARKED_W, "updated_at", ""),
    [Q_AGED_COUNT + OBX__AGED_QUARANTINED] = AGED_COUNT(QUAR_W, "created_at", ""),
    [Q_AGED_COUNT + OBX__AGED_INBOX_QUARANTINED] =
        AGED_COUNT(IQUAR_W, "at", " AND consumer_id = $2::text"),
    [Q_AGED_LIST + OBX__AGED_ASSERTED] = AGED_LIST("event_id, created_at, receipt_id, reason",
                                                   ASSERTED_W, "created_at", "receipt_id", ""),
    [Q_AGED_COUNT + OBX__AGED_ASSERTED] = AGED_COUNT(ASSERTED_W, "created_at", ""),
    [Q_AGED_LIST + OBX__AGED_UNSERVED] = AGED_LIST(EV_UNSERVED, UNSERVED_W, "committed_at", "seq",
                                                   NO_LIVE_RELAY("$5::bigint") NOT_TRAILING),
    [Q_AGED_COUNT + OBX__AGED_UNSERVED] =
        AGED_COUNT(UNSERVED_W, "committed_at", NO_LIVE_RELAY("$2::bigint") NOT_TRAILING),
    [Q_UNSERVED] =
        "SELECT dest_cluster, count(*), min(committed_at) FROM " UNSERVED_W NO_LIVE_RELAY(
            "$1::bigint") " GROUP BY dest_cluster ORDER BY dest_cluster",
    [Q_FIND] =
        "SELECT " EVENT_COLS EVENT_FROM "WHERE ($1::text IS NULL OR e.event_type = $1::text) "
        "AND ($2::text IS NULL OR v.dest_cluster = $2::text) "
        "AND ($3::text IS NULL OR v.dest_topic = $3::text) "
        "AND ($4::text[] IS NULL OR e.alias = ANY ($4::text[])) "
        "AND ($5::text[] IS NULL OR e.state = ANY ($5::text[])) "
        "AND e.committed_at >= $6::bigint AND ($7::bigint = 0 OR e.committed_at < "
        "$7::bigint) AND e.seq > $8::bigint AND (NOT $10::bool OR e.held_at > 0) "
        "AND ($11::bigint = 0 OR (e.unknown_since > 0 AND e.unknown_since < $11::bigint)) "
        "ORDER BY e.seq LIMIT $9::bigint",
    /* the set and its targets in one statement (contract 4) */
    [Q_RSET_PUT] = "WITH s AS (INSERT INTO obx.obx_route_set (route_gen, completion, targets) "
                   "VALUES ($1::bigint, $2::text, $3::int)) "
                   "INSERT INTO obx.obx_route_target (route_gen, target_no, cluster, topic, "
                   "routing_key, algorithm, serializer, durability, required_acks) SELECT "
                   "$1::bigint, t.* FROM unnest($4::int[], $5::text[], $6::text[], $7::text[], "
                   "$8::text[], $9::text[], $10::text[], $11::text[]) AS t",
    [Q_RSET_GET] = "SELECT s.completion, t.target_no, t.cluster, t.topic, t.routing_key, "
                   "t.algorithm, t.serializer, t.durability, t.required_acks FROM "
                   "obx.obx_route_set s LEFT JOIN obx.obx_route_target t ON t.route_gen = "
                   "s.route_gen WHERE s.route_gen = $1::bigint ORDER BY t.target_no",
    /* The set row unless present; the targets only when the set's rule is the one given (a
     * new set, or the same contract): fewer rows back than targets given = another rule. */
    /* the set row once (a WITH clause's INSERT runs whether or not the query reads it), then
     * the targets: a taken target number or slot violates their keys */
    [Q_DSET_PUT] = "WITH s AS (INSERT INTO obx.obx_delivery_set (event_id, completion, route_gen, "
                   "created_at) VALUES ($1::text, $2::text, $3::bigint, $4::bigint) ON CONFLICT "
                   "(event_id) DO NOTHING) INSERT INTO obx.obx_delivery_target (slot_id, "
                   "event_id, target_no, origin, created_at) SELECT t.slot, $1::text, t.no, "
                   "t.origin, t.at FROM unnest($5::text[], $6::int[], $7::text[], $8::bigint[]) "
                   "AS t(slot, no, origin, at)",
    [Q_DGET] = "SELECT d.event_id, d.completion, d.route_gen, d.created_at, t.target_no, "
               "t.slot_id, t.origin, t.created_at FROM obx.obx_delivery_set d JOIN "
               "obx.obx_delivery_target t ON t.event_id = d.event_id WHERE d.event_id = "
               "coalesce((SELECT x.event_id FROM obx.obx_delivery_target x WHERE x.slot_id = "
               "$1::text), $1::text) ORDER BY t.target_no",
    [Q_DSTATS] = "SELECT count(*), coalesce(sum(CASE WHEN (d.completion = 'all' AND x.pub = x.n) "
                 "OR (d.completion = 'any' AND x.pub > 0) THEN 1 ELSE 0 END), 0) FROM "
                 "obx.obx_delivery_set d JOIN (SELECT t.event_id, count(*) AS n, count(*) FILTER "
                 "(WHERE e.state IN ('PUBLISHED','RETAINED','PURGED')) AS pub FROM "
                 "obx.obx_delivery_target t JOIN obx.obx_event e ON e.event_id = t.slot_id "
                 "GROUP BY t.event_id) x ON x.event_id = d.event_id",
    [Q_RCPT_DETAIL] = "SELECT coalesce(detail, '') FROM obx.obx_receipt WHERE event_id = $1::text "
                      "AND kind = $2::text ORDER BY receipt_id",
    [Q_SET_ALIAS] = "UPDATE obx.obx_event e SET alias = $3::text FROM unnest($1::text[]) WITH "
                    "ORDINALITY AS k(id, ord) WHERE e.event_id = k.id AND e.alias = $2::text AND "
                    "e.state IN ('PENDING', 'PARKED') RETURNING k.ord",
    /* The literal IN list lets a generic plan use the partial index obx_receipt_kind. */
    [Q_RCPT_KIND_SPARSE] = "SELECT " RCPT_COLS " FROM obx.obx_receipt WHERE kind = $1::text AND "
                           "kind IN ('QUARANTINED','MIGRATION') ORDER BY receipt_id DESC "
                           "LIMIT $2::bigint",
    [Q_RCPT_KIND_ANY] = "SELECT " RCPT_COLS " FROM obx.obx_receipt WHERE kind = $1::text "
                        "ORDER BY receipt_id DESC LIMIT $2::bigint",
    [Q_RECENT_PUB] = "SELECT e.event_id, v.dest_topic, e.published_at FROM obx.obx_event e JOIN "
                     "obx.obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = "
                     "e.envelope_gen WHERE e.state = 'PUBLISHED' ORDER BY e.published_at DESC "
                     "LIMIT $1::bigint",
    [Q_CAUDIT_EVENT] = "SELECT " CAUDIT_COLS " FROM obx.obx_consume_audit WHERE event_id = "
                       "$2::text AND ($1::text IS NULL OR consumer_id = $1::text) AND audit_id > "
                       "$3::bigint ORDER BY audit_id LIMIT $4::bigint",
    [Q_CAUDIT_AFTER] = "SELECT " CAUDIT_COLS " FROM obx.obx_consume_audit WHERE audit_id > "
                       "$3::bigint AND ($1::text IS NULL OR consumer_id = $1::text) AND "
                       "($2::text IS NULL) ORDER BY audit_id LIMIT $4::bigint",
    [Q_CAUDIT_NEWEST] = "SELECT " CAUDIT_COLS " FROM obx.obx_consume_audit WHERE ($2::text IS "
                        "NULL OR event_id = $2::text) AND ($1::text IS NULL OR consumer_id = "
                        "$1::text) AND $3::bigint < 0 ORDER BY audit_id DESC LIMIT $4::bigint",
    [Q_SEL_UNPUB_STATE] = SEL_UNPUB_STATE,
    [Q_SEL_UNPUB_STATE_LOCK] = SEL_UNPUB_STATE SKIP_LOCKED,
    [Q_RELAY_PLANS] = RELAY_PLANS_SEL,
    [Q_CLAIM_PLANS] = CLAIM_PLANS_SEL,
};

/* Statements that only read: run standalone on an owned connection found lost, they are
 * retried once on a new connection (contract 6). A write is never retried: whether a lost
 * statement took effect is unknown. */
const bool obx__pg_q_readonly[Q_COUNT] = {
    [Q_ROUTE_GET] = true,
    [Q_ROUTE_LIST_CUR] = true,
    [Q_ROUTE_LIST_ALL] = true,
    [Q_IDEM] = true,
    [Q_SEL_EXPIRED] = true,
    [Q_SEL_RECONCILE] = true,
    [Q_SEL_STATE] = true,
    [Q_SEL_PUBBEFORE] = true,
    [Q_LOAD] = true,
    [Q_LOAD_SLOTS] = true,
    [Q_LOAD_ATT] = true,
    [Q_LOAD_ATT_EVENT] = true,
    [Q_LOAD_RCPT] = true,
    [Q_LOAD_AUDIT] = true,
    [Q_COUNTER_GET] = true,
    [Q_CLUSTER_GET] = true,
    [Q_SERIES_LIST] = true,
    [Q_DOPEN] = true,
    [Q_ENV_AT] = true,
    [Q_STATS] = true,
    [Q_STATS_INV] = true,
    [Q_UNKNOWN_RES] = true,
    [Q_FIND_CORR] = true,
    [Q_INBOX_GET] = true,
    [Q_INBOX_HAS] = true,
    [Q_WM_LIST] = true,
    [Q_WM_LIST_ALL] = true,
    [Q_POISON_LIST] = true,
    [Q_POISON_GET] = true,
    [Q_RET_CANDIDATES] = true,
    [Q_AGED_LIST + OBX__AGED_PENDING] = true,
    [Q_AGED_LIST + OBX__AGED_UNKNOWN] = true,
    [Q_AGED_LIST + OBX__AGED_PUBLISHED] = true,
    [Q_AGED_LIST + OBX__AGED_PARKED] = true,
    [Q_AGED_LIST + OBX__AGED_QUARANTINED] = true,
    [Q_AGED_LIST + OBX__AGED_INBOX_QUARANTINED] = true,
    [Q_AGED_COUNT + OBX__AGED_PENDING] = true,
    [Q_AGED_COUNT + OBX__AGED_UNKNOWN] = true,
    [Q_AGED_COUNT + OBX__AGED_PUBLISHED] = true,
    [Q_AGED_COUNT + OBX__AGED_PARKED] = true,
    [Q_AGED_COUNT + OBX__AGED_QUARANTINED] = true,
    [Q_AGED_COUNT + OBX__AGED_INBOX_QUARANTINED] = true,
    [Q_AGED_LIST + OBX__AGED_ASSERTED] = true,
    [Q_AGED_COUNT + OBX__AGED_ASSERTED] = true,
    [Q_FIND] = true,
    [Q_RSET_GET] = true,
    [Q_DGET] = true,
    [Q_DSTATS] = true,
    [Q_RCPT_DETAIL] = true,
    [Q_RCPT_KIND_SPARSE] = true,
    [Q_RCPT_KIND_ANY] = true,
    [Q_RECENT_PUB] = true,
    [Q_CAUDIT_EVENT] = true,
    [Q_CAUDIT_AFTER] = true,
    [Q_CAUDIT_NEWEST] = true,
};

/* ---- statement names ----------------------------------------------------------------------- */

static char name_prefix[24]; /* "obx_<8 hex>_" */
static pthread_once_t name_once = PTHREAD_ONCE_INIT;

/* The prefix hashes every statement text, so a connection shared by two library versions never
 * runs one version's statement under the other's name. */
static void name_init(void) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < Q_COUNT; i++)
        for (const char *p = sql_text[i]; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    snprintf(name_prefix, sizeof name_prefix, "obx_%08x_", h);
}

void obx__pg_stmt_name(int id, char out[40]) {
    pthread_once(&name_once, name_init);
    snprintf(out, 40, "%s%d", name_prefix, id);
}

/* The declared array type of each statement's parameters, read once from the statement texts:
 * param_types[id][n] for $n. */
enum { PT_NONE, PT_TEXT_ARR, PT_INT4_ARR, PT_INT8_ARR, PT_OTHER_ARR };
static unsigned char param_types[Q_COUNT][PMAX + 1];
static pthread_once_t param_types_once = PTHREAD_ONCE_INIT;

static void param_types_init(void) {
    for (int id = 0; id < Q_COUNT; id++)
        for (const char *c = sql_text[id]; *c; c++) {
            if (*c != '$' || c[1] < '1' || c[1] > '9') continue;
            char *end;
            long n = strtol(c + 1, &end, 10);
            if (n < 1 || n > PMAX || strncmp(end, "::", 2)) continue;
            const char *t = end + 2;
            size_t tl = strspn(t, "abcdefghijklmnopqrstuvwxyz0123456789");
            if (strncmp(t + tl, "[]", 2)) continue;
            unsigned char k = PT_OTHER_ARR;
            if (tl == 4 && !strncmp(t, "text", 4))
                k = PT_TEXT_ARR;
            else if (tl == 3 && !strncmp(t, "int", 3))
                k = PT_INT4_ARR;
            else if (tl == 6 && !strncmp(t, "bigint", 6))
                k = PT_INT8_ARR;
            param_types[id][n] = k;
        }
}

/* An A_RECORD parameter framed: the array's header (one dimension of acount rows, lower bound
 * 1, no NULL rows, the row type's OID) in front of its rows. */
/* A binary array's header: one dimension of count elements, lower bound 1 (none for an empty
 * array), whether some element is NULL, the element type. */
static void array_header(obx__buf *f, int count, bool nulls, uint32_t oid) {
    obx__buf_u32be(f, count ? 1 : 0);
    obx__buf_u32be(f, nulls ? 1 : 0);
    obx__buf_u32be(f, oid);
    if (count) {
        obx__buf_u32be(f, (uint32_t)count);
        obx__buf_u32be(f, 1);
    }
}

/* Parameter i becomes the framed array f (binary), in place of what was collected. */
static obx_err frame_set(params *p, int i, obx__buf f, const char *what) {
    if (f.oom) {
        obx__buf_free(&f);
        return obx__fail(OBX_ENOMEM, "%s: out of memory", what);
    }
    obx__buf_free(&p->arr[i]);
    p->arr[i] = f;
    p->val[i] = (const char *)f.data;
    p->len[i] = (int)f.len;
    p->fmt[i] = 1;
    p->akind[i] = A_FRAMED;
    return OBX_OK;
}

static obx_err frame_records(pg_store *s, params *p, int i, const char *what) {
    obx_err e = obx__pg_rec_oids(s);
    if (e) return e;
    obx__buf f = {0};
    array_header(&f, p->acount[i], false, s->rec_oid[p->rtype[i]]);
    if (p->acount[i]) obx__buf_put(&f, p->arr[i].data, p->arr[i].len);
    return frame_set(p, i, f, what);
}

/* Frames the collected array parameters of statement id (see A_*): one dimension, lower bound
 * 1, each element as a length (-1: NULL) and its bytes in network order. Idempotent. */
static obx_err frame_arrays(pg_store *s, params *p, int id, const char *what) {
    pthread_once(&param_types_once, param_types_init);
    for (int i = 0; i < p->n; i++) {
        unsigned char k = p->akind[i];
        if (k == A_RECORD) {
            obx_err e = frame_records(s, p, i, what);
            if (e) return e;
            continue;
        }
        if (k != A_TEXT && k != A_INT) continue;
        unsigned char t = param_types[id][i + 1];
        uint32_t oid = 25; /* text */
        if (k == A_INT && t == PT_INT4_ARR)
            oid = 23;
        else if (k == A_INT && t == PT_INT8_ARR)
            oid = 20;
        else if (k != A_TEXT || t != PT_TEXT_ARR)
            return obx__fail(OBX_EINTERNAL,
                             "postgres: %s: parameter $%d is an array of %s, the statement does "
                             "not declare it so",
                             what, i + 1, k == A_TEXT ? "text" : "integers");
        obx__buf f = {0};
        int count = p->acount[i];
        array_header(&f, count, p->anull[i], oid);
        if (k == A_TEXT) {
            obx__buf_put(&f, p->arr[i].data, p->arr[i].len);
        } else {
            for (int j = 0; j < count; j++) {
                int64_t v;
                memcpy(&v, p->arr[i].data + (size_t)j * sizeof v, sizeof v);
                if (oid == 23) {
                    if (v < INT32_MIN || v > INT32_MAX) {
                        obx__buf_free(&f);
                        return obx__fail(OBX_EINVAL,
                                         "postgres: %s: parameter $%d, element %d: %lld is out of "
                                         "range for an integer column (-2147483648..2147483647)",
                                         what, i + 1, j + 1, (long long)v);
                    }
                    put_int4(&f, (int32_t)v);
                } else {
                    put_int8(&f, v);
                }
            }
        }
        obx_err e = frame_set(p, i, f, what);
        if (e) return e;
    }
    return OBX_OK;
}

static bool p_oom(const params *p) {
    for (int i = 0; i < p->n; i++)
        if (p->arr[i].oom) return true;
    return false;
}

/* p ready to send with statement id: built without running out of memory, arrays framed. */
obx_err obx__pg_p_ready(pg_store *s, params *p, int id, const char *what) {
    if (p_oom(p)) return obx__fail(OBX_ENOMEM, "%s: out of memory", what);
    return frame_arrays(s, p, id, what);
}

/* Borrowed connection: which of our names are prepared already (contract 2). */
static obx_err check_names(pg_store *s) {
    char pattern[40];
    pthread_once(&name_once, name_init);
    snprintf(pattern, sizeof pattern, "%s%%", name_prefix);
    const char *v[1] = {pattern};
    PGresult *r = NULL;
    obx_err e = obx__pg_check(
        s,
        PQexecParams(s->conn, "SELECT name FROM pg_prepared_statements WHERE name LIKE $1::text", 1,
                     NULL, v, NULL, NULL, 0),
        PGRES_TUPLES_OK, &r, "read prepared statements");
    if (e) return e;
    size_t pl = strlen(name_prefix);
    for (int i = 0; i < PQntuples(r); i++) {
        const char *nm = PQgetvalue(r, i, 0);
        /* LIKE's '_' matches any character: compare the prefix exactly */
        if (strlen(nm) > pl && !strncmp(nm, name_prefix, pl)) {
            int id = atoi(nm + pl);
            if (id >= 0 && id < Q_COUNT) s->prepared[id] = true;
        }
    }
    PQclear(r);
    s->names_checked = true;
    return OBX_OK;
}

obx_err obx__pg_prepare(pg_store *s, int id) {
    if (s->prepared[id]) return OBX_OK;
    obx_err e;
    if (!s->owned && !s->names_checked) {
        if ((e = check_names(s))) return e;
        if (s->prepared[id]) return OBX_OK;
    }
    char name[40];
    obx__pg_stmt_name(id, name);
    e = obx__pg_check(s, PQprepare(s->conn, name, sql_text[id], 0, NULL), PGRES_COMMAND_OK, NULL,
                      "prepare");
    if (!e) s->prepared[id] = true;
    return e;
}

/*
 * pg_store.c — the PostgreSQL outbox store (libpq): many relay processes on many machines
 * sharing one database, and producers in any language (the SQL function obx.enqueue() in
 * schema.sql).
 *
 * Owns: one PGconn (opened here, or borrowed from a producer/consumer with obx_store_wrap_pg),
 * the names of the statements prepared on it, the nesting of obx transactions on it, and its
 * LISTEN state.
 *
 * Contracts:
 *   1. Every object lives in schema obx and every statement names it: obx works whatever the
 *      connection's search_path.
 *   2. Statements are prepared once per connection, on first use, under names derived from a
 *      hash of all statement texts ("obx_<hash>_<n>"). On a borrowed connection the names an
 *      earlier wrapper already prepared are read once from pg_prepared_statements: preparing a
 *      name twice would fail and abort the caller's transaction.
 *   3. Transactions nest: the outermost begin on a connection that is not in a transaction is
 *      BEGIN (READ COMMITTED, the server default); every other begin is a SAVEPOINT. obx never
 *      commits nor rolls back a transaction it did not begin.
 *   4. A batch is one round trip: rows travel as parameter arrays that the statement
 *      unnest()s; per-row results (update_events' applied[]) come back by ordinality. A batch
 *      that names the same row twice is cut into runs without repeats, executed in order, so
 *      that it behaves as the same calls one by one.
 *   5. Errors (map_error): OB001 from the frozen-data triggers -> OBX_EIMMUTABLE; 23505 unique
 *      violation -> OBX_ECONFLICT; 42501 insufficient privilege (row-level security included)
 *      -> OBX_EDENIED; 40001 serialization failure, 40P01 deadlock, 55P03 lock
 *      timeout, 57014 statement timeout -> OBX_EBUSY (retriable: the server rolled the
 *      statement back; inside a transaction the caller rolls back and retries the whole
 *      transaction); a lost connection -> OBX_ECONNLOST; a connection lost while COMMIT was in
 *      flight -> OBX_EUNKNOWN (the server may or may not have committed), never success.
 *      A standalone statement (no transaction open) that lost a serialization or deadlock race
 *      is retried here, since nothing of it was applied.
 *   6. A lost owned connection is re-established (PQreset) at the next call outside a
 *      transaction; inside one every call fails with OBX_ECONNLOST until the caller has rolled
 *      back to depth 0. A borrowed connection is never reset.
 *   7. Per order key (cluster, topic, routing key), seq order is commit order: see Q_INS_EVENT.
 *   8. wait_for_work LISTENs on channel obx_work (on first use) and polls the socket; the
 *      statement inserting an event NOTIFYs (delivered at commit; Q_INS_EVENT, obx.enqueue())
 *      while a relay of the event's cluster waits for work (NOTIFY_EXPR, the wake lock).
 *      A notification is a hint, never a row. Where the database has the obx_pg extension the
 *      wait is spent in the server (server_wait), and obx.enqueue()'s C body wakes it by its
 *      latch after the commit instead of a NOTIFY, which serializes commits.
 *
 * Thread use: one thread at a time per handle (obx.h); the statement-name hash is computed
 * once per process under pthread_once.
 */
#include "store/shared.h"

#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char obx__pg_schema[];

/* Migrations by target version: index v holds the script that takes a database from v-1 to v
 * (1: the baseline, schema.sql). */
static const char *const migrations[] = {NULL, obx__pg_schema};
_Static_assert(sizeof migrations / sizeof *migrations == OBX__SCHEMA_VERSION + 1,
               "one script per schema version");

/* Advisory lock class IDs ("OBX" and "OBY"): the two-key form keeps obx's locks apart from an
 * application's single-bigint advisory locks. */
#define LOCK_CLASS_ORDER "5194328" /* per order-key bucket: seq order = commit order */
#define LOCK_CLASS_INIT 5194329    /* serializes concurrent `obx init` */
/* With LOCK_CLASS_INIT: the schema in use (pg_schema_hold). Each relay connection holds it
 * shared for its life; `obx init` takes it exclusively, for its transaction, to migrate. */
#define LOCK_SCHEMA_IN_USE 1
/* The wake lock, one per cluster (key hashtext(cluster)): held exclusively by the relay
 * connection that waits for that cluster's work (pg_wait_for_work), tested shared by each
 * event-inserting statement, which NOTIFYs only when it cannot take it (NOTIFY_EXPR). */
#define LOCK_CLASS_WAKE "5194330"
#define NOTIFY_CHANNEL "obx_work"

enum {
    Q_ROUTE_PUT,
    Q_ROUTE_GET,
    Q_ROUTE_LIST_CUR,
    Q_ROUTE_LIST_ALL,
    Q_IDEM,
    Q_ROUTE_GET_TXID,
    Q_INS_ENV,
    Q_INS_EVENT,
    Q_INS_EVENT_AUDIT,
    Q_ENQ_WRITE,
    Q_ENQ_TRY,
    Q_CLAIM,
    Q_RELAY_PLANS,
    Q_CLAIM_PLANS,
    Q_SEL_EXPIRED,
    Q_SEL_EXPIRED_LOCK,
    Q_SEL_RECONCILE,
    Q_SEL_RECONCILE_LOCK,
    Q_SEL_STATE,
    Q_SEL_STATE_LOCK,
    Q_SEL_PUBBEFORE,
    Q_SEL_PUBBEFORE_LOCK,
    Q_LOAD,
    Q_LOAD_LOCK,
    Q_LOAD_SLOTS,
    Q_LOAD_SLOTS_LOCK,
    Q_UPD_EVENTS,
    Q_INS_ATT,
    Q_UPD_ATT,
    Q_LOAD_ATT,
    Q_LOAD_ATT_EVENT,
    Q_INS_RCPT,
    Q_LOAD_RCPT,
    Q_INS_AUDIT,
    Q_INS_AUDIT_FIND,
    Q_LOAD_AUDIT,
    Q_COUNTER_ADD,
    Q_COUNTER_GET,
    Q_STATS,
    Q_STATS_INV,
    Q_UNKNOWN_RES,
    Q_FIND_CORR,
    Q_INBOX_GET,
    Q_INBOX_PUT,
    Q_INBOX_FINISH,
    Q_INBOX_HAS,
    Q_WM_PUT,
    Q_WM_LIST,
    Q_WM_LIST_ALL,
    Q_FAIL_BUMP,
    Q_FAIL_GET,
    Q_FAIL_CLEAR,
    Q_POISON_PUT,
    Q_POISON_LIST,
    Q_POISON_GET,
    Q_POISON_STATE,
    Q_INBOX_QUAR,
    Q_CONSUME_AUDIT,
    Q_FIND,
    Q_RSET_PUT,
    Q_RSET_GET,
    Q_DSET_PUT,
    Q_DGET,
    Q_DSTATS,
    Q_RCPT_DETAIL,
    Q_SET_ALIAS,
    Q_RET_CANDIDATES,
    Q_RET_CANDIDATES_LOCK,
    Q_PURGE_PAYLOADS,
    Q_RCPT_KIND_SPARSE,
    Q_RCPT_KIND_ANY,
    Q_RECENT_PUB,
    Q_CAUDIT_EVENT,
    Q_CAUDIT_AFTER,
    Q_CAUDIT_NEWEST,
    Q_SEL_UNPUB_STATE,
    Q_SEL_UNPUB_STATE_LOCK,
    Q_CLUSTER_PUT,
    Q_CLUSTER_GET,
    Q_SERIES_PUT,
    Q_SERIES_LIST,
    Q_UNSERVED,
    Q_DOPEN,
    Q_ENV_AT,
    Q_AGED_LIST,                                  /* + obx__aged_kind */
    Q_AGED_COUNT = Q_AGED_LIST + OBX__AGED_COUNT, /* + obx__aged_kind */
    Q_COUNT = Q_AGED_COUNT + OBX__AGED_COUNT
};

struct ws_stmt;

/* The row types of the relay's batch statements' parameters (schema.sql), by name. */
enum { RT_EVENT_UPDATE, RT_ATTEMPT_INSERT, RT_ATTEMPT_UPDATE, RT_RECEIPT_INSERT, RT_COUNT };

typedef struct pg_store {
    obx__store base;
    PGconn *conn;
    bool owned;
    obx__tx_nest tx; /* transaction nesting (shared.c) */
    bool lost;       /* the connection was lost inside the current obx transaction */
    bool listening;  /* LISTEN obx_work issued on this connection */
    /* obx._wait_for_work() (the obx_pg extension) in this database: 0 not looked up yet, 1 yes,
     * -1 no (pg_wait_for_work) */
    int wait_fn;
    /* The wake lock of the cluster this connection claims for (pg_wait_for_work): the cluster
     * of its last claim (read_claim), the lock's key once read, and whether this session holds
     * it (from its wait until a claim takes a whole batch). */
    char wake_cluster[OBX_NAME_MAX + 1];
    int32_t wake_key;
    bool wake_key_known, wake_held;
    bool dispatch; /* serve_dispatch: every BEGIN sets the relay's planner options */
    unsigned pend; /* P_*: what goes in front of the next statement (ws_run, pend_flush) */
    /* a relay transaction's write set, held back for its COMMIT's pipeline (pg_write_set);
     * owned; sent before anything else the transaction sends (conn_ready) */
    struct ws_stmt *held;
    size_t n_held;
    bool names_checked; /* borrowed connection: pg_prepared_statements read */
    bool prepared[Q_COUNT];
    uint32_t rec_oid[RT_COUNT]; /* the row types' OIDs (rec_oids); 0: not read yet */
    bool rec_stale; /* a row type changed under the connection: prepare its statements again */
} pg_store;

#define EVENT_COLS OBX__EVENT_COLS   /* shared.h */
#define EVENT_NCOLS OBX__EVENT_NCOLS /* the payload, when selected, is column EVENT_NCOLS */
/* A delivery-set slot carries its logical event ID and target number (docs/migration.md). */
#define SLOT_JOIN " LEFT JOIN obx.obx_delivery_target t ON t.slot_id = e.event_id "
#define EVENT_FROM                                                                                 \
    " FROM obx.obx_event e JOIN obx.obx_envelope v ON v.event_id = e.event_id AND "                \
    "v.envelope_gen = e.envelope_gen" SLOT_JOIN
/* The relay's planner options, for the rest of a transaction (relay_plans): plan once, without
 * sequential scans, hash or merge joins, or JIT compilation (a generic plan's cost estimate for
 * a LIMIT $n walk of a million-row index passes jit_above_cost: 165 ms of compilation for a
 * 2 ms claim, on every call). */
#define RELAY_PLANS                                                                                \
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; "                            \
    "SET LOCAL enable_mergejoin = off; SET LOCAL jit = off; "                                      \
    "SET LOCAL plan_cache_mode = force_generic_plan"
/* The claim must walk obx_event_claimable in seq order and stop at the limit (relay_plans). */
#define CLAIM_PLANS "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off"
/* The same settings as one prepared statement each (set_config(.., true) is SET LOCAL), to go in
 * a pipeline, where a statement list cannot. */
#define RELAY_PLANS_SEL                                                                            \
    "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', "      \
    "true), set_config('enable_mergejoin', 'off', true), set_config('jit', 'off', true), "         \
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
#define CLAIM_PLANS_SEL                                                                            \
    "SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true)"
/* What a relay transaction has not sent yet (pg_store.pend): a relay connection's BEGIN waits
 * for the transaction's first statement and goes in its pipeline (tx_begin), with the planner
 * settings its statements need. P_RELAY and P_CLAIM alone: settings for a transaction already
 * open. */
enum { P_BEGIN = 1, P_RELAY = 2, P_CLAIM = 4 };
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
/* ENV_INS_VALS_WITH(txid, digest, nb): the envelope's values, created_txid and envelope_digest as
 * given (ENV_INS_VALS: parameters $11 and $16; Q_ENQ_WRITE: the server's), not_before the
 * statement's last parameter nb (after those the statement had before it: Q_INS_ENV $29,
 * Q_INS_EVENT $50, Q_INS_EVENT_AUDIT $51, Q_ENQ_WRITE and Q_ENQ_TRY $54: bound last) */
#define ENV_INS_VALS_WITH(txid, digest, nb)                                                        \
    "$1::text, $2::int, $3::text, $4::text, $5::bigint, $6::text, $7::text, $8::text, $9::text, "  \
    "$10::bigint, " txid ", $12::text, $13::text, $14::text, $15::text, " digest ", $17::text, "   \
    "$18::text, $19::text, $20::text, $21::bigint, $22::text, $23::text, $24::text, $25::text, "   \
    "$26::bytea, $27::bigint, $28::bigint, " nb "::bigint"
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
 * pipeline cannot commit a write set that did not apply whole (pg_write_set). Its own UNION ALL
 * branch, evaluated even when `cte` is empty; `ids` (the rows that did not apply) and the
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
/* INS_EVENT_CTES_WITH(head, cols, vals, src): the envelope's columns `cols` and values `vals`
 * selected from CTE `src`, which the CTEs in `head` end with (the order lock taken in it) */
#define INS_EVENT_CTES_WITH(head, cols, vals, src)                                                 \
    head                                                                                           \
        ", env AS (INSERT INTO obx.obx_envelope " cols " SELECT " vals " FROM " src                \
        " RETURNING event_id), "                                                                   \
        "ev AS (INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, "        \
        "correlation_id, "                                                                         \
        "order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen, attempt_id, " \
        "pinned_partition, rejections, available_at, next_check_at, unknown_since, "               \
        "primary_attempt_id, published_at, committed_at, updated_at, max_attempts, blind_retry, "  \
        "unordered, alias, dest_cluster) "                                                         \
        "SELECT env.event_id, $9::text, CASE WHEN $49::int >= 2 THEN NULL ELSE "                   \
        "nullif($15::text, '') END, $6::text, $12::text, $29::text, "                              \
        "$2::int, $30::text, $31::bigint, $32::text, $33::bigint, $34::int, $35::text, $36::int, " \
        "$37::int, $38::bigint, $39::bigint, $40::bigint, $41::text, $42::bigint, $43::bigint, "   \
        "$44::bigint, $45::int, $46::bool, $47::bool, $48::text, $17::text FROM env "              \
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
 * after that (pg_wait_for_work) claims once more before it waits: either the relay is told, or
 * its next claim sees the event (docs/postgres.md, "NOTIFY"). CASE keeps the order: no lock for
 * a session that never notifies. */
#define NOTIFY_EXPR                                                                                \
    "CASE WHEN current_setting('obx.notify', true) IS NOT DISTINCT FROM 'off' THEN NULL "          \
    "WHEN pg_try_advisory_xact_lock_shared(" LOCK_CLASS_WAKE ", hashtext($17::text)) THEN NULL "   \
    "ELSE obx._wake($17::text) END"
/* The end of every event-inserting statement: NOTIFY_EXPR, one row when the event was written. */
#define NOTIFY_TAIL " SELECT " NOTIFY_EXPR " FROM ev"

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
     * inside a savepoint), in one round trip (route_get_txid) */
    [Q_ROUTE_GET_TXID] = "SELECT " ROUTE_COLS ", tableoid::bigint, pg_current_xact_id()::text "
                         "FROM obx.obx_route "
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
    [Q_ENQ_WRITE] = PRODUCER_CTES_WITH("WITH lk AS MATERIALIZED (SELECT " ORDER_LOCK
                                       " WHERE " ROUTE_STILL "), " TXID_FROM "lk)",
                                       ENQ_VALS, "f") NOTIFY_TAIL,
    /* Q_ENQ_WRITE without a savepoint around it (enqueue_try): the order-key bucket's lock
     * only if it is free now, so that the statement never waits for a lock and so cannot fail
     * on a lock timeout or a deadlock. One row when the cached route is still current: got is
     * true when the event was written, false when the bucket was busy (nothing written: the
     * savepoint pipeline follows and waits for it); no row when the route changed. */
    [Q_ENQ_TRY] = PRODUCER_CTES_WITH(
        "WITH lk AS MATERIALIZED (SELECT " ORDER_TRY_LOCK " AS got WHERE " ROUTE_STILL
        "), " TXID_FROM "lk WHERE lk.got)",
        ENQ_VALS, "f") " SELECT lk.got, (SELECT " NOTIFY_EXPR " FROM ev) FROM lk",
    /* docs/design.md, "Claims, attempts and fencing": oldest first; PENDING when available,
     * CLAIMED when its lease expired; never behind an unpublished earlier event of the same order
     * key unless unordered. Rows locked by another relay's claim are skipped, but the NOT EXISTS
     * still sees them as unpublished, so a locked head of a key holds back the rest of the key.
     * $5: a payload over the relay's ceiling (NULL: obx_meta's payload_limit) is not read:
     * octet_length() of a TOASTed value reads its header, not its bytes. */
    [Q_CLAIM] =
        "SELECT " EVENT_COLS ", CASE WHEN octet_length(v.payload) <= coalesce($5::bigint, "
        "(SELECT m.value::bigint FROM obx.obx_meta m WHERE m.key = 'payload_limit'), 1048576) "
        "THEN v.payload END" EVENT_FROM "WHERE e.state IN ('PENDING','CLAIMED') "
        "AND ((e.state = 'PENDING' AND e.available_at <= $1::bigint) OR "
        "     (e.state = 'CLAIMED' AND e.lease_until <= $1::bigint)) "
        "AND ($2::text IS NULL OR e.dest_cluster = $2::text) "
        "AND ($4::text[] IS NULL OR e.alias = ANY ($4::text[])) "
        "AND (e.unordered OR NOT EXISTS (SELECT 1 FROM obx.obx_event p "
        "     WHERE p.order_key = e.order_key AND p.seq < e.seq AND p.state IN " UNPUBLISHED
        ")) ORDER BY e.seq LIMIT $3::bigint" SKIP_LOCKED,
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
static const bool q_readonly[Q_COUNT] = {
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

static void stmt_name(int id, char out[40]) {
    pthread_once(&name_once, name_init);
    snprintf(out, 40, "%s%d", name_prefix, id);
}

/* ---- parameters ------------------------------------------------------------------------------ */

#define PMAX 64

/* Array parameters travel in PostgreSQL's binary array format (array_recv): the relay prints
 * no decimals and quotes no strings, and the server parses no literals (text arrays cost about
 * 12 % of the relay's CPU and array_in 2 % of the server's under a backlog). The elements are
 * collected first (a text element as its length and bytes, an integer as an int64 in host
 * order) and framed by frame_arrays() when the statement is known: every array parameter is
 * written in the SQL with its cast ($n::text[], $n::int[], $n::bigint[]), and that cast says
 * which element type and width the server expects. */
enum { A_NONE, A_TEXT, A_INT, A_RECORD, A_FRAMED };

/* Parameters of one statement: text values (NULL = SQL NULL), binary bytea, and arrays built
 * in owned buffers. Out of memory is sticky and reported by run(). */
typedef struct params {
    int n;
    const char *val[PMAX];
    int len[PMAX];
    int fmt[PMAX];
    char num[PMAX][24];
    obx__buf arr[PMAX];
    unsigned char akind[PMAX]; /* A_* */
    int acount[PMAX];          /* elements */
    bool anull[PMAX];          /* some element is NULL */
    unsigned char rtype[PMAX]; /* A_RECORD: its row type (RT_*) */
} params;

static void p_init(params *p) { memset(p, 0, sizeof *p); }

static void p_free(params *p) {
    for (int i = 0; i < p->n; i++) obx__buf_free(&p->arr[i]);
}

static void p_text(params *p, const char *v) {
    p->val[p->n] = v;
    p->n++;
}

static void p_int(params *p, int64_t v) {
    snprintf(p->num[p->n], sizeof p->num[0], "%lld", (long long)v);
    p->val[p->n] = p->num[p->n];
    p->n++;
}

static void p_bool(params *p, bool v) {
    p->val[p->n] = v ? "t" : "f";
    p->n++;
}

/* Binary bytea; a NULL pointer with length 0 is an empty value, not SQL NULL. */
static void p_bytes(params *p, const void *data, size_t len) {
    p->val[p->n] = data ? (const char *)data : "";
    p->len[p->n] = (int)len;
    p->fmt[p->n] = 1;
    p->n++;
}

/* Array parameters: a_begin, one a_text or a_int per element, a_end. */
static obx__buf *a_begin(params *p, unsigned char kind) {
    p->akind[p->n] = kind;
    return &p->arr[p->n];
}

/* A text value as binary arrays and records carry it: its length (-1: NULL), then its bytes. */
static void put_text(obx__buf *b, const char *v) {
    if (!v) {
        obx__buf_u32be(b, UINT32_MAX);
        return;
    }
    size_t len = strlen(v);
    obx__buf_u32be(b, (uint32_t)len);
    obx__buf_put(b, v, len);
}

static void a_text(params *p, obx__buf *b, const char *v) {
    p->acount[p->n]++;
    if (!v) p->anull[p->n] = true;
    put_text(b, v);
}

static void a_int(params *p, obx__buf *b, int64_t v) {
    p->acount[p->n]++;
    obx__buf_put(b, &v, sizeof v);
}

static void a_end(params *p) { p->n++; }

/* An array of rows of a row type (A_RECORD: $n::obx._event_update[] and the others of
 * schema.sql), one function for the server to set up where an array per column took one
 * each: r_begin, then per row r_row, its columns in the type's order (r_text, r_int4,
 * r_int8), r_row_end; then r_end. The elements are written as they go, each a length and
 * record_recv's format (the column count, then per column its type OID, length and bytes);
 * frame_arrays puts the array's header, with the row type's OID, in front. */
static obx__buf *r_begin(params *p, unsigned char rtype) {
    p->akind[p->n] = A_RECORD;
    p->rtype[p->n] = rtype;
    return &p->arr[p->n];
}

/* Starts a row of ncols columns; returns where its length goes (r_row_end). */
static size_t r_row(params *p, obx__buf *b, uint32_t ncols) {
    p->acount[p->n]++;
    size_t at = b->len;
    obx__buf_u32be(b, 0);
    obx__buf_u32be(b, ncols);
    return at;
}

static void r_text(obx__buf *b, const char *v) {
    obx__buf_u32be(b, 25); /* text */
    put_text(b, v);
}

/* An int4 or int8 value as binary arrays and records carry it: its length, then its bytes in
 * network order. */
static void put_int4(obx__buf *b, int32_t v) {
    obx__buf_u32be(b, 4);
    obx__buf_u32be(b, (uint32_t)v);
}

static void put_int8(obx__buf *b, int64_t v) {
    obx__buf_u32be(b, 8);
    obx__buf_u32be(b, (uint32_t)((uint64_t)v >> 32));
    obx__buf_u32be(b, (uint32_t)(uint64_t)v);
}

static void r_int4(obx__buf *b, int32_t v) {
    obx__buf_u32be(b, 23); /* int4 */
    put_int4(b, v);
}

static void r_int8(obx__buf *b, int64_t v) {
    obx__buf_u32be(b, 20); /* int8 */
    put_int8(b, v);
}

static void r_row_end(obx__buf *b, size_t at) {
    if (b->oom || !b->data) return;
    uint32_t len = (uint32_t)(b->len - at - 4);
    unsigned char *d = b->data + at;
    d[0] = (unsigned char)(len >> 24);
    d[1] = (unsigned char)(len >> 16);
    d[2] = (unsigned char)(len >> 8);
    d[3] = (unsigned char)len;
}

static void r_end(params *p) { p->n++; }

/* Column arrays over n rows; the expression sees the row index as i. */
#define ARR_TEXT(p, n, expr)                                                                       \
    do {                                                                                           \
        obx__buf *b_ = a_begin(p, A_TEXT);                                                         \
        for (size_t i = 0; i < (n); i++) a_text(p, b_, (expr));                                    \
        a_end(p);                                                                                  \
    } while (0)
#define ARR_INT(p, n, expr)                                                                        \
    do {                                                                                           \
        obx__buf *b_ = a_begin(p, A_INT);                                                          \
        for (size_t i = 0; i < (n); i++) a_int(p, b_, (int64_t)(expr));                            \
        a_end(p);                                                                                  \
    } while (0)

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

static obx_err rec_oids(pg_store *s);

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
    obx_err e = rec_oids(s);
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
static obx_err p_ready(pg_store *s, params *p, int id, const char *what) {
    if (p_oom(p)) return obx__fail(OBX_ENOMEM, "%s: out of memory", what);
    return frame_arrays(s, p, id, what);
}

/* ---- errors ------------------------------------------------------------------------------- */

static bool conn_lost_state(const char *st) {
    return st && (!strncmp(st, "08", 2) || !strcmp(st, "57P01") || !strcmp(st, "57P02") ||
                  !strcmp(st, "57P03"));
}

static void primary_message(pg_store *s, const PGresult *r, char *out, size_t cap) {
    const char *m = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    obx__strlcpy(out, m ? m : PQerrorMessage(s->conn), cap);
    for (char *c = out; *c; c++)
        if (*c == '\n' || *c == '\t') *c = ' ';
    size_t n = strlen(out);
    while (n && out[n - 1] == ' ') out[--n] = '\0';
    if (!*out) obx__strlcpy(out, "no message from the server", cap);
}

/* The one place where PostgreSQL's errors become obx codes (contract 5). */
static obx_err map_error(pg_store *s, const PGresult *r, const char *what) {
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    char msg[768];
    primary_message(s, r, msg, sizeof msg);
    if (PQstatus(s->conn) != CONNECTION_OK || conn_lost_state(st)) {
        if (s->tx.depth > 0) s->lost = true;
        return obx__fail(OBX_ECONNLOST, "postgres: connection lost (%s): %s", what, msg);
    }
    if (!st) return obx__fail(OBX_ESTORE, "postgres: %s (%s)", msg, what);
    if (!strcmp(st, "OB001")) return obx__fail(OBX_EIMMUTABLE, "%s (%s)", msg, what);
    if (!strcmp(st, "OB002")) return obx__fail(OBX_EINVAL, "%s", msg);
    if (!strcmp(st, "OB003")) return obx__fail(OBX_ETOOBIG, "%s", msg);
    if (!strcmp(st, "OB004")) return obx__fail(OBX_ENOROUTE, "%s", msg);
    if (!strcmp(st, "OB005")) return obx__fail(OBX_ECONFLICT, "%s (%s)", msg, what);
    if (!strcmp(st, "OB006")) return obx__fail(OBX_ENOTFOUND, "%s (%s)", msg, what);
    if (!strcmp(st, "23505")) return obx__fail(OBX_ECONFLICT, "postgres: %s (%s)", msg, what);
    if (!strcmp(st, "40001") || !strcmp(st, "40P01") || !strcmp(st, "55P03") ||
        !strcmp(st, "57014"))
        return obx__fail(OBX_EBUSY, "postgres: %s [SQLSTATE %s] (%s): retry the transaction", msg,
                         st, what);
    if (!strncmp(st, "53", 2))
        return obx__fail(OBX_EIO, "postgres: %s [SQLSTATE %s] (%s)", msg, st, what);
    /* insufficient privilege, row-level security included: denied to this role, for good (not
     * a protocol guard's refusal: the caller could not look, or write, as this role) */
    if (!strcmp(st, "42501"))
        return obx__fail(OBX_EDENIED, "postgres: %s [SQLSTATE %s] (%s)", msg, st, what);
    return obx__fail(OBX_ESTORE, "postgres: %s [SQLSTATE %s] (%s)", msg, st, what);
}

/* Takes r. OBX_OK when it carries the expected status; *out (may be NULL) then owns it. */
static obx_err check(pg_store *s, PGresult *r, ExecStatusType want, PGresult **out,
                     const char *what) {
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == want || (want == PGRES_COMMAND_OK && st == PGRES_TUPLES_OK)) {
        if (out)
            *out = r;
        else
            PQclear(r);
        return OBX_OK;
    }
    /* the schema made again under this connection: a row type's OID is no longer the type's
     * ("wrong element type"), or the statement was prepared with the old type ("cache lookup
     * failed for type"): rec_oids prepares them again before the next statement */
    const char *code = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (code && (!strcmp(code, "42804") ||
                 (!strcmp(code, "XX000") && msg && strstr(msg, "cache lookup failed for type"))))
        s->rec_stale = true;
    obx_err e = map_error(s, r, what);
    PQclear(r);
    return e;
}

/* The OIDs of the batch statements' row types (schema.sql), read once per connection: a binary
 * array names its element type, and the server checks it against the statement's (the names are
 * qualified, so the session's search_path does not matter). Read outside any pipeline, before the
 * statement that needs them; a plain catalogue read, so also harmless inside the caller's
 * transaction. After check() saw a type change under the connection (rec_stale), the statements
 * that take the types are deallocated first, to be prepared again with the new ones. */
static obx_err rec_oids(pg_store *s) {
    if (s->rec_stale) {
        static const int uses[] = {Q_UPD_EVENTS, Q_INS_ATT, Q_UPD_ATT, Q_INS_RCPT};
        for (size_t i = 0; i < sizeof uses / sizeof uses[0]; i++) {
            if (!s->prepared[uses[i]]) continue;
            char name[40], sql[64];
            stmt_name(uses[i], name);
            snprintf(sql, sizeof sql, "DEALLOCATE %s", name);
            PQclear(PQexec(s->conn, sql)); /* gone already is as good */
            s->prepared[uses[i]] = false;
        }
        memset(s->rec_oid, 0, sizeof s->rec_oid);
        s->rec_stale = false;
    }
    if (s->rec_oid[0]) return OBX_OK;
    PGresult *r = NULL;
    obx_err e = check(s,
                      PQexec(s->conn, "SELECT 'obx._event_update'::regtype::oid, "
                                      "'obx._attempt_insert'::regtype::oid, "
                                      "'obx._attempt_update'::regtype::oid, "
                                      "'obx._receipt_insert'::regtype::oid"),
                      PGRES_TUPLES_OK, &r, "the batch statements' row types");
    if (e) return e;
    for (int i = 0; i < RT_COUNT; i++)
        s->rec_oid[i] = (uint32_t)strtoul(PQgetvalue(r, 0, i), NULL, 10);
    PQclear(r);
    return OBX_OK;
}

/* ---- connection ------------------------------------------------------------------------------ */

static void forget_session(pg_store *s) {
    memset(s->prepared, 0, sizeof s->prepared);
    memset(s->rec_oid, 0, sizeof s->rec_oid);
    s->listening = false;
    s->wait_fn = 0;
    s->wake_held = false; /* a session lock ends with its session */
    s->names_checked = false;
}

static obx_err held_send(pg_store *s, bool commit);

/* Contract 6: usable connection or OBX_ECONNLOST. What the transaction has not sent yet
 * (pend) stays unsent: for the callers that put it in their pipeline (ws_run); a held write set
 * is sent first (its errors are this call's). */
static obx_err conn_ready(pg_store *s, const char *what) {
    if (s->held) {
        obx_err e = held_send(s, false);
        if (e) return e;
    }
    if (s->tx.depth > 0 && s->lost)
        return obx__fail(OBX_ECONNLOST,
                         "postgres: connection lost earlier in this transaction (%s): roll back",
                         what);
    if (PQstatus(s->conn) == CONNECTION_OK) return OBX_OK;
    if (s->tx.depth > 0 || !s->owned)
        return obx__fail(OBX_ECONNLOST, "postgres: connection lost (%s): %s", what,
                         PQerrorMessage(s->conn));
    PQreset(s->conn);
    forget_session(s);
    if (PQstatus(s->conn) != CONNECTION_OK)
        return obx__fail(OBX_ECONNLOST, "postgres: cannot reconnect (%s): %s", what,
                         PQerrorMessage(s->conn));
    return OBX_OK;
}

/* The unsent part of the transaction (pend), sent on its own: for every statement that is not
 * in a pipeline. */
static obx_err pend_flush(pg_store *s, const char *what) {
    unsigned p = s->pend;
    if (!p) return OBX_OK;
    s->pend = 0;
    char sql[512];
    snprintf(sql, sizeof sql, "%s%s%s%s%s", p & P_BEGIN ? "BEGIN" : "",
             p & P_BEGIN && p & (P_RELAY | P_CLAIM) ? "; " : "", p & P_RELAY ? RELAY_PLANS : "",
             p & P_RELAY && p & P_CLAIM ? "; " : "", p & P_CLAIM ? CLAIM_PLANS : "");
    return check(s, PQexec(s->conn, sql), PGRES_COMMAND_OK, NULL, what);
}

/* conn_ready, then the transaction's unsent part: the connection is where the caller's
 * transaction says it is. */
static obx_err ready(pg_store *s, const char *what) {
    obx_err e = conn_ready(s, what);
    return e ? e : pend_flush(s, what);
}

static obx_err exec_simple(pg_store *s, const char *sql, const char *what) {
    obx_err e = ready(s, what);
    if (e) return e;
    return check(s, PQexec(s->conn, sql), PGRES_COMMAND_OK, NULL, what);
}

/* Borrowed connection: which of our names are prepared already (contract 2). */
static obx_err check_names(pg_store *s) {
    char pattern[40];
    pthread_once(&name_once, name_init);
    snprintf(pattern, sizeof pattern, "%s%%", name_prefix);
    const char *v[1] = {pattern};
    PGresult *r = NULL;
    obx_err e = check(
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

static obx_err prepare(pg_store *s, int id) {
    if (s->prepared[id]) return OBX_OK;
    obx_err e;
    if (!s->owned && !s->names_checked) {
        if ((e = check_names(s))) return e;
        if (s->prepared[id]) return OBX_OK;
    }
    char name[40];
    stmt_name(id, name);
    e = check(s, PQprepare(s->conn, name, sql_text[id], 0, NULL), PGRES_COMMAND_OK, NULL,
              "prepare");
    if (!e) s->prepared[id] = true;
    return e;
}

/* One statement of a pipeline (ws_run), and which part's rows its result answers for. */
enum { WS_PLAIN, WS_UPD_EVENTS, WS_UPD_ATT, WS_KEEP };
typedef struct ws_stmt {
    int id;
    int kind;      /* WS_*; WS_KEEP: the result goes to the caller */
    size_t off, n; /* its rows within the part */
    const char *what;
    ExecStatusType want;
    params p;
} ws_stmt;

static obx_err ws_run(pg_store *s, ws_stmt *st, size_t ns, const struct obx__write_set *w,
                      PGresult **keep, bool commit);

/* Frees ns statements and their parameters (st may be NULL). */
static void ws_free(ws_stmt *st, size_t ns) {
    for (size_t i = 0; st && i < ns; i++) p_free(&st[i].p);
    free(st);
}

static void held_drop(pg_store *s) {
    ws_free(s->held, s->n_held);
    s->held = NULL;
    s->n_held = 0;
}

/* Sends the held write set (pg_write_set), then COMMIT in the same pipeline when commit (from
 * commit_outer: the transaction's depth is already 0). Its failures are the caller's. */
static obx_err held_send(pg_store *s, bool commit) {
    ws_stmt *st = s->held;
    size_t ns = s->n_held;
    s->held = NULL; /* sent once, whatever happens (conn_ready: no recursion) */
    s->n_held = 0;
    obx_err e;
    if (commit && (s->lost || PQstatus(s->conn) != CONNECTION_OK)) {
        s->pend = 0; /* never reconnect here: the transaction died with the connection */
        e = obx__fail(OBX_ECONNLOST, "postgres: connection lost before COMMIT: the transaction "
                                     "was not committed");
    } else {
        e = ws_run(s, st, ns, NULL, NULL, commit);
    }
    ws_free(st, ns);
    return e;
}

static bool retriable_race(const PGresult *r) {
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    return st && (!strcmp(st, "40001") || !strcmp(st, "40P01"));
}

/* Runs prepared statement id with p (may be NULL). want: PGRES_TUPLES_OK or PGRES_COMMAND_OK;
 * *out (may be NULL) gets the result on success (PQclear it). */
static obx_err run(pg_store *s, int id, params *p, ExecStatusType want, PGresult **out,
                   const char *what) {
    if (p) {
        obx_err pe = p_ready(s, p, id, what);
        if (pe) return pe;
    }
    if (s->pend) { /* the transaction's first statement: one pipeline with its BEGIN */
        ws_stmt one = {.id = id, .kind = WS_KEEP, .what = what, .want = want};
        if (p) one.p = *p; /* shares p's buffers: not freed here */
        PGresult *r = NULL;
        obx_err e = ws_run(s, &one, 1, NULL, &r, false);
        if (!e && out)
            *out = r;
        else
            PQclear(r);
        return e;
    }
    char name[40];
    stmt_name(id, name);
    for (int attempt = 0;; attempt++) {
        obx_err e = ready(s, what);
        if (e) return e;
        if ((e = prepare(s, id))) {
            /* PREPARE found the connection lost: nothing ran, so any statement may go again */
            if (e == OBX_ECONNLOST && s->owned && s->tx.depth == 0 && attempt == 0) continue;
            return e;
        }
        PGresult *r = PQexecPrepared(s->conn, name, p ? p->n : 0, p ? p->val : NULL,
                                     p ? p->len : NULL, p ? p->fmt : NULL, 0);
        ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
        bool standalone = s->tx.depth == 0 && (PQstatus(s->conn) != CONNECTION_OK ||
                                               PQtransactionStatus(s->conn) == PQTRANS_IDLE);
        /* contract 6: a read found the connection lost; reconnect (ready) and read again */
        if (PQstatus(s->conn) != CONNECTION_OK && standalone && s->owned && q_readonly[id] &&
            attempt == 0) {
            PQclear(r);
            continue;
        }
        if (st != want && st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && r) {
            const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
            /* a caller reset its session (DISCARD ALL): every statement is gone, and each is
             * prepared again when next used; this one again now where that is harmless (inside
             * a transaction the error has failed it) */
            if (code && !strcmp(code, "26000")) {
                memset(s->prepared, 0, sizeof s->prepared);
                if (standalone && attempt == 0) {
                    PQclear(r);
                    s->names_checked = true;
                    continue;
                }
            }
            /* contract 5: a standalone statement that lost a race was not applied at all */
            if (retriable_race(r) && standalone && attempt < 3) {
                PQclear(r);
                continue;
            }
        }
        return check(s, r, want, out, what);
    }
}

/* ---- reading results ------------------------------------------------------------------------ */

static int64_t gi(const PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static bool gb(const PGresult *r, int row, int col) {
    return !PQgetisnull(r, row, col) && PQgetvalue(r, row, col)[0] == 't';
}

static void gt(const PGresult *r, int row, int col, char *out, size_t cap) {
    obx__strlcpy(out, PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col), cap);
}
#define GT(r, row, col, field) gt(r, row, col, field, sizeof(field))

/* the shared decoders' view of one result row (shared.h) */
typedef struct pg_cell {
    const PGresult *r;
    int row;
} pg_cell;
static int64_t rd_i64(void *c, int col) { return gi(((pg_cell *)c)->r, ((pg_cell *)c)->row, col); }
static bool rd_flag(void *c, int col) { return gb(((pg_cell *)c)->r, ((pg_cell *)c)->row, col); }
static void rd_text(void *c, int col, char *out, size_t cap) {
    gt(((pg_cell *)c)->r, ((pg_cell *)c)->row, col, out, cap);
}
#define READER(res, i) (&(obx__col_reader){rd_i64, rd_flag, rd_text, &(pg_cell){(res), (i)}})

static int hexv(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A bytea column in text format into a malloc'ed buffer (*out NULL for SQL NULL). Handles the
 * hex format (the default) and, through libpq, a session's bytea_output = escape. */
static obx_err get_bytea(const PGresult *r, int row, int col, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (PQgetisnull(r, row, col)) return OBX_OK;
    const char *t = PQgetvalue(r, row, col);
    size_t tl = (size_t)PQgetlength(r, row, col);
    if (tl >= 2 && t[0] == '\\' && t[1] == 'x') {
        size_t n = (tl - 2) / 2;
        unsigned char *b = malloc(n ? n : 1);
        if (!b) return obx__fail(OBX_ENOMEM, "payload: out of memory");
        for (size_t i = 0; i < n; i++) {
            int hi = hexv(t[2 + 2 * i]), lo = hexv(t[3 + 2 * i]);
            if (hi < 0 || lo < 0) {
                free(b);
                return obx__fail(OBX_ESTORE, "postgres: malformed bytea from the server");
            }
            b[i] = (unsigned char)(hi << 4 | lo);
        }
        *out = b;
        *len = n;
        return OBX_OK;
    }
    size_t n = 0;
    unsigned char *u = PQunescapeBytea((const unsigned char *)t, &n);
    if (!u) return obx__fail(OBX_ENOMEM, "payload: out of memory");
    unsigned char *b = malloc(n ? n : 1);
    if (b) memcpy(b, u, n);
    PQfreemem(u);
    if (!b) return obx__fail(OBX_ENOMEM, "payload: out of memory");
    *out = b;
    *len = n;
    return OBX_OK;
}

/* ---- open / close / schema --------------------------------------------------------------- */

static void pg_close(obx__store *base) {
    pg_store *s = (pg_store *)base;
    if (!s) return;
    held_drop(s);
    if (s->owned) PQfinish(s->conn);
    free(s);
}

static obx_err pg_new(PGconn *conn, bool owned, obx__store **out) {
    pg_store *s = calloc(1, sizeof *s);
    if (!s) return obx__fail(OBX_ENOMEM, "postgres store: out of memory");
    s->base.m = &obx__pg_store_methods;
    s->conn = conn;
    s->owned = owned;
    *out = &s->base;
    return OBX_OK;
}

/* The server's notices and warnings on obx's own connections (libpq's default prints them to
 * stderr as text): through obx's log, in log.format like every other record (core.h). A
 * wrapped connection keeps its owner's receiver. */
static void pg_notice(void *arg, const PGresult *r) {
    (void)arg;
    const char *sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    obx__blog_level l = !sev                        ? OBX__BLOG_INFO
                        : !strcmp(sev, "WARNING")   ? OBX__BLOG_WARN
                        : !strncmp(sev, "DEBUG", 5) ? OBX__BLOG_DEBUG
                                                    : OBX__BLOG_INFO;
    obx__backend_log(l, "postgres", "%s: %s", sev ? sev : "NOTICE",
                     msg ? msg : PQresultErrorMessage(r));
}

static obx_err pg_open(const obx__url *u, obx__store **out) {
    /* Defaults first, the URL next (its settings win), then what obx needs: UTF-8 strings.
     * Keepalives detect a dead peer during a long wait_for_work; tcp_user_timeout one that
     * vanished (a machine lost, a network cut: nothing refuses, nothing answers) while a
     * statement was on its way, which keepalives never probe: without it the kernel retransmits
     * for about 15 minutes before the call fails and a multi-host URL can move to the promoted
     * standby (docs/reliability.md, "PostgreSQL failover"). */
    const char *const keys[] = {
        "connect_timeout",  "keepalives_idle",           "keepalives_interval",
        "keepalives_count", "tcp_user_timeout",          "dbname",
        "client_encoding",  "fallback_application_name", NULL};
    const char *const vals[] = {"10", "30", "10", "3", "15000", u->raw, "UTF8", "obx", NULL};
    PGconn *conn = PQconnectdbParams(keys, vals, 1);
    if (!conn) return obx__fail(OBX_ENOMEM, "postgres: out of memory");
    if (PQstatus(conn) != CONNECTION_OK) {
        char msg[512];
        obx__strlcpy(msg, PQerrorMessage(conn), sizeof msg);
        size_t n = strlen(msg);
        while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = '\0';
        PQfinish(conn);
        /* The server answered that the database does not exist (SQLSTATE 3D000; libpq gives a
         * failed connection's message only, in the server's words, lc_messages 'C' or 'en'
         * by default): OBX_ENODB, no lost connection; a read-only command says "no such
         * outbox". */
        if (strstr(msg, "FATAL:  database \"") && strstr(msg, "\" does not exist"))
            return obx__fail(OBX_ENODB, "postgres: %s", strstr(msg, "database \""));
        /* retriable: the server may come up later (a bad password stays bad, with a message
         * that says so) */
        return obx__fail(OBX_ECONNLOST, "postgres: cannot connect: %s", msg);
    }
    PQsetNoticeReceiver(conn, pg_notice, NULL);
    if (u->read_only) { /* OBX_STORE_READ_ONLY: the server refuses any write of this session */
        PGresult *r = PQexec(conn, "SET default_transaction_read_only = on");
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) {
            obx_err e = obx__fail(OBX_ESTORE, "postgres: cannot make the session read-only: %s",
                                  PQerrorMessage(conn));
            PQfinish(conn);
            return e;
        }
    }
    obx_err e = pg_new(conn, true, out);
    if (e) PQfinish(conn);
    return e;
}

static obx_err pg_wrap(void *conn, obx__store **out) {
    PGconn *c = conn;
    if (!c) return obx__fail(OBX_EINVAL, "pg_conn: NULL");
    if (PQstatus(c) != CONNECTION_OK)
        return obx__fail(OBX_ECONNLOST, "pg_conn: the connection is not open: %s",
                         PQerrorMessage(c));
    const char *enc = pg_encoding_to_char(PQclientEncoding(c));
    if (strcmp(enc, "UTF8"))
        return obx__fail(OBX_EINVAL,
                         "pg_conn: client_encoding is %s; obx exchanges UTF-8 (SET "
                         "client_encoding = 'UTF8')",
                         enc);
    return pg_new(c, false, out);
}

static obx_err pg_schema_version(obx__store *base, int *found) {
    pg_store *s = (pg_store *)base;
    *found = 0;
    obx_err e = ready(s, "schema version");
    if (e) return e;
    PGresult *r = NULL;
    /* to_regclass: a missing table must not raise (it would abort a caller's transaction) */
    e = check(s, PQexec(s->conn, "SELECT to_regclass('obx.obx_meta') IS NOT NULL"), PGRES_TUPLES_OK,
              &r, "schema version");
    if (e) return e;
    bool present = gb(r, 0, 0);
    PQclear(r);
    if (!present) return OBX_OK;
    e = check(s, PQexec(s->conn, "SELECT value FROM obx.obx_meta WHERE key = 'schema_version'"),
              PGRES_TUPLES_OK, &r, "schema version");
    if (e) return e;
    if (PQntuples(r) == 1) *found = (int)gi(r, 0, 0);
    PQclear(r);
    return OBX_OK;
}

/* The schema version, for a relay: first the schema-in-use lock, shared and for the session,
 * then the version, in a statement of its own (a statement's snapshot is taken before a lock it
 * waits for, so a version read in the same statement could be the one a migration just
 * replaced). A migration holds the lock exclusively until it commits: a relay starting during
 * one waits for it, then reads the new version (and refuses it, when it is not its own);
 * `obx init` does not migrate while a relay holds it (migrate_in_tx). Held until the
 * connection closes. */
static obx_err pg_schema_hold(obx__store *base, int *found) {
    pg_store *s = (pg_store *)base;
    *found = 0;
    obx_err e = ready(s, "schema version");
    if (e) return e;
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_lock_shared(%d, %d)", LOCK_CLASS_INIT,
             LOCK_SCHEMA_IN_USE);
    if ((e = check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "schema in use"))) return e;
    return pg_schema_version(base, found);
}

/* The server's clock (obx__ref_sync): clock_timestamp(), not now(), which is the start of a
 * transaction. */
static obx_err pg_server_ms(obx__store *base, int64_t *out) {
    pg_store *s = (pg_store *)base;
    obx_err e = ready(s, "server clock");
    if (e) return e;
    PGresult *r = NULL;
    e = check(s,
              PQexec(s->conn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"),
              PGRES_TUPLES_OK, &r, "server clock");
    if (e) return e;
    *out = gi(r, 0, 0);
    PQclear(r);
    return OBX_OK;
}

/* Before a migration from version `from` to `to`: the schema-in-use lock, exclusively for this
 * transaction, or OBX_EBUSY naming the sessions that hold it (relays of this database; a
 * session whose client is gone holds it until the server notices, or until
 * pg_terminate_backend ends it). Nothing is changed on refusal. */
static obx_err migrate_exclusive(pg_store *s, int from, int to) {
    char sql[640];
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_xact_lock(%d, %d)", LOCK_CLASS_INIT,
             LOCK_SCHEMA_IN_USE);
    PGresult *r = NULL;
    obx_err e = check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, &r, "schema in use");
    if (e) return e;
    bool got = gb(r, 0, 0);
    PQclear(r);
    if (got) return OBX_OK;
    /* who holds it: pg_locks is readable by every role; pg_stat_activity shows another role's
     * client address only to its members and pg_read_all_stats (NULL otherwise) */
    snprintf(sql, sizeof sql,
             "SELECT count(*), string_agg(l.pid::text || coalesce(' from ' || "
             "host(a.client_addr), ''), ', ' ORDER BY l.pid) FROM pg_locks l LEFT JOIN "
             "pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
             "AND l.classid = %d AND l.objid = %d AND l.objsubid = 2 AND l.database = (SELECT oid "
             "FROM pg_database WHERE datname = current_database()) AND l.pid <> "
             "pg_backend_pid()",
             LOCK_CLASS_INIT, LOCK_SCHEMA_IN_USE);
    if ((e = check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, &r, "schema in use"))) return e;
    int64_t n = gi(r, 0, 0);
    char who[256];
    gt(r, 0, 1, who, sizeof who);
    PQclear(r);
    return obx__fail(OBX_EBUSY,
                     "postgres: %lld relay session%s of this database hold%s schema version %d "
                     "(server pids: %s): stop the relays, then run obx init again to migrate to "
                     "version %d (docs/operations.md, \"Upgrading obx\"); a session whose relay "
                     "is gone ends with SELECT pg_terminate_backend(pid)",
                     (long long)n, n == 1 ? "" : "s", n == 1 ? "s" : "", from, who[0] ? who : "?",
                     to);
}

static obx_err pg_begin(obx__store *base);
static obx_err pg_commit(obx__store *base);
static obx_err pg_rollback(obx__store *base);

/* the migration runner's statements (shared.c) */
static obx_err migrate_exec(obx__store *base, const char *sql) {
    pg_store *s = (pg_store *)base;
    return check(s, PQexec(s->conn, sql), PGRES_COMMAND_OK, NULL, "schema migration");
}

/* One DDL statement in a savepoint: true when it ran, false when the server refused it (the
 * transaction goes on as before it). */
static bool try_ddl(pg_store *s, const char *sql) {
    if (migrate_exec(&s->base, "SAVEPOINT obx_ddl")) return false;
    if (!migrate_exec(&s->base, sql)) return !migrate_exec(&s->base, "RELEASE SAVEPOINT obx_ddl");
    obx__clear_error();
    (void)migrate_exec(&s->base, "ROLLBACK TO SAVEPOINT obx_ddl");
    return false;
}

/* The obx_pg extension as this schema version needs it, the first two columns of a query that
 * starts with EXT_COLS (its $1: the version): whether the server has the extension's files of
 * version OBX__SCHEMA_VERSION, and the database's extension version (NULL: none). */
#define EXT_COLS                                                                                   \
    "EXISTS (SELECT 1 FROM pg_available_extension_versions WHERE name = 'obx_pg' AND version = "   \
    "$1::text), (SELECT extversion FROM pg_extension WHERE extname = 'obx_pg')"
typedef struct ext_state {
    char ver[16];     /* OBX__SCHEMA_VERSION as text: the version this obx needs */
    bool avail;       /* the server has its files */
    const char *have; /* the database's version (in *r), NULL when it has none */
} ext_state;

/* Runs sql (SELECT EXT_COLS, ...) into *r (the caller clears it) and reads its first columns. */
static obx_err ext_query(pg_store *s, const char *sql, const char *what, ext_state *x,
                         PGresult **r) {
    snprintf(x->ver, sizeof x->ver, "%d", OBX__SCHEMA_VERSION);
    const char *v[1] = {x->ver};
    obx_err e =
        check(s, PQexecParams(s->conn, sql, 1, NULL, v, NULL, NULL, 0), PGRES_TUPLES_OK, r, what);
    if (e) return e;
    x->avail = gb(*r, 0, 0);
    x->have = PQgetisnull(*r, 0, 1) ? NULL : PQgetvalue(*r, 0, 1);
    return OBX_OK;
}

/* obx.enqueue()'s body (schema.sql, obx._point_enqueue): obx._enqueue_c() of the obx_pg extension
 * when the server has the extension's files of this schema version (OBX__SCHEMA_VERSION is the
 * extension's version, and its library is named for it: CMakeLists.txt) and the database has the
 * extension at that version, or this user may create it or update it to that version (a trusted
 * extension: CREATE on the database; the update: its owner); else obx._enqueue_sql(). So a
 * database whose server lost the files, or has only another obx version's, runs the PL/pgSQL
 * body rather than C code built for another schema. Decided at every init, by whoever owns
 * obx.enqueue(): a server that gains the extension uses it from the next `obx init`, and a relay
 * started with a role of its own (cmd_relay.c runs init) changes nothing. The choice is in obx_meta
 * (enqueue_impl), for operators, the benches and the tests (docs/postgres.md, "The obx_pg
 * extension"). */
static obx_err enqueue_impl(pg_store *s) {
    ext_state x = {0};
    PGresult *r = NULL;
    obx_err e = ext_query(s,
                          "SELECT " EXT_COLS ", p.prosrc LIKE '%obx._enqueue_c(%', "
                          "pg_has_role(p.proowner, 'MEMBER') FROM pg_proc p WHERE p.oid = "
                          "'obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, "
                          "text, text, timestamptz, timestamptz)'::regprocedure",
                          "enqueue body", &x, &r);
    if (e) return e;
    bool have = x.have != NULL, same = have && !strcmp(x.have, x.ver), uses_c = gb(r, 0, 2),
         owner = gb(r, 0, 3);
    PQclear(r);
    if (!owner) return OBX_OK;
    char ddl[96];
    snprintf(ddl, sizeof ddl,
             have ? "ALTER EXTENSION obx_pg UPDATE TO '%s'"
                  : "CREATE EXTENSION obx_pg VERSION '%s'",
             x.ver);
    bool c = x.avail && (same || try_ddl(s, ddl));
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT obx._point_enqueue(%s)", c ? "true" : "false");
    if (c != uses_c && (e = check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "enqueue body")))
        return e;
    /* written only when it changes: an init (every relay start by the owner) writes nothing */
    char meta[320];
    snprintf(meta, sizeof meta,
             "INSERT INTO obx.obx_meta (key, value) SELECT 'enqueue_impl', '%s' WHERE NOT EXISTS "
             "(SELECT 1 FROM obx.obx_meta WHERE key = 'enqueue_impl' AND value = '%s') ON "
             "CONFLICT (key) DO UPDATE SET value = excluded.value",
             c ? "c" : "sql", c ? "c" : "sql");
    return migrate_exec(&s->base, meta);
}

/* obx_store_producer_body: enqueue_impl's choice, and why the PL/pgSQL body runs when it does
 * (the same conditions, read again: the server's files, the database's extension). */
static obx_err pg_producer_body(obx__store *base, char *buf, size_t cap) {
    pg_store *s = (pg_store *)base;
    ext_state x = {0};
    PGresult *r = NULL;
    obx_err e = ext_query(s,
                          "SELECT " EXT_COLS ", (SELECT value FROM obx.obx_meta WHERE key = "
                          "'enqueue_impl')",
                          "producer body", &x, &r);
    if (e) return e;
    if (!strcmp(PQgetvalue(r, 0, 2), "c"))
        snprintf(buf, cap, "obx.enqueue() runs in C (the obx_pg extension, version %s)",
                 x.have ? x.have : "?");
    else if (!x.avail)
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: this server has no obx_pg files of "
                 "version %s (scripts/pg_ext.sh on the server, then obx init again)",
                 x.ver);
    else if (x.have && strcmp(x.have, x.ver))
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: the database's obx_pg is version %s and "
                 "this init could not update it (obx init as the extension's owner)",
                 x.have);
    else if (!x.have)
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: this init could not create the obx_pg "
                 "extension (obx init as a user with CREATE on the database)");
    else
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: obx init as the owner of obx.enqueue() "
                 "points it at the obx_pg extension");
    PQclear(r);
    return OBX_OK;
}

/* The schema obx as init trusts it: owned by the role running init, by a superuser, or by a role
 * it is a member of (for a superuser, membership means nothing: it is a member of every role).
 * The owner of a schema may replace any function in it, obx.enqueue()'s body included, which
 * every producer then runs with obx.enqueue()'s owner's rights (docs/security.md, "Creating the
 * schema"). schema.sql checks it again after its CREATE SCHEMA, for one made in between. */
#define FOREIGN_SCHEMA_SQL                                                                         \
    "SELECT o.rolname, current_user FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner "    \
    "WHERE n.nspname = 'obx' AND NOT o.rolsuper AND o.rolname <> current_user AND (NOT "           \
    "pg_has_role(current_user, o.oid, 'MEMBER') OR (SELECT rolsuper FROM pg_roles WHERE "          \
    "rolname = current_user))"

/* OBX_EREFUSED, naming the owner, when a schema obx exists that init does not trust. */
static obx_err schema_owned(pg_store *s) {
    PGresult *r = NULL;
    obx_err e = check(s, PQexec(s->conn, FOREIGN_SCHEMA_SQL), PGRES_TUPLES_OK, &r, "schema owner");
    if (e) return e;
    char owner[OBX_NAME_MAX + 1] = "", me[OBX_NAME_MAX + 1] = "";
    bool foreign = PQntuples(r) == 1;
    if (foreign) {
        gt(r, 0, 0, owner, sizeof owner);
        gt(r, 0, 1, me, sizeof me);
    }
    PQclear(r);
    if (!foreign) return OBX_OK;
    return obx__fail(OBX_EREFUSED,
                     "postgres: the schema obx is owned by role %s, which %s, who runs obx init, "
                     "neither is nor belongs to: its owner could replace the functions every "
                     "producer runs; obx uses only a schema it made (DROP SCHEMA obx as %s if it "
                     "is empty, or run obx init as %s)",
                     owner, me, owner, owner);
}

/* The migration in the caller's transaction, to version `last` by scripts[1..last]. */
static obx_err migrate_in_tx(pg_store *s, const char *const *scripts, int last) {
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_xact_lock(%d, 0)", LOCK_CLASS_INIT);
    PGresult *r = NULL;
    obx_err e = check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "init lock");
    if (e) return e;
    /* canonical encodings hash UTF-8 bytes: the database must store UTF-8 */
    e = check(s,
              PQexec(s->conn, "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE "
                              "datname = current_database()"),
              PGRES_TUPLES_OK, &r, "database encoding");
    if (e) return e;
    char enc[32];
    gt(r, 0, 0, enc, sizeof enc);
    PQclear(r);
    if (strcmp(enc, "UTF8"))
        return obx__fail(OBX_ECONFIG,
                         "postgres: database encoding is %s; obx needs a UTF8 database "
                         "(CREATE DATABASE ... ENCODING 'UTF8')",
                         enc);
    if ((e = schema_owned(s))) return e;
    /* a migration waits for no relay and runs under none (pg_schema_hold) */
    int from = 0;
    if ((e = pg_schema_version(&s->base, &from))) return e;
    if (from > 0 && from < last && (e = migrate_exclusive(s, from, last))) return e;
    e = obx__migrate_run(&s->base, from, scripts, last, "obx.obx_meta", migrate_exec);
    return e ? e : enqueue_impl(s);
}

obx_err obx__pg_migrate_to(obx__store *base, const char *const *scripts, int last) {
    pg_store *s = (pg_store *)base;
    obx_err e = pg_begin(base);
    if (e) return e;
    e = migrate_in_tx(s, scripts, last);
    if (e) {
        pg_rollback(base);
        return e;
    }
    return pg_commit(base);
}

/* Versioned migrations in one transaction (DDL is transactional in PostgreSQL) under an advisory
 * lock, so that two concurrent `obx init` do not both create the schema. */
static obx_err pg_migrate(obx__store *base) {
    return obx__pg_migrate_to(base, migrations, OBX__SCHEMA_VERSION);
}

/* ---- transactions (contract 3) --------------------------------------------------------------- */

/* The nesting is shared (obx__tx_begin, shared.c); these are PostgreSQL's statements for it. */

/* Depth 0: our own connection left in a transaction (e.g. a failed COMMIT) is rolled back, being
 * nobody else's; a caller's transaction is joined unless it has failed already. */
static obx_err tx_in_tx(obx__store *base, bool *in_tx) {
    pg_store *s = (pg_store *)base;
    obx_err e;
    if ((e = ready(s, "begin"))) return e;
    PGTransactionStatusType ts = PQtransactionStatus(s->conn);
    if (s->owned && ts != PQTRANS_IDLE) {
        if ((e = exec_simple(s, "ROLLBACK", "begin"))) return e;
        ts = PQtransactionStatus(s->conn);
    }
    *in_tx = ts != PQTRANS_IDLE;
    if (ts == PQTRANS_INERROR)
        return obx__fail(OBX_ESTORE,
                         "postgres: the caller's transaction has already failed: roll it back");
    if (*in_tx && ts != PQTRANS_INTRANS)
        return obx__fail(OBX_ESTORE, "postgres: the connection is busy with another command");
    if (*in_tx) s->lost = false;
    return OBX_OK;
}

/* A relay connection's BEGIN is not sent here: it goes with the transaction's first statement,
 * in one pipeline (pend), and a transaction that sends nothing costs nothing. */
static obx_err tx_begin(obx__store *base) {
    pg_store *s = (pg_store *)base;
    if (s->dispatch) {
        s->pend = P_BEGIN | P_RELAY;
        s->lost = false;
        return OBX_OK;
    }
    obx_err e = exec_simple(s, "BEGIN", "begin");
    if (!e) s->lost = false;
    return e;
}

/* COMMIT's result r (consumed; NULL when none came): definite success, definite failure, or
 * OBX_EUNKNOWN when the connection broke while COMMIT was in flight (contract 5). */
static obx_err commit_result(pg_store *s, PGresult *r) {
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK) {
        /* COMMIT of a failed transaction reports success with the tag ROLLBACK */
        bool rolled_back = strcmp(PQcmdStatus(r), "COMMIT") != 0;
        PQclear(r);
        if (rolled_back)
            return obx__fail(OBX_ESTORE, "postgres: COMMIT rolled back: a statement of the "
                                         "transaction had failed");
        return OBX_OK;
    }
    const char *code = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (!r || PQstatus(s->conn) != CONNECTION_OK || conn_lost_state(code)) {
        char msg[512];
        primary_message(s, r, msg, sizeof msg);
        PQclear(r);
        return obx__fail(OBX_EUNKNOWN,
                         "postgres: connection lost during COMMIT: the transaction may or may "
                         "not have been committed (%s)",
                         msg);
    }
    /* the server answered: COMMIT failed (deferred constraint, serialization), rolled back */
    obx_err e = map_error(s, r, "commit");
    PQclear(r);
    return e;
}

/* The outermost COMMIT: definite success, definite failure, or OBX_EUNKNOWN when the connection
 * broke while COMMIT was in flight (contract 5). A held write set goes in COMMIT's pipeline. */
static obx_err commit_outer(pg_store *s) {
    if (s->held) return held_send(s, true);
    bool begun = !(s->pend & P_BEGIN);
    s->pend = 0;
    if (!begun) return OBX_OK; /* nothing was sent: nothing to commit */
    if (s->lost || PQstatus(s->conn) != CONNECTION_OK)
        return obx__fail(OBX_ECONNLOST, "postgres: connection lost before COMMIT: the "
                                        "transaction was not committed");
    return commit_result(s, PQexec(s->conn, "COMMIT"));
}

static obx_err tx_commit(obx__store *base) { return commit_outer((pg_store *)base); }

static obx_err tx_rollback(obx__store *base) {
    pg_store *s = (pg_store *)base;
    held_drop(s); /* never sent: nothing of it to roll back */
    bool begun = !(s->pend & P_BEGIN);
    s->pend = 0;
    return begun ? exec_simple(s, "ROLLBACK", "rollback") : OBX_OK;
}

static obx_err tx_savepoint(obx__store *base, int d, obx__sp_op op) {
    char sql[96];
    if (op == OBX__SP_OPEN)
        snprintf(sql, sizeof sql, "SAVEPOINT obx_sp%d", d);
    else if (op == OBX__SP_RELEASE)
        snprintf(sql, sizeof sql, "RELEASE SAVEPOINT obx_sp%d", d);
    else
        snprintf(sql, sizeof sql, "ROLLBACK TO SAVEPOINT obx_sp%d; RELEASE SAVEPOINT obx_sp%d", d,
                 d);
    return exec_simple((pg_store *)base, sql,
                       op == OBX__SP_OPEN      ? "savepoint"
                       : op == OBX__SP_RELEASE ? "release savepoint"
                                               : "rollback to savepoint");
}

/* nothing of a transaction survives its connection: rolled back already, by the server */
static bool tx_gone(obx__store *base) {
    pg_store *s = (pg_store *)base;
    return s->lost || PQstatus(s->conn) != CONNECTION_OK;
}

static void tx_idle(obx__store *base) {
    pg_store *s = (pg_store *)base;
    s->lost = false;
    held_drop(s); /* the transaction is over: a write set still held belonged to it */
}

static const obx__tx_ops pg_tx = {tx_in_tx,     tx_begin, tx_commit, tx_rollback,
                                  tx_savepoint, tx_gone,  tx_idle};

OBX__TX_METHODS(pg, pg_store, pg_tx)

/* ---- routes ------------------------------------------------------------------------------- */

static void read_route(const PGresult *r, int row, obx__route_row *o) {
    obx__route_decode(READER(r, row), o);
}

static obx_err pg_route_put(obx__store *base, const obx__route_row *rt, int64_t *gen) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, rt->event_type);
    p_text(&p, rt->cluster);
    p_text(&p, rt->topic);
    p_text(&p, rt->routing_key);
    p_text(&p, rt->algorithm);
    p_text(&p, rt->serializer);
    p_text(&p, rt->durability);
    p_text(&p, rt->required_acks);
    p_int(&p, rt->max_attempts);
    p_bool(&p, rt->blind_retry);
    p_bool(&p, rt->unordered);
    p_text(&p, rt->alias);
    p_int(&p, rt->created_at);
    p_text(&p, rt->encrypt_key);
    PGresult *r = NULL;
    obx_err e = run(s, Q_ROUTE_PUT, &p, PGRES_TUPLES_OK, &r, "insert route");
    if (!e) {
        if (gen) *gen = gi(r, 0, 0);
        PQclear(r);
    }
    return e;
}

/* The current route of event_type by statement q: Q_ROUTE_GET, whose last column is the route
 * table's OID (out->rel), or Q_ROUTE_GET_TXID, with the transaction ID after it (to txid[cap]). */
static obx_err route_read(pg_store *s, int q, const char *event_type, obx__route_row *out,
                          char *txid, size_t cap) {
    params p;
    p_init(&p);
    p_text(&p, event_type);
    PGresult *r = NULL;
    obx_err e = run(s, q, &p, PGRES_TUPLES_OK, &r, "read route");
    if (e) return e;
    if (PQntuples(r) == 1) {
        read_route(r, 0, out);
        int last = PQnfields(r) - 1;
        if (txid) gt(r, 0, last--, txid, cap);
        out->rel = (uint32_t)gi(r, 0, last);
    } else
        e = obx__fail(OBX_ENOROUTE,
                      "event_type: no route for '%s' (add one with `obx route set %s ...`)",
                      event_type, event_type);
    PQclear(r);
    return e;
}

static obx_err pg_route_get(obx__store *base, const char *event_type, obx__route_row *out) {
    return route_read((pg_store *)base, Q_ROUTE_GET, event_type, out, NULL, 0);
}

/* route_get and txid in one round trip: the producer's read inside its transaction. */
static obx_err pg_route_get_txid(obx__store *base, const char *event_type, obx__route_row *out,
                                 char *txid, size_t cap) {
    return route_read((pg_store *)base, Q_ROUTE_GET_TXID, event_type, out, txid, cap);
}

static obx_err pg_route_list(obx__store *base, bool all, obx__route_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    PGresult *r = NULL;
    obx_err e =
        run(s, all ? Q_ROUTE_LIST_ALL : Q_ROUTE_LIST_CUR, NULL, PGRES_TUPLES_OK, &r, "list routes");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "route list: out of memory");
        for (int i = 0; !e && i < rows; i++) read_route(r, i, &(*out)[i]);
        if (!e) *n = (size_t)rows;
    }
    PQclear(r);
    return e;
}

/* ---- producer ----------------------------------------------------------------------------- */

static obx_err pg_idem_lookup(obx__store *base, const char *tenant, const char *key,
                              char existing[OBX_EVENT_ID_LEN + 1]) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, tenant);
    p_text(&p, key);
    PGresult *r = NULL;
    obx_err e = run(s, Q_IDEM, &p, PGRES_TUPLES_OK, &r, "idempotency lookup");
    if (e) return e;
    if (PQntuples(r) == 1)
        gt(r, 0, 0, existing, OBX_EVENT_ID_LEN + 1);
    else
        e = OBX_ENOTFOUND;
    PQclear(r);
    return e;
}

static void order_key(const obx__event_row *r, char *out, size_t cap) {
    snprintf(out, cap, "%s\x1f%s\x1f%s", r->dest.cluster, r->dest.topic, r->dest.routing_key);
}
#define ORDER_KEY_CAP (OBX_NAME_MAX + OBX_TOPIC_MAX + OBX_KEY_MAX + 4)

/* Parameters $1..$28 of Q_INS_ENV and Q_INS_EVENT. */
static void bind_envelope(params *p, const obx__event_row *r, const void *payload, size_t len) {
    const obx__envelope *v = &r->env;
    p_text(p, v->event_id);
    p_int(p, r->envelope_gen);
    p_text(p, v->aggregate_type);
    p_text(p, v->aggregate_id);
    p_int(p, v->aggregate_version);
    p_text(p, v->event_type);
    p_text(p, v->payload_schema);
    p_text(p, v->payload_digest);
    p_text(p, v->tenant);
    p_int(p, v->occurred_at);
    p_text(p, v->created_txid);
    p_text(p, v->correlation_id);
    p_text(p, v->causation_id);
    p_text(p, v->traceparent);
    p_text(p, v->idempotency_key);
    p_text(p, r->envelope_digest);
    p_text(p, r->dest.cluster);
    p_text(p, r->dest.topic);
    p_text(p, r->dest.routing_key);
    p_text(p, r->dest.algorithm);
    p_int(p, r->dest.route_gen);
    p_text(p, r->dest.serializer);
    p_text(p, r->dest.durability);
    p_text(p, r->dest.required_acks);
    p_text(p, r->dest_digest);
    p_bytes(p, payload, len);
    p_int(p, (int64_t)len);
    p_int(p, r->committed_at);
}

static obx_err pg_insert_envelope(obx__store *base, const obx__event_row *r, const void *payload,
                                  size_t len) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    bind_envelope(&p, r, payload, len);
    p_int(&p, r->env.not_before); /* $29 */
    return run(s, Q_INS_ENV, &p, PGRES_COMMAND_OK, NULL, "insert envelope");
}

/* Parameters $1..$49 of Q_INS_EVENT and Q_INS_EVENT_AUDIT. p points into ok (the caller's,
 * ORDER_KEY_CAP bytes, alive until the statement ran). */
static void bind_event(params *p, char *ok, const obx__event_row *r, const void *payload,
                       size_t len) {
    order_key(r, ok, ORDER_KEY_CAP);
    bind_envelope(p, r, payload, len);
    p_text(p, ok); /* $29 */
    p_text(p, obx__state_name(r->state));
    p_int(p, r->claim_gen);
    p_text(p, r->owner);
    p_int(p, r->lease_until);
    p_int(p, r->attempt_gen);
    p_text(p, r->attempt_id);
    p_int(p, r->pinned_partition);
    p_int(p, r->rejections);
    p_int(p, r->available_at);
    p_int(p, r->next_check_at);
    p_int(p, r->unknown_since);
    p_text(p, r->primary_attempt_id);
    p_int(p, r->published_at);
    p_int(p, r->committed_at);
    p_int(p, r->updated_at);
    p_int(p, r->max_attempts);
    p_bool(p, r->blind_retry);
    p_bool(p, r->unordered);
    p_text(p, r->alias);    /* $48 */
    p_int(p, r->target_no); /* $49: a further target's slot carries no idempotency key */
}

static obx_err pg_insert_event(obx__store *base, const obx__event_row *r, const void *payload,
                               size_t len) {
    pg_store *s = (pg_store *)base;
    char ok[ORDER_KEY_CAP];
    params p;
    p_init(&p);
    bind_event(&p, ok, r, payload, len);
    p_int(&p, r->env.not_before); /* $50 */
    return run(s, Q_INS_EVENT, &p, PGRES_TUPLES_OK, NULL, "insert event");
}

/* Whether a is exactly the audit row that the producer's envelope of r records
 * (created_by): the one Q_LOAD_AUDIT and obx.obx_audit_all show for an envelope with
 * created_by. Any other row is written as a row, so that what is read back is what was
 * given. */
static bool producer_row(const obx__event_row *r, const obx__audit_row *a) {
    char reason[sizeof a->reason];
    snprintf(reason, sizeof reason, OBX__PRODUCER_REASON, (long long)r->dest.route_gen);
    return a->at == r->committed_at && a->actor == OBX__ACT_PRODUCER &&
           !strcmp(a->event_id, r->env.event_id) && a->envelope_gen == 1 &&
           r->env.envelope_gen == 1 && a->from == OBX__ST_NONE && a->to == OBX__ST_PENDING &&
           a->claim_gen == 0 && !a->attempt_id[0] && a->attempt_gen == 0 &&
           !strcmp(a->reason, reason);
}

static obx_err pg_insert_audit(obx__store *base, const obx__audit_row *a, size_t n);

/* insert_event and insert_audit of one row in one statement (Q_INS_EVENT_AUDIT): the audit row
 * recorded in the envelope when it is the producer's (producer_row), else the two writes. */
static obx_err pg_insert_event_audit(obx__store *base, const obx__event_row *r, const void *payload,
                                     size_t len, const obx__audit_row *a) {
    pg_store *s = (pg_store *)base;
    if (!producer_row(r, a)) {
        obx_err e = pg_insert_event(base, r, payload, len);
        return e ? e : pg_insert_audit(base, a, 1);
    }
    char ok[ORDER_KEY_CAP];
    params p;
    p_init(&p);
    bind_event(&p, ok, r, payload, len);
    p_text(&p, a->who);           /* $50 */
    p_int(&p, r->env.not_before); /* $51 */
    return run(s, Q_INS_EVENT_AUDIT, &p, PGRES_TUPLES_OK, NULL, "insert event");
}

/* A statement without parameters (SAVEPOINT, RELEASE) into a pipeline. */
static bool send_plain(pg_store *s, const char *sql) {
    return PQsendQueryParams(s->conn, sql, 0, NULL, NULL, NULL, NULL, 0);
}

/* Prepared statement id with p into a pipeline. */
static bool send_prepared(pg_store *s, int id, const params *p) {
    char name[40];
    stmt_name(id, name);
    return PQsendQueryPrepared(s->conn, name, p->n, p->val, p->len, p->fmt, 0);
}

/* One pipeline for pg_enqueue_write: SAVEPOINT, Q_ENQ_WRITE with p, RELEASE inside the caller's
 * transaction; with own (no transaction open), BEGIN, Q_ENQ_WRITE, COMMIT instead.
 *
 * Outcomes with own: the COMMIT's answer decides; a statement that failed on the server (the
 * pipeline then skipped the COMMIT) or a COMMIT that was never sent wrote nothing; a connection
 * that broke once the COMMIT was sent and before its answer is OBX_EUNKNOWN, as for
 * commit_outer (the server may have executed it). */
static obx_err enqueue_send(pg_store *s, const params *p, bool own, bool *written) {
    obx_err e = OBX_OK;
    char open[48] = "BEGIN", close[56] = "COMMIT";
    if (!own) {
        snprintf(open, sizeof open, "SAVEPOINT obx_sp%d", s->tx.depth);
        snprintf(close, sizeof close, "RELEASE SAVEPOINT obx_sp%d", s->tx.depth);
    }
    if (!PQenterPipelineMode(s->conn)) return map_error(s, NULL, "enqueue: pipeline mode");
    const char *what[3] = {own ? "begin" : "savepoint", "enqueue",
                           own ? "commit" : "release savepoint"};
    int sent = 0;
    if (send_plain(s, open)) sent++;
    if (sent == 1 && send_prepared(s, Q_ENQ_WRITE, p)) sent++;
    if (sent == 2 && send_plain(s, close)) sent++;
    bool synced = PQpipelineSync(s->conn); /* also after a failed send: answer what was sent */
    if (sent < 3 || !synced) e = map_error(s, NULL, "enqueue: send");
    bool opened = false, closed = false, gone = false, discarded = false, refused = false;
    for (int i = 0; i < sent && !gone; i++) {
        PGresult *res = PQgetResult(s->conn), *more;
        gone = !res;
        if (!res || PQresultStatus(res) == PGRES_PIPELINE_ABORTED || e) {
            PQclear(res);
        } else {
            const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
            /* the caller reset its session (DISCARD ALL): prepared again on the long way */
            if (i == 1 && code && !strcmp(code, "26000")) {
                s->prepared[Q_ENQ_WRITE] = false;
                discarded = true;
            }
            /* The server's own error (it carries a SQLSTATE; libpq's do not) to BEGIN or the
             * write ended the transaction, and so does one to COMMIT unless the connection was
             * ending under it (commit_outer): with own, nothing was committed */
            refused |= PQresultStatus(res) == PGRES_FATAL_ERROR && code &&
                       (i < 2 || (!conn_lost_state(code) && PQstatus(s->conn) == CONNECTION_OK));
            PGresult *keep = NULL;
            if (!(e = check(s, res, i == 1 ? PGRES_TUPLES_OK : PGRES_COMMAND_OK, &keep, what[i]))) {
                if (i == 0) opened = true;
                if (i == 1) *written = PQntuples(keep) == 1;
                /* COMMIT of a failed transaction reports success with the tag ROLLBACK */
                if (i == 2 && own && strcmp(PQcmdStatus(keep), "COMMIT") != 0)
                    e = obx__fail(OBX_ESTORE, "postgres: COMMIT rolled back (enqueue)");
                else if (i == 2)
                    closed = true;
                PQclear(keep);
            }
        }
        while (!gone && (more = PQgetResult(s->conn)) != NULL) PQclear(more);
    }
    if (gone && !e) e = map_error(s, NULL, "enqueue"); /* no answer: the connection broke */
    if (own && sent == 3 && !closed && !refused && e == OBX_ECONNLOST) {
        char why[512];
        obx__strlcpy(why, obx_errmsg(), sizeof why);
        e = obx__fail(OBX_EUNKNOWN,
                      "postgres: connection lost during the enqueue's COMMIT: the event may or "
                      "may not have been written (%s)",
                      why);
    }
    if (synced && !gone && PQstatus(s->conn) == CONNECTION_OK) PQclear(PQgetResult(s->conn));
    if (!PQexitPipelineMode(s->conn) && !e) e = map_error(s, NULL, "enqueue: pipeline mode");
    if ((opened || own) && !closed && PQstatus(s->conn) == CONNECTION_OK) {
        /* the write (or the release) failed: undo it, keep the first error. With own, a failed
         * statement left the session in an aborted transaction block (or a failed send left it
         * open): end it */
        char undo[112];
        if (own)
            snprintf(undo, sizeof undo, "ROLLBACK");
        else
            snprintf(undo, sizeof undo,
                     "ROLLBACK TO SAVEPOINT obx_sp%d; RELEASE SAVEPOINT obx_sp%d", s->tx.depth,
                     s->tx.depth);
        obx_err u = PQtransactionStatus(s->conn) == PQTRANS_IDLE
                        ? OBX_OK
                        : exec_simple(s, undo, own ? "rollback" : "rollback to savepoint");
        if (!e || (discarded && !u)) e = u; /* undone: the long way prepares it again */
    }
    if (e) *written = false;
    return e;
}

/* Q_ENQ_TRY in the caller's transaction, without a savepoint (pg_enqueue_write says when).
 * *written: the event was written; *busy: its order-key bucket is locked by another
 * transaction, nothing was written; neither: the cached route is no longer current. An error
 * is the server's (a disk full, a cancelled statement): the caller's transaction has failed,
 * as after a failure of its own statements. A session reset by the caller (DISCARD ALL) is
 * such an error too (run prepares every statement again afterwards). */
static obx_err enqueue_try(pg_store *s, params *p, bool *written, bool *busy) {
    *written = *busy = false;
    PGresult *keep = NULL;
    obx_err e = run(s, Q_ENQ_TRY, p, PGRES_TUPLES_OK, &keep, "enqueue");
    if (e) return e;
    if (PQntuples(keep) == 1) {
        *written = gb(keep, 0, 0);
        *busy = !*written;
    }
    PQclear(keep);
    return OBX_OK;
}

/* enqueue_write (store.h): SAVEPOINT, Q_ENQ_WRITE, RELEASE in one pipeline, one round trip
 * instead of the four of begin, route_get_txid, insert_event_audit and commit (issue 19: on a
 * 2-core machine three more round trips cost a business transaction a third of its rate,
 * docs/performance.md). Inside a transaction (the caller's, or obx's at any depth) after a
 * statement failed the server skipped the rest up to the sync; the savepoint is then rolled
 * back, so the caller's transaction is as before the call, as with obx__tx_rollback. On a
 * connection with none open (a producer that enqueues on its own), the same pipeline is
 * BEGIN, Q_ENQ_WRITE, COMMIT: one round trip where the long way takes four, with the long
 * way's outcomes (enqueue_send). An event without an idempotency key in the caller's
 * transaction is first tried without the savepoint (enqueue_try, Q_ENQ_TRY: 31,000 fewer
 * server instructions per business transaction, docs/performance.md section 3); a key could be
 * taken, and its write must not fail the caller's transaction, so it keeps the savepoint. */
static obx_err pg_enqueue_write(obx__store *base, const obx__event_row *r, const void *payload,
                                size_t len, const obx__audit_row *a, bool *written) {
    pg_store *s = (pg_store *)base;
    *written = false;
    if (!producer_row(r, a)) return OBX_OK; /* the long way writes it as a row */
    bool in_tx = s->tx.depth > 0;
    obx_err e = in_tx ? OBX_OK : tx_in_tx(base, &in_tx);
    if (e) return e;
    char ok[ORDER_KEY_CAP];
    obx__buf head = {0}, tail = {0}; /* the canonical encoding around created_txid */
    obx__envelope_canonical_head(&r->env, &head);
    obx__envelope_canonical_tail(&r->env, &tail);
    params p;
    p_init(&p);
    bind_event(&p, ok, r, payload, len);
    p_text(&p, a->who);               /* $50 */
    p_bytes(&p, head.data, head.len); /* $51 */
    p_bytes(&p, tail.data, tail.len); /* $52 */
    p_int(&p, r->route_rel);          /* $53 */
    p_int(&p, r->env.not_before);     /* $54 */
    if (head.oom || tail.oom) e = obx__fail(OBX_ENOMEM, "enqueue: out of memory");
    bool busy = true; /* the savepoint pipeline: unless enqueue_try wrote or the route changed */
    if (!e && !(e = p_ready(s, &p, Q_ENQ_WRITE, "enqueue")) && !(e = ready(s, "enqueue")) &&
        in_tx && s->tx.depth == 0 && !*r->env.idempotency_key)
        e = enqueue_try(s, &p, written, &busy);
    if (!e && busy && !(e = prepare(s, Q_ENQ_WRITE))) e = enqueue_send(s, &p, !in_tx, written);
    obx__buf_free(&head);
    obx__buf_free(&tail);
    return e;
}

/* ---- reading events ----------------------------------------------------------------------- */

static obx_err read_event(const PGresult *res, int row, obx__event_row *r, bool with_payload) {
    obx__event_decode(READER(res, row), r);
    if (with_payload) {
        size_t n = 0;
        obx_err e = get_bytea(res, row, EVENT_NCOLS, &r->payload, &n);
        if (e) return e;
        if (!r->payload && !r->payload_purged)
            r->payload_unread = true; /* over the claim's ceiling: payload_len is the stored one */
        else
            r->payload_len = n;
    }
    return OBX_OK;
}

/* Appends the rows of r to out and releases r. */
static obx_err collect(PGresult *r, bool with_payload, obx__rows *out, const char *what) {
    obx_err e = OBX_OK;
    for (int i = 0; !e && i < PQntuples(r); i++) {
        obx__event_row *row = obx__rows_push(out);
        if (!row)
            e = obx__fail(OBX_ENOMEM, "%s: out of memory", what);
        else
            e = read_event(r, i, row, with_payload);
    }
    PQclear(r);
    return e;
}

static obx_err wake_follow(pg_store *s, const char *cluster);
static obx_err wake_release(pg_store *s);

static obx_err read_claim(obx__store *base, const obx__claim_req *req, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_int(&p, req->now);
    p_text(&p, req->cluster);
    p_int(&p, (int64_t)req->limit);
    if (req->n_aliases)
        ARR_TEXT(&p, req->n_aliases, req->aliases[i]);
    else
        p_text(&p, NULL);
    if (req->max_payload)
        p_int(&p, (int64_t)req->max_payload);
    else
        p_text(&p, NULL);
    /* relay_plans. The relay prepares its statements once, often while the outbox is still
     * empty, and PostgreSQL caches generic plans made for empty tables until autovacuum first
     * analyzes them (a minute or more): each acceptance then scanned every row (3.2 ms per load
     * of a few events at 15,000 rows), and so did the claim, which without statistics prefers a
     * bitmap scan of every claimable row, the per-key NOT EXISTS and the envelope join for each
     * of them, and a sort: a claim that costs O(backlog) (212 ms against 1.5 ms at 20,000
     * pending rows; commit-to-PUBLISHED p50 of 50 s at 5,000 ev/s, docs/performance.md).
     * Planning each statement for its parameters fixed that but cost 0.3-0.5 ms per statement,
     * 37 % of the server's time at 1,000 ev/s. Every statement of the relay's transactions
     * finds its rows by key or through a partial index, so the plan that is right for them does
     * not depend on the table's size: a relay connection (serve_dispatch) begins each
     * transaction with RELAY_PLANS, which rules out what an empty table's statistics would
     * choose, and plans each statement once; the claim adds CLAIM_PLANS, which leaves the
     * ordered walk of obx_event_claimable. Other connections that claim (obx sim on
     * PostgreSQL, tests) get both for the claim's transaction. test_dispatch_plans checks the
     * plans on an outbox that grew after they were made. */
    if ((s->pend & P_BEGIN) || PQtransactionStatus(s->conn) == PQTRANS_INTRANS)
        s->pend |= s->dispatch ? P_CLAIM : P_CLAIM | P_RELAY; /* in the claim's pipeline */
    PGresult *r = NULL;
    obx_err e = wake_follow(s, req->cluster);
    if (!e) e = run(s, Q_CLAIM, &p, PGRES_TUPLES_OK, &r, "claim candidates");
    p_free(&p);
    /* a whole batch: a backlog, in which the relay claims again without waiting, so its
     * producers need not notify (nor commit one at a time) until it waits again */
    if (!e && s->wake_held && (size_t)PQntuples(r) >= req->limit) e = wake_release(s);
    if (e) {
        PQclear(r);
        return e;
    }
    return collect(r, true, out, "claim candidates");
}

static obx_err read_select(obx__store *base, const obx__select_req *req, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    int id;
    bool with_state = false;
    switch (req->kind) {
    case OBX__SEL_EXPIRED_SENDING: id = req->lock ? Q_SEL_EXPIRED_LOCK : Q_SEL_EXPIRED; break;
    case OBX__SEL_RECONCILE: id = req->lock ? Q_SEL_RECONCILE_LOCK : Q_SEL_RECONCILE; break;
    case OBX__SEL_STATE:
        if (obx__state_is_published(req->state))
            id = req->lock ? Q_SEL_STATE_LOCK : Q_SEL_STATE;
        else
            id = req->lock ? Q_SEL_UNPUB_STATE_LOCK : Q_SEL_UNPUB_STATE;
        with_state = true;
        break;
    case OBX__SEL_PUBLISHED_BEFORE:
        id = req->lock ? Q_SEL_PUBBEFORE_LOCK : Q_SEL_PUBBEFORE;
        with_state = true;
        break;
    default: return obx__fail(OBX_EINVAL, "select: unknown kind %d", (int)req->kind);
    }
    params p;
    p_init(&p);
    p_int(&p, req->now);
    p_text(&p, req->cluster);
    p_int(&p, (int64_t)(req->limit ? req->limit : 1000));
    p_bool(&p, req->payload);
    if (with_state) p_text(&p, obx__state_name(req->state));
    PGresult *r = NULL;
    obx_err e = run(s, id, &p, PGRES_TUPLES_OK, &r, "select events");
    return e ? e : collect(r, req->payload, out, "select events");
}

static obx_err read_ids(obx__store *base, const char *const *ids, size_t n, unsigned flags,
                        obx__rows *out) {
    pg_store *s = (pg_store *)base;
    bool pl = flags & OBX__LOAD_PAYLOAD;
    params p;
    p_init(&p);
    ARR_TEXT(&p, n, ids[i]);
    p_bool(&p, pl);
    /* A locking load opens acceptance and registration transactions: the relay's planner
     * options for the rest of the transaction (see relay_plans) where the connection did not
     * begin with them. */
    if (!s->dispatch && (flags & OBX__LOAD_LOCK) && PQtransactionStatus(s->conn) == PQTRANS_INTRANS)
        s->pend |= P_RELAY; /* in the load's pipeline */
    PGresult *r = NULL;
    obx_err e = run(s, (flags & OBX__LOAD_LOCK) ? Q_LOAD_LOCK : Q_LOAD, &p, PGRES_TUPLES_OK, &r,
                    "load events");
    p_free(&p);
    return e ? e : collect(r, pl, out, "load events");
}

/* Length of the run starting at from in which no key repeats (contract 4): open addressing on
 * a table of 2n slots, -1 = empty. */
static size_t unique_run(const char *(*key)(const void *, size_t), const void *rows, size_t from,
                         size_t n, long *slots, size_t nslots) {
    for (size_t k = 0; k < nslots; k++) slots[k] = -1;
    size_t j = from;
    for (; j < n; j++) {
        const char *kj = key(rows, j);
        uint32_t h = 2166136261u;
        for (const char *c = kj; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
        size_t at = h % nslots;
        bool dup = false;
        while (slots[at] >= 0) {
            if (!strcmp(key(rows, (size_t)slots[at]), kj)) {
                dup = true;
                break;
            }
            at = (at + 1) % nslots;
        }
        if (dup) break;
        slots[at] = (long)j;
    }
    return j - from;
}

static const char *update_key(const void *rows, size_t i) {
    return ((const obx__event_update *)rows)[i].row->env.event_id;
}

/* The parameters of Q_UPD_EVENTS for n updates with distinct event IDs. check: the statement
 * raises unless all n apply (WS_CHECK; the write set), else it reports which did. */
static obx_err build_update_events(params *p, const obx__event_update *u, size_t n, bool check) {
    char(*ok)[ORDER_KEY_CAP] = malloc(n * sizeof *ok);
    if (!ok) return obx__fail(OBX_ENOMEM, "update events: out of memory");
    obx__buf *b = r_begin(p, RT_EVENT_UPDATE);
    for (size_t i = 0; i < n; i++) {
        const obx__event_row *w = u[i].row;
        order_key(w, ok[i], sizeof ok[i]);
        size_t at = r_row(p, b, 21); /* obx._event_update */
        r_text(b, w->env.event_id);
        r_int4(b, w->envelope_gen);
        r_text(b, obx__state_name(w->state));
        r_int8(b, w->claim_gen);
        r_text(b, w->owner);
        r_int8(b, w->lease_until);
        r_int4(b, w->attempt_gen);
        r_text(b, w->attempt_id);
        r_int4(b, w->pinned_partition);
        r_int4(b, w->rejections);
        r_int8(b, w->available_at);
        r_int8(b, w->next_check_at);
        r_int8(b, w->unknown_since);
        r_text(b, w->primary_attempt_id);
        r_int8(b, w->published_at);
        r_int8(b, w->updated_at);
        r_text(b, ok[i]);
        r_text(b, w->dest.cluster);
        r_text(b, obx__state_name(u[i].expect_state));
        r_int8(b, u[i].expect_claim_gen);
        r_int8(b, w->held_at);
        r_row_end(b, at);
    }
    r_end(p);
    p_int(p, check ? (int64_t)n : -1);
    free(ok);
    return OBX_OK;
}

/* Which of Q_UPD_EVENTS's n updates applied (its RETURNING ord); consumes r. */
static void read_applied(PGresult *r, size_t n, bool *applied) {
    for (size_t i = 0; i < n; i++) applied[i] = false;
    for (int k = 0; k < PQntuples(r); k++) {
        int64_t ord = gi(r, k, 0);
        if (ord >= 1 && (size_t)ord <= n) applied[ord - 1] = true;
    }
    PQclear(r);
}

static obx_err update_events_run(pg_store *s, const obx__event_update *u, size_t n, bool *applied) {
    params p;
    p_init(&p);
    obx_err e = build_update_events(&p, u, n, false);
    PGresult *r = NULL;
    if (!e) e = run(s, Q_UPD_EVENTS, &p, PGRES_TUPLES_OK, &r, "update events");
    p_free(&p);
    if (e) return e;
    read_applied(r, n, applied);
    return OBX_OK;
}

static obx_err pg_update_events(obx__store *base, const obx__event_update *u, size_t n,
                                bool *applied) {
    pg_store *s = (pg_store *)base;
    size_t nslots = 2 * n + 1;
    long *slots = malloc(nslots * sizeof *slots);
    if (!slots) return obx__fail(OBX_ENOMEM, "update events: out of memory");
    obx_err e = OBX_OK;
    for (size_t at = 0; at < n && !e;) {
        size_t len = unique_run(update_key, u, at, n, slots, nslots);
        e = update_events_run(s, u + at, len, applied + at);
        at += len;
    }
    free(slots);
    return e;
}

/* ---- attempts, receipts, audit, counters --------------------------------------------------- */

/* The last five columns of obx._attempt_insert and obx._attempt_update: what came of the
 * attempt. */
static void r_attempt_outcome(obx__buf *b, const obx__attempt_row *a) {
    r_int8(b, a->unknown_at);
    r_int8(b, a->ended_at);
    r_int8(b, a->offset_before);
    r_int8(b, a->quiet_until);
    r_text(b, a->detail);
}

/* The parameters of Q_INS_ATT. */
static void build_insert_attempts(params *p, const obx__attempt_row *a, size_t n) {
    obx__buf *b = r_begin(p, RT_ATTEMPT_INSERT);
    for (size_t i = 0; i < n; i++) {
        size_t at = r_row(p, b, 15); /* obx._attempt_insert */
        r_text(b, a[i].attempt_id);
        r_text(b, a[i].event_id);
        r_int4(b, a[i].envelope_gen);
        r_int4(b, a[i].attempt_gen);
        r_int8(b, a[i].claim_gen);
        r_text(b, a[i].owner);
        r_text(b, a[i].dest_digest);
        r_int4(b, a[i].partition);
        r_text(b, obx__attempt_state_name(a[i].state));
        r_int8(b, a[i].started_at);
        r_attempt_outcome(b, &a[i]);
        r_row_end(b, at);
    }
    r_end(p);
}

static obx_err pg_insert_attempts(obx__store *base, const obx__attempt_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    build_insert_attempts(&p, a, n);
    obx_err e = run(s, Q_INS_ATT, &p, PGRES_COMMAND_OK, NULL, "insert attempts");
    p_free(&p);
    return e;
}

static const char *attempt_key(const void *rows, size_t i) {
    return ((const obx__attempt_row *)rows)[i].attempt_id;
}

/* The parameters of Q_UPD_ATT for n attempts with distinct IDs. check: the statement raises
 * unless all n exist (WS_CHECK; the write set). */
static void build_update_attempts(params *p, const obx__attempt_row *a, size_t n, bool check) {
    obx__buf *b = r_begin(p, RT_ATTEMPT_UPDATE);
    for (size_t i = 0; i < n; i++) {
        size_t at = r_row(p, b, 8); /* obx._attempt_update */
        r_text(b, a[i].attempt_id);
        r_int4(b, a[i].partition);
        r_text(b, obx__attempt_state_name(a[i].state));
        r_attempt_outcome(b, &a[i]);
        r_row_end(b, at);
    }
    r_end(p);
    p_int(p, check ? (int64_t)n : -1);
}

/* Q_UPD_ATT's RETURNING against the n attempts asked for: the first one missing is named;
 * consumes r. */
static obx_err check_updated_attempts(PGresult *r, const obx__attempt_row *a, size_t n) {
    obx_err e = OBX_OK;
    if ((size_t)PQntuples(r) != n) {
        /* name the first attempt that did not match (ids in a run are distinct) */
        for (size_t i = 0; i < n && !e; i++) {
            bool seen = false;
            for (int k = 0; k < PQntuples(r) && !seen; k++)
                seen = !strcmp(PQgetvalue(r, k, 0), a[i].attempt_id);
            if (!seen) e = obx__fail(OBX_ENOTFOUND, "attempt %s not found", a[i].attempt_id);
        }
    }
    PQclear(r);
    return e;
}

static obx_err update_attempts_run(pg_store *s, const obx__attempt_row *a, size_t n) {
    params p;
    p_init(&p);
    build_update_attempts(&p, a, n, false);
    PGresult *r = NULL;
    obx_err e = run(s, Q_UPD_ATT, &p, PGRES_TUPLES_OK, &r, "update attempts");
    p_free(&p);
    if (e) return e;
    return check_updated_attempts(r, a, n);
}

static obx_err pg_update_attempts(obx__store *base, const obx__attempt_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    size_t nslots = 2 * n + 1;
    long *slots = malloc(nslots * sizeof *slots);
    if (!slots) return obx__fail(OBX_ENOMEM, "update attempts: out of memory");
    obx_err e = OBX_OK;
    for (size_t at = 0; at < n && !e;) {
        size_t len = unique_run(attempt_key, a, at, n, slots, nslots);
        e = update_attempts_run(s, a + at, len);
        at += len;
    }
    free(slots);
    return e;
}

static void read_attempt(const PGresult *r, int row, obx__attempt_row *a) {
    obx__attempt_decode(READER(r, row), a);
}

/* The attempts of result r (consumed) into *out (the caller's, free()), *n_out. */
static obx_err collect_attempts(PGresult *r, obx__attempt_row **out, size_t *n_out) {
    obx_err e = OBX_OK;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "load attempts: out of memory");
        for (int i = 0; !e && i < rows; i++) read_attempt(r, i, &(*out)[i]);
        if (!e) *n_out = (size_t)rows;
    }
    PQclear(r);
    return e;
}

static obx_err pg_load_attempts(obx__store *base, const char *const *ids, size_t n,
                                const char *event_id, obx__attempt_row **out, size_t *n_out) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n_out = 0;
    params p;
    p_init(&p);
    if (event_id)
        p_text(&p, event_id);
    else
        ARR_TEXT(&p, n, ids[i]);
    PGresult *r = NULL;
    obx_err e =
        run(s, event_id ? Q_LOAD_ATT_EVENT : Q_LOAD_ATT, &p, PGRES_TUPLES_OK, &r, "load attempts");
    p_free(&p);
    return e ? e : collect_attempts(r, out, n_out);
}

/* load_slots: the attempts (Q_LOAD_ATT) and the slots' events (Q_LOAD_SLOTS*) in one
 * pipeline, with the transaction's unsent BEGIN and planner settings (ws_run). The events'
 * statement finds each slot through the attempt itself, so it needs nothing from the first. */
static obx_err pg_load_slots(obx__store *base, const char *const *aids, const char *const *eids,
                             size_t n, unsigned flags, obx__attempt_row **att, size_t *n_att,
                             obx__rows *ev) {
    pg_store *s = (pg_store *)base;
    bool pl = flags & OBX__LOAD_PAYLOAD, lock = flags & OBX__LOAD_LOCK;
    ws_stmt st[2] = {
        {.id = Q_LOAD_ATT, .kind = WS_KEEP, .what = "load attempts", .want = PGRES_TUPLES_OK},
        {.id = lock ? Q_LOAD_SLOTS_LOCK : Q_LOAD_SLOTS,
         .kind = WS_KEEP,
         .what = "load events",
         .want = PGRES_TUPLES_OK}};
    p_init(&st[0].p);
    p_init(&st[1].p);
    ARR_TEXT(&st[0].p, n, aids[i]);
    ARR_TEXT(&st[1].p, n, aids[i]);
    ARR_TEXT(&st[1].p, n, eids[i]);
    p_bool(&st[1].p, pl);
    /* as read_ids: a locking load in a transaction the connection did not begin with the
     * relay's planner options gets them in its pipeline */
    if (!s->dispatch && lock && PQtransactionStatus(s->conn) == PQTRANS_INTRANS) s->pend |= P_RELAY;
    PGresult *r[2] = {NULL, NULL};
    obx_err e = ws_run(s, st, 2, NULL, r, false);
    p_free(&st[0].p);
    p_free(&st[1].p);
    if (e) return e; /* ws_run cleared both results */
    if ((e = collect_attempts(r[0], att, n_att))) {
        PQclear(r[1]);
        return e;
    }
    if ((e = collect(r[1], pl, ev, "load events"))) {
        free(*att);
        *att = NULL;
        *n_att = 0;
    }
    return e;
}

/* The parameters of Q_INS_RCPT. */
static void build_insert_receipts(params *p, const obx__receipt_row *rc, size_t n) {
    obx__buf *b = r_begin(p, RT_RECEIPT_INSERT);
    for (size_t i = 0; i < n; i++) {
        size_t at = r_row(p, b, 15); /* obx._receipt_insert */
        r_text(b, rc[i].event_id);
        r_int4(b, rc[i].envelope_gen);
        r_text(b, rc[i].attempt_id);
        r_text(b, obx__receipt_kind_name(rc[i].kind));
        r_text(b, rc[i].cluster);
        r_text(b, rc[i].topic);
        r_int4(b, rc[i].partition);
        r_int8(b, rc[i].offset);
        r_int8(b, rc[i].broker_ts);
        r_text(b, rc[i].payload_digest);
        r_text(b, rc[i].dest_digest);
        r_text(b, rc[i].reason);
        r_text(b, rc[i].detail);
        r_int8(b, rc[i].created_at);
        r_text(b, obx__receipt_source_name(rc[i].source));
        r_row_end(b, at);
    }
    r_end(p);
}

static obx_err pg_insert_receipts(obx__store *base, const obx__receipt_row *rc, size_t n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    build_insert_receipts(&p, rc, n);
    obx_err e = run(s, Q_INS_RCPT, &p, PGRES_COMMAND_OK, NULL, "insert receipts");
    p_free(&p);
    return e;
}

/* Receipts from rows of RCPT_COLS. */
static obx_err read_receipts(PGresult *r, const char *what, obx__receipt_row **out, size_t *n_out) {
    obx_err e = OBX_OK;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "%s: out of memory", what);
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__receipt_decode(READER(r, i), &(*out)[i]);
    }
    if (!e) *n_out = (size_t)rows;
    return e;
}

static obx_err pg_load_receipts(obx__store *base, const char *event_id, obx__receipt_row **out,
                                size_t *n_out) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n_out = 0;
    params p;
    p_init(&p);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = run(s, Q_LOAD_RCPT, &p, PGRES_TUPLES_OK, &r, "load receipts");
    if (e) return e;
    e = read_receipts(r, "load receipts", out, n_out);
    PQclear(r);
    return e;
}

/* The parameters of Q_INS_AUDIT, or of Q_INS_AUDIT_FIND when some row's seq is not known;
 * returns which. */
static int build_insert_audit(params *p, const obx__audit_row *a, size_t n) {
    ARR_INT(p, n, a[i].at);
    ARR_TEXT(p, n, obx__actor_name(a[i].actor));
    ARR_TEXT(p, n, a[i].who);
    ARR_TEXT(p, n, a[i].event_id);
    ARR_INT(p, n, a[i].envelope_gen);
    ARR_TEXT(p, n, obx__state_name(a[i].from));
    ARR_TEXT(p, n, obx__state_name(a[i].to));
    ARR_INT(p, n, a[i].claim_gen);
    ARR_TEXT(p, n, a[i].attempt_id);
    ARR_INT(p, n, a[i].attempt_gen);
    ARR_TEXT(p, n, a[i].reason);
    int64_t lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i].seq <= 0) return Q_INS_AUDIT_FIND;
        if (!i || a[i].seq < lo) lo = a[i].seq;
        if (!i || a[i].seq > hi) hi = a[i].seq;
    }
    p_int(p, lo);
    p_int(p, hi);
    return Q_INS_AUDIT;
}

static obx_err pg_insert_audit(obx__store *base, const obx__audit_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    int q = build_insert_audit(&p, a, n);
    obx_err e = run(s, q, &p, PGRES_COMMAND_OK, NULL, "insert audit");
    p_free(&p);
    return e;
}

/* ---- a transaction's writes in one round trip (write_set) ----------------------------------- */

/* The result of the COMMIT that ended ws_run's pipeline, after the statements' (e: theirs;
 * refused: the server answered one with an error, so it did not run the COMMIT: a definite
 * failure, OBX_ECONNLOST if the backend went with it; broke: the connection broke while they
 * were read, so the COMMIT may have run: OBX_EUNKNOWN). Reads COMMIT's result when one is
 * due. */
static obx_err ws_commit_result(pg_store *s, obx_err e, bool refused, bool broke) {
    if (e && !refused && (broke || PQstatus(s->conn) != CONNECTION_OK))
        return obx__fail(OBX_EUNKNOWN,
                         "postgres: connection lost while the write set and its COMMIT were in "
                         "flight: the transaction may or may not have been committed (%s)",
                         obx_errmsg());
    PGresult *r = PQgetResult(s->conn), *more;
    bool got = r != NULL;
    obx_err c = OBX_OK;
    if (refused)
        PQclear(r); /* PGRES_PIPELINE_ABORTED: the server skipped it */
    else
        c = commit_result(s, r);
    while (got && (more = PQgetResult(s->conn)) != NULL) PQclear(more);
    if (!e || refused) return e ? e : c;
    /* no statement failed on the server, but one's result was not what this side expected:
     * the COMMIT ran, and may have committed */
    return c ? e
             : obx__fail(OBX_EUNKNOWN, "postgres: the write set's COMMIT ran after a result this "
                                       "side did not expect");
}

/* A statement's successful result r (consumed or kept): an update's rows to the write set w
 * (NULL: nothing to report, the statement checked itself), the WS_KEEP result to *keep. */
static obx_err ws_take(const ws_stmt *x, PGresult *r, const obx__write_set *w, PGresult **keep) {
    if (x->kind == WS_UPD_EVENTS && w) {
        read_applied(r, x->n, w->applied + x->off);
        return OBX_OK;
    }
    if (x->kind == WS_UPD_ATT && w) return check_updated_attempts(r, w->att + x->off, x->n);
    if (x->kind == WS_KEEP && keep)
        *keep = r;
    else
        PQclear(r);
    return OBX_OK;
}

/* Sends every statement, one sync, then reads the results in order (libpq pipeline mode).
 * The server runs them one after the other in the caller's transaction, exactly as separate
 * calls would; after a failed statement it skips the rest (PGRES_PIPELINE_ABORTED) and the
 * transaction is failed. Results are always read to the sync, so the connection leaves
 * pipeline mode whatever happened, unless it broke. What the transaction has not sent yet
 * (pend: its BEGIN, planner settings) goes first, in the same pipeline. w: the write set the
 * WS_UPD_* statements answer for (NULL if none); keep[j]: the result of the j-th WS_KEEP
 * statement (keep has a slot for each; all NULL on failure).
 * commit: COMMIT goes last, in the same pipeline (held_send; the transaction is over after,
 * committed or rolled back, or OBX_EUNKNOWN: ws_commit_result). */
static obx_err ws_run(pg_store *s, ws_stmt *st, size_t ns, const obx__write_set *w, PGresult **keep,
                      bool commit) {
    const char *what = ns ? st[0].what : "pipeline";
    obx_err e = conn_ready(s, what);
    unsigned pend = s->pend;
    /* the unsent part, in order: BEGIN (-1), then the settings' prepared statements */
    int pre[3];
    size_t npre = 0;
    if (pend & P_BEGIN) pre[npre++] = -1;
    if (pend & P_RELAY) pre[npre++] = Q_RELAY_PLANS;
    if (pend & P_CLAIM) pre[npre++] = Q_CLAIM_PLANS;
    for (size_t i = 0; !e && i < npre; i++)
        if (pre[i] >= 0) e = prepare(s, pre[i]);
    for (size_t i = 0; !e && i < ns; i++)
        if (!(e = p_ready(s, &st[i].p, st[i].id, st[i].what))) e = prepare(s, st[i].id);
    if (e) return e;
    if (!PQenterPipelineMode(s->conn)) return map_error(s, NULL, "pipeline mode");
    s->pend = 0; /* from here on the server's state says what was sent */
    static const params none;
    size_t sent = 0;
    for (; sent < npre + ns; sent++) {
        bool ok;
        if (sent < npre)
            ok = pre[sent] < 0 ? send_plain(s, "BEGIN") : send_prepared(s, pre[sent], &none);
        else
            ok = send_prepared(s, st[sent - npre].id, &st[sent - npre].p);
        if (!ok) break;
    }
    /* COMMIT only behind every statement: the server skips it after one that failed */
    bool committing = commit && sent == npre + ns && send_plain(s, "COMMIT");
    /* a sync also after a failed send: what was sent is answered, not left pending */
    bool synced = PQpipelineSync(s->conn);
    if (sent < npre + ns || commit != committing || !synced)
        e = map_error(s, NULL, "pipeline: send");
    bool refused = false, broke = false; /* the server failed a statement; the connection broke */
    size_t nkeep = 0;                    /* WS_KEEP statements read */
    for (size_t k = 0; k < sent; k++) {
        PGresult *r = PQgetResult(s->conn), *more;
        /* the server answered a statement with an error (a SQLSTATE: libpq's own errors, such
         * as a connection closed under it, have none), also 57P01 (terminated in it): it ran
         * nothing after it, COMMIT included */
        if (!e && r && PQresultStatus(r) == PGRES_FATAL_ERROR &&
            PQresultErrorField(r, PG_DIAG_SQLSTATE))
            refused = true;
        if (e || (r && PQresultStatus(r) == PGRES_PIPELINE_ABORTED)) {
            PQclear(r);
        } else if (k < npre) {
            e = check(s, r, pre[k] < 0 ? PGRES_COMMAND_OK : PGRES_TUPLES_OK, NULL,
                      pre[k] < 0 ? "begin" : "relay plans");
        } else {
            /* an event update that did not apply fails in its own statement (WS_CHECK), before
             * any later part runs */
            const ws_stmt *x = &st[k - npre];
            if (!(e = check(s, r, x->want, &r, x->what)))
                e = ws_take(x, r, w, keep ? &keep[nkeep] : NULL);
            if (x->kind == WS_KEEP) nkeep++;
        }
        if (!r) { /* the connection broke: nothing more will come */
            broke = true;
            break;
        }
        while ((more = PQgetResult(s->conn)) != NULL) PQclear(more);
    }
    if (committing) e = ws_commit_result(s, e, refused, broke);
    if (synced && PQstatus(s->conn) == CONNECTION_OK) {
        PGresult *r = PQgetResult(s->conn); /* PGRES_PIPELINE_SYNC */
        PQclear(r);
    }
    if (!PQexitPipelineMode(s->conn) && !e) e = map_error(s, NULL, "pipeline mode");
    /* a COMMIT that did not run leaves the transaction open (failed): end it, as a failed
     * COMMIT does (contract 5: definite failure means rolled back) */
    if (commit && e && e != OBX_EUNKNOWN && PQstatus(s->conn) == CONNECTION_OK &&
        PQtransactionStatus(s->conn) != PQTRANS_IDLE)
        PQclear(PQexec(s->conn, "ROLLBACK"));
    for (size_t j = 0; e && keep && j < nkeep; j++) {
        PQclear(keep[j]);
        keep[j] = NULL;
    }
    return e;
}

static obx_err pg_write_set(obx__store *base, const obx__write_set *w) {
    pg_store *s = (pg_store *)base;
    /* a part that names a row twice is split into runs, as update_events and update_attempts
     * split it (usually one run each): count them first, a statement's parameters are large */
    size_t big = w->n_upd > w->n_att ? w->n_upd : w->n_att, nslots = 2 * big + 1;
    long *slots = malloc(nslots * sizeof *slots);
    if (!slots) return obx__fail(OBX_ENOMEM, "write set: out of memory");
    size_t max = (w->n_att_new > 0) + (w->n_rc > 0) + (w->n_au > 0);
    for (size_t at = 0; at < w->n_upd; max++)
        at += unique_run(update_key, w->upd, at, w->n_upd, slots, nslots);
    for (size_t at = 0; at < w->n_att; max++)
        at += unique_run(attempt_key, w->att, at, w->n_att, slots, nslots);
    if (!max) {
        free(slots);
        return OBX_OK;
    }
    ws_stmt *st = calloc(max, sizeof *st);
    obx_err e = OBX_OK;
    size_t ns = 0;
    if (!st) e = obx__fail(OBX_ENOMEM, "write set: out of memory");
    for (size_t at = 0; !e && at < w->n_upd;) {
        size_t len = unique_run(update_key, w->upd, at, w->n_upd, slots, nslots);
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_UPD_EVENTS, WS_UPD_EVENTS, at, len, "update events", PGRES_TUPLES_OK};
        e = build_update_events(&x->p, w->upd + at, len, true);
        at += len;
    }
    if (!e && w->n_att_new) {
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_INS_ATT, WS_PLAIN, 0, w->n_att_new, "insert attempts", PGRES_COMMAND_OK};
        build_insert_attempts(&x->p, w->att_new, w->n_att_new);
    }
    for (size_t at = 0; !e && at < w->n_att;) {
        size_t len = unique_run(attempt_key, w->att, at, w->n_att, slots, nslots);
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_UPD_ATT, WS_UPD_ATT, at, len, "update attempts", PGRES_TUPLES_OK};
        build_update_attempts(&x->p, w->att + at, len, true);
        at += len;
    }
    if (!e && w->n_rc) {
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_INS_RCPT, WS_PLAIN, 0, w->n_rc, "insert receipts", PGRES_COMMAND_OK};
        build_insert_receipts(&x->p, w->rc, w->n_rc);
    }
    if (!e && w->n_au) {
        ws_stmt *x = &st[ns++];
        *x = (ws_stmt){Q_INS_AUDIT, WS_PLAIN, 0, w->n_au, "insert audit", PGRES_COMMAND_OK};
        x->id = build_insert_audit(&x->p, w->au, w->n_au);
    }
    /* A relay transaction (obx began it, depth 1) ends with its write set: hold it back, and
     * send it with the COMMIT (commit_outer), one round trip fewer per transaction. Every
     * statement checks itself (WS_CHECK): if an update did not apply the transaction fails and
     * the COMMIT rolls back, so every update counts as applied here. Anything else the
     * transaction sends first sends the write set (conn_ready). */
    if (!e && s->dispatch && s->tx.depth == 1 && s->tx.outer_begin && !s->held) {
        for (size_t i = 0; i < w->n_upd; i++) w->applied[i] = true;
        s->held = st;
        s->n_held = ns;
        free(slots);
        return OBX_OK;
    }
    if (!e) e = ws_run(s, st, ns, w, NULL, false);
    ws_free(st, ns);
    free(slots);
    return e;
}

static obx_err pg_load_audit(obx__store *base, const char *event_id, obx__audit_row **out,
                             size_t *n_out) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n_out = 0;
    params p;
    p_init(&p);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = run(s, Q_LOAD_AUDIT, &p, PGRES_TUPLES_OK, &r, "load audit");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "load audit: out of memory");
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__audit_row *a = &(*out)[i];
        a->at = gi(r, i, 0);
        const char *actor = PQgetvalue(r, i, 1);
        for (int k = 0; k < OBX__ACT_COUNT; k++)
            if (!strcmp(actor, obx__actor_name((obx__actor)k))) a->actor = (obx__actor)k;
        GT(r, i, 2, a->who);
        GT(r, i, 3, a->event_id);
        a->envelope_gen = (int32_t)gi(r, i, 4);
        a->from = obx__state_parse(PQgetvalue(r, i, 5));
        a->to = obx__state_parse(PQgetvalue(r, i, 6));
        a->claim_gen = gi(r, i, 7);
        GT(r, i, 8, a->attempt_id);
        a->attempt_gen = (int32_t)gi(r, i, 9);
        GT(r, i, 10, a->reason);
    }
    if (!e) *n_out = (size_t)rows;
    PQclear(r);
    return e;
}

static obx_err pg_counter_add(obx__store *base, const char *name, int64_t delta) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, name);
    p_int(&p, delta);
    return run(s, Q_COUNTER_ADD, &p, PGRES_COMMAND_OK, NULL, "counter");
}

static obx_err pg_counter_get(obx__store *base, const char *name, int64_t *value) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, name);
    PGresult *r = NULL;
    obx_err e = run(s, Q_COUNTER_GET, &p, PGRES_TUPLES_OK, &r, "counter");
    if (e) return e;
    *value = PQntuples(r) == 1 ? gi(r, 0, 0) : 0;
    PQclear(r);
    return OBX_OK;
}

/* ---- the dashboard's chart history --------------------------------------------------------- */

static obx_err pg_series_put(obx__store *base, const obx__series_row *r, int64_t keep_from) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_int(&p, r->slot);
    p_int(&p, r->at);
    p_text(&p, r->sample);
    p_int(&p, keep_from);
    return run(s, Q_SERIES_PUT, &p, PGRES_COMMAND_OK, NULL, "series");
}

static obx_err pg_series_list(obx__store *base, int64_t from, size_t limit, obx__series_row **out,
                              size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_int(&p, from);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = run(s, Q_SERIES_LIST, &p, PGRES_TUPLES_OK, &r, "series");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "series: out of memory");
    for (int i = 0; !e && i < rows; i++) {
        (*out)[i].slot = gi(r, i, 0);
        (*out)[i].at = gi(r, i, 1);
        if (!((*out)[i].sample = strdup(PQgetvalue(r, i, 2))))
            e = obx__fail(OBX_ENOMEM, "series: out of memory");
    }
    if (e) {
        obx__series_rows_free(*out, (size_t)rows);
        *out = NULL;
    } else
        *n = (size_t)rows;
    PQclear(r);
    return e;
}

/* ---- the cluster registry ------------------------------------------------------------------ */

static obx_err pg_cluster_put(obx__store *base, const obx__cluster_row *c) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, c->cluster);
    p_text(&p, c->backend);
    p_text(&p, c->lookup);
    p_text(&p, c->durability);
    p_text(&p, c->required_acks);
    p_text(&p, c->serializer);
    p_text(&p, c->relay);
    p_int(&p, c->seen_at);
    p_int(&p, c->live_until);
    return run(s, Q_CLUSTER_PUT, &p, PGRES_COMMAND_OK, NULL, "register cluster");
}

static obx_err pg_cluster_get(obx__store *base, const char *cluster, obx__cluster_row *c) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, cluster);
    PGresult *r = NULL;
    obx_err e = run(s, Q_CLUSTER_GET, &p, PGRES_TUPLES_OK, &r, "read cluster");
    if (e) return e;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return obx__fail(OBX_ENOTFOUND, "cluster '%s': no relay registered it", cluster);
    }
    memset(c, 0, sizeof *c);
    GT(r, 0, 0, c->cluster);
    GT(r, 0, 1, c->backend);
    GT(r, 0, 2, c->lookup);
    GT(r, 0, 3, c->durability);
    GT(r, 0, 4, c->required_acks);
    GT(r, 0, 5, c->serializer);
    GT(r, 0, 6, c->relay);
    c->seen_at = gi(r, 0, 7);
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_envelope_at(obx__store *base, const char *id, int32_t gen,
                              obx__envelope_at_row *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, id);
    p_int(&p, gen);
    PGresult *r = NULL;
    obx_err e = run(s, Q_ENV_AT, &p, PGRES_TUPLES_OK, &r, "read envelope");
    if (e) return e;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return obx__fail(OBX_ENOTFOUND, "event %s has no envelope generation %d", id, (int)gen);
    }
    obx__envelope_at_decode(READER(r, 0), out);
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_unserved(obx__store *base, int64_t now, obx__unserved_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_int(&p, now);
    PGresult *r = NULL;
    *out = NULL;
    *n = 0;
    obx_err e = run(s, Q_UNSERVED, &p, PGRES_TUPLES_OK, &r, "unserved clusters");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out))) {
        PQclear(r);
        return obx__fail(OBX_ENOMEM, "unserved clusters: out of memory");
    }
    for (int i = 0; i < rows; i++) {
        GT(r, i, 0, (*out)[i].cluster);
        (*out)[i].pending = gi(r, i, 1);
        (*out)[i].oldest_committed_at = gi(r, i, 2);
    }
    *n = (size_t)rows;
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_delivery_open(obx__store *base, int64_t out[3]) {
    pg_store *s = (pg_store *)base;
    PGresult *r = NULL;
    obx_err e = run(s, Q_DOPEN, NULL, PGRES_TUPLES_OK, &r, "open delivery sets");
    if (e) return e;
    for (int i = 0; i < 3; i++) out[i] = gi(r, 0, i);
    PQclear(r);
    return OBX_OK;
}

/* ---- statistics, search ------------------------------------------------------------------ */

static obx_err pg_stats(obx__store *base, obx__store_stats *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    PGresult *r = NULL;
    obx_err e = run(s, Q_STATS, NULL, PGRES_TUPLES_OK, &r, "stats");
    if (e) return e;
    for (int i = 0; i < PQntuples(r); i++) {
        const char *k = PQgetvalue(r, i, 0);
        int64_t v = gi(r, i, 1);
        if (!strncmp(k, "state:", 6)) {
            obx__state st = obx__state_parse(k + 6);
            if (st < OBX__ST_COUNT) out->by_state[st] = v;
        } else if (!strcmp(k, "receipt:PRIMARY"))
            out->receipts_primary = v;
        else if (!strcmp(k, "receipt:DUPLICATE"))
            out->receipts_duplicate = v;
        else if (!strcmp(k, "receipt:QUARANTINED"))
            out->receipts_quarantined = v;
        else if (!strcmp(k, "receipt:MIGRATION"))
            out->receipts_migration = v;
        else if (!strcmp(k, "receipt:ASSERTED"))
            out->receipts_asserted = v;
        else if (!strcmp(k, "oldest_pending"))
            out->oldest_pending_committed_at = v;
        else if (!strcmp(k, "oldest_unknown"))
            out->oldest_unknown_since = v;
        else if (!strcmp(k, "attempts_unknown"))
            out->attempts_unknown = v;
        else if (!strcmp(k, "held"))
            out->held = v;
        else if (!strcmp(k, "oldest_held"))
            out->oldest_held = v;
    }
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_invariants(obx__store *base, obx__store_invariants *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    PGresult *r = NULL;
    obx_err e = run(s, Q_STATS_INV, NULL, PGRES_TUPLES_OK, &r, "invariants");
    if (e) return e;
    if (PQntuples(r) == 1) {
        out->published_without_primary = gi(r, 0, 0);
        out->primary_not_published = gi(r, 0, 1);
        out->multi_primary = gi(r, 0, 2);
        out->cancelled_with_attempt = gi(r, 0, 3);
    }
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_unknown_resolutions(obx__store *base, int64_t **ms, size_t *n) {
    pg_store *s = (pg_store *)base;
    *ms = NULL;
    *n = 0;
    PGresult *r = NULL;
    obx_err e = run(s, Q_UNKNOWN_RES, NULL, PGRES_TUPLES_OK, &r, "unknown resolutions");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *ms = calloc((size_t)rows, sizeof **ms);
        if (!*ms) e = obx__fail(OBX_ENOMEM, "unknown resolutions: out of memory");
        for (int i = 0; !e && i < rows; i++) (*ms)[i] = gi(r, i, 0);
        if (!e) *n = (size_t)rows;
    }
    PQclear(r);
    return e;
}

static obx_err read_correlation(obx__store *base, const char *corr, size_t limit, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, corr);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = run(s, Q_FIND_CORR, &p, PGRES_TUPLES_OK, &r, "find by correlation");
    return e ? e : collect(r, false, out, "find by correlation");
}

/* ---- inbox ----------------------------------------------------------------------------------- */

static obx_err pg_inbox_get(obx__store *base, const char *consumer, const char *event_id,
                            obx__inbox_row *o) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = run(s, Q_INBOX_GET, &p, PGRES_TUPLES_OK, &r, "inbox get");
    if (e) return e;
    if (PQntuples(r) == 1) {
        memset(o, 0, sizeof *o);
        GT(r, 0, 0, o->consumer_id);
        GT(r, 0, 1, o->event_id);
        GT(r, 0, 2, o->payload_digest);
        GT(r, 0, 3, o->event_type);
        GT(r, 0, 4, o->tenant);
        GT(r, 0, 5, o->outcome);
        GT(r, 0, 6, o->result);
        GT(r, 0, 7, o->topic);
        o->partition = (int32_t)gi(r, 0, 8);
        o->offset = gi(r, 0, 9);
        o->consumed_at = gi(r, 0, 10);
        o->duration_us = gi(r, 0, 11);
        o->envelope_gen = (int32_t)gi(r, 0, 12);
        GT(r, 0, 13, o->attempt_id);
        GT(r, 0, 14, o->dest_digest);
    } else
        e = OBX_ENOTFOUND;
    PQclear(r);
    return e;
}

static obx_err pg_inbox_put(obx__store *base, const obx__inbox_row *i) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, i->consumer_id);
    p_text(&p, i->event_id);
    p_text(&p, i->payload_digest);
    p_text(&p, i->event_type);
    p_text(&p, i->tenant);
    p_text(&p, i->outcome);
    p_text(&p, i->result);
    p_text(&p, i->topic);
    p_int(&p, i->partition);
    p_int(&p, i->offset);
    p_int(&p, i->consumed_at);
    p_int(&p, i->duration_us);
    p_int(&p, i->envelope_gen);
    p_text(&p, i->attempt_id);
    p_text(&p, i->dest_digest);
    return run(s, Q_INBOX_PUT, &p, PGRES_COMMAND_OK, NULL, "inbox put");
}

static obx_err pg_inbox_has(obx__store *base, const char *consumer, const obx__inbox_key *keys,
                            size_t n, bool *present) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    ARR_TEXT(&p, n, keys[i].event_id);
    ARR_TEXT(&p, n, keys[i].payload_digest ? keys[i].payload_digest : "");
    ARR_INT(&p, n, keys[i].envelope_gen);
    ARR_TEXT(&p, n, keys[i].dest_digest ? keys[i].dest_digest : "");
    PGresult *r = NULL;
    obx_err e = run(s, Q_INBOX_HAS, &p, PGRES_TUPLES_OK, &r, "inbox has");
    p_free(&p);
    if (e) return e;
    for (size_t i = 0; i < n; i++) present[i] = false;
    for (int k = 0; k < PQntuples(r); k++) {
        int64_t ord = gi(r, k, 0);
        if (ord >= 1 && (size_t)ord <= n) present[ord - 1] = true;
    }
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_watermark_put(obx__store *base, const obx__watermark_row *w) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, w->consumer_id);
    p_text(&p, w->topic);
    p_int(&p, w->partition);
    p_int(&p, w->offset);
    p_text(&p, w->event_id);
    p_int(&p, w->occurred_at);
    p_int(&p, w->committed_at);
    return run(s, Q_WM_PUT, &p, PGRES_COMMAND_OK, NULL, "watermark");
}

static obx_err pg_watermark_list(obx__store *base, const char *consumer, obx__watermark_row **out,
                                 size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    if (consumer) p_text(&p, consumer);
    PGresult *r = NULL;
    obx_err e = run(s, consumer ? Q_WM_LIST : Q_WM_LIST_ALL, consumer ? &p : NULL, PGRES_TUPLES_OK,
                    &r, "watermarks");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "watermarks: out of memory");
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__watermark_row *w = &(*out)[i];
        GT(r, i, 0, w->consumer_id);
        GT(r, i, 1, w->topic);
        w->partition = (int32_t)gi(r, i, 2);
        w->offset = gi(r, i, 3);
        GT(r, i, 4, w->event_id);
        w->occurred_at = gi(r, i, 5);
        w->committed_at = gi(r, i, 6);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

static obx_err pg_failure_bump(obx__store *base, const char *consumer, const char *event_id,
                               const char *error, int64_t now, int64_t next_at, int32_t *failures) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_text(&p, error);
    p_int(&p, now);
    p_int(&p, next_at);
    PGresult *r = NULL;
    obx_err e = run(s, Q_FAIL_BUMP, &p, PGRES_TUPLES_OK, &r, "failure count");
    if (e) return e;
    *failures = (int32_t)gi(r, 0, 0);
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_failure_get(obx__store *base, const char *consumer, const char *event_id,
                              int32_t *failures, int64_t *next_at) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = run(s, Q_FAIL_GET, &p, PGRES_TUPLES_OK, &r, "failure get");
    if (e) return e;
    if (PQntuples(r)) {
        *failures = (int32_t)gi(r, 0, 0);
        *next_at = gi(r, 0, 1);
    } else
        e = OBX_ENOTFOUND;
    PQclear(r);
    return e;
}

static obx_err pg_inbox_finish(obx__store *base, const char *consumer, const char *event_id,
                               const char *result, int64_t duration_us) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, result);
    p_int(&p, duration_us);
    p_text(&p, consumer);
    p_text(&p, event_id);
    return run(s, Q_INBOX_FINISH, &p, PGRES_COMMAND_OK, NULL, "inbox finish");
}

static obx_err pg_failure_clear(obx__store *base, const char *consumer, const char *event_id) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    return run(s, Q_FAIL_CLEAR, &p, PGRES_COMMAND_OK, NULL, "failure clear");
}

static obx_err pg_poison_put(obx__store *base, const obx__poison_row *pr) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, pr->consumer_id);
    p_text(&p, pr->event_id);
    p_text(&p, pr->state);
    p_int(&p, pr->failures);
    p_text(&p, pr->last_error);
    p_text(&p, pr->topic);
    p_int(&p, pr->partition);
    p_int(&p, pr->offset);
    p_text(&p, pr->headers_json ? pr->headers_json : "{}");
    if (pr->payload)
        p_bytes(&p, pr->payload, pr->payload_len);
    else
        p_text(&p, NULL);
    p_int(&p, pr->parked_at);
    p_int(&p, pr->updated_at);
    p_text(&p, pr->payload_digest);
    return run(s, Q_POISON_PUT, &p, PGRES_COMMAND_OK, NULL, "poison put");
}

static obx_err read_poison(const PGresult *r, int row, obx__poison_row *p, bool payload) {
    memset(p, 0, sizeof *p);
    GT(r, row, 0, p->consumer_id);
    GT(r, row, 1, p->event_id);
    GT(r, row, 2, p->state);
    p->failures = (int32_t)gi(r, row, 3);
    GT(r, row, 4, p->last_error);
    GT(r, row, 5, p->topic);
    p->partition = (int32_t)gi(r, row, 6);
    p->offset = gi(r, row, 7);
    p->headers_json = obx__strdup(PQgetisnull(r, row, 8) ? "{}" : PQgetvalue(r, row, 8));
    p->parked_at = gi(r, row, 9);
    p->updated_at = gi(r, row, 10);
    GT(r, row, 11, p->payload_digest);
    if (!p->headers_json) return obx__fail(OBX_ENOMEM, "poison: out of memory");
    if (payload) return get_bytea(r, row, 12, &p->payload, &p->payload_len);
    return OBX_OK;
}

static obx_err pg_poison_list(obx__store *base, const char *consumer, const char *state,
                              obx__poison_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, state);
    PGresult *r = NULL;
    obx_err e = run(s, Q_POISON_LIST, &p, PGRES_TUPLES_OK, &r, "poison list");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "poison list: out of memory");
    }
    size_t done = 0;
    for (int i = 0; !e && i < rows; i++, done++) e = read_poison(r, i, &(*out)[i], false);
    PQclear(r);
    if (e) {
        obx__poison_rows_free(*out, *out ? (size_t)rows : 0);
        *out = NULL;
        return e;
    }
    *n = done;
    return OBX_OK;
}

static obx_err pg_poison_get(obx__store *base, const char *consumer, const char *event_id,
                             const char *digest, obx__poison_row *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_text(&p, digest);
    PGresult *r = NULL;
    obx_err e = run(s, Q_POISON_GET, &p, PGRES_TUPLES_OK, &r, "poison get");
    if (e) return e;
    if (PQntuples(r) == 1) {
        e = read_poison(r, 0, out, true);
        if (e) {
            free(out->headers_json);
            out->headers_json = NULL;
        }
    } else
        e = obx__fail(OBX_ENOTFOUND, "no poison message %s for consumer %s", event_id, consumer);
    PQclear(r);
    return e;
}

static obx_err pg_poison_set_state(obx__store *base, const char *consumer, const char *event_id,
                                   const char *state, int64_t now) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, state);
    p_int(&p, now);
    p_text(&p, consumer);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = run(s, Q_POISON_STATE, &p, PGRES_COMMAND_OK, &r, "poison state");
    if (e) return e;
    bool any = atoll(PQcmdTuples(r)) >= 1; /* every copy of the event */
    PQclear(r);
    if (!any)
        return obx__fail(OBX_ENOTFOUND, "no poison message %s for consumer %s", event_id, consumer);
    return OBX_OK;
}

static obx_err pg_inbox_quarantine_put(obx__store *base, const char *consumer, const char *event_id,
                                       const char *digest, const char *first_digest,
                                       const char *reason, int64_t at) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_text(&p, digest);
    p_text(&p, first_digest);
    p_text(&p, reason);
    p_int(&p, at);
    return run(s, Q_INBOX_QUAR, &p, PGRES_COMMAND_OK, NULL, "inbox quarantine");
}

static obx_err pg_consume_audit_put(obx__store *base, const obx__consume_audit_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    if (!n) return OBX_OK;
    params p;
    p_init(&p);
    ARR_INT(&p, n, a[i].at);
    ARR_TEXT(&p, n, a[i].consumer_id);
    ARR_TEXT(&p, n, a[i].event_id);
    ARR_TEXT(&p, n, a[i].outcome);
    ARR_INT(&p, n, a[i].duration_us);
    ARR_TEXT(&p, n, a[i].detail);
    obx_err e = run(s, Q_CONSUME_AUDIT, &p, PGRES_COMMAND_OK, NULL, "consume audit");
    p_free(&p);
    return e;
}

/* ---- retention and audit (docs/retention.md)
 * ------------------------------------------------------ */

static obx_err read_retention(obx__store *base, const obx__retention_req *req, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, obx__state_name(req->state));
    p_int(&p, req->after.at);
    p_int(&p, req->after.seq);
    p_int(&p, req->before.at);
    p_int(&p, req->before.seq);
    p_int(&p, (int64_t)req->limit);
    PGresult *r = NULL;
    obx_err e = run(s, req->lock ? Q_RET_CANDIDATES_LOCK : Q_RET_CANDIDATES, &p, PGRES_TUPLES_OK,
                    &r, "retention candidates");
    return e ? e : collect(r, false, out, "retention candidates");
}

static obx_err pg_purge_payloads(obx__store *base, const char *const *ids, size_t n,
                                 int64_t *bytes) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    ARR_TEXT(&p, n, ids[i]);
    PGresult *r = NULL;
    obx_err e = run(s, Q_PURGE_PAYLOADS, &p, PGRES_TUPLES_OK, &r, "purge payloads");
    p_free(&p);
    if (e) return e;
    int64_t total = 0;
    for (int k = 0; k < PQntuples(r); k++) total += gi(r, k, 0);
    PQclear(r);
    if (bytes) *bytes = total;
    return OBX_OK;
}

static obx_err pg_aged(obx__store *base, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                       obx__aged_count *count) {
    pg_store *s = (pg_store *)base;
    bool inbox = req->kind == OBX__AGED_INBOX_QUARANTINED;
    bool unserved = req->kind == OBX__AGED_UNSERVED;
    PGresult *r = NULL;
    obx_err e;
    if (req->count) {
        params p;
        p_init(&p);
        p_int(&p, req->until);
        if (inbox) p_text(&p, req->consumer);
        if (unserved) p_int(&p, req->now);
        if ((e = run(s, Q_AGED_COUNT + (int)req->kind, &p, PGRES_TUPLES_OK, &r, "audit count")))
            return e;
        if (count && PQntuples(r) == 1) {
            count->total = gi(r, 0, 0);
            count->oldest = gi(r, 0, 1);
        }
        PQclear(r);
    }
    if (!req->limit) return OBX_OK;
    params p;
    p_init(&p);
    p_int(&p, req->until);
    p_int(&p, req->after_at);
    p_int(&p, req->after_key);
    p_int(&p, (int64_t)req->limit);
    if (inbox) p_text(&p, req->consumer);
    if (unserved) p_int(&p, req->now);
    if ((e = run(s, Q_AGED_LIST + (int)req->kind, &p, PGRES_TUPLES_OK, &r, "audit list"))) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "audit list: out of memory");
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__aged_row *a = &(*out)[i];
        GT(r, i, 0, a->event_id);
        a->at = gi(r, i, 1);
        a->key = gi(r, i, 2);
        GT(r, i, 3, a->detail);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

static void pg_serve_dispatch(obx__store *base) { ((pg_store *)base)->dispatch = true; }

/* ---- idle wait (contract 8) ------------------------------------------------------------------ */

/* Releases the wake lock (a claim took a whole batch; the cluster changed). */
static obx_err wake_release(pg_store *s) {
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%s, %ld)", LOCK_CLASS_WAKE,
             (long)s->wake_key);
    s->wake_held = false;
    return check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "release the wake lock");
}

/* A claim for `cluster` (NULL: every cluster) on this connection: the wake lock it waits on is
 * that cluster's from now on. */
static obx_err wake_follow(pg_store *s, const char *cluster) {
    const char *c = cluster ? cluster : "";
    if (!strcmp(c, s->wake_cluster)) return OBX_OK;
    obx_err e = s->wake_held ? wake_release(s) : OBX_OK;
    obx__strlcpy(s->wake_cluster, c, sizeof s->wake_cluster);
    s->wake_key_known = false;
    return e;
}

/* Takes the wake lock of this connection's cluster for up to timeout_ms (0: only if free now).
 * *got: held now. Waiting (rather than trying once) matters: the lock is busy while a producer
 * that did not notify is between its statement and its commit, which under load is most of the
 * time, and a waiting exclusive request makes every later producer notify. A session lock taken
 * in a transaction outlives it; lock_timeout is the transaction's own. */
static obx_err wake_take(pg_store *s, int timeout_ms, bool *got) {
    *got = false;
    obx_err e;
    if (!s->wake_key_known) {
        const char *v[1] = {s->wake_cluster};
        PGresult *r = NULL;
        if ((e = check(
                 s, PQexecParams(s->conn, "SELECT hashtext($1::text)", 1, NULL, v, NULL, NULL, 0),
                 PGRES_TUPLES_OK, &r, "the wake lock's key")))
            return e;
        s->wake_key = (int32_t)strtol(PQgetvalue(r, 0, 0), NULL, 10);
        s->wake_key_known = true;
        PQclear(r);
    }
    char sql[200];
    if (timeout_ms <= 0)
        snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%s, %ld)", LOCK_CLASS_WAKE,
                 (long)s->wake_key);
    else
        snprintf(sql, sizeof sql,
                 "BEGIN; SET LOCAL lock_timeout = %d; SELECT pg_advisory_lock(%s, %ld), true; "
                 "COMMIT",
                 timeout_ms, LOCK_CLASS_WAKE, (long)s->wake_key);
    PGresult *r = PQexec(s->conn, sql);
    ExecStatusType st = PQresultStatus(r);
    const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (timeout_ms > 0 && st == PGRES_FATAL_ERROR && code && !strcmp(code, "55P03")) {
        /* lock_timeout: still busy; the transaction it ended is rolled back */
        PQclear(r);
        return check(s, PQexec(s->conn, "ROLLBACK"), PGRES_COMMAND_OK, NULL,
                     "wait for the wake lock");
    }
    if (timeout_ms > 0) {
        /* the last result is COMMIT's */
        if ((e = check(s, r, PGRES_COMMAND_OK, NULL, "wait for the wake lock"))) {
            if (PQstatus(s->conn) == CONNECTION_OK && PQtransactionStatus(s->conn) != PQTRANS_IDLE)
                PQclear(PQexec(s->conn, "ROLLBACK"));
            return e;
        }
        *got = true;
    } else {
        if ((e = check(s, r, PGRES_TUPLES_OK, &r, "take the wake lock"))) return e;
        *got = !strcmp(PQgetvalue(r, 0, 0), "t");
        PQclear(r);
    }
    s->wake_held = *got;
    return OBX_OK;
}

/* The shortest wait spent in the server (server_wait): the relay's turns of a few
 * milliseconds between a broker's outcomes poll the socket instead of sending a statement each. */
#define SERVER_WAIT_MIN_MS 20

/* The idle wait in the server: obx._wait_for_work() returns when a producer's commit sets this
 * backend's latch (obx_pg.c: the producers that find the wake lock held name its holders and
 * wake them after their commit, with no NOTIFY and so no commit queue; a NOTIFY to this LISTENing
 * session sets the latch too), or at its timeout (at most 1 s). *woke: the latch was set.
 * Without the extension (wait_fn -1) the caller polls the socket for the NOTIFY. */
static obx_err server_wait(pg_store *s, int ms, bool *woke) {
    *woke = false;
    PGresult *r = NULL;
    obx_err e;
    if (!s->wait_fn) {
        if ((e = check(s,
                       PQexec(s->conn, "SELECT to_regprocedure('obx._wait_for_work(integer)') "
                                       "IS NOT NULL"),
                       PGRES_TUPLES_OK, &r, "look up obx._wait_for_work")))
            return e;
        s->wait_fn = !strcmp(PQgetvalue(r, 0, 0), "t") ? 1 : -1;
        PQclear(r);
    }
    if (s->wait_fn < 0) return OBX_OK;
    char sql[64];
    snprintf(sql, sizeof sql, "SELECT obx._wait_for_work(%d)", ms > 1000 ? 1000 : ms);
    if ((e = check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, &r, "wait for work"))) return e;
    *woke = !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    return OBX_OK;
}

/* How long a wait that also watches a broker's descriptor waits for the wake lock: the
 * server-side wait cannot watch the descriptor, so it stays as short as the relay's turns were
 * (relay.c, idle_wait). */
#define WAKE_TAKE_WITH_FD_MS 2

static obx_err pg_wait_for_work(obx__store *base, int timeout_ms, int also_fd, bool *notified) {
    pg_store *s = (pg_store *)base;
    *notified = false;
    if (s->tx.depth > 0 ||
        (PQstatus(s->conn) == CONNECTION_OK && PQtransactionStatus(s->conn) != PQTRANS_IDLE))
        return obx__fail(OBX_EINVAL, "wait_for_work: called inside a transaction (a "
                                     "notification is only delivered between transactions)");
    obx_err e = ready(s, "wait for work");
    if (e) return e;
    if (!s->listening) {
        if ((e = exec_simple(s, "LISTEN " NOTIFY_CHANNEL, "listen"))) return e;
        s->listening = true;
    }
    int64_t deadline = obx__mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    if (s->wake_cluster[0] && !s->wake_held) {
        /* Producers notify only while this lock is held. One that tested it before we took it
         * committed before we could, after our last claim began perhaps: look again (notified)
         * before sleeping on the lock. Not taken in time: producers are still in flight, or
         * another relay of the cluster waits (its wake-ups reach us too); the caller's next
         * turn tries again. */
        bool got = false;
        int wait =
            also_fd >= 0 && timeout_ms > WAKE_TAKE_WITH_FD_MS ? WAKE_TAKE_WITH_FD_MS : timeout_ms;
        if ((e = wake_take(s, wait, &got))) return e;
        if (got) {
            *notified = true;
            return OBX_OK;
        }
        /* without the lock producers may not notify: the caller's next turn tries again */
        if (also_fd >= 0) return OBX_OK;
    }
    /* also_fd turned readable: the broker's turn, once the hints that came are read */
    bool fd_ready = false;
    for (;;) {
        if (!PQconsumeInput(s->conn)) return map_error(s, NULL, "wait for work");
        PGnotify *nt;
        while ((nt = PQnotifies(s->conn)) != NULL) {
            if (!strcmp(nt->relname, NOTIFY_CHANNEL)) *notified = true;
            PQfreemem(nt);
        }
        if (*notified || fd_ready) return OBX_OK;
        int64_t left = deadline - obx__mono_ms();
        if (left <= 0) return OBX_OK;
        if (also_fd < 0 && left >= SERVER_WAIT_MIN_MS && s->wait_fn >= 0) {
            bool woke = false;
            if ((e = server_wait(s, (int)left, &woke))) return e;
            if (woke) *notified = true;
            if (s->wait_fn > 0) continue; /* the notifications that came are read first */
        }
        struct pollfd pfd[2] = {{.fd = PQsocket(s->conn), .events = POLLIN},
                                {.fd = also_fd, .events = POLLIN}};
        if (pfd[0].fd < 0) return map_error(s, NULL, "wait for work");
        int rc = poll(pfd, also_fd >= 0 ? 2 : 1, left > 60000 ? 60000 : (int)left);
        if (rc < 0 && errno != EINTR)
            return obx__fail(OBX_EIO, "wait for work: poll: %s", strerror(errno));
        fd_ready = rc > 0 && also_fd >= 0 && pfd[1].revents;
    }
}

/* ---- roles ---------------------------------------------------------------------------------- */

static obx_err pg_create_roles(obx__store *base, const char *prefix) {
    pg_store *s = (pg_store *)base;
    obx_err e = pg_begin(base);
    if (e) return e;
    const char *v[1] = {prefix};
    e = check(s,
              PQexecParams(s->conn, "SELECT obx.create_roles($1::text)", 1, NULL, v, NULL, NULL, 0),
              PGRES_TUPLES_OK, NULL, "create roles");
    if (e) {
        pg_rollback(base);
        return e;
    }
    return pg_commit(base);
}

/* ---- selections, delivery sets, receipt details, takeover ---------------------------------- */

static obx_err read_filter(obx__store *base, const obx__event_filter *f, obx__rows *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, f->event_type);
    p_text(&p, f->cluster);
    p_text(&p, f->topic);
    if (f->n_aliases)
        ARR_TEXT(&p, f->n_aliases, f->aliases[i]);
    else
        p_text(&p, NULL);
    if (f->n_states)
        ARR_TEXT(&p, f->n_states, obx__state_name(f->states[i]));
    else
        p_text(&p, NULL);
    p_int(&p, f->committed_from);
    p_int(&p, f->committed_to);
    p_int(&p, f->after_seq);
    p_int(&p, (int64_t)(f->limit ? f->limit : 1000));
    p_bool(&p, f->held);
    p_int(&p, f->unknown_before);
    PGresult *r = NULL;
    obx_err e = run(s, Q_FIND, &p, PGRES_TUPLES_OK, &r, "find events");
    p_free(&p);
    return e ? e : collect(r, false, out, "find events");
}

static obx_err pg_route_set_put(obx__store *base, const obx__route_set_row *rs) {
    pg_store *s = (pg_store *)base;
    size_t n = (size_t)rs->n;
    params p;
    p_init(&p);
    p_int(&p, rs->route_gen);
    p_text(&p, rs->completion);
    p_int(&p, rs->n + 1);
    ARR_INT(&p, n, rs->t[i].target_no);
    ARR_TEXT(&p, n, rs->t[i].cluster);
    ARR_TEXT(&p, n, rs->t[i].topic);
    ARR_TEXT(&p, n, rs->t[i].routing_key);
    ARR_TEXT(&p, n, rs->t[i].algorithm);
    ARR_TEXT(&p, n, rs->t[i].serializer);
    ARR_TEXT(&p, n, rs->t[i].durability);
    ARR_TEXT(&p, n, rs->t[i].required_acks);
    obx_err e = run(s, Q_RSET_PUT, &p, PGRES_COMMAND_OK, NULL, "insert route set");
    p_free(&p);
    return e;
}

static obx_err pg_route_set_get(obx__store *base, int64_t gen, obx__route_set_row *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    params p;
    p_init(&p);
    p_int(&p, gen);
    PGresult *r = NULL;
    obx_err e = run(s, Q_RSET_GET, &p, PGRES_TUPLES_OK, &r, "read route set");
    if (e) return e;
    int rows = PQntuples(r);
    if (!rows) {
        PQclear(r);
        return obx__fail(OBX_ENOTFOUND, "route generation %lld declares no delivery set",
                         (long long)gen);
    }
    out->route_gen = gen;
    GT(r, 0, 0, out->completion);
    for (int i = 0; i < rows && out->n < OBX__SET_MAX - 1; i++) {
        if (PQgetisnull(r, i, 1)) continue;
        obx__route_target_row *t = &out->t[out->n++];
        t->target_no = (int32_t)gi(r, i, 1);
        GT(r, i, 2, t->cluster);
        GT(r, i, 3, t->topic);
        GT(r, i, 4, t->routing_key);
        GT(r, i, 5, t->algorithm);
        GT(r, i, 6, t->serializer);
        GT(r, i, 7, t->durability);
        GT(r, i, 8, t->required_acks);
    }
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_delivery_put(obx__store *base, const obx__delivery_row *d) {
    pg_store *s = (pg_store *)base;
    size_t n = (size_t)d->n;
    params p;
    p_init(&p);
    p_text(&p, d->event_id);
    p_text(&p, d->completion);
    p_int(&p, d->route_gen);
    p_int(&p, d->created_at);
    ARR_TEXT(&p, n, d->t[i].slot_id);
    ARR_INT(&p, n, d->t[i].target_no);
    ARR_TEXT(&p, n, d->t[i].origin);
    ARR_INT(&p, n, d->t[i].created_at);
    obx_err e = run(s, Q_DSET_PUT, &p, PGRES_COMMAND_OK, NULL, "insert delivery set");
    p_free(&p);
    return e;
}

static obx_err pg_delivery_get(obx__store *base, const char *id, obx__delivery_row *out) {
    pg_store *s = (pg_store *)base;
    memset(out, 0, sizeof *out);
    params p;
    p_init(&p);
    p_text(&p, id);
    PGresult *r = NULL;
    obx_err e = run(s, Q_DGET, &p, PGRES_TUPLES_OK, &r, "read delivery set");
    if (e) return e;
    int rows = PQntuples(r);
    for (int i = 0; i < rows && out->n < OBX__SET_MAX; i++) {
        GT(r, i, 0, out->event_id);
        GT(r, i, 1, out->completion);
        out->route_gen = gi(r, i, 2);
        out->created_at = gi(r, i, 3);
        obx__delivery_target_row *t = &out->t[out->n++];
        t->target_no = (int32_t)gi(r, i, 4);
        GT(r, i, 5, t->slot_id);
        GT(r, i, 6, t->origin);
        t->created_at = gi(r, i, 7);
    }
    PQclear(r);
    if (!out->n) return obx__fail(OBX_ENOTFOUND, "%s: not part of a delivery set", id);
    return OBX_OK;
}

static obx_err pg_delivery_stats(obx__store *base, int64_t *sets, int64_t *complete) {
    pg_store *s = (pg_store *)base;
    PGresult *r = NULL;
    obx_err e = run(s, Q_DSTATS, NULL, PGRES_TUPLES_OK, &r, "delivery statistics");
    if (e) return e;
    *sets = gi(r, 0, 0);
    *complete = gi(r, 0, 1);
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_receipt_details(obx__store *base, const char *event_id, obx__receipt_kind kind,
                                  char ***out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, event_id);
    p_text(&p, obx__receipt_kind_name(kind));
    PGresult *r = NULL;
    obx_err e = run(s, Q_RCPT_DETAIL, &p, PGRES_TUPLES_OK, &r, "receipt details");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "receipt details: out of memory");
        for (int i = 0; !e && i < rows; i++) {
            if (!((*out)[i] = obx__strdup(PQgetvalue(r, i, 0))))
                e = obx__fail(OBX_ENOMEM, "receipt details: out of memory");
            else
                (*n)++;
        }
    }
    PQclear(r);
    if (e) {
        for (size_t i = 0; i < *n; i++) free((*out)[i]);
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

static obx_err pg_set_alias(obx__store *base, const char *const *ids, size_t n, const char *from,
                            const char *to, bool *applied) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    ARR_TEXT(&p, n, ids[i]);
    p_text(&p, from);
    p_text(&p, to);
    PGresult *r = NULL;
    obx_err e = run(s, Q_SET_ALIAS, &p, PGRES_TUPLES_OK, &r, "set alias");
    p_free(&p);
    if (e) return e;
    for (size_t i = 0; i < n; i++) applied[i] = false;
    for (int i = 0; i < PQntuples(r); i++) {
        long ord = (long)gi(r, i, 0);
        if (ord >= 1 && (size_t)ord <= n) applied[ord - 1] = true;
    }
    PQclear(r);
    return OBX_OK;
}

static obx_err pg_receipts_by_kind(obx__store *base, obx__receipt_kind kind, size_t limit,
                                   obx__receipt_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    if ((unsigned)kind > OBX__RK_MIGRATION) return obx__fail(OBX_EINVAL, "receipt kind %d", kind);
    bool sparse = kind == OBX__RK_QUARANTINED || kind == OBX__RK_MIGRATION;
    params p;
    p_init(&p);
    p_text(&p, obx__receipt_kind_name(kind));
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = run(s, sparse ? Q_RCPT_KIND_SPARSE : Q_RCPT_KIND_ANY, &p, PGRES_TUPLES_OK, &r,
                    "receipts by kind");
    if (e) return e;
    e = read_receipts(r, "receipts by kind", out, n);
    PQclear(r);
    return e;
}

static obx_err pg_recent_published(obx__store *base, size_t limit, obx__published_ref **out,
                                   size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = run(s, Q_RECENT_PUB, &p, PGRES_TUPLES_OK, &r, "recent published");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "recent published: out of memory");
    for (int i = 0; !e && i < rows; i++) {
        GT(r, i, 0, (*out)[i].event_id);
        GT(r, i, 1, (*out)[i].topic);
        (*out)[i].published_at = gi(r, i, 2);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

static obx_err pg_consume_audit_list(obx__store *base, const char *consumer, const char *event_id,
                                     int64_t after_id, size_t limit, obx__consume_audit_row **out,
                                     size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_int(&p, after_id);
    p_int(&p, (int64_t)limit);
    int q = after_id < 0 ? Q_CAUDIT_NEWEST : event_id ? Q_CAUDIT_EVENT : Q_CAUDIT_AFTER;
    PGresult *r = NULL;
    obx_err e = run(s, q, &p, PGRES_TUPLES_OK, &r, "consume audit");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "consume audit: out of memory");
    for (int i = 0; !e && i < rows; i++) {
        obx__consume_audit_row *a = &(*out)[i];
        a->id = gi(r, i, 0);
        a->at = gi(r, i, 1);
        GT(r, i, 2, a->consumer_id);
        GT(r, i, 3, a->event_id);
        GT(r, i, 4, a->outcome);
        a->duration_us = gi(r, i, 5);
        GT(r, i, 6, a->detail);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

static const obx__event_readers pg_readers = {
    .ids = read_ids,
    .claim = read_claim,
    .select = read_select,
    .filter = read_filter,
    .retention = read_retention,
    .correlation = read_correlation,
};

static obx_err pg_read_events(obx__store *base, const obx__read_req *req, obx__rows *out) {
    return obx__read_events(base, req, &pg_readers, out);
}

static const obx__store_inbox_methods pg_inbox_methods = {
    .version = OBX__STORE_INBOX_VERSION,
    .inbox_get = pg_inbox_get,
    .inbox_put = pg_inbox_put,
    .inbox_finish = pg_inbox_finish,
    .inbox_has = pg_inbox_has,
    .watermark_put = pg_watermark_put,
    .watermark_list = pg_watermark_list,
    .failure_bump = pg_failure_bump,
    .failure_get = pg_failure_get,
    .failure_clear = pg_failure_clear,
    .poison_put = pg_poison_put,
    .poison_list = pg_poison_list,
    .poison_get = pg_poison_get,
    .poison_set_state = pg_poison_set_state,
    .inbox_quarantine_put = pg_inbox_quarantine_put,
    .consume_audit_put = pg_consume_audit_put,
    .consume_audit_list = pg_consume_audit_list,
};

static const obx__store_read_methods pg_read_methods = {
    .version = OBX__STORE_READ_VERSION,
    .counter_get = pg_counter_get,
    .stats = pg_stats,
    .invariants = pg_invariants,
    .unknown_resolutions = pg_unknown_resolutions,
    .delivery_open = pg_delivery_open,
    .unserved = pg_unserved,
    .aged = pg_aged,
    .delivery_stats = pg_delivery_stats,
    .receipt_details = pg_receipt_details,
    .receipts_by_kind = pg_receipts_by_kind,
    .recent_published = pg_recent_published,
    .envelope_at = pg_envelope_at,
};

const obx__store_methods obx__pg_store_methods = {
    .version = OBX__STORE_METHODS_VERSION,
    .name = "postgres",
    .open = pg_open,
    .wrap = pg_wrap,
    .close = pg_close,
    .schema_version = pg_schema_version,
    .migrate = pg_migrate,
    .begin = pg_begin,
    .commit = pg_commit,
    .rollback = pg_rollback,
    .route_put = pg_route_put,
    .route_get = pg_route_get,
    .route_list = pg_route_list,
    .idem_lookup = pg_idem_lookup,
    .insert_event = pg_insert_event,
    .insert_envelope = pg_insert_envelope,
    .read_events = pg_read_events,
    .update_events = pg_update_events,
    .insert_attempts = pg_insert_attempts,
    .update_attempts = pg_update_attempts,
    .load_attempts = pg_load_attempts,
    .insert_receipts = pg_insert_receipts,
    .load_receipts = pg_load_receipts,
    .insert_audit = pg_insert_audit,
    .load_audit = pg_load_audit,
    .counter_add = pg_counter_add,
    .wait_for_work = pg_wait_for_work,
    .write_set = pg_write_set,
    .load_slots = pg_load_slots,
    .cluster_put = pg_cluster_put,
    .cluster_get = pg_cluster_get,
    .series_put = pg_series_put,
    .series_list = pg_series_list,
    .serve_dispatch = pg_serve_dispatch,
    .create_roles = pg_create_roles,
    .producer_body = pg_producer_body,
    .schema_hold = pg_schema_hold,
    .server_ms = pg_server_ms,
    .route_get_txid = pg_route_get_txid,
    .insert_event_audit = pg_insert_event_audit,
    .enqueue_write = pg_enqueue_write,
    .purge_payloads = pg_purge_payloads,
    .route_set_put = pg_route_set_put,
    .route_set_get = pg_route_set_get,
    .delivery_put = pg_delivery_put,
    .delivery_get = pg_delivery_get,
    .set_alias = pg_set_alias,
    .inbox = &pg_inbox_methods,
    .read = &pg_read_methods,
};

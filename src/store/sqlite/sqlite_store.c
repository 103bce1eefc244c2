/*
 * sqlite_store.c — the SQLite outbox store (the embedded default, and the simulator's store).
 *
 * Owns: one sqlite3 connection (opened here, or borrowed from a producer/consumer with
 * obx_store_wrap_sqlite), its prepared statements (prepared once, kept for the connection's
 * life), and the nesting of obx transactions on it. This file holds the statement text, errors,
 * open and close, the schema, transactions, routes, the producer's writes, reading events, the
 * relay's writes and the method tables; sqlite_ops.c and sqlite_inbox.c hold the other methods
 * (sq_int.h, what they share).
 *
 * Contracts:
 *   - Own connections run in WAL mode with a busy timeout; an outermost obx transaction is
 *     BEGIN IMMEDIATE, so SQLite's single writer is the lock that makes claims exclusive.
 *   - On a borrowed connection obx never changes pragmas and never commits the caller's
 *     transaction: inside one it only uses savepoints.
 *   - Constraint failures raised by the frozen-data triggers map to OBX_EIMMUTABLE, unique
 *     violations to OBX_ECONFLICT, SQLITE_BUSY/LOCKED to OBX_EBUSY.
 */
#include "store/sqlite/sq_int.h"

#include <errno.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

extern const char obx__sqlite_schema[];

/* Migrations by target version: index v holds the script that takes a database from v-1 to v
 * (1: the baseline, schema.sql). */
static const char *const migrations[] = {NULL, obx__sqlite_schema};
_Static_assert(sizeof migrations / sizeof *migrations == OBX__SCHEMA_VERSION + 1,
               "one script per schema version");

#define EVENT_COLS OBX__EVENT_COLS /* shared.h */
#define EVENT_NCOLS OBX__EVENT_NCOLS
/* A delivery-set slot carries its logical event ID and target number (docs/migration.md). */
#define EVENT_FROM                                                                                 \
    " FROM obx_event e JOIN obx_envelope v ON v.event_id = e.event_id AND "                        \
    "v.envelope_gen = e.envelope_gen LEFT JOIN obx_delivery_target t ON t.slot_id = e.event_id "
#define ROUTE_COLS                                                                                 \
    "gen, event_type, cluster, topic, routing_key, algorithm, serializer, durability, "            \
    "required_acks, max_attempts, blind_retry, unordered, alias, created_at, "                     \
    "coalesce((SELECT s.targets FROM obx_route_set s WHERE s.route_gen = obx_route.gen), 0), "     \
    "encrypt_key"
/* "p is not yet published", written as the predicate of obx_event_unpublished term for term (the
 * planner uses a partial index only when the query repeats its predicate; an IN list of seven
 * states would also build an ephemeral table on every execution) */
/* not yet published and not final (CANCELLED never will be): obx_event_unpublished's predicate */
#define P_UNPUBLISHED                                                                              \
    "p.state <> 'PUBLISHED' AND p.state <> 'RETAINED' AND p.state <> 'PURGED' AND "                \
    "p.state <> 'CANCELLED'"
#define E_UNPUBLISHED                                                                              \
    "e.state <> 'PUBLISHED' AND e.state <> 'RETAINED' AND e.state <> 'PURGED' AND "                \
    "e.state <> 'CANCELLED'"

#define RCPT_COLS                                                                                  \
    "event_id, envelope_gen, attempt_id, kind, cluster, topic, partition, \"offset\", "            \
    "broker_ts, payload_digest, dest_digest, reason, created_at, source"
#define CAUDIT_COLS "audit_id, at, consumer_id, event_id, outcome, duration_us, detail"

static const char *const sql_text[Q_COUNT] = {
    [Q_ROUTE_PUT] = "INSERT INTO obx_route (event_type, cluster, topic, routing_key, algorithm, "
                    "serializer, durability, required_acks, max_attempts, blind_retry, unordered, "
                    "alias, created_at, encrypt_key) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_ROUTE_GET] = "SELECT " ROUTE_COLS " FROM obx_route WHERE event_type = ? ORDER BY gen DESC "
                    "LIMIT 1",
    [Q_ROUTE_LIST_CUR] = "SELECT " ROUTE_COLS " FROM obx_route WHERE gen = (SELECT max(r.gen) "
                         "FROM obx_route r WHERE r.event_type = obx_route.event_type) "
                         "ORDER BY event_type",
    [Q_ROUTE_LIST_ALL] = "SELECT " ROUTE_COLS " FROM obx_route ORDER BY event_type, gen",
    [Q_IDEM] = "SELECT event_id FROM obx_event WHERE tenant = ? AND idempotency_key = ?",
    [Q_INS_ENV] =
        "INSERT INTO obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id, "
        "aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at, "
        "created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
        "envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm, "
        "dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload, "
        "payload_len, created_at, not_before) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_INS_EVENT] =
        "INSERT INTO obx_event (event_id, tenant, idempotency_key, event_type, correlation_id, "
        "order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen, attempt_id, "
        "pinned_partition, rejections, available_at, next_check_at, unknown_since, "
        "primary_attempt_id, published_at, committed_at, updated_at, max_attempts, blind_retry, "
        "unordered, alias, dest_cluster) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_CLAIM] =
        /* INDEXED BY: the due claimable rows in (available_at, seq) order, LIMIT or the first
         * row not yet due stops the scan (a delayed backlog is never read: pg_sql.c's Q_CLAIM
         * says why available_at <= ?1 holds for a CLAIMED row whose lease expired); without it
         * the planner picked obx_event_state_pub and sorted the whole backlog on every claim */
    /* ?5: a payload over the relay's ceiling is not read (length() of a blob reads its size,
     * not its bytes) */
    "SELECT " EVENT_COLS ", CASE WHEN length(v.payload) <= ?5 THEN v.payload END "
    "FROM obx_event e INDEXED BY obx_event_claimable "
    "JOIN obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen "
    "LEFT JOIN obx_delivery_target t ON t.slot_id = e.event_id "
    "WHERE e.state IN ('PENDING','CLAIMED') AND e.available_at <= ?1 "
    "AND (e.state = 'PENDING' OR e.lease_until <= ?1) "
    "AND (?2 IS NULL OR e.dest_cluster = ?2) "
    "AND (?4 IS NULL OR instr(?4, ',' || e.alias || ',') > 0) "
    "AND (e.unordered = 1 OR NOT EXISTS (SELECT 1 FROM obx_event p INDEXED BY "
    "     obx_event_unpublished WHERE p.order_key = e.order_key AND p.seq < e.seq "
    "AND " P_UNPUBLISHED ")) ORDER BY e.available_at, e.seq LIMIT ?3",
    [Q_SEL_EXPIRED] =
        "SELECT " EVENT_COLS EVENT_FROM "WHERE e.state = 'SENDING' AND e.lease_until <= ?1 "
        "AND (?2 IS NULL OR e.dest_cluster = ?2) ORDER BY e.lease_until, e.seq LIMIT ?3",
    /* INDEXED BY, its predicate repeated: obx_event_unknown is in seq order, so the walk stops at
     * the batch; an OR of the states over other indexes (MULTI-INDEX OR) built two temporary
     * b-trees on every call (the IN list's and the sort's), a twentieth of a simulated trace */
    [Q_SEL_RECONCILE] =
        "SELECT " EVENT_COLS " FROM obx_event e INDEXED BY obx_event_unknown "
        "JOIN obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen "
        "LEFT JOIN obx_delivery_target t ON t.slot_id = e.event_id "
        "WHERE (e.state = 'DISPATCH_UNKNOWN' OR e.state = 'RECONCILING' OR "
        "e.state = 'RETRY_CLAIMED') AND CASE WHEN e.state = 'DISPATCH_UNKNOWN' THEN "
        "e.next_check_at ELSE e.lease_until END <= ?1 "
        "AND (?2 IS NULL OR e.dest_cluster = ?2) ORDER BY e.seq LIMIT ?3",
/* INDEXED BY: with ORDER BY seq LIMIT, SQLite otherwise scans the whole table in seq
 * order looking for a rare state (PARKED, UNKNOWN) at its end (seconds at 1M events). One
 * statement per state, the state a literal: a bound state compared with the constants of
 * obx_event_inflight's predicate makes SQLite re-prepare the statement on every bind. */
#define SEL_STATE(n, name)                                                                         \
    [Q_SEL_STATE + OBX__ST_##                                                                      \
        n] = "SELECT " EVENT_COLS " FROM obx_event e INDEXED BY obx_event_state_pub "              \
             "JOIN obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = "                \
             "e.envelope_gen LEFT JOIN obx_delivery_target t ON t.slot_id = e.event_id "           \
             "WHERE e.state = '" name "' AND (?2 IS NULL OR e.dest_cluster = ?2) "                 \
             "ORDER BY e.seq LIMIT ?3",                                                            \
      [Q_SEL_PUBBEFORE + OBX__ST_##n] =                                                            \
          "SELECT " EVENT_COLS EVENT_FROM "WHERE e.state = '" name "' AND e.published_at <= ?1 "   \
          "AND (?2 IS NULL OR e.dest_cluster = ?2) ORDER BY e.published_at, e.seq LIMIT ?3",
    OBX__STATE_LIST(SEL_STATE)
#undef SEL_STATE
        [Q_LOAD] = "SELECT " EVENT_COLS EVENT_FROM "WHERE e.event_id = ?",
    [Q_LOAD_PAYLOAD] = "SELECT " EVENT_COLS ", v.payload" EVENT_FROM "WHERE e.event_id = ?",
    /* every column (an update whose caller does not say which are unchanged); update_stmt
     * builds the others, with the same parameters */
    [Q_UPD_EVENT] =
        "UPDATE obx_event SET envelope_gen = ?4, state = ?5, claim_gen = ?6, owner = ?7, "
        "lease_until = ?8, attempt_gen = ?9, attempt_id = ?10, pinned_partition = ?11, "
        "rejections = ?12, available_at = ?13, next_check_at = ?14, unknown_since = ?15, "
        "primary_attempt_id = ?16, published_at = ?17, updated_at = ?18, order_key = ?19, "
        "dest_cluster = ?20, held_at = ?21 WHERE event_id = ?1 AND state = ?2 AND claim_gen = ?3",
    [Q_INS_ATT] = "INSERT INTO obx_attempt (attempt_id, event_id, envelope_gen, attempt_gen, "
                  "claim_gen, owner, dest_digest, partition, state, started_at, unknown_at, "
                  "ended_at, offset_before, quiet_until, detail) "
                  "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_UPD_ATT] = "UPDATE obx_attempt SET partition = ?, state = ?, unknown_at = ?, ended_at = ?, "
                  "offset_before = ?, quiet_until = ?, detail = ? WHERE attempt_id = ?",
    [Q_LOAD_ATT] = "SELECT attempt_id, event_id, envelope_gen, attempt_gen, claim_gen, owner, "
                   "dest_digest, partition, state, started_at, unknown_at, ended_at, "
                   "offset_before, quiet_until, detail FROM obx_attempt WHERE attempt_id = ?",
    [Q_LOAD_ATT_EVENT] = "SELECT attempt_id, event_id, envelope_gen, attempt_gen, claim_gen, "
                         "owner, dest_digest, partition, state, started_at, unknown_at, "
                         "ended_at, offset_before, quiet_until, detail FROM obx_attempt "
                         "WHERE event_id = ? ORDER BY started_at, attempt_gen, attempt_id",
    [Q_INS_RCPT] = "INSERT INTO obx_receipt (event_id, envelope_gen, attempt_id, kind, cluster, "
                   "topic, partition, \"offset\", broker_ts, payload_digest, dest_digest, reason, "
                   "detail, created_at, source) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_LOAD_RCPT] = "SELECT " RCPT_COLS " FROM obx_receipt WHERE event_id = ? ORDER BY receipt_id",
    [Q_INS_AUDIT] = "INSERT INTO obx_audit (at, actor, who, event_id, envelope_gen, from_state, "
                    "to_state, claim_gen, attempt_id, attempt_gen, reason) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    [Q_LOAD_AUDIT] = "SELECT at, actor, who, event_id, envelope_gen, from_state, to_state, "
                     "claim_gen, attempt_id, attempt_gen, reason FROM obx_audit "
                     "WHERE event_id = ? ORDER BY audit_id",
    [Q_COUNTER_ADD] = "INSERT INTO obx_counter (name, value) VALUES (?1, ?2) "
                      "ON CONFLICT (name) DO UPDATE SET value = value + ?2",
    [Q_COUNTER_GET] = "SELECT value FROM obx_counter WHERE name = ?",
    [Q_CLUSTER_PUT] = "INSERT OR REPLACE INTO obx_cluster (cluster, backend, lookup, durability, "
                      "required_acks, serializer, relay, seen_at) VALUES (?,?,?,?,?,?,?,?)",
    [Q_CLUSTER_GET] = "SELECT cluster, backend, lookup, durability, required_acks, serializer, "
                      "relay, seen_at FROM obx_cluster WHERE cluster = ?",
    [Q_SERIES_PUT] = "INSERT INTO obx_series (slot, at, sample) VALUES (?,?,?) "
                     "ON CONFLICT (slot) DO NOTHING",
    [Q_SERIES_TRIM] = "DELETE FROM obx_series WHERE slot < ?",
    [Q_SERIES_LIST] = "SELECT slot, at, sample FROM obx_series WHERE slot >= ? ORDER BY slot "
                      "LIMIT ?",
    [Q_RELAY_CLUSTER_PUT] = "INSERT INTO obx_relay_cluster (relay, cluster, seen_at, live_until) "
                            "VALUES (?,?,?,?) ON CONFLICT (relay, cluster) DO UPDATE SET seen_at "
                            "= excluded.seen_at, live_until = excluded.live_until",
    [Q_ENV_AT] = "SELECT " OBX__ENVELOPE_AT_COLS " FROM obx_envelope WHERE event_id = ? AND "
                 "envelope_gen = ?",
    [Q_DOPEN] = "WITH u AS (SELECT t.event_id FROM obx_event e INDEXED BY obx_event_unpublished "
                "JOIN obx_delivery_target t ON t.slot_id = e.event_id WHERE " E_UNPUBLISHED "), "
                "s AS (SELECT x.event_id, d.completion, EXISTS (SELECT 1 FROM "
                "obx_delivery_target t2 JOIN obx_event p ON p.event_id = t2.slot_id WHERE "
                "t2.event_id = x.event_id AND p.state IN ('PUBLISHED','RETAINED','PURGED')) AS "
                "delivered_one FROM (SELECT DISTINCT event_id FROM u) x JOIN obx_delivery_set d "
                "ON d.event_id = x.event_id) "
                "SELECT (SELECT count(*) FROM s WHERE completion = 'all'), "
                "(SELECT count(*) FROM s WHERE completion = 'any' AND NOT delivered_one), "
                "(SELECT count(*) FROM u JOIN s ON s.event_id = u.event_id WHERE s.completion = "
                "'any' AND s.delivered_one)",
    [Q_STATS_STATE] = "SELECT state, count(*) FROM obx_event GROUP BY state",
    [Q_STATS_OLDEST] =
        "SELECT (SELECT min(committed_at) FROM obx_event WHERE state IN ('PENDING','CLAIMED') "
        "AND NOT " OBX__DELAYED_WAITING "), "
        "(SELECT min(unknown_since) FROM obx_event WHERE state IN ('DISPATCH_UNKNOWN', "
        "'RECONCILING','RETRY_CLAIMED') AND unknown_since > 0), "
        "(SELECT count(*) FROM obx_event WHERE held_at > 0), "
        "(SELECT min(held_at) FROM obx_event WHERE held_at > 0)",
    [Q_STATS_RCPT] = "SELECT kind, count(*) FROM obx_receipt GROUP BY kind UNION ALL SELECT "
                     "'ASSERTED', count(*) FROM obx_receipt WHERE source = 'asserted' AND kind = "
                     "'PRIMARY'",
    [Q_STATS_ATT] = "SELECT count(*) FROM obx_attempt a JOIN obx_event e ON e.event_id = "
                    "a.event_id WHERE a.state = 'UNKNOWN' AND e.primary_attempt_id = ''",
    [Q_STATS_INV] =
        "SELECT (SELECT count(*) FROM obx_event e WHERE e.state IN ('PUBLISHED','RETAINED',"
        "'PURGED') AND NOT EXISTS (SELECT 1 FROM obx_receipt r WHERE r.event_id = e.event_id AND "
        "r.envelope_gen = e.envelope_gen AND r.kind = 'PRIMARY')), "
        "(SELECT count(*) FROM obx_receipt r JOIN obx_event e ON e.event_id = r.event_id WHERE "
        "r.kind = 'PRIMARY' AND (e.state NOT IN ('PUBLISHED','RETAINED','PURGED') OR "
        "r.envelope_gen <> e.envelope_gen)), "
        "(SELECT count(*) FROM (SELECT 1 FROM obx_receipt WHERE kind = 'PRIMARY' GROUP BY "
        "event_id, envelope_gen HAVING count(*) > 1)), "
        "(SELECT count(*) FROM obx_event e WHERE e.state = 'CANCELLED' AND EXISTS (SELECT 1 FROM "
        "obx_attempt a WHERE a.event_id = e.event_id))",
    [Q_UNKNOWN_RES] = "SELECT e.published_at - min(a.unknown_at) FROM obx_event e JOIN "
                      "obx_attempt a ON a.event_id = e.event_id WHERE a.unknown_at > 0 AND "
                      "e.published_at > 0 GROUP BY e.event_id",
    [Q_FIND_CORR] = "SELECT " EVENT_COLS EVENT_FROM "WHERE e.correlation_id = ?1 AND "
                    "e.correlation_id <> '' ORDER BY e.seq LIMIT ?2",
    [Q_INBOX_GET] = "SELECT consumer_id, event_id, payload_digest, event_type, tenant, outcome, "
                    "result, topic, partition, \"offset\", consumed_at, duration_us, "
                    "envelope_gen, attempt_id, dest_digest FROM obx_inbox "
                    "WHERE consumer_id = ? AND event_id = ?",
    [Q_INBOX_PUT] = "INSERT INTO obx_inbox (consumer_id, event_id, payload_digest, event_type, "
                    "tenant, outcome, result, topic, partition, \"offset\", consumed_at, "
                    "duration_us, envelope_gen, attempt_id, dest_digest) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_INBOX_FINISH] = "UPDATE obx_inbox SET result = ?, duration_us = ? "
                       "WHERE consumer_id = ? AND event_id = ?",
    /* obx__inbox_key: ?3 '' matches on the ID alone */
    [Q_INBOX_HAS] =
        "SELECT 1 FROM obx_inbox i WHERE i.consumer_id = ?1 AND i.event_id = ?2 AND "
        "(?3 = '' OR (i.payload_digest = ?3 AND i.envelope_gen = ?4 AND ?4 > 0 AND "
        "(?5 = '' OR i.dest_digest = ?5) AND NOT EXISTS (SELECT 1 FROM obx_inbox_quarantine q "
        "WHERE q.consumer_id = ?1 AND q.event_id = ?2)))",
    [Q_WM_PUT] = "INSERT INTO obx_consumer_watermark (consumer_id, topic, partition, \"offset\", "
                 "event_id, occurred_at, committed_at) VALUES (?1,?2,?3,?4,?5,?6,?7) "
                 "ON CONFLICT (consumer_id, topic, partition) DO UPDATE SET "
                 "event_id = CASE WHEN ?4 >= \"offset\" THEN ?5 ELSE event_id END, "
                 "occurred_at = CASE WHEN ?4 >= \"offset\" THEN ?6 ELSE occurred_at END, "
                 "\"offset\" = max(\"offset\", ?4), committed_at = ?7",
    [Q_WM_LIST] = "SELECT consumer_id, topic, partition, \"offset\", event_id, occurred_at, "
                  "committed_at FROM obx_consumer_watermark WHERE consumer_id = ? "
                  "ORDER BY topic, partition",
    [Q_WM_LIST_ALL] = "SELECT consumer_id, topic, partition, \"offset\", event_id, occurred_at, "
                      "committed_at FROM obx_consumer_watermark "
                      "ORDER BY consumer_id, topic, partition",
    [Q_FAIL_BUMP] = "INSERT INTO obx_inbox_failure (consumer_id, event_id, failures, last_error, "
                    "first_at, last_at, next_at) VALUES (?1, ?2, 1, ?3, ?4, ?4, ?5) "
                    "ON CONFLICT (consumer_id, event_id) DO UPDATE SET failures = failures + 1, "
                    "last_error = ?3, last_at = ?4, next_at = ?5 RETURNING failures",
    [Q_FAIL_GET] = "SELECT failures, next_at FROM obx_inbox_failure f WHERE consumer_id = ?1 "
                   "AND (?2 IS NULL OR event_id = ?2) AND (?2 IS NOT NULL OR NOT EXISTS (SELECT "
                   "1 FROM obx_poison p WHERE p.consumer_id = f.consumer_id AND p.event_id = "
                   "f.event_id AND p.state = 'PARKED')) ORDER BY next_at LIMIT 1",
    [Q_FAIL_GET_ID] = "SELECT failures, next_at FROM obx_inbox_failure WHERE consumer_id = ?1 "
                      "AND event_id = ?2",
    [Q_FAIL_CLEAR] = "DELETE FROM obx_inbox_failure WHERE consumer_id = ? AND event_id = ?",
    [Q_RETRY_PUT] = "INSERT INTO obx_inbox_retry (consumer_id, event_id, payload_digest, topic, "
                    "partition, \"offset\", headers, payload, kept_at) VALUES (?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT DO NOTHING",
    [Q_RETRY_LIST] = "SELECT r.consumer_id, r.event_id, r.payload_digest, r.topic, r.partition, "
                     "r.\"offset\", r.headers, r.payload, r.kept_at, coalesce(f.next_at, 0) AS due "
                     "FROM obx_inbox_retry r LEFT JOIN obx_inbox_failure f ON f.consumer_id = "
                     "r.consumer_id AND f.event_id = r.event_id WHERE r.consumer_id = ?1 AND "
                     "coalesce(f.next_at, 0) <= ?2 ORDER BY due, r.kept_at LIMIT ?3",
    [Q_RETRY_DEL] = "DELETE FROM obx_inbox_retry WHERE consumer_id = ? AND event_id = ?",
    [Q_POISON_PUT] = "INSERT INTO obx_poison (consumer_id, event_id, state, failures, last_error, "
                     "topic, partition, \"offset\", headers, payload, parked_at, updated_at, "
                     "payload_digest) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13) "
                     "ON CONFLICT (consumer_id, event_id, payload_digest) DO UPDATE SET "
                     "state = ?3, failures = ?4, last_error = ?5, updated_at = ?12",
    [Q_POISON_LIST] = "SELECT consumer_id, event_id, state, failures, last_error, topic, "
                      "partition, \"offset\", headers, parked_at, updated_at, payload_digest "
                      "FROM obx_poison WHERE (?1 IS NULL OR consumer_id = ?1) AND "
                      "(?2 IS NULL OR state = ?2) ORDER BY parked_at, event_id, payload_digest",
    [Q_POISON_GET] = "SELECT consumer_id, event_id, state, failures, last_error, topic, "
                     "partition, \"offset\", headers, parked_at, updated_at, payload_digest, "
                     "payload FROM obx_poison WHERE consumer_id = ?1 AND event_id = ?2 AND "
                     "(?3 IS NULL OR payload_digest = ?3) "
                     "ORDER BY state = 'PARKED' DESC, updated_at DESC LIMIT 1",
    [Q_POISON_GET_COPY] = "SELECT consumer_id, event_id, state, failures, last_error, topic, "
                          "partition, \"offset\", headers, parked_at, updated_at, "
                          "payload_digest, payload FROM obx_poison WHERE consumer_id = ?1 AND "
                          "event_id = ?2 AND payload_digest = ?3",
    [Q_POISON_STATE] = "UPDATE obx_poison SET state = ?, updated_at = ? WHERE consumer_id = ? AND "
                       "event_id = ?",
    [Q_INBOX_QUAR] = "INSERT INTO obx_inbox_quarantine (consumer_id, event_id, payload_digest, "
                     "first_digest, reason, at) VALUES (?,?,?,?,?,?)",
    [Q_CONSUME_AUDIT] = "INSERT INTO obx_consume_audit (at, consumer_id, event_id, outcome, "
                        "duration_us, detail) VALUES (?,?,?,?,?,?)",
/* publication order (published_at, seq) between two exclusive places; the plain bounds on
 * published_at let the planner range-scan obx_event_state_pub */
/* The state is a literal, not a parameter: a parameter compared with the constants of a
 * partial index's predicate (obx_event_inflight's state = '...') makes SQLite re-prepare
 * the statement whenever it is bound again (two thirds of `obx sim`'s time, callgrind) */
#define RET_CANDIDATES(state)                                                                      \
    "SELECT " EVENT_COLS EVENT_FROM "WHERE e.state = '" state "' AND e.published_at >= ?2 AND "    \
    "(e.published_at, e.seq) > (?2, ?3) AND e.published_at <= ?4 AND "                             \
    "(e.published_at, e.seq) < (?4, ?5) ORDER BY e.published_at, e.seq LIMIT ?6"
    [Q_RET_CANDIDATES_PUB] = RET_CANDIDATES("PUBLISHED"),
    [Q_RET_CANDIDATES_RET] = RET_CANDIDATES("RETAINED"),
    /* the generations first, then each one by its key: an UPDATE ... RETURNING over an event's
     * rows has two ephemeral tables in its program (its row set and RETURNING's rows) */
    [Q_PURGE_GENS] = "SELECT envelope_gen, payload_len FROM obx_envelope WHERE event_id = ?1 AND "
                     "payload IS NOT NULL ORDER BY envelope_gen LIMIT 8",
    [Q_PURGE_PAYLOAD] = "UPDATE obx_envelope SET payload = NULL WHERE event_id = ?1 AND "
                        "envelope_gen = ?2 AND payload IS NOT NULL",
#define AGED_LIST(cols, from_where, at, key)                                                       \
    "SELECT " cols " FROM " from_where " AND " at " <= ?1 AND (" at ", " key ") > (?2, ?3) "       \
    "ORDER BY " at ", " key " LIMIT ?4"
#define AGED_COUNT(from_where, at)                                                                 \
    "SELECT count(*), min(" at ") FROM " from_where " AND " at " <= ?1"
#define UNKNOWN_AT "(CASE WHEN unknown_since > 0 THEN unknown_since ELSE updated_at END)"
/* a PENDING event ages from when it became due: a delayed one from its time, not its commit */
#define PENDING_AT "max(committed_at, available_at)"
#define EV_AGED(at) "event_id, " at ", seq, state"
/* as pg_sql.c's: the event ID consumers see, and no trailing slot of a delivered any-set */
#define EV_AGED_WIRE(at)                                                                           \
    "coalesce((SELECT t.event_id FROM obx_delivery_target t WHERE t.slot_id = "                    \
    "obx_event.event_id), event_id), " at ", seq, state"
#define NOT_TRAILING                                                                               \
    " AND NOT EXISTS (SELECT 1 FROM obx_delivery_target t JOIN obx_delivery_set d ON d.event_id "  \
    "= t.event_id AND d.completion = 'any' JOIN obx_delivery_target t2 ON t2.event_id = "          \
    "t.event_id AND t2.slot_id <> t.slot_id JOIN obx_event p ON p.event_id = t2.slot_id AND "      \
    "p.state IN ('PUBLISHED', 'RETAINED', 'PURGED') WHERE t.slot_id = obx_event.event_id)"
#define PENDING_W "obx_event WHERE state IN ('PENDING','CLAIMED')" NOT_TRAILING
#define UNKNOWN_W                                                                                  \
    "obx_event WHERE state IN ('DISPATCH_UNKNOWN','RECONCILING','RETRY_CLAIMED')" NOT_TRAILING
#define PUBLISHED_W "obx_event WHERE state = 'PUBLISHED'"
#define PARKED_W "obx_event WHERE state = 'PARKED'"
#define QUAR_W "obx_receipt WHERE kind = 'QUARANTINED'"
#define IQUAR_W "obx_inbox_quarantine WHERE consumer_id = ?5"
#define ASSERTED_W "obx_receipt WHERE source = 'asserted' AND kind = 'PRIMARY'"
/* PENDING of a cluster without a live relay at ?5 (docs/operations.md, "Clusters nobody serves") */
#define UNSERVED_W                                                                                 \
    "obx_event WHERE state = 'PENDING' AND NOT EXISTS (SELECT 1 FROM obx_relay_cluster h WHERE "   \
    "h.cluster = obx_event.dest_cluster AND h.live_until >= ?5)"
    [Q_AGED_LIST + OBX__AGED_PENDING] =
        AGED_LIST(EV_AGED(PENDING_AT), PENDING_W, PENDING_AT, "seq"),
    [Q_AGED_LIST + OBX__AGED_UNKNOWN] =
        AGED_LIST(EV_AGED(UNKNOWN_AT), UNKNOWN_W, UNKNOWN_AT, "seq"),
    [Q_AGED_LIST + OBX__AGED_PUBLISHED] =
        AGED_LIST(EV_AGED_WIRE("published_at"), PUBLISHED_W, "published_at", "seq"),
    [Q_AGED_LIST + OBX__AGED_PARKED] =
        AGED_LIST(EV_AGED("updated_at"), PARKED_W, "updated_at", "seq"),
    [Q_AGED_LIST + OBX__AGED_QUARANTINED] =
        AGED_LIST("event_id, created_at, receipt_id, reason", QUAR_W, "created_at", "receipt_id"),
    [Q_AGED_LIST + OBX__AGED_INBOX_QUARANTINED] =
        AGED_LIST("event_id, at, quarantine_id, reason", IQUAR_W, "at", "quarantine_id"),
    [Q_AGED_LIST + OBX__AGED_UNSERVED] =
        AGED_LIST("event_id, committed_at, seq, 'cluster ' || dest_cluster",
                  UNSERVED_W NOT_TRAILING, "committed_at", "seq"),
    [Q_AGED_COUNT + OBX__AGED_PENDING] = AGED_COUNT(PENDING_W, PENDING_AT),
    [Q_AGED_COUNT + OBX__AGED_UNKNOWN] = AGED_COUNT(UNKNOWN_W, UNKNOWN_AT),
    [Q_AGED_COUNT + OBX__AGED_PUBLISHED] = AGED_COUNT(PUBLISHED_W, "published_at"),
    [Q_AGED_COUNT + OBX__AGED_PARKED] = AGED_COUNT(PARKED_W, "updated_at"),
    [Q_AGED_COUNT + OBX__AGED_QUARANTINED] = AGED_COUNT(QUAR_W, "created_at"),
    [Q_AGED_COUNT + OBX__AGED_INBOX_QUARANTINED] = AGED_COUNT(IQUAR_W, "at"),
    [Q_AGED_LIST + OBX__AGED_ASSERTED] = AGED_LIST("event_id, created_at, receipt_id, reason",
                                                   ASSERTED_W, "created_at", "receipt_id"),
    [Q_AGED_COUNT + OBX__AGED_ASSERTED] = AGED_COUNT(ASSERTED_W, "created_at"),
    [Q_AGED_COUNT + OBX__AGED_UNSERVED] = AGED_COUNT(UNSERVED_W NOT_TRAILING, "committed_at"),
    [Q_UNSERVED] = "SELECT dest_cluster, count(*), min(committed_at) FROM " UNSERVED_W
                   " GROUP BY dest_cluster ORDER BY dest_cluster",
#undef AGED_LIST
#undef AGED_COUNT
#undef UNKNOWN_AT
#undef PENDING_AT
#undef EV_AGED
#undef PENDING_W
#undef UNKNOWN_W
#undef PUBLISHED_W
#undef PARKED_W
#undef QUAR_W
#undef IQUAR_W
#undef ASSERTED_W
    [Q_FIND] = "SELECT " EVENT_COLS EVENT_FROM
               "WHERE (?1 IS NULL OR e.event_type = ?1) AND (?2 IS NULL OR v.dest_cluster = ?2) "
               "AND (?3 IS NULL OR v.dest_topic = ?3) "
               "AND (?4 IS NULL OR instr(?4, ',' || e.alias || ',') > 0) "
               "AND (?5 IS NULL OR instr(?5, ',' || e.state || ',') > 0) "
               "AND e.committed_at >= ?6 AND (?7 = 0 OR e.committed_at < ?7) AND e.seq > ?8 "
               "AND (?10 = 0 OR e.held_at > 0) "
               "AND (?11 = 0 OR (e.unknown_since > 0 AND e.unknown_since < ?11)) "
               "ORDER BY e.seq LIMIT ?9",
    [Q_RSET_PUT] = "INSERT INTO obx_route_set (route_gen, completion, targets) VALUES (?,?,?)",
    [Q_RTGT_PUT] = "INSERT INTO obx_route_target (route_gen, target_no, cluster, topic, "
                   "routing_key, algorithm, serializer, durability, required_acks) "
                   "VALUES (?,?,?,?,?,?,?,?,?)",
    [Q_RSET_GET] = "SELECT completion FROM obx_route_set WHERE route_gen = ?",
    [Q_RTGT_GET] = "SELECT target_no, cluster, topic, routing_key, algorithm, serializer, "
                   "durability, required_acks FROM obx_route_target WHERE route_gen = ? "
                   "ORDER BY target_no",
    [Q_DSET_PUT] = "INSERT INTO obx_delivery_set (event_id, completion, route_gen, created_at) "
                   "VALUES (?,?,?,?) ON CONFLICT (event_id) DO NOTHING",
    [Q_DTGT_PUT] = "INSERT INTO obx_delivery_target (slot_id, event_id, target_no, origin, "
                   "created_at) VALUES (?,?,?,?,?)",
    [Q_DGET] = "SELECT d.event_id, d.completion, d.route_gen, d.created_at, t.target_no, "
               "t.slot_id, t.origin, t.created_at FROM obx_delivery_set d JOIN "
               "obx_delivery_target t ON t.event_id = d.event_id WHERE d.event_id = "
               "coalesce((SELECT x.event_id FROM obx_delivery_target x WHERE x.slot_id = ?1), ?1) "
               "ORDER BY t.target_no",
    [Q_DSTATS] = "SELECT count(*), coalesce(sum(CASE WHEN (d.completion = 'all' AND x.pub = x.n) "
                 "OR (d.completion = 'any' AND x.pub > 0) THEN 1 ELSE 0 END), 0) FROM "
                 "obx_delivery_set d JOIN (SELECT t.event_id, count(*) AS n, sum(CASE WHEN "
                 "e.state IN ('PUBLISHED','RETAINED','PURGED') THEN 1 ELSE 0 END) AS pub FROM "
                 "obx_delivery_target t JOIN obx_event e ON e.event_id = t.slot_id GROUP BY "
                 "t.event_id) x ON x.event_id = d.event_id",
    [Q_RCPT_DETAIL] = "SELECT coalesce(detail, '') FROM obx_receipt WHERE event_id = ? AND "
                      "kind = ? ORDER BY receipt_id",
    [Q_SET_ALIAS] = "UPDATE obx_event SET alias = ?3 WHERE event_id = ?1 AND alias = ?2 AND "
                    "state IN ('PENDING', 'PARKED')",
    /* The literal IN list lets SQLite use the partial index obx_receipt_kind (a bound kind
     * alone does not imply the index's WHERE clause). */
    [Q_RCPT_KIND_SPARSE] = "SELECT " RCPT_COLS " FROM obx_receipt INDEXED BY obx_receipt_kind "
                           "WHERE kind = ?1 AND kind IN ('QUARANTINED','MIGRATION') ORDER BY "
                           "receipt_id DESC LIMIT ?2",
    [Q_RCPT_KIND_ANY] = "SELECT " RCPT_COLS " FROM obx_receipt WHERE kind = ?1 "
                        "ORDER BY receipt_id DESC LIMIT ?2",
    [Q_RECENT_PUB] = "SELECT e.event_id, v.dest_topic, e.published_at FROM obx_event e JOIN "
                     "obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = "
                     "e.envelope_gen WHERE e.state = 'PUBLISHED' ORDER BY e.published_at DESC "
                     "LIMIT ?1",
    [Q_CAUDIT_EVENT] = "SELECT " CAUDIT_COLS " FROM obx_consume_audit WHERE event_id = ?2 AND "
                       "(?1 IS NULL OR consumer_id = ?1) AND audit_id > ?3 ORDER BY audit_id "
                       "LIMIT ?4",
    [Q_CAUDIT_AFTER] = "SELECT " CAUDIT_COLS " FROM obx_consume_audit WHERE audit_id > ?3 AND "
                       "(?1 IS NULL OR consumer_id = ?1) ORDER BY audit_id LIMIT ?4",
    [Q_CAUDIT_NEWEST] = "SELECT " CAUDIT_COLS " FROM obx_consume_audit WHERE (?2 IS NULL OR "
                        "event_id = ?2) AND (?1 IS NULL OR consumer_id = ?1) ORDER BY audit_id "
                        "DESC LIMIT ?4",
};

/* ---- errors ------------------------------------------------------------------------------- */

obx_err obx__sq_map_rc(sq_store *s, int rc, const char *what) {
    const char *msg = s->db ? sqlite3_errmsg(s->db) : sqlite3_errstr(rc);
    int ext = s->db ? sqlite3_extended_errcode(s->db) : rc;
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return obx__fail(OBX_EBUSY, "sqlite: %s (%s)", msg, what);
    case SQLITE_NOMEM: return obx__fail(OBX_ENOMEM, "sqlite: out of memory (%s)", what);
    case SQLITE_IOERR:
    case SQLITE_FULL: return obx__fail(OBX_EIO, "sqlite: %s (%s)", msg, what);
    case SQLITE_CONSTRAINT:
        if (ext == SQLITE_CONSTRAINT_TRIGGER || strstr(msg, "obx: "))
            return obx__fail(OBX_EIMMUTABLE, "%s (%s)", msg, what);
        if (ext == SQLITE_CONSTRAINT_UNIQUE || ext == SQLITE_CONSTRAINT_PRIMARYKEY)
            return obx__fail(OBX_ECONFLICT, "sqlite: %s (%s)", msg, what);
        return obx__fail(OBX_ESTORE, "sqlite: %s (%s)", msg, what);
    default: return obx__fail(OBX_ESTORE, "sqlite: %s (%s)", msg, what);
    }
}

static obx_err exec(sq_store *s, const char *sql) {
    char *err = NULL;
    int rc = sqlite3_exec(s->db, sql, NULL, NULL, &err);
    if (rc != SQLITE_OK) {
        obx_err e = obx__sq_map_rc(s, rc, sql);
        if (err && e == OBX_ESTORE) obx__fail(e, "sqlite: %s (%s)", err, sql);
        sqlite3_free(err);
        return e;
    }
    return OBX_OK;
}

obx_err obx__sq_stmt(sq_store *s, int id, sqlite3_stmt **out) {
    if (!s->q[id]) {
        int rc =
            sqlite3_prepare_v3(s->db, sql_text[id], -1, SQLITE_PREPARE_PERSISTENT, &s->q[id], NULL);
        if (rc != SQLITE_OK) return obx__sq_map_rc(s, rc, "prepare");
    } else {
        sqlite3_reset(s->q[id]);
        sqlite3_clear_bindings(s->q[id]);
    }
    *out = s->q[id];
    return OBX_OK;
}

/* Runs a statement that returns no rows. */
obx_err obx__sq_step_done(sq_store *s, sqlite3_stmt *st, const char *what) {
    int rc = sqlite3_step(st);
    obx_err e = OBX_OK;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) e = obx__sq_map_rc(s, rc, what);
    sqlite3_reset(st);
    return e;
}

/* ---- open / close / schema --------------------------------------------------------------- */

static void sq_close(obx__store *base) {
    sq_store *s = (sq_store *)base;
    if (!s) return;
    for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(s->q[i]);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 3; j++) sqlite3_finalize(s->sp[i][j]);
    for (int i = 0; i < 3; i++) sqlite3_finalize(s->tx_st[i]);
    for (int i = 0; i < SQ_UPD_SLOTS; i++) sqlite3_finalize(s->upd[i].st);
    for (int i = 0; i < SQ_AUDIT_ROWS - 1; i++) sqlite3_finalize(s->audit_n[i]);
    if (s->owned) sqlite3_close_v2(s->db);
    free(s);
}

static obx_err sq_new(sqlite3 *db, bool owned, obx__store **out) {
    sq_store *s = calloc(1, sizeof *s);
    if (!s) return obx__fail(OBX_ENOMEM, "sqlite store: out of memory");
    s->base.m = &obx__sqlite_store_methods;
    s->db = db;
    s->owned = owned;
    *out = &s->base;
    return OBX_OK;
}

/* SQLite's write lock is a try-lock with no queue. The default busy handler backs off to
 * 100 ms sleeps, so a relay waiting behind a busy producer (thousands of short write
 * transactions per second) almost never sees the lock free and starves. Polling every
 * 0.5-1.5 ms (jittered, so that several waiters do not poll in step) keeps waiters in the race
 * at a negligible cost. Gives up after OBX__SQLITE_BUSY_MS. */
#define OBX__SQLITE_BUSY_MS 10000
static int busy_poll(void *arg, int count) {
    sq_store *s = arg;
    int64_t now = obx__mono_ms();
    if (count == 0) s->busy_since = now;
    if (now - s->busy_since >= OBX__SQLITE_BUSY_MS) return 0;
    s->busy_rng = s->busy_rng * 6364136223846793005ull + 1442695040888963407ull;
    struct timespec ts = {0, 500000 + (long)((s->busy_rng >> 33) % 1000000)};
    nanosleep(&ts, NULL);
    return 1;
}

/* "file:PATH?immutable=1" with PATH percent-encoded where a URI needs it (out: cap bytes). */
static void immutable_uri(const char *path, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "file:");
    for (const unsigned char *p = (const unsigned char *)path; *p && o + 4 < cap; p++)
        if (*p == '%' || *p == '?' || *p == '#' || *p < 0x21 || *p > 0x7e)
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", *p);
        else
            out[o++] = (char)*p;
    snprintf(out + o, cap - o, "?immutable=1");
}

/* A read-only handle (OBX_STORE_READ_ONLY) on an existing file, never created, also when the
 * user may not write it. A WAL database is read through its -shm and -wal files, which SQLite
 * (3.22 and later) reads without write permission when they exist, or creates when the folder
 * is writable; when neither is true (a clean WAL database, its files removed at its last close,
 * in a folder only its owner writes), it is opened immutable: no -wal file means no writer is
 * in the middle of a transaction, and a writer could not start one without creating it. */
static obx_err sq_open_ro(const obx__url *u, sqlite3 **out) {
    struct stat st;
    if (stat(u->path, &st)) {
        if (errno == ENOENT || errno == ENOTDIR)
            return obx__fail(OBX_ENODB, "sqlite: no such database file: %s", u->path);
        return obx__fail(OBX_ESTORE, "sqlite: cannot open '%s': %s", u->path, strerror(errno));
    }
    if (access(u->path, R_OK))
        return obx__fail(OBX_ESTORE, "sqlite: cannot open '%s': %s", u->path, strerror(errno));
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(u->path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    /* a first read tells whether the WAL's files could be opened */
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
    char wal[1100];
    snprintf(wal, sizeof wal, "%s-wal", u->path);
    /* SQLITE_CANTOPEN or SQLITE_READONLY_*: the -shm file could be neither opened nor made */
    if (rc != SQLITE_OK && ((rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_READONLY) &&
        access(wal, F_OK)) {
        sqlite3_close_v2(db);
        db = NULL;
        char uri[3300];
        immutable_uri(u->path, uri, sizeof uri);
        rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI,
                             NULL);
    }
    if (rc != SQLITE_OK) {
        obx_err e = obx__fail(OBX_ESTORE, "sqlite: cannot read '%s': %s", u->path,
                              db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close_v2(db);
        return e;
    }
    *out = db;
    return OBX_OK;
}

static obx_err sq_open(const obx__url *u, obx__store **out) {
    sqlite3 *db = NULL;
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    bool mem = !strcmp(u->path, ":memory:");
    bool ro = u->read_only && !mem; /* an empty in-memory database is no one's outbox anyway */
    int rc = SQLITE_OK;
    if (ro) {
        obx_err e = sq_open_ro(u, &db);
        if (e) return e;
    } else
        rc = sqlite3_open_v2(u->path, &db, flags, NULL);
    if (rc != SQLITE_OK) {
        obx_err e = obx__fail(OBX_ESTORE, "sqlite: cannot open '%s': %s", u->path,
                              db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close_v2(db);
        return e;
    }
    sqlite3_extended_result_codes(db, 1);
    obx_err e = sq_new(db, true, out);
    if (e) {
        sqlite3_close_v2(db);
        return e;
    }
    sq_store *s = (sq_store *)*out;
    s->read_only = ro;
    s->busy_rng = (uint64_t)(uintptr_t)s ^ (uint64_t)obx__mono_ms();
    sqlite3_busy_handler(db, busy_poll, s);
    const char *sync = strstr(u->query, "synchronous=full") ? "FULL" : "NORMAL";
    char pragmas[256];
    snprintf(pragmas, sizeof pragmas, "%sPRAGMA synchronous=%s; PRAGMA temp_store=MEMORY;",
             mem || ro ? "" : "PRAGMA journal_mode=WAL; ", sync);
    e = exec(s, pragmas);
    if (e) {
        sq_close(*out);
        *out = NULL;
        return obx__fail_prefix(e, "sqlite: cannot configure '%s'", u->path);
    }
    return OBX_OK;
}

static obx_err sq_wrap(void *conn, obx__store **out) {
    if (!conn) return obx__fail(OBX_EINVAL, "sqlite3_db: NULL");
    return sq_new((sqlite3 *)conn, false, out);
}

static obx_err sq_schema_version(obx__store *base, int *found) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st;
    *found = 0;
    int rc = sqlite3_prepare_v2(s->db, "SELECT value FROM obx_meta WHERE key = 'schema_version'",
                                -1, &st, NULL);
    if (rc != SQLITE_OK) {
        /* no obx_meta table: not initialized */
        sqlite3_finalize(st);
        if (strstr(sqlite3_errmsg(s->db), "no such table")) return OBX_OK;
        return obx__sq_map_rc(s, rc, "read schema version");
    }
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *found = (int)sqlite3_column_int64(st, 0);
    obx_err e =
        (rc == SQLITE_ROW || rc == SQLITE_DONE) ? OBX_OK : obx__sq_map_rc(s, rc, "schema version");
    sqlite3_finalize(st);
    return e;
}

static obx_err sq_begin(obx__store *base);
static obx_err sq_commit(obx__store *base);
static obx_err sq_rollback(obx__store *base);

/* the migration runner's statements (shared.c) */
static obx_err migrate_exec(obx__store *base, const char *sql) {
    return exec((sq_store *)base, sql);
}

static obx_err sq_migrate(obx__store *base) {
    obx_err e = sq_begin(base);
    if (e) return e;
    int from = 0;
    e = base->m->schema_version(base, &from);
    if (!e)
        e = obx__migrate_run(base, from, migrations, OBX__SCHEMA_VERSION, "obx_meta", migrate_exec);
    if (e) {
        sq_rollback(base);
        return e;
    }
    return sq_commit(base);
}

/* ---- transactions ------------------------------------------------------------------------- */

enum { SP_OPEN, SP_RELEASE, SP_ROLLBACK };

/* Runs the savepoint statement `kind` for nesting depth d (prepared once per depth). */
static obx_err savepoint(sq_store *s, int d, int kind) {
    char sql[96];
    if (d >= 8) { /* deeper than anything obx does: unprepared */
        snprintf(sql, sizeof sql,
                 kind == SP_OPEN      ? "SAVEPOINT obx_sp%d"
                 : kind == SP_RELEASE ? "RELEASE obx_sp%d"
                                      : "ROLLBACK TO obx_sp%d",
                 d);
        return exec(s, sql);
    }
    if (!s->sp[d][kind]) {
        snprintf(sql, sizeof sql,
                 kind == SP_OPEN      ? "SAVEPOINT obx_sp%d"
                 : kind == SP_RELEASE ? "RELEASE obx_sp%d"
                                      : "ROLLBACK TO obx_sp%d",
                 d);
        if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->sp[d][kind], NULL))
            return obx__sq_map_rc(s, sqlite3_errcode(s->db), sql);
    }
    return obx__sq_step_done(s, s->sp[d][kind], "savepoint");
}

enum { TX_BEGIN, TX_COMMIT, TX_ROLLBACK };

/* The outermost transaction's statement `which` (prepared once: parsing them for every
 * transaction cost the simulator about 1.5% of a trace). */
static obx_err tx(sq_store *s, int which) {
    /* a read-only handle reads in a deferred transaction (a consistent snapshot, no lock) */
    const char *const sql[] = {s->read_only ? "BEGIN" : "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK"};
    if (!s->tx_st[which] && sqlite3_prepare_v3(s->db, sql[which], -1, SQLITE_PREPARE_PERSISTENT,
                                               &s->tx_st[which], NULL))
        return obx__sq_map_rc(s, sqlite3_errcode(s->db), sql[which]);
    return obx__sq_step_done(s, s->tx_st[which], sql[which]);
}

/* The nesting is shared (obx__tx_begin, shared.c); these are SQLite's statements for it. */

static obx_err tx_in_tx(obx__store *base, bool *in_tx) {
    *in_tx = !sqlite3_get_autocommit(((sq_store *)base)->db);
    return OBX_OK;
}

static obx_err tx_begin(obx__store *base) { return tx((sq_store *)base, TX_BEGIN); }

static obx_err tx_commit(obx__store *base) {
    sq_store *s = (sq_store *)base;
    obx_err e = tx(s, TX_COMMIT);
    /* COMMIT failed (busy/IO): the transaction is still open; roll it back so the connection is
     * usable. The outcome is not applied. */
    if (e && !sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return e;
}

static obx_err tx_rollback(obx__store *base) {
    sq_store *s = (sq_store *)base;
    if (sqlite3_get_autocommit(s->db)) return OBX_OK; /* already rolled back by SQLite */
    return tx(s, TX_ROLLBACK);
}

static obx_err tx_savepoint(obx__store *base, int d, obx__sp_op op) {
    sq_store *s = (sq_store *)base;
    if (op == OBX__SP_OPEN) return savepoint(s, d, SP_OPEN);
    if (op == OBX__SP_RELEASE) return savepoint(s, d, SP_RELEASE);
    obx_err e = savepoint(s, d, SP_ROLLBACK);
    obx_err e2 = savepoint(s, d, SP_RELEASE);
    return e ? e : e2;
}

static const obx__tx_ops sq_tx = {tx_in_tx,     tx_begin, tx_commit, tx_rollback,
                                  tx_savepoint, NULL,     NULL};

OBX__TX_METHODS(sq, sq_store, sq_tx)

/* ---- routes ------------------------------------------------------------------------------- */

static void read_route(sqlite3_stmt *st, obx__route_row *r) { obx__route_decode(READER(st), r); }

static obx_err sq_route_put(obx__store *base, const obx__route_row *r, int64_t *gen) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_ROUTE_PUT, &st);
    if (e) return e;
    bt(st, 1, r->event_type);
    bt(st, 2, r->cluster);
    bt(st, 3, r->topic);
    bt(st, 4, r->routing_key);
    bt(st, 5, r->algorithm);
    bt(st, 6, r->serializer);
    bt(st, 7, r->durability);
    bt(st, 8, r->required_acks);
    bi(st, 9, r->max_attempts);
    bi(st, 10, r->blind_retry);
    bi(st, 11, r->unordered);
    bt(st, 12, r->alias);
    bi(st, 13, r->created_at);
    bt(st, 14, r->encrypt_key);
    e = obx__sq_step_done(s, st, "insert route");
    if (!e && gen) *gen = sqlite3_last_insert_rowid(s->db);
    return e;
}

static obx_err sq_route_get(obx__store *base, const char *event_type, obx__route_row *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_ROUTE_GET, &st);
    if (e) return e;
    bt(st, 1, event_type);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_route(st, out);
        e = OBX_OK;
    } else if (rc == SQLITE_DONE)
        e = obx__fail(OBX_ENOROUTE,
                      "event_type: no route for '%s' (add one with `obx route set %s ...`)",
                      event_type, event_type);
    else
        e = obx__sq_map_rc(s, rc, "read route");
    sqlite3_reset(st);
    return e;
}

static obx_err sq_route_list(obx__store *base, bool all, obx__route_row **out, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, all ? Q_ROUTE_LIST_ALL : Q_ROUTE_LIST_CUR, &st);
    if (e) return e;
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            obx__route_row *p = realloc(*out, cap * sizeof *p);
            if (!p) {
                e = obx__fail(OBX_ENOMEM, "route list: out of memory");
                break;
            }
            *out = p;
        }
        read_route(st, &(*out)[(*n)++]);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "list routes");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

/* ---- producer ----------------------------------------------------------------------------- */

static obx_err sq_idem_lookup(obx__store *base, const char *tenant, const char *key,
                              char existing[OBX_EVENT_ID_LEN + 1]) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_IDEM, &st);
    if (e) return e;
    bt(st, 1, tenant);
    bt(st, 2, key);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        ct(st, 0, existing, OBX_EVENT_ID_LEN + 1);
        e = OBX_OK;
    } else if (rc == SQLITE_DONE)
        e = OBX_ENOTFOUND;
    else
        e = obx__sq_map_rc(s, rc, "idempotency lookup");
    sqlite3_reset(st);
    return e;
}

static void order_key(const obx__event_row *r, char *out, size_t cap) {
    snprintf(out, cap, "%s\x1f%s\x1f%s", r->dest.cluster, r->dest.topic, r->dest.routing_key);
}

static obx_err sq_insert_envelope(obx__store *base, const obx__event_row *r, const void *payload,
                                  size_t len) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_INS_ENV, &st);
    if (e) return e;
    const obx__envelope *v = &r->env;
    bt(st, 1, v->event_id);
    bi(st, 2, r->envelope_gen);
    bt(st, 3, v->aggregate_type);
    bt(st, 4, v->aggregate_id);
    bi(st, 5, v->aggregate_version);
    bt(st, 6, v->event_type);
    bt(st, 7, v->payload_schema);
    bt(st, 8, v->payload_digest);
    bt(st, 9, v->tenant);
    bi(st, 10, v->occurred_at);
    bt(st, 11, v->created_txid);
    bt(st, 12, v->correlation_id);
    bt(st, 13, v->causation_id);
    bt(st, 14, v->traceparent);
    bt(st, 15, v->idempotency_key);
    bt(st, 16, r->envelope_digest);
    bt(st, 17, r->dest.cluster);
    bt(st, 18, r->dest.topic);
    bt(st, 19, r->dest.routing_key);
    bt(st, 20, r->dest.algorithm);
    bi(st, 21, r->dest.route_gen);
    bt(st, 22, r->dest.serializer);
    bt(st, 23, r->dest.durability);
    bt(st, 24, r->dest.required_acks);
    bt(st, 25, r->dest_digest);
    sqlite3_bind_blob(st, 26, payload ? payload : "", (int)len, SQLITE_STATIC);
    bi(st, 27, (int64_t)len);
    bi(st, 28, r->committed_at);
    bi(st, 29, v->not_before);
    return obx__sq_step_done(s, st, "insert envelope");
}

static obx_err sq_insert_event(obx__store *base, const obx__event_row *r, const void *payload,
                               size_t len) {
    sq_store *s = (sq_store *)base;
    obx_err e = sq_insert_envelope(base, r, payload, len);
    if (e) return e;
    sqlite3_stmt *st = NULL;
    e = obx__sq_stmt(s, Q_INS_EVENT, &st);
    if (e) return e;
    char ok[OBX_NAME_MAX + OBX_TOPIC_MAX + OBX_KEY_MAX + 4];
    order_key(r, ok, sizeof ok);
    bt(st, 1, r->env.event_id);
    bt(st, 2, r->env.tenant);
    /* the key names the logical event once: a further target's slot does not carry it */
    if (r->env.idempotency_key[0] && r->target_no < 2)
        bt(st, 3, r->env.idempotency_key);
    else
        sqlite3_bind_null(st, 3);
    bt(st, 4, r->env.event_type);
    bt(st, 5, r->env.correlation_id);
    bt(st, 6, ok);
    bi(st, 7, r->envelope_gen);
    bt(st, 8, obx__state_name(r->state));
    bi(st, 9, r->claim_gen);
    bt(st, 10, r->owner);
    bi(st, 11, r->lease_until);
    bi(st, 12, r->attempt_gen);
    bt(st, 13, r->attempt_id);
    bi(st, 14, r->pinned_partition);
    bi(st, 15, r->rejections);
    bi(st, 16, r->available_at);
    bi(st, 17, r->next_check_at);
    bi(st, 18, r->unknown_since);
    bt(st, 19, r->primary_attempt_id);
    bi(st, 20, r->published_at);
    bi(st, 21, r->committed_at);
    bi(st, 22, r->updated_at);
    bi(st, 23, r->max_attempts);
    bi(st, 24, r->blind_retry);
    bi(st, 25, r->unordered);
    bt(st, 26, r->alias);
    bt(st, 27, r->dest.cluster);
    return obx__sq_step_done(s, st, "insert event");
}

static obx_err sq_insert_audit(obx__store *base, const obx__audit_row *a, size_t n);

/* SQLite cannot name its transactions: the producer's created_txid is a new "tx-" + ULID for
 * each enqueue (obx.h, obx_event.txid). */
static obx_err mint_txid(sq_store *s, char *out, size_t cap) {
    char ulid[27];
    if (cap < 3 + sizeof ulid) return obx__fail(OBX_EINTERNAL, "txid: buffer too small");
    obx_err e = obx__ulid_next(&s->txid_gen, obx__wall_ms(), ulid);
    if (!e) snprintf(out, cap, "tx-%s", ulid);
    return e;
}

static obx_err sq_route_get_txid(obx__store *base, const char *event_type, obx__route_row *out,
                                 char *txid, size_t cap) {
    obx_err e = sq_route_get(base, event_type, out);
    return e ? e : mint_txid((sq_store *)base, txid, cap);
}

/* The two inserts; a failure of the second leaves the first to the caller's rollback (the
 * engine writes them in its enqueue's savepoint). */
static obx_err sq_insert_event_audit(obx__store *base, const obx__event_row *r, const void *payload,
                                     size_t len, const obx__audit_row *a) {
    obx_err e = sq_insert_event(base, r, payload, len);
    return e ? e : sq_insert_audit(base, a, 1);
}

/* *same: the event type's current route is the one r was built from, with every field the
 * engine copied into r (enqueue.c, build_row) unchanged, and no delivery set. The generation
 * alone does not tell: SQLite's generations are row IDs, which a route_put rolled back (the
 * simulator's traces) gives out again to another route. */
static obx_err route_still(obx__store *base, const obx__event_row *r, bool *same) {
    obx__route_row cur;
    char rk[OBX_KEY_MAX + 1];
    const obx__dest *d = &r->dest;
    *same = false;
    obx_err e = sq_route_get(base, r->env.event_type, &cur);
    if (e == OBX_ENOROUTE ||
        (!e && (cur.targets || cur.gen != d->route_gen ||
                obx__routing_key_expand(cur.routing_key, &r->env, rk, sizeof rk) != OBX_OK))) {
        obx__clear_error(); /* not written here: the long way reports it */
        return OBX_OK;
    }
    if (e) return e;
    *same = !strcmp(cur.cluster, d->cluster) && !strcmp(cur.topic, d->topic) &&
            !strcmp(rk, d->routing_key) && !strcmp(cur.algorithm, d->algorithm) &&
            !strcmp(cur.serializer, d->serializer) && !strcmp(cur.durability, d->durability) &&
            !strcmp(cur.required_acks, d->required_acks) && cur.max_attempts == r->max_attempts &&
            cur.blind_retry == r->blind_retry && cur.unordered == r->unordered &&
            !strcmp(cur.alias, r->alias);
    return OBX_OK;
}

/* enqueue_write (store.h): a savepoint (or a transaction of its own), the route compared
 * (route_still), the two inserts. */
static obx_err sq_enqueue_write(obx__store *base, const obx__event_row *r, const void *payload,
                                size_t len, const obx__audit_row *a, bool *written) {
    obx__event_row *own = NULL;
    obx_err e = OBX_OK;
    bool same = false;
    *written = false;
    if (!r->env.created_txid[0]) { /* the store's: then the envelope digest over it */
        if (!(own = malloc(sizeof *own))) return obx__fail(OBX_ENOMEM, "enqueue: out of memory");
        *own = *r;
        if (!(e = mint_txid((sq_store *)base, own->env.created_txid, sizeof own->env.created_txid)))
            e = obx__envelope_digest(&own->env, own->envelope_digest);
        r = own;
    }
    if (!e && !(e = sq_begin(base))) {
        if (!(e = route_still(base, r, &same)) && same)
            e = sq_insert_event_audit(base, r, payload, len, a);
        if (!e && same)
            e = sq_commit(base);
        else
            sq_rollback(base);
    }
    *written = !e && same;
    free(own);
    return e;
}

/* SQLite has no SQL producer function: obx_enqueue() runs in the library. */
static obx_err sq_producer_body(obx__store *base, char *buf, size_t cap) {
    (void)base;
    if (cap) buf[0] = '\0';
    return OBX_OK;
}

/* ---- reading events ----------------------------------------------------------------------- */

static obx_err read_event(sqlite3_stmt *st, obx__event_row *r, bool with_payload) {
    obx__event_decode(READER(st), r);
    if (with_payload) {
        const void *p = sqlite3_column_blob(st, EVENT_NCOLS);
        int n = sqlite3_column_bytes(st, EVENT_NCOLS);
        if (p && n > 0) {
            r->payload = malloc((size_t)n);
            if (!r->payload) return obx__fail(OBX_ENOMEM, "payload: out of memory");
            memcpy(r->payload, p, (size_t)n);
        }
        if (!p && !r->payload_purged)
            r->payload_unread = true; /* over the claim's ceiling: payload_len is the stored one */
        else
            r->payload_len = p ? (size_t)n : 0;
    }
    return OBX_OK;
}

static obx_err collect(sq_store *s, sqlite3_stmt *st, bool with_payload, obx__rows *out,
                       const char *what) {
    int rc;
    obx_err e = OBX_OK;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        obx__event_row *r = obx__rows_push(out);
        if (!r) {
            e = obx__fail(OBX_ENOMEM, "%s: out of memory", what);
            break;
        }
        e = read_event(st, r, with_payload);
        if (e) break;
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, what);
    sqlite3_reset(st);
    return e;
}

static void bind_aliases(sqlite3_stmt *st, int idx, const char *const *aliases, size_t n, char *buf,
                         size_t cap) {
    if (!n) {
        sqlite3_bind_null(st, idx);
        return;
    }
    size_t o = 0;
    buf[o++] = ',';
    for (size_t i = 0; i < n && o < cap - 2; i++) {
        int w = snprintf(buf + o, cap - o, "%s,", aliases[i]);
        if (w < 0 || (size_t)w >= cap - o) break;
        o += (size_t)w;
    }
    buf[o] = '\0';
    sqlite3_bind_text(st, idx, buf, -1, SQLITE_STATIC);
}

static obx_err read_claim(obx__store *base, const obx__claim_req *req, obx__rows *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_CLAIM, &st);
    if (e) return e;
    char aliases[2048];
    bi(st, 1, req->now);
    if (req->cluster)
        bt(st, 2, req->cluster);
    else
        sqlite3_bind_null(st, 2);
    bi(st, 3, (int64_t)req->limit);
    bind_aliases(st, 4, req->aliases, req->n_aliases, aliases, sizeof aliases);
    bi(st, 5, (int64_t)(req->max_payload ? req->max_payload : OBX_PAYLOAD_DEFAULT_LIMIT));
    return collect(s, st, true, out, "claim candidates");
}

static obx_err read_select(obx__store *base, const obx__select_req *req, obx__rows *out) {
    sq_store *s = (sq_store *)base;
    int id;
    switch (req->kind) {
    case OBX__SEL_EXPIRED_SENDING: id = Q_SEL_EXPIRED; break;
    case OBX__SEL_RECONCILE: id = Q_SEL_RECONCILE; break;
    case OBX__SEL_STATE:
    case OBX__SEL_PUBLISHED_BEFORE:
        if ((unsigned)req->state >= OBX__ST_COUNT)
            return obx__fail(OBX_EINVAL, "select: unknown state %d", (int)req->state);
        id = (req->kind == OBX__SEL_STATE ? Q_SEL_STATE : Q_SEL_PUBBEFORE) + (int)req->state;
        break;
    default: return obx__fail(OBX_EINVAL, "select: unknown kind %d", (int)req->kind);
    }
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, id, &st);
    if (e) return e;
    bi(st, 1, req->now);
    if (req->cluster)
        bt(st, 2, req->cluster);
    else
        sqlite3_bind_null(st, 2);
    bi(st, 3, (int64_t)(req->limit ? req->limit : 1000));
    e = collect(s, st, false, out, "select events");
    /* payload, when asked, is loaded per row (rare: reconciler retries) */
    if (!e && req->payload) {
        for (size_t i = 0; i < out->n && !e; i++) {
            sqlite3_stmt *pl = NULL;
            e = obx__sq_stmt(s, Q_LOAD_PAYLOAD, &pl);
            if (e) break;
            bt(pl, 1, out->v[i].env.event_id);
            int rc = sqlite3_step(pl);
            if (rc == SQLITE_ROW) {
                free(out->v[i].payload);
                out->v[i].payload = NULL;
                e = read_event(pl, &out->v[i], true);
            } else if (rc != SQLITE_DONE)
                e = obx__sq_map_rc(s, rc, "load payload");
            sqlite3_reset(pl);
        }
    }
    return e;
}

static obx_err read_ids(obx__store *base, const char *const *ids, size_t n, unsigned flags,
                        obx__rows *out) {
    sq_store *s = (sq_store *)base;
    bool pl = flags & OBX__LOAD_PAYLOAD;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, pl ? Q_LOAD_PAYLOAD : Q_LOAD, &st);
        if (e) return e;
        bt(st, 1, ids[i]);
        e = collect(s, st, pl, out, "load event");
        if (e) return e;
    }
    return OBX_OK;
}

/* The columns of an event update, in OBX__EVC_* bit order: column k is parameter ?(k + 4)
 * (?1 the event ID, ?2 the expected state, ?3 the expected claim_gen), as in Q_UPD_EVENT. */
enum { UC_I32, UC_I64, UC_TEXT, UC_STATE, UC_ORDER_KEY };
static const struct upd_col {
    const char *name;
    int kind;
    size_t off;
} upd_cols[OBX__EVC_COUNT] = {
    {"envelope_gen", UC_I32, offsetof(obx__event_row, envelope_gen)},
    {"state", UC_STATE, offsetof(obx__event_row, state)},
    {"claim_gen", UC_I64, offsetof(obx__event_row, claim_gen)},
    {"owner", UC_TEXT, offsetof(obx__event_row, owner)},
    {"lease_until", UC_I64, offsetof(obx__event_row, lease_until)},
    {"attempt_gen", UC_I32, offsetof(obx__event_row, attempt_gen)},
    {"attempt_id", UC_TEXT, offsetof(obx__event_row, attempt_id)},
    {"pinned_partition", UC_I32, offsetof(obx__event_row, pinned_partition)},
    {"rejections", UC_I32, offsetof(obx__event_row, rejections)},
    {"available_at", UC_I64, offsetof(obx__event_row, available_at)},
    {"next_check_at", UC_I64, offsetof(obx__event_row, next_check_at)},
    {"unknown_since", UC_I64, offsetof(obx__event_row, unknown_since)},
    {"primary_attempt_id", UC_TEXT, offsetof(obx__event_row, primary_attempt_id)},
    {"published_at", UC_I64, offsetof(obx__event_row, published_at)},
    {"updated_at", UC_I64, offsetof(obx__event_row, updated_at)},
    {"order_key", UC_ORDER_KEY, 0},
    {"dest_cluster", UC_TEXT, offsetof(obx__event_row, dest.cluster)},
    {"held_at", UC_I64, offsetof(obx__event_row, held_at)},
};

/* The prepared UPDATE that sets exactly the columns `cols` (OBX__EVC_* bits), from a cache of
 * SQ_UPD_SLOTS by column set (a transition changes a few columns, and a handle sees a few
 * dozen sets); the statement of every column when the cache is full. Setting only what changed
 * is what makes the update cheap: SQLite rewrites only the indexes whose columns (or partial
 * predicates' columns) are in the SET list, and fires obx_event_frozen (UPDATE OF) only when
 * a frozen column is in it. */
static obx_err update_stmt(sq_store *s, uint32_t cols, sqlite3_stmt **out) {
    size_t h = (size_t)((cols * 2654435761u) >> 7) % SQ_UPD_SLOTS, k = 0;
    while (k < SQ_UPD_SLOTS && s->upd[h].st && s->upd[h].cols != cols) {
        h = (h + 1) % SQ_UPD_SLOTS;
        k++;
    }
    if (k == SQ_UPD_SLOTS) return obx__sq_stmt(s, Q_UPD_EVENT, out);
    if (s->upd[h].st) {
        sqlite3_reset(s->upd[h].st);
        *out = s->upd[h].st;
        return OBX_OK;
    }
    char sql[768];
    size_t n = (size_t)snprintf(sql, sizeof sql, "UPDATE obx_event SET");
    const char *sep = " ";
    for (int c = 0; c < OBX__EVC_COUNT; c++)
        if (cols & (1u << c)) {
            n += (size_t)snprintf(sql + n, sizeof sql - n, "%s%s = ?%d", sep, upd_cols[c].name,
                                  c + 4);
            sep = ", ";
        }
    snprintf(sql + n, sizeof sql - n, " WHERE event_id = ?1 AND state = ?2 AND claim_gen = ?3");
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s->upd[h].st, NULL))
        return obx__sq_map_rc(s, sqlite3_errcode(s->db), "prepare update event");
    s->upd[h].cols = cols;
    *out = s->upd[h].st;
    return OBX_OK;
}

/* Binds the columns `cols` of r to an update_stmt statement. */
static void bind_update(sqlite3_stmt *st, uint32_t cols, const obx__event_row *r, char *ok,
                        size_t cap) {
    for (int c = 0; c < OBX__EVC_COUNT; c++) {
        if (!(cols & (1u << c))) continue;
        const char *p = (const char *)r + upd_cols[c].off;
        switch (upd_cols[c].kind) {
        case UC_I32: bi(st, c + 4, *(const int32_t *)(const void *)p); break;
        case UC_I64: bi(st, c + 4, *(const int64_t *)(const void *)p); break;
        case UC_TEXT: bt(st, c + 4, p); break;
        case UC_STATE: bt(st, c + 4, obx__state_name(r->state)); break;
        default: order_key(r, ok, cap); bt(st, c + 4, ok);
        }
    }
}

static obx_err sq_update_events(obx__store *base, const obx__event_update *u, size_t n,
                                bool *applied) {
    sq_store *s = (sq_store *)base;
    const uint32_t all = (1u << OBX__EVC_COUNT) - 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t cols = all & ~u[i].same;
        if (!cols) cols = OBX__EVC_UPDATED_AT; /* a compare-and-set that changes nothing */
        sqlite3_stmt *st = NULL;
        obx_err e = cols == all ? obx__sq_stmt(s, Q_UPD_EVENT, &st) : update_stmt(s, cols, &st);
        if (e) return e;
        if (st == s->q[Q_UPD_EVENT]) cols = all;
        char ok[OBX_NAME_MAX + OBX_TOPIC_MAX + OBX_KEY_MAX + 4];
        bind_update(st, cols, u[i].row, ok, sizeof ok);
        bt(st, 1, u[i].row->env.event_id);
        bt(st, 2, obx__state_name(u[i].expect_state));
        bi(st, 3, u[i].expect_claim_gen);
        e = obx__sq_step_done(s, st, "update event");
        if (e) return e;
        applied[i] = sqlite3_changes(s->db) == 1;
    }
    return OBX_OK;
}

/* ---- attempts, receipts, audit, counters --------------------------------------------------- */

static void bind_attempt_common(sqlite3_stmt *st, const obx__attempt_row *a) {
    bt(st, 1, a->attempt_id);
    bt(st, 2, a->event_id);
    bi(st, 3, a->envelope_gen);
    bi(st, 4, a->attempt_gen);
    bi(st, 5, a->claim_gen);
    bt(st, 6, a->owner);
    bt(st, 7, a->dest_digest);
    bi(st, 8, a->partition);
    bt(st, 9, obx__attempt_state_name(a->state));
    bi(st, 10, a->started_at);
    bi(st, 11, a->unknown_at);
    bi(st, 12, a->ended_at);
    bi(st, 13, a->offset_before);
    bi(st, 14, a->quiet_until);
    bt(st, 15, a->detail);
}

static obx_err sq_insert_attempts(obx__store *base, const obx__attempt_row *a, size_t n) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, Q_INS_ATT, &st);
        if (e) return e;
        bind_attempt_common(st, &a[i]);
        e = obx__sq_step_done(s, st, "insert attempt");
        if (e) return e;
    }
    return OBX_OK;
}

static obx_err sq_update_attempts(obx__store *base, const obx__attempt_row *a, size_t n) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, Q_UPD_ATT, &st);
        if (e) return e;
        bi(st, 1, a[i].partition);
        bt(st, 2, obx__attempt_state_name(a[i].state));
        bi(st, 3, a[i].unknown_at);
        bi(st, 4, a[i].ended_at);
        bi(st, 5, a[i].offset_before);
        bi(st, 6, a[i].quiet_until);
        bt(st, 7, a[i].detail);
        bt(st, 8, a[i].attempt_id);
        e = obx__sq_step_done(s, st, "update attempt");
        if (e) return e;
        if (sqlite3_changes(s->db) != 1)
            return obx__fail(OBX_ENOTFOUND, "attempt %s not found", a[i].attempt_id);
    }
    return OBX_OK;
}

static void read_attempt(sqlite3_stmt *st, obx__attempt_row *a) {
    obx__attempt_decode(READER(st), a);
}

obx_err obx__sq_grow_array(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return OBX_OK;
    size_t c = *cap ? *cap * 2 : 8;
    while (c < need) c *= 2;
    void *p = realloc(*arr, c * elem);
    if (!p) return obx__fail(OBX_ENOMEM, "out of memory");
    *arr = p;
    *cap = c;
    return OBX_OK;
}

static obx_err sq_load_attempts(obx__store *base, const char *const *ids, size_t n,
                                const char *event_id, obx__attempt_row **out, size_t *n_out) {
    sq_store *s = (sq_store *)base;
    size_t cap = 0;
    obx_err e = OBX_OK;
    *out = NULL;
    *n_out = 0;
    size_t rounds = event_id ? 1 : n;
    for (size_t i = 0; i < rounds && !e; i++) {
        sqlite3_stmt *st = NULL;
        e = obx__sq_stmt(s, event_id ? Q_LOAD_ATT_EVENT : Q_LOAD_ATT, &st);
        if (e) break;
        bt(st, 1, event_id ? event_id : ids[i]);
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            e = obx__sq_grow_array((void **)out, &cap, *n_out + 1, sizeof **out);
            if (e) break;
            read_attempt(st, &(*out)[(*n_out)++]);
        }
        if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "load attempts");
        sqlite3_reset(st);
    }
    if (e) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return e;
}

static obx_err sq_insert_receipts(obx__store *base, const obx__receipt_row *r, size_t n) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, Q_INS_RCPT, &st);
        if (e) return e;
        bt(st, 1, r[i].event_id);
        bi(st, 2, r[i].envelope_gen);
        bt(st, 3, r[i].attempt_id);
        bt(st, 4, obx__receipt_kind_name(r[i].kind));
        bt(st, 5, r[i].cluster);
        bt(st, 6, r[i].topic);
        bi(st, 7, r[i].partition);
        bi(st, 8, r[i].offset);
        bi(st, 9, r[i].broker_ts);
        bt(st, 10, r[i].payload_digest);
        bt(st, 11, r[i].dest_digest);
        bt(st, 12, r[i].reason);
        if (r[i].detail)
            bt(st, 13, r[i].detail);
        else
            sqlite3_bind_null(st, 13);
        bi(st, 14, r[i].created_at);
        bt(st, 15, obx__receipt_source_name(r[i].source));
        e = obx__sq_step_done(s, st, "insert receipt");
        if (e) return e;
    }
    return OBX_OK;
}

/* One receipt from a row of RCPT_COLS. */
static void read_receipt(sqlite3_stmt *st, obx__receipt_row *r) {
    obx__receipt_decode(READER(st), r);
}

/* Steps a receipt query into a growing array. */
obx_err obx__sq_collect_receipts(sq_store *s, sqlite3_stmt *st, const char *what,
                                 obx__receipt_row **out, size_t *n_out) {
    size_t cap = 0;
    obx_err e = OBX_OK;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n_out + 1, sizeof **out))) break;
        read_receipt(st, &(*out)[(*n_out)++]);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, what);
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return e;
}

static obx_err sq_load_receipts(obx__store *base, const char *event_id, obx__receipt_row **out,
                                size_t *n_out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    *out = NULL;
    *n_out = 0;
    obx_err e = obx__sq_stmt(s, Q_LOAD_RCPT, &st);
    if (e) return e;
    bt(st, 1, event_id);
    return obx__sq_collect_receipts(s, st, "load receipts", out, n_out);
}

/* The INSERT of k audit rows (1 <= k <= SQ_AUDIT_ROWS), prepared once per k: one statement
 * for a transaction's rows instead of one each (a statement's fixed cost, and the
 * AUTOINCREMENT counter's read and write, once). */
static obx_err audit_stmt(sq_store *s, size_t k, sqlite3_stmt **out) {
    if (k == 1) return obx__sq_stmt(s, Q_INS_AUDIT, out);
    sqlite3_stmt **st = &s->audit_n[k - 2];
    if (*st) {
        sqlite3_reset(*st);
        *out = *st;
        return OBX_OK;
    }
    char sql[256 + SQ_AUDIT_ROWS * 26];
    size_t n = (size_t)snprintf(sql, sizeof sql, "%s", sql_text[Q_INS_AUDIT]);
    for (size_t i = 1; i < k; i++)
        n += (size_t)snprintf(sql + n, sizeof sql - n, ", (?,?,?,?,?,?,?,?,?,?,?)");
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL))
        return obx__sq_map_rc(s, sqlite3_errcode(s->db), "prepare insert audit");
    *out = *st;
    return OBX_OK;
}

/* The rows in statements of up to SQ_AUDIT_ROWS, in order (audit_id follows the array). */
static obx_err sq_insert_audit(obx__store *base, const obx__audit_row *a, size_t n) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n;) {
        size_t k = n - i < SQ_AUDIT_ROWS ? n - i : SQ_AUDIT_ROWS;
        sqlite3_stmt *st = NULL;
        obx_err e = audit_stmt(s, k, &st);
        if (e) return e;
        for (int j = 0; j < (int)k; i++, j++) {
            int p = j * 11;
            bi(st, p + 1, a[i].at);
            bt(st, p + 2, obx__actor_name(a[i].actor));
            bt(st, p + 3, a[i].who);
            bt(st, p + 4, a[i].event_id);
            bi(st, p + 5, a[i].envelope_gen);
            bt(st, p + 6, obx__state_name(a[i].from));
            bt(st, p + 7, obx__state_name(a[i].to));
            bi(st, p + 8, a[i].claim_gen);
            bt(st, p + 9, a[i].attempt_id);
            bi(st, p + 10, a[i].attempt_gen);
            bt(st, p + 11, a[i].reason);
        }
        e = obx__sq_step_done(s, st, "insert audit");
        if (e) return e;
    }
    return OBX_OK;
}

static obx_err sq_load_audit(obx__store *base, const char *event_id, obx__audit_row **out,
                             size_t *n_out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n_out = 0;
    obx_err e = obx__sq_stmt(s, Q_LOAD_AUDIT, &st);
    if (e) return e;
    bt(st, 1, event_id);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        e = obx__sq_grow_array((void **)out, &cap, *n_out + 1, sizeof **out);
        if (e) break;
        obx__audit_row *a = &(*out)[(*n_out)++];
        memset(a, 0, sizeof *a);
        a->at = ci(st, 0);
        char actor[32], from[32], to[32];
        CT(st, 1, actor);
        for (int k = 0; k < OBX__ACT_COUNT; k++)
            if (!strcmp(actor, obx__actor_name((obx__actor)k))) a->actor = (obx__actor)k;
        CT(st, 2, a->who);
        CT(st, 3, a->event_id);
        a->envelope_gen = (int32_t)ci(st, 4);
        CT(st, 5, from);
        CT(st, 6, to);
        a->from = obx__state_parse(from);
        a->to = obx__state_parse(to);
        a->claim_gen = ci(st, 7);
        CT(st, 8, a->attempt_id);
        a->attempt_gen = (int32_t)ci(st, 9);
        CT(st, 10, a->reason);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "load audit");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return e;
}

/* write_set (store.h): the five writes in order, stopping after an update that did not apply
 * (the caller reports the conflict and rolls back). */
static obx_err sq_write_set(obx__store *base, const obx__write_set *w) {
    obx_err e;
    if (w->n_upd && (e = sq_update_events(base, w->upd, w->n_upd, w->applied))) return e;
    for (size_t i = 0; i < w->n_upd; i++)
        if (!w->applied[i]) return OBX_OK;
    if (w->n_att_new && (e = sq_insert_attempts(base, w->att_new, w->n_att_new))) return e;
    if (w->n_att && (e = sq_update_attempts(base, w->att, w->n_att))) return e;
    if (w->n_rc && (e = sq_insert_receipts(base, w->rc, w->n_rc))) return e;
    return w->n_au ? sq_insert_audit(base, w->au, w->n_au) : OBX_OK;
}

/* load_slots (store.h): the attempts, then the events of their slots, each the event of the
 * attempt found (attempts are few: a scan), else the one named. */
static obx_err sq_load_slots(obx__store *base, const char *const *attempt_ids,
                             const char *const *event_ids, size_t n, unsigned flags,
                             obx__attempt_row **att, size_t *n_att, obx__rows *ev) {
    obx_err e = sq_load_attempts(base, attempt_ids, n, NULL, att, n_att);
    const char **ids = e ? NULL : calloc(n, sizeof *ids);
    if (!e && !ids) e = obx__fail(OBX_ENOMEM, "load slots: out of memory");
    for (size_t i = 0; !e && i < n; i++) {
        ids[i] = event_ids[i];
        for (size_t k = 0; k < *n_att; k++)
            if (!strcmp((*att)[k].attempt_id, attempt_ids[i])) {
                ids[i] = (*att)[k].event_id;
                break;
            }
    }
    if (!e) e = read_ids(base, ids, n, flags, ev);
    free(ids);
    if (e) {
        free(*att);
        *att = NULL;
        *n_att = 0;
    }
    return e;
}

static obx_err sq_counter_add(obx__store *base, const char *name, int64_t delta) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_COUNTER_ADD, &st);
    if (e) return e;
    bt(st, 1, name);
    bi(st, 2, delta);
    return obx__sq_step_done(s, st, "counter");
}

static obx_err sq_counter_get(obx__store *base, const char *name, int64_t *value) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_COUNTER_GET, &st);
    if (e) return e;
    bt(st, 1, name);
    int rc = sqlite3_step(st);
    *value = rc == SQLITE_ROW ? ci(st, 0) : 0;
    e = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? OBX_OK : obx__sq_map_rc(s, rc, "counter");
    sqlite3_reset(st);
    return e;
}

static obx_err read_correlation(obx__store *base, const char *corr, size_t limit, obx__rows *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_FIND_CORR, &st);
    if (e) return e;
    bt(st, 1, corr);
    bi(st, 2, (int64_t)limit);
    return collect(s, st, false, out, "find by correlation");
}

/* ---- retention and audit (docs/retention.md)
 * ------------------------------------------------------ */

static obx_err read_retention(obx__store *base, const obx__retention_req *req, obx__rows *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    /* the store layer admits PUBLISHED and RETAINED only */
    obx_err e = obx__sq_stmt(
        s, req->state == OBX__ST_RETAINED ? Q_RET_CANDIDATES_RET : Q_RET_CANDIDATES_PUB, &st);
    if (e) return e;
    /* req->lock needs nothing more: the caller's write transaction (BEGIN IMMEDIATE) already
     * excludes every other writer */
    bi(st, 2, req->after.at);
    bi(st, 3, req->after.seq);
    bi(st, 4, req->before.at);
    bi(st, 5, req->before.seq);
    bi(st, 6, (int64_t)req->limit);
    return collect(s, st, false, out, "retention candidates");
}

/* ---- selections, delivery sets, receipt details, takeover ---------------------------------- */

static obx_err read_filter(obx__store *base, const obx__event_filter *f, obx__rows *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_FIND, &st);
    if (e) return e;
    char aliases[2048], states[512];
    const char *names[OBX__ST_COUNT];
    size_t ns = f->n_states < OBX__ST_COUNT ? f->n_states : OBX__ST_COUNT;
    for (size_t i = 0; i < ns; i++) names[i] = obx__state_name(f->states[i]);
    if (f->event_type)
        bt(st, 1, f->event_type);
    else
        sqlite3_bind_null(st, 1);
    if (f->cluster)
        bt(st, 2, f->cluster);
    else
        sqlite3_bind_null(st, 2);
    if (f->topic)
        bt(st, 3, f->topic);
    else
        sqlite3_bind_null(st, 3);
    /* ",a,b," lists for instr() membership tests; none binds NULL (no filter) */
    bind_aliases(st, 4, f->aliases, f->n_aliases, aliases, sizeof aliases);
    bind_aliases(st, 5, names, ns, states, sizeof states);
    bi(st, 6, f->committed_from);
    bi(st, 7, f->committed_to);
    bi(st, 8, f->after_seq);
    bi(st, 9, (int64_t)(f->limit ? f->limit : 1000));
    bi(st, 10, f->held);
    bi(st, 11, f->unknown_before);
    return collect(s, st, false, out, "find events");
}

static const obx__event_readers sq_readers = {
    .ids = read_ids,
    .claim = read_claim,
    .select = read_select,
    .filter = read_filter,
    .retention = read_retention,
    .correlation = read_correlation,
};

static obx_err sq_read_events(obx__store *base, const obx__read_req *req, obx__rows *out) {
    return obx__read_events(base, req, &sq_readers, out);
}

static const obx__store_inbox_methods sq_inbox_methods = {
    .version = OBX__STORE_INBOX_VERSION,
    .inbox_get = obx__sq_inbox_get,
    .inbox_put = obx__sq_inbox_put,
    .inbox_finish = obx__sq_inbox_finish,
    .inbox_has = obx__sq_inbox_has,
    .watermark_put = obx__sq_watermark_put,
    .watermark_list = obx__sq_watermark_list,
    .failure_bump = obx__sq_failure_bump,
    .failure_get = obx__sq_failure_get,
    .failure_clear = obx__sq_failure_clear,
    .retry_copy_put = obx__sq_retry_copy_put,
    .retry_copy_list = obx__sq_retry_copy_list,
    .retry_copy_del = obx__sq_retry_copy_del,
    .poison_put = obx__sq_poison_put,
    .poison_list = obx__sq_poison_list,
    .poison_get = obx__sq_poison_get,
    .poison_set_state = obx__sq_poison_set_state,
    .inbox_quarantine_put = obx__sq_inbox_quarantine_put,
    .consume_audit_put = obx__sq_consume_audit_put,
    .consume_audit_list = obx__sq_consume_audit_list,
};

static const obx__store_read_methods sq_read_methods = {
    .version = OBX__STORE_READ_VERSION,
    .counter_get = sq_counter_get,
    .stats = obx__sq_stats,
    .unknown_resolutions = obx__sq_unknown_resolutions,
    .invariants = obx__sq_invariants,
    .aged = obx__sq_aged,
    .delivery_stats = obx__sq_delivery_stats,
    .receipt_details = obx__sq_receipt_details,
    .receipts_by_kind = obx__sq_receipts_by_kind,
    .recent_published = obx__sq_recent_published,
    .delivery_open = obx__sq_delivery_open,
    .unserved = obx__sq_unserved,
    .envelope_at = obx__sq_envelope_at,
};

const obx__store_methods obx__sqlite_store_methods = {
    .version = OBX__STORE_METHODS_VERSION,
    .name = "sqlite",
    .open = sq_open,
    .wrap = sq_wrap,
    .close = sq_close,
    .schema_version = sq_schema_version,
    .migrate = sq_migrate,
    .begin = sq_begin,
    .commit = sq_commit,
    .rollback = sq_rollback,
    .route_put = sq_route_put,
    .route_get = sq_route_get,
    .route_list = sq_route_list,
    .idem_lookup = sq_idem_lookup,
    .route_get_txid = sq_route_get_txid,
    .insert_event = sq_insert_event,
    .insert_event_audit = sq_insert_event_audit,
    .enqueue_write = sq_enqueue_write,
    .producer_body = sq_producer_body,
    .insert_envelope = sq_insert_envelope,
    .read_events = sq_read_events,
    .update_events = sq_update_events,
    .insert_attempts = sq_insert_attempts,
    .update_attempts = sq_update_attempts,
    .load_attempts = sq_load_attempts,
    .load_slots = sq_load_slots,
    .insert_receipts = sq_insert_receipts,
    .load_receipts = sq_load_receipts,
    .insert_audit = sq_insert_audit,
    .load_audit = sq_load_audit,
    .write_set = sq_write_set,
    .counter_add = sq_counter_add,
    .purge_payloads = obx__sq_purge_payloads,
    .route_set_put = obx__sq_route_set_put,
    .route_set_get = obx__sq_route_set_get,
    .delivery_put = obx__sq_delivery_put,
    .delivery_get = obx__sq_delivery_get,
    .set_alias = obx__sq_set_alias,
    .cluster_put = obx__sq_cluster_put,
    .cluster_get = obx__sq_cluster_get,
    .series_put = obx__sq_series_put,
    .series_list = obx__sq_series_list,
    .inbox = &sq_inbox_methods,
    .read = &sq_read_methods,
};

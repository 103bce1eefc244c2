/* obx_pg: the PostgreSQL extension behind obx.enqueue() (docs/postgres.md, "The obx_pg
 * extension"; schema.sql, obx._point_enqueue).
 *
 * It owns one SQL function, obx._enqueue_c(): the contract, arguments and rows of
 * obx._enqueue_sql() (the PL/pgSQL body every database has), for the common call: every field
 * valid, no idempotency key, a route without a delivery set. For it, this file validates the
 * fields, draws the event ID (src/core/ulid.c), expands the routing key and computes the three
 * digests with obx's own canonical encoding (src/core/canon.c, the code the C producer and the
 * relay use, so the bytes are the same by construction), takes the order-key lock, and writes
 * the envelope, the event and the statistics delta in one prepared statement. PL/pgSQL spent
 * most of an enqueue building and running expressions (docs/performance.md, section 3).
 *
 * Every other call (a bad field, an idempotency key, no route, a delivery set, a template that
 * does not expand, a payload over the limit or a limit that is not a number) is handed to
 * obx._enqueue_sql() with the caller's arguments unchanged, so it answers or raises exactly as
 * without the extension: the fast path only ever accepts what obx._enqueue_sql() accepts, and
 * writes the same rows.
 *
 * Backend code: memory is palloc'd in the function's context or SPI's, errors are ereport()s.
 * The core's functions malloc only inside obx__buf and free it before they return. */
/* PostgreSQL 15 leaves PGDLLEXPORT empty on this platform, and the module is built with hidden
 * symbols (CMakeLists.txt): the entry points PG_MODULE_MAGIC and PG_FUNCTION_INFO_V1 declare
 * must be visible to the server. */
#define PGDLLEXPORT __attribute__((visibility("default")))
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation_d.h"
#include "catalog/pg_type_d.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/sinvaladt.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "core/core.h"

#include <inttypes.h>

PG_MODULE_MAGIC;

PGDLLEXPORT Datum obx_pg_enqueue(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(obx_pg_enqueue);
PGDLLEXPORT Datum obx_pg_wait_for_work(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(obx_pg_wait_for_work);
PGDLLEXPORT Datum obx_pg_wake(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(obx_pg_wake);
PGDLLEXPORT void _PG_init(void);

/* obx.enqueue()'s arguments, in order */
enum {
    A_TYPE,
    A_ATYPE,
    A_AID,
    A_AVER,
    A_TENANT,
    A_PAYLOAD,
    A_SCHEMA,
    A_CORR,
    A_CAUSE,
    A_TRACE,
    A_KEY,
    A_OCCURRED,
    A_NOT_BEFORE, /* a delayed event's time (obx_event.not_before_ms); absent in a caller
                     declared with the twelve arguments before it (PG_NARGS) */
    A_COUNT
};

/* pg_int.h's NOTIFY_CHANNEL (and LOCK_CLASS_ORDER in write_sql): the same channel and lock
 * as every other producer path */
#define NOTIFY_CHANNEL "obx_work"
/* obx.obx_meta's row payload_limit, when the owner wrote none (schema.sql, obx._enqueue_sql) */
#define PAYLOAD_LIMIT_DEFAULT_S "1048576"

/* Prepared once per backend (SPI_keepplan; the plan cache re-plans them after DDL). */
static SPIPlanPtr route_plan, write_plan, sql_plan;
static obx__ulid_gen ulid_gen;

static const char route_sql[] =
    "SELECT r.cluster, r.topic, r.routing_key, r.algorithm, r.gen, r.serializer, r.durability, "
    "r.required_acks, r.max_attempts, r.blind_retry, r.unordered, r.alias, "
    "EXISTS (SELECT 1 FROM obx.obx_route_set s WHERE s.route_gen = r.gen) "
    "FROM obx.obx_route r WHERE r.event_type = $1 ORDER BY r.gen DESC LIMIT 1";

/* The rows obx._enqueue_sql() writes for an event without an idempotency key, written only
 * while route generation $25 is still the type's current one and has no delivery set (the
 * check pg_sql.c's Q_ENQ_WRITE makes of the C producer's cached route) and the payload is
 * within the limit (obx.obx_meta's row payload_limit, the owner's; a subquery here costs next
 * to nothing, a statement of its own ~8 us; else no row, and obx._enqueue_sql() refuses): the
 * order key's locks (pg_sql.c ORDER_LOCK; $32: the key's own, else its bucket alone, as
 * order_keys says), the envelope (created_by: the event's first
 * audit row), the event (its seq drawn after the lock), the statistics delta. */
static const char write_sql[] =
    "WITH lk AS MATERIALIZED (SELECT CASE WHEN $32 THEN pg_advisory_xact_lock_shared(5194328, "
    "hashtext($5) & 1023)::text || pg_advisory_xact_lock(hashtextextended($5, 5194328))::text "
    "ELSE pg_advisory_xact_lock(5194328, hashtext($5) & 1023)::text END "
    "WHERE $25 = (SELECT max(r.gen) FROM obx.obx_route r WHERE r.event_type = $3) AND "
    "NOT EXISTS (SELECT 1 FROM obx.obx_route_set x WHERE x.route_gen = $25) AND "
    "octet_length($30) <= coalesce((SELECT m.value FROM obx.obx_meta m WHERE m.key = "
    "'payload_limit')::bigint, " PAYLOAD_LIMIT_DEFAULT_S ")), "
    "env AS (INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, "
    "aggregate_id, aggregate_version, event_type, payload_schema, payload_digest, tenant, "
    "occurred_at, created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
    "envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm, dest_route_gen, "
    "dest_serializer, dest_durability, dest_acks, dest_digest, payload, payload_len, created_at, "
    "created_by, not_before) SELECT $1, 1, $12, $13, $14, $3, $15, $16, $2, $17, $18, $4, $19, "
    "$20, '', $21, $11, $22, $23, $24, $25, $26, $27, $28, $29, $30, octet_length($30), $6, $31, "
    "$33 FROM lk RETURNING event_id), "
    "ev AS (INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, "
    "correlation_id, order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen, "
    "attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since, "
    "primary_attempt_id, published_at, committed_at, updated_at, max_attempts, blind_retry, "
    "unordered, alias, dest_cluster) SELECT env.event_id, $2, NULL, $3, $4, $5, 1, 'PENDING', 0, "
    "'', 0, 0, '', -1, 0, greatest($6, $33), 0, 0, '', 0, $6, $6, $7, $8, $9, $10, $11 FROM env "
    "RETURNING state) "
    "INSERT INTO obx.obx_stat_delta (key, n) SELECT 'state:' || state, 1 FROM ev";
static const Oid write_types[] = {TEXTOID, TEXTOID,  TEXTOID, TEXTOID, TEXTOID, INT8OID, INT4OID,
                                  BOOLOID, BOOLOID,  TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID,
                                  TEXTOID, TEXTOID,  INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID,
                                  TEXTOID, TEXTOID,  TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
                                  TEXTOID, BYTEAOID, TEXTOID, BOOLOID, INT8OID};
#define WRITE_NARGS ((int)(sizeof write_types / sizeof write_types[0]))

static const char sql_sql[] = "SELECT obx._enqueue_sql($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
                              "$11, $12, $13)";
static const Oid sql_types[A_COUNT] = {TEXTOID,  TEXTOID,        TEXTOID,       INT8OID, TEXTOID,
                                       BYTEAOID, TEXTOID,        TEXTOID,       TEXTOID, TEXTOID,
                                       TEXTOID,  TIMESTAMPTZOID, TIMESTAMPTZOID};

static SPIPlanPtr prepare(SPIPlanPtr *slot, const char *sql, int n, const Oid *types) {
    if (!*slot) {
        SPIPlanPtr p = SPI_prepare(sql, n, (Oid *)types);
        if (!p)
            ereport(ERROR, (errmsg("obx_pg: cannot prepare a statement: %s",
                                   SPI_result_code_string(SPI_result))));
        if (SPI_keepplan(p)) ereport(ERROR, (errmsg("obx_pg: cannot keep a prepared statement")));
        *slot = p;
    }
    return *slot;
}

/* ---- the fields, checked as obx._enqueue_sql() checks them: with the core's checks
 * (src/core/validate.c), the C producer's, which test_sql_validation_parity holds to the PL/pgSQL
 * body's refusals ------------------------------------------------------------------------------ */

/* The argument as a NUL-terminated copy in dst (cap bytes), or false when it does not fit;
 * NULL is the empty string. */
static bool arg_text(FunctionCallInfo fcinfo, int i, char *dst, size_t cap, size_t *len) {
    if (PG_ARGISNULL(i)) {
        dst[0] = '\0';
        *len = 0;
        return true;
    }
    text *t = PG_GETARG_TEXT_PP(i);
    size_t n = VARSIZE_ANY_EXHDR(t);
    if (n >= cap) return false;
    memcpy(dst, VARDATA_ANY(t), n);
    dst[n] = '\0';
    *len = n;
    return true;
}

/* ms since the epoch, floored, as floor(extract(epoch FROM ts) * 1000) */
static int64_t ts_ms(TimestampTz ts) {
    int64_t us = ts + (int64_t)(POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY;
    return us >= 0 ? us / 1000 : -((-us + 999) / 1000);
}

typedef struct call {
    obx__envelope e;
    obx__dest d;
    int64_t now_ms;
    int32 max_attempts;
    bool blind_retry, unordered;
    char alias[OBX_NAME_MAX + 1];
    bytea *payload;
} call;

/* A delayed event's time into c->e.not_before (0: none), checked as obx._enqueue_sql() and
 * obx_enqueue() check it (src/engine/enqueue.c); false when obx._enqueue_sql() must answer (a
 * time outside 0..2^48 ms or over OBX_DELAY_MAX_MS ahead: it raises). */
static bool read_not_before(FunctionCallInfo fcinfo, call *c) {
    c->e.not_before = 0;
    if (PG_NARGS() <= A_NOT_BEFORE || PG_ARGISNULL(A_NOT_BEFORE)) return true;
    TimestampTz nb = PG_GETARG_TIMESTAMPTZ(A_NOT_BEFORE);
    if (TIMESTAMP_NOT_FINITE(nb)) return false;
    int64_t ms = ts_ms(nb);
    if (ms < 0 || ms >= ((int64_t)1 << 48) || ms - c->now_ms > OBX_DELAY_MAX_MS) return false;
    c->e.not_before = ms;
    return true;
}

/* Reads and checks the arguments into c; false when obx._enqueue_sql() must answer (a field it
 * would refuse or may need to look up, an idempotency key). */
static bool read_args(FunctionCallInfo fcinfo, call *c) {
    obx__envelope *e = &c->e;
    static const struct {
        int arg;
        const char *name;
        size_t off, cap, min;
        obx__charset cs;
    } fields[] = {
#define F(a, n, min, cs) {a, #n, offsetof(obx__envelope, n), sizeof((obx__envelope *)0)->n, min, cs}
        F(A_TYPE, event_type, 1, OBX__CS_EVENT_TYPE), F(A_ATYPE, aggregate_type, 1, OBX__CS_NAME),
        F(A_TENANT, tenant, 1, OBX__CS_NAME),         F(A_AID, aggregate_id, 1, OBX__CS_TEXT),
        F(A_CORR, correlation_id, 0, OBX__CS_TEXT),   F(A_CAUSE, causation_id, 0, OBX__CS_TEXT),
#undef F
    };
    size_t n_key, n_trace, n_schema;
    if (PG_ARGISNULL(A_AVER) || PG_ARGISNULL(A_PAYLOAD)) return false;
    if (!arg_text(fcinfo, A_KEY, e->idempotency_key, sizeof e->idempotency_key, &n_key) || n_key)
        return false;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char *v = (char *)e + fields[i].off;
        size_t n;
        if ((fields[i].min && PG_ARGISNULL(fields[i].arg)) ||
            !arg_text(fcinfo, fields[i].arg, v, fields[i].cap, &n) ||
            obx__check_field(fields[i].name, v, fields[i].min, fields[i].cap - 1, fields[i].cs))
            return false;
    }
    if (!arg_text(fcinfo, A_TRACE, e->traceparent, sizeof e->traceparent, &n_trace) ||
        (n_trace && !obx__is_traceparent(e->traceparent)))
        return false;
    if (!arg_text(fcinfo, A_SCHEMA, e->payload_schema, sizeof e->payload_schema, &n_schema))
        return false;
    if (PG_ARGISNULL(A_SCHEMA)) {
        char s[OBX_NAME_MAX + 16];
        int n = snprintf(s, sizeof s, "schema:%s", e->event_type);
        if (obx_sha256_digest(s, (size_t)n, e->payload_schema)) return false;
    } else if (!obx__is_digest(e->payload_schema)) {
        return false;
    }
    e->aggregate_version = PG_GETARG_INT64(A_AVER);
    if (e->aggregate_version < 0) return false;
    c->now_ms = ts_ms(GetCurrentTimestamp());
    if (PG_ARGISNULL(A_OCCURRED)) {
        e->occurred_at = c->now_ms;
    } else {
        TimestampTz occ = PG_GETARG_TIMESTAMPTZ(A_OCCURRED);
        if (TIMESTAMP_NOT_FINITE(occ)) return false;
        e->occurred_at = ts_ms(occ);
    }
    if (e->occurred_at < 0 || e->occurred_at >= ((int64_t)1 << 48)) return false;
    if (!read_not_before(fcinfo, c)) return false;
    c->payload = PG_GETARG_BYTEA_PP(A_PAYLOAD);
    size_t plen = VARSIZE_ANY_EXHDR(c->payload);
    if (plen == 0) return false; /* the limit: write_sql */
    return obx_sha256_digest(VARDATA_ANY(c->payload), plen, e->payload_digest) == OBX_OK;
}

/* Column col as text into dst; false when it does not fit (obx._enqueue_sql() then answers:
 * a cut template or name must never be written) */
static bool get_text(HeapTuple t, TupleDesc td, int col, char *dst, size_t cap) {
    char *v = SPI_getvalue(t, td, col);
    return obx__strlcpy(dst, v ? v : "", cap) < cap;
}

/* A route generation as this backend keeps it. A generation's row
 * cannot change and its number (an identity) is never drawn twice, so the number stands for the
 * whole row; write_sql checks that it is still the type's current one. The relation's OID tells
 * a schema made again (its generations numbered from 1 again) from the one the row was read in. */
typedef struct route {
    Oid rel;
    char event_type[OBX_NAME_MAX + 1]; /* "": a free slot */
    obx__dest d;                       /* routing_key: the template */
    int32 max_attempts;
    bool blind_retry, unordered, has_set;
    char alias[OBX_NAME_MAX + 1];
} route;

/* The counters' first value; the test build obx_pg_counters (CMakeLists.txt) starts them near
 * 2^31, where a backend gets only after billions of calls (test_pg_hardening) */
#ifndef OBX_PG_COUNTER_START
#define OBX_PG_COUNTER_START 0u
#endif

/* routes_next: the slot the next miss fills, round robin. Unsigned, so that it wraps to 0 where
 * it runs out (2^32, a multiple of ROUTES: the rotation goes on unbroken): a signed int turned
 * negative after 2^31 misses in one backend, and so did its index, which killed the server. */
#define ROUTES 16
static route routes[ROUTES];
static uint32 routes_next = OBX_PG_COUNTER_START;

/* obx.obx_route's OID now (InvalidOid without the schema) */
static Oid route_rel(void) {
    Oid nsp = get_namespace_oid("obx", true);
    return OidIsValid(nsp) ? get_relname_relid("obx_route", nsp) : InvalidOid;
}

static route *route_cached(const char *type, Oid rel) {
    for (int i = 0; i < ROUTES; i++)
        if (routes[i].rel == rel && !strcmp(routes[i].event_type, type)) return &routes[i];
    return NULL;
}

/* The type's current route generation, read now into its slot; NULL when there is none or a
 * field does not fit (obx._enqueue_sql() then raises, or answers). */
static route *route_read(const char *type, Oid rel) {
    Datum arg = CStringGetTextDatum(type);
    SPIPlanPtr p = prepare(&route_plan, route_sql, 1, (const Oid[]){TEXTOID});
    if (SPI_execute_plan(p, &arg, NULL, true, 1) != SPI_OK_SELECT)
        ereport(ERROR, (errmsg("obx_pg: reading the route failed")));
    route *r = NULL;
    for (int i = 0; i < ROUTES && !r; i++)
        if (!strcmp(routes[i].event_type, type)) r = &routes[i];
    if (!r) r = &routes[routes_next++ % ROUTES];
    r->event_type[0] = '\0';
    if (SPI_processed != 1) return NULL;
    HeapTuple t = SPI_tuptable->vals[0];
    TupleDesc td = SPI_tuptable->tupdesc;
    bool isnull;
    obx__dest *d = &r->d;
    if (!get_text(t, td, 1, d->cluster, sizeof d->cluster) ||
        !get_text(t, td, 2, d->topic, sizeof d->topic) ||
        !get_text(t, td, 3, d->routing_key, sizeof d->routing_key) ||
        !get_text(t, td, 4, d->algorithm, sizeof d->algorithm) ||
        !get_text(t, td, 6, d->serializer, sizeof d->serializer) ||
        !get_text(t, td, 7, d->durability, sizeof d->durability) ||
        !get_text(t, td, 8, d->required_acks, sizeof d->required_acks) ||
        !get_text(t, td, 12, r->alias, sizeof r->alias))
        return NULL;
    d->route_gen = DatumGetInt64(SPI_getbinval(t, td, 5, &isnull));
    r->max_attempts = DatumGetInt32(SPI_getbinval(t, td, 9, &isnull));
    r->blind_retry = DatumGetBool(SPI_getbinval(t, td, 10, &isnull));
    r->unordered = DatumGetBool(SPI_getbinval(t, td, 11, &isnull));
    r->has_set = DatumGetBool(SPI_getbinval(t, td, 13, &isnull));
    r->rel = rel;
    obx__strlcpy(r->event_type, type, sizeof r->event_type);
    return r;
}

/* Route r into c, its template expanded for c's event; false when it has a delivery set (the
 * further targets are obx._enqueue_sql()'s) or the template does not expand. */
static bool use_route(call *c, const route *r) {
    if (r->has_set) return false;
    c->d = r->d;
    c->max_attempts = r->max_attempts;
    c->blind_retry = r->blind_retry;
    c->unordered = r->unordered;
    memcpy(c->alias, r->alias, sizeof c->alias);
    return obx__routing_key_expand(r->d.routing_key, &c->e, c->d.routing_key,
                                   sizeof c->d.routing_key) == OBX_OK;
}

/* obx._enqueue_sql() with the caller's arguments: its answer, or its error */
static text *enqueue_sql(FunctionCallInfo fcinfo) {
    Datum v[A_COUNT];
    char nulls[A_COUNT];
    for (int i = 0; i < A_COUNT; i++) {
        bool null = i >= PG_NARGS() || PG_ARGISNULL(i);
        v[i] = null ? (Datum)0 : PG_GETARG_DATUM(i);
        nulls[i] = null ? 'n' : ' ';
    }
    SPIPlanPtr p = prepare(&sql_plan, sql_sql, A_COUNT, sql_types);
    if (SPI_execute_plan(p, v, nulls, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
        ereport(ERROR, (errmsg("obx_pg: obx._enqueue_sql() returned no row")));
    bool isnull;
    Datum r = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
    if (isnull) return NULL;
    return (text *)DatumGetPointer(SPI_datumTransfer(r, false, -1));
}

static Datum txt(const char *s) { return CStringGetTextDatum(s); }

/* This transaction's events written by the fast path, which locks an event's order key itself
 * (with its bucket shared) for the first ORDER_KEYS_MAX of them and the bucket alone after
 * (pg_sql.c, ORDER_LOCK, which counts in the setting obx.order_locks; a count of its own
 * here saves that setting's reads and writes, ~25,000 instructions an enqueue: each path's
 * count bounds its own locks, and the locks of either mode exclude each other's). Reset at the
 * transaction's end (notify_at_commit). */
#define ORDER_KEYS_MAX 64
static int order_keys;

/* The fast path's rows (write_sql): true when written, false when the route generation in c is
 * no longer the type's current one or the payload is over the limit (nothing written, no lock
 * taken) */
static bool write_rows(call *c) {
    obx__envelope *e = &c->e;
    obx__dest *d = &c->d;
    char okey[OBX_NAME_MAX + OBX_TOPIC_MAX + OBX_KEY_MAX + 3]; /* the order key */
    snprintf(okey, sizeof okey, "%s\x1f%s\x1f%s", d->cluster, d->topic, d->routing_key);
    char env_digest[OBX_DIGEST_LEN + 1], dest_digest[OBX_DIGEST_LEN + 1];
    if (obx__envelope_digest(e, env_digest) || obx__dest_digest(d, dest_digest))
        ereport(ERROR, (errmsg("obx_pg: %s", obx_errmsg())));
    Datum v[] = {txt(e->event_id),
                 txt(e->tenant),
                 txt(e->event_type),
                 txt(e->correlation_id),
                 txt(okey),
                 Int64GetDatum(c->now_ms),
                 Int32GetDatum(c->max_attempts),
                 BoolGetDatum(c->blind_retry),
                 BoolGetDatum(c->unordered),
                 txt(c->alias),
                 txt(d->cluster),
                 txt(e->aggregate_type),
                 txt(e->aggregate_id),
                 Int64GetDatum(e->aggregate_version),
                 txt(e->payload_schema),
                 txt(e->payload_digest),
                 Int64GetDatum(e->occurred_at),
                 txt(e->created_txid),
                 txt(e->causation_id),
                 txt(e->traceparent),
                 txt(env_digest),
                 txt(d->topic),
                 txt(d->routing_key),
                 txt(d->algorithm),
                 Int64GetDatum(d->route_gen),
                 txt(d->serializer),
                 txt(d->durability),
                 txt(d->required_acks),
                 txt(dest_digest),
                 PointerGetDatum(c->payload),
                 txt(GetUserNameFromId(GetSessionUserId(), false)),
                 BoolGetDatum(order_keys < ORDER_KEYS_MAX),
                 Int64GetDatum(e->not_before)};
    StaticAssertStmt(sizeof v / sizeof v[0] == sizeof write_types / sizeof write_types[0],
                     "one value per parameter");
    SPIPlanPtr p = prepare(&write_plan, write_sql, WRITE_NARGS, write_types);
    if (SPI_execute_plan(p, v, NULL, false, 0) != SPI_OK_INSERT || SPI_processed > 1)
        ereport(ERROR, (errmsg("obx_pg: the enqueue's write failed")));
    order_keys += SPI_processed == 1;
    return SPI_processed == 1;
}

/* The fast path: true when the event is written. A route from this backend's cache that is no
 * longer current is read again once; a route read in this call that is already stale (a
 * generation added in between) or unusable leaves the call to obx._enqueue_sql(). */
static bool enqueue_fast(call *c) {
    obx__envelope *e = &c->e;
    char ulid[27];
    if (obx__ulid_next(&ulid_gen, c->now_ms, ulid))
        ereport(ERROR, (errmsg("obx_pg: %s", obx_errmsg())));
    snprintf(e->event_id, sizeof e->event_id, "evt-%s", ulid);
    e->envelope_gen = 1;
    snprintf(e->created_txid, sizeof e->created_txid, "%" PRIu64,
             U64FromFullTransactionId(GetTopFullTransactionId()));
    Oid rel = route_rel();
    route *r = route_cached(e->event_type, rel);
    for (bool fresh = false;; r = NULL) {
        if (!r) {
            if (fresh || !(r = route_read(e->event_type, rel))) return false;
            fresh = true;
        }
        if (use_route(c, r) && write_rows(c)) return true;
        if (fresh) return false;
    }
}

/* pg_try_advisory_xact_lock_shared(WAKE_LOCK_CLASS, hashtext(cluster)), as the other bodies
 * take it (schema.sql, obx._enqueue_sql): true when taken (held to the transaction's end, after its
 * commit is visible), false when a relay of the cluster holds it or waits for it (*tag: the lock).
 * hashtext with the C collation: every deterministic collation hashes a text's bytes alike. */
#define WAKE_LOCK_CLASS 5194330
static void wake_tag(Datum cluster, LOCKTAG *tag) {
    int32 key = DatumGetInt32(DirectFunctionCall1Coll(hashtext, C_COLLATION_OID, cluster));
    SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32)WAKE_LOCK_CLASS, (uint32)key, 2);
}

static bool wake_lock_free(const char *cluster, LOCKTAG *tag) {
    wake_tag(CStringGetTextDatum(cluster), tag);
    return LockAcquire(tag, ShareLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

/* The wake-up, sent once the transaction's commit is visible. A NOTIFY would serialize the
 * commits of every producer that sends one: PostgreSQL queues notifications in commit order
 * under a database-wide lock held from PreCommit_Notify to the end of the commit, WAL flush
 * included, so with fsync on producers commit one at a time (docs/performance.md, "Producer
 * overhead"). Instead the enqueue notes the backends that hold the cluster's wake lock (the
 * relays that wait in obx._wait_for_work(), below) and the commit callback sets their latches:
 * no lock, no queue, nothing in the commit's critical section. Only when no holder can be named
 * (a relay that holds the lock between two statements, or queues for it: no virtual transaction
 * to name it by) does the enqueue fall back to the NOTIFY, sent at the pre-commit callback
 * before PostgreSQL queues the transaction's notifications (CommitTransaction:
 * XACT_EVENT_PRE_COMMIT, then PreCommit_Notify); a relay in obx._wait_for_work() that LISTENs
 * is woken by it too (the notify interrupt sets its latch).
 * A transaction that is prepared instead (two-phase commit) wakes no one: PREPARE TRANSACTION
 * refuses one that has executed NOTIFY, which made obx.enqueue() fail 2PC exactly while a relay
 * waited (docs/postgres.md, "Two-phase commit"); its event is found at the relay's next poll
 * after COMMIT PREPARED. Any end of the transaction clears both. */
#define WAKE_PIDS_MAX 8
static bool notify_pending;
static int wake_pids[WAKE_PIDS_MAX];
static int n_wake_pids;

/* Notes the holders of the wake lock *tag for the commit; none nameable: the NOTIFY. */
static void wake_at_commit(const LOCKTAG *tag) {
    int n = 0;
    VirtualTransactionId *holders = GetLockConflicts(tag, ShareLock, &n);
    bool named = false;
    for (int i = 0; i < n; i++) {
        PGPROC *p = BackendIdGetProc(holders[i].backendId);
        int pid = p ? p->pid : 0;
        if (!pid) continue;
        named = true;
        bool known = false;
        for (int j = 0; j < n_wake_pids && !known; j++) known = wake_pids[j] == pid;
        if (!known && n_wake_pids < WAKE_PIDS_MAX) wake_pids[n_wake_pids++] = pid;
    }
    if (!named) notify_pending = true;
}

static void notify_at_commit(XactEvent event, void *arg) {
    (void)arg;
    if (event == XACT_EVENT_PRE_COMMIT && notify_pending) Async_Notify(NOTIFY_CHANNEL, "");
    if (event == XACT_EVENT_COMMIT)
        for (int i = 0; i < n_wake_pids; i++) {
            /* the pid again: a backend that has exited since is not woken, and one that reused
             * its slot is not either */
            PGPROC *p = BackendPidGetProc(wake_pids[i]);
            if (p) SetLatch(&p->procLatch);
        }
    if (event != XACT_EVENT_PARALLEL_PRE_COMMIT && event != XACT_EVENT_PARALLEL_COMMIT) {
        notify_pending = false;
        order_keys = 0;
    }
    /* the pids live from the enqueue to the commit, past its pre-commit event */
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE)
        n_wake_pids = 0;
}

void _PG_init(void) { RegisterXactCallback(notify_at_commit, NULL); }

/* obx._wake_c(cluster): the same wake-up for the other producers' statements, which found the
 * wake lock taken in SQL (schema.sql, obx._wake; pg_sql.c, NOTIFY_EXPR). */
Datum obx_pg_wake(PG_FUNCTION_ARGS) {
    LOCKTAG tag;
    wake_tag(PG_GETARG_DATUM(0), &tag);
    wake_at_commit(&tag);
    PG_RETURN_VOID();
}

/* The shortest time between two returns of a woken obx._wait_for_work() in one backend. Every
 * wake-up costs the waiter a return, a new statement and, in a relay, a claim, and a waiter
 * between two statements cannot be named by a producer, which then falls back to the NOTIFY
 * that makes commits queue (above): under a stream of commits a waiter woken by nearly each one
 * (900-1,600 returns a second) sent 8-45 % of the producers' commits to the NOTIFY, and with
 * this gap 3-11 % (docs/performance.md, section 3). A wake-up that comes sooner than this after the
 * previous return is held until then, and the commits in between end that one wait; a wake-up after
 * a quiet spell (a trickle of events, the first of a burst) returns at once. */
#define WAKE_GAP_MS 2
static TimestampTz last_return;

/* obx._wait_for_work(timeout_ms): a relay's idle wait (pg_wake.c, obx__pg_wait_for_work), in the
 * server, so that a producer's commit can wake it by its latch (above). Returns true when the
 * latch was set (a producer's wake-up, a NOTIFY to this LISTENing session, or another of the
 * server's reasons: the relay claims once more, which is cheap), at once or WAKE_GAP_MS after
 * the previous return, whichever is later; false at the timeout, which is at most 1 s: the wait
 * holds a snapshot, and a vacuum must not wait behind an idle relay. */
Datum obx_pg_wait_for_work(PG_FUNCTION_ARGS) {
    int32 ms = PG_GETARG_INT32(0);
    if (ms < 0) ms = 0;
    if (ms > 1000) ms = 1000;
    int rc =
        WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
    if (rc & WL_LATCH_SET) {
        /* held: the latch stays out of the wait, so the commits meanwhile set it and signal
         * nothing; the reset below covers them all */
        long hold = TimestampDifferenceMilliseconds(
            GetCurrentTimestamp(), TimestampTzPlusMilliseconds(last_return, WAKE_GAP_MS));
        if (hold > 0) WaitLatch(NULL, WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, hold, PG_WAIT_EXTENSION);
    }
    ResetLatch(MyLatch);
    CHECK_FOR_INTERRUPTS();
    last_return = GetCurrentTimestamp();
    PG_RETURN_BOOL((rc & WL_LATCH_SET) != 0);
}

Datum obx_pg_enqueue(PG_FUNCTION_ARGS) {
    call c;
    memset(&c, 0, sizeof c);
    bool fast = read_args(fcinfo, &c);
    if (SPI_connect() != SPI_OK_CONNECT) ereport(ERROR, (errmsg("obx_pg: SPI_connect failed")));
    text *out;
    if (fast && enqueue_fast(&c)) {
        /* the wake-up, at commit (notify_at_commit), coalesced per transaction; not where the
         * session's obx.notify is 'off', and only while a relay of the event's cluster waits
         * (as the other bodies) */
        const char *notify = GetConfigOption("obx.notify", true, false);
        LOCKTAG tag;
        if ((!notify || strcmp(notify, "off") != 0) && !wake_lock_free(c.d.cluster, &tag))
            wake_at_commit(&tag);
        size_t n = strlen(c.e.event_id);
        out = (text *)SPI_palloc(VARHDRSZ + n);
        SET_VARSIZE(out, VARHDRSZ + n);
        memcpy(VARDATA(out), c.e.event_id, n);
    } else {
        out = enqueue_sql(fcinfo);
    }
    SPI_finish();
    if (!out) PG_RETURN_NULL();
    PG_RETURN_TEXT_P(out);
}

#ifdef OBX_PG_SAN_SELFTEST
/* The sanitized test build's proof that its sanitizer reports from inside the server
 * (tests/pg/ext_sanitized.sh calls it first and expects the report): a signed overflow, which
 * UBSan stops. Never in the module obx.enqueue() loads. */
PGDLLEXPORT Datum obx_pg_san_selftest(PG_FUNCTION_ARGS);
PG_FUNCTION_INFO_V1(obx_pg_san_selftest);
Datum obx_pg_san_selftest(PG_FUNCTION_ARGS) {
    (void)fcinfo;
    volatile int32 big = PG_INT32_MAX, one = 1;
    PG_RETURN_INT32(big + one);
}
#endif

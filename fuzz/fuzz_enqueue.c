/*
 * fuzz_enqueue.c — what `obx enqueue` / `obx route set` arguments reach: the input validation
 * and the enqueue path down to SQL (obx__route_set_at, obx__enqueue_at on the SQLite store),
 * on an in-memory database. Each input runs inside a transaction of the fuzzer's own that is
 * rolled back afterwards, so inputs do not see each other.
 *
 * Properties, per input (fields as "key=value" lines, payload after "--"):
 *   1. a route and an event built from arbitrary strings (tenant, type, aggregate, idempotency
 *      key, correlation and causation IDs, traceparent, schema, routing-key template, topic
 *      with SQL metacharacters, invalid UTF-8, control bytes) are either refused with an error
 *      that starts with the name of the offending field, with nothing stored, or stored;
 *   2. a stored event reads back byte-identical: envelope fields, payload and its digest;
 *   3. a second enqueue with the same idempotency key returns the first event and stores
 *      nothing; without a key it stores a second event;
 *   4. every message is printable.
 */
#include "fuzz_common.h"

#include "engine/engine.h"

#include <sqlite3.h>

static sqlite3 *db;
static obx_store *st;

static long long count(const char *table) {
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM %s", table);
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) abort();
    if (sqlite3_step(s) != SQLITE_ROW) abort();
    long long n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return n;
}

static void init(void) {
    if (db) return;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) abort();
    if (obx_store_wrap_sqlite(db, &st) || obx_store_init(st)) {
        fprintf(stderr, "init: %s\n", obx_errmsg());
        abort();
    }
}

/* The error names one of the fields (its message starts with "field:"). */
static void names_field(const char *msg, const char *const *fields, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(fields[i]);
        if (!strncmp(msg, fields[i], l) && msg[l] == ':') return;
    }
    PROP(0, "error does not start with a field name: %s", msg);
}

static const char *const route_fields[] = {
    "event_type", "cluster",    "topic",         "routing_key", "algorithm",
    "serializer", "durability", "required_acks", "alias",       "max_attempts"};
static const char *const event_fields[] = {"event_type",        "aggregate_type",  "aggregate_id",
                                           "aggregate_version", "tenant",          "correlation_id",
                                           "causation_id",      "idempotency_key", "txid",
                                           "occurred_at_ms",    "payload_schema",  "traceparent",
                                           "payload",           "routing_key"};

static void check_stored(const obx_event *ev, const obx_enqueue_result *r) {
    obx__rows rows = {0};
    const char *id = r->event_id;
    PROP(obx__st_load_events(st, &id, 1, OBX__LOAD_PAYLOAD, &rows) == OBX_OK && rows.n == 1,
         "stored event %s not found", id);
    const obx__event_row *row = &rows.v[0];
    const obx__envelope *e = &row->env;
#define SAME(f, v) PROP(!strcmp(e->f, (v) ? (v) : ""), #f " changed: '%s' vs '%s'", e->f, v)
    SAME(event_type, ev->event_type);
    SAME(aggregate_type, ev->aggregate_type);
    SAME(aggregate_id, ev->aggregate_id);
    SAME(tenant, ev->tenant);
    SAME(correlation_id, ev->correlation_id);
    SAME(causation_id, ev->causation_id);
    SAME(idempotency_key, ev->idempotency_key);
    SAME(traceparent, ev->traceparent);
    if (ev->payload_schema) SAME(payload_schema, ev->payload_schema);
#undef SAME
    PROP(e->aggregate_version == ev->aggregate_version, "aggregate_version");
    PROP(row->payload_len == ev->payload_len && !memcmp(row->payload, ev->payload, ev->payload_len),
         "payload changed");
    char d[OBX_DIGEST_LEN + 1];
    obx_sha256_digest(ev->payload, ev->payload_len, d);
    PROP(!strcmp(d, e->payload_digest) && !strcmp(d, r->payload_digest), "payload digest");
    PROP(!strcmp(row->dest_digest, r->dest_digest), "dest digest");
    obx__rows_free(&rows);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    init();
    fz_input in;
    fz_parse(data, size, &in);
    if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) abort();
    char *type = fz_get(&in, "type", NULL);
    char *cluster = fz_get(&in, "cluster", NULL), *topic = fz_get(&in, "topic", NULL);
    char *tpl = fz_get(&in, "routing_key", NULL), *alg = fz_get(&in, "algorithm", NULL);
    obx_route rt = {.event_type = type,
                    .cluster = cluster ? cluster : "local",
                    .topic = topic ? topic : "orders",
                    .routing_key = tpl,
                    .algorithm = alg,
                    .max_attempts = (int)fz_int(&in, "max_attempts", 0)};
    obx__clear_error();
    obx_err e = obx__route_set_at(st, &rt, 1700000000000, NULL);
    if (e) {
        fz_printable("route error", obx_errmsg());
        names_field(obx_errmsg(), route_fields, sizeof route_fields / sizeof route_fields[0]);
    }
    long long events0 = count("obx_event"), env0 = count("obx_envelope"),
              audit0 = count("obx_audit");
    obx_event ev = {.event_type = type,
                    .aggregate_type = fz_get(&in, "aggregate_type", NULL),
                    .aggregate_id = fz_get(&in, "aggregate_id", NULL),
                    .aggregate_version = fz_int(&in, "version", 1),
                    .tenant = fz_get(&in, "tenant", NULL),
                    .payload = in.rest,
                    .payload_len = in.rest_len,
                    .payload_schema = fz_get(&in, "schema", NULL),
                    .correlation_id = fz_get(&in, "correlation_id", NULL),
                    .causation_id = fz_get(&in, "causation_id", NULL),
                    .traceparent = fz_get(&in, "traceparent", NULL),
                    .idempotency_key = fz_get(&in, "idempotency_key", NULL),
                    .txid = fz_get(&in, "txid", NULL),
                    .occurred_at_ms = fz_int(&in, "occurred_at", 0)};
    long long limit = fz_int(&in, "payload_limit", 0);
    if (limit > 0 && limit < 1 << 20) obx_store_set_payload_limit(st, (size_t)limit);
    obx_enqueue_result r;
    obx__clear_error();
    e = obx__enqueue_at(st, &ev, 1700000000001, NULL, &r);
    if (e) {
        fz_printable("enqueue error", obx_errmsg());
        names_field(obx_errmsg(), event_fields, sizeof event_fields / sizeof event_fields[0]);
        PROP(count("obx_event") == events0 && count("obx_envelope") == env0 &&
                 count("obx_audit") == audit0,
             "refused (%s) but something was stored", obx_errmsg());
        PROP(!r.event_id[0], "refused but an event ID was returned");
    } else {
        PROP(!r.existing, "first enqueue reported an existing event");
        PROP(count("obx_event") == events0 + 1, "one event expected");
        check_stored(&ev, &r);
        obx_enqueue_result r2;
        PROP(obx__enqueue_at(st, &ev, 1700000000002, NULL, &r2) == OBX_OK, "again: %s",
             obx_errmsg());
        if (ev.idempotency_key && *ev.idempotency_key) {
            PROP(r2.existing && !strcmp(r2.event_id, r.event_id), "idempotency key ignored");
            PROP(count("obx_event") == events0 + 1, "a second event for the same key");
        } else {
            PROP(!r2.existing && strcmp(r2.event_id, r.event_id), "second event expected");
            check_stored(&ev, &r2);
        }
    }
    obx_store_set_payload_limit(st, OBX_PAYLOAD_DEFAULT_LIMIT);
    if (sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL) != SQLITE_OK) abort();
    free(type);
    free(cluster);
    free(topic);
    free(tpl);
    free(alg);
    free((char *)ev.aggregate_type);
    free((char *)ev.aggregate_id);
    free((char *)ev.tenant);
    free((char *)ev.payload_schema);
    free((char *)ev.correlation_id);
    free((char *)ev.causation_id);
    free((char *)ev.traceparent);
    free((char *)ev.idempotency_key);
    free((char *)ev.txid);
    return 0;
}

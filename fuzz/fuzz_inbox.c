/*
 * fuzz_inbox.c — the consumer's decoding and validation of a delivered message
 * (obx_inbox_process, src/engine/inbox.c): every field of an obx_message comes from a broker,
 * or from an application's own client, and is outside input. In-memory SQLite consumer
 * database; each input runs inside a transaction of the fuzzer's own that is rolled back.
 *
 * Properties, per input (message fields as "key=value" lines, payload after "--"):
 *   1. obx_inbox_process returns OBX_OK with one of the five outcomes, ack set unless FAILED —
 *      never a crash and never a store error (a store error would leave the message
 *      unacknowledged forever: the consumer would stall on it);
 *   2. the handler runs only for a well-formed message: valid event ID, payload matching its
 *      digest, a versioned event type, a valid tenant and aggregate, both accepted by the
 *      consumer's filters;
 *   3. over several deliveries of one message the effect is applied at most once;
 *   4. everything written to the consumer's database is valid UTF-8 (PostgreSQL refuses
 *      anything else in a TEXT column) and the outcome's result and detail are printable;
 *   5. a poisoned message is visible in obx_inbox_poison_list.
 */
#include "fuzz_common.h"

#include <jansson.h>
#include <sqlite3.h>

static sqlite3 *db;
static obx_store *st;

typedef struct hstate {
    int ok_calls, calls;
    const char *mode;
    const obx_message *seen;
} hstate;

static obx_err handler(void *user, void *conn, const obx_message *m, const char *key, char *res,
                       size_t cap) {
    hstate *h = user;
    (void)conn;
    h->calls++;
    /* property 2: only well-formed messages get here */
    PROP(!obx_event_id_check(m->event_id), "handler got a bad event ID");
    char d[OBX_DIGEST_LEN + 1];
    obx_sha256_digest(m->payload ? m->payload : "", m->payload_len, d);
    PROP(m->payload_digest && !strcmp(d, m->payload_digest), "handler got a digest mismatch");
    PROP(!obx__check_field("event_type", m->event_type, 1, OBX_NAME_MAX, OBX__CS_EVENT_TYPE),
         "handler got event_type: %s", obx_errmsg());
    PROP(!obx__check_field("tenant", m->tenant, 1, OBX_NAME_MAX, OBX__CS_NAME),
         "handler got tenant: %s", obx_errmsg());
    PROP(!obx__check_field("aggregate_type", m->aggregate_type, 0, OBX_NAME_MAX, OBX__CS_NAME),
         "handler got aggregate_type: %s", obx_errmsg());
    PROP(!obx__check_field("aggregate_id", m->aggregate_id, 0, OBX_KEY_MAX, OBX__CS_TEXT),
         "handler got aggregate_id: %s", obx_errmsg());
    PROP(strlen(key) == 67, "effect key");
    if (!strcmp(h->mode, "fail")) return obx__fail(OBX_EHANDLER, "downstream \x1b[31m\xff down");
    if (!strcmp(h->mode, "fail1") && h->calls == 1) return OBX_EHANDLER;
    if (!strcmp(h->mode, "badresult"))
        snprintf(res, cap, "r\x01\xc3(\xf0\x9f\x98 %.200s", m->aggregate_id ? m->aggregate_id : "");
    else
        snprintf(res, cap, "ok");
    h->ok_calls++;
    return OBX_OK;
}

static void text_columns_valid(void) {
    static const char *const tables[] = {"obx_inbox",
                                         "obx_poison",
                                         "obx_inbox_failure",
                                         "obx_consume_audit",
                                         "obx_consumer_watermark",
                                         "obx_inbox_quarantine"};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT * FROM %s", tables[t]);
        sqlite3_stmt *s;
        if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) abort();
        while (sqlite3_step(s) == SQLITE_ROW)
            for (int c = 0; c < sqlite3_column_count(s); c++) {
                if (sqlite3_column_type(s, c) != SQLITE_TEXT) continue;
                const unsigned char *v = sqlite3_column_text(s, c);
                int n = sqlite3_column_bytes(s, c);
                PROP(obx__utf8_invalid_at(v, (size_t)n) < 0 && !memchr(v, 0, (size_t)n),
                     "%s.%s holds invalid UTF-8", tables[t], sqlite3_column_name(s, c));
            }
        sqlite3_finalize(s);
    }
}

static size_t split(char *s, const char **out, size_t max) {
    size_t n = 0;
    for (char *save = NULL, *t = s ? strtok_r(s, ",", &save) : NULL; t && n < max;
         t = strtok_r(NULL, ",", &save))
        out[n++] = t;
    return n;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (!db) {
        if (sqlite3_open(":memory:", &db) != SQLITE_OK) abort();
        if (obx_store_wrap_sqlite(db, &st) || obx_store_init(st)) abort();
    }
    fz_input in;
    fz_parse(data, size, &in);
    char *types_s = fz_get(&in, "types", NULL), *tenants_s = fz_get(&in, "tenants", NULL);
    char *consumer = fz_get(&in, "consumer", NULL), *mode = fz_get(&in, "handler", NULL);
    const char *types[8], *tenants[8];
    size_t nty = split(types_s, types, 8), nte = split(tenants_s, tenants, 8);
    obx_inbox_options o = {.consumer_id = consumer ? consumer : "fuzz",
                           .event_types = nty ? types : NULL,
                           .n_event_types = nty,
                           .tenants = nte ? tenants : NULL,
                           .n_tenants = nte,
                           .max_failures = (int)(fz_int(&in, "max_failures", 2) % 4)};
    if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) abort();
    obx_inbox *ib = NULL;
    obx_err e = obx_inbox_open(st, &o, &ib);
    if (e) {
        PROP(e == OBX_EINVAL || e == OBX_ETOOBIG, "inbox open: %s", obx_errname(e));
        fz_printable("inbox open error", obx_errmsg());
    } else {
        char digest[OBX_DIGEST_LEN + 1];
        obx_sha256_digest(in.rest ? (const void *)in.rest : "", in.rest_len, digest);
        char *pd = fz_get(&in, "payload_digest", NULL);
        obx_message m = {.event_id = fz_get(&in, "event_id", NULL),
                         .envelope_gen = (int)fz_int(&in, "envelope_gen", 1),
                         .event_type = fz_get(&in, "event_type", NULL),
                         .tenant = fz_get(&in, "tenant", NULL),
                         .aggregate_type = fz_get(&in, "aggregate_type", NULL),
                         .aggregate_id = fz_get(&in, "aggregate_id", NULL),
                         .aggregate_version = fz_int(&in, "aggregate_version", 0),
                         .correlation_id = fz_get(&in, "correlation_id", NULL),
                         .causation_id = fz_get(&in, "causation_id", NULL),
                         .traceparent = fz_get(&in, "traceparent", NULL),
                         .occurred_at = fz_int(&in, "occurred_at", 0),
                         .payload_digest = pd && !strcmp(pd, "auto") ? digest : pd,
                         .payload = in.rest,
                         .payload_len = in.rest_len,
                         .topic = fz_get(&in, "topic", NULL),
                         .partition = (int32_t)fz_int(&in, "partition", 0),
                         .offset = fz_int(&in, "offset", 0),
                         .header_error = fz_get(&in, "header_error", NULL)};
        hstate h = {.mode = mode ? mode : "ok"};
        int deliveries = 1 + (int)(fz_int(&in, "deliveries", 1) & 3);
        for (int i = 0; i < deliveries; i++) {
            obx_inbox_result r;
            obx__clear_error();
            e = obx_inbox_process(ib, &m, handler, &h, db, &r);
            PROP(e == OBX_OK, "process: %s: %s", obx_errname(e), obx_errmsg());
            /* DELAYED: a redelivery before its retry is due (the default back-off, 1 s) */
            PROP(r.outcome >= OBX_INBOX_APPLIED && r.outcome <= OBX_INBOX_DELAYED, "outcome %d",
                 (int)r.outcome);
            PROP(r.ack == (r.outcome != OBX_INBOX_FAILED && r.outcome != OBX_INBOX_DELAYED),
                 "ack %d for outcome %d", r.ack, (int)r.outcome);
            PROP(r.outcome != OBX_INBOX_DELAYED || r.retry_at > 0, "delayed without retry_at");
            fz_printable("result", r.result);
            fz_printable("detail", r.detail);
            if (r.outcome == OBX_INBOX_POISONED) {
                char *js = NULL;
                PROP(obx_inbox_poison_list(st, o.consumer_id, &js) == OBX_OK, "poison list: %s",
                     obx_errmsg());
                json_t *arr = json_loads(js, 0, NULL);
                PROP(json_array_size(arr) >= 1, "poisoned, but the poison list is empty");
                json_decref(arr);
                obx_free(js);
            }
            text_columns_valid();
        }
        PROP(h.ok_calls <= 1, "effect applied %d times", h.ok_calls);
        free((char *)m.event_id);
        free((char *)m.event_type);
        free((char *)m.tenant);
        free((char *)m.aggregate_type);
        free((char *)m.aggregate_id);
        free((char *)m.correlation_id);
        free((char *)m.causation_id);
        free((char *)m.traceparent);
        free((char *)m.topic);
        free((char *)m.header_error);
        free(pd);
        obx_inbox_close(ib);
    }
    if (sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL) != SQLITE_OK) abort();
    free(types_s);
    free(tenants_s);
    free(consumer);
    free(mode);
    return 0;
}

/*
 * test_inbox_sql.c — the SQL inbox (schema.sql: obx.inbox_receive, inbox_applied,
 * inbox_failed, inbox_redrives, inbox_effect_key) against obx_inbox_process() on a real
 * PostgreSQL (OBX_TEST_PG_URL; fails, never skips, without it).
 *
 *   same semantics   one script of deliveries — in order, redelivered, reordered, a late
 *                    duplicate, same ID with another payload, a payload not matching its
 *                    digest, an undeclared contract, a foreign tenant, a malformed event ID
 *                    and event type, handler failures up to the limit, a failure then a
 *                    success, a handler refusing poison, a re-drive — runs through the C inbox
 *                    into one database and through the SQL functions into another; every
 *                    delivery must end the same way and the inbox tables (receipts,
 *                    watermarks, failures, poison rows with their headers and payloads,
 *                    quarantine rows, consume audit) must hold the same rows, clocks aside;
 *                    the effects table has each applied event once;
 *   effect keys      obx.inbox_effect_key() equals obx_inbox_effect_key();
 *   concurrency      a second instance receiving the same event waits for the first one's
 *                    transaction: duplicate after its commit, process after its rollback;
 *   completeness     a receipt received for processing cannot be committed without
 *                    obx.inbox_applied() (the effect may not have been made);
 *   least privilege  through the <prefix>_consumer role: its granted consumer and tenant work,
 *                    another tenant is parked ("refused the receipt"), another consumer ID is
 *                    refused, the outbox is out of reach;
 *   evidence         a delivery recorded through obx.inbox_receive() with the relay's attempt
 *                    and destination headers is a critical consumer's evidence for the
 *                    reconciler (obx__consumer_evidence); a malformed attempt is not;
 *   bad input        a bad consumer ID or failure limit is an error naming the field and
 *                    stores nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/pg_fx.h"
#include "support/support.h"

#include "engine/engine.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static PGconn *admin;
static char port[16];
static int dbs;

static void sql(PGconn *c, const char *q) { obx_t_pg_sql(c, q); }

static long long qint(PGconn *c, const char *q) { return obx_t_pg_qint(c, q); }

/* A new database with the obx schema (and the test's effects table); its URL into url. */
static void new_db(char *db, char *url, size_t cap) {
    snprintf(db, 48, "obx_isql_%d_%d", (int)getpid(), ++dbs);
    char q[160];
    snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s", db);
    sql(admin, q);
    snprintf(q, sizeof q, "CREATE DATABASE %s", db);
    sql(admin, q);
    snprintf(url, cap, "postgres://postgres@127.0.0.1:%s/%s", port, db);
    obx_store *s;
    OK(obx_store_open(url, &s));
    OK(obx_store_init(s));
    obx_store_close(s);
    PGconn *c = PQconnectdb(url);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    sql(c, "CREATE TABLE fx (event_id text NOT NULL, effect text NOT NULL)");
    PQfinish(c);
}

static void drop_db(const char *db) {
    char q[128];
    snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s WITH (FORCE)", db);
    sql(admin, q);
}

/* ---- deliveries --------------------------------------------------------------------------- */

typedef enum { H_OK, H_FAIL, H_POISON } behaviour;

typedef struct delivery {
    const char *event_id;
    const char *payload;
    const char *digest_of; /* the digest header is this text's digest (NULL: the payload's) */
    const char *event_type;
    const char *tenant;
    behaviour h;
    const char *want; /* "APPLIED", "DUPLICATE", "QUARANTINED", "FAILED", "POISONED" */
    int64_t offset;
    const char *attempt_id; /* its obx-attempt-id header (NULL: ATT) */
} delivery;

/* The attempt and destination digest the relay's headers carry: with them a consume receipt is
 * evidence for the reconciler (obx_inbox's evidence columns). */
#define ATT "att-01JB0000000000000000000A01"
#define DEST "sha256:" DEST32 DEST32
#define DEST32 "0123456789abcdef0123456789abcdef"

#define E(n) "evt-01JB0000000000000000000" n
static const delivery script[] = {
    {E("001"), "{\"order\":1}", NULL, "order.created.v1", "t1", H_OK, "APPLIED", 1},
    {E("002"), "{\"order\":2}", NULL, "order.created.v1", "t2", H_OK, "APPLIED", 2},
    {E("002"), "{\"order\":2}", NULL, "order.created.v1", "t2", H_OK, "DUPLICATE", 3},
    {E("010"), "{\"order\":10}", NULL, "order.created.v1", "t1", H_OK, "APPLIED", 5},
    /* a malformed attempt header: applied, an ordinary receipt (never evidence) */
    {E("009"), "{\"order\":9}", NULL, "order.created.v1", "t1", H_OK, "APPLIED", 4, "att-bogus"},
    {E("001"), "{\"order\":1}", NULL, "order.created.v1", "t1", H_OK, "DUPLICATE", 6},
    {E("001"), "{\"order\":1,\"x\":1}", NULL, "order.created.v1", "t1", H_OK, "QUARANTINED", 7},
    {E("003"), "{\"order\":3}", "{\"order\":1}", "order.created.v1", "t1", H_OK, "POISONED", 8},
    {E("004"), "{\"order\":4}", NULL, "order.created.v2", "t1", H_OK, "POISONED", 9},
    {E("005"), "{\"order\":5}", NULL, "order.created.v1", "t9", H_OK, "POISONED", 10},
    {"evt-not-an-id'; DROP TABLE fx;--", "{\"o\":1}", NULL, "order.created.v1", "t1", H_OK,
     "POISONED", 11},
    {E("006"), "{\"order\":6}", NULL, "Order.Created", "t1", H_OK, "POISONED", 12},
    {E("007"), "{\"order\":7}", NULL, "order.created.v1", "t1", H_FAIL, "FAILED", 13},
    {E("007"), "{\"order\":7}", NULL, "order.created.v1", "t1", H_FAIL, "FAILED", 13},
    {E("007"), "{\"order\":7}", NULL, "order.created.v1", "t1", H_FAIL, "POISONED", 13},
    /* the ack of that POISONED was lost: the broker delivers it again, and a handler that would
     * now succeed must not run on a parked message (it ran, and applied it, before the fix) */
    {E("007"), "{\"order\":7}", NULL, "order.created.v1", "t1", H_OK, "POISONED", 13},
    {E("008"), "{\"order\":8}", NULL, "order.created.v1", "t2", H_FAIL, "FAILED", 14},
    {E("008"), "{\"order\":8}", NULL, "order.created.v1", "t2", H_OK, "APPLIED", 14},
    {E("011"), "not json", NULL, "order.created.v1", "t1", H_POISON, "POISONED", 15},
    /* issue 46, item 4: a copy whose body does not match its digest header comes first and is
     * parked under its own digest; the genuine copy is applied (it was "already parked"), once */
    {E("012"), "{\"order\":12}?", "{\"order\":12}", "order.created.v1", "t1", H_OK, "POISONED", 16},
    {E("012"), "{\"order\":12}", NULL, "order.created.v1", "t1", H_OK, "APPLIED", 17},
    {E("012"), "{\"order\":12}", NULL, "order.created.v1", "t1", H_OK, "DUPLICATE", 18},
    {E("012"), "{\"order\":12}?", "{\"order\":12}", "order.created.v1", "t1", H_OK, "POISONED", 19},
};
#define N_SCRIPT (sizeof script / sizeof script[0])
static const char *const types[] = {"order.created.v1"};
static const char *const tenants[] = {"t1", "t2"};
#define AGG "order/o-7@3"
#define CORR "checkout-7"
#define OCCURRED 1700000000123LL

static const char *outcome_name(obx_inbox_outcome o) {
    static const char *const n[] = {"?",           "APPLIED", "DUPLICATE",
                                    "QUARANTINED", "FAILED",  "POISONED"};
    return (int)o >= 1 && (int)o <= 5 ? n[o] : "?";
}

/* The C side's handler: the effect is a row in fx, made on the inbox's connection. */
static obx_err c_handler(void *user, void *conn, const obx_message *m, const char *key, char *res,
                         size_t cap) {
    const delivery *d = user;
    (void)key;
    if (d->h == H_FAIL) return obx__fail(OBX_EHANDLER, "boom on %s", m->aggregate_id);
    if (d->h == H_POISON) return obx__fail(OBX_EPOISON, "payload is not JSON");
    const char *v[] = {m->event_id};
    PGresult *r =
        PQexecParams(conn, "INSERT INTO fx VALUES ($1, 'effect')", 1, NULL, v, NULL, NULL, 0);
    obx_err e = PQresultStatus(r) == PGRES_COMMAND_OK ? OBX_OK : OBX_ESTORE;
    PQclear(r);
    snprintf(res, cap, "projected %s", m->event_id);
    return e;
}

static void digest_of(const delivery *d, char out[OBX_DIGEST_LEN + 1]) {
    const char *t = d->digest_of ? d->digest_of : d->payload;
    OK(obx_sha256_digest(t, strlen(t), out));
}

static obx_message message_of(const delivery *d, const char *digest) {
    return (obx_message){.event_id = d->event_id,
                         .envelope_gen = 1,
                         .event_type = d->event_type,
                         .tenant = d->tenant,
                         .aggregate_type = "order",
                         .aggregate_id = "o-7",
                         .aggregate_version = 3,
                         .correlation_id = CORR,
                         .occurred_at = OCCURRED,
                         .payload_digest = digest,
                         .payload = d->payload,
                         .payload_len = strlen(d->payload),
                         .topic = "orders",
                         .partition = 0,
                         .offset = d->offset,
                         .attempt_id = d->attempt_id ? d->attempt_id : ATT,
                         .dest_digest = DEST};
}

static const char *c_deliver(obx__store *s, obx_inbox *in, PGconn *conn, const delivery *d) {
    char digest[OBX_DIGEST_LEN + 1];
    digest_of(d, digest);
    obx_message m = message_of(d, digest);
    obx_inbox_result r;
    OK(obx__inbox_process_at(in, &m, c_handler, (void *)d, conn, obx__wall_ms(), 0, NULL, &r));
    (void)s;
    return outcome_name(r.outcome);
}

/* One statement returning one row; its first column into out. NULL on an error (the message
 * into err). */
static const char *q1(PGconn *c, const char *q, int n, const char *const *v, const int *len,
                      const int *fmt, char *out, size_t cap, char *err, size_t ecap) {
    PGresult *r = PQexecParams(c, q, n, NULL, v, len, fmt, 0);
    const char *ret = NULL;
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) >= 1) {
        snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
        ret = out;
    } else if (err)
        snprintf(err, ecap, "%s", PQresultErrorMessage(r));
    else
        fail_msg("%s: %s", q, PQresultErrorMessage(r));
    PQclear(r);
    return ret;
}

#define RECEIVE_SQL                                                                                \
    "SELECT decision FROM obx.inbox_receive($1, $2, 1, $3, 'orders', 0, $4::bigint, $5::bytea, "   \
    "$6, $7, ARRAY['order.created.v1'], ARRAY['t1', 't2'], jsonb_build_object('obx-aggregate', "   \
    "'" AGG "', 'obx-correlation-id', '" CORR "', 'obx-occurred-at', '1700000000123', "            \
    "'obx-attempt-id', $8::text, 'obx-dest-digest', '" DEST "'))"
#define FAILED_SQL                                                                                 \
    "SELECT decision FROM obx.inbox_failed($1, $2, $3, 3, $4::boolean, 1, $5, 'orders', 0, "       \
    "$6::bigint, $7::bytea, $8, $9, jsonb_build_object('obx-aggregate', '" AGG "', "               \
    "'obx-correlation-id', '" CORR "', 'obx-occurred-at', '1700000000123', 'obx-attempt-id', "     \
    "$10::text, 'obx-dest-digest', '" DEST "'), retry_backoff_ms => 0)"

/* The SQL side, as a consumer in any language writes it. */
static const char *sql_deliver(PGconn *c, const char *consumer, const delivery *d, char *out,
                               size_t cap) {
    char digest[OBX_DIGEST_LEN + 1], off[24];
    digest_of(d, digest);
    snprintf(off, sizeof off, "%lld", (long long)d->offset);
    const char *att = d->attempt_id ? d->attempt_id : ATT;
    const char *v[] = {consumer,   d->event_id,   digest,    off,
                       d->payload, d->event_type, d->tenant, att};
    const int len[] = {0, 0, 0, 0, (int)strlen(d->payload), 0, 0, 0};
    const int fmt[] = {0, 0, 0, 0, 1, 0, 0, 0};
    char dec[32];
    sql(c, "BEGIN");
    q1(c, RECEIVE_SQL, 8, v, len, fmt, dec, sizeof dec, NULL, 0);
    if (strcmp(dec, "process")) {
        sql(c, "COMMIT");
        snprintf(out, cap, "%s",
                 !strcmp(dec, "duplicate")     ? "DUPLICATE"
                 : !strcmp(dec, "quarantined") ? "QUARANTINED"
                 : !strcmp(dec, "poisoned")    ? "POISONED"
                                               : dec);
        return out;
    }
    if (d->h == H_OK) {
        const char *fv[] = {d->event_id};
        PGresult *r =
            PQexecParams(c, "INSERT INTO fx VALUES ($1, 'effect')", 1, NULL, fv, NULL, NULL, 0);
        assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
        PQclear(r);
        char res[64], ignored[8];
        snprintf(res, sizeof res, "projected %s", d->event_id);
        const char *av[] = {consumer, d->event_id, res};
        q1(c, "SELECT obx.inbox_applied($1, $2, $3)::text", 3, av, NULL, NULL, ignored,
           sizeof ignored, NULL, 0);
        sql(c, "COMMIT");
        snprintf(out, cap, "APPLIED");
        return out;
    }
    sql(c, "ROLLBACK"); /* the effect, if any, goes with it */
    const char *err = d->h == H_FAIL ? "OBX_EHANDLER: boom on o-7" : "payload is not JSON";
    const char *fv[] = {consumer,  d->event_id, err,        d->h == H_POISON ? "t" : "f",
                        digest,    off,         d->payload, d->event_type,
                        d->tenant, att};
    const int flen[] = {0, 0, 0, 0, 0, 0, (int)strlen(d->payload), 0, 0, 0};
    const int ffmt[] = {0, 0, 0, 0, 0, 0, 1, 0, 0, 0};
    q1(c, FAILED_SQL, 10, fv, flen, ffmt, dec, sizeof dec, NULL, 0);
    snprintf(out, cap, "%s", !strcmp(dec, "retry") ? "FAILED" : "POISONED");
    return out;
}

/* Every inbox table of one database as text, clocks and generated keys left out. */
static char *dump(PGconn *c) {
    static const char *const q[] = {
        "SELECT consumer_id, event_id, payload_digest, event_type, tenant, outcome, result, "
        "topic, partition, \"offset\", envelope_gen, attempt_id, dest_digest FROM obx.obx_inbox "
        "ORDER BY event_id",
        "SELECT consumer_id, topic, partition, \"offset\", event_id, occurred_at FROM "
        "obx.obx_consumer_watermark ORDER BY topic, partition",
        "SELECT consumer_id, event_id, failures, last_error FROM obx.obx_inbox_failure ORDER BY "
        "event_id",
        "SELECT consumer_id, event_id, payload_digest, state, failures, last_error, topic, "
        "partition, \"offset\", headers::jsonb, encode(payload, 'hex') FROM obx.obx_poison "
        "ORDER BY event_id, payload_digest",
        "SELECT consumer_id, event_id, payload_digest, first_digest, reason FROM "
        "obx.obx_inbox_quarantine ORDER BY quarantine_id",
        /* the duplicate's detail names the first receipt's time */
        "SELECT consumer_id, event_id, outcome, regexp_replace(detail, 'applied at "
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{3}Z', 'applied at T') "
        "FROM obx.obx_consume_audit ORDER BY audit_id",
        "SELECT event_id, effect FROM fx ORDER BY event_id, effect"};
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    s[0] = '\0';
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        PGresult *r = PQexec(c, q[i]);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", q[i], PQerrorMessage(c));
        for (int row = 0; row < PQntuples(r); row++) {
            for (int col = 0; col < PQnfields(r); col++) {
                const char *v = PQgetvalue(r, row, col);
                while (len + strlen(v) + 8 > cap) {
                    cap *= 2;
                    s = realloc(s, cap);
                    assert_non_null(s);
                }
                len += (size_t)sprintf(s + len, "%s%s", col ? " | " : "", v);
            }
            s[len++] = '\n';
            s[len] = '\0';
        }
        len += (size_t)sprintf(s + len, "--\n");
        PQclear(r);
    }
    return s;
}

static void test_same_semantics_as_c(void **st) {
    (void)st;
    char dbc[48], dbs_[48], urlc[256], urls[256];
    new_db(dbc, urlc, sizeof urlc);
    new_db(dbs_, urls, sizeof urls);
    PGconn *cc = PQconnectdb(urlc), *sc = PQconnectdb(urls);
    assert_int_equal(PQstatus(cc), CONNECTION_OK);
    assert_int_equal(PQstatus(sc), CONNECTION_OK);
    obx_store *cs;
    OK(obx_store_wrap_pg(cc, &cs));
    obx_inbox_options o = {.consumer_id = "projection",
                           .event_types = types,
                           .n_event_types = 1,
                           .tenants = tenants,
                           .n_tenants = 2,
                           .max_failures = 3,
                           /* the script redelivers at once: no back-off on either side
                            * (test_retry_backoff has it) */
                           .retry_backoff_ms = -1};
    obx_inbox *in;
    OK(obx_inbox_open(cs, &o, &in));
    for (size_t i = 0; i < N_SCRIPT; i++) {
        char got_s[32];
        const char *got_c = c_deliver(cs, in, cc, &script[i]);
        sql_deliver(sc, "projection", &script[i], got_s, sizeof got_s);
        if (strcmp(got_c, script[i].want) || strcmp(got_s, script[i].want))
            fail_msg("delivery %zu (%s): C inbox %s, SQL inbox %s, want %s", i + 1,
                     script[i].event_id, got_c, got_s, script[i].want);
    }
    /* an operator re-drives the poison message of E("007"); each consumer applies it */
    OK(obx_inbox_redrive(cs, "projection", E("007")));
    obx_store *ss;
    OK(obx_store_wrap_pg(sc, &ss));
    OK(obx_inbox_redrive(ss, "projection", E("007")));
    obx_store_close(ss);
    /* C: what consumer.c's redrive does */
    obx__poison_row p;
    OK(cs->m->inbox->poison_get(cs, "projection", E("007"), NULL, &p));
    delivery d7 = script[12];
    d7.h = H_OK;
    char digest[OBX_DIGEST_LEN + 1];
    digest_of(&d7, digest);
    obx_message m = message_of(&d7, digest);
    m.payload = p.payload;
    m.payload_len = p.payload_len;
    obx_inbox_result r;
    OK(obx__inbox_process_at(in, &m, c_handler, &d7, cc, obx__wall_ms(), 0, NULL, &r));
    assert_int_equal(r.outcome, OBX_INBOX_APPLIED);
    OK(cs->m->inbox->poison_set_state(cs, "projection", E("007"), "DONE", obx__wall_ms()));
    free(p.payload);
    free(p.headers_json);
    /* SQL: the re-drive list gives the delivery back as it was parked */
    PGresult *rr = PQexec(sc, "SELECT event_id, payload_digest, \"offset\", "
                              "convert_from(payload, 'UTF8'), event_type, tenant, "
                              "headers->>'obx-aggregate' FROM obx.inbox_redrives('projection')");
    assert_int_equal(PQresultStatus(rr), PGRES_TUPLES_OK);
    assert_int_equal(PQntuples(rr), 1);
    assert_string_equal(PQgetvalue(rr, 0, 0), E("007"));
    assert_string_equal(PQgetvalue(rr, 0, 1), digest);
    assert_string_equal(PQgetvalue(rr, 0, 2), "13");
    assert_string_equal(PQgetvalue(rr, 0, 3), d7.payload);
    assert_string_equal(PQgetvalue(rr, 0, 6), AGG);
    PQclear(rr);
    char got[32];
    sql_deliver(sc, "projection", &d7, got, sizeof got);
    assert_string_equal(got, "APPLIED");
    assert_int_equal(qint(sc, "SELECT count(*) FROM obx.inbox_redrives('projection')"), 0);
    assert_int_equal(qint(sc, "SELECT count(*) FROM obx.obx_poison WHERE state = 'DONE'"), 1);

    char *a = dump(cc), *b = dump(sc);
    if (strcmp(a, b)) {
        FILE *fa = fopen("test_inbox_sql.c.txt", "w"), *fb = fopen("test_inbox_sql.sql.txt", "w");
        if (fa) fputs(a, fa);
        if (fb) fputs(b, fb);
        if (fa) fclose(fa);
        if (fb) fclose(fb);
        fprintf(stderr, "---- C inbox\n%s---- SQL inbox\n%s", a, b);
        fail_msg("the SQL inbox's rows differ from the C inbox's");
    }
    /* each applied event's effect exactly once: 001 002 007 008 009 010 012 */
    assert_int_equal(qint(sc, "SELECT count(*) FROM fx"), 7);
    assert_int_equal(qint(sc, "SELECT count(DISTINCT event_id) FROM fx"), 7);
    /* 012's corrupt copy stays parked under the digest of its own bytes */
    assert_int_equal(qint(sc,
                          "SELECT count(*) FROM obx.obx_poison WHERE event_id = '" E(
                              "012") "' AND state = 'PARKED' AND payload_digest = "
                                     "obx._poison_digest(convert_to('{\"order\":12}?', 'UTF8'))"),
                     1);
    /* the handler's run time is measured, not left as the placeholder */
    assert_int_equal(qint(sc, "SELECT count(*) FROM obx.obx_inbox WHERE duration_us < 0 OR "
                              "duration_us > 60000000"),
                     0);
    free(a);
    free(b);
    obx_inbox_close(in);
    obx_store_close(cs);
    PQfinish(cc);
    PQfinish(sc);
    drop_db(dbc);
    drop_db(dbs_);
}

static void test_effect_key_matches_c(void **st) {
    (void)st;
    char db[48], url[256];
    new_db(db, url, sizeof url);
    PGconn *c = PQconnectdb(url);
    const char *cases[][3] = {{"projection", E("001"), "charge"},
                              {"billing", E("002"), "effect"},
                              {"b", E("003"), "e-mail \xc3\xa9"}};
    for (size_t i = 0; i < 3; i++) {
        char want[68], got[80];
        OK(obx_inbox_effect_key(cases[i][0], cases[i][1], cases[i][2], want));
        q1(c, "SELECT obx.inbox_effect_key($1, $2, $3)", 3, cases[i], NULL, NULL, got, sizeof got,
           NULL, 0);
        assert_string_equal(got, want);
    }
    PQfinish(c);
    drop_db(db);
}

/* Sends RECEIVE on c without waiting; returns whether it is still waiting after ms. */
static bool still_waiting(PGconn *c, int ms) {
    struct timespec t = {0, 0};
    for (int i = 0; i < ms / 10; i++) {
        t.tv_nsec = 10 * 1000000L;
        nanosleep(&t, NULL);
        PQconsumeInput(c);
        if (!PQisBusy(c)) return false;
    }
    return true;
}

static void test_concurrent_instances(void **st) {
    (void)st;
    char db[48], url[256];
    new_db(db, url, sizeof url);
    PGconn *a = PQconnectdb(url), *b = PQconnectdb(url);
    for (int round = 0; round < 2; round++) {
        bool commit = round == 0;
        const delivery d = {commit ? E("021") : E("022"),
                            "{\"order\":21}",
                            NULL,
                            "order.created.v1",
                            "t1",
                            H_OK,
                            "",
                            21};
        char digest[OBX_DIGEST_LEN + 1], dec[32];
        digest_of(&d, digest);
        const char *v[] = {"projection", d.event_id,   digest,   "21",
                           d.payload,    d.event_type, d.tenant, ATT};
        const int len[] = {0, 0, 0, 0, (int)strlen(d.payload), 0, 0, 0};
        const int fmt[] = {0, 0, 0, 0, 1, 0, 0, 0};
        sql(a, "BEGIN");
        q1(a, RECEIVE_SQL, 8, v, len, fmt, dec, sizeof dec, NULL, 0);
        assert_string_equal(dec, "process");
        /* instance b gets the same message (a redelivery to another consumer instance) */
        sql(b, "BEGIN");
        assert_int_equal(PQsendQueryParams(b, RECEIVE_SQL, 8, NULL, v, len, fmt, 0), 1);
        assert_true(still_waiting(b, 300)); /* held by a's receipt */
        if (commit) {
            sql(a, "INSERT INTO fx VALUES ('" E("021") "', 'effect')");
            sql(a, "SELECT obx.inbox_applied('projection', '" E("021") "', 'done')");
            sql(a, "COMMIT");
        } else {
            sql(a, "ROLLBACK"); /* a crashed before its commit */
        }
        PGresult *r = PQgetResult(b);
        assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
        assert_string_equal(PQgetvalue(r, 0, 0), commit ? "duplicate" : "process");
        PQclear(r);
        while ((r = PQgetResult(b))) PQclear(r);
        if (!commit) {
            sql(b, "INSERT INTO fx VALUES ('" E("022") "', 'effect')");
            sql(b, "SELECT obx.inbox_applied('projection', '" E("022") "', 'done')");
        }
        sql(b, "COMMIT");
    }
    assert_int_equal(qint(a, "SELECT count(*) FROM fx"), 2);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_inbox WHERE outcome = 'APPLIED'"), 2);
    PQfinish(a);
    PQfinish(b);
    drop_db(db);
}

static void test_receipt_must_be_completed(void **st) {
    (void)st;
    char db[48], url[256];
    new_db(db, url, sizeof url);
    PGconn *c = PQconnectdb(url);
    const delivery d = {E("031"), "{\"o\":31}", NULL, "order.created.v1", "t1", H_OK, "", 31};
    char digest[OBX_DIGEST_LEN + 1], dec[32], err[512];
    digest_of(&d, digest);
    const char *v[] = {"projection", d.event_id,   digest,   "31",
                       d.payload,    d.event_type, d.tenant, ATT};
    const int len[] = {0, 0, 0, 0, (int)strlen(d.payload), 0, 0, 0};
    const int fmt[] = {0, 0, 0, 0, 1, 0, 0, 0};
    sql(c, "BEGIN");
    q1(c, RECEIVE_SQL, 8, v, len, fmt, dec, sizeof dec, NULL, 0);
    assert_string_equal(dec, "process");
    PGresult *r = PQexec(c, "COMMIT"); /* without inbox_applied */
    assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
    assert_non_null(strstr(PQresultErrorMessage(r), "did not call obx.inbox_applied()"));
    PQclear(r);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_inbox"), 0);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_consumer_watermark"), 0);
    /* inbox_applied without a receive in the same transaction */
    const char *av[] = {"projection", d.event_id};
    assert_null(q1(c, "SELECT obx.inbox_applied($1, $2)::text", 2, av, NULL, NULL, dec, sizeof dec,
                   err, sizeof err));
    assert_non_null(strstr(err, "was not received by consumer projection in this transaction"));
    PQfinish(c);
    drop_db(db);
}

static void test_consumer_role(void **st) {
    (void)st;
    char db[48], url[256], curl[300];
    new_db(db, url, sizeof url);
    obx_store *s;
    OK(obx_store_open(url, &s));
    OK(obx_store_create_roles(s, "obxisql"));
    obx_store_close(s);
    PGconn *o = PQconnectdb(url);
    sql(admin, "DROP ROLE IF EXISTS obx_isql_cons");
    sql(admin, "CREATE ROLE obx_isql_cons LOGIN IN ROLE obxisql_consumer");
    sql(o, "INSERT INTO obx.obx_consumer_grant VALUES ('obx_isql_cons', 'projection', 't1')");
    sql(o, "GRANT SELECT, INSERT ON fx TO obx_isql_cons");
    snprintf(curl, sizeof curl, "postgres://obx_isql_cons@127.0.0.1:%s/%s", port, db);
    PGconn *c = PQconnectdb(curl);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    char got[32], err[512], dec[32];
    delivery d = {E("041"), "{\"o\":41}", NULL, "order.created.v1", "t1", H_OK, "", 41};
    assert_string_equal(sql_deliver(c, "projection", &d, got, sizeof got), "APPLIED");
    assert_string_equal(sql_deliver(c, "projection", &d, got, sizeof got), "DUPLICATE");
    /* a tenant the role is not granted: the database refuses the receipt, parked */
    delivery d2 = {E("042"), "{\"o\":42}", NULL, "order.created.v1", "t2", H_OK, "", 42};
    assert_string_equal(sql_deliver(c, "projection", &d2, got, sizeof got), "POISONED");
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_poison WHERE last_error LIKE "
                             "'the consumer''s database refused the receipt: %'"),
                     1);
    assert_int_equal(qint(c, "SELECT count(*) FROM fx"), 1);
    /* another consumer ID: refused outright, nothing written */
    char digest[OBX_DIGEST_LEN + 1];
    digest_of(&d, digest);
    const char *v[] = {"billing", d.event_id, digest, "41", d.payload, d.event_type, d.tenant, ATT};
    const int len[] = {0, 0, 0, 0, (int)strlen(d.payload), 0, 0, 0};
    const int fmt[] = {0, 0, 0, 0, 1, 0, 0, 0};
    sql(c, "BEGIN");
    assert_null(q1(c, RECEIVE_SQL, 8, v, len, fmt, dec, sizeof dec, err, sizeof err));
    assert_non_null(strstr(err, "row-level security"));
    sql(c, "ROLLBACK");
    /* the outbox is out of reach */
    PGresult *r = PQexec(c, "SELECT count(*) FROM obx.obx_event");
    assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
    assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42501");
    PQclear(r);
    PQfinish(c);
    PQfinish(o);
    drop_db(db);
    sql(admin, "DROP ROLE IF EXISTS obx_isql_cons");
}

/* A delivery recorded through obx.inbox_receive() is a critical consumer's evidence for the
 * reconciler (obx__consumer_evidence, as `obx resolve --accept --from-consumer` and the relay
 * consult it): the receipt carries the generation, attempt and destination digest of the
 * message's headers. A receipt of another generation or destination, or without a well-formed
 * attempt, proves nothing. */
static void test_sql_receipt_is_evidence(void **st) {
    (void)st;
    char db[48], url[256], got[32];
    new_db(db, url, sizeof url);
    PGconn *c = PQconnectdb(url);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    delivery d = {E("061"), "{\"o\":61}", NULL, "order.created.v1", "t1", H_OK, "", 61, NULL};
    assert_string_equal(sql_deliver(c, "projection", &d, got, sizeof got), "APPLIED");
    delivery bad = {E("062"), "{\"o\":62}", NULL, "order.created.v1",  "t1",
                    H_OK,     "",           62,   "att-not-an-attempt"};
    assert_string_equal(sql_deliver(c, "projection", &bad, got, sizeof got), "APPLIED");
    obx_store *s;
    OK(obx_store_open(url, &s));
    obx__critical cs = {.s = s};
    obx__strlcpy(cs.id, "projection", sizeof cs.id);
    obx__event_row row;
    memset(&row, 0, sizeof row);
    obx__strlcpy(row.env.event_id, d.event_id, sizeof row.env.event_id);
    row.envelope_gen = 1;
    obx__strlcpy(row.dest_digest, DEST, sizeof row.dest_digest);
    obx__strlcpy(row.dest.cluster, "local", sizeof row.dest.cluster);
    obx__outcome o;
    bool found = false;
    char who[64] = "";
    OK(obx__consumer_evidence(&cs, 1, &row, &o, &found, who, sizeof who));
    assert_true(found);
    assert_string_equal(who, "projection");
    assert_int_equal(o.kind, OBX__OUT_ACK);
    assert_string_equal(o.event_id, d.event_id);
    assert_int_equal(o.envelope_gen, 1);
    assert_string_equal(o.attempt_id, ATT);
    assert_string_equal(o.dest_digest, DEST);
    assert_string_equal(o.topic, "orders");
    assert_int_equal(o.offset, 61);
    char digest[OBX_DIGEST_LEN + 1];
    digest_of(&d, digest);
    assert_string_equal(o.payload_digest, digest);
    /* another envelope generation or destination: not evidence for it */
    row.envelope_gen = 2;
    OK(obx__consumer_evidence(&cs, 1, &row, &o, &found, NULL, 0));
    assert_false(found);
    row.envelope_gen = 1;
    row.dest_digest[OBX_DIGEST_LEN - 1] = row.dest_digest[OBX_DIGEST_LEN - 1] == '0' ? '1' : '0';
    OK(obx__consumer_evidence(&cs, 1, &row, &o, &found, NULL, 0));
    assert_false(found);
    /* a malformed attempt header: an ordinary receipt */
    obx__strlcpy(row.dest_digest, DEST, sizeof row.dest_digest);
    obx__strlcpy(row.env.event_id, bad.event_id, sizeof row.env.event_id);
    OK(obx__consumer_evidence(&cs, 1, &row, &o, &found, NULL, 0));
    assert_false(found);
    assert_int_equal(
        qint(c, "SELECT count(*) FROM obx.obx_inbox WHERE event_id = '" E(
                    "062") "' "
                           "AND envelope_gen = 0 AND attempt_id = '' AND dest_digest = ''"),
        1);
    obx_store_close(s);
    PQfinish(c);
    drop_db(db);
}

/* The retry back-off in SQL (issue 51, item 1): obx.inbox_failed() returns when to try again
 * (retry_backoff_ms * 2^(n-1) +-20 %) and keeps it in the failure row; obx.inbox_receive()
 * answers 'delayed' until then (the handler must not run) and 'process' once it is due; a
 * RETRY_SCHEDULED audit row per retry, its detail as the C inbox writes it. */
static void test_retry_backoff(void **st) {
    (void)st;
    char db[48], url[256], dec[64];
    new_db(db, url, sizeof url);
    PGconn *c = PQconnectdb(url);
#define FAIL_BO                                                                                    \
    "FROM obx.inbox_failed('c', '" E("061") "', 'boom', 5, false, retry_backoff_ms => 1000, "      \
                                            "retry_backoff_max_ms => 8000)"
#define RECV_BO                                                                                    \
    "SELECT decision FROM obx.inbox_receive('c', '" E(                                             \
        "061") "', 1, 'sha256:' || "                                                               \
               "encode(sha256('\\x01'::bytea), 'hex'), 't', 0, 1, '\\x01'::bytea, "                \
               "'order.created.v1', "                                                              \
               "'t1')"
    /* the first failure: due in 1 s +-20 % (ms, from the server's clock) */
    long long d1 = qint(c, "SELECT (extract(epoch FROM retry_at) * 1000)::bigint - "
                           "obx._inbox_ms() " FAIL_BO);
    assert_true(d1 >= 700 && d1 <= 1200);
    /* the schedule is the failure row's */
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_inbox_failure WHERE next_at > "
                             "obx._inbox_ms() + 500"),
                     1);
    assert_non_null(q1(c, RECV_BO, 0, NULL, NULL, NULL, dec, sizeof dec, NULL, 0));
    assert_string_equal(dec, "delayed");
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_inbox"), 0); /* nothing written */
    /* the second: 2 s +-20 % */
    long long d2 = qint(c, "SELECT (extract(epoch FROM retry_at) * 1000)::bigint - "
                           "obx._inbox_ms() " FAIL_BO);
    assert_true(d2 >= 1500 && d2 <= 2400);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_consume_audit WHERE outcome = "
                             "'RETRY_SCHEDULED' AND detail IN ('retry 1 scheduled: back-off 1000 "
                             "ms +-20 %', 'retry 2 scheduled: back-off 2000 ms +-20 %')"),
                     2);
    /* once due: processed */
    sql(c, "UPDATE obx.obx_inbox_failure SET next_at = next_at - 10000");
    sql(c, "BEGIN");
    assert_non_null(q1(c, RECV_BO, 0, NULL, NULL, NULL, dec, sizeof dec, NULL, 0));
    assert_string_equal(dec, "process");
    sql(c, "ROLLBACK");
    /* the inbox's clock is never ahead of the server's: floored, as the C library's (a rounded
     * one was up to 0.5 ms ahead half the time, and a retry due at once was then not due) */
    assert_int_equal(qint(c,
                          "SELECT count(*) FROM generate_series(1, 20000) g WHERE "
                          "obx._inbox_ms() > floor(extract(epoch FROM clock_timestamp()) * 1000) "
                          "OR obx._inbox_us() > floor(extract(epoch FROM clock_timestamp()) * "
                          "1000000)"),
                     0);
    /* without back-off: due at once, no RETRY_SCHEDULED row */
    assert_int_equal(qint(c, "SELECT (retry_at <= clock_timestamp())::int FROM obx.inbox_failed("
                             "'c', '" E("062") "', 'boom', 5, false, retry_backoff_ms => 0)"),
                     1);
    assert_int_equal(qint(c, "SELECT count(*) FROM obx.obx_consume_audit WHERE event_id = '" E(
                                 "062") "' AND outcome = 'RETRY_SCHEDULED'"),
                     0);
#undef FAIL_BO
#undef RECV_BO
    PQfinish(c);
    drop_db(db);
}

static void test_bad_input(void **st) {
    (void)st;
    char db[48], url[256];
    new_db(db, url, sizeof url);
    PGconn *c = PQconnectdb(url);
    char dec[32], err[512];
    static const struct {
        const char *q, *want;
    } cases[] = {
        {"SELECT decision FROM obx.inbox_receive('a b', '" E(
             "051") "', 1, 'x', 't', 0, 1, "
                    "'\\x01', 'order.created.v1', 't1')",
         "consumer_id: byte 0x20 at offset 1 is outside the allowed set"},
        {"SELECT decision FROM obx.inbox_receive(NULL, '" E(
             "051") "', 1, 'x', 't', 0, 1, "
                    "'\\x01', 'order.created.v1', 't1')",
         "consumer_id: missing"},
        {"SELECT decision FROM obx.inbox_failed('c', '" E("051") "', 'e', 0)",
         "max_failures: 0 outside 1..1000"},
        {"SELECT decision FROM obx.inbox_failed('c', 'nope', 'e')",
         "event_id: 'nope' is not an obx event ID"},
        {"SELECT decision FROM obx.inbox_failed('c', '" E(
             "051") "', 'e', "
                    "retry_backoff_ms => 2000, retry_backoff_max_ms => 1000)",
         "retry_backoff_ms: 2000, retry_backoff_max_ms: 1000: each 0..86400000 ms"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_null(q1(c, cases[i].q, 0, NULL, NULL, NULL, dec, sizeof dec, err, sizeof err));
        if (!strstr(err, cases[i].want))
            fail_msg("%s: %s, want %s", cases[i].q, err, cases[i].want);
    }
    assert_int_equal(qint(c, "SELECT (SELECT count(*) FROM obx.obx_inbox) + (SELECT count(*) "
                             "FROM obx.obx_poison) + (SELECT count(*) FROM "
                             "obx.obx_consume_audit) + (SELECT count(*) FROM "
                             "obx.obx_inbox_failure)"),
                     0);
    PQfinish(c);
    drop_db(db);
}

int main(void) {
    /* databases a failed earlier run left behind hold grants to the role this test drops */
    obx_t_pg pg;
    if (obx_t_pg_open(&pg, "test_inbox_sql", "obx_isql_")) return 1;
    admin = pg.admin;
    snprintf(port, sizeof port, "%s", pg.port);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_semantics_as_c),
        cmocka_unit_test(test_effect_key_matches_c),
        cmocka_unit_test(test_concurrent_instances),
        cmocka_unit_test(test_receipt_must_be_completed),
        cmocka_unit_test(test_consumer_role),
        cmocka_unit_test(test_sql_receipt_is_evidence),
        cmocka_unit_test(test_retry_backoff),
        cmocka_unit_test(test_bad_input),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    PQfinish(admin);
    return rc;
}

/*
 * test_bad_input.c — hostile and broken input across the product, one test per input: what
 * the fuzz targets (fuzz/) found, kept as regression tests, and the cases of issue 11 that
 * have no server behind them. Every refusal names what was wrong and stores nothing; every
 * message is printable; no secret shows.
 *
 *   URLs            malformed parts, control bytes, passwords with reserved characters
 *   secrets         ${NAME} / ${file:PATH} references, constant-time comparison
 *   headers         obx headers read back from a broker (NUL, invalid UTF-8, bad aggregate)
 *   enqueue         oversized and empty payloads, invalid UTF-8, SQL metacharacters
 *   configuration   unknown keys, wrong types, NUL bytes, duplicates, two documents, the dump
 *   inbox           malformed deliveries parked as poison, stored text valid UTF-8
 *   missing topic   a destination pointing at a topic the broker does not have (log broker
 *                   with auto_create=0): rejected, parked after max attempts, the rest of the
 *                   batch unaffected (tests/broker/test_broker_hardening.c: the same on Kafka)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include "engine/engine_int.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

obx_err obx__log_broker_create_topic(obx__broker *base, const char *topic, int32_t partitions_n);

/* x fails with code `code` and a message containing `needle`. */
#define REFUSED(x, code, needle)                                                                   \
    do {                                                                                           \
        obx_err e_ = (x);                                                                          \
        if (e_ != (code) || !strstr(obx_errmsg(), needle))                                         \
            fail_msg("%s: got %s '%s', expected %s with '%s'", #x, obx_errname(e_), obx_errmsg(),  \
                     obx_errname(code), needle);                                                   \
        printable(obx_errmsg());                                                                   \
    } while (0)

static void printable(const char *s) {
    size_t n = strlen(s);
    if (obx__utf8_invalid_at((const unsigned char *)s, n) >= 0) fail_msg("invalid UTF-8: %s", s);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) fail_msg("control byte in: %s", s);
}

/* ---- URLs --------------------------------------------------------------------------------------
 */

static void test_url_messages(void **st) {
    (void)st;
    obx__url u;
    /* fuzz_url: the URL was echoed raw (control bytes, invalid UTF-8) */
    REFUSED(obx__url_parse("no-scheme-\x1b[2J\xff", "store", &u), OBX_EURL, "no scheme");
    REFUSED(obx__url_parse("kafka://h:99998\xff\xfe", "broker", &u), OBX_EURL, "port");
    REFUSED(obx__url_parse("mysql\x01://x", "store", &u), OBX_EURL, "unknown scheme");
    REFUSED(obx__url_parse("sqlite:", "store", &u), OBX_EURL, "path after 'sqlite:' is empty");
    /* a password must never show, also when the URL is malformed around it */
    const char *secret = "Zq9-s3cr3t";
    char url[256];
    snprintf(url, sizeof url, "amqp:u:%s@h:5672/", secret); /* '//' forgotten */
    REFUSED(obx__url_parse(url, "broker", &u), OBX_EURL, "followed by '//'");
    assert_null(strstr(obx_errmsg(), secret));
    /* reserved characters in a password: refused without echo, redaction hides it */
    const char *reserved[] = {"amqp://u:pa/%s@h:5672/", "postgres://u:pa?%s@h/db",
                              "amqps://u:pa#%s@h:5671/"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(url, sizeof url, reserved[i], secret);
        obx_err e = obx__url_parse(url, i == 1 ? "store" : "broker", &u);
        assert_int_equal(e, OBX_EURL);
        assert_non_null(strstr(obx_errmsg(), "percent-encode"));
        assert_null(strstr(obx_errmsg(), secret));
        char *red = NULL;
        OK(obx_url_redact(url, &red));
        assert_null(strstr(red, secret));
        obx_free(red);
    }
    /* query parameters named like secrets */
    char *red = NULL;
    snprintf(url, sizeof url, "postgres://h/db?sslpassword=%s&application_name=a@b", secret);
    OK(obx_url_redact(url, &red));
    assert_string_equal(red, "postgres://h/db?sslpassword=***&application_name=a@b");
    obx_free(red);
    /* an empty password is kept as it is (redaction once looped on it: fuzz_url) */
    OK(obx_url_redact("amqp://u:@h:72/", &red));
    assert_string_equal(red, "amqp://u:@h:72/");
    obx_free(red);
    /* an '@' in a parameter is not a credential */
    OK(obx__url_parse("postgres://h:5432/db?application_name=a@b", "store", &u));
    assert_string_equal(u.hosts, "h:5432");
    assert_string_equal(u.password, "");
    OK(obx__url_parse("amqp://u:p@ss@h:5672/v", "broker", &u));
    assert_string_equal(u.password, "p@ss");
    assert_string_equal(u.hosts, "h:5672");
    /* a secret typed as a backend property without its key is not echoed (AMQP echoed it) */
    const char *bare[] = {secret};
    obx__broker *b = NULL;
    const char *brokers[] = {"amqp://u@127.0.0.1:1/", "kafka://127.0.0.1:1"};
    for (int i = 0; i < 2; i++) {
        obx_err e = obx__br_open(brokers[i], bare, 1, &b);
        assert_true(e == OBX_ECONFIG || e == OBX_EUNSUPPORTED); /* a build without the backend */
        assert_null(strstr(obx_errmsg(), secret));
    }
}

/* ---- secrets ------------------------------------------------------------------------------------
 */

static void test_secret_references(void **st) {
    (void)st;
    char *out = NULL;
    setenv("OBX_T_PW", "p@ss/w:rd", 1);
    unsetenv("OBX_T_MISSING");
    OK(obx__secret_expand("postgres://u:${OBX_T_PW}@h/db", true, &out));
    assert_string_equal(out, "postgres://u:p%40ss%2Fw%3Ard@h/db"); /* percent-encoded */
    obx__url u;
    OK(obx__url_parse(out, "store", &u));
    assert_string_equal(u.password, "p@ss/w:rd");
    obx__secret_free(out);
    OK(obx__secret_expand("${OBX_T_PW}", true, &out)); /* a whole value: as it is */
    assert_string_equal(out, "p@ss/w:rd");
    obx__secret_free(out);
    setenv("OBX_T_DIR", "/tmp/a b", 1);
    OK(obx__secret_expand("sqlite:${OBX_T_DIR}/x.db", true, &out)); /* a path: as it is */
    assert_string_equal(out, "sqlite:/tmp/a b/x.db");
    obx__secret_free(out);
    OK(obx__secret_expand("pa$$word $${literal}", true, &out));
    assert_string_equal(out, "pa$$word ${literal}");
    obx__secret_free(out);
    REFUSED(obx__secret_expand("x${OBX_T_MISSING}", true, &out), OBX_ECONFIG,
            "${OBX_T_MISSING}: the environment variable is not set");
    assert_null(out);
    REFUSED(obx__secret_expand("x${OBX_T_PW", true, &out), OBX_ECONFIG, "no closing");
    REFUSED(obx__secret_expand("${bad name\x1b}", false, &out), OBX_ECONFIG, "expected ${NAME}");
    /* files: one trailing newline dropped, NUL and oversize refused, value never shown */
    char path[] = "/tmp/obx-secret-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "s3cr3t-from-file\n", 17), 17);
    close(fd);
    char ref[64];
    snprintf(ref, sizeof ref, "${file:%s}", path);
    OK(obx__secret_expand(ref, false, &out));
    assert_string_equal(out, "s3cr3t-from-file");
    obx__secret_free(out);
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "a\0b", 3), 3);
    close(fd);
    REFUSED(obx__secret_expand(ref, false, &out), OBX_ECONFIG, "contains a NUL byte");
    unlink(path);
    REFUSED(obx__secret_expand(ref, false, &out), OBX_ECONFIG, "cannot open");
    REFUSED(obx__secret_expand("${file:/dev/null}", false, &out), OBX_ECONFIG, "regular file");
    /* constant-time comparison */
    assert_true(obx__secret_equal("tok", 3, "tok", 3));
    assert_false(obx__secret_equal("tok", 3, "tox", 3));
    assert_false(obx__secret_equal("tok", 3, "tok!", 4));
    assert_false(obx__secret_equal(NULL, 0, "", 0));
    assert_true(obx__secret_key("sasl.password") && obx__secret_key("ssl.key.pem") &&
                obx__secret_key("sslpassword") && !obx__secret_key("linger.ms"));
}

/* ---- headers from a broker ------------------------------------------------------------------ */

typedef struct hdrs {
    const char *name[16], *value[16];
    size_t len[16], n;
} hdrs;

static const char *hget(void *user, const char *name, size_t *len) {
    hdrs *h = user;
    for (size_t i = 0; i < h->n; i++)
        if (!strcmp(h->name[i], name)) {
            *len = h->len[i];
            return h->value[i];
        }
    return NULL;
}

static void hset(hdrs *h, const char *name, const char *v, size_t len) {
    for (size_t i = 0; i < h->n; i++)
        if (!strcmp(h->name[i], name)) {
            h->value[i] = v;
            h->len[i] = len;
            return;
        }
    h->name[h->n] = name;
    h->value[h->n] = v;
    h->len[h->n++] = len;
}

static void valid_headers(hdrs *h) {
    static const char d[] =
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    memset(h, 0, sizeof *h);
#define H(n, v) hset(h, n, v, strlen(v))
    H(OBX__H_EVENT_ID, "evt-01HZX3K9QW8E7R6T5Y4V3J201P");
    H(OBX__H_ENVELOPE_GEN, "1");
    H(OBX__H_ATTEMPT_ID, "att-01HZX3K9QW8E7R6T5Y4V3J201Q");
    H(OBX__H_PAYLOAD_DIGEST, d);
    H(OBX__H_DEST_DIGEST, d);
    H(OBX__H_EVENT_TYPE, "order.created.v1");
    H(OBX__H_TENANT, "t1");
    H(OBX__H_AGGREGATE, "order/o-1@7");
#undef H
}

static void header_refused(hdrs *h, const char *needle) {
    obx__delivery d;
    memset(&d, 0, sizeof d);
    REFUSED(obx__headers_parse(hget, h, &d), OBX_EINVAL, needle);
    assert_non_null(strstr(d.header_error, needle));
    printable(d.header_error);
}

static void test_headers(void **st) {
    (void)st;
    hdrs h;
    valid_headers(&h);
    obx__delivery d;
    memset(&d, 0, sizeof d);
    OK(obx__headers_parse(hget, &h, &d));
    assert_string_equal(d.env.aggregate_id, "o-1");
    /* fuzz_headers: the aggregate type was only checked as text */
    hset(&h, OBX__H_AGGREGATE, "or der/o-1@7", 12);
    header_refused(&h, "aggregate type");
    hset(&h, OBX__H_AGGREGATE, "/o-1@7", 6);
    header_refused(&h, "aggregate type");
    hset(&h, OBX__H_AGGREGATE, "order/@7", 8);
    header_refused(&h, "aggregate id");
    hset(&h, OBX__H_AGGREGATE, "order/o@99999999999999999999", 28); /* overflowed to max */
    header_refused(&h, "version");
    hset(&h, OBX__H_AGGREGATE, "order/o@ 7", 10);
    header_refused(&h, "version");
    hset(&h, OBX__H_AGGREGATE, "order/a/b@c@9223372036854775807", 31);
    memset(&d, 0, sizeof d);
    OK(obx__headers_parse(hget, &h, &d));
    assert_string_equal(d.env.aggregate_id, "a/b@c");
    assert_true(d.env.aggregate_version == INT64_MAX);
    valid_headers(&h);
    hset(&h, OBX__H_TENANT,
         "t\0"
         "1",
         3);
    header_refused(&h, "NUL");
    valid_headers(&h);
    hset(&h, OBX__H_CORRELATION_ID, "c\xc3\x28", 3);
    header_refused(&h, "invalid UTF-8");
    valid_headers(&h);
    hset(&h, OBX__H_ENVELOPE_GEN, "99999999999999999999", 20);
    header_refused(&h, "not an integer");
    valid_headers(&h);
    hset(&h, OBX__H_EVENT_ID, "evt-\x1b[31m\xff", 10);
    header_refused(&h, "obx-event-id: byte 0x1b");
}

/* ---- enqueue -------------------------------------------------------------------------------- */

static obx__store *mem_store(void) {
    obx__store *s;
    OK(obx__st_open("sqlite::memory:", &s));
    OK(obx_store_init(s));
    obx_route r = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx__route_set_at(s, &r, 1700000000000, NULL));
    return s;
}

static int64_t events(obx__store *s) {
    obx__store_stats st;
    OK(s->m->read->stats(s, &st));
    int64_t n = 0;
    for (int i = 0; i < OBX__ST_COUNT; i++) n += st.by_state[i];
    return n;
}

static void test_enqueue_bad_input(void **st) {
    (void)st;
    obx__store *s = mem_store();
    char big[300];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    obx_event ok = obx_t_event("order.created.v1", "order", "o-1", "t1", "{}");
    ok.aggregate_version = 1;
    obx_enqueue_result r;
    obx_event ev = ok;
    ev.payload_len = 0;
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_EINVAL, "payload: empty");
    ev = ok;
    ev.payload = NULL;
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_EINVAL, "payload: empty");
    OK(obx_store_set_payload_limit(s, 16));
    ev = ok;
    ev.payload = big;
    ev.payload_len = 17;
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_ETOOBIG,
            "payload: 17 bytes, over the limit of 16");
    OK(obx_store_set_payload_limit(s, OBX_PAYLOAD_DEFAULT_LIMIT));
    ev = ok;
    ev.aggregate_id = "o-\xff\xfe";
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_EINVAL,
            "aggregate_id: invalid UTF-8 at byte 2");
    ev = ok;
    ev.correlation_id = "c\x1b[2J";
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_EINVAL,
            "correlation_id: byte 0x1b");
    ev = ok;
    ev.tenant = "t'; DROP TABLE obx_event;--";
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_EINVAL, "tenant: byte 0x27");
    ev = ok;
    ev.event_type = "Order.Created";
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_EINVAL, "event_type: byte");
    ev = ok;
    ev.aggregate_id = big + 45; /* 254 bytes: fine alone, too long once expanded */
    REFUSED(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r), OBX_ETOOBIG, "aggregate_id (254)");
    assert_int_equal(events(s), 0); /* nothing stored by any refusal */
    /* SQL metacharacters in free text are data: stored and read back byte for byte */
    ev = ok;
    ev.aggregate_id = "o'); DELETE FROM obx_event; --";
    ev.idempotency_key = "k' OR '1'='1";
    ev.correlation_id = "\"; DROP TABLE x; \xe2\x82\xac";
    OK(obx__enqueue_at(s, &ev, 1700000000001, NULL, &r));
    obx__rows rows = {0};
    const char *id = r.event_id;
    OK(obx__st_load_events(s, &id, 1, 0, &rows));
    assert_string_equal(rows.v[0].env.aggregate_id, ev.aggregate_id);
    assert_string_equal(rows.v[0].env.idempotency_key, ev.idempotency_key);
    assert_string_equal(rows.v[0].env.correlation_id, ev.correlation_id);
    obx__rows_free(&rows);
    assert_int_equal(events(s), 1);
    /* a route for a topic with SQL metacharacters is refused naming the field */
    obx_route rt = {.event_type = "x.y.v1", .cluster = "local", .topic = "t'; --"};
    REFUSED(obx__route_set_at(s, &rt, 1, NULL), OBX_EINVAL, "topic: byte 0x27");
    rt.topic = "t";
    rt.routing_key = "{tenant}{\xff\x1b}";
    REFUSED(obx__route_set_at(s, &rt, 1, NULL), OBX_EINVAL, "routing_key");
    obx__st_close(s);
}

/* ---- configuration -------------------------------------------------------------------------- */

static char cfg_path[64];

static void write_cfg(const char *text, size_t n) {
    FILE *f = fopen(cfg_path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

static void cfg_refused(const char *yaml, size_t n, const char *needle) {
    write_cfg(yaml, n);
    obx_config *c = NULL;
    REFUSED(obx_config_load(cfg_path, &c), OBX_ECONFIG, needle);
    assert_null(c);
}

#define CFG_REFUSED(lit, needle) cfg_refused(lit, sizeof lit - 1, needle)

static void test_config_bad_input(void **st) {
    (void)st;
    /* a "\0" escape used to cut the value short silently */
    CFG_REFUSED("db: \"sqlite:a.db\\0junk\"\n", "db (line 1): contains a NUL byte");
    CFG_REFUSED("relay:\n  aliases: [\"a\\0b\"]\n", "NUL");
    CFG_REFUSED("broker_properties:\n  \"k\\0x\": v\n", "NUL");
    CFG_REFUSED("relay:\n  id: \"r\\x1b[31m\"\n", "relay.id (line 2): value: byte 0x1b");
    CFG_REFUSED("db: sqlite:a.db\ndb: sqlite:b.db\n", "db (line 2): given twice (first on line 1)");
    CFG_REFUSED("relay:\n  batch: 1\n  batch: 2\n", "relay.batch (line 3): given twice");
    CFG_REFUSED("db: sqlite:a.db\n---\ndb: sqlite:b.db\n", "a second YAML document");
    CFG_REFUSED("relay:\n  dispatchers: \"\\x1b[2J\"\n",
                "relay.dispatchers (line 2): value: byte 0x1b");
    CFG_REFUSED("relay:\n  id: \"bad id\"\n", "relay.id: byte 0x20"); /* ECONFIG, not EINVAL */
    CFG_REFUSED("broker_properties: [novalue]\n", "not key=value");
    CFG_REFUSED("\"\\x01key\": 1\n", "\\x01key (line 1): unknown configuration key");
    /* the dump is a configuration: dump -> load -> dump is the same text */
    static const char good[] = "db: postgres://relay:hunter2@db.example:5432/obx\n"
                               "broker: kafka://k1:9092\n"
                               "broker_properties:\n  linger.ms: 5\n  sasl.password: hunter2\n"
                               "  sasl.username: ${KAFKA_USER}\n"
                               "relay:\n  dispatchers: 3\n  aliases: [a, b]\n";
    write_cfg(good, sizeof good - 1);
    obx_config *c = NULL, *c2 = NULL;
    OK(obx_config_load(cfg_path, &c));
    char *d1 = NULL, *d2 = NULL;
    OK(obx_config_dump(c, &d1));
    assert_null(strstr(d1, "hunter2"));
    assert_non_null(strstr(d1, "\"sasl.password=***\""));
    assert_non_null(strstr(d1, "\"sasl.username=${KAFKA_USER}\"")); /* a reference is shown */
    assert_non_null(strstr(d1, "relay:***@db.example"));
    write_cfg(d1, strlen(d1));
    OK(obx_config_load(cfg_path, &c2));
    OK(obx_config_dump(c2, &d2));
    assert_string_equal(d1, d2);
    obx_free(d1);
    obx_free(d2);
    obx_config_free(c);
    obx_config_free(c2);
    /* a whole-URL reference is checked when it is opened, not when it is loaded */
    static const char ref[] = "db: ${OBX_T_DATABASE_URL}\n";
    write_cfg(ref, sizeof ref - 1);
    OK(obx_config_load(cfg_path, &c));
    obx_config_free(c);
}

/* ---- inbox ---------------------------------------------------------------------------------- */

static int applied;

static obx_err h_ok(void *user, void *conn, const obx_message *m, const char *key, char *res,
                    size_t cap) {
    (void)user;
    (void)conn;
    (void)m;
    (void)key;
    applied++;
    snprintf(res, cap, "r\x01\xc3(%s", "\xe2\x82"); /* a careless handler's result */
    return OBX_OK;
}

/* Every TEXT value in the consumer's inbox tables is valid UTF-8 (PostgreSQL's rule). */
static void inbox_text_valid(sqlite3 *db) {
    const char *tables[] = {"obx_inbox", "obx_poison", "obx_consume_audit", "obx_inbox_failure"};
    for (size_t t = 0; t < 4; t++) {
        char sql[64];
        snprintf(sql, sizeof sql, "SELECT * FROM %s", tables[t]);
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
        while (sqlite3_step(s) == SQLITE_ROW)
            for (int c = 0; c < sqlite3_column_count(s); c++)
                if (sqlite3_column_type(s, c) == SQLITE_TEXT &&
                    obx__utf8_invalid_at(sqlite3_column_text(s, c),
                                         (size_t)sqlite3_column_bytes(s, c)) >= 0)
                    fail_msg("%s.%s holds invalid UTF-8", tables[t], sqlite3_column_name(s, c));
        sqlite3_finalize(s);
    }
}

static void test_inbox_bad_deliveries(void **st) {
    (void)st;
    sqlite3 *db;
    assert_int_equal(sqlite3_open(":memory:", &db), SQLITE_OK);
    obx_store *cs;
    OK(obx_store_wrap_sqlite(db, &cs));
    OK(obx_store_init(cs));
    /* fuzz_inbox: a bad second filter list leaked the first one (LeakSanitizer) */
    const char *types[] = {"order.created.v1"}, *tenants[] = {"t\xff"};
    obx_inbox_options bad = {.consumer_id = "c",
                             .event_types = types,
                             .n_event_types = 1,
                             .tenants = tenants,
                             .n_tenants = 1};
    obx_inbox *in = NULL;
    REFUSED(obx_inbox_open(cs, &bad, &in), OBX_EINVAL, "tenants: byte 0xff");
    obx_inbox_options o = {.consumer_id = "c"};
    OK(obx_inbox_open(cs, &o, &in));
    char digest[OBX_DIGEST_LEN + 1];
    obx_message good = obx_t_inbox_message("evt-01HZX3K9QW8E7R6T5Y4V3J201P", "t1", digest);
    good.aggregate_type = "order";
    good.aggregate_id = "o-1";
    struct {
        const char *field, *value, *needle;
    } bad_fields[] = {
        {"tenant", "t\xff", "tenant: byte 0xff"},
        {"event_type", "order.created", "not versioned"},
        {"aggregate_id", "o\x1b[2J", "aggregate_id: byte 0x1b"},
        {"aggregate_type", "a b", "aggregate_type: byte 0x20"},
        {"correlation_id", "c\xc3\x28", "correlation_id: invalid UTF-8"},
        {"topic",
         "or\xff"
         "ders",
         "topic: byte 0xff"},
    };
    obx_inbox_result r;
    for (size_t i = 0; i < sizeof bad_fields / sizeof bad_fields[0]; i++) {
        obx_message m = good;
        char id[OBX_EVENT_ID_LEN + 1];
        snprintf(id, sizeof id, "evt-01HZX3K9QW8E7R6T5Y4V3J20%02zu", i);
        m.event_id = id;
        if (!strcmp(bad_fields[i].field, "tenant")) m.tenant = bad_fields[i].value;
        if (!strcmp(bad_fields[i].field, "event_type")) m.event_type = bad_fields[i].value;
        if (!strcmp(bad_fields[i].field, "aggregate_id")) m.aggregate_id = bad_fields[i].value;
        if (!strcmp(bad_fields[i].field, "aggregate_type")) m.aggregate_type = bad_fields[i].value;
        if (!strcmp(bad_fields[i].field, "correlation_id")) m.correlation_id = bad_fields[i].value;
        if (!strcmp(bad_fields[i].field, "topic")) m.topic = bad_fields[i].value;
        OK(obx_inbox_process(in, &m, h_ok, NULL, db, &r));
        assert_int_equal(r.outcome, OBX_INBOX_POISONED);
        assert_true(r.ack);
        if (!strstr(r.detail, bad_fields[i].needle))
            fail_msg("%s: detail '%s' lacks '%s'", bad_fields[i].field, r.detail,
                     bad_fields[i].needle);
        printable(r.detail);
    }
    /* an empty payload (matching its digest) is not an obx event */
    obx_message m = good;
    char ed[OBX_DIGEST_LEN + 1];
    OK(obx_sha256_digest("", 0, ed));
    m.event_id = "evt-01HZX3K9QW8E7R6T5Y4V3J20AA";
    m.payload = NULL;
    m.payload_len = 0;
    m.payload_digest = ed;
    OK(obx_inbox_process(in, &m, h_ok, NULL, db, &r));
    assert_int_equal(r.outcome, OBX_INBOX_POISONED);
    assert_non_null(strstr(r.detail, "payload: empty"));
    /* a NULL payload with a length is the caller's bug */
    m.payload_len = 3;
    REFUSED(obx_inbox_process(in, &m, h_ok, NULL, db, &r), OBX_EINVAL, "payload is NULL");
    /* unusable event IDs: each parked under its own stable "bad-" key */
    m = good;
    m.event_id = "evt-\x1b[31m\xff";
    OK(obx_inbox_process(in, &m, h_ok, NULL, db, &r));
    assert_int_equal(r.outcome, OBX_INBOX_POISONED);
    printable(r.detail);
    m.event_id = NULL;
    OK(obx_inbox_process(in, &m, h_ok, NULL, db, &r));
    OK(obx_inbox_process(in, &m, h_ok, NULL, db, &r)); /* redelivered: same row */
    char *js = NULL;
    OK(obx_inbox_poison_list(cs, "c", &js));
    int bad_rows = 0;
    for (const char *p = strstr(js, "\"bad-"); p; p = strstr(p + 1, "\"bad-")) bad_rows++;
    assert_int_equal(bad_rows, 2);
    assert_non_null(strstr(js, "\\\\x1b[31m\\\\xff")); /* the header kept, escaped */
    obx_free(js);
    assert_int_equal(applied, 0);
    /* a valid message: applied; the handler's careless result is stored as valid UTF-8 */
    OK(obx_inbox_process(in, &good, h_ok, NULL, db, &r));
    assert_int_equal(r.outcome, OBX_INBOX_APPLIED);
    assert_int_equal(applied, 1);
    printable(r.result);
    inbox_text_valid(db);
    obx_inbox_close(in);
    obx_store_close(cs);
    sqlite3_close(db);
}

/* ---- a destination pointing at a missing topic -------------------------------------------------
 */

static int audit_with(obx__store *s, const char *id, obx__state to, const char *needle) {
    obx__audit_row *a;
    size_t n;
    OK(s->m->load_audit(s, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++) c += a[i].to == to && strstr(a[i].reason, needle) != NULL;
    free(a);
    return c;
}

static void test_missing_topic(void **st) {
    (void)st;
    obx__store *s;
    OK(obx__st_open("sqlite::memory:", &s));
    OK(obx_store_init(s));
    int64_t now = 4102444800000;
    char ids[2][OBX_EVENT_ID_LEN + 1];
    obx_t_missing_topic(s, now, "local", ids);
    obx__broker *b;
    OK(obx__br_open("log::memory:?cluster=local&auto_create=0", NULL, 0, &b));
    OK(obx__log_broker_create_topic(b, "orders", 2));
    obx__dest d = {.algorithm = "murmur2", .routing_key = "k"};
    strcpy(d.topic, "no-such-topic");
    int32_t part = 0;
    REFUSED(obx__br_partition_for(b, &d, &part), OBX_ENOTFOUND,
            "topic 'no-such-topic' does not exist");
    obx__engine e;
    obx_t_engine_backoff(&e, s, b, 100, 200, 1);
    size_t sent = 0, n = 0;
    /* the missing topic does not hold up the rest of the batch */
    OK(obx__engine_dispatch(&e, now, &sent));
    assert_int_equal(sent, 1);
    OK(obx__engine_poll(&e, now, 0, &n));
    obx_t_missing_topic_backoff(s, ids);
    assert_int_equal(audit_with(s, ids[0], OBX__ST_PENDING, "topic 'no-such-topic' does not exist"),
                     1);
    /* after the route's max attempts it is PARKED, visible with its reason */
    obx_t_missing_topic_parks(&e, s, now + 1000, ids[0]);
    assert_int_equal(audit_with(s, ids[0], OBX__ST_PARKED, "does not exist"), 1);
    char *js = NULL;
    OK(obx_inspect(s, ids[0], &js));
    assert_non_null(strstr(js, "no-such-topic"));
    obx_free(js);
    obx__br_close(b);
    obx__st_close(s);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_url_messages),     cmocka_unit_test(test_secret_references),
    cmocka_unit_test(test_headers),          cmocka_unit_test(test_enqueue_bad_input),
    cmocka_unit_test(test_config_bad_input), cmocka_unit_test(test_inbox_bad_deliveries),
    cmocka_unit_test(test_missing_topic),
};

int main(void) { return OBX_T_RUN_WITH_TMPFILE("test_bad_input", tests, cfg_path, "badcfg"); }

/*
 * test_core.c — the pure layer: error list, canonical encodings against the independent
 * vectors, event IDs, field validation, URLs and the whole transition table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/core.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ---- */

static void test_error_list(void **st) {
    (void)st;
    int seen[64] = {0};
#define CHECK(name, num, retr, msg)                                                                \
    assert_true(num < 64);                                                                         \
    assert_int_equal(seen[num], 0);                                                                \
    seen[num] = 1;                                                                                 \
    assert_string_equal(obx_errname(name), #name);                                                 \
    assert_string_equal(obx_strerror(name), msg);                                                  \
    assert_int_equal(obx_err_is_retriable(name), retr);
    OBX_ERROR_LIST(CHECK)
#undef CHECK
    assert_string_equal(obx_strerror((obx_err)999), "unknown error code");
    assert_int_equal(obx__fail(OBX_EINVAL, "tenant: %s", "bad"), OBX_EINVAL);
    assert_string_equal(obx_errmsg(), "tenant: bad");
    obx__fail_prefix(OBX_EINVAL, "enqueue");
    assert_string_equal(obx_errmsg(), "enqueue: tenant: bad");
}

/* ---- canonical encodings vs. tests/data/digest_vectors.json ---- */

static json_t *vectors;

static const char *js(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    assert_non_null(v);
    return json_string_value(v);
}

static void copy(char *dst, size_t cap, const char *src) {
    assert_true(strlen(src) < cap);
    obx__strlcpy(dst, src, cap);
}

static void test_dest_vectors(void **st) {
    (void)st;
    json_t *arr = json_object_get(vectors, "destination"), *v;
    size_t i;
    assert_true(json_array_size(arr) >= 4);
    json_array_foreach(arr, i, v) {
        json_t *f = json_object_get(v, "fields");
        obx__dest d;
        memset(&d, 0, sizeof d);
        copy(d.cluster, sizeof d.cluster, js(f, "cluster"));
        copy(d.topic, sizeof d.topic, js(f, "topic"));
        copy(d.routing_key, sizeof d.routing_key, js(f, "routing_key"));
        copy(d.algorithm, sizeof d.algorithm, js(f, "algorithm"));
        d.route_gen = json_integer_value(json_object_get(f, "route_policy_gen"));
        copy(d.serializer, sizeof d.serializer, js(f, "serializer"));
        copy(d.durability, sizeof d.durability, js(f, "durability"));
        copy(d.required_acks, sizeof d.required_acks, js(f, "required_acks"));
        obx__buf b = {0};
        obx__dest_canonical(&d, &b);
        char *hex = malloc(b.len * 2 + 1);
        obx__hex(b.data, b.len, hex);
        assert_string_equal(hex, js(v, "canonical_hex"));
        free(hex);
        obx__buf_free(&b);
        char dig[OBX_DIGEST_LEN + 1];
        assert_int_equal(obx__dest_digest(&d, dig), OBX_OK);
        assert_string_equal(dig, js(v, "digest"));
        /* one changed field changes the digest */
        d.route_gen++;
        char dig2[OBX_DIGEST_LEN + 1];
        assert_int_equal(obx__dest_digest(&d, dig2), OBX_OK);
        assert_string_not_equal(dig, dig2);
    }
}

/* "envelope": no delay, "envelope_delayed": with not_before (a trailing field only when set) */
static void envelope_vectors(const char *key, size_t at_least) {
    json_t *arr = json_object_get(vectors, key), *v;
    size_t i;
    assert_true(json_array_size(arr) >= at_least);
    json_array_foreach(arr, i, v) {
        json_t *f = json_object_get(v, "fields");
        obx__envelope e;
        memset(&e, 0, sizeof e);
        copy(e.event_id, sizeof e.event_id, js(f, "event_id"));
        e.envelope_gen = (int32_t)json_integer_value(json_object_get(f, "envelope_gen"));
        copy(e.aggregate_type, sizeof e.aggregate_type, js(f, "aggregate_type"));
        copy(e.aggregate_id, sizeof e.aggregate_id, js(f, "aggregate_id"));
        e.aggregate_version = json_integer_value(json_object_get(f, "aggregate_version"));
        copy(e.event_type, sizeof e.event_type, js(f, "event_type"));
        copy(e.payload_schema, sizeof e.payload_schema, js(f, "payload_schema"));
        copy(e.payload_digest, sizeof e.payload_digest, js(f, "payload_digest"));
        copy(e.tenant, sizeof e.tenant, js(f, "tenant"));
        e.occurred_at = json_integer_value(json_object_get(f, "occurred_at"));
        copy(e.created_txid, sizeof e.created_txid, js(f, "created_txid"));
        copy(e.correlation_id, sizeof e.correlation_id, js(f, "correlation_id"));
        copy(e.causation_id, sizeof e.causation_id, js(f, "causation_id"));
        copy(e.traceparent, sizeof e.traceparent, js(f, "traceparent"));
        copy(e.idempotency_key, sizeof e.idempotency_key, js(f, "idempotency_key"));
        e.not_before = json_integer_value(json_object_get(f, "not_before")); /* 0 when absent */
        char dig[OBX_DIGEST_LEN + 1];
        assert_int_equal(obx__envelope_digest(&e, dig), OBX_OK);
        assert_string_equal(dig, js(v, "digest"));
        obx__buf b = {0};
        obx__envelope_canonical(&e, &b);
        char *hex = malloc(b.len * 2 + 1);
        obx__hex(b.data, b.len, hex);
        assert_string_equal(hex, js(v, "canonical_hex"));
        free(hex);
        obx__buf_free(&b);
    }
}

static void test_envelope_vectors(void **st) {
    (void)st;
    envelope_vectors("envelope", 3);
    envelope_vectors("envelope_delayed", 2);
}

static void test_payload_vectors(void **st) {
    (void)st;
    json_t *arr = json_object_get(vectors, "payload"), *v;
    size_t i;
    json_array_foreach(arr, i, v) {
        unsigned char buf[256];
        size_t n;
        assert_int_equal(obx__unhex(js(v, "hex"), buf, sizeof buf, &n), 0);
        char dig[OBX_DIGEST_LEN + 1];
        assert_int_equal(obx_sha256_digest(buf, n, dig), OBX_OK);
        assert_string_equal(dig, js(v, "digest"));
        assert_true(obx__is_digest(dig));
    }
    char dig[OBX_DIGEST_LEN + 1];
    /* SHA-256 of the empty string, a known constant */
    assert_int_equal(obx_sha256_digest("", 0, dig), OBX_OK);
    assert_string_equal(dig,
                        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_routing_key(void **st) {
    (void)st;
    obx__envelope e;
    memset(&e, 0, sizeof e);
    strcpy(e.tenant, "tenant-7");
    strcpy(e.aggregate_type, "order");
    strcpy(e.aggregate_id, "o-42");
    strcpy(e.event_type, "order.created.v2");
    char out[OBX_KEY_MAX + 1];
    assert_int_equal(
        obx__routing_key_expand("{tenant}.{aggregate_type}.{aggregate_id}", &e, out, sizeof out),
        OBX_OK);
    assert_string_equal(out, "tenant-7.order.o-42");
    assert_int_equal(obx__routing_key_expand("x-{event_type}", &e, out, sizeof out), OBX_OK);
    assert_string_equal(out, "x-order.created.v2");
    assert_int_equal(obx__routing_key_expand("{nope}", &e, out, sizeof out), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "routing_key"));
    char small[8];
    assert_int_equal(obx__routing_key_expand("{tenant}{tenant}", &e, small, sizeof small),
                     OBX_ETOOBIG);
}

/* ---- event IDs ---- */

static void test_ulid_monotonic(void **st) {
    (void)st;
    char prev[OBX_EVENT_ID_LEN + 1] = "", cur[OBX_EVENT_ID_LEN + 1];
    int64_t t = 1732800000123;
    for (int i = 0; i < 10000; i++) {
        /* the same millisecond many times, and once a clock step backwards */
        assert_int_equal(obx_event_id_new(i == 5000 ? t - 10 : t + i / 1000, cur), OBX_OK);
        assert_int_equal(obx_event_id_check(cur), OBX_OK);
        assert_int_equal(strlen(cur), OBX_EVENT_ID_LEN);
        assert_true(strcmp(prev, cur) < 0);
        strcpy(prev, cur);
    }
    assert_int_equal(obx__ulid_time(cur + 4), t + 9);
    assert_int_equal(obx_event_id_new(0, cur), OBX_OK); /* system clock */
    assert_int_equal(obx_event_id_check(cur), OBX_OK);
}

static void test_ulid_seeded(void **st) {
    (void)st;
    obx__ulid_gen a = {.seed = 42}, b = {.seed = 42}, c = {.seed = 43};
    char x[27], y[27], z[27];
    for (int i = 0; i < 100; i++) {
        assert_int_equal(obx__ulid_next(&a, 1000 + i / 10, x), OBX_OK);
        assert_int_equal(obx__ulid_next(&b, 1000 + i / 10, y), OBX_OK);
        assert_int_equal(obx__ulid_next(&c, 1000 + i / 10, z), OBX_OK);
        assert_string_equal(x, y);
    }
    assert_string_not_equal(x, z);
    assert_int_equal(obx__ulid_next(&a, -1, x), OBX_EINVAL);
}

static void test_event_id_check(void **st) {
    (void)st;
    assert_int_equal(obx_event_id_check(NULL), OBX_EINVAL);
    assert_int_equal(obx_event_id_check("evt-short"), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "expected 30"));
    assert_int_equal(obx_event_id_check("xyz-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G"), OBX_EINVAL);
    assert_int_equal(obx_event_id_check("evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3U"), OBX_EINVAL); /* U */
    assert_int_equal(obx_event_id_check("evt-81J9ZQ4X5Y6Z7A8B9C0D1E2F3G"), OBX_EINVAL);
    assert_int_equal(obx_event_id_check("evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G"), OBX_OK);
}

/* ---- validation ---- */

static void test_validation(void **st) {
    (void)st;
    assert_int_equal(obx__check_field("tenant", "t-1", 1, 128, OBX__CS_NAME), OBX_OK);
    assert_int_equal(obx__check_field("tenant", NULL, 1, 128, OBX__CS_NAME), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "tenant: missing"));
    assert_int_equal(obx__check_field("tenant", "", 1, 128, OBX__CS_NAME), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "tenant: empty"));
    assert_int_equal(obx__check_field("tenant", "a b", 1, 128, OBX__CS_NAME), OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "offset 1"));
    assert_int_equal(
        obx__check_field("tenant", "x'; DROP TABLE obx_event;--", 1, 128, OBX__CS_NAME),
        OBX_EINVAL);
    char big[300];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(obx__check_field("topic", big, 1, 249, OBX__CS_NAME), OBX_ETOOBIG);
    assert_non_null(strstr(obx_errmsg(), "over the limit of 249"));
    assert_int_equal(obx__check_field("event_type", "order.created.v2", 1, 128, OBX__CS_EVENT_TYPE),
                     OBX_OK);
    assert_int_equal(obx__check_field("event_type", "order.created", 1, 128, OBX__CS_EVENT_TYPE),
                     OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "not versioned"));
    assert_int_equal(obx__check_field("event_type", "Order.created.v2", 1, 128, OBX__CS_EVENT_TYPE),
                     OBX_EINVAL);
    assert_int_equal(obx__check_field("event_type", "order.v", 1, 128, OBX__CS_EVENT_TYPE),
                     OBX_EINVAL);
    /* text: UTF-8 accepted, invalid UTF-8 and control characters refused */
    assert_int_equal(obx__check_field("aggregate_id", "ü-ø-✓", 1, 255, OBX__CS_TEXT), OBX_OK);
    assert_int_equal(obx__check_field("aggregate_id", "a\xc3\x28", 1, 255, OBX__CS_TEXT),
                     OBX_EINVAL);
    assert_non_null(strstr(obx_errmsg(), "invalid UTF-8 at byte 1"));
    assert_int_equal(obx__check_field("aggregate_id", "a\x01", 1, 255, OBX__CS_TEXT), OBX_EINVAL);
    assert_int_equal(obx__check_field("aggregate_id", "\xed\xa0\x80", 1, 255, OBX__CS_TEXT),
                     OBX_EINVAL); /* surrogate */
    assert_int_equal(obx__check_field("aggregate_id", "\xc0\xaf", 1, 255, OBX__CS_TEXT),
                     OBX_EINVAL); /* overlong */
    assert_int_equal(obx__check_field("correlation_id", NULL, 0, 255, OBX__CS_TEXT), OBX_OK);
    assert_true(
        obx__is_digest("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    assert_false(
        obx__is_digest("sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855"));
    assert_false(obx__is_digest("md5:abc"));
}

/* ---- URLs ---- */

static void test_urls(void **st) {
    (void)st;
    obx__url u;
    assert_int_equal(obx__url_parse("sqlite:/tmp/x.db", "store", &u), OBX_OK);
    assert_int_equal(u.scheme, OBX__URL_SQLITE);
    assert_string_equal(u.path, "/tmp/x.db");
    assert_int_equal(obx__url_parse("sqlite::memory:", "store", &u), OBX_OK);
    assert_string_equal(u.path, ":memory:");
    assert_int_equal(
        obx__url_parse("postgres://obx:s3cret@127.0.0.1:5433/db?sslmode=disable", "store", &u),
        OBX_OK);
    assert_int_equal(u.scheme, OBX__URL_POSTGRES);
    assert_string_equal(u.password, "s3cret");
    assert_int_equal(obx__url_parse("log:/tmp/b.db", "broker", &u), OBX_OK);
    assert_int_equal(obx__url_parse("kafka://h1:9092,h2:9093", "broker", &u), OBX_OK);
    assert_string_equal(u.hosts, "h1:9092,h2:9093");
    assert_int_equal(obx__url_parse("amqp://guest:gu%40st@localhost:5672/%2f", "broker", &u),
                     OBX_OK);
    assert_string_equal(u.password, "gu@st");
    assert_string_equal(u.vhost, "/");

    struct {
        const char *url, *kind, *needle;
    } bad[] = {
        {"", "store", "empty"},
        {"mysql://x", "store", "unknown scheme 'mysql'"},
        {"sqlite:", "store", "path after 'sqlite:' is empty"},
        {"postgres:x", "store", "must be followed by '//'"},
        {"kafka://h1", "broker", "needs HOST:PORT"},
        {"kafka://h1:99999", "broker", "outside 1..65535"},
        {"kafka://h1:90x2", "broker", "not a number"},
        {"kafka://h1:9092,", "broker", "ends with ','"},
        {"kafka://u:p@h1:9092", "broker", "no credentials"},
        {"amqp://u:p@h 1:5672/v", "broker", "outside [A-Za-z0-9.-]"},
        {"amqp://u:p%zz@h:5672/v", "broker", "password part is malformed"},
        {"nats://h:1", "broker", "unknown scheme 'nats'"},
        {"noscheme", "broker", "no scheme"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(obx__url_parse(bad[i].url, bad[i].kind, &u), OBX_EURL);
        if (!strstr(obx_errmsg(), bad[i].needle))
            fail_msg("url '%s': message '%s' lacks '%s'", bad[i].url, obx_errmsg(), bad[i].needle);
        assert_null(strstr(obx_errmsg(), "s3cret"));
    }
    char *red = NULL;
    assert_int_equal(obx_url_redact("amqp://guest:s3cret@h:5672/v", &red), OBX_OK);
    assert_string_equal(red, "amqp://guest:***@h:5672/v");
    obx_free(red);
    assert_int_equal(obx_url_redact("postgres://h/db?password=s3cret&x=1", &red), OBX_OK);
    assert_string_equal(red, "postgres://h/db?password=***&x=1");
    obx_free(red);
}

/* ---- the transition table ---- */

static void test_transitions_walk(void **st) {
    (void)st;
    /* every row is allowed, every pair outside the table is not */
    int allowed = 0;
    for (int f = 0; f < OBX__ST_COUNT; f++)
        for (int t = 0; t < OBX__ST_COUNT; t++)
            for (int a = 0; a < OBX__ACT_COUNT; a++) {
                bool in_table = false;
                for (size_t i = 0; i < obx__transition_count; i++)
                    if (obx__transitions[i].from == (obx__state)f &&
                        obx__transitions[i].to == (obx__state)t &&
                        obx__transitions[i].actor == (obx__actor)a)
                        in_table = true;
                assert_int_equal(
                    obx__transition_allowed((obx__state)f, (obx__state)t, (obx__actor)a), in_table);
                allowed += in_table;
            }
    assert_int_equal((size_t)allowed, obx__transition_count); /* no duplicate rows */
    for (size_t i = 0; i < obx__transition_count; i++) {
        assert_non_null(obx__transitions[i].performed_by);
        assert_non_null(obx__transitions[i].why);
    }
}

static void test_transition_invariants(void **st) {
    (void)st;
    for (size_t i = 0; i < obx__transition_count; i++) {
        const obx__transition *t = &obx__transitions[i];
        /* 1. only the acceptor publishes */
        if (t->to == OBX__ST_PUBLISHED) assert_int_equal(t->actor, OBX__ACT_ACCEPTOR);
        /* 2. SENDING only from a claim */
        if (t->to == OBX__ST_SENDING)
            assert_true(t->from == OBX__ST_CLAIMED || t->from == OBX__ST_RETRY_CLAIMED);
        /* 4. nothing leaves PURGED */
        assert_int_not_equal(t->from, OBX__ST_PURGED);
        /* only the producer creates an event; the migrator adds a publish slot (a delivery-set
         * target) to an existing one, into PENDING */
        if (t->from == OBX__ST_NONE)
            assert_true(t->actor == OBX__ACT_PRODUCER ||
                        (t->actor == OBX__ACT_MIGRATOR && t->to == OBX__ST_PENDING));
        /* a possibly-sent event goes to PENDING only on a definite rejection: an UNKNOWN
         * event only when its current attempt's rejection lands late (after the sweep, or
         * while a reconciler holds it), never on a guess */
        if ((t->from == OBX__ST_DISPATCH_UNKNOWN || t->from == OBX__ST_RECONCILING) &&
            t->to == OBX__ST_PENDING &&
            !(strstr(t->why, "rejection") &&
              (t->actor == OBX__ACT_DISPATCHER || t->actor == OBX__ACT_RECONCILER)))
            fail_msg("an UNKNOWN event may not return to PENDING but on a definite rejection");
    }
    /* the spine of docs/design.md, "States" is present */
    assert_true(obx__transition_allowed(OBX__ST_PENDING, OBX__ST_CLAIMED, OBX__ACT_DISPATCHER));
    assert_true(obx__transition_allowed(OBX__ST_CLAIMED, OBX__ST_SENDING, OBX__ACT_DISPATCHER));
    assert_true(obx__transition_allowed(OBX__ST_SENDING, OBX__ST_PUBLISHED, OBX__ACT_ACCEPTOR));
    assert_true(obx__transition_allowed(OBX__ST_PUBLISHED, OBX__ST_RETAINED, OBX__ACT_PURGER));
    assert_true(obx__transition_allowed(OBX__ST_RETAINED, OBX__ST_PURGED, OBX__ACT_PURGER));
    assert_true(
        obx__transition_allowed(OBX__ST_SENDING, OBX__ST_DISPATCH_UNKNOWN, OBX__ACT_SWEEPER));
    assert_true(obx__transition_allowed(OBX__ST_DISPATCH_UNKNOWN, OBX__ST_RECONCILING,
                                        OBX__ACT_RECONCILER));
    assert_true(
        obx__transition_allowed(OBX__ST_RECONCILING, OBX__ST_RETRY_CLAIMED, OBX__ACT_RECONCILER));
    assert_true(
        obx__transition_allowed(OBX__ST_RETRY_CLAIMED, OBX__ST_SENDING, OBX__ACT_RECONCILER));
    assert_true(obx__transition_allowed(OBX__ST_RECONCILING, OBX__ST_DISPATCH_UNKNOWN,
                                        OBX__ACT_RECONCILER));
    /* forbidden examples */
    assert_false(obx__transition_allowed(OBX__ST_PENDING, OBX__ST_PUBLISHED, OBX__ACT_DISPATCHER));
    assert_false(obx__transition_allowed(OBX__ST_SENDING, OBX__ST_PUBLISHED, OBX__ACT_DISPATCHER));
    assert_false(
        obx__transition_allowed(OBX__ST_DISPATCH_UNKNOWN, OBX__ST_PENDING, OBX__ACT_MIGRATOR));
    assert_false(obx__transition_allowed(OBX__ST_PUBLISHED, OBX__ST_PURGED, OBX__ACT_PURGER));
    for (int s = 0; s < OBX__ST_COUNT; s++) {
        assert_int_equal(obx__state_parse(obx__state_name((obx__state)s)), s);
    }
    assert_int_equal(obx__state_parse("BOGUS"), OBX__ST_COUNT);
    for (int s = 0; s < OBX__AT_COUNT; s++)
        assert_int_equal(obx__attempt_state_parse(obx__attempt_state_name((obx__attempt_state)s)),
                         s);
}

static int setup(void **st) {
    (void)st;
    json_error_t err;
    vectors = json_load_file(OBX_TEST_DATA "/digest_vectors.json", 0, &err);
    if (!vectors) fprintf(stderr, "vectors: %s (line %d)\n", err.text, err.line);
    return vectors ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    json_decref(vectors);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_list),       cmocka_unit_test(test_dest_vectors),
        cmocka_unit_test(test_envelope_vectors), cmocka_unit_test(test_payload_vectors),
        cmocka_unit_test(test_routing_key),      cmocka_unit_test(test_ulid_monotonic),
        cmocka_unit_test(test_ulid_seeded),      cmocka_unit_test(test_event_id_check),
        cmocka_unit_test(test_validation),       cmocka_unit_test(test_urls),
        cmocka_unit_test(test_transitions_walk), cmocka_unit_test(test_transition_invariants),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

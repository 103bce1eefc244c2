/*
 * test_config.c — configuration: defaults, YAML over them, flag overrides, and errors that
 * name the key and the line for unknown keys, wrong types and out-of-range values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "obx.h"
#include "support/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

static void write_file(const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Loads yaml as the file's text (it must load) and dumps it into *js (the caller frees it). */
static obx_config *load_dump(const char *yaml, char **js) {
    write_file(yaml);
    obx_config *c;
    assert_int_equal(obx_config_load(path, &c), OBX_OK);
    assert_int_equal(obx_config_dump(c, js), OBX_OK);
    return c;
}

static void test_defaults_and_file(void **st) {
    (void)st;
    char *js;
    obx_config *c = load_dump("# obx relay\n"
                              "db: sqlite:/tmp/x.db\n"
                              "broker: kafka://127.0.0.1:9092\n"
                              "broker_properties:\n"
                              "  linger.ms: 5\n"
                              "  sasl.password: hunter2\n"
                              "relay:\n"
                              "  id: relay-1\n"
                              "  dispatchers: 4\n"
                              "  aliases: [obx, legacy]\n"
                              "  shadow: true\n"
                              "  shadow_topics: [orders-legacy]\n"
                              "http:\n"
                              "  listen: 127.0.0.1:8089\n",
                              &js);
    assert_non_null(strstr(js, "\"relay.dispatchers\": 4"));
    assert_non_null(strstr(js, "\"relay.batch\": 256")); /* default kept */
    assert_non_null(strstr(js, "\"linger.ms=5\""));
    assert_null(strstr(js, "hunter2")); /* secrets never printed */
    assert_non_null(strstr(js, "legacy"));
    assert_non_null(strstr(js, "\"relay.shadow\": true"));
    assert_non_null(strstr(js, "\"relay.shadow_grace_ms\": 60000")); /* default */
    assert_non_null(strstr(js, "orders-legacy"));
    obx_free(js);
    /* flags override the file */
    assert_int_equal(obx_config_set(c, "relay.dispatchers", "8"), OBX_OK);
    assert_int_equal(obx_config_set(c, "relay.dispatchers", "0"), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "relay.dispatchers: 0 is outside 1..64"));
    assert_int_equal(obx_config_set(c, "relay.nope", "1"), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "relay.nope: unknown configuration key"));
    assert_int_equal(obx_config_set(c, "relay.reconciler", "maybe"), OBX_ECONFIG);
    obx_config_free(c);
    assert_int_equal(obx_config_new(&c), OBX_OK);
    assert_int_equal(obx_config_dump(c, &js), OBX_OK);
    assert_non_null(strstr(js, "\"db\": \"sqlite:obx.db\""));
    obx_free(js);
    obx_config_free(c);
}

static void expect_code(obx_err want, const char *yaml, const char *needle) {
    write_file(yaml);
    obx_config *c = NULL;
    obx_err e = obx_config_load(path, &c);
    if (e != want || !strstr(obx_errmsg(), needle))
        fail_msg("yaml:\n%s\ngot %s '%s', expected %s containing '%s'", yaml, obx_errname(e),
                 obx_errmsg(), obx_errname(want), needle);
    assert_null(c);
}

static void expect_error(const char *yaml, const char *needle) {
    expect_code(OBX_ECONFIG, yaml, needle);
}

static void test_errors(void **st) {
    (void)st;
    expect_error("db: sqlite:x\nrelay:\n  dispatchrs: 2\n", "relay.dispatchrs (line 3): unknown");
    expect_error("relay:\n  dispatchers: two\n",
                 "relay.dispatchers (line 2): 'two' is not an integer");
    expect_error("relay:\n  dispatchers: 1000\n", "relay.dispatchers (line 2): 1000 is outside");
    expect_error("relay:\n  aliases: obx\n", "relay.aliases (line 2): expected a list");
    expect_error("db: [a, b]\n", "db (line 1): expected a single value");
    expect_code(OBX_EURL, "db: mysql://x\n", "db: store URL");
    expect_code(OBX_EURL, "broker: nats://h:1\n", "broker: broker URL");
    expect_error("relay: {dispatchers: 2\n", "YAML");
    expect_error("log:\n  format: xml\n", "log.format (line 2): 'xml' is not one of text|json");
    expect_error("relay:\n  backoff_base_ms: 9000\n  backoff_max_ms: 10\n", "backoff_max_ms");
    /* shadow mode (docs/migration.md) */
    expect_error("relay:\n  shadow: perhaps\n",
                 "relay.shadow (line 2): 'perhaps' is not a boolean");
    expect_error("relay:\n  shadow_interval_ms: 5\n",
                 "relay.shadow_interval_ms (line 2): 5 is outside");
    expect_error("relay:\n  shadow_feed: /tmp/feed.jsonl\n", "relay.shadow_feed: given, but");
    expect_code(OBX_ECONFIG, "relay:\n  shadow: true\n  shadow_topics: [\"a b\"]\n",
                "relay.shadow_topics");
    obx_config *c;
    assert_int_equal(obx_config_load("/nonexistent/obx.yaml", &c), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "cannot open"));
}

/* audit.critical_consumers: "ID=URL" items, checked when loaded; flags append whole items */
static void test_critical_consumers(void **st) {
    (void)st;
    expect_error("audit:\n  critical_consumers: [projection]\n",
                 "audit.critical_consumers[0]: 'projection' is not ID=URL");
    expect_error("audit:\n  critical_consumers: ['=sqlite:c.db']\n", "is not ID=URL");
    expect_code(OBX_ECONFIG, "audit:\n  critical_consumers: ['a b=sqlite:c.db']\n",
                "audit.critical_consumers[0]: consumer ID");
    expect_code(OBX_EURL, "audit:\n  critical_consumers: [p=sqlite:c.db, q=mysql://x]\n",
                "audit.critical_consumers[1]: store URL");
    expect_error("audit:\n  critical_consumers: [p=sqlite:a.db, p=sqlite:b.db]\n",
                 "consumer ID 'p' is declared twice");
    expect_error("audit:\n  max_ids: 0\n", "audit.max_ids (line 2): 0 is outside 1..10000");
    expect_error("retention:\n  interval_ms: -1\n", "retention.interval_ms (line 2)");
    char *js;
    obx_config *c =
        load_dump("audit:\n  critical_consumers: [p=sqlite:a.db, 'q=postgres://u@h/d?a=1,2']\n"
                  "  broker_scan_window_ms: 0\nretention:\n  interval_ms: 60000\n",
                  &js);
    assert_non_null(strstr(js, "\"q=postgres://u@h/d?a=1,2\""));
    assert_non_null(strstr(js, "\"retention.interval_ms\": 60000"));
    assert_non_null(strstr(js, "\"audit.broker_scan_window_ms\": 0"));
    obx_free(js);
    /* append keeps a comma inside an item; set would split it */
    assert_int_equal(obx_config_set(c, "audit.critical_consumers", ""), OBX_OK);
    assert_int_equal(obx_config_append(c, "audit.critical_consumers", "r=sqlite:x,y.db"), OBX_OK);
    assert_int_equal(obx_config_dump(c, &js), OBX_OK);
    assert_non_null(strstr(js, "\"r=sqlite:x,y.db\""));
    assert_null(strstr(js, "q=postgres"));
    obx_free(js);
    assert_int_equal(obx_config_append(c, "db", "sqlite:z.db"), OBX_ECONFIG);
    assert_non_null(strstr(obx_errmsg(), "db: not a list"));
    assert_int_equal(obx_config_append(c, "audit.critical_consumers", ""), OBX_ECONFIG);
    assert_int_equal(obx_config_append(c, "nope", "x"), OBX_ECONFIG);
    obx_config_free(c);
}

/* otel.*: off by default (no exporter at all), its bounds, and an exporter that starts and
 * stops with nothing to send (no collector needed) */
static void test_otel_keys(void **st) {
    (void)st;
    obx_config *c;
    obx_otel *o = (obx_otel *)&o; /* must be set to NULL */
    assert_int_equal(obx_config_new(&c), OBX_OK);
    assert_int_equal(obx_otel_open(c, &o), OBX_OK);
    assert_null(o);
    obx_otel_close(NULL);
    obx_store_set_otel(NULL, NULL);
    obx_config_free(c);
    expect_error("otel:\n  queue_max: 0\n", "otel.queue_max (line 2): 0 is outside");
    expect_error("otel:\n  timeout_ms: 5\n", "otel.timeout_ms (line 2): 5 is outside");
    char *js;
    c = load_dump("otel:\n  endpoint: http://127.0.0.1:9/\n  service_name: orders-relay\n", &js);
    assert_non_null(strstr(js, "\"otel.service_name\": \"orders-relay\""));
    assert_non_null(strstr(js, "\"otel.queue_max\": 4096"));
    obx_free(js);
    obx_err e = obx_otel_open(c, &o);
    if (e == OBX_OK) {
        assert_non_null(o);
        obx_otel_close(o); /* nothing queued: returns at once */
    } else {
        assert_int_equal(e, OBX_EUNSUPPORTED); /* built without OBX_WITH_OTEL */
        assert_non_null(strstr(obx_errmsg(), "OBX_WITH_OTEL"));
    }
    obx_config_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_file), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_critical_consumers), cmocka_unit_test(test_otel_keys)};
    return OBX_T_RUN_WITH_TMPFILE("test_config", tests, path, "config");
}

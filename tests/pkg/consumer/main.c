/*
 * main.c — a producer built against an installed libobx (find_package(obx) or pkg-config):
 * obx_consumer SQLITE_PATH commits one event into a fresh outbox and prints
 * "<header version> <library version> <event id> <state>". Exit status 1 on any failure.
 */
#include <obx.h>

#include <stdio.h>
#include <string.h>

static int fail(const char *what, obx_err e) {
    fprintf(stderr, "obx_consumer: %s: %s: %s\n", what, obx_errname(e), obx_errmsg());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: obx_consumer SQLITE_PATH\n");
        return 2;
    }
    char url[1024];
    snprintf(url, sizeof url, "sqlite:%s", argv[1]);
    obx_store *s = NULL;
    obx_err e = obx_store_open(url, &s);
    if (!e) e = obx_store_init(s);
    if (e) return fail("open", e);
    obx_route r = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    if ((e = obx_route_set(s, &r, NULL))) return fail("route", e);
    const char payload[] = "{\"order\":\"o-1\"}";
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = "o-1",
                    .aggregate_version = 1,
                    .tenant = "t1",
                    .payload = payload,
                    .payload_len = strlen(payload)};
    obx_enqueue_result res;
    if ((e = obx_enqueue(s, &ev, &res))) return fail("enqueue", e);
    char *doc = NULL;
    if ((e = obx_inspect(s, res.event_id, &doc))) return fail("inspect", e);
    const char *state = strstr(doc, "\"PENDING\"") ? "PENDING" : "?";
    printf("%s %s %s %s\n", OBX_VERSION_STRING, obx_libversion(), res.event_id, state);
    obx_free(doc);
    obx_store_close(s);
    return strcmp(state, "PENDING") != 0;
}

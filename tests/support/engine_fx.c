/*
 * engine_fx.c — the engine fixture (engine_fx.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

obx_err obx_t_sqlite_store(const char *dir, const char *name, int *count, obx__store **out) {
    char url[256];
    snprintf(url, sizeof url, "sqlite:%s/%s%d.db", dir, name, ++*count);
    obx_err e = obx__st_open(url, out);
    if (!e) e = obx_store_init(*out);
    return e;
}

int64_t obx_t_route(obx__store *s, int64_t now, const char *type, const char *topic, int blind,
                    int max_attempts, const char *alias) {
    obx_route r = {.event_type = type,
                   .cluster = "local",
                   .topic = topic,
                   .on_unknown = blind ? "retry" : "hold",
                   .max_attempts = max_attempts,
                   .alias = alias};
    int64_t gen = 0;
    OK(obx__route_set_at(s, &r, now, &gen));
    return gen;
}

obx_event obx_t_order_event(const char *id, const char *payload) {
    obx_event ev = {.event_type = "order.created.v2",
                    .aggregate_type = "order",
                    .aggregate_id = id,
                    .aggregate_version = 1,
                    .tenant = "tenant-7",
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .correlation_id = "corr-1"};
    return ev;
}

void obx_t_enq(obx__store *s, int64_t now, const char *type, const char *agg, const char *corr,
               const char *payload, char id[31]) {
    char own[64];
    if (!payload) {
        snprintf(own, sizeof own, "{\"order\":\"%s\"}", agg);
        payload = own;
    }
    obx_event ev = {.event_type = type,
                    .aggregate_type = "order",
                    .aggregate_id = agg,
                    .aggregate_version = 1,
                    .tenant = "t1",
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .correlation_id = corr};
    obx_enqueue_result r;
    OK(obx__enqueue_at(s, &ev, now, NULL, &r));
    strcpy(id, r.event_id);
}

void obx_t_engine(obx__engine *e, obx__store *s, obx__broker *b, const char *owner, uint64_t seed,
                  const char *const *aliases, size_t n_aliases) {
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, owner, sizeof c.owner);
    c.lease_ms = 1000;
    c.reconcile_lease_ms = 1000;
    c.recheck_ms = 500;
    c.backoff_base_ms = 100;
    c.seed = seed;
    c.aliases = aliases;
    c.n_aliases = n_aliases;
    OK(obx__engine_init(e, s, b, &c));
}

obx__event_row obx_t_ev(obx__store *s, const char *id, unsigned flags) {
    obx__rows rows = {0};
    OK(obx__st_load_events(s, &id, 1, flags, &rows));
    assert_int_equal(rows.n, 1);
    obx__event_row r = rows.v[0];
    r.payload = NULL;
    obx__rows_free(&rows);
    return r;
}

int obx_t_receipts(obx__store *s, const char *id, obx__receipt_kind k, char *attempt_out,
                   char *reason_out) {
    obx__receipt_row *r;
    size_t n;
    OK(s->m->load_receipts(s, id, &r, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++)
        if (r[i].kind == k) {
            c++;
            if (attempt_out) strcpy(attempt_out, r[i].attempt_id);
            if (reason_out) strcpy(reason_out, r[i].reason);
        }
    free(r);
    return c;
}

int obx_t_attempts(obx__store *s, const char *id, int st) {
    obx__attempt_row *a;
    size_t n;
    OK(obx__st_load_attempts(s, NULL, 0, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++) c += st < 0 || a[i].state == (obx__attempt_state)st;
    free(a);
    return c;
}

int obx_t_audit(obx__store *s, const char *id, int from, int to, const char *needle) {
    obx__audit_row *a;
    size_t n;
    OK(s->m->load_audit(s, id, &a, &n));
    int c = 0;
    for (size_t i = 0; i < n; i++)
        if ((from < 0 || a[i].from == (obx__state)from) && (to < 0 || a[i].to == (obx__state)to) &&
            (!needle || strstr(a[i].reason, needle)))
            c++;
    free(a);
    return c;
}

size_t obx_t_poll_all(obx__engine *e, int64_t now) {
    size_t total = 0, n;
    do {
        OK(obx__engine_poll(e, now, 0, &n));
        total += n;
    } while (n);
    return total;
}

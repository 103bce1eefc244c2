/*
 * kit_handlers.c — consumers for the consumer test kit's own tests: built as a shared library
 * that `obx consumer-test --handler` loads, and compiled into tests/ops/test_ops.c.
 *
 *   obx_kit_good            an order projection done right: effects only through the inbox's
 *                           connection, a conditional upsert that keeps the highest version,
 *                           the payload validated first, an e-mail sent with the inbox's
 *                           effect key as its idempotency key, contracts and tenants declared
 *   obx_kit_broken          the usual mistakes: last writer wins, an e-mail sent outside the
 *                           transaction with no idempotency key, any payload accepted, nothing
 *                           declared
 *   obx_kit_inproc_dedupe   correct but for an in-process "already processed" set (the source
 *                           document forbids it: a crash before the commit loses the effect)
 *
 * The "e-mails" are an in-memory ledger outside the database: an effect the consumer's
 * transaction cannot undo. The library calls no obx function (the obx binary does not export
 * them); it uses SQLite through the connection the inbox hands the handler.
 */
#include "obx.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct ledger {
    char mail[256][96];
    int n;
    char seen[256][32]; /* obx_kit_inproc_dedupe's in-process set */
    int n_seen;
} ledger;

static ledger good_l, broken_l, inproc_l;

static obx_err setup(void *user, void *db) {
    (void)user;
    return sqlite3_exec(db,
                        "CREATE TABLE orders (id TEXT PRIMARY KEY, version INTEGER NOT NULL, "
                        "total INTEGER NOT NULL)",
                        NULL, NULL, NULL) == SQLITE_OK
               ? OBX_OK
               : OBX_ESTORE;
}

static void reset(void *user) {
    ledger *l = user;
    l->n = 0;
    l->n_seen = 0;
}

/* orders rows, then the e-mails sent (sorted: their order is not part of the state) */
static int cmp(const void *a, const void *b) { return strcmp(a, b); }

static obx_err snapshot(void *user, void *db, char **out) {
    ledger *l = user;
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    if (!s) return OBX_ENOMEM;
    len += (size_t)snprintf(s, cap, "orders:\n");
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "SELECT id, version, total FROM orders ORDER BY id", -1, &st,
                           NULL) != SQLITE_OK) {
        free(s);
        return OBX_ESTORE;
    }
    while (sqlite3_step(st) == SQLITE_ROW && len + 200 < cap)
        len += (size_t)snprintf(s + len, cap - len, "  %s v%lld total %lld\n",
                                sqlite3_column_text(st, 0), (long long)sqlite3_column_int64(st, 1),
                                (long long)sqlite3_column_int64(st, 2));
    sqlite3_finalize(st);
    char sorted[256][96];
    memcpy(sorted, l->mail, sizeof sorted);
    qsort(sorted, (size_t)l->n, sizeof sorted[0], cmp);
    len += (size_t)snprintf(s + len, cap - len, "mails:\n");
    for (int i = 0; i < l->n && len + 100 < cap; i++)
        len += (size_t)snprintf(s + len, cap - len, "  %s\n", sorted[i]);
    *out = s;
    return OBX_OK;
}

/* The contract: a JSON object with an integer "total". */
static int parse_total(const obx_message *m, long long *total) {
    const char *p = m->payload;
    size_t n = m->payload_len;
    if (n < 2 || p[0] != '{' || p[n - 1] != '}') return -1;
    char buf[512];
    if (n >= sizeof buf) return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    const char *t = strstr(buf, "\"total\":");
    return t && sscanf(t + 8, "%lld", total) == 1 ? 0 : -1;
}

static obx_err upsert(sqlite3 *db, const obx_message *m, long long total, int keep_highest) {
    sqlite3_stmt *st;
    const char *sql = keep_highest
                          ? "INSERT INTO orders (id, version, total) VALUES (?1, ?2, ?3) ON "
                            "CONFLICT (id) DO UPDATE SET version = excluded.version, total = "
                            "excluded.total WHERE excluded.version > orders.version"
                          : "INSERT INTO orders (id, version, total) VALUES (?1, ?2, ?3) ON "
                            "CONFLICT (id) DO UPDATE SET version = excluded.version, total = "
                            "excluded.total";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) return OBX_ESTORE;
    sqlite3_bind_text(st, 1, m->aggregate_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, m->aggregate_version);
    sqlite3_bind_int64(st, 3, total);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? OBX_OK : OBX_ESTORE;
}

static void send_mail(ledger *l, const char *key, const obx_message *m) {
    char text[96];
    snprintf(text, sizeof text, "order %s v%lld confirmed%s%.40s", m->aggregate_id,
             (long long)m->aggregate_version, key ? " key " : "", key ? key : "");
    for (int i = 0; key && i < l->n; i++)
        if (!strcmp(l->mail[i], text)) return; /* the mail service dedupes by idempotency key */
    if (l->n < 256) snprintf(l->mail[l->n++], sizeof l->mail[0], "%s", text);
}

static obx_err good(void *user, void *db, const obx_message *m, const char *key, char *result,
                    size_t cap) {
    long long total;
    if (parse_total(m, &total)) return OBX_ECONTRACT; /* before any effect */
    obx_err e = upsert(db, m, total, 1);
    if (e) return e;
    send_mail(user, key, m);
    snprintf(result, cap, "order %s at version %lld", m->aggregate_id,
             (long long)m->aggregate_version);
    return OBX_OK;
}

static obx_err broken(void *user, void *db, const obx_message *m, const char *key, char *result,
                      size_t cap) {
    (void)key;
    long long total = 0;
    parse_total(m, &total); /* whatever it was, apply it */
    obx_err e = upsert(db, m, total, 0);
    if (e) return e;
    send_mail(user, NULL, m); /* no idempotency key: every run sends one */
    snprintf(result, cap, "ok");
    return OBX_OK;
}

static obx_err inproc(void *user, void *db, const obx_message *m, const char *key, char *result,
                      size_t cap) {
    ledger *l = user;
    for (int i = 0; i < l->n_seen; i++)
        if (!strcmp(l->seen[i], m->event_id)) return OBX_OK; /* "already processed" */
    if (l->n_seen < 256) snprintf(l->seen[l->n_seen++], sizeof l->seen[0], "%s", m->event_id);
    return good(user, db, m, key, result, cap);
}

/* What every kit consumer below shares: its ID, handler and log; the projection's setup,
 * snapshot and reset. */
#define KIT(id, h, log)                                                                            \
    .consumer_id = id, .handler = h, .user = &log, .setup = setup, .snapshot = snapshot,           \
    .reset = reset

static const char *const types[] = {"order.created.v2"};
static const char *const tenants[] = {"tenant-1"};

EXPORT const obx_consumer_test *obx_kit_good(void) {
    static const obx_consumer_test t = {KIT("orders-good", good, good_l), .event_types = types,
                                        .n_event_types = 1, .tenants = tenants, .n_tenants = 1};
    return &t;
}

EXPORT const obx_consumer_test *obx_kit_broken(void) {
    static const obx_consumer_test t = {KIT("orders-broken", broken, broken_l)};
    return &t;
}

EXPORT const obx_consumer_test *obx_kit_inproc_dedupe(void) {
    static const obx_consumer_test t = {KIT("orders-inproc", inproc, inproc_l),
                                        .event_types = types, .n_event_types = 1,
                                        .tenants = tenants, .n_tenants = 1};
    return &t;
}

/* The default symbol `obx consumer-test --handler LIB.so` looks for. */
EXPORT const obx_consumer_test *obx_consumer_test_spec(void) { return obx_kit_good(); }

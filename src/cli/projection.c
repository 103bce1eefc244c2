/*
 * projection.c — the sample consumer shipped with the CLI: an order projection in the
 * consumer's SQLite database, used by `obx consume` (and the demo) and tested by
 * `obx consumer-test --builtin order-projection`. It declares the contracts and tenants it
 * handles, validates the payload before its effect (a JSON object, else it is parked as poison
 * at once: OBX_EPOISON) and makes its effect
 * only through the inbox's connection, so the inbox's transaction covers it.
 */
#include "cli.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* The sample's declaration, as a consumer in production states it: the one contract whose
 * payload it understands, and the tenants of the sample shop (README's tour, `obx demo`). An
 * older contract or a foreign tenant is refused by the inbox before the handler runs. */
const char *const projection_types[] = {"order.created.v1"};
const size_t projection_n_types = sizeof projection_types / sizeof projection_types[0];
const char *const projection_tenants[] = {"tenant-7", "tenant-9"};
const size_t projection_n_tenants = sizeof projection_tenants / sizeof projection_tenants[0];

obx_err projection_setup(void *user, void *db) {
    (void)user;
    return sqlite3_exec(db,
                        "CREATE TABLE IF NOT EXISTS order_projection (event_id TEXT NOT NULL, "
                        "order_id TEXT NOT NULL, version INTEGER NOT NULL, payload BLOB, "
                        "effect_key TEXT NOT NULL, applied_at INTEGER NOT NULL)",
                        NULL, NULL, NULL) == SQLITE_OK
               ? OBX_OK
               : OBX_ESTORE;
}

obx_err projection_handler(void *user, void *conn, const obx_message *m, const char *effect_key,
                           char *result, size_t cap) {
    projection *p = user;
    if (p && p->fail_permille) {
        p->rng ^= p->rng << 13;
        p->rng ^= p->rng >> 7;
        p->rng ^= p->rng << 17;
        if (p->rng % 1000 < p->fail_permille) return OBX_EHANDLER; /* a flaky downstream */
    }
    /* the contract: a JSON object; anything else is refused before any effect */
    json_t *doc = json_loadb(m->payload, m->payload_len, 0, NULL);
    bool ok = json_is_object(doc);
    json_decref(doc);
    /* no retry can make these bytes an order: park the message at once, visible */
    if (!ok) return obx_error_set(OBX_EPOISON, "payload is not a JSON object");
    /* a plain INSERT, not an upsert: if the inbox ever let an event through twice, the
     * projection would show two rows for it (the demo counts them) */
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(conn,
                           "INSERT INTO order_projection (event_id, order_id, version, payload, "
                           "effect_key, applied_at) VALUES (?, ?, ?, ?, ?, "
                           "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))",
                           -1, &st, NULL) != SQLITE_OK)
        return OBX_ESTORE;
    sqlite3_bind_text(st, 1, m->event_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, m->aggregate_id ? m->aggregate_id : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, m->aggregate_version);
    sqlite3_bind_blob(st, 4, m->payload, (int)m->payload_len, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, effect_key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return OBX_ESTORE;
    snprintf(result, cap, "order %s projected at version %lld",
             m->aggregate_id ? m->aggregate_id : "", (long long)m->aggregate_version);
    return OBX_OK;
}

/* The projection without its clock column (applied_at differs between runs by nature). */
obx_err projection_snapshot(void *user, void *db, char **out) {
    (void)user;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "SELECT event_id, order_id, version, hex(payload), effect_key FROM "
                           "order_projection ORDER BY event_id, version, effect_key",
                           -1, &st, NULL) != SQLITE_OK)
        return OBX_ESTORE;
    size_t len = 0, cap = 256;
    char *s = malloc(cap);
    if (!s) {
        sqlite3_finalize(st);
        return OBX_ENOMEM;
    }
    s[0] = '\0';
    while (sqlite3_step(st) == SQLITE_ROW) {
        char line[1200];
        int n = snprintf(line, sizeof line, "%s %s v%lld %s %s\n", sqlite3_column_text(st, 0),
                         sqlite3_column_text(st, 1), (long long)sqlite3_column_int64(st, 2),
                         sqlite3_column_text(st, 3), sqlite3_column_text(st, 4));
        if (n < 0) continue;
        if (len + (size_t)n + 1 > cap) {
            while (len + (size_t)n + 1 > cap) cap *= 2;
            char *p = realloc(s, cap);
            if (!p) {
                free(s);
                sqlite3_finalize(st);
                return OBX_ENOMEM;
            }
            s = p;
        }
        memcpy(s + len, line, (size_t)n + 1);
        len += (size_t)n;
    }
    sqlite3_finalize(st);
    *out = s;
    return OBX_OK;
}

/*
 * test_retention_pg.c — the audit and retention suite on the PostgreSQL store, against a real
 * server (OBX_TEST_PG_URL, set by scripts/services.sh): every outbox and every critical
 * consumer's database is a fresh database there. Fails, never skips, without a server.
 */
#include "engine/retention_suite.h"
#include "support/pg_fx.h"

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char base_url[1024];
static PGconn *admin;
static int count;
static char created[512][64];

/* base_url with its database replaced by db */
static void db_url(const char *db, char *out, size_t cap) {
    const char *auth = strstr(base_url, "://");
    auth = auth ? auth + 3 : base_url;
    const char *slash = strchr(auth, '/'), *q = strchr(auth, '?');
    size_t head =
        slash ? (size_t)(slash - base_url) : (q ? (size_t)(q - base_url) : strlen(base_url));
    snprintf(out, cap, "%.*s/%s%s", (int)head, base_url, db, q ? q : "");
}

static obx_err factory(obx__store **out) {
    if (count >= 512) return obx__fail(OBX_ESTORE, "test: too many databases");
    char db[64], sql[128], url[1200];
    snprintf(db, sizeof db, "obx_r%d_%d", (int)getpid(), ++count);
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", db);
    PGresult *r = PQexec(admin, sql);
    bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) return obx__fail(OBX_ESTORE, "%s: %s", sql, PQerrorMessage(admin));
    strcpy(created[count - 1], db);
    db_url(db, url, sizeof url);
    obx_err e = obx__st_open(url, out);
    if (!e) e = obx_store_init(*out);
    return e;
}

int main(void) {
    obx_t_pg pg;
    if (obx_t_pg_open(&pg, "test_retention_pg", NULL)) return 1;
    snprintf(base_url, sizeof base_url, "%s", pg.url);
    admin = pg.admin;
    int failed = retention_suite_run("retention and audit: postgres", factory, 1000);
    for (int i = 0; i < count; i++) obx_t_pg_drop_db(admin, created[i]);
    PQfinish(admin);
    return failed;
}

/*
 * pg_fx.h — the PostgreSQL fixture, written once for the suites that talk to the server
 * themselves (test_store_pg.c, test_pg_security.c, test_pg_hardening.c, test_inbox_sql.c,
 * test_retention_pg.c) (issue 47, item 5): the server named by OBX_TEST_PG_URL, a superuser
 * session on it, statements whose failure fails the running test, fresh databases.
 *
 * A suite without OBX_TEST_PG_URL fails, never skips (scripts/services.sh starts a server).
 * obx_t_pg_sql, obx_t_pg_qint and obx_t_pg_connect call cmocka's fail_msg: only inside a test.
 */
#ifndef OBX_TEST_PG_FX_H
#define OBX_TEST_PG_FX_H

#include <libpq-fe.h>
#include <stddef.h>

#include "core/core.h"

typedef struct obx_t_pg {
    const char *url; /* OBX_TEST_PG_URL */
    obx__url base;   /* its parts */
    char port[16];   /* its port ("5432" when it names none) */
    PGconn *admin;   /* a superuser session on the URL's database, client_min_messages=warning */
} obx_t_pg;

/* Reads OBX_TEST_PG_URL, connects the admin session and drops the databases whose names start
 * with left_prefix (what a failed earlier run left behind; NULL: none). On failure prints why,
 * naming who, and returns -1 (the caller's main returns 1). */
int obx_t_pg_open(obx_t_pg *pg, const char *who, const char *left_prefix);

/* Closes the admin session. */
void obx_t_pg_close(obx_t_pg *pg);

/* Runs q; the test fails unless it succeeds. */
void obx_t_pg_sql(PGconn *c, const char *q);

/* The integer in the one row and column q returns; the test fails otherwise. */
long long obx_t_pg_qint(PGconn *c, const char *q);

/* A session on url; the test fails if it cannot connect. The caller PQfinishes it. */
PGconn *obx_t_pg_connect(const char *url);

/* DROP DATABASE IF EXISTS db WITH (FORCE) through admin. */
void obx_t_pg_drop_db(PGconn *admin, const char *db);

#endif

/*
 * pg_fx.c — the PostgreSQL fixture (pg_fx.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/pg_fx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx.h"

void obx_t_pg_sql(PGconn *c, const char *q) {
    PGresult *r = PQexec(c, q);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) fail_msg("%s: %s", q, PQerrorMessage(c));
    PQclear(r);
}

long long obx_t_pg_qint(PGconn *c, const char *q) {
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("%s: %s", q, PQerrorMessage(c));
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

PGconn *obx_t_pg_connect(const char *url) {
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK) fail_msg("connect %s: %s", url, PQerrorMessage(c));
    return c;
}

void obx_t_pg_drop_db(PGconn *admin, const char *db) {
    char q[160];
    snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s WITH (FORCE)", db);
    PQclear(PQexec(admin, q));
}

/* Drops the databases whose names start with prefix ('_' matched as itself). */
static void drop_left(PGconn *admin, const char *prefix) {
    char q[256], like[96];
    size_t k = 0;
    for (const char *p = prefix; *p && k + 3 < sizeof like; p++) {
        if (*p == '_' || *p == '%') like[k++] = '\\';
        like[k++] = *p;
    }
    like[k] = '\0';
    snprintf(q, sizeof q, "SELECT datname FROM pg_database WHERE datname LIKE '%s%%'", like);
    PGresult *left = PQexec(admin, q);
    for (int i = 0; PQresultStatus(left) == PGRES_TUPLES_OK && i < PQntuples(left); i++)
        obx_t_pg_drop_db(admin, PQgetvalue(left, i, 0));
    PQclear(left);
}

int obx_t_pg_open(obx_t_pg *pg, const char *who, const char *left_prefix) {
    memset(pg, 0, sizeof *pg);
    pg->url = getenv("OBX_TEST_PG_URL");
    if (!pg->url || !*pg->url) {
        fprintf(stderr,
                "%s: OBX_TEST_PG_URL must be set (scripts/services.sh) — failing, not "
                "skipping.\n",
                who);
        return -1;
    }
    if (obx__url_parse(pg->url, "store", &pg->base) || pg->base.scheme != OBX__URL_POSTGRES) {
        fprintf(stderr, "%s: OBX_TEST_PG_URL: %s\n", who, obx_errmsg());
        return -1;
    }
    const char *colon = strrchr(pg->base.hosts, ':');
    snprintf(pg->port, sizeof pg->port, "%s", colon ? colon + 1 : "5432");
    pg->admin = PQconnectdb(pg->url);
    if (PQstatus(pg->admin) != CONNECTION_OK) {
        fprintf(stderr, "%s: cannot connect to %s: %s", who, pg->url, PQerrorMessage(pg->admin));
        return -1;
    }
    PQclear(PQexec(pg->admin, "SET client_min_messages = warning"));
    if (left_prefix) drop_left(pg->admin, left_prefix);
    return 0;
}

void obx_t_pg_close(obx_t_pg *pg) {
    PQfinish(pg->admin);
    pg->admin = NULL;
}

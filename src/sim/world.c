/*
 * world.c — a simulator worker's world: the outbox store (SQLite in memory, or a PostgreSQL
 * connection with --db), two consumers' SQLite databases with their inboxes, the simulated
 * cluster, and the relay's shipped timings every trace runs on. A worker thread owns one world
 * for all its traces; each trace runs inside outer transactions that are rolled back.
 */
#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

obx_err obx__sim_open_mem(sqlite3 **db, obx_store **s) {
    if (sqlite3_open_v2(":memory:", db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK)
        return obx__fail(OBX_ESTORE, "sim: cannot open an in-memory database");
    /* a trace's databases hold a few dozen rows: small pages mean less to journal for every
     * page a trace touches (measured: ~5% fewer instructions than 4096) */
    sqlite3_exec(*db, "PRAGMA page_size=1024; PRAGMA synchronous=OFF", NULL, NULL, NULL);
    obx_err e = obx_store_wrap_sqlite(*db, s);
    if (!e) e = obx_store_init(*s);
    return e;
}

obx_err obx__sim_open_pg(wk *k, const char *url) {
    k->opg = PQconnectdb(url);
    if (PQstatus(k->opg) != CONNECTION_OK)
        return obx__fail(OBX_ESTORE, "sim: postgres: %s", PQerrorMessage(k->opg));
    const char *setup[] = {"SET search_path = obx, public", "SET client_min_messages = warning",
                           ("CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id "
                            "TEXT NOT NULL)")};
    for (size_t i = 0; i < sizeof setup / sizeof setup[0]; i++) {
        PGresult *r = PQexec(k->opg, setup[i]);
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) return obx__fail(OBX_ESTORE, "sim: postgres: %s", PQerrorMessage(k->opg));
    }
    return obx_store_wrap_pg(k->opg, &k->os);
}

/* The relay's shipped defaults: what `obx relay` runs with when nobody configured anything. */
obx_err obx__sim_shipped_timings(wk *k) {
    obx_config *c = NULL;
    obx_err e = obx_config_new(&c);
    if (e) return e;
    obx__engine_cfg_defaults(&k->base);
    k->base.lease_ms = c->lease_ms;
    k->base.reconcile_lease_ms = c->reconcile_lease_ms;
    k->base.recheck_ms = c->recheck_ms;
    k->base.recheck_max_ms = c->recheck_max_ms;
    k->base.backoff_base_ms = c->backoff_base_ms;
    k->base.backoff_max_ms = c->backoff_max_ms;
    k->base.batch = (size_t)c->batch;
    k->sweep_ms = c->sweep_ms;
    k->reconcile_ms = c->reconcile_ms;
    obx_config_free(c);
    return OBX_OK;
}

obx_err obx__sim_wk_init(wk *k, int id, const obx_sim_options *o) {
    memset(k, 0, sizeof *k);
    k->id = id;
    k->o = o;
    obx_err se = obx__sim_shipped_timings(k);
    if (se) return se;
    snprintf(k->wname, sizeof k->wname, "simworld-%p-%d", (void *)k, id);
    snprintf(k->wurl, sizeof k->wurl, "sim:%s", k->wname);
    obx_err e = obx__sim_world_new(k->wname, &k->w);
    if (e) return e;
    if (o->db_url) {
        if ((e = obx__sim_open_pg(k, o->db_url))) return e;
    } else {
        if ((e = obx__sim_open_mem(&k->odb, &k->os))) return e;
        if (sqlite3_exec(k->odb,
                         "CREATE TEMP TABLE sim_orders (order_id TEXT PRIMARY KEY, event_id TEXT "
                         "NOT NULL)",
                         NULL, NULL, NULL) != SQLITE_OK)
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->odb));
    }
    for (int i = 0; i < 2; i++) {
        if ((e = obx__sim_open_mem(&k->cdb[i], &k->cs[i]))) return e;
        if (sqlite3_exec(k->cdb[i], "CREATE TABLE sim_effects (event_id TEXT NOT NULL)", NULL, NULL,
                         NULL) != SQLITE_OK)
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->cdb[i]));
        char cid[16];
        snprintf(cid, sizeof cid, "consumer-%d", i);
        obx_inbox_options io = {.consumer_id = cid, .max_failures = 100};
        if ((e = obx_inbox_open(k->cs[i], &io, &k->in[i]))) return e;
        if (sqlite3_prepare_v3(k->cdb[i],
                               "SELECT min(consumed_at) FROM obx_inbox WHERE consumer_id = ? AND "
                               "event_id = ?",
                               -1, SQLITE_PREPARE_PERSISTENT, &k->st_inbox_at[i], NULL))
            return obx__fail(OBX_ESTORE, "sim: %s", sqlite3_errmsg(k->cdb[i]));
    }
    return OBX_OK;
}

void obx__sim_wk_free(wk *k) {
    obx__simq_cached_free();
    for (int i = 0; i < OQ_COUNT; i++) sqlite3_finalize(k->oq_st[i]);
    for (int i = 0; i < 2; i++) sqlite3_finalize(k->st_effect[i]);
    for (int i = 0; i < 2; i++) sqlite3_finalize(k->st_inbox_at[i]);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) sqlite3_finalize(k->st_tx[i][j]);
    for (int i = 0; i < 2; i++) {
        obx_inbox_close(k->in[i]);
        obx_store_close(k->cs[i]);
        sqlite3_close(k->cdb[i]);
    }
    obx_store_close(k->os);
    if (k->odb) sqlite3_close(k->odb);
    if (k->opg) PQfinish(k->opg);
    obx__sim_world_free(k->w);
    free(k->res_ms);
}

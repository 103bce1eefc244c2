/*
 * world.c — a simulator worker's world: the outbox store (SQLite in memory, or a PostgreSQL
 * connection with --db), two consumers' SQLite databases with their inboxes, the simulated
 * cluster, and the relay's shipped timings every trace runs on. A worker thread owns one world
 * for all its traces; each trace runs inside outer transactions that are rolled back. The
 * databases are the application doubles' (src/app): the producing service's, whose connection
 * the outbox store shares, and each consuming service's, whose connection its inbox shares.
 */
#include "sim/sim.h"

#include <stdlib.h>
#include <string.h>

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
    if ((e = obx__app_producer_open(o->db_url, &k->shop))) return e;
    k->os = obx__app_producer_store(k->shop);
    for (int i = 0; i < 2; i++) {
        if ((e = obx__app_consumer_open(&k->app[i]))) return e;
        k->cs[i] = obx__app_consumer_store(k->app[i]);
    }
    for (int i = 0; i < 2; i++) {
        char cid[16];
        snprintf(cid, sizeof cid, "consumer-%d", i);
        /* no back-off here: each trace draws its own, with a seeded jitter (faults.c) */
        obx_inbox_options io = {.consumer_id = cid, .max_failures = 100, .retry_backoff_ms = -1};
        if ((e = obx_inbox_open(k->cs[i], &io, &k->in[i]))) return e;
    }
    return OBX_OK;
}

/* The trace's outer transactions, one per database, through the stores' own nesting: every
 * transaction obx opens inside a trace is a savepoint of these, and the rollback at the end
 * leaves the databases as empty as before the trace. */
void obx__sim_trace_begin(wk *k) {
    if (obx__st_begin(k->os)) fail(k, "sim: begin: %s", obx_errmsg());
    for (int i = 0; i < 2; i++) obx__st_begin(k->cs[i]);
}

void obx__sim_trace_end(wk *k) {
    /* all the way down: a transaction obx left open (the checkers count it) must not hold the
     * next trace inside this one */
    while (k->os->tx_depth > 0)
        if (obx__st_rollback(k->os)) fail(k, "sim: rollback: %s", obx_errmsg());
    for (int i = 0; i < 2; i++)
        while (k->cs[i]->tx_depth > 0) obx__st_rollback(k->cs[i]);
}

void obx__sim_wk_free(wk *k) {
    for (int i = 0; i < 2; i++) obx_inbox_close(k->in[i]);
    for (int i = 0; i < 2; i++) obx__app_consumer_close(k->app[i]);
    obx__app_producer_close(k->shop);
    obx__sim_world_free(k->w);
    free(k->res_ms);
}

/*
 * actors.c — the simulator's actors, each one step at a time: a producer (business
 * transactions with their envelopes, retrying a command with the same idempotency key after
 * it crashes), two dispatchers, a reconciler, one or two consumer IDs with the inbox (two
 * instances each, in one group, that may take one message at once), a purger, an operator
 * migrating the backlog and an on-call operator resolving held UNKNOWNs, who also tries what
 * must change nothing (dry runs, a refused route change), false evidence and poison re-drives
 * (issue 46, item 11). They run the
 * production engine code; the faults they are exposed to are drawn in faults.c, the order they
 * run in in scheduler.c. An actor's crash loses its memory; what it committed stays. The
 * relay's actors (dispatchers, reconciler) pass the engine their own clock, as the driver computes
 * it (relay_now); the others pass the simulator's.
 */
#include "sim/sim.h"

#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- actor lifecycle ------------------------------------------------------------------------- */

static obx_err actor_start(wk *k, actor *a) {
    a->incarnation++;
    snprintf(a->owner, sizeof a->owner, "%s%d.i%d",
             a->kind == A_PRODUCER     ? "p"
             : a->kind == A_DISPATCHER ? "d"
             : a->kind == A_RECONCILER ? "r"
             : a->kind == A_PURGER     ? "g"
             : a->kind == A_MIGRATOR   ? "m"
             : a->kind == A_OPERATOR   ? "o"
             : a->instance             ? "k" /* a consumer ID's second instance */
                                       : "c",
             a->index, a->incarnation);
    obx_err e = OBX_OK;
    if (a->incarnation == 1 && (a->kind == A_DISPATCHER || a->kind == A_RECONCILER))
        /* a relay's host: its monotonic clock counts from its boot */
        a->mono_base = (int64_t)(rnd(k) % 86400000) - k->now;
    a->clock_synced = false; /* the driver reads the server's clock at each connection */
    /* the operator reads the broker too: its evidence is checked there (obx resolve --broker) */
    if (a->kind != A_PRODUCER && a->kind != A_PURGER) e = obx__br_open(k->wurl, NULL, 0, &a->b);
    if (e) return e;
    if (a->kind == A_DISPATCHER || a->kind == A_RECONCILER || a->kind == A_MIGRATOR ||
        a->kind == A_OPERATOR) {
        obx__engine_cfg c = k->base; /* the shipped timings */
        obx__strlcpy(c.owner, a->owner, sizeof c.owner);
        c.seed = rnd(k) | 1;
        if (a->kind == A_RECONCILER && k->evidence) {
            for (int i = 0; i < k->nconsumers; i++) {
                memset(&a->crit[i], 0, sizeof a->crit[i]);
                snprintf(a->crit[i].id, sizeof a->crit[i].id, "consumer-%d", i);
                a->crit[i].s = k->cs[i];
            }
            c.evidence = a->crit;
            c.n_evidence = (size_t)k->nconsumers;
        }
        e = obx__engine_init(&a->e, k->os, a->b, &c);
    } else if (a->kind == A_CONSUMER) {
        char group[16];
        snprintf(group, sizeof group, "group-%d", a->index);
        const char *topics[] = {"orders", "orders-v2"}; /* v2: after a route revision */
        e = obx__br_consume_open(a->b, group, topics, 2);
    } else if (a->kind == A_PURGER) {
        /* every consumer of the trace is critical: an event is purged only with evidence from
         * each (its inbox receipt), behind the forced consumer watermark, after the window */
        for (int i = 0; i < k->nconsumers && !e; i++) {
            memset(&a->crit[i], 0, sizeof a->crit[i]);
            snprintf(a->crit[i].id, sizeof a->crit[i].id, "consumer-%d", i);
            a->crit[i].s = k->cs[i];
            e = obx__critical_load(&a->crit[i]);
        }
        a->rcfg = (obx__retention_cfg){.consumers = a->crit,
                                       .n_consumers = (size_t)k->nconsumers,
                                       .replay_window_ms = k->replay_window_ms,
                                       .batch = k->purge_batch,
                                       .who = a->owner,
                                       .max_listed = 0};
        obx__purge_cursor_init(&a->cur);
    } else {
        memset(&a->gen, 0, sizeof a->gen);
        a->gen.seed = rnd(k) | 1;
    }
    return e;
}

/* The actor loses its memory: held claims, unacknowledged deliveries, its broker session (and
 * every outcome on its way to it). What it committed stays; what it was doing rolls back. */
void obx__sim_actor_crash(wk *k, actor *a) {
    a->wait_until = 0;
    obx__rows_free(&a->held);
    a->held_pos = 0;
    for (size_t i = 0; i < a->ndl; i++) obx__delivery_free(&a->dl[i]);
    a->ndl = a->posdl = 0;
    obx__br_close(a->b);
    a->b = NULL;
    if (actor_start(k, a)) {
        k->r.internal_errors++;
        fail(k, "actor %s could not restart: %s", a->owner, obx_errmsg());
    }
}

void obx__sim_actor_stop(actor *a) {
    obx__rows_free(&a->held);
    for (size_t i = 0; i < a->ndl; i++) obx__delivery_free(&a->dl[i]);
    a->ndl = 0;
    obx__br_close(a->b);
    a->b = NULL;
}

/* ---- the relay's clock (docs/design.md, "One clock") ------------------------------------------
 */

/* The driver's clock_sync (src/drivers/relay.c) and obx__ref_ms (src/core/util.c), on a relay
 * actor's simulated clocks (sim.h, actor): the database server's clock_timestamp() (the
 * simulator's clock is the server's) is read at each connection and every SIM_CLOCK_SYNC_MS; the
 * query reaches the server after `up` ms and its answer comes back after `down` ms, each up to
 * half of SIM_DB_RTT_MS, so the offset measured is off by (up - down) / 2: half a round trip at
 * most. The host's wall clock takes no part: a step of it moves nothing. */
#define SIM_CLOCK_SYNC_MS 10000 /* relay.c's CLOCK_SYNC_MS; SIM_DB_RTT_MS: sim.h */

static void clock_sync(wk *k, actor *a, int64_t mono) {
    int64_t up = (int64_t)(rnd(k) % (SIM_DB_RTT_MS / 2 + 1));
    int64_t down = (int64_t)(rnd(k) % (SIM_DB_RTT_MS / 2 + 1));
    int64_t server = k->now + up, recv = mono + up + down;
    a->ref_off = server - (mono + (recv - mono) / 2); /* obx__ref_sync */
    a->synced_at = mono;
    a->clock_synced = true;
}

/* The time relay actor a decides on (obx__ref_ms): its monotonic clock plus the offset measured
 * at the last read of the server's clock. */
static int64_t relay_now(wk *k, actor *a) {
    int64_t mono = k->now + a->mono_base;
    if (!a->clock_synced || mono - a->synced_at >= SIM_CLOCK_SYNC_MS) clock_sync(k, a, mono);
    if (OBX__MUTANT(RELAY_HOST_CLOCK)) return k->now + a->host_off; /* test-only: its host clock */
    return mono + a->ref_off;
}

/* ---- steps --------------------------------------------------------------------------------- */

static void producer_step(wk *k, actor *a) {
    int c = a->retry_cmd >= 0 ? a->retry_cmd : a->next_cmd;
    if (c >= k->n_events) return;
    bool kill_before = k->faults_on && chance(k, k->p[F_KILL_BEFORE_COMMIT]);
    bool kill_after = !kill_before && k->faults_on && chance(k, k->p[F_KILL_AFTER_COMMIT]);
    char payload[96];
    snprintf(payload, sizeof payload, "{\"order\":\"%s\",\"total\":%d}", k->orders[c], 100 + c);
    char agg[16];
    snprintf(agg, sizeof agg, "o-%d", c % (1 + (int)(k->idx % 3))); /* shared keys: order rule */
    /* the business transaction's ID, named here (not minted by SQLite's store or read from
     * PostgreSQL's txid_current): the same trace is then the same on both stores */
    char txid[48];
    snprintf(txid, sizeof txid, "sim-%ld-%d-%s", k->idx, c, a->owner);
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = agg,
                    .aggregate_version = c,
                    .tenant = k->tenant,
                    .txid = txid,
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .idempotency_key = k->orders[c],
                    .correlation_id = k->orders[c],
                    /* a delayed event (issue 51): not published before now + its delay */
                    .not_before_ms = k->delay_ms[c] ? k->now + k->delay_ms[c] : 0};
    obx_enqueue_result res;
    obx_err e = obx__st_begin(k->os);
    if (!e) e = obx__enqueue_at(k->os, &ev, k->now, &a->gen, &res);
    if (!e) { /* the business row, in the same transaction (idempotent: a retried command) */
        if ((e = obx__app_order_put(k->shop, k->orders[c], res.event_id)))
            fail(k, "sim: %s", obx_errmsg());
    }
    if (e || kill_before) {
        obx__st_rollback(k->os);
        if (e) check_err(k, a, e, "enqueue");
        if (kill_before) {
            k->r.fired[F_KILL_BEFORE_COMMIT]++;
            logv(k, "%s: killed before committing %s", a->owner, k->orders[c]);
        }
        a->retry_cmd = c; /* the client retries the command */
        obx__sim_actor_crash(k, a);
        return;
    }
    if ((e = obx__st_commit(k->os))) {
        check_err(k, a, e, "commit");
        return;
    }
    logv(k, "%s: committed %s -> %s%s", a->owner, k->orders[c], res.event_id,
         res.existing ? " (idempotency key: existing)" : "");
    h_str(k, res.event_id);
    bool known = false;
    for (int i = 0; i < k->n_ids[c]; i++)
        known = known || !strcmp(k->event_ids[c][i], res.event_id);
    if (!known && k->n_ids[c] < 2) {
        k->not_before[c][k->n_ids[c]] = ev.not_before_ms; /* as this commit froze it */
        k->r.fired[F_DELAYED_EVENT] += ev.not_before_ms > 0;
        obx__strlcpy(k->event_ids[c][k->n_ids[c]++], res.event_id, 31);
    }
    if (kill_after) { /* committed, but the client never heard: it retries the same command */
        k->r.fired[F_KILL_AFTER_COMMIT]++;
        logv(k, "%s: killed after committing %s", a->owner, k->orders[c]);
        a->retry_cmd = c;
        obx__sim_actor_crash(k, a);
        return;
    }
    a->retry_cmd = -1;
    if (c == a->next_cmd) a->next_cmd++;
}

static void poll_outcomes(wk *k, actor *a) {
    size_t n = 0;
    bool rollback = k->faults_on && chance(k, k->p[F_ACCEPTANCE_ROLLBACK]);
    if (rollback) k->os->fail_commits = 8; /* every retry of this step's transactions fails */
    obx_err e = obx__engine_poll(&a->e, relay_now(k, a), 0, &n);
    k->os->fail_commits = 0;
    if (e && rollback) {
        /* the acceptance rolled back: those ACKs never reached a committed acceptance; their
         * attempts stay SENDING/UNKNOWN to be reconciled */
        obx__sim_handle_unrecord_acks(a->b);
        k->r.fired[F_ACCEPTANCE_ROLLBACK]++;
        logv(k, "%s: acceptance of %s rolled back", a->owner, "a batch");
        return;
    }
    check_err(k, a, e, "poll");
    if (n) logv(k, "%s: applied %zu outcomes", a->owner, n);
    h_add(k, n);
}

static void dispatcher_step(wk *k, actor *a) {
    obx_err e;
    size_t n = 0;
    switch (rnd(k) % 4) {
    case 0: /* claim (held in memory until sent) */
        if (a->held.n) break;
        e = obx__engine_claim(&a->e, relay_now(k, a), &a->held);
        check_err(k, a, e, "claim");
        if (a->held.n) logv(k, "%s: claimed %zu", a->owner, a->held.n);
        h_add(k, a->held.n);
        break;
    case 1: /* register attempts and send what was claimed */
        if (!a->held.n) break;
        e = obx__engine_begin_attempts(&a->e, relay_now(k, a), a->held.v, a->held.n,
                                       OBX__ACT_DISPATCHER, &n);
        check_err(k, a, e, "begin attempts");
        logv(k, "%s: sent %zu of %zu claimed", a->owner, n, a->held.n);
        h_add(k, n);
        obx__rows_free(&a->held);
        break;
    case 2: poll_outcomes(k, a); break;
    default:
        e = obx__engine_sweep(&a->e, relay_now(k, a), &n);
        check_err(k, a, e, "sweep");
        if (n) logv(k, "%s: swept %zu expired SENDING leases", a->owner, n);
        h_add(k, n);
    }
}

/* Sends the retry the reconciler decided (a row it holds as RETRY_CLAIMED), with the two known
 * races (docs/design.md, "Fault model") injected around it when the trace has them on (also in
 * the liveness phase: they are orderings, not faults). */
static void retry_send(wk *k, actor *a, obx__event_row *row) {
    char old_att[OBX__ATTEMPT_ID_LEN + 1];
    obx__strlcpy(old_att, row->attempt_id, sizeof old_att);
    /* the older attempt's true ACK arrives while the retry is claimed and not yet sent: the
     * acceptance fills the slot and the retry is fenced (never sent) */
    if (old_att[0] && chance(k, k->p[F_UNKNOWN_RACING_RETRY]) &&
        obx__sim_world_release_ack(k->w, old_att, k->now)) {
        k->r.fired[F_UNKNOWN_RACING_RETRY]++;
        logv(k, "%s: the late ACK of %s races the retry claim", a->owner, old_att);
        obx__sim_world_tick(k->w, k->now);
        for (int i = 0; i < k->na; i++)
            if (k->a[i].kind == A_DISPATCHER || k->a[i].kind == A_RECONCILER)
                poll_outcomes(k, &k->a[i]);
    }
    size_t sent = 0;
    obx_err e =
        obx__engine_begin_attempts(&a->e, relay_now(k, a), row, 1, OBX__ACT_RECONCILER, &sent);
    check_err(k, a, e, "retry");
    logv(k, "%s: retry of %s %s", a->owner, row->env.event_id, sent ? "sent" : "refused (fenced)");
    h_add(k, sent);
    /* the new attempt is on its way and the old one's true ACK arrives well after it (the new
     * one has been accepted by then): one primary receipt, one late duplicate */
    if (sent && old_att[0] && chance(k, k->p[F_BOTH_ATTEMPTS_ACKED]) &&
        obx__sim_world_release_ack(k->w, old_att, k->now + 10000)) {
        k->r.fired[F_BOTH_ATTEMPTS_ACKED]++;
        logv(k, "%s: the old attempt %s will be ACKed too", a->owner, old_att);
    }
}

/* The reconciler's whole step in the liveness phase (obx__reconcile_step's sequence, with the
 * retries sent through retry_send). */
static void reconcile_all(wk *k, actor *a) {
    obx__rows_free(&a->held);
    a->held_pos = 0;
    obx_err e = obx__reconcile_begin(&a->e, relay_now(k, a), &a->held);
    check_err(k, a, e, "reconcile begin");
    for (size_t i = 0; !e && i < a->held.n; i++) {
        obx__event_row *row = &a->held.v[i];
        if (row->state != OBX__ST_RETRY_CLAIMED) {
            obx__lookup_res res;
            int64_t now = relay_now(k, a);
            e = obx__reconcile_lookup(&a->e, now, row, &res);
            if (!e) e = obx__reconcile_apply(&a->e, now, row, &res);
            check_err(k, a, e, "reconcile");
        }
        if (!e && row->state == OBX__ST_RETRY_CLAIMED) retry_send(k, a, row);
    }
    obx__rows_free(&a->held);
}

static void reconciler_step(wk *k, actor *a) {
    obx_err e;
    switch (rnd(k) % 3) {
    case 0:
        if (a->held_pos < a->held.n) break;
        obx__rows_free(&a->held);
        a->held_pos = 0;
        e = obx__reconcile_begin(&a->e, relay_now(k, a), &a->held);
        check_err(k, a, e, "reconcile begin");
        if (a->held.n) logv(k, "%s: reconciling %zu", a->owner, a->held.n);
        h_add(k, a->held.n);
        break;
    case 1: {
        if (a->held_pos >= a->held.n) break;
        obx__event_row *row = &a->held.v[a->held_pos];
        if (row->state == OBX__ST_RETRY_CLAIMED) { /* a separate step: the race window */
            retry_send(k, a, row);
            a->held_pos++;
            break;
        }
        obx__lookup_res res;
        int64_t now = relay_now(k, a);
        e = obx__reconcile_lookup(&a->e, now, row, &res);
        if (!e) e = obx__reconcile_apply(&a->e, now, row, &res);
        check_err(k, a, e, "reconcile");
        logv(k, "%s: %s: lookup %s -> %s", a->owner, row->env.event_id,
             res.kind == OBX__LOOKUP_FOUND       ? "FOUND"
             : res.kind == OBX__LOOKUP_NOT_FOUND ? "NOT_FOUND"
                                                 : "CANNOT_TELL",
             obx__state_name(row->state));
        h_add(k, (uint64_t)res.kind * 16 + row->state);
        if (row->state != OBX__ST_RETRY_CLAIMED) a->held_pos++;
        break;
    }
    default: poll_outcomes(k, a);
    }
}

typedef struct effect_ctx {
    wk *k;
    int consumer;
    bool nested;  /* the other instance's run, inside this one's handler */
    bool overlap; /* this delivery's handler lets the other instance take the message */
} effect_ctx;

/* A handler run of consumer ci on event_id, counted outside every transaction (an effect
 * outside the database: a charge, a mail). */
static void count_run(wk *k, int ci, const char *event_id) {
    for (int c = 0; c < k->n_events; c++)
        if (k->n_ids[c] && !strcmp(k->event_ids[c][0], event_id) && k->runs[ci][c] < 255)
            k->runs[ci][c]++;
}

static obx_err effect_handler(void *user, void *conn, const obx_message *m, const char *key,
                              char *res, size_t cap);

/* Two instances of one consumer ID take one message at once: while this handler runs, the other
 * instance processes the same message. Each instance's inbox transaction is on the consumer's
 * one connection, so the other's is nested in this one's: it sees this one's claim as
 * PostgreSQL's second session sees it once the first commits (it waits on the unique key), and
 * it must answer DUPLICATE without running its handler. */
static void overlap_run(wk *k, int ci, const obx_message *m, void *conn) {
    effect_ctx ec = {k, ci, true, false};
    obx_inbox_result r;
    obx_err e = obx__inbox_process_at(k->in[ci], m, effect_handler, &ec, conn, k->now, 0, NULL, &r);
    k->r.fired[F_CONCURRENT_INSTANCES]++;
    logv(k, "consumer %d's other instance took %s meanwhile: %s", ci, m->event_id,
         e                                  ? obx_errname(e)
         : r.outcome == OBX_INBOX_DUPLICATE ? "DUPLICATE"
                                            : "handled");
    h_add(k, e ? 99 : (uint64_t)r.outcome);
}

int obx__sim_cmd_of(const wk *k, const char *event_id, int *slot) {
    for (int c = 0; c < k->n_events; c++)
        for (int i = 0; i < k->n_ids[c]; i++)
            if (!strcmp(k->event_ids[c][i], event_id)) {
                if (slot) *slot = i;
                return c;
            }
    return -1;
}

int64_t obx__sim_retry_next_at(const wk *k) {
    int64_t t = INT64_MAX;
    for (int i = 0; i < k->nconsumers; i++)
        for (int c = 0; c < k->n_events; c++)
            if (k->retry_at[i][c] > k->now && k->retry_at[i][c] < t) t = k->retry_at[i][c];
    return t;
}

/* A handler run of consumer ci for a message that failed before: its failure row, as the
 * consumer's database holds it, must be due (issue 51: no retry before its due time). */
static void check_retry_due(wk *k, int ci, const char *event_id) {
    char cid[16];
    snprintf(cid, sizeof cid, "consumer-%d", ci);
    int32_t failures = 0;
    int64_t next_at = 0;
    obx_err e = obx__st_failure_get(k->cs[ci], cid, event_id, &failures, &next_at);
    if (e == OBX_ENOTFOUND || (!e && next_at <= k->now)) return;
    if (e) {
        k->r.internal_errors++;
        fail(k, "sim: read failure row: %s", obx_errmsg());
        return;
    }
    k->r.retry_before_due++;
    fail(k, "consumer %d's handler ran for %s %lld ms before its retry %d was due", ci, event_id,
         (long long)(next_at - k->now), (int)failures);
}

/* Whether this run of consumer ci's handler fails: the flaky downstream of handler-failure, or
 * one of the failures drawn for the message (handler-backoff: it fails N times, then succeeds). */
static bool handler_fails(wk *k, int ci, int cmd) {
    if (k->handler_fail_next) {
        k->handler_fail_next = false;
        return true;
    }
    if (cmd < 0 || !k->fail_left[ci][cmd]) return false;
    k->fail_left[ci][cmd]--;
    k->r.fired[F_HANDLER_BACKOFF]++;
    return true;
}

static obx_err effect_handler(void *user, void *conn, const obx_message *m, const char *key,
                              char *res, size_t cap) {
    effect_ctx *c = user;
    (void)key;
    if (!c->nested) {
        int cmd = obx__sim_cmd_of(c->k, m->event_id, NULL);
        if (cmd >= 0 && c->k->retry_at[c->consumer][cmd])
            check_retry_due(c->k, c->consumer, m->event_id);
        if (handler_fails(c->k, c->consumer, cmd))
            return obx__fail(OBX_EHANDLER, "sim: a flaky downstream");
    }
    count_run(c->k, c->consumer, m->event_id);
    if (c->overlap) {
        c->overlap = false;
        overlap_run(c->k, c->consumer, m, conn);
    }
    obx_err e = obx__app_effect_put(c->k->app[c->consumer], m->event_id);
    snprintf(res, cap, "applied");
    return e;
}

static void drop_deliveries(actor *a) {
    for (size_t i = 0; i < a->ndl; i++) obx__delivery_free(&a->dl[i]);
    a->ndl = a->posdl = 0;
}

static void consumer_fetch(wk *k, actor *a) {
    if (a->ndl) return;
    /* waiting out a retry's back-off; in the fault phase the broker sometimes hands the message
     * back early (a requeue): the inbox must not run it before its time (DELAYED) */
    if (a->wait_until > k->now && !(k->faults_on && chance(k, k->p[F_HANDLER_BACKOFF]))) return;
    obx_err e = obx__br_consume_poll(a->b, 0, a->dl, MAX_DL, &a->ndl);
    check_err(k, a, e, "consume poll");
    memset(a->to_ack, 0, sizeof a->to_ack);
    a->posdl = 0;
    if (a->ndl) logv(k, "%s: fetched %zu deliveries", a->owner, a->ndl);
    h_add(k, a->ndl);
}

/* What the inbox answered for consumer a's message of command cmd (-1: none): a failed message's
 * retry is due at r->retry_at, the consumer waits until then and the scheduler wakes it
 * (obx__sim_retry_next_at); an applied one has no retry left. */
static void note_retry(wk *k, actor *a, int cmd, const obx_inbox_result *r) {
    bool failed = r->outcome == OBX_INBOX_FAILED || r->outcome == OBX_INBOX_DELAYED;
    k->r.retries_delayed += r->outcome == OBX_INBOX_DELAYED;
    if (failed) a->wait_until = r->retry_at;
    if (cmd < 0) return;
    if (failed)
        k->retry_at[a->index][cmd] = r->retry_at ? r->retry_at : k->now;
    else if (r->outcome == OBX_INBOX_APPLIED || r->outcome == OBX_INBOX_DUPLICATE)
        k->retry_at[a->index][cmd] = 0;
}

/* One delivery through the inbox (its commit); the broker ack is a later step, so a crash in
 * between is "consumer commit then lost broker ACK". */
static void consumer_process_one(wk *k, actor *a) {
    if (a->posdl >= a->ndl) return;
    int ci = a->index;
    obx__delivery *d = &a->dl[a->posdl];
    obx_message m = obx__message_of(d);
    if (k->faults_on && chance(k, k->p[F_HANDLER_FAILURE])) {
        k->handler_fail_next = true;
        k->r.fired[F_HANDLER_FAILURE]++;
    }
    /* the other instance of this consumer ID takes the same message meanwhile (a handler that
     * will fail rolls back the claim: the overlap is injected only where this run succeeds) */
    int cmd = obx__sim_cmd_of(k, m.event_id, NULL);
    effect_ctx ec = {k, ci, false,
                     k->faults_on && !k->handler_fail_next && (cmd < 0 || !k->fail_left[ci][cmd]) &&
                         chance(k, k->p[F_CONCURRENT_INSTANCES])};
    obx_inbox_result r;
    obx_err e = obx__inbox_process_at(k->in[ci], &m, effect_handler, &ec,
                                      obx__app_consumer_conn(k->app[ci]), k->now, 0, NULL, &r);
    k->handler_fail_next = false;
    check_err(k, a, e, "inbox");
    if (e) return;
    logv(k, "%s: %s -> %s", a->owner, m.event_id,
         r.outcome == OBX_INBOX_APPLIED       ? "APPLIED"
         : r.outcome == OBX_INBOX_DUPLICATE   ? "DUPLICATE"
         : r.outcome == OBX_INBOX_QUARANTINED ? "QUARANTINED"
         : r.outcome == OBX_INBOX_FAILED      ? "FAILED"
         : r.outcome == OBX_INBOX_DELAYED     ? "DELAYED (retry not due)"
                                              : "POISONED");
    h_add(k, (uint64_t)r.outcome);
    note_retry(k, a, cmd, &r);
    /* a copy the relay never sent (or the genuine one after another producer's copy was
     * applied) is parked or quarantined; the checkers judge the genuine copy's fate */
    if ((r.outcome == OBX_INBOX_QUARANTINED || r.outcome == OBX_INBOX_POISONED) &&
        !obx__sim_world_forged(k->w, m.event_id)) {
        k->r.internal_errors++;
        fail(k, "%s: %s was %s: %s", a->owner, m.event_id,
             r.outcome == OBX_INBOX_QUARANTINED ? "quarantined" : "parked as poison", r.detail);
    }
    if (r.ack) {
        a->to_ack[a->posdl] = true;
        a->posdl++;
        return;
    }
    /* failed: this delivery and everything after it come again */
    check_err(k, a, obx__br_consume_redeliver(a->b, d), "redeliver");
    drop_deliveries(a);
}

static void consumer_ack_all(wk *k, actor *a) {
    for (size_t i = 0; i < a->posdl; i++)
        if (a->to_ack[i]) {
            check_err(k, a, obx__br_consume_ack(a->b, &a->dl[i]), "ack");
            a->to_ack[i] = false;
        }
    if (a->posdl >= a->ndl) drop_deliveries(a);
}

static void consumer_step(wk *k, actor *a) {
    switch (rnd(k) % 3) {
    case 0: consumer_fetch(k, a); break;
    case 1: consumer_process_one(k, a); break;
    default: consumer_ack_all(k, a);
    }
}

/* One bounded retention step; or, as the fault "premature purge attempt", an operator's
 * `obx purge EVENT_ID` of any event at any time: obx must refuse it unless every condition
 * holds (the checker verifies each purge against the consumers' receipts afterwards). */
static void purger_step(wk *k, actor *a) {
    obx__ret_result res = {0};
    obx_err e;
    if (k->faults_on && chance(k, k->p[F_PREMATURE_PURGE])) {
        int c = (int)(rnd(k) % (uint64_t)k->n_events);
        if (!k->n_ids[c]) return;
        e = obx__purge_event(k->os, &a->rcfg, k->now, k->event_ids[c][0], &res);
        logv(k, "%s: purge %s -> %s", a->owner, k->event_ids[c][0],
             e == OBX_EREFUSED ? "refused"
             : e               ? obx_errname(e)
                               : "purged");
        if (e == OBX_EREFUSED) {
            k->r.fired[F_PREMATURE_PURGE]++;
            e = OBX_OK;
        }
    } else {
        e = obx__purge_step(k->os, &a->rcfg, k->now, &a->cur, &res);
        if (res.retained || res.purged)
            logv(k, "%s: retained %lld, purged %lld", a->owner, (long long)res.retained,
                 (long long)res.purged);
        if (a->cur.phase == 2) obx__purge_cursor_init(&a->cur);
    }
    h_add(k, (uint64_t)(res.retained * 64 + res.purged));
    obx__ret_result_free(&res);
    check_err(k, a, e, "purge");
}

/* An operator moving one event of the backlog to the current route generation (after a route
 * policy revision) with `obx migrate`: it must move only with proof that the old target did not
 * accept the event, and is refused otherwise — in particular while the old target cannot be
 * queried (the fault). The checker verifies every move against the broker's log. */
static void migrator_step(wk *k, actor *a) {
    if (!k->revised) return; /* nothing to migrate to yet */
    int c = (int)(rnd(k) % (uint64_t)k->n_events);
    if (!k->n_ids[c]) return;
    obx__sim_faults *wf = obx__sim_world_faults(k->w);
    bool was_down = wf->lookup_down;
    bool down = k->faults_on && chance(k, k->p[F_MIGRATION_UNQUERYABLE]);
    if (down) wf->lookup_down = true;
    /* the event drawn, or (one step in two) the whole backlog the producer was told of */
    const char *ids[MAX_EVENTS] = {k->event_ids[c][0]};
    size_t n = 1;
    bool all = rnd(k) % 2;
    for (int i = 0; all && i < k->n_events; i++)
        if (k->n_ids[i] && i != c) ids[n++] = k->event_ids[i][0];
    obx__migrate_req req = {.ids = ids, .n_ids = n, .who = a->owner, .reason = "sim"};
    json_t *out = NULL;
    size_t refused = 0;
    obx_err e = obx__migrate(&a->e, k->now, &req, &out, &refused);
    wf->lookup_down = was_down;
    if (e == OBX_EREFUSED) e = OBX_OK;
    if (!e) {
        k->r.migrated += (long)(n - refused);
        k->r.migration_refused += (long)refused;
        if (down) k->r.fired[F_MIGRATION_UNQUERYABLE]++;
        logv(k, "%s: migrate %s -> %s%s%s", a->owner, ids[0], refused ? "refused: " : "moved",
             refused ? obx_errmsg() : "", down ? " (old target unqueryable)" : "");
    }
    h_add(k, refused ? 7 : 9);
    json_decref(out);
    check_err(k, a, e, "migrate");
}

/* ---- the operator's other paths (issue 46, item 11) ---- */

/* What the outbox's routes are (every generation), as one number: a dry run or a refused
 * change must leave it as it was. */
static uint64_t routes_sig(wk *k, bool *ok) {
    obx__route_row *v = NULL;
    size_t n = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    *ok = !obx__st_route_list(k->os, true, &v, &n);
    for (size_t i = 0; *ok && i < n; i++) {
        h = mix(h ^ (uint64_t)v[i].gen);
        for (const char *s = v[i].topic; *s; s++) h = mix(h ^ (unsigned char)*s);
    }
    free(v);
    return h ^ n;
}

/* `obx migrate` that must change nothing: a dry run with a new route, a dry run of
 * --add-target, or a route change whose only event is not in this outbox (refused). */
static void operator_no_change(wk *k, actor *a, int kind) {
    int c = (int)(rnd(k) % (uint64_t)k->n_events);
    if (!k->n_ids[c]) return;
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "sim",
                   .topic = "orders-v2",
                   .routing_key = "{tenant}.{aggregate_id}",
                   .on_unknown = k->hold ? "hold" : "retry",
                   .max_attempts = 50};
    const char *ids[] = {kind == 2 ? "01ARZ3NDEKTSV4RRFFQ69G5FAV" : k->event_ids[c][0]};
    obx__migrate_req req = {.ids = ids,
                            .n_ids = 1,
                            .who = a->owner,
                            .reason = "sim: must change nothing",
                            .dry_run = kind != 2,
                            .add_target = kind == 1,
                            .route = kind == 1 ? NULL : &r};
    bool ok1, ok2;
    uint64_t before = routes_sig(k, &ok1);
    json_t *out = NULL;
    size_t refused = 0;
    obx_err e = obx__migrate(&a->e, k->now, &req, &out, &refused);
    json_decref(out);
    uint64_t after = routes_sig(k, &ok2);
    if (e == OBX_EREFUSED) e = OBX_OK; /* refused: what it must be */
    check_err(k, a, e, "operator: migrate");
    if (!ok1 || !ok2) check_err(k, a, OBX_ESTORE, "operator: route list");
    if (kind == 2)
        k->r.op_refusals++;
    else
        k->r.op_dry_runs++;
    logv(k, "%s: migrate %s%s%s -> %zu refused, routes %s", a->owner, ids[0],
         kind == 2 ? " with a new route (refused)" : " --dry-run",
         kind == 1   ? " --add-target"
         : kind == 0 ? " with a new route"
                     : "",
         refused, before == after ? "unchanged" : "CHANGED");
    h_add(k, refused * 2 + (before == after));
    if (before != after) {
        k->r.route_changed_by_dry_run_or_refusal++;
        fail(k, "%s: a %s changed the routes", a->owner,
             kind == 2 ? "refused route change" : "dry run");
    }
}

/* `obx resolve --accept` with false evidence (an offset the broker does not hold under the
 * event, or another payload digest) for an event in DISPATCH_UNKNOWN (the only state resolve
 * takes): where the broker can be asked it must be refused; a false acceptance would publish
 * the event on no evidence (checkers.c counts it). */
static void operator_false_accept(wk *k, actor *a) {
    obx__sim_faults *wf = obx__sim_world_faults(k->w);
    int c = (int)(rnd(k) % (uint64_t)k->n_events);
    bool digest = rnd(k) % 2;
    if (!k->n_ids[c] || k->ad->lookup != OBX__SIM_LOOKUP_AUTHORITATIVE || wf->lookup_down) return;
    obx__rows rows = {0};
    const char *id = k->event_ids[c][0];
    obx_err e = obx__st_load_events(k->os, &id, 1, 0, &rows);
    const obx__sim_msg *m = !e && rows.n && rows.v[0].state == OBX__ST_DISPATCH_UNKNOWN
                                ? obx__sim_world_find(k->w, id, rows.v[0].envelope_gen)
                                : NULL;
    if (m) {
        char bad[OBX_DIGEST_LEN + 1];
        obx__strlcpy(bad, m->env.payload_digest, sizeof bad);
        bad[10] = bad[10] == 'a' ? 'b' : 'a';
        const char *ids[] = {id};
        obx__resolve_req q = {.ids = ids,
                              .n_ids = 1,
                              .accept = true,
                              .topic = m->topic,
                              .partition = m->partition,
                              .offset = digest ? m->offset : m->offset + 1000,
                              .payload_digest = digest ? bad : m->env.payload_digest,
                              .who = a->owner,
                              .reason = "sim: false evidence"};
        json_t *out = NULL;
        size_t refused = 0;
        e = obx__resolve(&a->e, k->now, &q, &out, &refused);
        json_decref(out);
        if (e == OBX_EREFUSED) {
            e = OBX_OK;
            refused = 1;
        }
        k->r.op_false_accepts++;
        k->r.op_false_refused += refused > 0;
        logv(k, "%s: resolve %s --accept with a false %s -> %s", a->owner, id,
             digest ? "digest" : "offset", refused ? "refused" : "ACCEPTED");
        h_add(k, 41 + refused);
    }
    obx__rows_free(&rows);
    check_err(k, a, e, "operator: false accept");
}

/* `obx poison redrive` of every parked copy of each consumer. */
static void operator_redrive(wk *k, actor *a) {
    for (int i = 0; i < k->nconsumers; i++) {
        char cid[16];
        snprintf(cid, sizeof cid, "consumer-%d", i);
        obx__poison_row *p = NULL;
        size_t n = 0;
        obx_err e = obx__st_poison_list(k->cs[i], cid, "PARKED", &p, &n);
        for (size_t j = 0; !e && j < n; j++) {
            e = obx_inbox_redrive(k->cs[i], cid, p[j].event_id);
            if (e == OBX_EREFUSED) e = OBX_OK;
            k->r.op_redrives++;
            logv(k, "%s: redrive %s of %s", a->owner, p[j].event_id, cid);
        }
        obx__poison_rows_free(p, n);
        h_add(k, n);
        check_err(k, a, e, "operator: redrive");
    }
}

static void operator_paths(wk *k, actor *a) {
    switch (rnd(k) % 5) {
    case 0: operator_no_change(k, a, 0); break;
    case 1: operator_no_change(k, a, 1); break;
    case 2: operator_no_change(k, a, 2); break;
    case 3: operator_false_accept(k, a); break;
    default: operator_redrive(k, a);
    }
}

/* The on-call operator: held UNKNOWNs (an alert) older than the reaction time are resolved with
 * `obx resolve`. An operator first reads the broker (kcat, a queue browser): a message of the
 * event's generation there is accepted as evidence (offset and the payload digest it carries;
 * obx checks it at the broker where the broker can be asked, and refuses it while the broker
 * cannot answer); otherwise, or when the evidence was refused, the event is retried to its
 * frozen destination. */
static void operator_step(wk *k, actor *a) {
    if (k->faults_on && rnd(k) % 4 == 0) operator_paths(k, a);
    if (k->now < k->op_next_at) return;
    k->op_next_at = k->now + OP_POLL_MS;
    obx__event_filter f = {.held = true, .limit = 32};
    obx__rows rows = {0};
    obx_err e =
        obx__st_read_events(k->os, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, &rows);
    check_err(k, a, e, "operator: list held");
    for (size_t i = 0; !e && i < rows.n; i++) {
        obx__event_row *r = &rows.v[i];
        if (!r->held_at || r->held_at + k->op_react_ms > k->now) continue;
        const obx__sim_msg *m = obx__sim_world_find(k->w, obx__wire_id(r), r->envelope_gen);
        const char *ids[] = {r->env.event_id};
        obx__resolve_req q = {.ids = ids,
                              .n_ids = 1,
                              .partition = -1,
                              .who = a->owner,
                              .reason = "on-call: held UNKNOWN past the alert"};
        if (m) {
            q.accept = true;
            q.topic = m->topic;
            q.partition = m->partition;
            q.offset = m->offset;
            q.payload_digest = m->env.payload_digest;
            q.attempt_id = m->attempt_id;
        }
        json_t *out = NULL;
        size_t refused = 0;
        e = obx__resolve(&a->e, k->now, &q, &out, &refused);
        json_decref(out);
        if (!e && m && refused) { /* not checkable now: the operator retries instead */
            m = NULL;
            q = (obx__resolve_req){.ids = ids,
                                   .n_ids = 1,
                                   .partition = -1,
                                   .who = a->owner,
                                   .reason = "on-call: evidence refused, same-target retry"};
            out = NULL;
            e = obx__resolve(&a->e, k->now, &q, &out, &refused);
            json_decref(out);
        }
        check_err(k, a, e, "operator: resolve");
        if (!e && !refused) {
            if (m)
                k->r.op_accepts++;
            else
                k->r.op_retries++;
        }
        logv(k, "%s: resolved held %s: %s%s", a->owner, r->env.event_id,
             m ? "accepted the broker's copy" : "same-target retry", refused ? " (refused)" : "");
        h_add(k, m ? 31 : 37);
    }
    obx__rows_free(&rows);
}

void obx__sim_step(wk *k, actor *a) {
    if (a->paused_until > k->now) return;
    switch (a->kind) {
    case A_PRODUCER: producer_step(k, a); break;
    case A_DISPATCHER: dispatcher_step(k, a); break;
    case A_RECONCILER: reconciler_step(k, a); break;
    case A_PURGER: purger_step(k, a); break;
    case A_MIGRATOR: migrator_step(k, a); break;
    case A_OPERATOR: operator_step(k, a); break;
    default: consumer_step(k, a);
    }
}

void obx__sim_route(wk *k, const char *topic, bool unordered) {
    obx_route r = {.event_type = "order.created.v1",
                   .cluster = "sim",
                   .topic = topic,
                   .routing_key = "{tenant}.{aggregate_id}",
                   .on_unknown = k->hold ? "hold" : "retry",
                   .unordered = unordered,
                   .max_attempts = 50};
    obx_err e = obx__route_set_at(k->os, &r, k->now, NULL);
    if (e) {
        k->r.internal_errors++;
        fail(k, "route set: %s", obx_errmsg());
    }
}

/* The trace's actors: a producer, two dispatchers, a reconciler, a purger (3 traces in 4), an
 * operator migrating the backlog (1 in 2), the on-call operator and one or two consumers. */
void obx__sim_actors_setup(wk *k) {
    k->nconsumers = 1 + (int)(rnd(k) % 2);
    k->na = 0;
    bool retention = rnd(k) % 4 != 0; /* a purger runs in 3 of 4 traces */
    bool migration = rnd(k) % 2 == 0; /* an operator migrating the backlog in half of them */
    k->replay_window_ms = (int64_t)(rnd(k) % 1500);
    k->purge_batch = 1 + (size_t)(rnd(k) % 3);
    int kinds[] = {A_PRODUCER, A_DISPATCHER, A_DISPATCHER, A_RECONCILER, A_PURGER,  A_MIGRATOR,
                   A_OPERATOR, A_CONSUMER,   A_CONSUMER,   A_CONSUMER,   A_CONSUMER};
    int index[] = {0, 1, 2, 0, 0, 0, 0, 0, 1, 0, 1};
    memset(k->runs, 0, sizeof k->runs);
    for (int i = 0; i < MAX_ACTORS; i++) { /* consumers: two instances per consumer ID */
        if ((kinds[i] == A_PURGER && !retention) || (kinds[i] == A_MIGRATOR && !migration) ||
            (kinds[i] == A_CONSUMER && index[i] >= k->nconsumers))
            continue;
        actor *a = &k->a[k->na++];
        /* everything but the delivery slots (~40 KB an actor, valid below ndl only): zeroing
         * them for every actor of every trace was 5% of the simulator's instructions */
        memset(a, 0, offsetof(actor, dl));
        a->ndl = a->posdl = 0;
        memset(a->to_ack, 0, sizeof a->to_ack);
        a->kind = kinds[i];
        a->index = index[i];
        a->instance = i >= 9;
        a->retry_cmd = -1;
        if (actor_start(k, a)) {
            k->r.internal_errors++;
            fail(k, "actor start: %s", obx_errmsg());
        }
    }
}

/* Actor i's turn in a liveness round: it does everything it has to do (no faults). */
void obx__sim_actor_live(wk *k, int i) {
    actor *a = &k->a[i];
    switch (a->kind) {
    case A_PRODUCER:
        while (a->next_cmd < k->n_events || a->retry_cmd >= 0) producer_step(k, a);
        break;
    case A_DISPATCHER: {
        size_t n = 0;
        poll_outcomes(k, a);
        int64_t now = relay_now(k, a);
        if (i == 1) check_err(k, a, obx__engine_sweep(&a->e, now, &n), "sweep");
        if (a->held.n) {
            check_err(k, a,
                      obx__engine_begin_attempts(&a->e, now, a->held.v, a->held.n,
                                                 OBX__ACT_DISPATCHER, &n),
                      "begin attempts");
            obx__rows_free(&a->held);
        }
        check_err(k, a, obx__engine_dispatch(&a->e, now, &n), "dispatch");
        break;
    }
    case A_RECONCILER:
        reconcile_all(k, a);
        poll_outcomes(k, a);
        break;
    case A_PURGER: purger_step(k, a); break;
    case A_MIGRATOR: break; /* the migrating operator is done */
    case A_OPERATOR: operator_step(k, a); break;
    default: /* a consumer ID's second instance: one round (the first one drains the rest) */
        for (int rep = 0; rep < (a->instance ? 1 : 4); rep++) {
            consumer_fetch(k, a);
            while (a->posdl < a->ndl) consumer_process_one(k, a);
            consumer_ack_all(k, a);
        }
    }
}

/*
 * faults.c — the fault classes of the simulator (the fault model of docs/model.md): their
 * names (`obx sim --faults`), which are on in a trace and with what probability, their
 * injection — in the simulated cluster and network (lost, late, timed-out, duplicated and
 * mangled ACKs, lost requests, rejections, an unqueryable target, duplicated and reordered
 * deliveries, lost consumer commits: set here, fired by src/broker/sim), between two steps
 * (crashes, pauses past a lease, a route policy revision) and inside the actors' steps (kills
 * around a commit, acceptance rollback, handler failures, premature purges, the two races, two
 * instances of a consumer ID taking one message at once; actors.c draws those with k->p[]) —
 * and the count of each that fired. The copies the relay never sent (issue 46: good headers
 * with another body, a corrupt copy before the genuine one, a foreign copy) and late
 * rejections are set here and made by src/broker/sim. A relay's host clock steps between two
 * steps (relay-clock-step, issue 46, item 10): the relay decides on the database server's clock
 * (actors.c, relay_now), so the step must move nothing. Delayed events (delayed-event) and
 * handlers failing a drawn number of times under the inbox's back-off (handler-backoff) are
 * drawn here per trace (issue 51, item 3) and made by the producer and the consumers' handlers
 * (actors.c).
 */
#include "sim/sim.h"

#include <string.h>

static const char *const fault_names[F_COUNT] = {
#define F(n, s) s,
    FAULT_LIST(F)
#undef F
};

size_t obx_sim_fault_count(void) { return F_COUNT; }

const char *obx_sim_fault_name(size_t i) { return i < F_COUNT ? fault_names[i] : NULL; }

obx_err obx_sim_fault_index(const char *name, int *out) {
    for (int i = 0; i < F_COUNT; i++)
        if (name && !strcmp(name, fault_names[i])) {
            *out = i;
            return OBX_OK;
        }
    return obx__fail(OBX_EINVAL, "fault: unknown class '%s'", name ? name : "(null)");
}

/* Delayed events and failing handlers with back-off (issue 51, item 3), when their classes are
 * on: about one command in seven carries a delay of 1 to 30 s or of 30 s to 5 min (virtual);
 * about one (consumer ID, command) pair in sixteen has a handler that fails 1 to 3 times before it
 * succeeds, and the inboxes retry on a back-off whose base (0.1 to 2 s) and maximum (up to 30 s)
 * are drawn, with a seeded jitter. With handler-backoff off the inboxes retry without back-off. */
static void draw_delays_and_backoff(wk *k) {
    bool delays = k->p[F_DELAYED_EVENT] > 0, backoff = k->p[F_HANDLER_BACKOFF] > 0;
    memset(k->delay_ms, 0, sizeof k->delay_ms);
    memset(k->not_before, 0, sizeof k->not_before);
    memset(k->fail_left, 0, sizeof k->fail_left);
    memset(k->retry_at, 0, sizeof k->retry_at);
    for (int c = 0; delays && c < k->n_events; c++)
        if (rnd(k) % 7 == 0)
            k->delay_ms[c] =
                rnd(k) % 2 ? 1000 + (int64_t)(rnd(k) % 29000) : 30000 + (int64_t)(rnd(k) % 270000);
    k->backoff_ms = k->backoff_max_ms = 0;
    if (backoff) {
        k->backoff_ms = 100 + (int64_t)(rnd(k) % 1900);
        k->backoff_max_ms = k->backoff_ms * (int64_t)(2 + rnd(k) % 15);
        if (k->backoff_max_ms > 30000) k->backoff_max_ms = 30000;
        for (int i = 0; i < 2; i++)
            for (int c = 0; c < k->n_events; c++)
                if (rnd(k) % 16 == 0) k->fail_left[i][c] = (unsigned char)(1 + rnd(k) % 3);
    }
    for (int i = 0; i < 2; i++)
        obx__inbox_set_backoff(k->in[i], k->backoff_ms, k->backoff_max_ms, rnd(k));
}

void obx__sim_faults_draw(wk *k) {
    const obx_sim_options *o = k->o;
    for (int f = 0; f < F_COUNT; f++) {
        bool on = o->faults_mask ? (o->faults_mask >> f & 1) : true;
        k->p[f] = on && rnd(k) % 4 ? 1.0 : 0.0; /* each class on in ~3/4 of the traces */
    }
    int64_t lease = k->base.lease_ms;
    obx__sim_faults sf = {.drop_ack = k->p[F_TIMED_OUT_ACK] * 0.15,
                          .lose_ack = k->p[F_LOST_ACK] * 0.10,
                          .delay_ack = (k->p[F_DELAYED_ACK] + k->p[F_CLAIM_EXPIRY_LATE_ACK]) * 0.12,
                          .dup_append = k->p[F_DUPLICATE_APPEND] * 0.10,
                          .blackhole = k->p[F_LOST_REQUEST] * 0.08,
                          .reject = k->p[F_REJECTION] * 0.05,
                          .corrupt = k->p[F_MANGLED_RECEIPT] * 0.05,
                          .dup_deliver = k->p[F_DUPLICATED_DELIVERY] * 0.20,
                          .lose_commit = k->p[F_CONSUMER_COMMIT_LOST_ACK] * 0.15,
                          .forge_body = k->p[F_FORGED_BODY] * 0.04,
                          .corrupt_before = k->p[F_CORRUPT_BEFORE_GENUINE] * 0.04,
                          .foreign_before = k->p[F_FOREIGN_COPY] * 0.03,
                          .late_reject = k->p[F_LATE_REJECTION] * 0.5,
                          /* a delayed ACK arrives after the sender's lease: a late ACK */
                          .delay_ack_ms = lease + 5000,
                          .ack_timeout_ms = k->ad->ack_timeout_ms,
                          .max_net_delay_ms = 150,
                          .quiet_ms = k->ad->quiet_ms};
    obx__sim_world_reset(k->w, rnd(k), &sf, 1 + (int32_t)(rnd(k) % 4), k->ad->lookup, "sim");
    draw_delays_and_backoff(k);
    for (int f = 0; f < F_COUNT; f++) k->p[f] *= 0.03; /* per-step injection probabilities */
    k->p[F_KILL_BEFORE_COMMIT] *= 3;
    k->p[F_KILL_AFTER_COMMIT] *= 3;
    k->p[F_ACCEPTANCE_ROLLBACK] *= 2;
    k->p[F_HANDLER_FAILURE] *= 3;
    /* the two races are injected where their window opens (a retry claimed, a retry sent):
     * often, since the window is rare */
    k->p[F_UNKNOWN_RACING_RETRY] = k->p[F_UNKNOWN_RACING_RETRY] > 0 ? 0.5 : 0;
    k->p[F_BOTH_ATTEMPTS_ACKED] = k->p[F_BOTH_ATTEMPTS_ACKED] > 0 ? 0.5 : 0;
    /* a delivery's handler runs while the other instance of its consumer ID takes the same
     * message (actors.c, effect_handler) */
    k->p[F_CONCURRENT_INSTANCES] = k->p[F_CONCURRENT_INSTANCES] > 0 ? 0.3 : 0;
    /* a consumer waiting out a retry's back-off gets the message back early (a requeue; a
     * fetch step of the fault phase in five): the inbox must not run it yet */
    k->p[F_HANDLER_BACKOFF] = k->p[F_HANDLER_BACKOFF] > 0 ? 0.2 : 0;
}

void obx__sim_faults_between(wk *k, bool unordered) {
    int64_t lease = k->base.lease_ms;
    if (chance(k, k->p[F_ACTOR_CRASH])) {
        actor *v = &k->a[1 + rnd(k) % (uint64_t)(k->na - 1)];
        logv(k, "%s crashes", v->owner);
        obx__sim_actor_crash(k, v);
        k->r.fired[F_ACTOR_CRASH]++;
    }
    if (chance(k, k->p[F_PAUSE_PAST_LEASE] + k->p[F_CLAIM_EXPIRY_LATE_ACK])) {
        actor *v = &k->a[1 + rnd(k) % (uint64_t)(k->na - 1)];
        v->paused_until = k->now + lease + 200 + (int64_t)(rnd(k) % (uint64_t)(lease * 3 / 2));
        logv(k, "%s pauses until t=%lld", v->owner, (long long)(v->paused_until - 1700000000000LL));
        k->r.fired[F_PAUSE_PAST_LEASE]++;
    }
    if (!k->revised && chance(k, k->p[F_ROUTE_REVISION])) {
        /* only later events may use it (the same UNKNOWN policy) */
        obx__sim_route(k, "orders-v2", unordered);
        k->revised = true;
        k->r.fired[F_ROUTE_REVISION]++;
        logv(k, "route policy revised: later events go to orders-v2");
    }
    obx__sim_faults *wf = obx__sim_world_faults(k->w);
    bool down = chance(k, k->p[F_TARGET_UNQUERYABLE] * 3);
    if (down != wf->lookup_down) {
        wf->lookup_down = down;
        if (down) k->r.fired[F_TARGET_UNQUERYABLE]++;
    }
    if (chance(k, k->p[F_RELAY_CLOCK_STEP])) {
        /* a dispatcher's or the reconciler's host clock (actors 1-3) steps forwards or
         * backwards by up to four leases (NTP after a suspend, an operator's date -s) */
        actor *v = &k->a[1 + rnd(k) % 3];
        int64_t span = 4 * lease, step = (int64_t)(rnd(k) % (uint64_t)(2 * span + 1)) - span;
        v->host_off += step;
        k->r.fired[F_RELAY_CLOCK_STEP]++;
        logv(k, "%s: host clock steps %+lld ms (now %+lld ms off)", v->owner, (long long)step,
             (long long)v->host_off);
    }
}

void obx__sim_faults_stop(wk *k) {
    int64_t lease = k->base.lease_ms;
    obx__sim_faults none = {.delay_ack_ms = lease + 5000,
                            .ack_timeout_ms = k->ad->ack_timeout_ms,
                            .max_net_delay_ms = 150,
                            .quiet_ms = k->ad->quiet_ms};
    *obx__sim_world_faults(k->w) = none;
    for (int i = 0; i < k->na; i++) k->a[i].paused_until = 0;
}

void obx__sim_faults_collect(wk *k) {
    const obx__sim_fired *wf = obx__sim_world_fired(k->w);
    k->r.fired[F_LOST_ACK] += wf->lose_ack;
    k->r.fired[F_TIMED_OUT_ACK] += wf->drop_ack;
    k->r.fired[F_DELAYED_ACK] += wf->delay_ack;
    k->r.fired[F_DUPLICATE_APPEND] += wf->dup_append;
    k->r.fired[F_LOST_REQUEST] += wf->blackhole;
    k->r.fired[F_REJECTION] += wf->reject;
    k->r.fired[F_MANGLED_RECEIPT] += wf->corrupt;
    k->r.fired[F_DUPLICATED_DELIVERY] += wf->dup_deliver;
    k->r.fired[F_REORDERED_DELIVERY] += wf->reorder;
    k->r.fired[F_CONSUMER_COMMIT_LOST_ACK] += wf->lose_commit;
    k->r.fired[F_FORGED_BODY] += wf->forge_body;
    k->r.fired[F_CORRUPT_BEFORE_GENUINE] += wf->corrupt_before;
    k->r.fired[F_FOREIGN_COPY] += wf->foreign_before;
    k->r.fired[F_LATE_REJECTION] += wf->late_reject;
}

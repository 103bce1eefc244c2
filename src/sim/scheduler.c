/*
 * scheduler.c — the deterministic simulator and the release gate (docs/model.md): `obx sim`.
 * This file owns the virtual clock, the phases of a trace and the worker threads; the other
 * files of src/sim are listed in sim.h.
 *
 * It runs the production engine code (the real store — SQLite in memory, or PostgreSQL with
 * --db — the real engine step functions, the real inbox) against the simulated broker
 * (src/broker/sim) under a virtual clock, over seeded traces. A trace:
 *   1. a fault phase: a seeded scheduler interleaves actors one step at a time — a producer
 *      (business transactions with their envelopes, retrying commands with the same
 *      idempotency key after it crashes), two dispatchers, a reconciler, a purger, one or two
 *      consumers with the inbox — and injects the fault classes of §9 between any two steps
 *      (crashes: an actor loses its memory; pauses past a lease; a relay's host clock
 *      steps), in the broker and the network (lost, late, timed-out, duplicated and mangled
 *      ACKs, lost requests, rejections, unqueryable target, duplicated and reordered
 *      deliveries, lost consumer commits) and in the store
 *      (acceptance rolled back), plus a route policy revision;
 *   2. a liveness phase: faults stop, every actor runs until the system is quiescent;
 *   3. the checkers: lost events, second logical event IDs, cross-destination retries, digest
 *      divergence, duplicate consumer effects, sends under a stale claim, late valid ACKs
 *      converged to the publish slot or the duplicate log, UNKNOWNs traceable by attempt, and
 *      UNKNOWN resolution times.
 *
 * Timings (docs/model.md, "The release gate"): every trace runs on the relay's shipped defaults
 * (leases, recheck back-off, backoff, sweep and reconcile intervals: obx_config_new()) and on
 * the timings of one adapter drawn per trace as production would have it — Kafka (authoritative
 * lookup, UNKNOWN after message.timeout.ms, quiet time message.timeout.ms + request.timeout.ms),
 * RabbitMQ without and with an audit stream (no lookup / best effort, confirm timeout, quiet
 * time confirm timeout + 2 heartbeats) or the local log — with the route's UNKNOWN policy drawn
 * too (retry, the default, or hold). An on-call operator is an actor: held UNKNOWNs older than
 * their reaction time are resolved with `obx resolve` (evidence found at the broker, or a
 * same-target retry). Virtual time jumps to the next due lease, check or network event when
 * nothing else is due, so a trace covers hours of production time in a few milliseconds.
 *
 * Determinism: trace i is a pure function of (seed, i): its own RNG, virtual clock, seeded IDs.
 * Each worker thread owns a world (databases, a simulated cluster) and runs a trace inside
 * outer transactions that are rolled back afterwards, so traces do not see each other: on
 * PostgreSQL each worker has its own connection, every engine transaction is a savepoint of
 * the trace's transaction, and the checkers read the outbox through the same connection.
 * The trace hash combines per-trace digests in trace order, so --jobs does not change it.
 */
#include "sim/sim.h"

#include <openssl/evp.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* The adapters a trace may run on, with their shipped timings (docs/kafka.md, docs/amqp.md). */
const adapter obx__sim_adapters[4] = {
    /* message.timeout.ms 300 s; quiet = that + request.timeout.ms 30 s */
    {"kafka", OBX__SIM_LOOKUP_AUTHORITATIVE, 300000, 330000},
    /* confirm_timeout_ms 30 s; quiet = that + 2 x heartbeat 30 s */
    {"amqp", OBX__SIM_LOOKUP_NONE, 30000, 90000},
    {"amqp-stream", OBX__SIM_LOOKUP_BEST_EFFORT, 30000, 90000},
    /* the local log broker: a synchronous append, no late write after the deadline */
    {"log", OBX__SIM_LOOKUP_AUTHORITATIVE, 1000, 0},
};

/* Whether the ordered event i waits for an earlier event of its key (cluster, topic, routing
 * key) that is not yet published: the claim's per-key order (the store's claim query), under
 * which it is not claimable, whatever its own backoff or lease says. The events are in seq
 * order. */
static bool behind_its_key(const obx__sim_snap *s, size_t i) {
    const obx__event_row *ev = &s->ev.v[i];
    if (ev->unordered) return false;
    for (size_t j = 0; j < i; j++) {
        const obx__event_row *p = &s->ev.v[j];
        if (obx__sim_published(p->state) || p->state == OBX__ST_CANCELLED) continue;
        if (!strcmp(p->dest.cluster, ev->dest.cluster) && !strcmp(p->dest.topic, ev->dest.topic) &&
            !strcmp(p->dest.routing_key, ev->dest.routing_key))
            return true;
    }
    return false;
}

/* When the next thing is due: a lease ends, a check or a backoff is due, a network event
 * arrives, the operator's next look at held events. An event claimable only after an earlier
 * one of its key is published is due when that one is. INT64_MAX: nothing scheduled. */
static int64_t next_due(wk *k, const obx__sim_snap *s) {
    int64_t t = obx__sim_world_next_at(k->w);
    /* a consumer's retry after its back-off (simdelay, issue 51; a delayed event's not_before is
     * its available_at, below) */
    int64_t retry = obx__sim_retry_next_at(k);
    if (retry < t) t = retry;
    int64_t held = INT64_MAX; /* the earliest held_at */
    for (size_t i = 0; i < s->ev.n; i++) {
        const obx__event_row *ev = &s->ev.v[i];
        int64_t at = INT64_MAX; /* a lease end, a check or a backoff end */
        if (ev->state == OBX__ST_SENDING || ev->state == OBX__ST_RECONCILING ||
            ev->state == OBX__ST_RETRY_CLAIMED)
            at = ev->lease_until;
        else if (ev->state == OBX__ST_CLAIMED)
            at = behind_its_key(s, i) ? INT64_MAX : ev->lease_until;
        else if (ev->state == OBX__ST_DISPATCH_UNKNOWN)
            at = ev->next_check_at;
        else if (ev->state == OBX__ST_PENDING)
            at = behind_its_key(s, i) ? INT64_MAX : ev->available_at;
        if (at < t) t = at;
        if (ev->held_at > 0 && ev->held_at < held) held = ev->held_at;
    }
    if (held != INT64_MAX) { /* held: the operator reacts, on its round */
        int64_t op_at =
            held + k->op_react_ms > k->op_next_at ? held + k->op_react_ms : k->op_next_at;
        if (op_at < t) t = op_at;
    }
    return t;
}

/* The trace's world drawn from (seed, idx): events, the adapter and the route's UNKNOWN
 * policy, evidence, the operator, the faults, the actors. Returns whether the route is
 * unordered. The order of the draws is part of the trace_hash. */
static bool trace_setup(wk *k, long idx) {
    const obx_sim_options *o = k->o;
    k->idx = idx;
    k->rng = mix(o->seed ^ mix((uint64_t)idx + 1));
    k->hash = 0xcbf29ce484222325ull;
    k->now = 1700000000000LL;
    k->failure[0] = '\0';
    memset(&k->r, 0, sizeof k->r);
    k->r.traces = 1;
    /* this trace's world */
    k->n_events = 2 + (int)(rnd(k) % 4);
    snprintf(k->tenant, sizeof k->tenant, "t%ld", idx);
    for (int i = 0; i < k->n_events; i++) {
        snprintf(k->orders[i], sizeof k->orders[i], "order-%d", i);
        k->n_ids[i] = 0;
    }
    /* the adapter and the route's UNKNOWN policy, as production would have them: the default
     * policy (retry) in most traces, hold in a fifth */
    uint64_t pick = rnd(k) % 20;
    int ai = pick < 7 ? 0 : pick < 14 ? 1 : pick < 17 ? 2 : 3;
    k->ad = &obx__sim_adapters[ai];
    k->r.adapter_traces[ai] = 1;
    k->hold = rnd(k) % 5 == 0;
    k->r.hold_traces = k->hold;
    k->evidence = rnd(k) % 2; /* the reconciler consults the consumers in half of them */
    k->op_react_ms = OP_REACT_MIN_MS + (int64_t)(rnd(k) % (OP_REACT_MAX_MS - OP_REACT_MIN_MS));
    k->op_next_at = 0;
    bool unordered = rnd(k) % 4 == 0;
    obx__sim_faults_draw(k);
    obx__sim_trace_begin(k);
    obx__sim_route(k, "orders", unordered);
    obx__sim_actors_setup(k);
    if (k->verbose)
        fprintf(stderr,
                "trace %ld: %d events, adapter %s (quiet %lld ms), UNKNOWN policy %s, %s, %d "
                "consumers%s, operator reacts after %lld s\n",
                idx, k->n_events, k->ad->name, (long long)k->ad->quiet_ms,
                k->hold ? "hold" : "retry", unordered ? "unordered" : "ordered per key",
                k->nconsumers, k->evidence ? " (evidence)" : "",
                (long long)(k->op_react_ms / 1000));
    return unordered;
}

/* 1. The fault phase: a seeded scheduler interleaves the actors one step at a time and
 * injects faults between any two steps; virtual time advances between steps on the scale of
 * the shipped lease. */
static void fault_phase(wk *k, bool unordered) {
    int64_t lease = k->base.lease_ms;
    k->faults_on = true;
    int steps = 60 + (int)(rnd(k) % 90);
    k->revised = false;
    for (int s = 0; s < steps && !k->failure[0]; s++) {
        actor *a = &k->a[rnd(k) % (uint64_t)k->na];
        h_add(k, (uint64_t)(a - k->a));
        obx__sim_world_clock(k->w, k->now); /* the broker's and network's time: the server's */
        obx__sim_step(k, a);
        obx__sim_world_tick(k->w, k->now);
        obx__sim_faults_between(k, unordered);
        /* time between two steps, on the scale of the shipped lease: mostly a fraction of a
         * second, sometimes a good part of a lease */
        k->now += (int64_t)(rnd(k) % (uint64_t)(lease / 25));
        if (rnd(k) % 20 == 0) k->now += lease / 5 + (int64_t)(rnd(k) % (uint64_t)lease);
    }
}

/* What is stuck after a failed liveness phase (--replay narrates it). */
static void narrate_stuck(wk *k) {
    obx__sim_snap s;
    if (obx__sim_snap_load(k, false, &s)) return;
    for (size_t i = 0; i < s.ev.n; i++) {
        const obx__event_row *ev = &s.ev.v[i];
        fprintf(stderr, "    %s %s claim_gen=%lld owner=%s lease_until=%lld next=%lld\n",
                ev->env.event_id, obx__state_name(ev->state), (long long)ev->claim_gen, ev->owner,
                (long long)(ev->lease_until - 1700000000000LL),
                (long long)(ev->next_check_at - 1700000000000LL));
    }
    obx__sim_snap_free(&s);
}

/* 2. Liveness: faults stop, every actor runs in rounds until the system is quiescent. */
static void liveness_phase(wk *k) {
    k->faults_on = false;
    obx__sim_faults_stop(k);
    bool done = false;
    for (int round = 0; round < 1000 && !done && !k->failure[0]; round++) {
        obx__sim_world_clock(k->w, k->now);
        for (int i = 0; i < k->na; i++) obx__sim_actor_live(k, i);
        obx__sim_world_tick(k->w, k->now);
        /* a network event still on its way, due before the next sweep: not quiescent, and
         * nothing in the outbox can be due sooner, so the clock steps one sweep without
         * reading the outbox */
        if (obx__sim_world_pending(k->w) && obx__sim_world_next_at(k->w) <= k->now + k->sweep_ms) {
            k->now += k->sweep_ms;
            continue;
        }
        obx__sim_snap s; /* the outbox after the round: is it done, what is due next */
        if (obx__sim_snap_load(k, false, &s)) {
            k->r.internal_errors++;
            fail(k, "sim: cannot read the outbox: %s", obx_errmsg());
            break;
        }
        done = obx__sim_quiescent(k, &s) && obx__sim_world_pending(k->w) == 0;
        /* the relay sweeps and reconciles every second; when nothing is due sooner, virtual
         * time jumps to the next lease end, check, backoff end, network event or operator
         * round (a Kafka UNKNOWN waits out a quiet time of 5.5 minutes) */
        int64_t due = next_due(k, &s), stepms = k->sweep_ms;
        obx__sim_snap_free(&s);
        if (due > k->now + stepms && due != INT64_MAX) stepms = due - k->now;
        k->now += stepms;
    }
    if (!done && !k->failure[0]) {
        k->r.liveness_failures++;
        fail(k, "not quiescent after the liveness phase (%zu network events pending)",
             obx__sim_world_pending(k->w));
        if (k->verbose) narrate_stuck(k);
    }
}

/* Trace idx, a pure function of (seed, idx): setup, the two phases, the checkers; then the
 * outer transactions roll back, so the next trace starts from empty databases. */
static void run_trace(wk *k, long idx) {
    bool unordered = trace_setup(k, idx);
    fault_phase(k, unordered);
    liveness_phase(k);
    obx__sim_check_trace(k);
    /* 3. leave no trace behind for the next one */
    for (int i = 0; i < k->na; i++) obx__sim_actor_stop(&k->a[i]);
    obx__sim_trace_end(k);
}

/* ---- running many traces ------------------------------------------------------------------------
 */

typedef struct run {
    const obx_sim_options *o;
    long next; /* atomic */
    long done; /* atomic */
    int stop;  /* atomic: fail_fast saw a failure */
    uint64_t *hashes;
    results total;
    int64_t *res_ms;
    size_t nres;
    pthread_mutex_t mu;
    obx_err err;
    char errmsg[512];
} run;

typedef struct thr {
    run *r;
    int id;
    pthread_t th;
} thr;

static void *worker_main(void *arg) {
    thr *t = arg;
    run *r = t->r;
    wk *k = calloc(1, sizeof *k);
    obx_err e = k ? obx__sim_wk_init(k, t->id, r->o) : obx__fail(OBX_ENOMEM, "sim: out of memory");
    results acc;
    memset(&acc, 0, sizeof acc);
    if (!e) {
        k->verbose = r->o->replay >= 0;
        for (;;) {
            long i = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
            long idx = r->o->replay >= 0 ? r->o->replay : i;
            if (r->o->replay >= 0 ? i > 0 : i >= r->o->traces) break;
            if (__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) break;
            run_trace(k, idx);
            if (r->o->fail_fast && k->failure[0]) __atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
            r->hashes[r->o->replay >= 0 ? 0 : i] = k->hash;
            long nf = acc.nfailing;
            obx__sim_results_add(&acc, &k->r);
            for (long j = 0; j < k->r.nfailing && nf + j < 16; j++)
                acc.failing[acc.nfailing++] = k->r.failing[j];
            if (k->r.first_failure[0] && !acc.first_failure[0])
                obx__strlcpy(acc.first_failure, k->r.first_failure, sizeof acc.first_failure);
            long d = __atomic_add_fetch(&r->done, 1, __ATOMIC_RELAXED);
            if (r->o->progress && (d % 1000 == 0 || d == r->o->traces))
                r->o->progress(r->o->progress_user, d, r->o->replay >= 0 ? 1 : r->o->traces);
        }
    }
    pthread_mutex_lock(&r->mu);
    if (e && !r->err) {
        r->err = e;
        obx__strlcpy(r->errmsg, obx_errmsg(), sizeof r->errmsg);
    }
    long nf = r->total.nfailing;
    obx__sim_results_add(&r->total, &acc);
    for (long j = 0; j < acc.nfailing && nf + j < 16; j++)
        r->total.failing[r->total.nfailing++] = acc.failing[j];
    if (acc.first_failure[0] && !r->total.first_failure[0])
        obx__strlcpy(r->total.first_failure, acc.first_failure, sizeof r->total.first_failure);
    if (k && k->nres) {
        int64_t *p = realloc(r->res_ms, (r->nres + k->nres) * sizeof *p);
        if (p) {
            memcpy(p + r->nres, k->res_ms, k->nres * sizeof *p);
            r->res_ms = p;
            r->nres += k->nres;
        }
    }
    pthread_mutex_unlock(&r->mu);
    if (k) obx__sim_wk_free(k);
    free(k);
    return NULL;
}

/* Checks the options, sets the mutation and, on PostgreSQL, creates the schema once, before
 * the workers' trace transactions. */
static obx_err run_prepare(const obx_sim_options *o) {
    if (o->traces < 1 && o->replay < 0)
        return obx__fail(OBX_EINVAL, "traces: %ld is below 1", o->traces);
    if (o->jobs < 1 || o->jobs > 64)
        return obx__fail(OBX_EINVAL, "jobs: %d outside 1..64", o->jobs);
    obx_err e = obx__mutation_set(o->mutation);
    if (e) return e;
    if (o->db_url) {
        if (strncmp(o->db_url, "postgres://", 11) && strncmp(o->db_url, "postgresql://", 13))
            return obx__fail(OBX_EINVAL,
                             "db: the simulator runs on SQLite in memory (default) or a "
                             "postgres:// URL, not '%.40s'",
                             o->db_url);
        obx_store *s;
        if ((e = obx_store_open(o->db_url, &s))) return e;
        e = obx_store_init(s);
        obx_store_close(s);
        if (e) return e;
    }
    /* SQLite's memory statistics take a process-wide mutex on every allocation; the workers
     * share nothing else. Fails harmlessly (SQLITE_MISUSE) if SQLite is already initialized. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    obx__sim_malloc_install(); /* small blocks recycled per thread (sim_malloc.c) */
    return OBX_OK;
}

/* Runs the n traces on jobs worker threads into r; false: out of memory. */
static bool run_workers(run *r, int jobs) {
    thr *t = calloc((size_t)jobs, sizeof *t);
    if (!t) return false;
    for (int i = 0; i < jobs; i++) {
        t[i].r = r;
        t[i].id = i;
        pthread_create(&t[i].th, NULL, worker_main, &t[i]);
    }
    for (int i = 0; i < jobs; i++) pthread_join(t[i].th, NULL);
    free(t);
    return true;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The trace hash (per-trace digests in trace order: independent of --jobs) and the UNKNOWN
 * resolution percentiles (virtual seconds) of a finished run, into s. */
static void run_summary(run *r, long n, obx__sim_summary *s, char hash[65]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(r->hashes, (size_t)n * sizeof *r->hashes, md, &mdlen, EVP_sha256(), NULL);
    obx__hex(md, 32, hash);
    s->hash = hash;
    s->nres = r->nres;
    if (r->nres) {
        qsort(r->res_ms, r->nres, sizeof *r->res_ms, cmp_i64);
        s->p50 = (double)r->res_ms[(size_t)(0.50 * (double)(r->nres - 1))] / 1000.0;
        s->p99 = (double)r->res_ms[(size_t)(0.99 * (double)(r->nres - 1) + 0.5)] / 1000.0;
        s->maxs = (double)r->res_ms[r->nres - 1] / 1000.0;
    }
}

obx_err obx_sim_run(const obx_sim_options *o, char **out) {
    if (!o || !out) return obx__fail(OBX_EINVAL, "sim: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx_err e = run_prepare(o);
    if (e) return e;
    run r;
    memset(&r, 0, sizeof r);
    r.o = o;
    pthread_mutex_init(&r.mu, NULL);
    long n = o->replay >= 0 ? 1 : o->traces;
    int jobs = o->replay >= 0 ? 1 : o->jobs;
    r.hashes = calloc((size_t)n, sizeof *r.hashes);
    int64_t t0 = obx__mono_ms();
    bool ran = r.hashes && run_workers(&r, jobs);
    int64_t t1 = obx__mono_ms();
    obx__mutation_set(NULL);
    if (!ran || r.err) {
        free(r.hashes);
        free(r.res_ms);
        pthread_mutex_destroy(&r.mu);
        return ran ? obx__fail(r.err, "%s", r.errmsg) : obx__fail(OBX_ENOMEM, "sim: out of memory");
    }
    obx__sim_summary s = {.o = o, .x = &r.total, .jobs = jobs, .n = n};
    char hash[65];
    run_summary(&r, n, &s, hash);
    s.secs = (double)(t1 - t0) / 1000.0;
    json_t *j = obx__sim_report(&s);
    free(r.hashes);
    free(r.res_ms);
    pthread_mutex_destroy(&r.mu);
    return obx__json_out(j, out);
}

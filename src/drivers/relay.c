/*
 * relay.c — the relay daemon: threads and timers around the engine's step functions.
 *
 *   dispatcher threads (relay.dispatchers): each with its own store and broker connection and
 *     engine: collect outcomes, claim + send while fewer than relay.window are in flight,
 *     idle-wait on the store's wake-up hint (PostgreSQL NOTIFY) or relay.poll_ms; those beyond
 *     the first claim only during a backlog and wait for it instead (follower_wait);
 *     dispatcher 0 also sweeps expired SENDING leases every relay.sweep_ms.
 *   reconciler thread (relay.reconciler): reconcile every relay.reconcile_ms, and collect the
 *     outcomes of its retries.
 *   auditor thread (retention.c; audit.interval_ms, retention.interval_ms): the three-set audit
 *     whose counts /metrics exports, and (when configured) the purge.
 *
 *   shadow mode (relay.shadow): instead of all of the above, one thread that claims nothing and
 *     sends nothing: every relay.shadow_interval_ms it compares what obx would send for the
 *     events of relay.aliases with what was published (the broker, or relay.shadow_feed), logs
 *     the differences and exports their counts (docs/migration.md).
 *
 * Work is always found by querying committed rows: a wake-up only makes the next query come
 * sooner (docs/design.md, "Claims, attempts and fencing"). Stop: threads stop claiming, drain
 * in-flight outcomes for up to relay.drain_ms (so late ACKs reach the acceptance point), close,
 * exit. A killed relay needs no cleanup: its leases expire and another relay's sweeper and
 * reconciler take over.
 */
#include "drivers/config.h"
#include "drivers/deps.h"
#include "drivers/http.h"
#include "drivers/log.h"
#include "drivers/observe.h"
#include "drivers/otel.h"
#include "drivers/retention.h"

#include <errno.h>
#include <stdatomic.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_THREADS = 66 };

typedef struct worker {
    obx_relay *r;
    int index; /* dispatcher index, -1 for the reconciler, -2 for the shadow comparer */
    pthread_t th;
    bool started;
    obx__engine_stats st; /* published under r->mu */
    /* histograms: live ones touched only by the worker's thread, copies published under r->mu
     * with the counters (no lock per event) */
    obx__hist latency, resolution;
    obx__hist latency_pub, resolution_pub;
    unsigned down;        /* the dependencies this thread fails on now (deps.h) */
    int fails;            /* consecutive failed tries: the back-off's exponent */
    size_t in_flight;     /* messages handed to the broker without an outcome, under r->mu */
    int64_t clock_synced; /* obx__mono_ms of this thread's last clock_sync, 0 never */
} worker;

struct obx_relay {
    obx_config *cfg;
    char id[201];
    atomic_int stop;
    atomic_int stop_now; /* stop without draining (obx_relay_stop_now) */
    atomic_int ended;    /* worker threads that have returned */
    pthread_mutex_t mu;
    obx_err first_err;
    char first_msg[1024];
    worker w[MAX_THREADS];
    int n;
    _Atomic int64_t last_claim_us; /* when a dispatcher of this relay last began a claim (mono) */
    atomic_bool backlog; /* the last claim took a whole batch (claim_due: dispatchers beyond 0) */
    /* claims that took a whole batch, counted under wake_mu, each broadcast on wake_cv: what the
     * dispatchers beyond the first wait for (follower_wait) */
    uint64_t backlog_gen;
    pthread_mutex_t wake_mu;
    pthread_cond_t wake_cv; /* on CLOCK_MONOTONIC */
    void *http;
    void *auditor; /* retention.c; NULL when audit and purge intervals are both 0 */
    int64_t started_at;
    obx__shadow_counts shadow; /* the last comparison (shadow mode), under mu */
    obx__relay_view view;      /* what the HTTP server and the auditor see (relay_view.h) */
    obx__deps deps;            /* database, schema, broker: up or down (deps.h) */
    obx_otel *otel;            /* spans (otel.h); NULL when otel.endpoint is empty */
    obx_keyring *keys;         /* encryption.keys; NULL when empty */
};

static void view_totals(obx_relay *r, obx__engine_stats *t);
static bool view_stopping(obx_relay *r);
static bool view_ready(obx_relay *r, char *why, size_t cap);
static void view_audit_metrics(obx_relay *r, obx__buf *b);
static void view_hists(obx_relay *r, obx__hist *latency, obx__hist *resolution);
static int view_dispatchers(obx_relay *r, obx__dispatcher_counts *out, int cap);

static void sleep_ms(int64_t ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* Sleeps up to ms, in slices that look at the stop flag: a back-off of many seconds must not
 * hold up a stop. */
static void stop_sleep(obx_relay *r, int64_t ms) {
    int64_t until = obx__mono_ms() + ms;
    for (int64_t left; !atomic_load(&r->stop) && (left = until - obx__mono_ms()) > 0;)
        sleep_ms(left < 50 ? left : 50);
}

static void fatal(obx_relay *r, obx_err e, const char *what) {
    pthread_mutex_lock(&r->mu);
    if (!r->first_err) {
        r->first_err = e;
        snprintf(r->first_msg, sizeof r->first_msg, "%s: %s", what, obx_errmsg());
    }
    pthread_mutex_unlock(&r->mu);
    obx__log(OBX__LOG_ERROR, "relay", NULL, NULL, NULL, "%s: %s: %s", what, obx_errname(e),
             obx_errmsg());
    atomic_store(&r->stop, 1);
}

/* One log record per event that needs attention (level by how much), and the histograms.
 * Routine acceptances log at debug only: at thousands of events a second an info line each
 * would drown everything else. Each kind is folded during an incident (obx__log_event: past
 * log.fold_after a window, one line counts the rest); the metrics count every one. */
static void on_note(void *user, const obx__note *n) {
    worker *w = user;
    const char *comp = w->index >= 0 ? "dispatcher" : "reconciler";
    const char *e = n->event_id, *a = n->attempt_id, *c = n->correlation_id;
    obx__otel_note(w->r->otel, n);
    switch (n->kind) {
    case OBX__NOTE_PUBLISHED:
        obx__hist_observe(&w->latency, (double)n->latency_ms / 1000.0);
        if (n->unknown_ms >= 0)
            obx__log_event(w->index >= 0 ? "UNKNOWN resolved by a late ACK"
                                         : "UNKNOWN resolved by lookup",
                           OBX__LOG_INFO, "acceptor", e, a, c,
                           "UNKNOWN resolved: published (%s) %lld ms after the outcome became "
                           "unknown",
                           n->detail, (long long)n->unknown_ms);
        else
            obx__log(OBX__LOG_DEBUG, "acceptor", e, a, c, "published (%s) %lld ms after commit",
                     n->detail, (long long)n->latency_ms);
        break;
    case OBX__NOTE_DUPLICATE:
        obx__log_event("duplicate transport receipts recorded", OBX__LOG_INFO, "acceptor", e, a, c,
                       "duplicate transport receipt recorded (%s)", n->detail);
        break;
    case OBX__NOTE_QUARANTINED:
        obx__log_event("ALARM receipts quarantined", OBX__LOG_ERROR, "acceptor", e, a, c,
                       "ALARM receipt quarantined: %s", n->detail);
        break;
    case OBX__NOTE_UNKNOWN:
        obx__log_event("outcome UNKNOWN", OBX__LOG_WARN, comp, e, a, c,
                       "outcome UNKNOWN: %s (the reconciler will ask the broker)", n->detail);
        break;
    case OBX__NOTE_REJECTED:
        obx__log_event("definite rejections", OBX__LOG_INFO, comp, e, a, c,
                       "definite rejection: %s", n->detail);
        break;
    case OBX__NOTE_NOT_SENT:
        obx__log(OBX__LOG_DEBUG, comp, e, a, c, "not sent: %s", n->detail);
        break;
    case OBX__NOTE_PARKED:
        obx__log_event("PARKED after the route's maximum rejections", OBX__LOG_WARN, comp, e, a, c,
                       "PARKED after the route's maximum rejections: %s (requeue: obx requeue %s)",
                       n->detail, e);
        break;
    case OBX__NOTE_RETRY:
    case OBX__NOTE_RESOLVED:
        obx__log_event(n->kind == OBX__NOTE_RETRY ? "reconciler retries" : "reconciler decisions",
                       OBX__LOG_INFO, "reconciler", e, a, c, "%s", n->detail);
        break;
    case OBX__NOTE_HELD:
        obx__log_event("UNKNOWN HELD for an operator", OBX__LOG_WARN, "reconciler", e, a, c,
                       "UNKNOWN HELD: %s (resolve: obx resolve %s --retry|--accept ...)", n->detail,
                       e);
        break;
    }
}

/* The engine's alarms outside the acceptance point (a payload over relay.max_payload): one
 * error record each, folded during an incident like the notes. */
static void on_alarm(void *user, const char *event_id, const char *what) {
    worker *w = user;
    obx__log_event("ALARM events refused before sending", OBX__LOG_ERROR,
                   w->index >= 0 ? "dispatcher" : "reconciler", event_id, NULL, NULL, "ALARM %s",
                   what);
}

static void on_resolved(void *user, const char *event_id, int64_t ms) {
    worker *w = user;
    (void)event_id;
    obx__hist_observe(&w->resolution, (double)ms / 1000.0);
}

/* The relay's heartbeat in obx_relay_cluster: dispatcher 0 writes it every relay.heartbeat_ms;
 * a relay counts as serving its cluster until three beats after its last one (three beats
 * missed), and until the moment it stops cleanly. */
#define LIVE_MS(r) (3 * (r)->cfg->heartbeat_ms)

/* Registers the cluster this relay serves in the outbox's cluster registry: its broker backend,
 * lookup capability and the destination contracts it honours, so that `obx route set` can
 * refuse a contract this cluster cannot honour (docs/design.md, "Destination contract"); and
 * beats this relay's heartbeat for it, live until live_until (docs/operations.md, "Clusters
 * nobody serves"). */
static obx_err register_cluster(obx_relay *r, obx__store *s, obx__broker *b, const char *cluster,
                                int64_t live_until) {
    obx__cluster_row c;
    memset(&c, 0, sizeof c);
    obx__strlcpy(c.cluster, cluster, sizeof c.cluster);
    obx__strlcpy(c.backend, obx__br_name(b), sizeof c.backend);
    unsigned caps = obx__br_caps(b);
    obx__strlcpy(c.lookup,
                 caps & OBX__BCAP_LOOKUP_AUTHORITATIVE ? "authoritative"
                 : caps & OBX__BCAP_LOOKUP_BEST_EFFORT ? "best_effort"
                                                       : "none",
                 sizeof c.lookup);
    obx__contract k;
    obx__br_contract(b, &k);
    obx__strlcpy(c.durability, k.durability, sizeof c.durability);
    obx__strlcpy(c.required_acks, k.required_acks, sizeof c.required_acks);
    obx__strlcpy(c.serializer, k.serializer, sizeof c.serializer);
    obx__strlcpy(c.relay, r->id, sizeof c.relay);
    c.seen_at = obx__ref_ms();
    c.live_until = live_until;
    return obx__st_cluster_put(s, &c);
}

/* The schema version of a relay connection, which also holds that schema until it closes where
 * the store can (PostgreSQL: `obx init` then refuses to migrate under it, and a relay starting
 * during a migration waits for it; docs/operations.md, "Upgrading obx"). */
static obx_err schema_in_use(obx__store *s, int *found) {
    return obx__st_has_schema_hold(s) ? obx__st_schema_hold(s, found)
                                      : obx__st_schema_version(s, found);
}

/* Opens the store and checks its schema; *which names the dependency a failure is about. A
 * database without an obx schema yet (version 0) is one to wait for (`obx init` may come
 * later); another version than ours is a deployment error. */
static obx_err open_store(obx_relay *r, obx__store **s, obx__dep_kind *which) {
    *which = OBX__DEP_DATABASE;
    obx_err err = obx__st_open(r->cfg->db, s);
    if (err) return err;
    obx__st_serve_dispatch(*s);
    int found = 0;
    if ((err = schema_in_use(*s, &found))) return err;
    *which = OBX__DEP_SCHEMA;
    if (found == 0)
        return obx__fail(OBX_ESTORE, "%s: no obx schema yet (run obx init)", (*s)->url_redacted);
    if (found != OBX__SCHEMA_VERSION)
        return obx__fail(OBX_ESCHEMA, "%s: schema version %d, this relay needs %d (run obx init)",
                         (*s)->url_redacted, found, OBX__SCHEMA_VERSION);
    *which = OBX__DEP_DATABASE;
    return OBX_OK;
}

static obx_err open_engine(worker *w, obx__store **s, obx__broker **b, obx__engine *e,
                           obx__dep_kind *which) {
    obx_relay *r = w->r;
    obx_config *c = r->cfg;
    obx_err err = open_store(r, s, which);
    if (err) return err;
    *which = OBX__DEP_BROKER;
    if ((err =
             obx__br_open(c->broker, (const char *const *)c->broker_props.v, c->broker_props.n, b)))
        return err;
    *which = OBX__DEP_DATABASE;
    obx__engine_cfg ec;
    obx__engine_cfg_defaults(&ec);
    if (w->index >= 0)
        snprintf(ec.owner, sizeof ec.owner, "%s/d%d", r->id, w->index);
    else
        snprintf(ec.owner, sizeof ec.owner, "%s/reconciler", r->id);
    ec.lease_ms = c->lease_ms;
    ec.reconcile_lease_ms = c->reconcile_lease_ms;
    ec.recheck_ms = c->recheck_ms;
    ec.recheck_max_ms = c->recheck_max_ms;
    ec.backoff_base_ms = c->backoff_base_ms;
    ec.backoff_max_ms = c->backoff_max_ms;
    ec.batch = (size_t)c->batch;
    ec.max_payload = (size_t)c->max_payload;
    ec.aliases = (const char *const *)c->aliases.v;
    ec.n_aliases = c->aliases.n;
    ec.keys = r->keys;
    if ((err = obx__engine_init(e, *s, *b, &ec))) return err;
    if (w->index == 0 && !r->cfg->shadow &&
        (err = register_cluster(r, *s, *b, e->cluster, obx__ref_ms() + LIVE_MS(r))))
        return obx__fail_prefix(err, "register cluster %s", e->cluster);
    e->on_note = on_note;
    e->on_note_user = w;
    e->on_unknown_resolved = on_resolved;
    e->on_unknown_resolved_user = w;
    e->on_alarm = on_alarm;
    e->on_alarm_user = w;
    return OBX_OK;
}

static void publish(worker *w, const obx__engine *e) {
    pthread_mutex_lock(&w->r->mu);
    w->st = e->st;
    w->in_flight = e->b ? obx__br_in_flight(e->b) : 0;
    w->latency_pub = w->latency;
    w->resolution_pub = w->resolution;
    pthread_mutex_unlock(&w->r->mu);
}

/* This thread failed on dependency k (why) and waits its back-off, which grows with each
 * failure in a row (connect.retry_initial_ms doubling up to connect.retry_max_ms, jittered).
 * The relay logs one line when the dependency goes down, one when it is back (deps.c). */
static void dep_wait(worker *w, obx__dep_kind k, const char *why) {
    obx_relay *r = w->r;
    int64_t ms = obx_retry_delay_ms(r->cfg->retry_initial_ms, r->cfg->retry_max_ms, w->fails++);
    obx__deps_down(&r->deps, &w->down, k, why, ms);
    stop_sleep(r, ms);
}

/* This thread's last round went through: what it failed on is back. */
static void dep_ok(worker *w) {
    w->fails = 0;
    if (w->down) obx__deps_up(&w->r->deps, &w->down);
}

/* Store/broker trouble once running. An outage (the database or the broker unreachable) is
 * waited out with the back-off, logged once when it starts and once when it ends; anything
 * else (a lost compare-and-set, a busy database) is logged and retried after a short pause.
 * The relay keeps going either way. */
static void transient(worker *w, obx_err e, const char *what) {
    if (obx__dep_waitable(e) && e != OBX_EBUSY) {
        char why[700];
        snprintf(why, sizeof why, "%s: %s: %s", what, obx_errname(e), obx_errmsg());
        dep_wait(w, e == OBX_EBROKER ? OBX__DEP_BROKER : OBX__DEP_DATABASE, why);
        return;
    }
    obx__log(OBX__LOG_WARN,
             w->index >= 0 ? "dispatcher" : (w->index == -1 ? "reconciler" : "shadow"), NULL, NULL,
             NULL, "%s: %s: %s (retrying)", what, obx_errname(e), obx_errmsg());
    stop_sleep(w->r, w->r->cfg->poll_ms * 4 + 100);
}

/* Opens this thread's store, broker and engine, waiting for whichever is not there yet (see
 * deps.c): returns OBX_OK once connected, OBX_ESTOPPED when the relay was asked to stop first,
 * or the first error that waiting cannot mend (a configuration error: the caller ends the
 * relay with it). */
/* One clock (docs/design.md): every relay of a database decides leases, attempt deadlines and
 * quiet times, and its brokers check deadlines, on the database server's clock (obx__ref_ms),
 * read again every CLOCK_SYNC_MS and at each connection, so a relay whose host clock is
 * behind cannot make a late write look timely to itself, nor one ahead take over live claims.
 * A failed read keeps the last offset (the connection's failure shows on the next call). */
#define CLOCK_SYNC_MS 10000

static void clock_sync(worker *w, obx__store *s, bool force) {
    int64_t t0 = obx__mono_ms(), server = 0;
    if (!obx__st_has_server_ms(s) || (!force && t0 - w->clock_synced < CLOCK_SYNC_MS)) return;
    w->clock_synced = t0;
    if (!obx__st_server_ms(s, &server)) obx__ref_sync(server, t0, obx__mono_ms());
}

static obx_err connect_engine(worker *w, obx__store **s, obx__broker **b, obx__engine *e) {
    obx_relay *r = w->r;
    while (!atomic_load(&r->stop)) {
        obx__dep_kind which = OBX__DEP_DATABASE;
        obx_err err = open_engine(w, s, b, e, &which);
        if (!err) {
            clock_sync(w, *s, true);
            dep_ok(w);
            obx__deps_connected(&r->deps);
            return OBX_OK;
        }
        if (!obx__dep_waitable(err)) return err;
        char why[700];
        obx__strlcpy(why, obx_errmsg(), sizeof why);
        obx__br_close(*b);
        obx__st_close(*s);
        *b = NULL;
        *s = NULL;
        dep_wait(w, which, why);
    }
    return OBX_ESTOPPED;
}

/* A dispatcher with nothing to do waits for whichever comes first: a hint that work was
 * committed (the store's wake-up, PostgreSQL NOTIFY), an outcome of what it sent, or
 * relay.poll_ms. With nothing in flight it blocks in the store's wait. With messages in flight
 * and a broker that has a wake_fd (Kafka) it blocks in the store's wait on that descriptor too,
 * so a commit and an outcome each end the wait at once. Otherwise it takes turns of
 * IDLE_SLICE_MS on the broker and a non-blocking look at the store's hint, so that an event
 * committed while an ACK is awaited is claimed within a slice rather than after the ACK or the
 * whole interval (commit-to-PUBLISHED latency, docs/performance.md, section 2: the turns added
 * up to a slice to a commit's wait and woke the relay 500 times a second). Outcomes collected
 * here are applied here. */
#define IDLE_SLICE_MS 2

static void idle_wait(worker *w, obx__engine *e, obx__store *s, obx__broker *b) {
    obx_relay *r = w->r;
    int64_t until = obx__mono_ms() + r->cfg->poll_ms;
    bool can_wait = obx__st_has_wait_for_work(s);
    int wake_fd = can_wait ? obx__br_wake_fd(b) : -1;
    for (;;) {
        int64_t left = until - obx__mono_ms();
        if (left <= 0 || atomic_load(&r->stop)) return;
        bool notified = false;
        obx_err err = OBX_OK;
        if (obx__br_in_flight(b)) {
            size_t n = 0;
            int slice = wake_fd >= 0 ? 0 : left < IDLE_SLICE_MS ? (int)left : IDLE_SLICE_MS;
            int64_t t0 = obx__mono_ms();
            err = obx__engine_poll(e, obx__ref_ms(), slice, &n);
            if (err) {
                transient(w, err, "collect outcomes");
                return;
            }
            if (n) return;
            /* a broker whose poll does not block (the log broker) leaves the rest of the slice
             * to the store's wait, or to a sleep: never a spin */
            int64_t rest = wake_fd >= 0 ? left : slice - (obx__mono_ms() - t0);
            if (rest < 0) rest = 0;
            if (!can_wait) {
                sleep_ms(rest);
                continue;
            }
            err = obx__st_wait_for_work(s, (int)rest, wake_fd, &notified);
        } else if (can_wait) {
            err = obx__st_wait_for_work(s, (int)left, -1, &notified);
        } else {
            sleep_ms(left);
            return;
        }
        if (err) {
            transient(w, err, "wait for work");
            return;
        }
        if (notified) return;
    }
}

/* The idle wait of a dispatcher beyond the first (index > 0): it claims only during a backlog
 * (claim_due), so it does not LISTEN for commits: below a backlog that would wake it, and its
 * server backend, on every commit for nothing (at 1,000 commits/s, 1,000 times a second). It
 * waits for a claim that took a whole batch after the one it saw (seen: r->backlog_gen before
 * its own claim), for outcomes of what it sent, or for relay.poll_ms. */
static void follower_wait(worker *w, obx__engine *e, obx__broker *b, uint64_t seen) {
    obx_relay *r = w->r;
    int64_t until = obx__mono_ms() + r->cfg->poll_ms;
    for (;;) {
        int64_t left = until - obx__mono_ms();
        if (left <= 0 || atomic_load(&r->stop)) return;
        int64_t t0 = obx__mono_ms();
        if (obx__br_in_flight(b)) {
            size_t n = 0;
            obx_err err = obx__engine_poll(e, obx__ref_ms(), IDLE_SLICE_MS, &n);
            if (err) transient(w, err, "collect outcomes");
            if (err || n) return;
        }
        /* the rest of the slice (a broker whose poll does not block), or up to the deadline */
        int64_t wait = obx__br_in_flight(b) ? IDLE_SLICE_MS - (obx__mono_ms() - t0) : left;
        pthread_mutex_lock(&r->wake_mu);
        if (r->backlog_gen == seen && wait > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t ns = ts.tv_nsec + (wait % 1000) * 1000000;
            ts.tv_sec += (time_t)(wait / 1000 + ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&r->wake_cv, &r->wake_mu, &ts);
        }
        bool woken = r->backlog_gen != seen;
        pthread_mutex_unlock(&r->wake_mu);
        if (woken) return;
    }
}

/* After a claim: a claim that took a whole batch starts or continues a backlog, and wakes the
 * dispatchers beyond the first (follower_wait); one that took less ends it. */
static void note_claim(obx_relay *r, bool full) {
    atomic_store(&r->backlog, full);
    if (!full) return;
    pthread_mutex_lock(&r->wake_mu);
    r->backlog_gen++;
    pthread_cond_broadcast(&r->wake_cv);
    pthread_mutex_unlock(&r->wake_mu);
}

static uint64_t backlog_gen(obx_relay *r) {
    pthread_mutex_lock(&r->wake_mu);
    uint64_t g = r->backlog_gen;
    pthread_mutex_unlock(&r->wake_mu);
    return g;
}

/* ---- shadow mode ------------------------------------------------------------------------------
 */

/* Reads the whole receipts feed (it grows: read again every round). */
static obx_err read_feed(const char *path, obx__observed **obs, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return obx__fail(OBX_EIO, "relay.shadow_feed: %s: cannot open: %s", path, strerror(errno));
    obx__buf b = {0};
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) obx__buf_put(&b, chunk, k);
    fclose(f);
    obx_err e = b.oom ? obx__fail(OBX_ENOMEM, "relay.shadow_feed: out of memory")
                      : obx__shadow_parse_feed((const char *)b.data, b.len, obs, n);
    obx__buf_free(&b);
    return e;
}

/* One comparison: a broker connection of its own (a fresh consumer group every round). */
static obx_err shadow_round(worker *w, obx__store *s, obx__shadow_counts *out) {
    obx_relay *r = w->r;
    obx_config *c = r->cfg;
    int64_t now = obx__ref_ms();
    obx__broker *b = NULL;
    obx_err err =
        obx__br_open(c->broker, (const char *const *)c->broker_props.v, c->broker_props.n, &b);
    if (err) return err;
    obx__engine e;
    obx__engine_cfg ec;
    obx__engine_cfg_defaults(&ec);
    snprintf(ec.owner, sizeof ec.owner, "%s/shadow", r->id);
    obx__shadow_req req = {.aliases = (const char *const *)c->aliases.v,
                           .n_aliases = c->aliases.n,
                           .topics = (const char *const *)c->shadow_topics.v,
                           .n_topics = c->shadow_topics.n,
                           .since = now - c->shadow_window_ms,
                           .grace_ms = c->shadow_grace_ms};
    obx__observed *obs = NULL;
    size_t n_obs = 0;
    json_t *rep = NULL;
    size_t diffs = 0;
    if (!(err = obx__engine_init(&e, s, b, &ec))) {
        if (c->shadow_feed[0])
            err = read_feed(c->shadow_feed, &obs, &n_obs);
        else {
            char **topics = NULL;
            size_t nt = 0;
            err = obx__shadow_topics(&e, now, &req, &topics, &nt);
            if (!err)
                err = obx__shadow_observe_broker(&e, (const char *const *)topics, nt, 0, &obs,
                                                 &n_obs);
            for (size_t i = 0; i < nt; i++) free(topics[i]);
            free(topics);
        }
    }
    if (!err) err = obx__shadow_compare(&e, now, &req, obs, n_obs, &rep, &diffs);
    free(obs);
    obx__br_close(b);
    if (err) return err;
    json_t *d = json_object_get(rep, "differences");
    out->rounds++;
    out->at = now;
#define G(o, k) json_integer_value(json_object_get(o, k))
    out->compared = G(rep, "compared");
    out->matched = G(rep, "matched");
    out->missing = G(d, "missing");
    out->destination = G(d, "destination");
    out->partition = G(d, "partition");
    out->payload = G(d, "payload");
    out->unknown = G(d, "unknown_on_broker");
#undef G
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(rep, "findings"), i, f) {
        if (i == 20) break; /* the counts say the rest */
        obx__log(OBX__LOG_WARN, "shadow", json_string_value(json_object_get(f, "event_id")), NULL,
                 NULL, "%s: %s", json_string_value(json_object_get(f, "kind")),
                 json_string_value(json_object_get(f, "why")));
    }
    obx__log(diffs ? OBX__LOG_WARN : OBX__LOG_INFO, "shadow", NULL, NULL, NULL,
             "compared %lld slots with %zu publications: %lld matched, %zu differences "
             "(missing %lld, destination %lld, partition %lld, payload %lld, unknown %lld); "
             "nothing claimed, nothing sent",
             (long long)out->compared, n_obs, (long long)out->matched, diffs,
             (long long)out->missing, (long long)out->destination, (long long)out->partition,
             (long long)out->payload, (long long)out->unknown);
    json_decref(rep);
    return OBX_OK;
}

static void *shadow_main(void *arg) {
    worker *w = arg;
    obx_relay *r = w->r;
    obx__store *s = NULL;
    obx_err err = OBX_ESTOPPED;
    while (!atomic_load(&r->stop)) { /* the store, waited for as the dispatchers do */
        obx__dep_kind which;
        if (!(err = open_store(r, &s, &which))) {
            dep_ok(w);
            obx__deps_connected(&r->deps);
            break;
        }
        obx__st_close(s);
        s = NULL;
        if (!obx__dep_waitable(err)) break;
        char why[700];
        obx__strlcpy(why, obx_errmsg(), sizeof why);
        dep_wait(w, which, why);
        err = OBX_ESTOPPED;
    }
    if (err) {
        if (err != OBX_ESTOPPED) fatal(r, err, "shadow start");
        obx__st_close(s);
        return NULL;
    }
    while (!atomic_load(&r->stop)) {
        pthread_mutex_lock(&r->mu);
        obx__shadow_counts cur = r->shadow;
        pthread_mutex_unlock(&r->mu);
        err = shadow_round(w, s, &cur);
        if (err)
            transient(w, err, "shadow comparison");
        else {
            dep_ok(w);
            pthread_mutex_lock(&r->mu);
            r->shadow = cur;
            pthread_mutex_unlock(&r->mu);
        }
        int64_t t0 = obx__ref_ms();
        while (!atomic_load(&r->stop) && obx__ref_ms() - t0 < r->cfg->shadow_interval_ms)
            sleep_ms(20);
    }
    obx__st_close(s);
    return NULL;
}

static int view_shadow(obx_relay *r, obx__shadow_counts *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->shadow;
    pthread_mutex_unlock(&r->mu);
    return r->cfg->shadow != 0;
}

/* A dispatcher looks for work when it has a reason (a wake-up hint, outcomes applied, which may
 * have unblocked a key's next event, a full batch, relay.poll_ms) at time since; it need not
 * when another dispatcher of this relay began a claim after that: that claim's snapshot already
 * holds everything committed before the reason. Every dispatcher used to claim on every NOTIFY
 * and after every batch of outcomes: at 1,000 commits/s most of the claims found nothing
 * (docs/performance.md, scenario 2). Two dispatchers passing the check together both claim,
 * which is only the old cost.
 *
 * Dispatchers beyond the first (index > 0) claim only while the outbox has a backlog: the last
 * claim of this relay took a whole batch (relay.batch); one that took less ends it. Below that
 * rate one dispatcher claims everything, in fewer and larger transactions: at 1,000 commits/s
 * two dispatchers sharing the work cost PostgreSQL 64-66 % of the 2 cores against 49-55 % for
 * one, and commit-to-PUBLISHED p99 28-31 ms against 20-23 ms; from a backlog two drain twice
 * as fast as one (docs/performance.md, section 2). The others still collect the outcomes of
 * what they sent. */
static bool claim_due(obx_relay *r, int index, int64_t since) {
    if (index > 0 && !atomic_load(&r->backlog)) return false;
    if (atomic_load(&r->last_claim_us) > since) return false;
    atomic_store(&r->last_claim_us, obx__mono_us());
    return true;
}

static void *dispatcher_main(void *arg) {
    worker *w = arg;
    obx_relay *r = w->r;
    obx__store *s = NULL;
    obx__broker *b = NULL;
    obx__engine e;
    obx_err err = connect_engine(w, &s, &b, &e);
    if (err) {
        if (err != OBX_ESTOPPED) fatal(r, err, "dispatcher start");
        obx__br_close(b);
        obx__st_close(s);
        return NULL;
    }
    int64_t last_sweep = 0, last_beat = obx__ref_ms(), since = obx__mono_us();
    while (!atomic_load(&r->stop)) {
        clock_sync(w, s, false);
        int64_t now = obx__ref_ms();
        size_t applied = 0, sent = 0, swept = 0;
        bool failed = false;
        err = obx__engine_poll(&e, now, 0, &applied);
        if (err) transient(w, err, "collect outcomes");
        failed |= err != OBX_OK;
        if (applied || err) since = obx__mono_us();
        uint64_t seen = w->index > 0 ? backlog_gen(r) : 0;
        bool full = false;
        if (obx__br_in_flight(b) < (size_t)r->cfg->window && !atomic_load(&r->stop) &&
            claim_due(r, w->index, since)) {
            int64_t claimed = e.st.claimed;
            err = obx__engine_dispatch(&e, now, &sent);
            if (err) transient(w, err, "dispatch");
            failed |= err != OBX_OK;
            full = !err && e.st.claimed - claimed >= (int64_t)r->cfg->batch;
            note_claim(r, full);
        }
        if (w->index == 0 && now - last_beat >= r->cfg->heartbeat_ms) {
            last_beat = now;
            err = register_cluster(r, s, b, e.cluster, now + LIVE_MS(r));
            if (err) transient(w, err, "heartbeat");
            failed |= err != OBX_OK;
        }
        if (w->index == 0 && now - last_sweep >= r->cfg->sweep_ms) {
            last_sweep = now;
            err = obx__engine_sweep(&e, now, &swept);
            if (err) transient(w, err, "sweep");
            failed |= err != OBX_OK;
            if (swept)
                obx__log(OBX__LOG_WARN, "sweeper", NULL, NULL, NULL,
                         "%zu SENDING leases expired: now DISPATCH_UNKNOWN", swept);
        }
        if (!failed) dep_ok(w);
        if (w->index == 0) obx__log_fold_flush(false); /* a burst's count, once its window ends */
        publish(w, &e);
        if (sent || applied) {
            /* a claim that took less than a whole batch held everything committed before it
             * began: what comes later brings its own reason (a wake-up; relay.poll_ms for a
             * backoff that ends), so only a full one looks again at once */
            if (full) since = obx__mono_us();
            continue;
        }
        if (w->index > 0)
            follower_wait(w, &e, b, seen);
        else
            idle_wait(w, &e, s, b);
        since = obx__mono_us();
    }
    /* drain: late ACKs of what we sent still go to the acceptance point (not after
     * obx_relay_stop_now: what is outstanding is left as after a kill) */
    int64_t until = obx__ref_ms() + r->cfg->drain_ms;
    while (obx__br_in_flight(b) && obx__ref_ms() < until && !atomic_load(&r->stop_now)) {
        publish(w, &e);
        size_t n = 0;
        err = obx__engine_poll(&e, obx__ref_ms(), 50, &n);
        if (err) break;
        if (!n) sleep_ms(10);
    }
    if (obx__br_in_flight(b))
        obx__log(OBX__LOG_WARN, "dispatcher", NULL, NULL, NULL,
                 "stopping with %zu outcomes outstanding: their attempts stay SENDING and will "
                 "be reconciled",
                 obx__br_in_flight(b));
    publish(w, &e);
    /* a clean stop: the cluster is no longer served by this relay from now on */
    if (w->index == 0) (void)register_cluster(r, s, b, e.cluster, obx__ref_ms());
    obx__br_close(b);
    obx__st_close(s);
    return NULL;
}

/* The critical consumers' databases as consumer evidence for the reconciler (resolve.c):
 * opened on demand before each step; one whose query failed is closed and opened again at the
 * next step (a lost connection does not come back by itself). */
static void evidence_refresh(obx__consumer_set *cs, obx__critical *crit, obx__engine *e) {
    for (size_t i = 0; i < cs->n; i++) {
        if (crit[i].failed) {
            obx__log(OBX__LOG_WARN, "reconciler", NULL, NULL, NULL,
                     "critical consumer %s cannot testify now (reconnecting): %s", crit[i].id,
                     obx_errmsg());
            obx__consumer_drop(cs, i, OBX_ESTORE);
            crit[i].failed = false;
        }
        if (!cs->v[i].s) obx__consumer_open(cs, i);
        obx__strlcpy(crit[i].id, cs->v[i].id, sizeof crit[i].id);
        crit[i].s = cs->v[i].s; /* NULL while it cannot be opened: skipped */
    }
    e->cfg.evidence = crit;
    e->cfg.n_evidence = cs->n;
}

static void *reconciler_main(void *arg) {
    worker *w = arg;
    obx_relay *r = w->r;
    obx__store *s = NULL;
    obx__broker *b = NULL;
    obx__engine e;
    obx__consumer_set cs = {0};
    obx__critical *crit = NULL;
    obx_err err = connect_engine(w, &s, &b, &e);
    if (!err)
        err = obx__consumer_set_init(&cs, (const char *const *)r->cfg->critical_consumers.v,
                                     r->cfg->critical_consumers.n);
    if (!err && cs.n && !(crit = calloc(cs.n, sizeof *crit)))
        err = obx__fail(OBX_ENOMEM, "reconciler: out of memory");
    if (err) {
        if (err != OBX_ESTOPPED) fatal(r, err, "reconciler start");
        free(crit);
        obx__consumer_set_free(&cs);
        obx__br_close(b);
        obx__st_close(s);
        return NULL;
    }
    while (!atomic_load(&r->stop)) {
        clock_sync(w, s, false);
        int64_t now = obx__ref_ms();
        size_t handled = 0, applied = 0;
        evidence_refresh(&cs, crit, &e);
        err = obx__reconcile_step(&e, now, &handled);
        if (err) transient(w, err, "reconcile");
        obx_err perr = obx__engine_poll(&e, obx__ref_ms(), 0, &applied);
        if (perr) transient(w, perr, "collect retry outcomes");
        if (!err && !perr) dep_ok(w);
        obx__log_fold_flush(false);
        if (handled)
            obx__log(OBX__LOG_INFO, "reconciler", NULL, NULL, NULL,
                     "%zu UNKNOWN events reconciled (found %lld, not found %lld, cannot tell "
                     "%lld so far)",
                     handled, (long long)e.st.reconciled_found,
                     (long long)e.st.reconciled_not_found, (long long)e.st.reconciled_cannot_tell);
        publish(w, &e);
        if (!handled && !applied) {
            int64_t t0 = obx__ref_ms();
            while (!atomic_load(&r->stop) && obx__ref_ms() - t0 < r->cfg->reconcile_ms) {
                size_t n = 0;
                if (obx__br_in_flight(b)) obx__engine_poll(&e, obx__ref_ms(), 20, &n);
                sleep_ms(20);
            }
        }
    }
    int64_t until = obx__ref_ms() + r->cfg->drain_ms;
    while (obx__br_in_flight(b) && obx__ref_ms() < until && !atomic_load(&r->stop_now)) {
        size_t n = 0;
        publish(w, &e);
        if (obx__engine_poll(&e, obx__ref_ms(), 50, &n)) break;
        if (!n) sleep_ms(10);
    }
    publish(w, &e);
    obx__consumer_set_free(&cs);
    free(crit);
    obx__br_close(b);
    obx__st_close(s);
    return NULL;
}

/* Every worker thread: its role's loop, then counted as ended (obx_relay_stopped). */
static void *worker_main(void *arg) {
    worker *w = arg;
    if (w->index >= 0)
        dispatcher_main(w);
    else if (w->index == -1)
        reconciler_main(w);
    else
        shadow_main(w);
    atomic_fetch_add(&w->r->ended, 1);
    return NULL;
}

obx_err obx_relay_start(const obx_config *c, obx_relay **out) {
    if (!c || !out) return obx__fail(OBX_EINVAL, "relay: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx_err e = obx__config_check(c);
    if (e) return e;
    obx_relay *r = calloc(1, sizeof *r);
    if (!r) return obx__fail(OBX_ENOMEM, "relay: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->wake_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->wake_cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((e = obx__config_copy(c, &r->cfg))) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->wake_cv);
        pthread_mutex_destroy(&r->wake_mu);
        free(r);
        return e;
    }
    obx__log_setup(r->cfg->log_format, r->cfg->log_level);
    obx__log_fold_setup(r->cfg->log_fold_after, r->cfg->log_fold_interval_ms);
    if (r->cfg->relay_id[0])
        obx__strlcpy(r->id, r->cfg->relay_id, sizeof r->id);
    else {
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        for (char *p = host; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                  (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
                *p = '-';
        snprintf(r->id, sizeof r->id, "%s:%d", host, (int)getpid());
    }
    r->started_at = obx__ref_ms();
    /* shadow mode: no dispatcher, no reconciler — nothing that could claim or send */
    int nd = r->cfg->shadow ? 0 : (int)r->cfg->dispatchers;
    for (int i = 0; i < nd; i++) r->w[r->n++] = (worker){.r = r, .index = i};
    if (r->cfg->reconciler && !r->cfg->shadow) r->w[r->n++] = (worker){.r = r, .index = -1};
    if (r->cfg->shadow) r->w[r->n++] = (worker){.r = r, .index = -2};
    obx__deps_init(&r->deps, r->n);
    for (int i = 0; i < r->n; i++) {
        obx__hist_init(&r->w[i].latency, obx__publish_latency_le);
        obx__hist_init(&r->w[i].resolution, obx__unknown_resolution_le);
        r->w[i].latency_pub = r->w[i].latency;
        r->w[i].resolution_pub = r->w[i].resolution;
    }
    if ((e = obx_otel_open(r->cfg, &r->otel))) atomic_store(&r->stop, 1);
    if (!e && r->cfg->enc_keys[0] && (e = obx_keyring_open(r->cfg->enc_keys, &r->keys)))
        atomic_store(&r->stop, 1);
    for (int i = 0; !e && i < r->n; i++) {
        int rc = pthread_create(&r->w[i].th, NULL, worker_main, &r->w[i]);
        if (rc) {
            e = obx__fail(OBX_EINTERNAL, "relay: cannot start thread: %s", strerror(rc));
            atomic_store(&r->stop, 1);
            break;
        }
        r->w[i].started = true;
    }
    /* the daemon's other parts see the relay through its view only */
    r->view = (obx__relay_view){.cfg = r->cfg,
                                .id = r->id,
                                .started_at = r->started_at,
                                .relay = r,
                                .stopping = view_stopping,
                                .ready = view_ready,
                                .totals = view_totals,
                                .dispatchers = view_dispatchers,
                                .hists = view_hists,
                                .shadow = view_shadow,
                                .audit_metrics = view_audit_metrics,
                                .otel = r->otel};
    if (!e && (e = obx__auditor_start(&r->view, &r->auditor))) atomic_store(&r->stop, 1);
    if (!e && r->cfg->http_listen[0]) {
        e = obx__http_start(&r->view, r->cfg->http_listen, &r->http);
        if (e) atomic_store(&r->stop, 1);
    }
    if (e) {
        obx_relay_wait(r);
        obx_relay_close(r);
        return e;
    }
    char *db = NULL, *br = NULL;
    obx_url_redact(r->cfg->db, &db);
    obx_url_redact(r->cfg->broker, &br);
    obx__log(OBX__LOG_INFO, "relay", NULL, NULL, NULL, "relay %s started: %s, store %s, broker %s",
             r->id,
             r->cfg->shadow       ? "SHADOW mode (claims nothing, sends nothing)"
             : r->cfg->reconciler ? "dispatchers + reconciler"
                                  : "dispatchers",
             db ? db : "?", br ? br : "?");
    free(db);
    free(br);
    *out = r;
    return OBX_OK;
}

void obx_relay_stop(obx_relay *r) {
    if (r) atomic_store(&r->stop, 1);
}

void obx_relay_stop_now(obx_relay *r) {
    if (!r) return;
    atomic_store(&r->stop_now, 1);
    atomic_store(&r->stop, 1);
}

static bool view_ready(obx_relay *r, char *why, size_t cap) {
    if (atomic_load(&r->stop)) {
        snprintf(why, cap, "the relay is stopping");
        return false;
    }
    return obx__deps_ready(&r->deps, why, cap);
}

int obx_relay_ready(obx_relay *r, char *why, size_t cap) {
    char buf[1024];
    if (!r) return 0;
    bool ok = view_ready(r, buf, sizeof buf);
    if (why && cap) obx__strlcpy(why, ok ? "" : buf, cap);
    return ok;
}

obx_err obx_relay_wait(obx_relay *r) {
    if (!r) return OBX_OK;
    for (int i = 0; i < r->n; i++)
        if (r->w[i].started) {
            pthread_join(r->w[i].th, NULL);
            r->w[i].started = false;
        }
    if (r->http) {
        obx__http_stop(r->http);
        r->http = NULL;
    }
    obx__auditor_stop(r->auditor); /* the stop flag is set: it ends after its current run */
    r->auditor = NULL;
    obx__log_fold_flush(true); /* what was folded in the last window */
    if (r->first_err) obx__fail(r->first_err, "%s", r->first_msg);
    return r->first_err;
}

/* Sum of every worker's counters. */
static void view_totals(obx_relay *r, obx__engine_stats *t) {
    memset(t, 0, sizeof *t);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        const obx__engine_stats *s = &r->w[i].st;
        const int64_t *a = (const int64_t *)(const void *)s;
        int64_t *b = (int64_t *)(void *)t;
        size_t nfields = sizeof *s / sizeof(int64_t);
        for (size_t k = 0; k < nfields; k++) b[k] += a[k];
        if (s->unknown_resolve_ms_max > t->unknown_resolve_ms_max)
            t->unknown_resolve_ms_max = s->unknown_resolve_ms_max;
    }
    pthread_mutex_unlock(&r->mu);
}

static int view_dispatchers(obx_relay *r, obx__dispatcher_counts *out, int cap) {
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        int d = r->w[i].index;
        if (d < 0) continue;
        if (d < cap)
            out[d] = (obx__dispatcher_counts){.claimed = r->w[i].st.claimed,
                                              .claims = r->w[i].st.claims,
                                              .empty_claims = r->w[i].st.empty_claims};
        if (d + 1 > n) n = d + 1;
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void view_hists(obx_relay *r, obx__hist *latency, obx__hist *resolution) {
    obx__hist_init(latency, obx__publish_latency_le);
    obx__hist_init(resolution, obx__unknown_resolution_le);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        obx__hist_add(latency, &r->w[i].latency_pub);
        obx__hist_add(resolution, &r->w[i].resolution_pub);
    }
    pthread_mutex_unlock(&r->mu);
}

const obx__relay_view *obx__relay_view_of(obx_relay *r) { return &r->view; }

static bool view_stopping(obx_relay *r) { return atomic_load(&r->stop) != 0; }

static void view_audit_metrics(obx_relay *r, obx__buf *b) { obx__auditor_metrics(r->auditor, b); }

obx_err obx_relay_stats(obx_relay *r, char **out) {
    if (!r || !out) return obx__fail(OBX_EINVAL, "relay: NULL argument");
    obx__engine_stats t;
    view_totals(r, &t);
    json_t *o = json_pack(
        "{s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "relay_id",
        r->id, "claimed", (json_int_t)t.claimed, "sent", (json_int_t)t.sent, "stale_refused",
        (json_int_t)t.stale_refused, "accepted", (json_int_t)t.accepted, "duplicates",
        (json_int_t)t.duplicates, "quarantined", (json_int_t)t.quarantined, "rejected",
        (json_int_t)t.rejected, "not_sent", (json_int_t)t.not_sent, "unknown",
        (json_int_t)t.unknown, "swept", (json_int_t)t.swept, "retries", (json_int_t)t.retries,
        "parked", (json_int_t)t.parked, "reconciled_found", (json_int_t)t.reconciled_found,
        "reconciled_not_found", (json_int_t)t.reconciled_not_found, "unknown_resolved",
        (json_int_t)t.unknown_resolved, "store_errors", (json_int_t)t.store_errors, "claims",
        (json_int_t)t.claims, "empty_claims", (json_int_t)t.empty_claims);
    size_t in_flight = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) in_flight += r->w[i].in_flight;
    pthread_mutex_unlock(&r->mu);
    if (o) json_object_set_new(o, "in_flight", json_integer((json_int_t)in_flight));
    obx__shadow_counts sc;
    if (o && view_shadow(r, &sc))
        json_object_set_new(
            o, "shadow",
            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rounds", (json_int_t)sc.rounds,
                      "at_ms", (json_int_t)sc.at, "compared", (json_int_t)sc.compared, "matched",
                      (json_int_t)sc.matched, "missing", (json_int_t)sc.missing, "destination",
                      (json_int_t)sc.destination, "partition", (json_int_t)sc.partition, "payload",
                      (json_int_t)sc.payload, "unknown_on_broker", (json_int_t)sc.unknown));
    return obx__json_out(o, out);
}

int obx_relay_stopped(obx_relay *r) {
    if (!r) return 1;
    pthread_mutex_lock(&r->mu);
    int dead = r->first_err != OBX_OK;
    pthread_mutex_unlock(&r->mu);
    int started = 0;
    for (int i = 0; i < r->n; i++) started += r->w[i].started;
    return dead || atomic_load(&r->ended) >= started;
}

obx_err obx_broker_cluster_id(const char *url, const char *const *props, size_t n, char *out,
                              size_t cap) {
    if (!url || !out || !cap) return obx__fail(OBX_EINVAL, "broker: NULL argument");
    obx__clear_error();
    obx__broker *b;
    obx_err e = obx__br_open(url, props, n, &b);
    if (e) return e;
    e = obx__br_cluster_id(b, out, cap);
    obx__br_close(b);
    return e;
}

void obx_relay_close(obx_relay *r) {
    if (!r) return;
    obx_relay_stop(r);
    obx_relay_wait(r);
    obx_otel_close(r->otel);
    obx_keyring_close(r->keys);
    obx_config_free(r->cfg);
    obx__deps_destroy(&r->deps);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->wake_cv);
    pthread_mutex_destroy(&r->wake_mu);
    free(r);
}

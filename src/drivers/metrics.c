/*
 * metrics.c — /metrics in the Prometheus text format (version 0.0.4): histograms, and the
 * exposition of the outbox, of this relay and of the critical consumers.
 *
 * What one scrape costs (docs/operations.md has measurements):
 *   outbox      store statistics through obx__stats_get (PostgreSQL: delta rows, ~1 ms; SQLite:
 *               counts, reused for 100x their cost), and nothing else;
 *   relay       in-memory counters and histograms kept by the relay's threads as they accept
 *               receipts and resolve UNKNOWN outcomes (incremental: no query at all);
 *   consumers   per critical consumer: its watermarks, its poison table, the consume audit rows
 *               added since the previous scrape (a cursor on the audit table's key, at most
 *               CURSOR_PAGE rows per scrape) which feed a handler-duration histogram and
 *               outcome counters, and the lag window (OBX__LAG_WINDOW newest PUBLISHED events,
 *               one indexed query shared by all consumers, then one batched receipt lookup).
 *
 * Section order is the render table at the bottom: a section is one function appending to the
 * buffer, so further sections (e.g. audit findings) slot in without touching the others.
 */
#include "drivers/metrics.h"
#include "drivers/otel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double obx__publish_latency_le[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,    2.5,
                                          5,     10,   30,    60,   120, 300,  900, 3600, -1};
const double obx__unknown_resolution_le[] = {0.1, 0.5, 1,   5,    15,   30,   60, 120,
                                             300, 600, 900, 1800, 3600, 7200, -1};
const double obx__handler_le[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                  0.1,    0.25,    0.5,    1,     2.5,    5,     10,   -1};

void obx__hist_init(obx__hist *h, const double *le) {
    memset(h, 0, sizeof *h);
    h->le = le;
    while (h->n < OBX__HIST_MAX && le[h->n] >= 0) h->n++;
}

void obx__hist_observe(obx__hist *h, double v) {
    size_t i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->bucket[i]++;
    h->count++;
    h->sum += v;
}

void obx__hist_add(obx__hist *into, const obx__hist *h) {
    for (size_t i = 0; i <= into->n && i <= h->n; i++) into->bucket[i] += h->bucket[i];
    into->count += h->count;
    into->sum += h->sum;
}

/* ---- exposition helpers ------------------------------------------------------------------- */

/* A label value: backslash, double quote and newline escaped (the text format's rule). */
static void label(obx__buf *b, const char *v) {
    for (const char *p = v; *p; p++) {
        if (*p == '\\')
            obx__buf_puts(b, "\\\\");
        else if (*p == '"')
            obx__buf_puts(b, "\\\"");
        else if (*p == '\n')
            obx__buf_puts(b, "\\n");
        else
            obx__buf_put(b, p, 1);
    }
}

static void family(obx__buf *b, const char *name, const char *type, const char *help) {
    obx__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{k="v"} value — lk may be NULL for no label. */
static void sample(obx__buf *b, const char *name, const char *lk, const char *lv, double v) {
    obx__buf_puts(b, name);
    if (lk) {
        obx__buf_printf(b, "{%s=\"", lk);
        label(b, lv);
        obx__buf_puts(b, "\"}");
    }
    /* counters print exactly; fractions with 9 significant digits (microseconds on a day) */
    if (v == (double)(long long)v && v < 9e15 && v > -9e15)
        obx__buf_printf(b, " %lld\n", (long long)v);
    else
        obx__buf_printf(b, " %.9g\n", v);
}

static void hist(obx__buf *b, const char *name, const char *lk, const char *lv,
                 const obx__hist *h) {
    int64_t cum = 0;
    for (size_t i = 0; i <= h->n; i++) {
        cum += h->bucket[i];
        obx__buf_printf(b, "%s_bucket{", name);
        if (lk) {
            obx__buf_printf(b, "%s=\"", lk);
            label(b, lv);
            obx__buf_puts(b, "\",");
        }
        if (i < h->n)
            obx__buf_printf(b, "le=\"%g\"} %lld\n", h->le[i], (long long)cum);
        else
            obx__buf_printf(b, "le=\"+Inf\"} %lld\n", (long long)cum);
    }
    char n[160];
    snprintf(n, sizeof n, "%s_sum", name);
    sample(b, n, lk, lv, h->sum);
    snprintf(n, sizeof n, "%s_count", name);
    sample(b, n, lk, lv, (double)h->count);
}

/* ---- state ---------------------------------------------------------------------------------- */

enum { CURSOR_PAGE = 10000 };

static const char *const outcomes[] = {"APPLIED", "DUPLICATE", "QUARANTINED", "FAILED", "POISONED"};
#define N_OUTCOMES (sizeof outcomes / sizeof outcomes[0])

typedef struct consumer_metrics {
    bool started;   /* the cursor is positioned */
    int64_t cursor; /* highest consume audit id seen */
    int64_t outcome[N_OUTCOMES + 1];
    int64_t retries; /* RETRY_SCHEDULED consume audit rows */
    obx__hist handler;
} consumer_metrics;

struct obx__metrics {
    obx__consumer_set *cs;
    consumer_metrics *c;
    obx__stats_cache stats;
    double last_scrape_s;
};

obx_err obx__metrics_new(obx__consumer_set *cs, obx__metrics **out) {
    obx__metrics *m = calloc(1, sizeof *m);
    if (!m || !(m->c = calloc(cs->n + 1, sizeof *m->c))) {
        free(m);
        return obx__fail(OBX_ENOMEM, "metrics: out of memory");
    }
    m->cs = cs;
    for (size_t i = 0; i < cs->n; i++) obx__hist_init(&m->c[i].handler, obx__handler_le);
    *out = m;
    return OBX_OK;
}

void obx__metrics_free(obx__metrics *m) {
    if (!m) return;
    free(m->c);
    free(m);
}

obx__stats_cache *obx__metrics_stats(obx__metrics *m) { return &m->stats; }

/* ---- sections ------------------------------------------------------------------------------- */

typedef struct scrape {
    obx__metrics *mx; /* the registry (not a backend: named apart from vtable calls) */
    const obx__relay_view *v;
    obx__store *s;
    bool store_ok;
    obx__store_stats st;
    int64_t stats_age_ms;
    int64_t now; /* wall clock, ms */
} scrape;

static void sec_outbox(scrape *x, obx__buf *b) {
    family(b, "obx_up", "gauge", "1 when the outbox database answered this scrape");
    sample(b, "obx_up", NULL, NULL, x->store_ok);
    family(b, "obx_scrape_duration_seconds", "gauge",
           "Time this relay took to produce its previous /metrics answer");
    sample(b, "obx_scrape_duration_seconds", NULL, NULL, x->mx->last_scrape_s);
    if (!x->store_ok) return;
    const obx__store_stats *st = &x->st;
    family(b, "obx_stats_age_seconds", "gauge",
           "Age of the outbox statistics below (reused for 100x the time they took to count)");
    sample(b, "obx_stats_age_seconds", NULL, NULL, (double)x->stats_age_ms / 1000.0);
    family(b, "obx_events", "gauge", "Events by state");
    int64_t all = 0;
    for (int i = 1; i < OBX__ST_COUNT; i++) {
        sample(b, "obx_events", "state", obx__state_name((obx__state)i), (double)st->by_state[i]);
        all += st->by_state[i];
    }
    /* counters of the whole outbox (every relay exports the same values: take max(), not sum()
     * across relays). Events are never deleted and published ones never become unpublished, so
     * both only grow: rate() gives the enqueue and publish rates (docs/ops/). */
    family(b, "obx_outbox_enqueued_total", "counter",
           "Publish slots committed to the outbox, in every state (the whole outbox)");
    sample(b, "obx_outbox_enqueued_total", NULL, NULL, (double)all);
    family(b, "obx_outbox_published_total", "counter",
           "Publish slots PUBLISHED, RETAINED or PURGED (the whole outbox)");
    sample(b, "obx_outbox_published_total", NULL, NULL,
           (double)(st->by_state[OBX__ST_PUBLISHED] + st->by_state[OBX__ST_RETAINED] +
                    st->by_state[OBX__ST_PURGED]));
    family(b, "obx_oldest_pending_age_seconds", "gauge",
           "Age of the oldest PENDING or CLAIMED event (0: none); grows when no relay scans");
    sample(b, "obx_oldest_pending_age_seconds", NULL, NULL,
           st->oldest_pending_committed_at
               ? (double)(x->now - st->oldest_pending_committed_at) / 1000.0
               : 0.0);
    family(b, "obx_unknown_events", "gauge",
           "Events whose publish outcome is unknown (DISPATCH_UNKNOWN, RECONCILING, "
           "RETRY_CLAIMED)");
    sample(b, "obx_unknown_events", NULL, NULL,
           (double)(st->by_state[OBX__ST_DISPATCH_UNKNOWN] + st->by_state[OBX__ST_RECONCILING] +
                    st->by_state[OBX__ST_RETRY_CLAIMED]));
    family(b, "obx_unknown_oldest_age_seconds", "gauge",
           "Age of the oldest unresolved UNKNOWN episode (0: none)");
    sample(b, "obx_unknown_oldest_age_seconds", NULL, NULL,
           st->oldest_unknown_since ? (double)(x->now - st->oldest_unknown_since) / 1000.0 : 0.0);
    family(b, "obx_unknown_held_events", "gauge",
           "UNKNOWN events held for an operator (route policy hold, or a broker copy obx cannot "
           "accept): resolve with obx resolve");
    sample(b, "obx_unknown_held_events", NULL, NULL, (double)st->held);
    family(b, "obx_unknown_held_oldest_age_seconds", "gauge",
           "How long the oldest held UNKNOWN has been waiting for an operator (0: none)");
    sample(b, "obx_unknown_held_oldest_age_seconds", NULL, NULL,
           st->oldest_held ? (double)(x->now - st->oldest_held) / 1000.0 : 0.0);
    family(b, "obx_unknown_held_alert_seconds", "gauge",
           "The held-UNKNOWN age past which obx status and the dashboard raise an alert");
    sample(b, "obx_unknown_held_alert_seconds", NULL, NULL, OBX__HELD_ALERT_MS / 1000.0);
    family(b, "obx_unknown_attempts", "gauge",
           "Attempts with an unknown outcome on events whose publish slot is still empty");
    sample(b, "obx_unknown_attempts", NULL, NULL, (double)st->attempts_unknown);
    family(b, "obx_parked_events", "gauge", "PARKED events waiting for an operator's requeue");
    sample(b, "obx_parked_events", NULL, NULL, (double)st->by_state[OBX__ST_PARKED]);
    family(b, "obx_receipts", "gauge",
           "Receipts by kind (duplicate: transport duplicates kept as evidence; quarantined: "
           "receipts contradicting a frozen event)");
    sample(b, "obx_receipts", "kind", "primary", (double)st->receipts_primary);
    sample(b, "obx_receipts", "kind", "duplicate", (double)st->receipts_duplicate);
    sample(b, "obx_receipts", "kind", "quarantined", (double)st->receipts_quarantined);
    sample(b, "obx_receipts", "kind", "migration", (double)st->receipts_migration);
    family(b, "obx_receipts_asserted", "gauge",
           "Primary receipts an operator asserted on a cluster that cannot be asked (obx resolve "
           "--accept, not verified at the broker): obx audit reports each until a critical "
           "consumer's receipt confirms it");
    sample(b, "obx_receipts_asserted", NULL, NULL, (double)st->receipts_asserted);
}

static void sec_relay(scrape *x, obx__buf *b) {
    obx__engine_stats t;
    x->v->totals(x->v->relay, &t);
    obx__hist lat, res;
    x->v->hists(x->v->relay, &lat, &res);
    family(b, "obx_relay_info", "gauge", "This relay (value 1)");
    obx__buf_puts(b, "obx_relay_info{relay_id=\"");
    label(b, x->v->id);
    obx__buf_printf(b, "\",version=\"%s\"} 1\n", OBX_VERSION_STRING);
    family(b, "obx_relay_stopping", "gauge", "1 when the relay is stopping or stopped on an error");
    sample(b, "obx_relay_stopping", NULL, NULL, x->v->stopping(x->v->relay));
    obx__dispatcher_counts dc[64];
    int nd = x->v->dispatchers(x->v->relay, dc, 64);
    if (nd > 64) nd = 64;
    static const struct {
        const char *name, *help;
        size_t off;
    } dfam[] = {
        {"obx_dispatcher_claimed_total",
         "Events claimed by each dispatcher of this relay (beyond the first only while claims "
         "take whole batches: a backlog)",
         offsetof(obx__dispatcher_counts, claimed)},
        {"obx_dispatcher_claims_total", "Claim transactions of each dispatcher of this relay",
         offsetof(obx__dispatcher_counts, claims)},
        {"obx_dispatcher_empty_claims_total",
         "Claim transactions of each dispatcher that found nothing to claim",
         offsetof(obx__dispatcher_counts, empty_claims)},
    };
    for (size_t k = 0; k < sizeof dfam / sizeof dfam[0]; k++) {
        family(b, dfam[k].name, "counter", dfam[k].help);
        for (int i = 0; i < nd; i++) {
            char d[16];
            snprintf(d, sizeof d, "%d", i);
            int64_t v;
            memcpy(&v, (const char *)&dc[i] + dfam[k].off, sizeof v);
            sample(b, dfam[k].name, "dispatcher", d, (double)v);
        }
    }
    family(b, "obx_publish_latency_seconds", "histogram",
           "From an event's commit to the acceptance of its primary receipt (this relay)");
    hist(b, "obx_publish_latency_seconds", NULL, NULL, &lat);
    family(b, "obx_unknown_resolution_seconds", "histogram",
           "From an UNKNOWN outcome to its resolution (this relay; target p99 under 900 s)");
    hist(b, "obx_unknown_resolution_seconds", NULL, NULL, &res);
    static const struct {
        const char *name, *help;
        size_t off;
    } counters[] = {
#define F(f) offsetof(obx__engine_stats, f)
        {"obx_published_total", "Primary receipts this relay accepted", F(accepted)},
        {"obx_duplicate_receipts_total",
         "Valid receipts after the publish slot was full (recorded, never dropped)", F(duplicates)},
        {"obx_quarantined_total", "Receipts quarantined with an alarm", F(quarantined)},
        {"obx_unknown_outcomes_total", "Sends whose outcome became unknown (timeout, lost ACK)",
         F(unknown)},
        {"obx_swept_total", "SENDING leases that expired with no outcome (now UNKNOWN)", F(swept)},
        {"obx_retries_total", "Reconciler retries to the frozen destination", F(retries)},
        {"obx_rejections_total", "Definite broker rejections (retried with backoff)", F(rejected)},
        {"obx_not_sent_total", "Sends definitely not made (broker down), retried", F(not_sent)},
        {"obx_parked_total", "Events parked after their route's maximum rejections", F(parked)},
        {"obx_stale_refused_total", "Sends refused because the claim was fenced", F(stale_refused)},
        {"obx_store_errors_total", "Store transactions that failed after retries", F(store_errors)},
        {"obx_broker_errors_total", "Broker calls that failed", F(broker_errors)},
#undef F
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        family(b, counters[i].name, "counter", counters[i].help);
        sample(b, counters[i].name, NULL, NULL,
               (double)*(const int64_t *)(const void *)((const char *)&t + counters[i].off));
    }
    family(b, "obx_relay_total", "counter", "Relay counters since start (all of them)");
#define C(name) obx__buf_printf(b, "obx_relay_total{what=\"" #name "\"} %lld\n", (long long)t.name)
    C(claimed);
    C(sent);
    C(stale_refused);
    C(accepted);
    C(duplicates);
    C(quarantined);
    C(rejected);
    C(not_sent);
    C(unknown);
    C(swept);
    C(retries);
    C(parked);
    C(reconciled_found);
    C(reconciled_not_found);
    C(reconciled_cannot_tell);
    C(store_errors);
    C(broker_errors);
    C(claims);
    C(empty_claims);
    C(corrupt_copies);
#undef C
}

/* Reads the consume audit rows added since the previous scrape (bounded per scrape). */
static obx_err consumer_cursor(obx__store *cdb, const char *id, consumer_metrics *cm) {
    obx__consume_audit_row *rows = NULL;
    size_t n = 0;
    obx_err e;
    if (!cm->started) {
        /* start at the newest row: counters and the histogram cover what happens from now */
        if ((e = obx__st_consume_audit_list(cdb, id, NULL, -1, 1, &rows, &n))) return e;
        cm->cursor = n ? rows[0].id : 0;
        cm->started = true;
        free(rows);
        return OBX_OK;
    }
    if ((e = obx__st_consume_audit_list(cdb, id, NULL, cm->cursor, CURSOR_PAGE, &rows, &n)))
        return e;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].id > cm->cursor) cm->cursor = rows[i].id;
        if (!strcmp(rows[i].outcome, "RETRY_SCHEDULED")) { /* not a delivery: a retry's row */
            cm->retries++;
            continue;
        }
        size_t k = 0;
        while (k < N_OUTCOMES && strcmp(outcomes[k], rows[i].outcome)) k++;
        cm->outcome[k]++;
        if (k == 0) obx__hist_observe(&cm->handler, (double)rows[i].duration_us / 1e6);
    }
    free(rows);
    return OBX_OK;
}

static void sec_consumers(scrape *x, obx__buf *b) {
    obx__consumer_set *cs = x->mx->cs;
    if (!cs->n) return;
    obx__published_ref *recent = NULL;
    size_t n_recent = 0;
    bool window = x->store_ok &&
                  obx__st_recent_published(x->s, OBX__LAG_WINDOW, &recent, &n_recent) == OBX_OK;
    typedef struct {
        bool up;
        obx__consumer_lag lag;
        int64_t parked, redrive;
        int64_t retry_due; /* the earliest scheduled retry's due time, 0: none */
    } view;
    view *v = calloc(cs->n, sizeof *v);
    if (!v) {
        free(recent);
        return;
    }
    for (size_t i = 0; i < cs->n; i++) {
        obx__consumer_db *c = &cs->v[i];
        obx_err e = obx__consumer_open(cs, i);
        if (!e && window) e = obx__consumer_lag_of(c->s, c->id, recent, n_recent, &v[i].lag);
        obx__poison_row *pr = NULL;
        size_t np = 0;
        if (!e) e = obx__st_poison_list(c->s, c->id, NULL, &pr, &np);
        for (size_t k = 0; !e && k < np; k++) {
            if (!strcmp(pr[k].state, "PARKED")) v[i].parked++;
            if (!strcmp(pr[k].state, "REDRIVE")) v[i].redrive++;
        }
        obx__poison_rows_free(pr, np);
        int32_t nf = 0;
        obx_err fe = e ? e : obx__st_failure_get(c->s, c->id, NULL, &nf, &v[i].retry_due);
        if (fe != OBX_ENOTFOUND) e = fe;
        if (!e) e = consumer_cursor(c->s, c->id, &x->mx->c[i]);
        if (e && c->s) obx__consumer_drop(cs, i, e);
        v[i].up = !e;
    }
    free(recent);
    family(b, "obx_consumer_up", "gauge", "1 when the critical consumer's database answered");
    for (size_t i = 0; i < cs->n; i++)
        sample(b, "obx_consumer_up", "consumer", cs->v[i].id, v[i].up);
    family(b, "obx_consumer_lag_events", "gauge",
           "Newest published events on the consumer's topics it has no consume receipt for "
           "(counted over a window of the newest published events: saturates at the window)");
    for (size_t i = 0; i < cs->n; i++)
        if (v[i].up)
            sample(b, "obx_consumer_lag_events", "consumer", cs->v[i].id, (double)v[i].lag.missing);
    family(b, "obx_consumer_lag_seconds", "gauge",
           "Age of the oldest published event in the window the consumer has not applied");
    for (size_t i = 0; i < cs->n; i++)
        if (v[i].up)
            sample(b, "obx_consumer_lag_seconds", "consumer", cs->v[i].id,
                   v[i].lag.oldest_missing_at
                       ? (double)(x->now - v[i].lag.oldest_missing_at) / 1000.0
                       : 0.0);
    family(b, "obx_consumer_lag_window_events", "gauge",
           "Events of the lag window on the consumer's topics (the window's size for it)");
    for (size_t i = 0; i < cs->n; i++)
        if (v[i].up)
            sample(b, "obx_consumer_lag_window_events", "consumer", cs->v[i].id,
                   (double)v[i].lag.window);
    family(b, "obx_consumer_last_commit_age_seconds", "gauge",
           "Time since the consumer last committed an event (0: never)");
    for (size_t i = 0; i < cs->n; i++)
        if (v[i].up)
            sample(b, "obx_consumer_last_commit_age_seconds", "consumer", cs->v[i].id,
                   v[i].lag.last_commit_at ? (double)(x->now - v[i].lag.last_commit_at) / 1000.0
                                           : 0.0);
    family(b, "obx_consumer_poison_messages", "gauge",
           "The consumer's failed-message backlog: poison messages PARKED (waiting for an "
           "operator) or marked for REDRIVE");
    for (size_t i = 0; i < cs->n; i++)
        if (v[i].up) {
            obx__buf_puts(b, "obx_consumer_poison_messages{consumer=\"");
            label(b, cs->v[i].id);
            obx__buf_printf(b, "\",state=\"PARKED\"} %lld\n", (long long)v[i].parked);
            obx__buf_puts(b, "obx_consumer_poison_messages{consumer=\"");
            label(b, cs->v[i].id);
            obx__buf_printf(b, "\",state=\"REDRIVE\"} %lld\n", (long long)v[i].redrive);
        }
    family(b, "obx_consumer_messages_total", "counter",
           "Deliveries the consumer's inbox handled since this relay started watching, by "
           "outcome (FAILED ones are retried: their rate is the retry rate)");
    for (size_t i = 0; i < cs->n; i++)
        for (size_t k = 0; k <= N_OUTCOMES; k++) {
            obx__buf_puts(b, "obx_consumer_messages_total{consumer=\"");
            label(b, cs->v[i].id);
            obx__buf_printf(b, "\",outcome=\"%s\"} %lld\n", k < N_OUTCOMES ? outcomes[k] : "OTHER",
                            (long long)x->mx->c[i].outcome[k]);
        }
    family(b, "obx_consumer_retries_scheduled_total", "counter",
           "Handler failures given a retry with back-off (--retry-backoff) since this relay "
           "started watching");
    for (size_t i = 0; i < cs->n; i++)
        sample(b, "obx_consumer_retries_scheduled_total", "consumer", cs->v[i].id,
               (double)x->mx->c[i].retries);
    family(b, "obx_consumer_retry_oldest_due_seconds", "gauge",
           "How long ago the consumer's earliest scheduled retry (of a message not parked) came "
           "due (0: none due); a running consumer retries it within a poll, a growing value means "
           "none does");
    for (size_t i = 0; i < cs->n; i++)
        if (v[i].up)
            sample(b, "obx_consumer_retry_oldest_due_seconds", "consumer", cs->v[i].id,
                   v[i].retry_due && v[i].retry_due < x->now
                       ? (double)(x->now - v[i].retry_due) / 1000.0
                       : 0.0);
    family(b, "obx_consumer_handler_duration_seconds", "histogram",
           "Handler run time of applied deliveries (from the consumer's consume audit)");
    for (size_t i = 0; i < cs->n; i++)
        hist(b, "obx_consumer_handler_duration_seconds", "consumer", cs->v[i].id,
             &x->mx->c[i].handler);
    free(v);
}

/* The relay's auditor (its last run's findings by kind) and, in shadow mode, the last
 * comparison's differences. */
static void sec_audit(scrape *x, obx__buf *b) {
    x->v->audit_metrics(x->v->relay, b); /* obx_audit_findings{kind=...} */
    obx__shadow_counts sc;
    if (!x->v->shadow(x->v->relay, &sc)) return;
    family(b, "obx_shadow_differences", "gauge", "Differences found by the last shadow comparison");
    sample(b, "obx_shadow_differences", "kind", "missing", (double)sc.missing);
    sample(b, "obx_shadow_differences", "kind", "destination", (double)sc.destination);
    sample(b, "obx_shadow_differences", "kind", "partition", (double)sc.partition);
    sample(b, "obx_shadow_differences", "kind", "payload", (double)sc.payload);
    sample(b, "obx_shadow_differences", "kind", "unknown_on_broker", (double)sc.unknown);
    family(b, "obx_shadow_compared", "gauge", "Events the last shadow comparison looked at");
    sample(b, "obx_shadow_compared", NULL, NULL, (double)sc.compared);
    family(b, "obx_shadow_matched", "gauge", "Events the last shadow comparison matched");
    sample(b, "obx_shadow_matched", NULL, NULL, (double)sc.matched);
    family(b, "obx_shadow_rounds", "counter", "Shadow comparisons run");
    sample(b, "obx_shadow_rounds", NULL, NULL, (double)sc.rounds);
}

/* The span exporter's counters (otel.h); zeros when otel.endpoint is empty. */
static void sec_otel(scrape *x, obx__buf *b) {
    obx__otel_stats st;
    obx__otel_stats_get(x->v->otel, &st);
    family(b, "obx_otel_spans_exported_total", "counter",
           "OpenTelemetry spans the collector accepted");
    sample(b, "obx_otel_spans_exported_total", NULL, NULL, (double)st.exported);
    family(b, "obx_otel_spans_dropped_total", "counter",
           "OpenTelemetry spans lost: the queue (otel.queue_max) was full or their export failed");
    sample(b, "obx_otel_spans_dropped_total", NULL, NULL, (double)st.dropped);
    family(b, "obx_otel_export_failures_total", "counter",
           "OpenTelemetry export requests that failed");
    sample(b, "obx_otel_export_failures_total", NULL, NULL, (double)st.failures);
    family(b, "obx_otel_export_retries_total", "counter",
           "OpenTelemetry export requests sent again after a retryable failure (no answer, "
           "HTTP 429, 502, 503, 504)");
    sample(b, "obx_otel_export_retries_total", NULL, NULL, (double)st.retries);
}

/* PENDING events of clusters no live relay serves (obx_relay_cluster's heartbeats): they wait
 * for a relay that is not there (docs/operations.md, "Clusters nobody serves"). A cluster
 * appears only while it has such events. */
static void sec_unserved(scrape *x, obx__buf *b) {
    obx__unserved_row *u = NULL;
    size_t n = 0;
    if (!x->store_ok || obx__st_unserved(x->s, x->now, &u, &n)) return;
    family(b, "obx_pending_unserved_events", "gauge",
           "PENDING events of a cluster no live relay serves (they wait for a relay of that "
           "cluster to start)");
    for (size_t i = 0; i < n; i++)
        sample(b, "obx_pending_unserved_events", "cluster", u[i].cluster, (double)u[i].pending);
    family(b, "obx_pending_unserved_oldest_age_seconds", "gauge",
           "Age of the oldest PENDING event of a cluster no live relay serves");
    for (size_t i = 0; i < n; i++)
        sample(b, "obx_pending_unserved_oldest_age_seconds", "cluster", u[i].cluster,
               (double)(x->now - u[i].oldest_committed_at) / 1000.0);
    free(u);
}

static void (*const sections[])(scrape *, obx__buf *) = {sec_outbox,    sec_unserved, sec_relay,
                                                         sec_consumers, sec_audit,    sec_otel};

obx_err obx__metrics_render(obx__metrics *m, const obx__relay_view *v, obx__store *s,
                            obx__buf *out) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* ages and heartbeats on the database server's clock as this process keeps it (a relay
     * syncs it; elsewhere it is the host's): a relay whose host clock is ahead must not report
     * live relays' clusters unserved or every event old */
    scrape x = {.mx = m, .v = v, .s = s, .now = obx__ref_ms()};
    obx_err e = s ? obx__stats_get(&m->stats, s, &x.st, &x.stats_age_ms) : OBX_ESTORE;
    x.store_ok = !e;
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) sections[i](&x, out);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    m->last_scrape_s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    return e;
}

/*
 * series.c — the dashboard's charts: a bounded ring of samples (http.series_points, one every
 * http.series_interval_ms: an hour at 5 s by default) that the relay's HTTP server takes on a
 * thread of its own and serves as /api/series. It owns the ring and nothing else: a sample
 * reads what /metrics reads (the cached outbox statistics, this relay's counters, each critical
 * consumer's lag window and poison backlog) through the server's own connections.
 *
 * Per sample: enqueued/s and published/s (outbox-wide: the change of the events committed and
 * of those published, retained or purged, over the time since the previous sample), backlog
 * (publish slots not yet published nor parked: PENDING, CLAIMED, SENDING and the three UNKNOWN
 * states), oldest PENDING age, UNKNOWN count and oldest UNKNOWN age, this relay's reconciler
 * retries/s, and per critical consumer its lag (events of the lag window without a receipt)
 * and its PARKED poison messages. A value that could not be read is null (a gap in the chart),
 * never a guess; rates need two samples with the outbox answering both.
 *
 * The ring survives a restart through the outbox (obx_series, store.h: series_put/series_list):
 * each sample is written there (one row per slot, a multiple of the interval; the first relay to
 * write a slot keeps it, so relays sharing an outbox write one series), the rows older than the
 * window deleted as it goes. The first sample the outbox answers reads the window back into the
 * ring (replacing the samples taken before, when the outbox could not be read: gaps), and the
 * rates go on from the last row's totals. Both are ranges of the table's primary key.
 */
#include "drivers/series.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    V_ENQ_RATE,
    V_PUB_RATE,
    V_BACKLOG,
    V_OLDEST_PENDING,
    V_UNKNOWN,
    V_OLDEST_UNKNOWN,
    V_RETRY_RATE,
    V_COUNT
};

static const char *const names[V_COUNT] = {
    "enqueued_per_s", "published_per_s",      "backlog",      "oldest_pending_age_s",
    "unknown_events", "oldest_unknown_age_s", "retries_per_s"};

typedef struct point {
    int64_t t;            /* ms since the epoch */
    double v[V_COUNT];    /* NAN: not known */
    double *lag, *poison; /* per consumer, NAN: not known */
} point;

struct obx__series {
    point *p;
    double *lag, *poison; /* capacity x n_consumers, backing point.lag / point.poison */
    size_t cap, n, head;  /* head: the slot the next sample goes to */
    size_t n_consumers;
    int64_t interval_ms;
    /* the previous sample's totals, for rates (prev_t: the outbox's, prev_ret_t: this relay's
     * retries counter, which starts at 0 with the process) */
    bool prev_ok;
    int64_t prev_t, prev_enqueued, prev_published, prev_ret_t, prev_retries;
    bool restored;     /* the window was read back from the outbox */
    int64_t prev_slot; /* the slot of the last sample kept in the outbox (or read back) */
};

obx_err obx__series_new(size_t capacity, int64_t interval_ms, size_t n_consumers,
                        obx__series **out) {
    obx__series *x = calloc(1, sizeof *x);
    if (!x || !(x->p = calloc(capacity, sizeof *x->p)) ||
        (n_consumers && (!(x->lag = calloc(capacity * n_consumers, sizeof *x->lag)) ||
                         !(x->poison = calloc(capacity * n_consumers, sizeof *x->poison))))) {
        obx__series_free(x);
        return obx__fail(OBX_ENOMEM, "series: out of memory");
    }
    for (size_t i = 0; i < capacity; i++) {
        x->p[i].lag = n_consumers ? x->lag + i * n_consumers : NULL;
        x->p[i].poison = n_consumers ? x->poison + i * n_consumers : NULL;
    }
    x->cap = capacity;
    x->n_consumers = n_consumers;
    x->interval_ms = interval_ms;
    *out = x;
    return OBX_OK;
}

void obx__series_free(obx__series *x) {
    if (!x) return;
    free(x->p);
    free(x->lag);
    free(x->poison);
    free(x);
}

static double rate(int64_t now, int64_t before, int64_t dt_ms) {
    if (dt_ms <= 0) return NAN;
    double d = (double)(now - before);
    return d < 0 ? 0.0 : d * 1000.0 / (double)dt_ms; /* a purge never makes a rate negative */
}

/* The outbox-wide values of pt from st (the cached statistics); *enqueued and *published get
 * the totals the rates are taken from. */
static void outbox_values(point *pt, const obx__store_stats *st, int64_t now, int64_t *enqueued,
                          int64_t *published) {
    *enqueued = 0;
    for (int i = 1; i < OBX__ST_COUNT; i++) *enqueued += st->by_state[i];
    *published = st->by_state[OBX__ST_PUBLISHED] + st->by_state[OBX__ST_RETAINED] +
                 st->by_state[OBX__ST_PURGED];
    int64_t unknown = st->by_state[OBX__ST_DISPATCH_UNKNOWN] + st->by_state[OBX__ST_RECONCILING] +
                      st->by_state[OBX__ST_RETRY_CLAIMED];
    pt->v[V_BACKLOG] = (double)(st->by_state[OBX__ST_PENDING] + st->by_state[OBX__ST_CLAIMED] +
                                st->by_state[OBX__ST_SENDING] + unknown);
    pt->v[V_UNKNOWN] = (double)unknown;
    pt->v[V_OLDEST_PENDING] = st->oldest_pending_committed_at
                                  ? (double)(now - st->oldest_pending_committed_at) / 1000.0
                                  : 0.0;
    pt->v[V_OLDEST_UNKNOWN] =
        st->oldest_unknown_since ? (double)(now - st->oldest_unknown_since) / 1000.0 : 0.0;
}

/* Each critical consumer's lag and poison backlog into pt: the same window and poison rows
 * /metrics reads. */
static void consumer_values(obx__series *x, point *pt, const obx__series_src *src, bool outbox) {
    obx__published_ref *recent = NULL;
    size_t n_recent = 0;
    bool window = outbox && x->n_consumers &&
                  obx__st_recent_published(src->s, OBX__LAG_WINDOW, &recent, &n_recent) == OBX_OK;
    for (size_t c = 0; c < x->n_consumers && c < src->cs->n; c++) {
        obx__consumer_db *cd = &src->cs->v[c];
        obx_err ce = obx__consumer_open(src->cs, c);
        obx__consumer_lag lag;
        if (!ce && window && !(ce = obx__consumer_lag_of(cd->s, cd->id, recent, n_recent, &lag)))
            pt->lag[c] = (double)lag.missing;
        obx__poison_row *pr = NULL;
        size_t np = 0;
        if (!ce && !(ce = obx__st_poison_list(cd->s, cd->id, "PARKED", &pr, &np)))
            pt->poison[c] = (double)np;
        obx__poison_rows_free(pr, np);
        if (ce && cd->s) obx__consumer_drop(src->cs, c, ce);
    }
    free(recent);
}

static json_t *num(double v) { return isnan(v) ? json_null() : json_real(v); }
static double val(const json_t *j) { return json_is_number(j) ? json_number_value(j) : NAN; }

/* pt (a sample the outbox answered) as the row obx_series keeps: {"v": [the values], "c":
 * {consumer: [lag, poison]}, "enq", "pub": the totals of the rates}. NULL when out of memory. */
static char *encode(const obx__series *x, const point *pt, const obx__consumer_set *cs) {
    json_t *v = json_array(), *c = json_object(), *doc = json_object();
    for (int i = 0; i < V_COUNT; i++) json_array_append_new(v, num(pt->v[i]));
    for (size_t k = 0; k < x->n_consumers && k < cs->n; k++)
        json_object_set_new(c, cs->v[k].id, json_pack("[oo]", num(pt->lag[k]), num(pt->poison[k])));
    json_object_set_new(doc, "v", v);
    json_object_set_new(doc, "c", c);
    json_object_set_new(doc, "enq", json_integer(x->prev_enqueued));
    json_object_set_new(doc, "pub", json_integer(x->prev_published));
    char *txt = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    return txt;
}

/* The row r into the ring's next slot; its totals become the rates' previous sample. */
static void decode(obx__series *x, const obx__series_row *r, const obx__consumer_set *cs) {
    point *pt = &x->p[x->head];
    pt->t = r->at;
    json_t *doc = json_loads(r->sample, 0, NULL);
    const json_t *v = json_object_get(doc, "v"), *c = json_object_get(doc, "c");
    for (int i = 0; i < V_COUNT; i++) pt->v[i] = val(json_array_get(v, (size_t)i));
    for (size_t k = 0; k < x->n_consumers && k < cs->n; k++) {
        const json_t *lp = json_object_get(c, cs->v[k].id); /* NULL: not critical then */
        pt->lag[k] = val(json_array_get(lp, 0));
        pt->poison[k] = val(json_array_get(lp, 1));
    }
    const json_t *enq = json_object_get(doc, "enq"), *pub = json_object_get(doc, "pub");
    x->prev_ok = json_is_integer(enq) && json_is_integer(pub);
    x->prev_t = r->at;
    x->prev_slot = r->slot;
    x->prev_enqueued = (int64_t)json_integer_value(enq);
    x->prev_published = (int64_t)json_integer_value(pub);
    json_decref(doc);
    x->head = (x->head + 1) % x->cap;
    if (x->n < x->cap) x->n++;
}

/* The window (the last capacity slots before now) read back from the outbox into the ring, in
 * place of what it held. */
static obx_err restore(obx__series *x, const obx__series_src *src, int64_t now) {
    obx__series_row *rows = NULL;
    size_t n = 0;
    obx_err e =
        obx__st_series_list(src->s, now - (int64_t)x->cap * x->interval_ms, x->cap, &rows, &n);
    if (e) return e;
    x->n = x->head = 0;
    x->prev_ok = false;
    for (size_t i = 0; i < n; i++) decode(x, &rows[i], src->cs);
    obx__series_rows_free(rows, n);
    x->restored = true;
    return OBX_OK;
}

/* pt kept in the outbox, in a slot of its own; the rows before the window deleted. */
static obx_err keep(obx__series *x, const point *pt, const obx__series_src *src) {
    char *txt = encode(x, pt, src->cs);
    if (!txt) return obx__fail(OBX_ENOMEM, "series: out of memory");
    /* the nearest slot boundary, or the next slot when a late sample and an early one fall on
     * the same (the schedule is fixed: the next sample rounds back) */
    int64_t slot = (pt->t + x->interval_ms / 2) / x->interval_ms * x->interval_ms;
    if (slot <= x->prev_slot) slot = x->prev_slot + x->interval_ms;
    x->prev_slot = slot;
    obx__series_row r = {.slot = slot, .at = pt->t, .sample = txt};
    obx_err e = obx__st_series_put(src->s, &r, pt->t - (int64_t)x->cap * x->interval_ms);
    free(txt);
    return e;
}

obx_err obx__series_sample(obx__series *x, const obx__series_src *src, int64_t now) {
    obx__engine_stats t;
    src->v->totals(src->v->relay, &t);
    obx__store_stats st;
    int64_t age = 0, enqueued = 0, published = 0;
    obx_err e = src->s ? obx__stats_get(src->stats, src->s, &st, &age) : OBX_ESTORE, ke = OBX_OK;
    if (!e && !x->restored) ke = restore(x, src, now); /* failed: tried again at the next */
    point *pt = &x->p[x->head];
    pt->t = now;
    for (int i = 0; i < V_COUNT; i++) pt->v[i] = NAN;
    for (size_t c = 0; c < x->n_consumers; c++) pt->lag[c] = pt->poison[c] = NAN;
    if (!e) {
        outbox_values(pt, &st, now, &enqueued, &published);
        if (x->prev_ok) {
            pt->v[V_ENQ_RATE] = rate(enqueued, x->prev_enqueued, now - x->prev_t);
            pt->v[V_PUB_RATE] = rate(published, x->prev_published, now - x->prev_t);
        }
        x->prev_enqueued = enqueued;
        x->prev_published = published;
        x->prev_t = now;
    }
    if (x->prev_ret_t) pt->v[V_RETRY_RATE] = rate(t.retries, x->prev_retries, now - x->prev_ret_t);
    x->prev_retries = t.retries;
    x->prev_ret_t = now;
    x->prev_ok = !e;
    consumer_values(x, pt, src, !e);
    if (!e && !ke) ke = keep(x, pt, src);
    x->head = (x->head + 1) % x->cap;
    if (x->n < x->cap) x->n++;
    return e ? e : ke;
}

obx_err obx__series_json(const obx__series *x, const obx__consumer_set *cs, json_t **out) {
    json_t *t = json_array(), *vals[V_COUNT], *doc = json_object(), *cons = json_array();
    for (int i = 0; i < V_COUNT; i++) vals[i] = json_array();
    size_t start = (x->head + x->cap - x->n) % x->cap;
    for (size_t k = 0; k < x->n; k++) {
        const point *pt = &x->p[(start + k) % x->cap];
        json_array_append_new(t, json_real((double)pt->t / 1000.0)); /* uPlot: seconds */
        for (int i = 0; i < V_COUNT; i++) json_array_append_new(vals[i], num(pt->v[i]));
    }
    for (size_t c = 0; c < x->n_consumers && c < cs->n; c++) {
        json_t *lag = json_array(), *poison = json_array();
        for (size_t k = 0; k < x->n; k++) {
            const point *pt = &x->p[(start + k) % x->cap];
            json_array_append_new(lag, num(pt->lag[c]));
            json_array_append_new(poison, num(pt->poison[c]));
        }
        json_array_append_new(cons, json_pack("{s:s,s:o,s:o}", "consumer_id", cs->v[c].id,
                                              "lag_events", lag, "poison_parked", poison));
    }
    json_object_set_new(doc, "interval_ms", json_integer(x->interval_ms));
    json_object_set_new(doc, "capacity", json_integer((json_int_t)x->cap));
    json_object_set_new(doc, "t", t);
    for (int i = 0; i < V_COUNT; i++) json_object_set_new(doc, names[i], vals[i]);
    json_object_set_new(doc, "consumers", cons);
    *out = doc;
    return OBX_OK;
}

/*
 * hist.h — Prometheus histograms (implemented in metrics.c): fixed bounds, cumulative since
 * the process started; the relay keeps them per thread and sums them for a scrape.
 */
#ifndef OBX_DRIVERSIST_H
#define OBX_DRIVERSIST_H

#include "core/core.h"

/* A Prometheus histogram: fixed upper bounds in seconds, cumulative since the process started.
 * Counts are per bucket (not cumulative); rendering accumulates them. */
#define OBX__HIST_MAX 24
typedef struct obx__hist {
    const double *le; /* upper bounds, increasing; +Inf is implicit */
    size_t n;
    int64_t bucket[OBX__HIST_MAX + 1]; /* bucket[n] counts values above every bound */
    int64_t count;
    double sum;
} obx__hist;

extern const double obx__publish_latency_le[];    /* commit -> accepted receipt */
extern const double obx__unknown_resolution_le[]; /* UNKNOWN -> resolved (target p99 < 900 s) */
extern const double obx__handler_le[];            /* a consumer handler's run */
void obx__hist_init(obx__hist *h, const double *le);
void obx__hist_observe(obx__hist *h, double seconds);
void obx__hist_add(obx__hist *into, const obx__hist *h); /* same bounds */

#endif

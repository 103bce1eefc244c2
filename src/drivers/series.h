/*
 * series.h — the dashboard's charts (series.c): a bounded ring of samples of a running relay.
 */
#ifndef OBX_DRIVERS_SERIES_H
#define OBX_DRIVERS_SERIES_H

#include "drivers/observe.h"
#include "drivers/relay_view.h"

/* What one sample reads (the HTTP server's connections, under its lock). */
typedef struct obx__series_src {
    const obx__relay_view *v;
    obx__store *s; /* NULL when the outbox could not be opened: the sample has no outbox values */
    obx__stats_cache *stats;
    obx__consumer_set *cs;
} obx__series_src;

typedef struct obx__series obx__series;
/* capacity samples, one every interval_ms (both from http.series_*). */
obx_err obx__series_new(size_t capacity, int64_t interval_ms, size_t n_consumers,
                        obx__series **out);
void obx__series_free(obx__series *x);
/* Takes one sample now (wall clock now_ms). Returns the outbox's error (the caller drops that
 * connection), OBX_OK when it answered; the sample is recorded either way. */
obx_err obx__series_sample(obx__series *x, const obx__series_src *src, int64_t now_ms);
/* The ring as the document /api/series serves (oldest first). */
obx_err obx__series_json(const obx__series *x, const obx__consumer_set *cs, json_t **out);

#endif

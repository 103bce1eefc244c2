/*
 * metrics.h — the Prometheus exposition of a running relay (metrics.c).
 */
#ifndef OBX_DRIVERS_METRICS_H
#define OBX_DRIVERS_METRICS_H

#include "drivers/observe.h"
#include "drivers/relay_view.h"

typedef struct obx__metrics obx__metrics;
/* cs: the critical consumers (borrowed; the HTTP server owns them). */
obx_err obx__metrics_new(obx__consumer_set *cs, obx__metrics **out);
void obx__metrics_free(obx__metrics *m);
/* The whole exposition. s: the outbox (NULL when it could not be opened: obx_up 0). Returns
 * the outbox's error (the caller drops that connection), OBX_OK when it answered. */
obx_err obx__metrics_render(obx__metrics *m, const obx__relay_view *v, obx__store *s,
                            obx__buf *out);
/* The statistics cache the dashboard shares with /metrics. */
obx__stats_cache *obx__metrics_stats(obx__metrics *m);

#endif

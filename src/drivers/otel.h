/*
 * otel.h — OpenTelemetry spans of the life of an event (otel.c; docs/operations.md,
 * "OpenTelemetry"). The relay, the consumer loop and obx_enqueue() hand their events to an
 * exporter (struct obx_otel, opened from the otel.* keys); the exporter's own thread sends them in
 * batches over OTLP/HTTP. The callers never wait: a span that finds the queue full is dropped
 * and counted. Nothing here runs when otel.endpoint is empty (no exporter, NULL everywhere).
 */
#ifndef OBX_DRIVERS_OTEL_H
#define OBX_DRIVERS_OTEL_H

#include "drivers/config.h"

typedef struct obx__otel_stats {
    int64_t queued;   /* spans accepted into the queue */
    int64_t exported; /* spans the collector accepted (HTTP 2xx) */
    int64_t dropped;  /* spans lost: the queue was full, or their batch failed */
    int64_t failures; /* export requests that failed */
    int64_t retries;  /* export requests sent again after a retryable failure */
} obx__otel_stats;

/* The exporter's counters; all zero for NULL. Any thread. */
void obx__otel_stats_get(obx_otel *o, obx__otel_stats *out);

/* The relay's engine notes as spans: a publish attempt's outcome (dispatcher, or the
 * reconciler's retry), or a reconciliation's decision (reconciler). o NULL: nothing. Any thread;
 * never blocks on the network. */
void obx__otel_note(obx_otel *o, const obx__note *n);

/* One consumer delivery through the inbox, from start_ms to now: a CONSUMER span "process". */
void obx__otel_process(obx_otel *o, const char *consumer, const obx_message *m,
                       const obx_inbox_result *r, int64_t start_ms);

#endif

/*
 * relay_view.h — the typed view a running relay hands the HTTP server, the metrics, the
 * dashboard's charts and the auditor (relay.c assembles the daemon; they never call into it).
 */
#ifndef OBX_DRIVERS_RELAY_VIEW_H
#define OBX_DRIVERS_RELAY_VIEW_H

#include "drivers/config.h"
#include "drivers/hist.h"

/* The relay's last shadow comparison (shadow mode; counts of its report). */
typedef struct obx__shadow_counts {
    int64_t rounds, at, compared, matched, missing, destination, partition, payload, unknown;
} obx__shadow_counts;

/* What a running relay shows the parts it starts beside its workers (the HTTP server, its
 * metrics and charts, the auditor): a typed, read-only view that relay.c fills before it
 * starts them and that stays valid until obx_relay_wait has stopped them. The functions may be
 * called from any thread (the relay takes its own lock). These parts know the relay only
 * through this view: relay.c includes their headers, they do not call back into relay.c. */
/* One dispatcher's claims so far: events claimed, claim transactions, and those that found
 * nothing. */
typedef struct obx__dispatcher_counts {
    int64_t claimed, claims, empty_claims;
} obx__dispatcher_counts;

typedef struct obx__relay_view {
    const obx_config *cfg; /* the relay's configuration */
    const char *id;        /* the relay's ID */
    int64_t started_at;    /* wall clock, ms */
    obx_relay *relay;      /* passed back to the functions below */
    /* true once the relay was asked to stop (its threads finish their current step) */
    bool (*stopping)(obx_relay *relay);
    /* true when every thread reached the database (with the schema) and the broker and none
     * fails on them now; else false and why (one line). Answers at once: the relay's own
     * state, no store or broker call. */
    bool (*ready)(obx_relay *relay, char *why, size_t cap);
    /* every worker's counters, summed */
    void (*totals)(obx_relay *relay, obx__engine_stats *t);
    /* each dispatcher's claims (out[i] for dispatcher i, up to cap); returns how many
     * dispatchers the relay runs. Beyond the first they claim only during a backlog. */
    int (*dispatchers)(obx_relay *relay, obx__dispatcher_counts *out, int cap);
    /* the workers' histograms, summed (publish latency, UNKNOWN resolution) */
    void (*hists)(obx_relay *relay, obx__hist *latency, obx__hist *resolution);
    /* the last shadow comparison; returns 0 when the relay is not in shadow mode */
    int (*shadow)(obx_relay *relay, obx__shadow_counts *out);
    /* Prometheus lines of the auditor's last audit and purges (nothing without an auditor) */
    void (*audit_metrics)(obx_relay *relay, obx__buf *b);
    obx_otel *otel; /* the span exporter (otel.h), NULL when off: its counters in /metrics */
} obx__relay_view;

/* A started relay's view (relay.c); valid until obx_relay_close. For tests that render a
 * running relay's metrics or start its parts by hand. */
const obx__relay_view *obx__relay_view_of(obx_relay *r);

#endif

/*
 * drivers.h — what runs the engine: configuration, logging, the relay daemon (threads, timers,
 * drain), the consumer loop. Drivers own the clock and the threads; the engine owns neither.
 */
#ifndef OBX_DRIVERS_H
#define OBX_DRIVERS_H

#include "engine/engine.h"

#include <stdatomic.h>

/* A held UNKNOWN (one only an operator, a lookup's proof or a consumer's evidence can end)
 * older than this is an alert in `obx status`, on the dashboard and in docs/ops/alerts.yml: the
 * release gate's bound on UNKNOWN resolution (p99 under 15 minutes). */
#define OBX__HELD_ALERT_MS 900000

typedef struct obx__strv {
    char **v;
    size_t n;
} obx__strv;

struct obx_config {
    char db[1024];
    char broker[1024];
    obx__strv broker_props; /* "key=value" */
    char relay_id[201];
    int64_t dispatchers, batch, window, lease_ms, reconcile_lease_ms, recheck_ms, recheck_max_ms,
        backoff_base_ms, backoff_max_ms, poll_ms, sweep_ms, reconcile_ms, drain_ms, reconciler;
    obx__strv aliases;
    char http_listen[128];
    char http_token_file[512];
    int64_t series_interval_ms, series_points; /* the dashboard's sample ring (series.c) */
    char log_format[16];
    char log_level[16];
    obx__strv critical_consumers; /* "id=sqlite:..." */
    int64_t pending_max_age_ms, unconsumed_max_age_ms, unknown_max_age_ms, audit_interval_ms;
    int64_t replay_window_ms, purge_batch;
    int64_t audit_max_ids, audit_max_scan, audit_scan_window_ms, purge_interval_ms;
    int64_t purge_max_rate; /* retention.max_rate: events per second, 0 = as fast as it goes */
    /* shadow mode (docs/migration.md): claim nothing, send nothing, compare */
    int64_t shadow, shadow_interval_ms, shadow_grace_ms, shadow_window_ms;
    char shadow_feed[1024];
    obx__strv shadow_topics;
};

/* The relay's last shadow comparison (shadow mode; counts of its report). */
typedef struct obx__shadow_counts {
    int64_t rounds, at, compared, matched, missing, destination, partition, payload, unknown;
} obx__shadow_counts;

obx_err obx__config_copy(const obx_config *src, obx_config **out);
obx_err obx__config_check(const obx_config *c);

/* ---- audit and retention (retention.c): the stores a configuration names ---- */
/* Opens every critical consumer of c (audit.critical_consumers, "ID=URL"), checks its schema and
 * reads its forced watermark. On failure nothing stays open. */
obx_err obx__criticals_open(const obx_config *c, obx__critical **out, size_t *n);
void obx__criticals_close(obx__critical *v, size_t n);
/* The relay's auditor thread (audit.interval_ms, retention.interval_ms; both 0: *out = NULL). It
 * stops when the relay stops; obx__auditor_stop joins it. */
obx_err obx__auditor_start(obx_relay *r, void **out);
void obx__auditor_stop(void *auditor);
/* Prometheus lines of the last audit and of the relay's purges (nothing when auditor is NULL). */
void obx__auditor_metrics(void *auditor, obx__buf *b);

/* ---- the simulator's SQLite allocator (src/sim/sim_malloc.c) ---- */
/* Installs per-thread small-block recycling as SQLite's allocator, once per process, before
 * SQLite is initialized; false (nothing changed) when SQLite already runs or in an ASan build. */
bool obx__sim_malloc_install(void);

/* ---- logging (log.c): one line per record, text or JSON; never a secret ---- */
typedef enum { OBX__LOG_DEBUG, OBX__LOG_INFO, OBX__LOG_WARN, OBX__LOG_ERROR } obx__log_level;
void obx__log_setup(const char *format, const char *level);
void obx__log(obx__log_level lvl, const char *component, const char *event_id,
              const char *attempt_id, const char *correlation_id, const char *fmt, ...)
    OBX__PRINTF(6, 7);

/* ---- operations (observe.c, metrics.c): critical consumers, status, trace, metrics -------- */

typedef struct obx__consumer_set obx__consumer_set;
typedef struct obx__stats_cache obx__stats_cache;

/* ---- histograms and /metrics (metrics.c) ------------------------------------------------- */

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

typedef struct obx__metrics obx__metrics;
/* cs: the critical consumers (borrowed; the HTTP server owns them). */
obx_err obx__metrics_new(obx__consumer_set *cs, obx__metrics **out);
void obx__metrics_free(obx__metrics *m);
/* The whole exposition. s: the outbox (NULL when it could not be opened: obx_up 0). Returns
 * the outbox's error (the caller drops that connection), OBX_OK when it answered. */
obx_err obx__metrics_render(obx__metrics *m, obx_relay *r, obx__store *s, obx__buf *out);
/* The statistics cache the dashboard shares with /metrics. */
obx__stats_cache *obx__metrics_stats(obx__metrics *m);

/* ---- the relay, as the HTTP server sees it (relay.c) ---- */
void obx__relay_totals(obx_relay *r, obx__engine_stats *t);
/* The relay's histograms summed over its threads. */
void obx__relay_hists(obx_relay *r, obx__hist *publish_latency, obx__hist *unknown_resolution);
const obx_config *obx__relay_config(obx_relay *r);
const char *obx__relay_id(obx_relay *r);
int obx__relay_stopping(obx_relay *r);
int64_t obx__relay_started_at(obx_relay *r);
/* The relay's auditor thread (NULL when none) and, in shadow mode, its last comparison
 * (returns 0 when the relay is not in shadow mode). */
void *obx__relay_auditor(obx_relay *r);
int obx__relay_shadow(obx_relay *r, obx__shadow_counts *out);

/* The critical consumers named in configuration ("ID=URL", audit.critical_consumers), with
 * their database handles opened on demand and dropped after an error (reopened on next use). */
typedef struct obx__consumer_db {
    char id[OBX_NAME_MAX + 1];
    char *url; /* as configured (may hold a password: never printed) */
    char url_redacted[1024];
    obx__store *s; /* NULL while closed */
    char error[512];
} obx__consumer_db;

struct obx__consumer_set {
    obx__consumer_db *v;
    size_t n;
};

/* Splits "ID=URL" (ID in [A-Za-z0-9._-], URL a store URL). */
obx_err obx__consumer_decl_check(const char *decl);
obx_err obx__consumer_set_init(obx__consumer_set *cs, const char *const *decls, size_t n);
void obx__consumer_set_free(obx__consumer_set *cs);
/* Opens consumer i when closed; on failure records the error and returns it. */
obx_err obx__consumer_open(obx__consumer_set *cs, size_t i);
/* Closes consumer i after an error so that the next use reconnects. */
void obx__consumer_drop(obx__consumer_set *cs, size_t i, obx_err e);

/* Store statistics reused while they are young: a stats query that took T ms is reused for up
 * to 100 T ms (at most 60 s), so the database spends at most about 1% of its time on metrics
 * and dashboards however often they are read. (PostgreSQL's statistics are delta rows and take
 * ~1 ms; SQLite's count the event table and take longer on a big outbox.) */
struct obx__stats_cache {
    obx__store_stats st;
    bool valid;
    int64_t at_ms;   /* monotonic */
    int64_t cost_ms; /* how long the last query took */
};

obx_err obx__stats_get(obx__stats_cache *c, obx__store *s, obx__store_stats *out, int64_t *age_ms);

/* Consumer lag over a bounded window of the newest PUBLISHED events (recent): those on the
 * consumer's topics (the topics of its watermarks; all when it has none) that it has no
 * consume receipt for. Saturates at the window: the three-set audit counts the whole backlog. */
typedef struct obx__consumer_lag {
    int64_t missing;           /* events in the window without a consume receipt */
    int64_t oldest_missing_at; /* published_at of the oldest of them, 0 none */
    int64_t window;            /* events of the window on the consumer's topics */
    int64_t last_commit_at;    /* newest watermark commit, 0 none */
} obx__consumer_lag;

obx_err obx__consumer_lag_of(obx__store *cdb, const char *consumer,
                             const obx__published_ref *recent, size_t n_recent,
                             obx__consumer_lag *out);

#define OBX__LAG_WINDOW 1000

/* ---- the dashboard's charts (series.c): a bounded ring of samples ------------------------ */

/* What one sample reads (the HTTP server's connections, under its lock). */
typedef struct obx__series_src {
    obx_relay *r;
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

/* The documents behind obx_status and obx_trace, on open handles (the HTTP server reuses its
 * own). st: precomputed statistics or NULL. */
obx_err obx__status_json(obx__store *s, obx__consumer_set *cs, const obx__store_stats *st,
                         size_t limit, int64_t now, json_t **out);
obx_err obx__trace_json(obx__store *s, obx__consumer_set *cs, const char *event_id,
                        const char *correlation_id, size_t limit, json_t **out);

#endif

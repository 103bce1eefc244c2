/*
 * observe.h — what operations read (observe.c): the critical consumers' databases, the
 * statistics cache, consumer lag, and the documents behind `obx status` and `obx trace`.
 */
#ifndef OBX_DRIVERS_OBSERVE_H
#define OBX_DRIVERS_OBSERVE_H

#include "engine/engine.h"

/* A held UNKNOWN (one only an operator, a lookup's proof or a consumer's evidence can end)
 * older than this is an alert in `obx status`, on the dashboard and in docs/ops/alerts.yml: the
 * release gate's bound on UNKNOWN resolution (p99 under 15 minutes). */
#define OBX__HELD_ALERT_MS 900000

typedef struct obx__consumer_set obx__consumer_set;
typedef struct obx__stats_cache obx__stats_cache;

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
    /* how obx__consumer_open opens them: OBX_STORE_READ_ONLY for what only reads (obx status,
     * obx trace, obx catalog check); 0 where one is also written (the dashboard's re-drive) */
    unsigned open_flags;
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

/* The documents behind obx_status and obx_trace, on open handles (the HTTP server reuses its
 * own). st: precomputed statistics or NULL. */
obx_err obx__status_json(obx__store *s, obx__consumer_set *cs, const obx__store_stats *st,
                         size_t limit, int64_t now, json_t **out);
obx_err obx__trace_json(obx__store *s, obx__consumer_set *cs, const char *event_id,
                        const char *correlation_id, size_t limit, json_t **out);

#endif

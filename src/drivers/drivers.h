/*
 * drivers.h — what runs the engine: configuration, logging, the relay daemon (threads, timers,
 * drain), the consumer loop. Drivers own the clock and the threads; the engine owns neither.
 */
#ifndef OBX_DRIVERS_H
#define OBX_DRIVERS_H

#include "engine/engine.h"

#include <stdatomic.h>

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
    char log_format[16];
    char log_level[16];
    obx__strv critical_consumers; /* "id=sqlite:..." */
    int64_t pending_max_age_ms, unconsumed_max_age_ms, unknown_max_age_ms, audit_interval_ms;
    int64_t replay_window_ms, purge_batch;
    int64_t audit_max_ids, audit_max_scan, audit_scan_window_ms, purge_interval_ms;
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
const obx_config *obx__relay_config(obx_relay *r);
const char *obx__relay_id(obx_relay *r);
int obx__relay_stopping(obx_relay *r);

/* ---- logging (log.c): one line per record, text or JSON; never a secret ---- */
typedef enum { OBX__LOG_DEBUG, OBX__LOG_INFO, OBX__LOG_WARN, OBX__LOG_ERROR } obx__log_level;
void obx__log_setup(const char *format, const char *level);
void obx__log(obx__log_level lvl, const char *component, const char *event_id,
              const char *attempt_id, const char *correlation_id, const char *fmt, ...)
    OBX__PRINTF(6, 7);

#endif

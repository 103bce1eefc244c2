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

/* ---- logging (log.c): one line per record, text or JSON; never a secret ---- */
typedef enum { OBX__LOG_DEBUG, OBX__LOG_INFO, OBX__LOG_WARN, OBX__LOG_ERROR } obx__log_level;
void obx__log_setup(const char *format, const char *level);
void obx__log(obx__log_level lvl, const char *component, const char *event_id,
              const char *attempt_id, const char *correlation_id, const char *fmt, ...)
    OBX__PRINTF(6, 7);

#endif

/*
 * config.h — the relay's configuration (config.c): the struct obx_config behind the public
 * obx_config handle, its copy and its checks.
 */
#ifndef OBX_DRIVERS_CONFIG_H
#define OBX_DRIVERS_CONFIG_H

#include "engine/engine.h"

typedef struct obx__strv {
    char **v;
    size_t n;
} obx__strv;

struct obx_config {
    char db[1024];
    char broker[1024];
    obx__strv broker_props; /* "key=value" */
    char relay_id[201];
    int64_t dispatchers, batch, max_payload, window, lease_ms, reconcile_lease_ms, recheck_ms,
        recheck_max_ms, backoff_base_ms, backoff_max_ms, poll_ms, sweep_ms, reconcile_ms, drain_ms,
        reconciler, heartbeat_ms;
    obx__strv aliases;
    /* connect.*: the wait for a database or broker that is not there (deps.c) */
    int64_t retry_initial_ms, retry_max_ms;
    char http_listen[128];
    char http_token_file[512];
    obx__strv http_allowed_hosts; /* Host names served besides the loopback literals */
    int64_t http_max_connections, http_max_connections_per_ip; /* the listener's limits */
    int64_t series_interval_ms, series_points; /* the dashboard's sample ring (series.c) */
    char log_format[16];
    char log_level[16];
    int64_t log_fold_after, log_fold_interval_ms; /* per-event records folded (log.c) */
    obx__strv critical_consumers;                 /* "id=sqlite:..." */
    char otel_endpoint[1024], otel_service[128];  /* OpenTelemetry spans (otel.c) */
    char enc_keys[1024]; /* encryption.keys: the key ring's reference (crypt.c) */
    int64_t otel_queue_max, otel_interval_ms, otel_timeout_ms;
    int64_t pending_max_age_ms, unconsumed_max_age_ms, unknown_max_age_ms, audit_interval_ms;
    int64_t replay_window_ms, purge_batch;
    int64_t audit_max_ids, audit_max_scan, audit_scan_window_ms, purge_interval_ms;
    int64_t purge_max_rate; /* retention.max_rate: events per second, 0 = as fast as it goes */
    /* shadow mode (docs/migration.md): claim nothing, send nothing, compare */
    int64_t shadow, shadow_interval_ms, shadow_grace_ms, shadow_window_ms;
    char shadow_feed[1024];
    obx__strv shadow_topics;
};

obx_err obx__config_copy(const obx_config *src, obx_config **out);
obx_err obx__config_check(const obx_config *c);

#endif

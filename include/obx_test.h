/*
 * obx_test.h — test and simulation support of libobx: the deterministic simulator and release
 * gate (`obx sim`, docs/design.md, "The release gate") and an in-process Kafka-protocol mock
 * cluster (`obx demo --broker kafka`, benchmarks). obx's own CLI, tests and benchmarks use it.
 *
 * Not part of the stable API: these declarations may change in any release, and the header is
 * not installed (`cmake --install` ships obx.h only; tests/pkg/test_install.sh checks that).
 * The conventions of obx.h hold here: every fallible call returns an obx_err with a message
 * from obx_errmsg(), strings passed in are borrowed for the call, and a char ** output is the
 * caller's to free with obx_free().
 */
#ifndef OBX_TEST_H
#define OBX_TEST_H

#include "obx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * A Kafka-protocol cluster in this process (librdkafka's mock cluster), for demos and tests.
 * Other processes reach it at the bootstrap list written to `bootstraps` until it is stopped.
 * Its brokers answer with Nagle's algorithm off (TCP_NODELAY on the connections they accept),
 * as Kafka's brokers do. OBX_EUNSUPPORTED in builds without Kafka.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_kafka_mock obx_kafka_mock;
OBX_API obx_err obx_kafka_mock_start(int brokers, const char *topic, int partitions,
                                     char *bootstraps, size_t cap, obx_kafka_mock **out);
OBX_API void obx_kafka_mock_stop(obx_kafka_mock *m);

/* ---------------------------------------------------------------------------------------------
 * The deterministic simulator and release gate (`obx sim`, docs/design.md, "The release gate").
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_sim_options {
    uint64_t seed;
    long traces;
    int jobs;             /* worker threads, 1..64 */
    uint64_t faults_mask; /* bit i enables fault class i (obx_sim_fault_name); 0 = all */
    long replay;          /* >= 0: run only this trace, narrating every step on stderr */
    const char *mutation; /* test-only builds (OBX_MUTATIONS): an engine mutation to enable */
    int fail_fast;        /* stop starting new traces after the first failing one */
    void (*progress)(void *user, long done, long total); /* may be NULL; called from workers */
    void *progress_user;
    /* NULL: the outbox is SQLite in memory (one per worker). A postgres:// URL: the PostgreSQL
     * store on that database (schema applied first); each worker runs every trace inside one
     * transaction on its own connection and rolls it back, so the database keeps nothing.
     * Borrowed for the call. */
    const char *db_url;
} obx_sim_options;

/* Runs the traces and writes the gate as JSON (the caller frees): traces, seed, lost_events,
 * second_event_ids, cross_destination_retries, digest_divergence, consumer_duplicate_effects,
 * late_ack_total, late_ack_converged, unknown_total, unknown_untraceable, unknown_p99_s,
 * faults_fired, trace_hash, passed, and more. Returns OBX_OK whether or not the gate passed. */
OBX_API obx_err obx_sim_run(const obx_sim_options *o, char **out_json);
OBX_API size_t obx_sim_fault_count(void);
OBX_API const char *obx_sim_fault_name(size_t i);
OBX_API obx_err obx_sim_fault_index(const char *name, int *out);

#ifdef __cplusplus
}
#endif
#endif /* OBX_TEST_H */

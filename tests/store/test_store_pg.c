/*
 * test_store_pg.c — the PostgreSQL store against a real server (OBX_TEST_PG_URL, set by
 * scripts/services.sh; the suite fails, never skips, without it).
 *
 * 1. The store conformance suite, one fresh database per test (CREATE DATABASE through a
 *    maintenance connection).
 * 2. PostgreSQL-specific tests: the producer's transaction on its own PGconn (commit together,
 *    roll back together, a SIGKILLed producer leaves neither), frozen-data triggers, concurrent
 *    producers (one event per idempotency key; per-key seq order is commit order), the SQL
 *    function obx.enqueue() against the C path and the digest vectors, psql as another language,
 *    least-privilege roles, NOTIFY waking wait_for_work, connection loss and a lost COMMIT,
 *    serialization/deadlock/lock-timeout mapping, SKIP LOCKED claims by concurrent relays,
 *    exact statistics, batch semantics, schema versions, and a claim+mark throughput figure;
 *    delivery sets through obx.enqueue() against the C path; the schema's own rules (checks,
 *    storage, IDs and digests in SQL, what each role writes); an upgrade refused under a
 *    running relay.
 */
#include "store/test_store_pg.h"

/* ---- main
 * ---------------------------------------------------------------------------------------- */

int main(void) {
    obx_t_pg pg;
    if (obx_t_pg_open(&pg, "test_store_pg", NULL)) return 1;
    snprintf(base_url, sizeof base_url, "%s", pg.url);
    admin = pg.admin;
    int64_t t0 = obx__mono_ms();
    int failed = store_conformance_run("store conformance: postgres", pg_factory, &pg_app);
    int64_t t1 = obx__mono_ms();
    const struct CMUnitTest tests[] = {
        OBX_T_CASE(test_commit_together),
        OBX_T_CASE(test_read_only),
        OBX_T_CASE(test_rollback_together),
        OBX_T_CASE(test_caller_tx_survives),
        OBX_T_CASE(test_enqueue_one_round_trip),
        OBX_T_CASE(test_enqueue_server_fault),
        OBX_T_CASE(test_enqueue_own_one_round_trip),
        OBX_T_CASE(test_newer_schema_refused),
        OBX_T_CASE(test_frozen),
        OBX_T_CASE(test_idempotency_concurrent),
        OBX_T_CASE(test_idempotency_concurrent_sql),
        OBX_T_CASE(test_seq_is_commit_order),
        OBX_T_CASE(test_digest_vectors_sql),
        OBX_T_CASE(test_sql_enqueue_matches_c),
        OBX_T_CASE(test_sql_enqueue_key_matches_c),
        OBX_T_CASE(test_sql_body_matches_c),
        OBX_T_CASE(test_sql_enqueue_delay),
        OBX_T_CASE(test_sql_body_delay),
        OBX_T_CASE(test_enqueue_without_extension),
        OBX_T_CASE(test_extension_versions),
        OBX_T_CASE(test_sql_enqueue_route_changes),
        OBX_T_CASE(test_enqueue_route_schema_remade),
        OBX_T_CASE(test_write_set_schema_remade),
        OBX_T_CASE(test_sql_validation_parity),
        OBX_T_CASE(test_psql_producer),
        OBX_T_CASE(test_roles),
        OBX_T_CASE(test_notify_wakes),
        OBX_T_CASE(test_notify_off),
        OBX_T_CASE(test_wake_lock),
        OBX_T_CASE(test_latch_wake),
        OBX_T_CASE(test_wake_gap),
        OBX_T_CASE(test_wake_c_dropped),
        OBX_T_CASE(test_connection_loss),
        OBX_T_CASE(test_busy_mapping),
        OBX_T_CASE(test_claim_skip_locked),
        OBX_T_CASE(test_dispatch_plans),
        OBX_T_CASE(test_dispatch_round_trips),
        OBX_T_CASE(test_claim_throughput),
        OBX_T_CASE(test_stats_exact),
        OBX_T_CASE(test_batch_semantics),
        OBX_T_CASE(test_write_set),
        OBX_T_CASE(test_held_write_set),
        OBX_T_CASE(test_schema_versions),
        OBX_T_CASE(test_sql_enqueue_delivery_set),
        OBX_T_CASE(test_schema_checks),
        OBX_T_CASE(test_relay_tables_storage),
        OBX_T_CASE(test_sql_ids_digests),
        OBX_T_CASE(test_roles_write_paths),
        OBX_T_CASE(test_init_refuses_under_relay),
    };
    failed += cmocka_run_group_tests_name("postgres store", tests, NULL, NULL);
    /* the engine's fault suite (docs/design.md, "Tests per fault") on this store */
    failed += engine_fault_run("engine faults: postgres", pg_factory);
    /* destination migration, delivery sets, shadow mode and takeover on this store */
    failed +=
        engine_migration_run("migration, delivery sets, shadow, takeover: postgres", pg_factory);
    /* delayed events and their cancellation on this store */
    failed += engine_delay_run("delayed events: postgres", pg_factory);
    int64_t t2 = obx__mono_ms();
    printf("test_store_pg: conformance %lld ms, postgres-specific %lld ms\n", (long long)(t1 - t0),
           (long long)(t2 - t1));
    for (int i = 0; i < db_count && i < 256; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", created[i]);
        admin_exec(sql);
    }
    PQfinish(admin);
    return failed;
}

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
        cmocka_unit_test_setup_teardown(test_commit_together, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rollback_together, setup, teardown),
        cmocka_unit_test_setup_teardown(test_caller_tx_survives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_one_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_server_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_own_one_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frozen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_concurrent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_concurrent_sql, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seq_is_commit_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_digest_vectors_sql, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_matches_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_key_matches_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_body_matches_c, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_body_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_without_extension, setup, teardown),
        cmocka_unit_test_setup_teardown(test_extension_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_route_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_enqueue_route_schema_remade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_set_schema_remade, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_validation_parity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_psql_producer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notify_wakes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notify_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wake_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latch_wake, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connection_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_mapping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_skip_locked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dispatch_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dispatch_round_trips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_throughput, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_write_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_enqueue_delivery_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schema_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relay_tables_storage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sql_ids_digests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roles_write_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_refuses_under_relay, setup, teardown),
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

/*
 * test_engine_sqlite.c — the engine fault suite and the migration suite on the SQLite store,
 * and the engine's batch ID index.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/support.h"
#include "engine/engine_int.h"
#include "engine/delay_suite.h"
#include "engine/fault_suite.h"
#include "engine/migration_suite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *str_at(const void *rows, size_t i) { return ((const char *const *)rows)[i]; }

/* The index answers as a linear scan would: the first position of an ID, -1 for none. */
static void test_id_index(void **state) {
    (void)state;
    const char *rows[] = {"att-c", "att-a", "att-b", "att-a", "att-d", "att-c", "att-a"};
    size_t n = sizeof rows / sizeof rows[0];
    obx__id_index x = {0};
    assert_int_equal(obx__id_index_build(&x, rows, n, str_at), OBX_OK);
    const char *probe[] = {"att-a", "att-b", "att-c", "att-d", "att-", "att-e", "", "att-aa"};
    for (size_t p = 0; p < sizeof probe / sizeof probe[0]; p++) {
        long want = -1;
        for (size_t i = 0; i < n && want < 0; i++)
            if (!strcmp(rows[i], probe[p])) want = (long)i;
        assert_int_equal(obx__id_index_find(&x, probe[p]), want);
    }
    obx__id_index_free(&x);
    assert_int_equal(obx__id_index_build(&x, rows, 0, str_at), OBX_OK);
    assert_int_equal(obx__id_index_find(&x, "att-a"), -1);
    obx__id_index_free(&x);
}

static char dir[64];
static int n;

static obx_err factory(obx__store **out) { return obx_t_sqlite_store(dir, "f", &n, out); }

int main(void) {
    if (obx_t_tmpdir(dir, sizeof dir, "eng")) return 1;
    const struct CMUnitTest internals[] = {cmocka_unit_test(test_id_index)};
    int failed = cmocka_run_group_tests_name("engine internals", internals, NULL, NULL);
    failed += engine_fault_run("engine faults: sqlite", factory);
    failed += engine_migration_run("migration, delivery sets, shadow, takeover: sqlite", factory);
    failed += engine_delay_run("delayed events: sqlite", factory);
    if (obx_t_rmdir(dir)) failed++;
    return failed;
}

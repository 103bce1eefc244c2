/*
 * test_engine_sqlite.c — the engine fault suite and the migration suite on the SQLite store.
 */
#include "engine/fault_suite.h"
#include "engine/migration_suite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[64];
static int n;

static obx_err factory(obx__store **out) {
    char url[128];
    snprintf(url, sizeof url, "sqlite:%s/f%d.db", dir, ++n);
    obx_err e = obx__st_open(url, out);
    if (!e) e = obx_store_init(*out);
    return e;
}

int main(void) {
    strcpy(dir, "/tmp/obx-eng-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    int failed = engine_fault_run("engine faults: sqlite", factory);
    failed += engine_migration_run("migration, delivery sets, shadow, takeover: sqlite", factory);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) failed++;
    return failed;
}

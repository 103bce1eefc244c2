/*
 * test_retention_sqlite.c — the audit and retention suite on the SQLite store (the outbox and
 * each critical consumer's database: separate files).
 */
#include "engine/retention_suite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/engine_fx.h"
#include "support/support.h"

static char dir[64];
static int n;

static obx_err factory(obx__store **out) { return obx_t_sqlite_store(dir, "r", &n, out); }

int main(void) {
    if (obx_t_tmpdir(dir, sizeof dir, "retdb")) return 1;
    int failed = retention_suite_run("retention and audit: sqlite", factory, 1000);
    if (obx_t_rmdir(dir)) failed++;
    return failed;
}

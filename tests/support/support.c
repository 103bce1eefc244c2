/*
 * support.c — temp folders for the test suites (support.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/support.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int obx_t_tmpdir(char *dir, size_t size, const char *name) {
    int n = snprintf(dir, size, "/tmp/obx-%s-XXXXXX", name);
    if (n < 0 || (size_t)n >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(dir) ? 0 : -1;
}

int obx_t_rmdir(const char *dir) {
    char cmd[1100];
    int n = snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (n < 0 || (size_t)n >= sizeof cmd) return -1;
    return system(cmd) == 0 ? 0 : -1;
}

int obx_t_run_in_tmpdir(const char *label, const struct CMUnitTest *tests, size_t n, char *dir,
                        size_t size, const char *name) {
    if (obx_t_tmpdir(dir, size, name)) return 1;
    int failed = _cmocka_run_group_tests(label, tests, n, NULL, NULL);
    if (obx_t_rmdir(dir)) failed++;
    return failed;
}

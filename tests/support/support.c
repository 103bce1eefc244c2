/*
 * support.c — temp folders for the test suites (support.h).
 */
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

/*
 * support.c — temp folders and files for the test suites (support.h).
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
#include <unistd.h>

int obx_t_has_epoch_ms(const char *s) {
    for (size_t i = 0; s && s[i];) {
        size_t n = 0;
        while (s[i + n] >= '0' && s[i + n] <= '9') n++;
        if (n == 13 && s[i] == '1') return 1;
        i += n ? n : 1;
    }
    return 0;
}

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

int obx_t_run_with_tmpfile(const char *label, const struct CMUnitTest *tests, size_t n, char *path,
                           size_t size, const char *name) {
    int len = snprintf(path, size, "/tmp/obx-%s-XXXXXX", name);
    if (len < 0 || (size_t)len >= size) return 1;
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    close(fd);
    int failed = _cmocka_run_group_tests(label, tests, n, NULL, NULL);
    unlink(path);
    return failed;
}

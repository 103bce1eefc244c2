/*
 * support.h — what every C test suite needs, written once (issue 47, item 5): the OK() check,
 * private temp folders, a cmocka group run with its folder, the virtual clock's start. Include
 * it after <cmocka.h>.
 *
 * Contracts:
 *   OBX_T_CASE(f)  a cmocka table row: test f between the suite's own setup() and teardown().
 *   OK(x)      x is an obx_err expression; anything but OBX_OK fails the running test with the
 *              expression, the error's name and obx_errmsg().
 *   a folder made by obx_t_tmpdir is the caller's: obx_t_rmdir removes it and all it holds.
 *   the file obx_t_run_with_tmpfile makes lives as long as the group's run.
 */
#ifndef OBX_TEST_SUPPORT_H
#define OBX_TEST_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#define OK(x)                                                                                      \
    do {                                                                                           \
        obx_err e_ = (x);                                                                          \
        if (e_ != OBX_OK) fail_msg("%s: %s: %s", #x, obx_errname(e_), obx_errmsg());               \
    } while (0)

#define OBX_T_CASE(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

/* 2100-01-01 in ms: a test's virtual clock starts here (backends compare deadlines with
 * max(now, wall), so a virtual "now" ahead of the wall clock rules). */
#define OBX_T_NOW INT64_C(4102444800000)

/* Whether s holds a number of 13 digits from 1 (milliseconds since the epoch, 2001..2286): a
 * text meant for operators names times in ISO-8601 instead (tests/cli/test_cli_times.sh). */
int obx_t_has_epoch_ms(const char *s);

/* Makes a new folder /tmp/obx-NAME-XXXXXX; its path into dir (OUT, size bytes). 0 on success,
 * -1 (errno set) if it cannot. */
int obx_t_tmpdir(char *dir, size_t size, const char *name);

/* Removes dir and everything below it (rm -rf); 0 on success, -1 on failure. */
int obx_t_rmdir(const char *dir);

struct CMUnitTest;

/* Runs the cmocka group tests[n] named label with a new folder (obx_t_tmpdir(dir, size, name),
 * OUT) that its tests use, removed afterwards. Returns the count of failed tests, plus one if the
 * folder could not be removed; 1 if it could not be made (nothing ran). */
int obx_t_run_in_tmpdir(const char *label, const struct CMUnitTest *tests, size_t n, char *dir,
                        size_t size, const char *name);
/* The same for an array tests[] and a char array dir[]. */
#define OBX_T_RUN_IN_TMPDIR(label, tests, dir, name)                                               \
    obx_t_run_in_tmpdir(label, tests, sizeof tests / sizeof tests[0], dir, sizeof dir, name)

/* Runs the cmocka group tests[n] named label with a new empty file /tmp/obx-NAME-XXXXXX (its
 * path into path, size bytes, OUT) that its tests write, removed afterwards. Returns the count of
 * failed tests; 1 if the file could not be made (nothing ran). */
int obx_t_run_with_tmpfile(const char *label, const struct CMUnitTest *tests, size_t n, char *path,
                           size_t size, const char *name);
/* The same for an array tests[] and a char array path[]. */
#define OBX_T_RUN_WITH_TMPFILE(label, tests, path, name)                                           \
    obx_t_run_with_tmpfile(label, tests, sizeof tests / sizeof tests[0], path, sizeof path, name)

#endif

/*
 * getopt_dump.c — LD_PRELOAD'ed by tests/cli/test_cli_help.sh: the first getopt_long() (or
 * getopt()) call of an obx command appends the option table it was given to the file named by
 * OBX_GETOPT_DUMP ("long NAME HAS_ARG" lines, "short OPTSTRING") and ends the process with
 * status 0, before the command does anything. That is how the test learns, from the code as it
 * runs, every option each command accepts.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void dump(const char *shortopts, const struct option *longopts) {
    const char *path = getenv("OBX_GETOPT_DUMP");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (!f) _exit(97);
    fprintf(f, "short %s\n", shortopts ? shortopts : "");
    for (const struct option *o = longopts; o && o->name; o++)
        fprintf(f, "long %s %d\n", o->name, o->has_arg);
    fclose(f);
    _exit(0);
}

int getopt_long(int argc, char *const argv[], const char *shortopts, const struct option *longopts,
                int *longindex) {
    (void)argc, (void)argv, (void)longindex;
    dump(shortopts, longopts);
    return -1;
}

int getopt_long_only(int argc, char *const argv[], const char *shortopts,
                     const struct option *longopts, int *longindex) {
    (void)argc, (void)argv, (void)longindex;
    dump(shortopts, longopts);
    return -1;
}

int getopt(int argc, char *const argv[], const char *shortopts) {
    (void)argc, (void)argv;
    dump(shortopts, NULL);
    return -1;
}

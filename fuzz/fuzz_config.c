/*
 * fuzz_config.c — the relay's YAML configuration file (obx_config_load, libyaml underneath,
 * src/drivers/config.c): written by operators, sometimes generated, always outside input.
 *
 * Properties, per input (the bytes are the file):
 *   1. loaded, or refused with OBX_ECONFIG / OBX_EURL and a printable message — never a crash,
 *      a leak, or a value silently cut at a NUL byte;
 *   2. a loaded configuration dumps (obx_config_dump) and the dump loads again to the same
 *      dump: the JSON dump is itself a valid configuration (JSON is YAML), so an operator can
 *      save `obx config` output and run from it.
 */
#include "fuzz_common.h"

#include <unistd.h>

static char path[64];

static void remove_file(void) { unlink(path); }

static void write_file(const char *p, const void *d, size_t n) {
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (n && fwrite(d, 1, n, f) != n) abort();
    fclose(f);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/obx-fuzz-config-%d.yaml", (int)getpid());
        atexit(remove_file);
    }
    write_file(path, data, size);
    obx_config *c = NULL;
    obx__clear_error();
    obx_err e = obx_config_load(path, &c);
    if (e) {
        PROP(!c, "config returned with an error");
        PROP(e == OBX_ECONFIG || e == OBX_EURL, "unexpected %s: %s", obx_errname(e), obx_errmsg());
        fz_printable("config error", obx_errmsg());
        return 0;
    }
    char *d1 = NULL, *d2 = NULL;
    PROP(obx_config_dump(c, &d1) == OBX_OK, "dump: %s", obx_errmsg());
    obx_config_free(c);
    write_file(path, d1, strlen(d1));
    obx_config *c2 = NULL;
    e = obx_config_load(path, &c2);
    PROP(e == OBX_OK, "the dump does not load: %s\n%s", obx_errmsg(), d1);
    PROP(obx_config_dump(c2, &d2) == OBX_OK, "dump 2");
    PROP(!strcmp(d1, d2), "dump -> load -> dump differs:\n%s\n%s", d1, d2);
    obx_config_free(c2);
    obx_free(d1);
    obx_free(d2);
    return 0;
}

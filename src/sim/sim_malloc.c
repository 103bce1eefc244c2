/*
 * sim_malloc.c — SQLite's memory allocator while `obx sim` runs: small blocks recycled through
 * per-thread free lists.
 *
 * Why: Debian's libsqlite3 is built with SQLITE_OMIT_LOOKASIDE, so every small allocation of a
 * statement step (registers, cursors, record buffers) goes to malloc and free — about 3,000 of
 * each per simulated trace and 15% of the simulator's instructions (callgrind). A simulator
 * worker allocates and frees the same few sizes over and over on one thread; a per-thread free
 * list per 16-byte size class serves them without glibc's bookkeeping. The classes reach
 * 4,608 bytes (a 4 KiB page with its header), so the blocks above 1 KiB, page-cache pages
 * among them (about 190 a trace went to glibc with 1 KiB classes), are recycled too. Larger
 * blocks, and blocks beyond a class's cap, go to malloc/free.
 *
 * Contract: obx__sim_malloc_install() must run before SQLite is initialized (sqlite3_config
 * refuses afterwards, and then nothing changes: SQLite keeps the system allocator). It is
 * process-wide and stays for the process's lifetime, so only `obx sim` installs it, and never
 * in a sanitizer build (ASan must see SQLite's allocations). Each block carries a 16-byte
 * header with its usable size (16-byte alignment kept). A thread's cached blocks are freed
 * when the thread exits.
 */
#include "sim/sim.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define OBX__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OBX__ASAN 1
#endif
#endif

#ifndef OBX__ASAN
enum {
    HDR = 16,         /* header: the block's usable size */
    CLASS_SHIFT = 4,  /* 16-byte size classes ... */
    SMALL_MAX = 4608, /* ... up to this size: a 4 KiB page with its header */
    NCLASS = SMALL_MAX / 16 + 1,
    CACHE_MAX = 4096 /* blocks kept per class and thread */
};

typedef struct blk {
    struct blk *next;
} blk;

typedef struct tcache {
    blk *head[NCLASS];
    unsigned n[NCLASS];
} tcache;

static pthread_key_t key;
static _Thread_local tcache *tc;

static void tc_free(void *p) {
    tcache *c = p;
    for (int i = 0; i < NCLASS; i++)
        while (c->head[i]) {
            blk *b = c->head[i];
            c->head[i] = b->next;
            free((char *)b - HDR);
        }
    free(c);
}

static tcache *tc_get(void) {
    if (!tc && (tc = calloc(1, sizeof *tc))) pthread_setspecific(key, tc);
    return tc;
}

static size_t usable(int n) {
    size_t z = n > 0 ? (size_t)n : 1;
    return z <= SMALL_MAX ? (z + 15) & ~(size_t)15 : z;
}

static void *x_malloc(int n) {
    size_t z = usable(n);
    if (z <= SMALL_MAX) {
        tcache *c = tc_get();
        size_t k = z >> CLASS_SHIFT;
        if (c && c->head[k]) {
            blk *b = c->head[k];
            c->head[k] = b->next;
            c->n[k]--;
            return b;
        }
    }
    char *p = malloc(z + HDR);
    if (!p) return NULL;
    memcpy(p, &z, sizeof z);
    return p + HDR;
}

static int x_size(void *q) {
    size_t z;
    memcpy(&z, (char *)q - HDR, sizeof z);
    return (int)z;
}

static void x_free(void *q) {
    if (!q) return;
    size_t z = (size_t)x_size(q);
    if (z <= SMALL_MAX) {
        tcache *c = tc_get();
        size_t k = z >> CLASS_SHIFT;
        if (c && c->n[k] < CACHE_MAX) {
            blk *b = q;
            b->next = c->head[k];
            c->head[k] = b;
            c->n[k]++;
            return;
        }
    }
    free((char *)q - HDR);
}

static void *x_realloc(void *q, int n) {
    size_t have = (size_t)x_size(q), want = usable(n);
    if (want == have) return q;
    void *r = x_malloc(n);
    if (!r) return NULL;
    memcpy(r, q, have < want ? have : want);
    x_free(q);
    return r;
}

static int x_roundup(int n) { return (int)usable(n); }
static int x_init(void *arg) {
    (void)arg;
    return SQLITE_OK;
}
static void x_shutdown(void *arg) { (void)arg; }

static bool installed;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void install(void) {
    static const sqlite3_mem_methods m = {x_malloc,  x_free, x_realloc,  x_size,
                                          x_roundup, x_init, x_shutdown, NULL};
    installed =
        !pthread_key_create(&key, tc_free) && sqlite3_config(SQLITE_CONFIG_MALLOC, &m) == SQLITE_OK;
}

#endif /* OBX__ASAN */

bool obx__sim_malloc_install(void) {
#ifdef OBX__ASAN
    return false;
#else
    pthread_once(&once, install);
    return installed;
#endif
}

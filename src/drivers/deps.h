/*
 * deps.h — what a daemon waits for (deps.c): the database, its obx schema and the broker, each
 * up or down, with one log line per change and the back-off between tries.
 */
#ifndef OBX_DRIVERS_DEPS_H
#define OBX_DRIVERS_DEPS_H

#include "core/core.h"

#include <pthread.h>

typedef enum { OBX__DEP_DATABASE, OBX__DEP_SCHEMA, OBX__DEP_BROKER, OBX__DEP_N } obx__dep_kind;

/* The dependencies of one daemon (a relay), shared by its threads under mu. A dependency is
 * down while at least one thread fails on it (each thread keeps its own mask of the ones it
 * fails on); the line "X unreachable: why; retrying in N s" is logged when the first thread
 * fails, "X reachable again after N s" when the last one succeeds. */
typedef struct obx__deps {
    pthread_mutex_t mu;
    struct {
        int failing;        /* threads failing on it now */
        int64_t down_since; /* monotonic ms, when failing went from 0 to 1 */
        bool ever_up;       /* some thread reached it once */
        char why[512];      /* the last failure's message */
    } d[OBX__DEP_N];
    int connected, threads; /* threads past their first connection, of how many */
} obx__deps;

void obx__deps_init(obx__deps *ds, int threads);
void obx__deps_destroy(obx__deps *ds);
/* A thread failed on k (why: the message; retry_ms: when it tries again). *mask is the
 * thread's own. The kinds are in the order a thread needs them: those before k in *mask come
 * up (it got through to them). */
void obx__deps_down(obx__deps *ds, unsigned *mask, obx__dep_kind k, const char *why,
                    int64_t retry_ms);
/* The thread's last try of everything in *mask succeeded: each comes up (a line when the last
 * failing thread recovers); *mask is cleared. */
void obx__deps_up(obx__deps *ds, unsigned *mask);
/* A thread reached everything it needs for the first time. */
void obx__deps_connected(obx__deps *ds);
/* true when every thread connected and nothing is down; else why (a one-line reason). */
bool obx__deps_ready(obx__deps *ds, char *why, size_t cap);

/* Whether an error while opening or using a dependency is one to wait out (it is not there
 * yet, or not reachable now) rather than a configuration error that ends the daemon. */
bool obx__dep_waitable(obx_err e);

#endif

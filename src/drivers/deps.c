/*
 * deps.c — a daemon's dependencies (the database, its obx schema, the broker) and the wait for
 * them. Contracts:
 *
 *   1. Something that is not there yet or not reachable now (a database not created yet, a
 *      server down, a broker restarting) is waited for, never a reason to exit: the thread that
 *      needs it tries again after a capped exponential back-off with jitter
 *      (obx_retry_delay_ms; connect.retry_initial_ms, connect.retry_max_ms). Only a
 *      configuration error ends the daemon (obx__dep_waitable says which is which).
 *   2. One log line per change, whatever the number of threads and tries: "database
 *      unreachable: <why>; retrying in 2.0 s" when the first thread fails on it, "database
 *      reachable again after 12.4 s" when the last failing thread gets through.
 *   3. The daemon is ready (/readyz, systemd's READY=1) once every thread connected and nothing
 *      is down.
 */
#include "drivers/deps.h"
#include "drivers/log.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *const dep_name[OBX__DEP_N] = {"database", "schema", "broker"};

void obx__deps_init(obx__deps *ds, int threads) {
    memset(ds, 0, sizeof *ds);
    pthread_mutex_init(&ds->mu, NULL);
    ds->threads = threads;
}

void obx__deps_destroy(obx__deps *ds) { pthread_mutex_destroy(&ds->mu); }

/* "500 ms", "2.0 s" */
static void say_ms(int64_t ms, char *out, size_t cap) {
    if (ms < 1000)
        snprintf(out, cap, "%lld ms", (long long)ms);
    else
        snprintf(out, cap, "%.1f s", (double)ms / 1000.0);
}

void obx__deps_down(obx__deps *ds, unsigned *mask, obx__dep_kind k, const char *why,
                    int64_t retry_ms) {
    char in[32];
    say_ms(retry_ms, in, sizeof in);
    /* the dependencies come in order (database, its schema, the broker): a thread that fails
     * on one got through to those before it */
    unsigned before = *mask & ((1u << k) - 1u);
    if (before) {
        *mask &= ~before;
        obx__deps_up(ds, &before);
    }
    pthread_mutex_lock(&ds->mu);
    obx__strlcpy(ds->d[k].why, why, sizeof ds->d[k].why);
    bool first = false;
    if (!(*mask & (1u << k))) {
        *mask |= 1u << k;
        if (ds->d[k].failing++ == 0) {
            ds->d[k].down_since = obx__mono_ms();
            first = true;
        }
    }
    pthread_mutex_unlock(&ds->mu);
    if (!first) return;
    if (k == OBX__DEP_SCHEMA)
        obx__log(OBX__LOG_WARN, "relay", NULL, NULL, NULL, "database not ready: %s; retrying in %s",
                 why, in);
    else
        obx__log(OBX__LOG_WARN, "relay", NULL, NULL, NULL, "%s unreachable: %s; retrying in %s",
                 dep_name[k], why, in);
}

void obx__deps_up(obx__deps *ds, unsigned *mask) {
    for (int k = 0; k < OBX__DEP_N; k++) {
        if (!(*mask & (1u << k))) continue;
        pthread_mutex_lock(&ds->mu);
        bool last = --ds->d[k].failing == 0;
        bool again = ds->d[k].ever_up;
        ds->d[k].ever_up = true;
        double secs = (double)(obx__mono_ms() - ds->d[k].down_since) / 1000.0;
        pthread_mutex_unlock(&ds->mu);
        if (!last) continue;
        if (k == OBX__DEP_SCHEMA)
            obx__log(OBX__LOG_INFO, "relay", NULL, NULL, NULL,
                     "database ready (obx schema present) after %.1f s", secs);
        else
            obx__log(OBX__LOG_INFO, "relay", NULL, NULL, NULL, "%s reachable %safter %.1f s",
                     dep_name[k], again ? "again " : "", secs);
    }
    *mask = 0;
}

void obx__deps_connected(obx__deps *ds) {
    pthread_mutex_lock(&ds->mu);
    ds->connected++;
    for (int k = 0; k < OBX__DEP_N; k++) ds->d[k].ever_up = true;
    pthread_mutex_unlock(&ds->mu);
}

bool obx__deps_ready(obx__deps *ds, char *why, size_t cap) {
    bool ready = true;
    pthread_mutex_lock(&ds->mu);
    int64_t now = obx__mono_ms();
    for (int k = 0; k < OBX__DEP_N && ready; k++)
        if (ds->d[k].failing) {
            ready = false;
            snprintf(why, cap, "%s %s for %.1f s: %s", dep_name[k],
                     k == OBX__DEP_SCHEMA ? "not ready" : "unreachable",
                     (double)(now - ds->d[k].down_since) / 1000.0, ds->d[k].why);
        }
    if (ready && ds->connected < ds->threads) {
        ready = false;
        snprintf(why, cap, "starting: %d of %d threads connected", ds->connected, ds->threads);
    }
    pthread_mutex_unlock(&ds->mu);
    if (ready && cap) why[0] = '\0';
    return ready;
}

bool obx__dep_waitable(obx_err e) {
    switch (e) {
    case OBX_ECONNLOST: /* no server, authentication refused (for now) */
    case OBX_ENODB:     /* a database not created yet */
    case OBX_EBROKER:   /* broker down, connection refused or timed out */
    case OBX_EIO:
    case OBX_EBUSY:
    case OBX_ESTORE: /* e.g. a SQLite file in a folder not mounted yet */ return true;
    default: return false;
    }
}

/* Per thread: jitter need not be good randomness, only different between the daemons that
 * a shared outage would otherwise send back at the same instant. */
static _Thread_local uint64_t jitter_state;

int64_t obx_retry_delay_ms(int64_t initial_ms, int64_t max_ms, int attempt) {
    if (initial_ms < 1) initial_ms = 1;
    if (max_ms < initial_ms) max_ms = initial_ms;
    int64_t d = initial_ms;
    for (int i = 0; i < attempt && d < max_ms; i++) d *= 2;
    if (d > max_ms) d = max_ms;
    if (!jitter_state) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        jitter_state =
            ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&jitter_state;
        if (!jitter_state) jitter_state = 0x9e3779b97f4a7c15ull;
    }
    jitter_state ^= jitter_state << 13;
    jitter_state ^= jitter_state >> 7;
    jitter_state ^= jitter_state << 17;
    /* "equal jitter": half of the step fixed, the other half drawn */
    int64_t half = d / 2;
    return d - half + (half > 0 ? (int64_t)(jitter_state % (uint64_t)(half + 1)) : 0);
}

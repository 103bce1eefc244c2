/*
 * conformance.h — the store conformance suite every store backend must pass against its real
 * server. A backend's test program supplies a factory that opens a fresh, initialized, empty
 * outbox store, and runs the suite.
 */
#ifndef OBX_TEST_STORE_CONFORMANCE_H
#define OBX_TEST_STORE_CONFORMANCE_H

#include "store/store.h"

/* Opens a fresh, empty, initialized store (schema applied, no routes). */
typedef obx_err (*store_factory)(obx__store **out);

/* How an application reaches the database the factory opened last, for the tests that need a
 * process of its own (the producer killed at each point of its transaction). The suite forks;
 * the child calls connect, wrap and exec only, and dies by SIGKILL. */
typedef struct store_app {
    const char *prefix;                           /* the outbox tables' schema: "obx." or "" */
    void *(*connect)(void);                       /* a new connection; NULL on failure */
    obx_err (*wrap)(void *conn, obx_store **out); /* the public handle on it (obx_store_wrap_*) */
    int (*exec)(void *conn, const char *sql);     /* 0 once sql ran */
    long long (*count)(void *conn, const char *sql); /* the first column of the first row; -1 */
    void (*close)(void *conn);
} store_app;

/* Runs every conformance test; returns the number of failed tests (cmocka). */
int store_conformance_run(const char *label, store_factory factory, const store_app *app);

#endif

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

/* Runs every conformance test; returns the number of failed tests (cmocka). */
int store_conformance_run(const char *label, store_factory factory);

#endif

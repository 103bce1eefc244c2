/*
 * retention_suite.h — the three-set audit and retention (docs/retention.md) on a store backend: the
 * outbox and the critical consumers' databases all come from the backend's factory, the broker
 * is the local log broker, the clock is virtual.
 */
#ifndef OBX_TEST_RETENTION_SUITE_H
#define OBX_TEST_RETENTION_SUITE_H

#include "store/conformance.h"

/* Runs the suite; returns the number of failed tests. With many != 0 the batched-purge test
 * uses that many events (else 1000). */
int retention_suite_run(const char *label, store_factory factory, int many);

#endif

/*
 * fault_suite.h — the engine's fault tests (docs/design.md, "Fault model" and "Tests per
 * fault"), run on every store backend with the local log broker and its fault knobs, under a
 * virtual clock.
 */
#ifndef OBX_TEST_FAULT_SUITE_H
#define OBX_TEST_FAULT_SUITE_H

#include "store/conformance.h"

int engine_fault_run(const char *label, store_factory factory);

#endif

/*
 * delay_suite.h — delayed events (obx_event.not_before_ms) and their cancellation
 * (obx_cancel), on every store backend with the local log broker under a virtual clock
 * (docs/operations.md, "Delayed events").
 */
#ifndef OBX_TEST_DELAY_SUITE_H
#define OBX_TEST_DELAY_SUITE_H

#include "store/conformance.h"

int engine_delay_run(const char *label, store_factory factory);

#endif

/*
 * migration_suite.h — destination migration, delivery sets, shadow mode and scoped takeover at
 * the engine level (docs/migration.md), run on every store backend with the local log broker.
 */
#ifndef OBX_TEST_MIGRATION_SUITE_H
#define OBX_TEST_MIGRATION_SUITE_H

#include "store/conformance.h"

int engine_migration_run(const char *label, store_factory factory);

#endif

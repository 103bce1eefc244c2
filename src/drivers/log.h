/*
 * log.h — logging (log.c): one line per record, text or JSON; never a secret.
 */
#ifndef OBX_DRIVERS_LOG_H
#define OBX_DRIVERS_LOG_H

#include "core/core.h"

typedef enum { OBX__LOG_DEBUG, OBX__LOG_INFO, OBX__LOG_WARN, OBX__LOG_ERROR } obx__log_level;
void obx__log_setup(const char *format, const char *level);
void obx__log(obx__log_level lvl, const char *component, const char *event_id,
              const char *attempt_id, const char *correlation_id, const char *fmt, ...)
    OBX__PRINTF(6, 7);
/* A per-event record of the kind `what` (a literal: "UNKNOWN resolved by lookup"), folded past
 * log.fold_after of its kind per log.fold_interval_ms into one line that counts them (log.c). */
void obx__log_event(const char *what, obx__log_level lvl, const char *component,
                    const char *event_id, const char *attempt_id, const char *correlation_id,
                    const char *fmt, ...) OBX__PRINTF(7, 8);
/* after 0: never fold */
void obx__log_fold_setup(int64_t after, int64_t interval_ms);
/* Writes the line of every window that has ended (all: of every window now, at a stop); called
 * from the daemons' loops, so that the count of a burst that ended is not held back. */
void obx__log_fold_flush(bool all);

#endif

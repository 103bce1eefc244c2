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

#endif

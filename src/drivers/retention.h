/*
 * retention.h — audit and retention in the relay (retention.c): the critical consumers a
 * configuration names and the auditor thread that audits and purges on a schedule.
 */
#ifndef OBX_DRIVERS_RETENTION_H
#define OBX_DRIVERS_RETENTION_H

#include "drivers/relay_view.h"

/* Opens every critical consumer of c (audit.critical_consumers, "ID=URL"), checks its schema and
 * reads its forced watermark. On failure nothing stays open. */
/* flags: OBX_STORE_READ_ONLY where the consumers' databases are only read. */
obx_err obx__criticals_open(const obx_config *c, unsigned flags, obx__critical **out, size_t *n);
void obx__criticals_close(obx__critical *v, size_t n);
/* The relay's auditor thread (audit.interval_ms, retention.interval_ms; both 0: *out = NULL). It
 * stops when v->stopping says so; obx__auditor_stop joins it. v is borrowed and must outlive
 * the thread. */
obx_err obx__auditor_start(const obx__relay_view *v, void **out);
void obx__auditor_stop(void *auditor);
/* Prometheus lines of the last audit and of the relay's purges (nothing when auditor is NULL). */
void obx__auditor_metrics(void *auditor, obx__buf *b);

#endif

/*
 * http.h — the relay's HTTP server (http.c): metrics, health, dashboard, operator API.
 */
#ifndef OBX_DRIVERSTTP_H
#define OBX_DRIVERSTTP_H

#include "drivers/relay_view.h"

/* Starts the relay's HTTP server on listen (ADDR:PORT): /metrics, /healthz, the dashboard and
 * its API. v is borrowed and must outlive the server; *out is stopped with obx__http_stop. */
obx_err obx__http_start(const obx__relay_view *v, const char *listen, void **out);
void obx__http_stop(void *h);

#endif

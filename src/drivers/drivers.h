/*
 * drivers.h — what runs the engine: configuration, logging, the relay daemon (threads, timers,
 * drain), the consumer loop, operations. Drivers own the clock and the threads; the engine owns
 * neither. Each module has its own header; this one includes them all, for tests and the
 * simulator. relay.c assembles the daemon: it starts the auditor (retention.h) and the HTTP
 * server (http.h, with metrics.h and series.h) and hands them a typed view of itself
 * (relay_view.h).
 */
#ifndef OBX_DRIVERS_H
#define OBX_DRIVERS_H

#include "drivers/config.h"
#include "drivers/deps.h"
#include "drivers/hist.h"
#include "drivers/http.h"
#include "drivers/log.h"
#include "drivers/metrics.h"
#include "drivers/observe.h"
#include "drivers/otel.h"
#include "drivers/relay_view.h"
#include "drivers/retention.h"
#include "drivers/series.h"

#endif

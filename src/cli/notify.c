/*
 * notify.c — `obx relay` and `obx consume` tell their service manager how they are: READY=1
 * once they serve, STATUS= a one-line summary when it changes, WATCHDOG=1 from the main loop
 * while the unit sets WatchdogSec=, STOPPING=1 when a stop begins (sd_notify(3), libsystemd).
 * Without NOTIFY_SOCKET (not under systemd) each call does nothing; built without libsystemd
 * (OBX_WITH_SYSTEMD=OFF) neither do they.
 */
#include "cli.h"

#include <stdarg.h>
#include <string.h>
#include <time.h>
#ifdef OBX_WITH_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static long long mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void send_state(const char *state) {
#ifdef OBX_WITH_SYSTEMD
    sd_notify(0, state);
#else
    (void)state;
#endif
}

void cli_notify_init(cli_notify *n) {
    memset(n, 0, sizeof *n);
#ifdef OBX_WITH_SYSTEMD
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0)
        n->watchdog_ms = (long long)(usec / 1000) / 2; /* twice per WatchdogSec, as advised */
    if (n->watchdog_ms < 1 && usec > 0) n->watchdog_ms = 1;
#endif
}

void cli_notify_watchdog(cli_notify *n) {
    long long now = mono_ms();
    if (n->watchdog_ms && now - n->watchdog_at >= n->watchdog_ms) {
        send_state("WATCHDOG=1");
        n->watchdog_at = now;
    }
}

void cli_notify_tick(cli_notify *n, bool ready, const char *status) {
    long long now = mono_ms();
    char msg[700];
    if (ready && !n->ready_sent) {
        snprintf(msg, sizeof msg, "READY=1\nSTATUS=%.600s", status);
        send_state(msg);
        n->ready_sent = true;
        snprintf(n->status, sizeof n->status, "%s", status);
    } else if (strcmp(status, n->status) && now - n->status_at >= 1000) {
        snprintf(msg, sizeof msg, "STATUS=%.600s", status);
        send_state(msg);
        snprintf(n->status, sizeof n->status, "%s", status);
        n->status_at = now;
    }
    cli_notify_watchdog(n);
}

void cli_notify_stopping(cli_notify *n, const char *status) {
    char msg[700];
    snprintf(msg, sizeof msg, "STOPPING=1\nSTATUS=%.600s", status);
    send_state(msg);
    snprintf(n->status, sizeof n->status, "%s", status);
}

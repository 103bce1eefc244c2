/*
 * http.c — the relay's HTTP server (libmicrohttpd), bound to 127.0.0.1 unless configured
 * otherwise: /healthz (process alive), /readyz (database and broker reachable, schema current),
 * /metrics (Prometheus text: events by state, oldest PENDING age, UNKNOWN count and age,
 * receipts by kind, relay counters, the last audit's findings by kind).
 *
 * Requests are served on libmicrohttpd's internal thread with one store connection of its own,
 * guarded by a mutex; nothing here touches the dispatchers' connections.
 */
#include "drivers/drivers.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void obx__relay_totals(obx_relay *r, obx__engine_stats *t);
void *obx__relay_auditor(obx_relay *r);
int obx__relay_shadow(obx_relay *r, obx__shadow_counts *out);
const obx_config *obx__relay_config(obx_relay *r);
const char *obx__relay_id(obx_relay *r);

typedef struct http {
    struct MHD_Daemon *d;
    obx_relay *r;
    pthread_mutex_t mu;
    obx__store *s; /* lazily opened, reopened after an error */
} http;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type,
                             const char *body, size_t len) {
    struct MHD_Response *rs =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
    if (!rs) return MHD_NO;
    MHD_add_response_header(rs, "Content-Type", type);
    MHD_add_response_header(rs, "Cache-Control", "no-store");
    MHD_add_response_header(rs, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c, code, rs);
    MHD_destroy_response(rs);
    return ret;
}

static obx_err store_of(http *h, obx__store **s) {
    if (!h->s) {
        obx_err e = obx__st_open(obx__relay_config(h->r)->db, &h->s);
        if (e) {
            h->s = NULL;
            return e;
        }
    }
    *s = h->s;
    return OBX_OK;
}

static void store_drop(http *h) {
    obx__st_close(h->s);
    h->s = NULL;
}

static void metrics(http *h, obx__buf *b) {
    obx__store *s;
    obx__store_stats st;
    int64_t now = obx__wall_ms();
    obx_err e = store_of(h, &s);
    if (!e) e = s->m->stats(s, &st);
    obx__buf_printf(b,
                    "# HELP obx_up 1 when the outbox database answered this scrape\n"
                    "# TYPE obx_up gauge\nobx_up %d\n",
                    e ? 0 : 1);
    if (e) {
        store_drop(h);
    } else {
        obx__buf_puts(b, "# HELP obx_events Events by state\n# TYPE obx_events gauge\n");
        for (int i = 1; i < OBX__ST_COUNT; i++)
            obx__buf_printf(b, "obx_events{state=\"%s\"} %lld\n", obx__state_name((obx__state)i),
                            (long long)st.by_state[i]);
        obx__buf_printf(b,
                        "# HELP obx_oldest_pending_age_seconds Age of the oldest PENDING event\n"
                        "# TYPE obx_oldest_pending_age_seconds gauge\n"
                        "obx_oldest_pending_age_seconds %.3f\n",
                        st.oldest_pending_committed_at
                            ? (double)(now - st.oldest_pending_committed_at) / 1000.0
                            : 0.0);
        obx__buf_printf(
            b,
            "# HELP obx_unknown_events Events whose publish outcome is unknown\n"
            "# TYPE obx_unknown_events gauge\nobx_unknown_events %lld\n"
            "# HELP obx_unknown_oldest_age_seconds Age of the oldest UNKNOWN episode\n"
            "# TYPE obx_unknown_oldest_age_seconds gauge\n"
            "obx_unknown_oldest_age_seconds %.3f\n"
            "# HELP obx_unknown_attempts Attempts with an unknown outcome\n"
            "# TYPE obx_unknown_attempts gauge\nobx_unknown_attempts %lld\n",
            (long long)(st.by_state[OBX__ST_DISPATCH_UNKNOWN] + st.by_state[OBX__ST_RECONCILING] +
                        st.by_state[OBX__ST_RETRY_CLAIMED]),
            st.oldest_unknown_since ? (double)(now - st.oldest_unknown_since) / 1000.0 : 0.0,
            (long long)st.attempts_unknown);
        obx__buf_printf(b,
                        "# HELP obx_receipts Receipts by kind\n# TYPE obx_receipts gauge\n"
                        "obx_receipts{kind=\"primary\"} %lld\nobx_receipts{kind=\"duplicate\"} "
                        "%lld\nobx_receipts{kind=\"quarantined\"} %lld\n"
                        "obx_receipts{kind=\"migration\"} %lld\n",
                        (long long)st.receipts_primary, (long long)st.receipts_duplicate,
                        (long long)st.receipts_quarantined, (long long)st.receipts_migration);
    }
    obx__engine_stats t;
    obx__relay_totals(h->r, &t);
    obx__buf_puts(b, "# HELP obx_relay_total Relay counters since start\n"
                     "# TYPE obx_relay_total counter\n");
#define C(name) obx__buf_printf(b, "obx_relay_total{what=\"" #name "\"} %lld\n", (long long)t.name)
    C(claimed);
    C(sent);
    C(stale_refused);
    C(accepted);
    C(duplicates);
    C(quarantined);
    C(rejected);
    C(not_sent);
    C(unknown);
    C(swept);
    C(retries);
    C(parked);
    C(reconciled_found);
    C(reconciled_not_found);
    C(reconciled_cannot_tell);
    C(store_errors);
    C(broker_errors);
#undef C
    obx__auditor_metrics(obx__relay_auditor(h->r), b); /* obx_audit_findings{kind=...} */
    obx__shadow_counts sc;
    if (obx__relay_shadow(h->r, &sc)) /* shadow mode: the last comparison's differences */
        obx__buf_printf(
            b,
            "# HELP obx_shadow_differences Differences found by the last shadow comparison\n"
            "# TYPE obx_shadow_differences gauge\n"
            "obx_shadow_differences{kind=\"missing\"} %lld\n"
            "obx_shadow_differences{kind=\"destination\"} %lld\n"
            "obx_shadow_differences{kind=\"partition\"} %lld\n"
            "obx_shadow_differences{kind=\"payload\"} %lld\n"
            "obx_shadow_differences{kind=\"unknown_on_broker\"} %lld\n"
            "# TYPE obx_shadow_compared gauge\nobx_shadow_compared %lld\n"
            "# TYPE obx_shadow_matched gauge\nobx_shadow_matched %lld\n"
            "# TYPE obx_shadow_rounds counter\nobx_shadow_rounds %lld\n",
            (long long)sc.missing, (long long)sc.destination, (long long)sc.partition,
            (long long)sc.payload, (long long)sc.unknown, (long long)sc.compared,
            (long long)sc.matched, (long long)sc.rounds);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    http *h = cls;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n", 19);
    if (!strcmp(url, "/healthz")) return reply(c, MHD_HTTP_OK, "text/plain", "ok\n", 3);
    pthread_mutex_lock(&h->mu);
    enum MHD_Result ret;
    if (!strcmp(url, "/readyz")) {
        obx__store *s;
        int found = 0;
        obx_err e = store_of(h, &s);
        if (!e) e = s->m->schema_version(s, &found);
        if (!e && found != OBX__SCHEMA_VERSION)
            e = obx__fail(OBX_ESCHEMA, "schema version %d, need %d", found, OBX__SCHEMA_VERSION);
        obx__broker *b = NULL;
        if (!e) {
            const obx_config *cfg = obx__relay_config(h->r);
            e = obx__br_open(cfg->broker, (const char *const *)cfg->broker_props.v,
                             cfg->broker_props.n, &b);
            char cl[OBX_NAME_MAX + 1];
            if (!e) e = obx__br_cluster_id(b, cl, sizeof cl);
            obx__br_close(b);
        }
        char body[1200];
        int n = snprintf(body, sizeof body, e ? "not ready: %s\n" : "ready\n", obx_errmsg());
        if (e) store_drop(h);
        ret =
            reply(c, e ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK, "text/plain", body, (size_t)n);
    } else if (!strcmp(url, "/metrics")) {
        obx__buf b = {0};
        metrics(h, &b);
        ret = b.oom
                  ? reply(c, 500, "text/plain", "out of memory\n", 14)
                  : reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4", (const char *)b.data, b.len);
        obx__buf_free(&b);
    } else
        ret = reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "not found\n", 10);
    pthread_mutex_unlock(&h->mu);
    return ret;
}

obx_err obx__http_start(obx_relay *r, const char *listen, void **out) {
    char host[128];
    obx__strlcpy(host, listen, sizeof host);
    char *colon = strrchr(host, ':');
    if (!colon) return obx__fail(OBX_ECONFIG, "http.listen: '%s' is not ADDR:PORT", listen);
    *colon = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return obx__fail(OBX_ECONFIG, "http.listen: port in '%s' is not 0..65535", listen);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host[0] ? host : "127.0.0.1", &sa.sin_addr) != 1)
        return obx__fail(OBX_ECONFIG, "http.listen: '%s' is not an IPv4 address", host);
    http *h = calloc(1, sizeof *h);
    if (!h) return obx__fail(OBX_ENOMEM, "http: out of memory");
    h->r = r;
    pthread_mutex_init(&h->mu, NULL);
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
                            NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, &sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return obx__fail(OBX_EIO, "http: cannot listen on %s (in use?)", listen);
    }
    obx__log(OBX__LOG_INFO, "http", NULL, NULL, NULL, "listening on http://%s", listen);
    *out = h;
    return OBX_OK;
}

void obx__http_stop(void *p) {
    http *h = p;
    if (!h) return;
    MHD_stop_daemon(h->d);
    store_drop(h);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

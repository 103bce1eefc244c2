/*
 * http.c — the relay's HTTP server (libmicrohttpd), bound to 127.0.0.1 unless configured
 * otherwise (http.listen). It owns the routes, authentication of mutating requests, and the
 * connections it reads with:
 *
 *   GET  /healthz            the process is alive (no database access)
 *   GET  /readyz             every relay thread reached the database (with the current
 *                            schema) and the broker, none fails on them now, relay not
 *                            stopping, and the probe thread's last look (schema version, a
 *                            fresh broker connection) was good: answered from that state,
 *                            no store or broker call in the request
 *   GET  /metrics            Prometheus text (metrics.c)
 *   GET  /  /app.js  /style.css   the dashboard: static files embedded in the binary
 *   GET  /api/status         obx_status's document plus this relay's counters
 *   GET  /api/trace?q=X      the trace of event ID X and of correlation ID X
 *   GET  /api/series         the charts' ring of samples (series.c), taken on a thread of
 *                            this server's every http.series_interval_ms
 *   GET  /vendor/uplot.js /vendor/uplot.css   uPlot, vendored (src/drivers/dashboard/vendor)
 *   POST /api/requeue        {"event_id": ...}              PARKED -> PENDING
 *   POST /api/redrive        {"consumer": ..., "event_id": ...}  a consumer's poison message
 *   POST /api/resolve        {"event_id" | "event_ids": [...] | "held": true, "type",
 * "older_than_ms", "action": "retry" | "accept", evidence ("offset", "payload_digest", "partition",
 * "topic", "attempt_id" | "consumer"), "who", "reason"}   UNKNOWN outcomes ended by an operator
 * (obx resolve)
 *
 * Mutating requests need "Authorization: Bearer <token>", the token read from http.token_file
 * at start (compared in constant time, never logged); without a token file they are refused.
 * With a loopback listen address, requests must name a loopback Host, compared whole: an
 * address in 127.0.0.0/8, [::1], localhost, or a name in http.allowed_hosts (a page elsewhere
 * that rebinds its DNS name to 127.0.0.1 cannot read the API). Event data is hostile input: the
 * API returns it as JSON strings only, and the page renders it as text (never as HTML) under a
 * Content-Security-Policy that allows no inline script.
 *
 * The listener: libmicrohttpd's internal thread on epoll (poll where epoll is missing), so no
 * FD_SETSIZE bound; at most http.max_connections connections, http.max_connections_per_ip
 * from one address; an idle connection is closed after 10 s. That thread never waits for a
 * store or a broker: /healthz, /readyz and the dashboard's static files are answered on it,
 * from memory; a request that needs the store (/metrics, /api/...) is suspended and handed to
 * the server's worker thread (work_main), which answers requests one at a time with
 * connections of its own (outbox and critical consumers), under a mutex, and resumes it.
 * Nothing here touches the dispatchers' connections.
 *
 * A token file that group or others may read is refused: the write actions stay off, and the
 * dashboard and /api/status say why.
 */
#include "drivers/http.h"
#include "drivers/log.h"
#include "drivers/metrics.h"
#include "drivers/series.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

extern const char obx__dash_index_html[];
extern const char obx__dash_app_js[];
extern const char obx__dash_style_css[];
extern const char obx__dash_uplot_js[];
extern const char obx__dash_uplot_css[];

enum { BODY_MAX = 8192, TOKEN_MIN = 16, QUEUE_MAX = 256 };

typedef struct req req;

typedef struct http {
    struct MHD_Daemon *d;
    const obx__relay_view *v; /* the relay's (relay_view.h), outlives the server */
    pthread_mutex_t mu;
    obx__store *s; /* lazily opened, reopened after an error */
    obx__consumer_set cs;
    obx__metrics *m;
    char token_digest[OBX_DIGEST_LEN + 1]; /* SHA-256 of the token; "" = no token configured */
    bool loopback;
    obx__series *series; /* under mu, like the connections a sample reads */
    pthread_t series_th;
    bool series_started;
    atomic_int series_stop;
    /* /readyz's own look, on a thread of its own while someone asks (probe_main) */
    pthread_t probe_th;
    bool probe_started;
    _Atomic int64_t probe_asked; /* monotonic ms of the last /readyz */
    pthread_mutex_t probe_mu;
    bool probe_bad;       /* under probe_mu: the last look failed ... */
    char probe_why[1024]; /* ... and why */
    char writes_off[700]; /* why the write actions are off despite a token file, or "" */
    /* requests that need the store, suspended until the worker answered them (work_main) */
    pthread_t work_th;
    bool work_started;
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    req *q_head, *q_tail; /* under q_mu */
    int q_len;
    bool q_stop;
} http;

struct req {
    obx__buf body;
    bool too_big;
    /* handed to the worker: 0 not, 1 queued (the connection suspended), 2 answered */
    int phase;
    struct MHD_Connection *c;
    char url[512], method[16];
    struct MHD_Response *rs; /* the worker's answer (NULL: close the connection) */
    unsigned code;
    req *next;
};

/* On the worker thread while it answers a request: reply() keeps the response here instead of
 * queueing it on a suspended connection (handle() queues it once resumed). */
static _Thread_local req *capture;

/* ---- responses --------------------------------------------------------------------------------
 */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type,
                             const char *body, size_t len) {
    struct MHD_Response *rs =
        MHD_create_response_from_buffer(len, (void *)(uintptr_t)body, MHD_RESPMEM_MUST_COPY);
    if (!rs) return MHD_NO;
    MHD_add_response_header(rs, "Content-Type", type);
    MHD_add_response_header(rs, "Cache-Control", "no-store");
    MHD_add_response_header(rs, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(rs, "X-Frame-Options", "DENY");
    MHD_add_response_header(rs, "Referrer-Policy", "no-referrer");
    /* no inline script or style, no foreign origin: even markup that slipped past the page's
     * text-only rendering could not run */
    MHD_add_response_header(rs, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; "
                            "connect-src 'self'; img-src 'self'; base-uri 'none'; "
                            "form-action 'none'; frame-ancestors 'none'");
    if (code == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(rs, "WWW-Authenticate", "Bearer realm=\"obx\"");
    if (capture) {
        capture->rs = rs;
        capture->code = code;
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(c, code, rs);
    MHD_destroy_response(rs);
    return ret;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned code, const char *s) {
    return reply(c, code, "text/plain; charset=utf-8", s, strlen(s));
}

/* Takes the reference. */
static enum MHD_Result json(struct MHD_Connection *c, unsigned code, json_t *j) {
    char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!txt) return text(c, 500, "out of memory\n");
    enum MHD_Result ret = reply(c, code, "application/json; charset=utf-8", txt, strlen(txt));
    free(txt);
    return ret;
}

static enum MHD_Result json_error(struct MHD_Connection *c, unsigned code, obx_err e,
                                  const char *msg) {
    return json(c, code, json_pack("{s:s,s:s}", "error", msg, "code", obx_errname(e)));
}

static unsigned status_of(obx_err e) {
    switch (e) {
    case OBX_EINVAL: return MHD_HTTP_BAD_REQUEST;
    case OBX_ENOTFOUND: return MHD_HTTP_NOT_FOUND;
    case OBX_EDENIED: return MHD_HTTP_FORBIDDEN;
    case OBX_EREFUSED:
    case OBX_ECONFLICT: return MHD_HTTP_CONFLICT;
    default: return MHD_HTTP_SERVICE_UNAVAILABLE;
    }
}

/* ---- connections ------------------------------------------------------------------------------
 */

static obx_err store_of(http *h, obx__store **s) {
    if (!h->s) {
        obx_err e = obx__st_open(h->v->cfg->db, &h->s);
        if (e) {
            h->s = NULL;
            return e;
        }
        obx_store_set_otel(h->s, h->v->otel); /* POST /api/resolve's spans */
    }
    *s = h->s;
    return OBX_OK;
}

static void store_drop(http *h) {
    obx__st_close(h->s);
    h->s = NULL;
}

/* ---- authentication ---------------------------------------------------------------------------
 */

static obx_err read_token(http *h, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return obx__fail(OBX_ECONFIG, "http.token_file: %s: %s", path, strerror(errno));
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    struct stat sb;
    bool loose = fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077);
    fclose(f);
    buf[n] = '\0';
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
    obx_err e = OBX_OK;
    if (n < TOKEN_MIN)
        e = obx__fail(OBX_ECONFIG, "http.token_file: %s: the token has %zu bytes, at least %d",
                      path, n, TOKEN_MIN);
    if (!e) e = obx_sha256_digest(buf, n, h->token_digest);
    memset(buf, 0, sizeof buf);
    if (!e && loose) {
        /* a token others may read is no secret: the write actions stay off */
        h->token_digest[0] = '\0';
        snprintf(h->writes_off, sizeof h->writes_off,
                 "http.token_file %s is readable by group or others: write actions are off "
                 "(chmod 600 it and restart the relay)",
                 path);
        obx__log(OBX__LOG_WARN, "http", NULL, NULL, NULL, "%s", h->writes_off);
    }
    return e;
}

/* Constant time in the token: both sides are hashed first, so neither its bytes nor its length
 * shape the comparison's timing. */
static bool authorized(http *h, struct MHD_Connection *c) {
    if (!h->token_digest[0]) return false;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!a || strncmp(a, "Bearer ", 7)) return false;
    char d[OBX_DIGEST_LEN + 1];
    if (obx_sha256_digest(a + 7, strlen(a + 7), d)) return false;
    unsigned diff = 0;
    for (size_t i = 0; i < OBX_DIGEST_LEN; i++)
        diff |= (unsigned)(unsigned char)(d[i] ^ h->token_digest[i]);
    return diff == 0;
}

/* With a loopback listen address only these Host names are served (DNS rebinding): an IPv4
 * address in 127.0.0.0/8 written as one, [::1], localhost, or a name in http.allowed_hosts, each
 * compared whole (case aside), with an optional :PORT; never by prefix. */
static bool host_ok(http *h, struct MHD_Connection *c) {
    if (!h->loopback) return true;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host) return false;
    char name[256];
    if (obx__strlcpy(name, host, sizeof name) >= sizeof name) return false;
    char *port = name[0] == '[' ? strchr(name, ']') : strchr(name, ':');
    if (port && name[0] == '[') port++;
    if (port && *port) {
        if (*port != ':' || !port[1] || strspn(port + 1, "0123456789") != strlen(port + 1))
            return false;
        *port = '\0';
    }
    struct in_addr a;
    if (inet_pton(AF_INET, name, &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    if (!strcasecmp(name, "localhost") || !strcmp(name, "[::1]")) return true;
    const obx__strv *allowed = &h->v->cfg->http_allowed_hosts;
    for (size_t i = 0; i < allowed->n; i++)
        if (*name && !strcasecmp(name, allowed->v[i])) return true;
    return false;
}

/* ---- routes ------------------------------------------------------------------------------------
 */

/* /readyz answers at once, from two things the server already knows: the relay's threads'
 * state (relay_view.h: every thread reached the database with its schema and the broker, none
 * fails on them now) and the last look of the probe thread below. No store or broker call
 * happens in the request. */
static enum MHD_Result readyz(http *h, struct MHD_Connection *c) {
    char why[1024], body[1100];
    atomic_store(&h->probe_asked, obx__mono_ms());
    bool ok = h->v->ready(h->v->relay, why, sizeof why);
    if (ok) {
        pthread_mutex_lock(&h->probe_mu);
        if (h->probe_bad) {
            ok = false;
            obx__strlcpy(why, h->probe_why, sizeof why);
        }
        pthread_mutex_unlock(&h->probe_mu);
    }
    snprintf(body, sizeof body, ok ? "ready\n" : "not ready: %s\n", why);
    return text(c, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body);
}

/* One look at what a thread reconnecting now would get: the outbox database with the schema
 * this relay needs, and a fresh broker connection (OBX_OK or why not, in obx_errmsg()). */
static obx_err probe_once(http *h, obx__store **s) {
    const obx_config *cfg = h->v->cfg;
    obx_err e = *s ? OBX_OK : obx__st_open(cfg->db, s);
    int found = 0;
    if (!e) e = obx__st_schema_version(*s, &found);
    if (!e && found != OBX__SCHEMA_VERSION)
        return obx__fail(OBX_ESCHEMA, "schema version %d, need %d", found, OBX__SCHEMA_VERSION);
    if (e) {
        obx__st_close(*s);
        *s = NULL;
        return e;
    }
    obx__broker *b = NULL;
    e = obx__br_open(cfg->broker, (const char *const *)cfg->broker_props.v, cfg->broker_props.n,
                     &b);
    char cl[OBX_NAME_MAX + 1];
    if (!e) e = obx__br_cluster_id(b, cl, sizeof cl);
    obx__br_close(b);
    return e;
}

/* The probe: after a /readyz, one look on its own connections (at most one per PROBE_MS, so
 * never more broker connections than before, when each /readyz opened one), its result kept for
 * the next /readyz (a database whose schema changed under the relay, a broker that stopped
 * taking new connections). Nothing when nobody asks. */
#define PROBE_MS 1000
static void *probe_main(void *arg) {
    http *h = arg;
    obx__store *s = NULL;
    int64_t done_at = 0; /* monotonic ms of the last look */
    while (!atomic_load(&h->series_stop)) {
        int64_t asked = atomic_load(&h->probe_asked), now = obx__mono_ms();
        if (asked > done_at && now - done_at >= PROBE_MS) {
            done_at = now;
            obx_err e = probe_once(h, &s);
            pthread_mutex_lock(&h->probe_mu);
            h->probe_bad = e != OBX_OK;
            if (e) obx__strlcpy(h->probe_why, obx_errmsg(), sizeof h->probe_why);
            pthread_mutex_unlock(&h->probe_mu);
        }
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    obx__st_close(s);
    return NULL;
}

static enum MHD_Result metrics(http *h, struct MHD_Connection *c) {
    obx__store *s = NULL;
    if (store_of(h, &s)) s = NULL;
    obx__buf b = {0};
    if (obx__metrics_render(h->m, h->v, s, &b) && s) store_drop(h);
    enum MHD_Result ret = b.oom ? text(c, 500, "out of memory\n")
                                : reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                                        (const char *)b.data, b.len);
    obx__buf_free(&b);
    return ret;
}

static enum MHD_Result api_status(http *h, struct MHD_Connection *c) {
    obx__store *s = NULL;
    obx__store_stats st;
    int64_t age = 0;
    obx_err e = store_of(h, &s);
    if (!e) e = obx__stats_get(obx__metrics_stats(h->m), s, &st, &age);
    json_t *doc = NULL;
    /* ages and heartbeats on the database server's clock, as the relay keeps it (obx__ref_ms) */
    if (!e) e = obx__status_json(s, &h->cs, &st, 50, obx__ref_ms(), &doc);
    if (e) {
        store_drop(h);
        return json_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, e, obx_errmsg());
    }
    obx__engine_stats t;
    h->v->totals(h->v->relay, &t);
    json_object_set_new(doc, "stats_age_ms", json_integer(age));
    json_object_set_new(doc, "write_actions",
                        json_string(h->token_digest[0] ? "on"
                                    : h->writes_off[0] ? h->writes_off
                                                       : "off: no http.token_file"));
    json_object_set_new(
        doc, "relay",
        json_pack("{s:s,s:I,s:b,s:b,s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}}", "id", h->v->id,
                  "started_at_ms", (json_int_t)h->v->started_at, "stopping",
                  h->v->stopping(h->v->relay), "token_configured", h->token_digest[0] != '\0',
                  "counters", "published", (json_int_t)t.accepted, "duplicates",
                  (json_int_t)t.duplicates, "quarantined", (json_int_t)t.quarantined, "unknown",
                  (json_int_t)(t.unknown + t.swept), "retries", (json_int_t)t.retries, "rejected",
                  (json_int_t)t.rejected, "parked", (json_int_t)t.parked, "store_errors",
                  (json_int_t)t.store_errors));
    return json(c, MHD_HTTP_OK, doc);
}

static enum MHD_Result api_series(http *h, struct MHD_Connection *c) {
    json_t *doc = NULL;
    obx_err e = obx__series_json(h->series, &h->cs, &doc);
    if (e) return json_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, e, obx_errmsg());
    return json(c, MHD_HTTP_OK, doc);
}

/* The sampler: one sample now, then one every http.series_interval_ms on a fixed schedule
 * (a slow sample does not shift the ones after it), until the server stops. */
static void *series_main(void *arg) {
    http *h = arg;
    int64_t every = h->v->cfg->series_interval_ms, next = obx__mono_ms();
    while (!atomic_load(&h->series_stop)) {
        pthread_mutex_lock(&h->mu);
        obx__store *s = NULL;
        if (store_of(h, &s)) s = NULL;
        obx__series_src src = {.v = h->v, .s = s, .stats = obx__metrics_stats(h->m), .cs = &h->cs};
        if (obx__series_sample(h->series, &src, obx__wall_ms()) && s) store_drop(h);
        pthread_mutex_unlock(&h->mu);
        next += every;
        int64_t now;
        while (!atomic_load(&h->series_stop) && (now = obx__mono_ms()) < next) {
            int64_t ms = next - now < 50 ? next - now : 50;
            struct timespec ts = {0, (long)ms * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (obx__mono_ms() > next + every) next = obx__mono_ms(); /* fell behind: no burst */
    }
    return NULL;
}

static enum MHD_Result api_trace(http *h, struct MHD_Connection *c) {
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q");
    if (!q || !*q)
        return json_error(c, MHD_HTTP_BAD_REQUEST, OBX_EINVAL,
                          "q: an event ID or a correlation ID is required");
    obx__store *s = NULL;
    obx_err e = store_of(h, &s);
    json_t *doc = NULL;
    /* one box for both: q is traced as an event ID when it is one, and as a correlation ID */
    const char *eid = obx_event_id_check(q) == OBX_OK ? q : NULL;
    const char *corr = obx__check_field("q", q, 1, OBX_TEXT_MAX, OBX__CS_TEXT) ? NULL : q;
    if (!e && !eid && !corr)
        return json_error(c, MHD_HTTP_BAD_REQUEST, OBX_EINVAL,
                          "q: neither an event ID nor a valid correlation ID");
    if (!e) e = obx__trace_json(s, &h->cs, eid, corr, 50, &doc);
    if (e) {
        if (e != OBX_EINVAL) store_drop(h);
        return json_error(c, status_of(e), e, obx_errmsg());
    }
    return json(c, MHD_HTTP_OK, doc);
}

/* Parses the request body as a JSON object of string fields. */
static json_t *body_json(req *rq, const char **err) {
    if (rq->too_big) {
        *err = "request body over 8 KiB";
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(rq->body.data ? (const char *)rq->body.data : "", rq->body.len, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        *err = "request body is not a JSON object";
        return NULL;
    }
    return j;
}

static enum MHD_Result api_requeue(http *h, struct MHD_Connection *c, req *rq) {
    const char *err = NULL;
    json_t *j = body_json(rq, &err);
    if (!j) return json_error(c, MHD_HTTP_BAD_REQUEST, OBX_EINVAL, err);
    const char *id = json_string_value(json_object_get(j, "event_id"));
    obx__store *s = NULL;
    obx_err e = id ? store_of(h, &s) : obx__fail(OBX_EINVAL, "event_id: missing");
    char who[OBX__OWNER_MAX + 1];
    snprintf(who, sizeof who, "operator:dashboard@%.200s", h->v->id);
    if (!e) e = obx__requeue(s, id, who, obx__st_now_ms(s)); /* the server's clock, as relays */
    enum MHD_Result ret;
    if (e) {
        if (e == OBX_ESTORE || e == OBX_EIO || e == OBX_ECONNLOST) store_drop(h);
        ret = json_error(c, status_of(e), e, obx_errmsg());
    } else {
        obx__log(OBX__LOG_INFO, "http", id, NULL, NULL,
                 "requeued from the dashboard: PARKED -> PENDING");
        ret = json(c, MHD_HTTP_OK, json_pack("{s:s,s:s}", "event_id", id, "state", "PENDING"));
    }
    json_decref(j);
    return ret;
}

/* What a resolve request lacks or gives in the wrong type (NULL: nothing). A field is never
 * defaulted: accepting evidence found at the broker names its offset and payload digest. */
static const char *resolve_missing(json_t *j) {
    json_t *off = json_object_get(j, "offset"), *part = json_object_get(j, "partition");
    json_t *age = json_object_get(j, "older_than_ms");
    const char *action = json_string_value(json_object_get(j, "action"));
    if (!action) return "action: missing (retry or accept)";
    if ((off && !json_is_integer(off)) || (part && !json_is_integer(part)) ||
        (age && !json_is_integer(age)))
        return "offset, partition and older_than_ms are integers";
    if (strcmp(action, "accept") || json_object_get(j, "consumer")) return NULL;
    if (!off) return "offset: missing (accepting evidence found at the broker names the offset)";
    if (!json_string_value(json_object_get(j, "payload_digest")))
        return "payload_digest: missing (the digest the message at the broker carries)";
    return NULL;
}

/* POST /api/resolve: obx_resolve's request as JSON; the reply is its document. "who" names the
 * operator (recorded as operator:<who>@<relay>); "reason" is required. Evidence found at the
 * broker is read from this relay's broker; "consumer" must be one of its declared critical
 * consumers. */
static enum MHD_Result api_resolve(http *h, struct MHD_Connection *c, req *rq) {
    const char *err = NULL;
    json_t *j = body_json(rq, &err);
    if (!j) return json_error(c, MHD_HTTP_BAD_REQUEST, OBX_EINVAL, err);
    if ((err = resolve_missing(j))) {
        json_decref(j);
        return json_error(c, MHD_HTTP_BAD_REQUEST, OBX_EINVAL, err);
    }
    const char *ids[64];
    size_t n = 0;
    const char *one = json_string_value(json_object_get(j, "event_id"));
    json_t *arr = json_object_get(j, "event_ids"), *it;
    size_t i;
    if (one) ids[n++] = one;
    json_array_foreach(arr, i, it) if (n < 64 && json_string_value(it)) ids[n++] =
        json_string_value(it);
    const char *op = json_string_value(json_object_get(j, "who"));
    char who[OBX__OWNER_MAX + 1];
    snprintf(who, sizeof who, "operator:%.60s@%.120s", op && *op ? op : "dashboard", h->v->id);
    json_t *part = json_object_get(j, "partition");
    obx_resolve_request q = {
        .event_ids = n ? ids : NULL,
        .n_event_ids = n,
        .event_type = json_string_value(json_object_get(j, "type")),
        .held = json_is_true(json_object_get(j, "held")),
        .older_than_ms = json_integer_value(json_object_get(j, "older_than_ms")),
        .action = json_string_value(json_object_get(j, "action")),
        .topic = json_string_value(json_object_get(j, "topic")),
        .has_partition = json_is_integer(part),
        .partition = (int32_t)json_integer_value(part),
        .offset = json_integer_value(json_object_get(j, "offset")),
        .payload_digest = json_string_value(json_object_get(j, "payload_digest")),
        .attempt_id = json_string_value(json_object_get(j, "attempt_id")),
        .consumer = json_string_value(json_object_get(j, "consumer")),
        .who = who,
        .reason = json_string_value(json_object_get(j, "reason")),
        .dry_run = json_is_true(json_object_get(j, "dry_run")),
        .broker_url = h->v->cfg->broker,
        .broker_props = (const char *const *)h->v->cfg->broker_props.v,
        .n_broker_props = h->v->cfg->broker_props.n,
        .critical_consumers = (const char *const *)h->v->cfg->critical_consumers.v,
        .n_critical_consumers = h->v->cfg->critical_consumers.n};
    obx__store *s = NULL;
    obx_err e = json_array_size(arr) > 64
                    ? obx__fail(OBX_ETOOBIG, "event_ids: over the limit of 64 per request")
                    : store_of(h, &s);
    char *out = NULL;
    size_t refused = 0;
    if (!e) e = obx_resolve(s, &q, &out, &refused);
    enum MHD_Result ret;
    if (e) {
        if (e == OBX_ESTORE || e == OBX_EIO || e == OBX_ECONNLOST) store_drop(h);
        ret = json_error(c, status_of(e), e, obx_errmsg());
    } else {
        json_t *doc = json_loads(out, 0, NULL);
        obx__log(OBX__LOG_INFO, "http", n == 1 ? ids[0] : NULL, NULL, NULL,
                 "UNKNOWN resolution from the dashboard by %s (%s): %lld resolved, %zu refused",
                 who, q.action, (long long)json_integer_value(json_object_get(doc, "resolved")),
                 refused);
        ret = json(c, MHD_HTTP_OK, doc ? doc : json_object());
    }
    obx_free(out);
    json_decref(j);
    return ret;
}

static enum MHD_Result api_redrive(http *h, struct MHD_Connection *c, req *rq) {
    const char *err = NULL;
    json_t *j = body_json(rq, &err);
    if (!j) return json_error(c, MHD_HTTP_BAD_REQUEST, OBX_EINVAL, err);
    const char *consumer = json_string_value(json_object_get(j, "consumer"));
    const char *id = json_string_value(json_object_get(j, "event_id"));
    size_t i = 0;
    while (consumer && i < h->cs.n && strcmp(h->cs.v[i].id, consumer)) i++;
    obx_err e = !consumer || !id ? obx__fail(OBX_EINVAL, "consumer and event_id are required")
                : i == h->cs.n
                    ? obx__fail(OBX_ENOTFOUND, "consumer: not a critical consumer of this relay")
                    : obx__consumer_open(&h->cs, i);
    if (!e) e = obx_inbox_redrive(h->cs.v[i].s, consumer, id);
    enum MHD_Result ret;
    if (e) {
        if (i < h->cs.n && (e == OBX_ESTORE || e == OBX_EIO || e == OBX_ECONNLOST))
            obx__consumer_drop(&h->cs, i, e);
        ret = json_error(c, status_of(e), e, obx_errmsg());
    } else {
        obx__log(OBX__LOG_INFO, "http", id, NULL, NULL,
                 "poison message of consumer %s marked for re-drive from the dashboard", consumer);
        ret = json(
            c, MHD_HTTP_OK,
            json_pack("{s:s,s:s,s:s}", "consumer", consumer, "event_id", id, "state", "REDRIVE"));
    }
    json_decref(j);
    return ret;
}

static enum MHD_Result route(http *h, struct MHD_Connection *c, const char *url, const char *method,
                             req *rq) {
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    if (get && !strcmp(url, "/metrics")) return metrics(h, c);
    if (get && (!strcmp(url, "/") || !strcmp(url, "/index.html")))
        return reply(c, MHD_HTTP_OK, "text/html; charset=utf-8", obx__dash_index_html,
                     strlen(obx__dash_index_html));
    if (get && !strcmp(url, "/app.js"))
        return reply(c, MHD_HTTP_OK, "text/javascript; charset=utf-8", obx__dash_app_js,
                     strlen(obx__dash_app_js));
    if (get && !strcmp(url, "/style.css"))
        return reply(c, MHD_HTTP_OK, "text/css; charset=utf-8", obx__dash_style_css,
                     strlen(obx__dash_style_css));
    if (get && !strcmp(url, "/vendor/uplot.js"))
        return reply(c, MHD_HTTP_OK, "text/javascript; charset=utf-8", obx__dash_uplot_js,
                     strlen(obx__dash_uplot_js));
    if (get && !strcmp(url, "/vendor/uplot.css"))
        return reply(c, MHD_HTTP_OK, "text/css; charset=utf-8", obx__dash_uplot_css,
                     strlen(obx__dash_uplot_css));
    if (get && !strcmp(url, "/api/status")) return api_status(h, c);
    if (get && !strcmp(url, "/api/series")) return api_series(h, c);
    if (get && !strcmp(url, "/api/trace")) return api_trace(h, c);
    bool mutating = !strcmp(url, "/api/requeue") || !strcmp(url, "/api/redrive") ||
                    !strcmp(url, "/api/resolve");
    if (mutating && !post)
        return json_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, OBX_EINVAL, "use POST");
    if (mutating) {
        if (!h->token_digest[0])
            return json_error(
                c, MHD_HTTP_FORBIDDEN, OBX_EREFUSED,
                h->writes_off[0] ? h->writes_off
                                 : "no http.token_file configured: mutating requests are disabled");
        if (!authorized(h, c)) {
            obx__log(OBX__LOG_WARN, "http", NULL, NULL, NULL,
                     "POST %s refused: missing or wrong bearer token", url);
            return json_error(c, MHD_HTTP_UNAUTHORIZED, OBX_EREFUSED,
                              "missing or wrong bearer token");
        }
        if (!strcmp(url, "/api/resolve")) return api_resolve(h, c, rq);
        return !strcmp(url, "/api/requeue") ? api_requeue(h, c, rq) : api_redrive(h, c, rq);
    }
    if (!get && !post) return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n");
    return text(c, MHD_HTTP_NOT_FOUND, "not found\n");
}

/* What the worker answers (it needs the store); everything else is answered at once. */
static bool needs_store(const char *url) {
    return !strncmp(url, "/api/", 5) || !strcmp(url, "/metrics");
}

/* Hands rq to the worker: the connection is suspended until work_main answered it. */
static enum MHD_Result enqueue(http *h, struct MHD_Connection *c, req *rq, const char *url,
                               const char *method) {
    if (strlen(url) >= sizeof rq->url) return text(c, MHD_HTTP_URI_TOO_LONG, "URL too long\n");
    pthread_mutex_lock(&h->q_mu);
    bool full = h->q_len >= QUEUE_MAX || h->q_stop;
    if (!full) {
        obx__strlcpy(rq->url, url, sizeof rq->url);
        obx__strlcpy(rq->method, method, sizeof rq->method);
        rq->c = c;
        rq->phase = 1;
        rq->next = NULL;
        MHD_suspend_connection(c);
        if (h->q_tail)
            h->q_tail->next = rq;
        else
            h->q_head = rq;
        h->q_tail = rq;
        h->q_len++;
        pthread_cond_signal(&h->q_cv);
    }
    pthread_mutex_unlock(&h->q_mu);
    return full ? text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "busy: too many requests waiting\n")
                : MHD_YES;
}

/* The worker: answers the queued requests one at a time (the store connections under h->mu),
 * then resumes their connections; at a stop, what is still queued is resumed unanswered (the
 * connection closes). */
static void *work_main(void *arg) {
    http *h = arg;
    pthread_mutex_lock(&h->q_mu);
    for (;;) {
        while (!h->q_head && !h->q_stop) pthread_cond_wait(&h->q_cv, &h->q_mu);
        req *rq = h->q_head;
        if (!rq) break;
        h->q_head = rq->next;
        if (!h->q_head) h->q_tail = NULL;
        h->q_len--;
        bool stop = h->q_stop;
        pthread_mutex_unlock(&h->q_mu);
        if (!stop) {
            capture = rq;
            pthread_mutex_lock(&h->mu);
            route(h, rq->c, rq->url, rq->method, rq);
            pthread_mutex_unlock(&h->mu);
            capture = NULL;
        }
        rq->phase = 2;
        MHD_resume_connection(rq->c);
        pthread_mutex_lock(&h->q_mu);
    }
    pthread_mutex_unlock(&h->q_mu);
    return NULL;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    http *h = cls;
    (void)version;
    if (!*con_cls) { /* first call for this request: headers only */
        req *rq = calloc(1, sizeof *rq);
        if (!rq) return MHD_NO;
        *con_cls = rq;
        return MHD_YES;
    }
    req *rq = *con_cls;
    if (rq->phase == 2) { /* resumed: the worker's answer */
        if (!rq->rs) return MHD_NO;
        enum MHD_Result ret = MHD_queue_response(c, rq->code, rq->rs);
        MHD_destroy_response(rq->rs);
        rq->rs = NULL;
        return ret;
    }
    if (*upload_size) { /* a chunk of the body */
        if (rq->body.len + *upload_size > BODY_MAX)
            rq->too_big = true;
        else
            obx__buf_put(&rq->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (!strcmp(url, "/healthz")) return text(c, MHD_HTTP_OK, "ok\n");
    if (!host_ok(h, c)) return text(c, MHD_HTTP_FORBIDDEN, "host not allowed\n");
    /* the probes never wait behind a request that is busy with the store */
    if (!strcmp(url, "/readyz")) return readyz(h, c);
    if (needs_store(url)) return enqueue(h, c, rq, url, method);
    return route(h, c, url, method, rq); /* the static files, 404, 405: from memory */
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    req *rq = *con_cls;
    if (!rq) return;
    if (rq->rs) MHD_destroy_response(rq->rs);
    obx__buf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

/* Stops the worker: it resumes whatever is still queued, unanswered. Before MHD_stop_daemon,
 * which needs no connection suspended. */
static void work_stop(http *h) {
    if (!h->work_started) return;
    pthread_mutex_lock(&h->q_mu);
    h->q_stop = true;
    pthread_cond_broadcast(&h->q_cv);
    pthread_mutex_unlock(&h->q_mu);
    pthread_join(h->work_th, NULL);
    h->work_started = false;
}

static void http_free(http *h) {
    work_stop(h);
    if (h->series_started) {
        atomic_store(&h->series_stop, 1);
        pthread_join(h->series_th, NULL);
    }
    if (h->probe_started) {
        atomic_store(&h->series_stop, 1);
        pthread_join(h->probe_th, NULL);
    }
    pthread_mutex_destroy(&h->probe_mu);
    pthread_mutex_destroy(&h->q_mu);
    pthread_cond_destroy(&h->q_cv);
    obx__series_free(h->series);
    obx__metrics_free(h->m);
    obx__consumer_set_free(&h->cs);
    obx__st_close(h->s);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

obx_err obx__http_start(const obx__relay_view *v, const char *listen, void **out) {
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
    h->v = v;
    h->loopback = (ntohl(sa.sin_addr.s_addr) >> 24) == 127;
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->probe_mu, NULL);
    pthread_mutex_init(&h->q_mu, NULL);
    pthread_cond_init(&h->q_cv, NULL);
    const obx_config *cfg = v->cfg;
    obx_err e = obx__consumer_set_init(&h->cs, (const char *const *)cfg->critical_consumers.v,
                                       cfg->critical_consumers.n);
    if (!e) e = obx__metrics_new(&h->cs, &h->m);
    if (!e)
        e = obx__series_new((size_t)cfg->series_points, cfg->series_interval_ms, h->cs.n,
                            &h->series);
    if (!e && cfg->http_token_file[0]) e = read_token(h, cfg->http_token_file);
    if (e) {
        http_free(h);
        return e;
    }
    int rc = pthread_create(&h->work_th, NULL, work_main, h);
    if (rc) {
        http_free(h);
        return obx__fail(OBX_EINTERNAL, "http: cannot start the worker: %s", strerror(rc));
    }
    h->work_started = true;
    /* epoll (no FD_SETSIZE bound), or poll where libmicrohttpd was built without it */
    unsigned flags =
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
        (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES ? MHD_USE_EPOLL : MHD_USE_POLL);
    h->d =
        MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, &sa,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)cfg->http_max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                         (unsigned)cfg->http_max_connections_per_ip, MHD_OPTION_NOTIFY_COMPLETED,
                         completed, NULL, MHD_OPTION_END);
    if (!h->d) {
        work_stop(h);
        http_free(h);
        return obx__fail(OBX_EIO, "http: cannot listen on %s (in use?)", listen);
    }
    rc = pthread_create(&h->series_th, NULL, series_main, h);
    if (rc) {
        work_stop(h);
        MHD_stop_daemon(h->d);
        http_free(h);
        return obx__fail(OBX_EINTERNAL, "http: cannot start the series sampler: %s", strerror(rc));
    }
    h->series_started = true;
    if (!(rc = pthread_create(&h->probe_th, NULL, probe_main, h))) h->probe_started = true;
    /* port 0 asks the kernel for a free port: log the one we got (tests read it here) */
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    char addr[160];
    inet_ntop(AF_INET, &sa.sin_addr, addr, sizeof addr);
    obx__log(OBX__LOG_INFO, "http", NULL, NULL, NULL,
             "listening on http://%s:%u (dashboard /, /metrics, /healthz, /readyz; mutating "
             "requests %s)",
             addr, info ? (unsigned)info->port : (unsigned)port,
             h->token_digest[0] ? "need the bearer token" : "disabled: no token file");
    *out = h;
    return OBX_OK;
}

void obx__http_stop(void *p) {
    http *h = p;
    if (!h) return;
    /* the sampler first: it takes the lock the request handler takes */
    atomic_store(&h->series_stop, 1);
    if (h->series_started) {
        pthread_join(h->series_th, NULL);
        h->series_started = false;
    }
    if (h->probe_started) {
        pthread_join(h->probe_th, NULL);
        h->probe_started = false;
    }
    work_stop(h);
    MHD_stop_daemon(h->d);
    http_free(h);
}

/*
 * otel.c — the OpenTelemetry exporter (otel.h; docs/operations.md, "OpenTelemetry").
 *
 * Owns: the span queue, the exporter thread, and the mapping of obx's events to spans.
 *
 *   callers (dispatchers, reconciler, consumer loop, obx_enqueue)   exporter thread
 *     span record (strings copied) ------- queue (mutex) ------>  up to 512: IDs, OTLP JSON,
 *     queue full: dropped += 1, never waits                       POST {endpoint}/v1/traces
 *                                                                 failed: dropped += batch
 *
 * Invariants:
 *  1. A caller never waits for the network: it copies the span's strings into one record and
 *     holds the queue's lock only to append a pointer; only the exporter thread derives IDs,
 *     builds JSON and talks HTTP. With otel.endpoint empty there is no exporter: every hook is
 *     a NULL check.
 *  2. The queue holds at most otel.queue_max spans; a span that finds it full is dropped and
 *     counted (obx_otel_spans_dropped_total), as is every span of a batch the collector did not
 *     accept: at once for an answer the OTLP specification does not call retryable, after
 *     OTEL_RETRIES tries 1 s, 2 s and 4 s apart for one it does (no answer, 429, 502, 503,
 *     504; obx_otel_export_retries_total), never past a stop's otel.timeout_ms. Traces are
 *     diagnostics; the outbox's own tables are the record.
 *  3. Every span of an event is in one trace: the traceparent's trace, whose span is the parent
 *     of every span obx emits for it; an event without a traceparent gets a trace of its own,
 *     derived from its event ID (so the relay, the consumers and the producer agree on it).
 *  4. The producer span's ID is derived from the event ID (span_id("create", event_id)), and the
 *     publish attempt's from the attempt ID: every other span links to them without asking
 *     anyone, and a link to a span that was never emitted (obx.enqueue() in SQL emits none)
 *     costs nothing.
 *
 * Why libcurl: OTLP/HTTP collectors are reached over HTTP/1.1 and, in production, TLS with the
 * system's CA store and proxies; libcurl gives all of it, keep-alive and time limits, in one
 * dependency that every distribution carries, where a hand-written client would only do plain
 * HTTP. JSON comes from jansson, which obx links already. Without libcurl (OBX_WITH_OTEL off)
 * obx_otel_open refuses a configured endpoint with OBX_EUNSUPPORTED.
 */
#include "drivers/otel.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef OBX_WITH_OTEL
#include <curl/curl.h>
#endif

/* OTLP's SpanKind and StatusCode (opentelemetry-proto trace.proto); JSON carries enums as
 * integers. */
enum { KIND_INTERNAL = 1, KIND_PRODUCER = 4, KIND_CONSUMER = 5 };
enum { STATUS_UNSET = 0, STATUS_OK = 1, STATUS_ERROR = 2 };
enum { BATCH_MAX = 512, OTEL_RETRIES = 3 };

struct obx_otel {
    char url[1100];
    char service[128];
    char system[32]; /* messaging.system: kafka, rabbitmq, obx_log */
    int64_t interval_ms, timeout_ms;
    size_t queue_max;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool kafka;
    struct span **q; /* ring of queue_max span records (owned) */
    size_t head, n;
    bool stop;
    pthread_t th;
    obx__otel_stats st; /* under mu */
};

/* ---- time and IDs ------------------------------------------------------------------------- */

static int64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 16 hex digits (a span ID) or 32 (a trace ID) derived from what and key: sha256 of both. */
static void derive_id(const char *what, const char *key, char *out, size_t digits) {
    char in[600], d[OBX_DIGEST_LEN + 1];
    int n = snprintf(in, sizeof in, "obx.%s:%s", what, key);
    if (n < 0 || (size_t)n >= sizeof in) n = (int)sizeof in - 1; /* cut: still one per key */
    if (obx_sha256_digest(in, (size_t)n, d) != OBX_OK) snprintf(d, sizeof d, "sha256:%064d", 1);
    memcpy(out, d + 7, digits); /* after "sha256:" */
    out[digits] = '\0';
}

/* The event's trace and the parent of its spans: from its traceparent
 * ("00-<32 hex trace>-<16 hex span>-<2 hex flags>"), or a trace of its own and no parent. */
static bool zeros(const char *hex, size_t n) { return strspn(hex, "0") >= n; }

static void trace_of(const char *traceparent, const char *event_id, char trace[33],
                     char parent[17]) {
    /* W3C: an all-zero trace or parent ID is invalid, and a collector refuses the whole request
     * for one such span; obx's input check (obx__is_traceparent) checks only the shape */
    if (traceparent && strlen(traceparent) == 55 && !zeros(traceparent + 3, 32) &&
        !zeros(traceparent + 36, 16)) {
        memcpy(trace, traceparent + 3, 32);
        trace[32] = '\0';
        memcpy(parent, traceparent + 36, 16);
        parent[16] = '\0';
        return;
    }
    derive_id("trace", event_id, trace, 32);
    parent[0] = '\0';
}

/* ---- span records: what a caller queues ---------------------------------------------------
 * A caller copies the span's strings into one record (a few strlcpy and one malloc); the
 * exporter thread derives the IDs (sha256) and builds the JSON, off the relay's and the
 * consumer's threads. */

enum { MAX_ATTRS = 24, TEXT_CAP = 3072 };

typedef struct attr {
    const char *key; /* static */
    int32_t off;     /* the value in text; -1: an integer, in ival */
    int64_t ival;
} attr;

typedef struct span {
    const char *op;                  /* the name's first word (static): "<op> <destination>" */
    const char *id_what, *link_what; /* derive_id's what for its ID and its link (NULL: none) */
    int kind, status, n_attrs;
    int64_t start_ns, end_ns;
    int32_t tp, event_id, id_key, link_key, dest, status_msg; /* offsets in text */
    attr a[MAX_ATTRS];
    size_t used;
    char text[TEXT_CAP]; /* text[0] = '\0': offset 0 is "" */
} span;

/* Copies v into the span's text; returns its offset (0: "" or no room). */
static int32_t put(span *s, const char *v) {
    size_t n = v ? strlen(v) : 0;
    if (!n || s->used + n + 1 > sizeof s->text) return 0;
    int32_t off = (int32_t)s->used;
    memcpy(s->text + off, v, n + 1);
    s->used += n + 1;
    return off;
}

static void attr_s(span *s, const char *k, const char *v) {
    int32_t off = put(s, v);
    if (off && s->n_attrs < MAX_ATTRS) s->a[s->n_attrs++] = (attr){.key = k, .off = off};
}

static void attr_i(span *s, const char *k, int64_t v) {
    if (s->n_attrs < MAX_ATTRS) s->a[s->n_attrs++] = (attr){.key = k, .off = -1, .ival = v};
}

/* A span of the event's: its trace from the traceparent (or the event ID), the obx and
 * messaging attributes every span of an event carries. */
static void span_init(span *s, const char *op, const char *op_type, const char *traceparent,
                      const char *event_id, const char *type, const char *tenant,
                      const char *dest) {
    s->op = op;
    s->used = 1;
    s->text[0] = '\0';
    s->tp = put(s, traceparent);
    s->event_id = put(s, event_id);
    s->dest = put(s, dest);
    attr_s(s, "messaging.operation.type", op_type);
    attr_s(s, "messaging.operation.name", op);
    attr_s(s, "messaging.destination.name", dest);
    attr_s(s, "messaging.message.id", event_id);
    attr_s(s, "obx.event_id", event_id);
    attr_s(s, "obx.event_type", type);
    attr_s(s, "obx.tenant", tenant);
    attr_s(s, "obx.destination", dest);
}

/* Appends a copy of the span to the queue, or drops it (invariant 2). Never waits for the
 * network. */
static void enqueue_span(obx_otel *o, const span *s) {
    size_t size = offsetof(span, text) + s->used;
    span *c = malloc(size);
    if (c) memcpy(c, s, size);
    pthread_mutex_lock(&o->mu);
    if (!c || o->n >= o->queue_max || o->stop) {
        o->st.dropped++;
        pthread_mutex_unlock(&o->mu);
        free(c);
        return;
    }
    o->q[(o->head + o->n) % o->queue_max] = c;
    o->n++;
    o->st.queued++;
    if (o->n >= BATCH_MAX) pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

/* True when the queue has no room: the span is counted as dropped without being built. */
static bool full(obx_otel *o) {
    pthread_mutex_lock(&o->mu);
    bool f = o->n >= o->queue_max;
    if (f) o->st.dropped++;
    pthread_mutex_unlock(&o->mu);
    return f;
}

/* ---- span records as OTLP JSON (the exporter thread) ----------------------------------------- */

/* {"key": k, "value": {type: v}}: built by hand, json_pack's format parsing per attribute was
 * a third of the exporter's time (keys are ours and ASCII: no UTF-8 check) */
static json_t *attr_json(const char *k, const char *type, const char *v) {
    json_t *a = json_object(), *val = json_object();
    json_object_set_new_nocheck(val, type, json_string(v));
    json_object_set_new_nocheck(a, "key", json_string_nocheck(k));
    json_object_set_new_nocheck(a, "value", val);
    return a;
}

static json_t *attrs_json(obx_otel *o, const span *s) {
    json_t *a = json_array();
    json_array_append_new(a, attr_json("messaging.system", "stringValue", o->system));
    for (int i = 0; i < s->n_attrs; i++) {
        char v[32];
        if (s->a[i].off < 0)
            snprintf(v, sizeof v, "%lld", (long long)s->a[i].ival); /* int64: a JSON string */
        json_array_append_new(a,
                              attr_json(s->a[i].key, s->a[i].off < 0 ? "intValue" : "stringValue",
                                        s->a[i].off < 0 ? v : s->text + s->a[i].off));
    }
    return a;
}

static json_t *span_json(obx_otel *o, const span *s) {
    char trace[33], parent[17], id[17], name[400], start[24], end[24];
    trace_of(s->text + s->tp, s->text + s->event_id, trace, parent);
    derive_id(s->id_what, s->text + s->id_key, id, 16);
    snprintf(name, sizeof name, "%s %s", s->op, s->dest ? s->text + s->dest : "(none)");
    snprintf(start, sizeof start, "%lld", (long long)s->start_ns);
    snprintf(end, sizeof end, "%lld",
             (long long)(s->end_ns > s->start_ns ? s->end_ns : s->start_ns));
    json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:o}", "traceId", trace, "spanId", id,
                          "name", name, "kind", s->kind, "startTimeUnixNano", start,
                          "endTimeUnixNano", end, "attributes", attrs_json(o, s));
    if (!j) return NULL;
    if (parent[0]) json_object_set_new(j, "parentSpanId", json_string(parent));
    if (s->link_what) {
        char link[17];
        derive_id(s->link_what, s->text + s->link_key, link, 16);
        json_object_set_new(j, "links",
                            json_pack("[{s:s, s:s}]", "traceId", trace, "spanId", link));
    }
    if (s->status != STATUS_UNSET) {
        json_t *st = json_pack("{s:i}", "code", s->status);
        if (st && s->status_msg)
            json_object_set_new(st, "message", json_string(s->text + s->status_msg));
        json_object_set_new(j, "status", st);
    }
    return j;
}

/* ---- the producer span (obx_enqueue) -------------------------------------------------------- */

static void on_enqueued(void *user, const obx__event_row *row, int64_t start_ms) {
    obx_otel *o = user;
    if (full(o)) return;
    const obx__envelope *v = &row->env;
    span s = {.kind = KIND_PRODUCER, .id_what = "create", .start_ns = start_ms * 1000000};
    span_init(&s, "create", "create", v->traceparent, v->event_id, v->event_type, v->tenant,
              row->dest.topic);
    s.id_key = s.event_id;
    s.end_ns = wall_ns();
    attr_s(&s, "obx.cluster", row->dest.cluster);
    attr_s(&s, "obx.correlation_id", v->correlation_id);
    enqueue_span(o, &s);
}

/* An operator's resolution of an UNKNOWN attempt (obx_resolve: `obx resolve`, POST
 * /api/resolve): a reconcile span from the start of the UNKNOWN episode to the decision,
 * linked to the attempt it resolved, as the reconciler's own decisions are. */
static void on_resolved(void *user, const obx__event_row *row, const char *action,
                        const char *who) {
    obx_otel *o = user;
    if (full(o)) return;
    const obx__envelope *v = &row->env;
    span s = {.kind = KIND_INTERNAL, .id_what = "reconcile", .end_ns = wall_ns()};
    span_init(&s, "reconcile", NULL, v->traceparent, v->event_id, v->event_type, v->tenant,
              row->dest.topic);
    char key[200];
    snprintf(key, sizeof key, "%s/resolve", row->attempt_id);
    s.id_key = put(&s, key);
    s.link_what = "send";
    s.link_key = put(&s, row->attempt_id);
    s.start_ns = row->unknown_since > 0 ? row->unknown_since * 1000000 : s.end_ns;
    s.status = STATUS_OK;
    if (row->attempt_gen > 0) attr_i(&s, "obx.attempt", row->attempt_gen);
    attr_s(&s, "obx.attempt_id", row->attempt_id);
    attr_s(&s, "obx.outcome", !strcmp(action, "accept") ? "operator_accept" : "operator_retry");
    attr_s(&s, "obx.resolved_by", who ? who : "");
    attr_s(&s, "obx.cluster", row->dest.cluster);
    attr_s(&s, "obx.correlation_id", v->correlation_id);
    enqueue_span(o, &s);
}

void obx_store_set_otel(obx_store *s, obx_otel *o) {
    if (!s) return;
    s->on_enqueued = o ? on_enqueued : NULL;
    s->on_enqueued_user = o;
    s->on_resolved = o ? on_resolved : NULL;
    s->on_resolved_user = o;
}

/* ---- the relay's spans: publish attempts and reconciliations -------------------------------- */

/* What a note says about a publish attempt (its outcome), or NULL when the note is a
 * reconciliation's (*reconcile set) or neither. */
static const char *attempt_outcome(const obx__note *n, bool *reconcile) {
    *reconcile = false;
    switch (n->kind) {
    case OBX__NOTE_PUBLISHED:
    case OBX__NOTE_DUPLICATE:
    case OBX__NOTE_QUARANTINED:
        if (n->source != OBX__RS_BROKER) {
            *reconcile = true;
            return n->source == OBX__RS_LOOKUP ? "found" : "evidence";
        }
        return n->kind == OBX__NOTE_PUBLISHED   ? "published"
               : n->kind == OBX__NOTE_DUPLICATE ? "duplicate"
                                                : "quarantined";
    case OBX__NOTE_UNKNOWN: return "unknown";
    case OBX__NOTE_REJECTED: return "rejected";
    case OBX__NOTE_NOT_SENT: return "not_sent";
    case OBX__NOTE_PARKED: return "parked";
    case OBX__NOTE_RETRY: *reconcile = true; return "retry";
    case OBX__NOTE_HELD: *reconcile = true; return "held";
    default: return NULL;
    }
}

/* A publish attempt, from its registration (the attempt ID's time) to its outcome. */
static void attempt_span(const obx__note *n, const char *outcome, span *s) {
    int64_t t0 = obx__ulid_time(n->attempt_id + 4); /* "att-" + ULID */
    s->kind = KIND_PRODUCER;
    s->id_what = "send";
    s->id_key = put(s, n->attempt_id);
    s->link_what = "create";
    s->link_key = s->event_id;
    s->start_ns = t0 > 0 ? t0 * 1000000 : s->end_ns;
    bool ok = !strcmp(outcome, "published") || !strcmp(outcome, "duplicate");
    s->status = ok ? STATUS_OK : STATUS_ERROR;
    s->status_msg = ok ? 0 : put(s, n->detail);
}

/* A reconciliation's decision about an UNKNOWN attempt: from the start of the UNKNOWN episode
 * to the decision. A retry's span links to the attempt it sends, the others to the attempt
 * they resolved. */
static void reconcile_span(const obx__note *n, span *s) {
    char key[200];
    snprintf(key, sizeof key, "%s/%d", n->attempt_id, (int)n->kind);
    s->kind = KIND_INTERNAL;
    s->id_what = "reconcile";
    s->id_key = put(s, key);
    s->link_what = "send";
    s->link_key = put(s, n->attempt_id);
    int64_t since = n->unknown_ms >= 0 ? s->end_ns / 1000000 - n->unknown_ms : n->ev->unknown_since;
    s->start_ns = since > 0 ? since * 1000000 : s->end_ns;
    s->status = n->kind == OBX__NOTE_HELD ? STATUS_ERROR : STATUS_OK;
    s->status_msg = n->kind == OBX__NOTE_HELD ? put(s, n->detail) : 0;
}

void obx__otel_note(obx_otel *o, const obx__note *n) {
    bool reconcile;
    const char *outcome = o && n->ev ? attempt_outcome(n, &reconcile) : NULL;
    if (!outcome || full(o)) return;
    const obx__event_row *ev = n->ev;
    /* the relay's clock (docs/design.md, "One clock"): the attempt IDs' and the UNKNOWN
     * episodes' times, where the spans start, are on it */
    span s = {.end_ns = obx__ref_ms() * 1000000};
    span_init(&s, reconcile ? "reconcile" : "send", reconcile ? NULL : "send", ev->env.traceparent,
              ev->env.event_id, ev->env.event_type, ev->env.tenant, ev->dest.topic);
    if (reconcile)
        reconcile_span(n, &s);
    else
        attempt_span(n, outcome, &s);
    /* a retry's note names the new attempt: the one reconciled was the one before it */
    int32_t gen = n->kind == OBX__NOTE_RETRY ? n->attempt_gen - 1 : n->attempt_gen;
    if (gen > 0) attr_i(&s, "obx.attempt", gen);
    if (n->kind == OBX__NOTE_RETRY) attr_i(&s, "obx.retry_attempt", n->attempt_gen);
    attr_s(&s, n->kind == OBX__NOTE_RETRY ? "obx.retry_attempt_id" : "obx.attempt_id",
           n->attempt_id);
    attr_s(&s, "obx.outcome", outcome);
    attr_s(&s, "obx.cluster", ev->dest.cluster);
    attr_s(&s, "obx.correlation_id", ev->env.correlation_id);
    if (ev->pinned_partition >= 0)
        attr_i(&s, "messaging.destination.partition.id", ev->pinned_partition);
    enqueue_span(o, &s);
}

/* ---- the consumer's span ------------------------------------------------------------------ */

static const char *inbox_outcome(obx_inbox_outcome k) {
    switch (k) {
    case OBX_INBOX_APPLIED: return "applied";
    case OBX_INBOX_DUPLICATE: return "duplicate";
    case OBX_INBOX_QUARANTINED: return "quarantined";
    case OBX_INBOX_FAILED: return "failed";
    case OBX_INBOX_POISONED: return "poisoned";
    case OBX_INBOX_DELAYED: return "delayed";
    }
    return "?";
}

void obx__otel_process(obx_otel *o, const char *consumer, const obx_message *m,
                       const obx_inbox_result *r, int64_t start_ms) {
    if (!o || !m->event_id || full(o)) return;
    span s = {.kind = KIND_CONSUMER, .start_ns = start_ms * 1000000, .end_ns = wall_ns()};
    span_init(&s, "process", "process", m->traceparent, m->event_id, m->event_type, m->tenant,
              m->topic);
    char key[400];
    snprintf(key, sizeof key, "%s/%s/%s/%lld", consumer, m->event_id,
             m->attempt_id ? m->attempt_id : "", (long long)s.end_ns);
    s.id_what = "process";
    s.id_key = put(&s, key);
    s.link_what = "create";
    s.link_key = s.event_id;
    bool ok = r->outcome == OBX_INBOX_APPLIED || r->outcome == OBX_INBOX_DUPLICATE;
    s.status = ok ? STATUS_OK : STATUS_ERROR;
    s.status_msg = ok ? 0 : put(&s, r->detail);
    attr_s(&s, "messaging.consumer.group.name", consumer);
    attr_s(&s, "obx.consumer", consumer);
    attr_s(&s, "obx.attempt_id", m->attempt_id);
    attr_s(&s, "obx.outcome", inbox_outcome(r->outcome));
    attr_s(&s, "obx.correlation_id", m->correlation_id);
    attr_i(&s, "messaging.destination.partition.id", m->partition);
    attr_i(&s, o->kafka ? "messaging.kafka.offset" : "obx.offset", m->offset);
    enqueue_span(o, &s);
}

/* ---- the exporter thread ------------------------------------------------------------------ */

/* ExportTraceServiceRequest: one resource (service.name), one scope (obx), the spans (stolen). */
static json_t *request_json(obx_otel *o, json_t *spans) {
    json_t *res = json_array();
    json_array_append_new(res, attr_json("service.name", "stringValue", o->service));
    json_array_append_new(res, attr_json("telemetry.sdk.name", "stringValue", "obx"));
    json_array_append_new(res, attr_json("telemetry.sdk.language", "stringValue", "c"));
    json_array_append_new(res,
                          attr_json("telemetry.sdk.version", "stringValue", OBX_VERSION_STRING));
    return json_pack("{s:[{s:{s:o}, s:[{s:{s:s, s:s}, s:o}]}]}", "resourceSpans", "resource",
                     "attributes", res, "scopeSpans", "scope", "name", "obx", "version",
                     OBX_VERSION_STRING, "spans", spans);
}

#ifdef OBX_WITH_OTEL
static size_t discard(char *p, size_t size, size_t n, void *u) {
    (void)p;
    (void)u;
    return size * n;
}

static void curl_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* POSTs body; true when the collector answered 2xx. *retry: whether the failure is one the
 * OTLP specification calls retryable (no answer, or HTTP 429, 502, 503, 504). */
static bool post(obx_otel *o, CURL *h, const char *body, char *why, size_t cap, bool *retry) {
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, o->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)o->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hd);
    if (rc != CURLE_OK)
        snprintf(why, cap, "%s", curl_easy_strerror(rc));
    else if (status < 200 || status > 299)
        snprintf(why, cap, "HTTP %ld", status);
    *retry = rc != CURLE_OK || status == 429 || status == 502 || status == 503 || status == 504;
    return rc == CURLE_OK && status >= 200 && status <= 299;
}
#endif

/* Takes up to BATCH_MAX spans off the queue (under mu); returns how many. */
static size_t take_batch(obx_otel *o, span **out) {
    size_t n = 0;
    for (; o->n && n < BATCH_MAX; n++) {
        out[n] = o->q[o->head];
        o->head = (o->head + 1) % o->queue_max;
        o->n--;
    }
    return n;
}

/* The batch as a JSON array of OTLP spans; frees the records. */
static json_t *batch_json(obx_otel *o, span **b, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(a, span_json(o, b[i]));
        free(b[i]);
    }
    return a;
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The CLOCK_MONOTONIC time ms from now: the deadline of a wait on o->cv (monotonic). */
static struct timespec mono_after(int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ns = ts.tv_nsec + (ms % 1000) * 1000000;
    ts.tv_sec += (time_t)(ms / 1000 + ns / 1000000000);
    ts.tv_nsec = ns % 1000000000;
    return ts;
}

#ifdef OBX_WITH_OTEL
/* Waits ms (the exporter's back-off) unless the exporter is stopping; true when it is. */
static bool pause_unless_stopping(obx_otel *o, int64_t ms) {
    int64_t until = mono_ms() + ms;
    pthread_mutex_lock(&o->mu);
    while (!o->stop && mono_ms() < until) {
        struct timespec ts = mono_after(until - mono_ms());
        pthread_cond_timedwait(&o->cv, &o->mu, &ts);
    }
    bool stop = o->stop;
    pthread_mutex_unlock(&o->mu);
    return stop;
}
#endif

/* Sends one batch of n spans (h NULL: drops it); counts them exported or dropped. True when the
 * collector took them. A retryable failure (post) is sent again after 1 s, 2 s and 4 s, the
 * OTLP specification's exponential back-off, unless the exporter is stopping: a collector
 * restarting or shedding load loses no spans, while the callers, who never wait, fill the
 * queue meanwhile (and drop what does not fit, counted). */
static bool send_batch(obx_otel *o, void *h, json_t *spans, size_t n) {
    json_t *req = request_json(o, spans);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    char why[300] = "out of memory";
    bool ok = false;
#ifdef OBX_WITH_OTEL
    bool retry = false;
    for (int i = 0; body && h && !ok; i++) {
        ok = post(o, h, body, why, sizeof why, &retry);
        if (ok || !retry || i == OTEL_RETRIES) break;
        pthread_mutex_lock(&o->mu);
        o->st.retries++;
        pthread_mutex_unlock(&o->mu);
        if (pause_unless_stopping(o, (int64_t)1000 << i)) break;
    }
#endif
    if (!h) snprintf(why, sizeof why, "not sent: stopping, and otel.timeout_ms is over");
    free(body);
    pthread_mutex_lock(&o->mu);
    if (ok)
        o->st.exported += (int64_t)n;
    else {
        o->st.dropped += (int64_t)n;
        o->st.failures++;
    }
    int64_t failures = o->st.failures;
    pthread_mutex_unlock(&o->mu);
    /* one line for the first failure and then one per hundred: the collector may be away long */
    if (!ok && failures % 100 == 1)
        obx__backend_log(OBX__BLOG_WARN, "otel",
                         "span export to %s failed (%s): %zu spans dropped; failures so far: %lld",
                         o->url, why, n, (long long)failures);
    return ok;
}

static void *exporter_main(void *arg) {
    obx_otel *o = arg;
    void *h = NULL;
#ifdef OBX_WITH_OTEL
    h = curl_easy_init();
#endif
    /* once stopping: what is queued gets otel.timeout_ms in all, and none after a failure, so
     * that a relay's stop never waits on an absent collector for more than that */
    int64_t stop_by = 0;
    bool give_up = false;
    span *batch[BATCH_MAX];
    pthread_mutex_lock(&o->mu);
    for (;;) {
        if (o->stop && !stop_by) stop_by = mono_ms() + o->timeout_ms;
        if (!o->stop && o->n < BATCH_MAX) {
            struct timespec ts = mono_after(o->interval_ms);
            pthread_cond_timedwait(&o->cv, &o->mu, &ts);
        }
        if (!o->n && o->stop) break;
        size_t n = take_batch(o, batch);
        pthread_mutex_unlock(&o->mu);
        give_up |= stop_by && mono_ms() > stop_by;
        if (n && !send_batch(o, give_up ? NULL : h, batch_json(o, batch, n), n) && stop_by)
            give_up = true;
        pthread_mutex_lock(&o->mu);
    }
    pthread_mutex_unlock(&o->mu);
#ifdef OBX_WITH_OTEL
    curl_easy_cleanup(h);
#endif
    return NULL;
}

/* ---- open, close, counters ------------------------------------------------------------------ */

static const char *system_of(const char *broker) {
    if (!strncmp(broker, "kafka", 5)) return "kafka";
    if (!strncmp(broker, "amqp", 4)) return "rabbitmq";
    if (!strncmp(broker, "log:", 4)) return "obx_log";
    return "obx";
}

static obx_err otel_init(obx_otel *o, const obx_config *c) {
    const char *ep = c->otel_endpoint;
    size_t len = strlen(ep);
    while (len && ep[len - 1] == '/') len--;
    bool has_path = len >= 10 && !strncmp(ep + len - 10, "/v1/traces", 10);
    snprintf(o->url, sizeof o->url, "%.*s%s", (int)len, ep, has_path ? "" : "/v1/traces");
    obx__strlcpy(o->service, c->otel_service[0] ? c->otel_service : "obx", sizeof o->service);
    obx__strlcpy(o->system, system_of(c->broker), sizeof o->system);
    o->kafka = !strcmp(o->system, "kafka");
    o->interval_ms = c->otel_interval_ms > 0 ? c->otel_interval_ms : 1000;
    o->timeout_ms = c->otel_timeout_ms > 0 ? c->otel_timeout_ms : 5000;
    o->queue_max = c->otel_queue_max > 0 ? (size_t)c->otel_queue_max : 4096;
    if (!(o->q = calloc(o->queue_max, sizeof *o->q)))
        return obx__fail(OBX_ENOMEM, "otel: out of memory");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&o->th, NULL, exporter_main, o)) {
        pthread_cond_destroy(&o->cv);
        pthread_mutex_destroy(&o->mu);
        return obx__fail(OBX_EIO, "otel: cannot start the exporter thread: %s", strerror(errno));
    }
    return OBX_OK;
}

obx_err obx_otel_open(const obx_config *c, obx_otel **out) {
    if (!c || !out) return obx__fail(OBX_EINVAL, "otel: NULL argument");
    obx__clear_error();
    *out = NULL;
    if (!c->otel_endpoint[0]) return OBX_OK;
#ifndef OBX_WITH_OTEL
    if (c->otel_endpoint[0])
        return obx__fail(OBX_EUNSUPPORTED,
                         "otel.endpoint: this obx was built without OpenTelemetry "
                         "(OBX_WITH_OTEL: libcurl)");
#else
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_once);
#endif
    obx_otel *o = calloc(1, sizeof *o);
    if (!o) return obx__fail(OBX_ENOMEM, "otel: out of memory");
    obx_err e = otel_init(o, c);
    if (e) {
        free(o->q);
        free(o);
        return e;
    }
    *out = o;
    return OBX_OK;
}

void obx_otel_close(obx_otel *o) {
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    o->stop = true;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->th, NULL);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o->q);
    free(o);
}

void obx__otel_stats_get(obx_otel *o, obx__otel_stats *out) {
    memset(out, 0, sizeof *out);
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    *out = o->st;
    pthread_mutex_unlock(&o->mu);
}

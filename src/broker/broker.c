/*
 * broker.c — the engine's only way into a broker backend (registry, argument checks, fault
 * injection), plus what all backends share: the obx message headers (build and parse — the
 * parser reads outside input and is a fuzz target) and the partitioners.
 */
#include "broker/broker.h"
#include "obx_test.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static long fault_at;
static long call_count;
static const char *fault_hit; /* the wrapper the armed fault failed (a literal) */
static obx_err fault_with = OBX_EBROKER;

const char *obx__br_fault_hit(void) { return __atomic_load_n(&fault_hit, __ATOMIC_SEQ_CST); }

void obx__br_fault_code(obx_err code) { __atomic_store_n(&fault_with, code, __ATOMIC_SEQ_CST); }

void obx__br_fault_after(long k) {
    if (!k) obx__br_fault_code(OBX_EBROKER);
    __atomic_store_n(&fault_hit, NULL, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fault_at, k, __ATOMIC_SEQ_CST);
    __atomic_store_n(&call_count, 0, __ATOMIC_SEQ_CST);
}

long obx__br_calls(void) { return __atomic_load_n(&call_count, __ATOMIC_SEQ_CST); }

static obx_err fault(const char *what) {
    long n = __atomic_add_fetch(&call_count, 1, __ATOMIC_SEQ_CST);
    long k = __atomic_load_n(&fault_at, __ATOMIC_SEQ_CST);
    if (k && n == k) {
        __atomic_store_n(&fault_hit, what, __ATOMIC_SEQ_CST);
        return obx__fail(__atomic_load_n(&fault_with, __ATOMIC_SEQ_CST),
                         "injected broker fault at call %ld (%s)", n, what);
    }
    return OBX_OK;
}

const char *obx__outcome_kind_name(obx__outcome_kind k) {
    static const char *const n[] = {"ACK", "REJECT", "NOT_SENT", "UNKNOWN"};
    return (unsigned)k < 4 ? n[k] : "?";
}

void obx__delivery_free(obx__delivery *d) {
    if (!d) return;
    free(d->payload);
    d->payload = NULL;
    d->payload_len = 0;
}

const obx__broker_methods *obx__broker_backend(obx__url_scheme scheme) {
    switch (scheme) {
    case OBX__URL_LOG: return &obx__log_broker_methods;
#ifdef OBX_WITH_SIM
    case OBX__URL_SIM: return &obx__sim_broker_methods;
#endif
#ifdef OBX_WITH_KAFKA
    case OBX__URL_KAFKA: return &obx__kafka_broker_methods;
#endif
#ifdef OBX_WITH_AMQP
    case OBX__URL_AMQP:
    case OBX__URL_AMQPS: return &obx__amqp_broker_methods;
#endif
    default: return NULL;
    }
}

obx_err obx__broker_methods_check(const obx__broker_methods *m) {
    if (m->version != OBX__BROKER_METHODS_VERSION)
        return obx__fail(OBX_EINTERNAL, "broker backend %s: methods version %d, expected %d",
                         m->name, m->version, OBX__BROKER_METHODS_VERSION);
        /* refuse a backend with a missing callback rather than crash later */
#define REQUIRED_(meth)                                                                            \
    if (!m->meth)                                                                                  \
        return obx__fail(OBX_EINTERNAL, "broker backend %s: the method %s is missing", m->name,    \
                         #meth);
    OBX__BROKER_REQUIRED(REQUIRED_)
#undef REQUIRED_
    if ((m->caps & OBX__BCAP_SCAN) && !m->scan)
        return obx__fail(OBX_EINTERNAL,
                         "broker backend %s: declares the scan capability without the method scan",
                         m->name);
#define CONSUMER_(meth)                                                                            \
    if ((m->caps & OBX__BCAP_CONSUME) && !m->meth)                                                 \
        return obx__fail(OBX_EINTERNAL,                                                            \
                         "broker backend %s: declares the consume capability without the method "  \
                         "%s",                                                                     \
                         m->name, #meth);
    OBX__BROKER_CONSUME_REQUIRED(CONSUMER_)
#undef CONSUMER_
    return OBX_OK;
}

static obx_err open_expanded(const char *url, const char *x, const char *const *props,
                             size_t n_props, obx__broker **out);

/* Backend properties with their ${...} references expanded (values only, never in a URL). */
static obx_err expand_props(const char *const *props, size_t n, char ***out) {
    *out = NULL;
    if (!n) return OBX_OK;
    char **v = calloc(n, sizeof *v);
    if (!v) return obx__fail(OBX_ENOMEM, "broker properties: out of memory");
    obx_err e = OBX_OK;
    for (size_t i = 0; i < n && !e; i++) {
        if (!props[i]) continue; /* a backend skips NULL entries */
        const char *eq = strchr(props[i], '=');
        if (!eq) { /* the backend reports it (without echoing: it may be a bare secret) */
            if (!(v[i] = obx__strdup(props[i])))
                e = obx__fail(OBX_ENOMEM, "broker properties: out of memory");
            continue;
        }
        char *val = NULL;
        if ((e = obx__secret_expand(eq + 1, false, &val))) {
            char name[96];
            obx__fail_prefix(e, "broker property '%s'",
                             obx__printable(props[i], (size_t)(eq - props[i]), name, sizeof name));
            break;
        }
        v[i] = obx__asprintf("%.*s=%s", (int)(eq - props[i]), props[i], val);
        obx__secret_free(val);
        if (!v[i]) e = obx__fail(OBX_ENOMEM, "broker properties: out of memory");
    }
    if (e) {
        for (size_t i = 0; i < n; i++) obx__secret_free(v[i]);
        free(v);
        return e;
    }
    *out = v;
    return OBX_OK;
}

obx_err obx__br_open(const char *url, const char *const *props, size_t n_props, obx__broker **out) {
    char *x = NULL, **xp = NULL;
    obx_err e = obx__secret_expand(url, true, &x);
    if (e) return obx__fail_prefix(e, "broker URL");
    if ((e = expand_props(props, n_props, &xp))) {
        obx__secret_free(x);
        return e;
    }
    e = open_expanded(url, x, (const char *const *)xp, n_props, out);
    obx__secret_free(x);
    for (size_t i = 0; xp && i < n_props; i++) obx__secret_free(xp[i]);
    free(xp);
    return e;
}

static obx_err open_expanded(const char *url, const char *x, const char *const *props,
                             size_t n_props, obx__broker **out) {
    obx__url u;
    obx_err e = obx__url_parse(x, "broker", &u);
    if (e) return e;
    const obx__broker_methods *m = obx__broker_backend(u.scheme);
    if (!m) {
        char sh[64];
        return obx__fail(OBX_EUNSUPPORTED, "broker URL: this build has no backend for '%s'",
                         obx__printable(url, strcspn(url, ":"), sh, sizeof sh));
    }
    if ((e = obx__broker_methods_check(m))) return e;
    e = m->open(&u, props, n_props, out);
    OPENSSL_cleanse(&u, sizeof u);
    if (e) return e;
    char *red = NULL;
    if (obx_url_redact(url, &red) == OBX_OK) {
        obx__strlcpy((*out)->url_redacted, red, sizeof(*out)->url_redacted);
        free(red);
    }
    return OBX_OK;
}

/* every method has one entry in the lists of broker.h: a method added to the struct without
 * a wrapper changes its size and stops the build here */
#define ONE_(...) +1
enum { N_METHODS_ = 0 OBX__BROKER_CONSUME(ONE_) OBX__BROKER_CUSTOM(ONE_) };
_Static_assert(sizeof(obx__broker_methods) ==
                   offsetof(obx__broker_methods, open) + N_METHODS_ * sizeof(void (*)(void)),
               "every broker method needs an entry in OBX__BROKER_CONSUME/CUSTOM");

#define CONSUME_(name, params, args)                                                               \
    obx_err obx__br_##name params {                                                                \
        if (!b) return obx__fail(OBX_EINTERNAL, #name ": broker NULL");                            \
        obx_err e = fault(#name);                                                                  \
        if (e) return e;                                                                           \
        if (!(obx__br_caps(b) & OBX__BCAP_CONSUME) || !b->m->name)                                 \
            return obx__fail(OBX_EUNSUPPORTED, "broker %s has no consumer side (" #name ")",       \
                             obx__br_name(b));                                                     \
        return b->m->name args;                                                                    \
    }
OBX__BROKER_CONSUME(CONSUME_)
#undef CONSUME_

bool obx__br_has_consume_release(const obx__broker *b) { return b && b->m->consume_release; }
bool obx__br_has_consume_pause(const obx__broker *b) { return b && b->m->consume_pause; }

const char *obx__br_name(const obx__broker *b) { return b ? b->m->name : "?"; }

size_t obx__br_in_flight(obx__broker *b) { return b->m->in_flight(b); }

int64_t obx__br_quiet_time_ms(obx__broker *b) { return b->m->quiet_time_ms(b); }

int obx__br_wake_fd(obx__broker *b) { return b && b->m->wake_fd ? b->m->wake_fd(b) : -1; }

void obx__br_close(obx__broker *b) {
    if (b) b->m->close(b);
}

obx_err obx__br_cluster_id(obx__broker *b, char *out, size_t cap) {
    obx_err e = fault("cluster_id");
    return e ? e : b->m->cluster_id(b, out, cap);
}

obx_err obx__br_partition_for(obx__broker *b, const obx__dest *d, int32_t *out) {
    obx_err e = fault("partition_for");
    return e ? e : b->m->partition_for(b, d, out);
}

obx_err obx__br_send(obx__broker *b, const obx__msg *m, size_t n, int64_t now) {
    obx_err e = fault("send");
    if (e) return e;
    for (size_t i = 0; i < n; i++)
        if (!m[i].env || !m[i].dest || !m[i].dest_digest || !m[i].attempt_id || m[i].partition < 0)
            return obx__fail(OBX_EINTERNAL, "send: message %zu is incomplete", i);
    return n ? b->m->send(b, m, n, now) : OBX_OK;
}

obx_err obx__br_poll(obx__broker *b, int64_t now, int timeout_ms, obx__outcome *out, size_t cap,
                     size_t *n) {
    *n = 0;
    obx_err e = fault("poll");
    return e ? e : b->m->poll(b, now, timeout_ms, out, cap, n);
}

unsigned obx__br_caps(obx__broker *b) {
    /* a backend may narrow its static caps per configuration, never widen them */
    return b->m->caps_of ? b->m->caps_of(b) & b->m->caps : b->m->caps;
}

obx_err obx__br_scan(obx__broker *b, const char *topic, int64_t since, obx__scan_fn fn,
                     void *user) {
    obx_err e = fault("scan");
    if (e) return e;
    if (!(obx__br_caps(b) & OBX__BCAP_SCAN) || !b->m->scan)
        return obx__fail(OBX_EUNSUPPORTED, "%s broker: cannot scan a topic (no scan capability)",
                         b->m->name);
    return b->m->scan(b, topic, since, fn, user);
}

obx_err obx__br_lookup(obx__broker *b, const obx__lookup_req *req, obx__lookup_res *res) {
    memset(res, 0, sizeof *res);
    obx_err e = fault("lookup");
    if (e) return e;
    unsigned caps = obx__br_caps(b);
    if (!(caps & (OBX__BCAP_LOOKUP_AUTHORITATIVE | OBX__BCAP_LOOKUP_BEST_EFFORT))) {
        res->kind = OBX__LOOKUP_CANNOT_TELL;
        snprintf(res->reason, sizeof res->reason, "%s: no lookup capability", b->m->name);
        return OBX_OK;
    }
    e = b->m->lookup(b, req, res);
    if (e) return e;
    /* a backend that cannot prove absence never answers NOT_FOUND, and nobody may before the
     * attempt's quiet time */
    if (res->kind == OBX__LOOKUP_NOT_FOUND &&
        (!(caps & OBX__BCAP_LOOKUP_AUTHORITATIVE) || req->now < req->quiet_until)) {
        res->kind = OBX__LOOKUP_CANNOT_TELL;
        if (caps & OBX__BCAP_LOOKUP_AUTHORITATIVE) res->authoritative_at = req->quiet_until;
        char at[32];
        obx__iso_ms(req->quiet_until, at); /* reasons reach operators: ISO, not epoch ms */
        snprintf(res->reason, sizeof res->reason,
                 "not found, but not authoritative before the quiet time ends at %s", at);
    }
    return OBX_OK;
}

/* An encrypted route's copy: its body opened (crypt.c), the plaintext's digest into hashed;
 * false when the ring lacks the key (the copy can be judged neither way). A body that does not
 * open leaves hashed "" and says why in refused. */
static bool open_copy(const obx__lookup_req *req, const void *body, size_t len,
                      char hashed[OBX_DIGEST_LEN + 1], char *refused, size_t cap) {
    unsigned char *plain = NULL;
    size_t plen = 0;
    hashed[0] = '\0';
    obx_err e = obx__open(req->keys, req->enc_key, req->event_id, req->envelope_gen,
                          body ? body : "", len, &plain, &plen);
    if (e == OBX_ENOTFOUND) return false;
    if (e) snprintf(refused, cap, "; %s", obx_errmsg());
    if (!e && obx_sha256_digest(plain, plen, hashed)) hashed[0] = '\0';
    free(plain);
    return true;
}

bool obx__lookup_copy(const obx__lookup_req *req, obx__lookup_res *res, obx__outcome *copy,
                      const void *body, size_t len) {
    char header[OBX_DIGEST_LEN + 1], hashed[OBX_DIGEST_LEN + 1] = "", refused[200] = "";
    obx__strlcpy(header, copy->payload_digest, sizeof header);
    copy->kind = OBX__OUT_ACK;
    if (req->enc_key && req->enc_key[0]) {
        if (!open_copy(req, body, len, hashed, refused, sizeof refused)) {
            snprintf(res->reason, sizeof res->reason,
                     "a copy at offset %lld is sealed with key '%.64s', not in this key ring",
                     (long long)copy->offset, req->enc_key);
            return false;
        }
    } else if (obx_sha256_digest(body ? body : "", len, hashed))
        hashed[0] = '\0';
    obx__strlcpy(copy->payload_digest, hashed, sizeof copy->payload_digest);
    const char *want = req->payload_digest ? req->payload_digest : header;
    bool body_ok = hashed[0] && !strcmp(hashed, want);
    bool dest_ok = !req->dest_digest || !strcmp(copy->dest_digest, req->dest_digest);
    if (body_ok && dest_ok) {
        if (res->kind == OBX__LOOKUP_FOUND) return true; /* a later copy: a duplicate */
        res->found = *copy;
        res->kind = OBX__LOOKUP_FOUND;
        return true;
    }
    if (!res->n_bad++) {
        res->bad = *copy;
        if (refused[0]) /* a sealed body that does not open: say so first */
            snprintf(res->bad.reason, sizeof res->bad.reason, "corrupt copy at %.60s/%d@%lld%s",
                     copy->topic, (int)copy->partition, (long long)copy->offset, refused);
        else
            snprintf(res->bad.reason, sizeof res->bad.reason,
                     "%s copy at %.60s/%d@%lld: its body hashes to %.20s..., its header says "
                     "%.20s..., the frozen payload digest is %.20s...%s",
                     !strcmp(hashed, header) ? "foreign" : "corrupt", copy->topic,
                     (int)copy->partition, (long long)copy->offset,
                     hashed[0] ? hashed : "(nothing)", header, want,
                     dest_ok ? "" : "; it names another destination digest");
    }
    return false;
}

void obx__br_contract(obx__broker *b, obx__contract *out) {
    memset(out, 0, sizeof *out);
    if (b->m->contract) {
        b->m->contract(b, out);
        return;
    }
    obx__strlcpy(out->durability, "persistent", sizeof out->durability);
    obx__strlcpy(out->required_acks, "all", sizeof out->required_acks);
    obx__strlcpy(out->serializer, "*", sizeof out->serializer);
}

bool obx__br_honours(obx__broker *b, const obx__dest *d, char *why, size_t cap) {
    obx__contract c;
    obx__br_contract(b, &c);
    const char *field = NULL, *value = NULL, *offer = NULL;
    if (!obx__csv_has(c.durability, d->durability))
        field = "durability", value = d->durability, offer = c.durability;
    else if (!obx__csv_has(c.required_acks, d->required_acks))
        field = "required_acks", value = d->required_acks, offer = c.required_acks;
    else if (!obx__csv_has(c.serializer, d->serializer))
        field = "serializer", value = d->serializer, offer = c.serializer;
    if (!field) return true;
    snprintf(why, cap,
             "the frozen destination's %s '%.60s' cannot be honoured by the %s backend (it "
             "honours: %.100s)",
             field, value, b->m->name, offer);
    return false;
}

/* ---- headers -------------------------------------------------------------------------------- */

static void put(obx__headers *h, const char *name, const char *fmt, ...) OBX__PRINTF(3, 4);
static void put(obx__headers *h, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->value[h->n], sizeof h->value[h->n], fmt, ap);
    va_end(ap);
    h->name[h->n++] = name;
}

void obx__headers_build(const obx__msg *m, obx__headers *h) {
    const obx__envelope *e = m->env;
    h->n = 0;
    put(h, OBX__H_EVENT_ID, "%s", e->event_id);
    put(h, OBX__H_ENVELOPE_GEN, "%d", (int)e->envelope_gen);
    put(h, OBX__H_ATTEMPT_ID, "%s", m->attempt_id);
    put(h, OBX__H_ATTEMPT_GEN, "%d", (int)m->attempt_gen);
    put(h, OBX__H_PAYLOAD_DIGEST, "%s", e->payload_digest);
    put(h, OBX__H_DEST_DIGEST, "%s", m->dest_digest);
    put(h, OBX__H_EVENT_TYPE, "%s", e->event_type);
    put(h, OBX__H_TENANT, "%s", e->tenant);
    put(h, OBX__H_AGGREGATE, "%s/%s@%lld", e->aggregate_type, e->aggregate_id,
        (long long)e->aggregate_version);
    put(h, OBX__H_OCCURRED_AT, "%lld", (long long)e->occurred_at);
    put(h, OBX__H_PAYLOAD_SCHEMA, "%s", e->payload_schema);
    if (e->correlation_id[0]) put(h, OBX__H_CORRELATION_ID, "%s", e->correlation_id);
    if (e->causation_id[0]) put(h, OBX__H_CAUSATION_ID, "%s", e->causation_id);
    if (e->traceparent[0]) put(h, OBX__H_TRACEPARENT, "%s", e->traceparent);
    if (m->dest && m->dest->serializer[0]) put(h, OBX__H_CONTENT_TYPE, "%s", m->dest->serializer);
    if (m->enc_key && m->enc_key[0]) put(h, OBX__H_ENCRYPTION, "%s", m->enc_key);
}

static obx_err hfail(obx__delivery *d, const char *fmt, ...) OBX__PRINTF(2, 3);
static obx_err hfail(obx__delivery *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->header_error, sizeof d->header_error, fmt, ap);
    va_end(ap);
    return obx__fail(OBX_EINVAL, "message headers: %s", d->header_error);
}

/* Copies header `name` into out (cap bytes) after checking it with the field rules. */
static obx_err take(obx__header_get_fn get, void *user, obx__delivery *d, const char *name,
                    char *out, size_t cap, size_t min, obx__charset cs) {
    size_t len = 0;
    const char *v = get(user, name, &len);
    if (!v) {
        if (min == 0) {
            out[0] = '\0';
            return OBX_OK;
        }
        return hfail(d, "%s: missing", name);
    }
    if (len >= cap) return hfail(d, "%s: %zu bytes, over the limit of %zu", name, len, cap - 1);
    if (memchr(v, '\0', len)) return hfail(d, "%s: contains a NUL byte", name);
    char tmp[1024];
    memcpy(tmp, v, len);
    tmp[len] = '\0';
    if (obx__check_field(name, tmp, min, cap - 1, cs)) return hfail(d, "%s", obx_errmsg());
    memcpy(out, tmp, len + 1);
    return OBX_OK;
}

static obx_err take_i64(obx__header_get_fn get, void *user, obx__delivery *d, const char *name,
                        int64_t *out, bool required, int64_t min, int64_t max) {
    char tmp[32];
    obx_err e = take(get, user, d, name, tmp, sizeof tmp, required ? 1 : 0, OBX__CS_NAME);
    if (e) return e;
    if (!tmp[0]) {
        *out = 0;
        return OBX_OK;
    }
    char *end;
    errno = 0;
    long long v = strtoll(tmp, &end, 10);
    if (*end || errno || v < min || v > max)
        return hfail(d, "%s: '%s' is not an integer in %lld..%lld", name, tmp, (long long)min,
                     (long long)max);
    *out = v;
    return OBX_OK;
}

obx_err obx__headers_parse(obx__header_get_fn get, void *user, obx__delivery *d) {
    obx__envelope *e = &d->env;
    int64_t gen = 0, ts = 0;
    obx_err r;
    d->header_error[0] = '\0';
    if ((r = take(get, user, d, OBX__H_EVENT_ID, e->event_id, sizeof e->event_id, 1, OBX__CS_NAME)))
        return r;
    if (obx_event_id_check(e->event_id)) return hfail(d, "%s", obx_errmsg());
    if ((r = take_i64(get, user, d, OBX__H_ENVELOPE_GEN, &gen, true, 1, INT32_MAX))) return r;
    e->envelope_gen = (int32_t)gen;
    if ((r = take(get, user, d, OBX__H_ATTEMPT_ID, d->attempt_id, sizeof d->attempt_id, 1,
                  OBX__CS_NAME)) ||
        (r = take(get, user, d, OBX__H_PAYLOAD_DIGEST, e->payload_digest, sizeof e->payload_digest,
                  1, OBX__CS_OWNER)) ||
        (r = take(get, user, d, OBX__H_DEST_DIGEST, d->dest_digest, sizeof d->dest_digest, 1,
                  OBX__CS_OWNER)) ||
        (r = take(get, user, d, OBX__H_EVENT_TYPE, e->event_type, sizeof e->event_type, 1,
                  OBX__CS_EVENT_TYPE)) ||
        (r = take(get, user, d, OBX__H_TENANT, e->tenant, sizeof e->tenant, 1, OBX__CS_NAME)) ||
        (r = take(get, user, d, OBX__H_CORRELATION_ID, e->correlation_id, sizeof e->correlation_id,
                  0, OBX__CS_TEXT)) ||
        (r = take(get, user, d, OBX__H_CAUSATION_ID, e->causation_id, sizeof e->causation_id, 0,
                  OBX__CS_TEXT)) ||
        (r = take(get, user, d, OBX__H_TRACEPARENT, e->traceparent, sizeof e->traceparent, 0,
                  OBX__CS_NAME)) ||
        (r = take(get, user, d, OBX__H_PAYLOAD_SCHEMA, e->payload_schema, sizeof e->payload_schema,
                  0, OBX__CS_OWNER)) ||
        (r = take_i64(get, user, d, OBX__H_OCCURRED_AT, &ts, false, 0, ((int64_t)1 << 48) - 1)) ||
        (r = take(get, user, d, OBX__H_ENCRYPTION, d->enc_key, sizeof d->enc_key, 0, OBX__CS_NAME)))
        return r;
    e->occurred_at = ts;
    if (!obx__is_digest(e->payload_digest))
        return hfail(d, "%s: not a sha256 digest", OBX__H_PAYLOAD_DIGEST);
    if (!obx__is_digest(d->dest_digest))
        return hfail(d, "%s: not a sha256 digest", OBX__H_DEST_DIGEST);
    if (e->payload_schema[0] && !obx__is_digest(e->payload_schema))
        return hfail(d, "%s: not a sha256 digest", OBX__H_PAYLOAD_SCHEMA);
    char agg[OBX_NAME_MAX + OBX_KEY_MAX + 32];
    if ((r = take(get, user, d, OBX__H_AGGREGATE, agg, sizeof agg, 0, OBX__CS_TEXT))) return r;
    if (agg[0]) {
        /* "type/id@version": the type has no '/', the version is the digits after the last
         * '@'; each part obeys the producer's rules (fuzz_headers found a type with any
         * text in it passing through to the handler) */
        char *slash = strchr(agg, '/'), *at = strrchr(agg, '@');
        if (!slash || !at || at < slash)
            return hfail(d, "%s: not type/id@version", OBX__H_AGGREGATE);
        *slash = '\0';
        *at = '\0';
        bool digits = at[1] != '\0';
        for (const char *p = at + 1; digits && *p; p++) digits = *p >= '0' && *p <= '9';
        errno = 0;
        long long ver = digits ? strtoll(at + 1, NULL, 10) : -1;
        if (!digits || errno)
            return hfail(d, "%s: the version after '@' is not a decimal number in 0..2^63-1",
                         OBX__H_AGGREGATE);
        if (obx__check_field("aggregate type", agg, 1, OBX_NAME_MAX, OBX__CS_NAME) ||
            obx__check_field("aggregate id", slash + 1, 1, OBX_KEY_MAX, OBX__CS_TEXT))
            return hfail(d, "%s: %s", OBX__H_AGGREGATE, obx_errmsg());
        obx__strlcpy(e->aggregate_type, agg, sizeof e->aggregate_type);
        obx__strlcpy(e->aggregate_id, slash + 1, sizeof e->aggregate_id);
        e->aggregate_version = ver;
    }
    return OBX_OK;
}

/* ---- partitioners --------------------------------------------------------------------------- */

uint32_t obx__murmur2(const void *key, size_t len) {
    const unsigned char *data = key;
    const uint32_t m = 0x5bd1e995;
    const int r = 24;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    size_t len4 = len / 4;
    for (size_t i = 0; i < len4; i++) {
        size_t i4 = i * 4;
        uint32_t k = (uint32_t)data[i4] | ((uint32_t)data[i4 + 1] << 8) |
                     ((uint32_t)data[i4 + 2] << 16) | ((uint32_t)data[i4 + 3] << 24);
        k *= m;
        k ^= k >> r;
        k *= m;
        h *= m;
        h ^= k;
    }
    size_t tail = len & ~(size_t)3;
    switch (len % 4) {
    case 3: h ^= (uint32_t)data[tail + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[tail + 1] << 8;  /* fall through */
    case 1: h ^= (uint32_t)data[tail]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

int32_t obx__partition(const char *algorithm, const char *key, int32_t n) {
    if (n <= 1) return 0;
    size_t len = strlen(key);
    if (!strcmp(algorithm, "murmur2"))
        return (int32_t)((obx__murmur2(key, len) & 0x7fffffff) % (uint32_t)n);
    if (!strcmp(algorithm, "fnv1a")) {
        uint32_t h = 0x811c9dc5u;
        for (size_t i = 0; i < len; i++) {
            h ^= (unsigned char)key[i];
            h *= 0x01000193u;
        }
        return (int32_t)((h & 0x7fffffff) % (uint32_t)n);
    }
    return 0; /* "none": one partition */
}

#ifndef OBX_WITH_KAFKA
/* Builds without Kafka: the public mock API exists and says so. */
obx_err obx_kafka_mock_start(int brokers, const char *topic, int partitions, char *bootstraps,
                             size_t cap, obx_kafka_mock **out) {
    (void)brokers;
    (void)topic;
    (void)partitions;
    (void)bootstraps;
    (void)cap;
    if (out) *out = NULL;
    return obx__fail(OBX_EUNSUPPORTED, "this build has no Kafka backend");
}

void obx_kafka_mock_stop(obx_kafka_mock *m) { (void)m; }
#endif

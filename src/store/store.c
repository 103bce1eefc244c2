/*
 * store.c — the engine's only way into a store backend: argument checks, the backend
 * registry, row-set helpers, and fault injection (fail the k-th call, for the fault loops of
 * the hardening suite). Also the public obx_store_* entry points.
 */
#include "store/store.h"

#include <openssl/crypto.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static long fault_at;         /* 0: off */
static int fault_sticky;      /* fail every call from fault_at on */
static long call_count;       /* calls through the wrappers, process-wide */
static const char *fault_hit; /* the wrapper the armed fault failed first (a literal) */

void obx__st_fault_after(long k) {
    __atomic_store_n(&fault_hit, NULL, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fault_sticky, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&fault_at, k, __ATOMIC_SEQ_CST);
    __atomic_store_n(&call_count, 0, __ATOMIC_SEQ_CST);
}

void obx__st_fault_from(long k) {
    obx__st_fault_after(k);
    __atomic_store_n(&fault_sticky, 1, __ATOMIC_SEQ_CST);
}

long obx__st_calls(void) { return __atomic_load_n(&call_count, __ATOMIC_SEQ_CST); }

const char *obx__st_fault_hit(void) { return __atomic_load_n(&fault_hit, __ATOMIC_SEQ_CST); }

static obx_err fault(const char *what) {
    long n = __atomic_add_fetch(&call_count, 1, __ATOMIC_SEQ_CST);
    long k = __atomic_load_n(&fault_at, __ATOMIC_SEQ_CST);
    if (k && (n == k || (n > k && __atomic_load_n(&fault_sticky, __ATOMIC_SEQ_CST)))) {
        if (n == k) __atomic_store_n(&fault_hit, what, __ATOMIC_SEQ_CST);
        return obx__fail(OBX_EIO, "injected store fault at call %ld (%s)", n, what);
    }
    return OBX_OK;
}

#define FAULT(what)                                                                                \
    do {                                                                                           \
        obx_err fe_ = fault(what);                                                                 \
        if (fe_) return fe_;                                                                       \
    } while (0)

const char *obx__receipt_kind_name(obx__receipt_kind k) {
    static const char *const n[] = {"PRIMARY", "DUPLICATE", "QUARANTINED", "MIGRATION"};
    return (unsigned)k < 4 ? n[k] : "?";
}

static const char *const source_names[OBX__RS_COUNT] = {"broker", "lookup", "consumer", "operator",
                                                        "asserted"};

const char *obx__receipt_source_name(obx__receipt_source k) {
    return (unsigned)k < OBX__RS_COUNT ? source_names[k] : "?";
}

obx__receipt_source obx__receipt_source_parse(const char *s) {
    for (int i = 0; s && i < OBX__RS_COUNT; i++)
        if (!strcmp(s, source_names[i])) return (obx__receipt_source)i;
    return OBX__RS_COUNT;
}

void obx__poison_rows_free(obx__poison_row *rows, size_t n) {
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].headers_json);
        free(rows[i].payload);
    }
    free(rows);
}

void obx__retry_copy_rows_free(obx__retry_copy_row *rows, size_t n) {
    for (size_t i = 0; rows && i < n; i++) {
        free(rows[i].headers_json);
        free(rows[i].payload);
    }
    free(rows);
}

obx_err obx__poison_digest(const void *payload, size_t len, char out[OBX_DIGEST_LEN + 1]) {
    return obx_sha256_digest(payload ? payload : "", payload ? len : 0, out);
}

void obx__series_rows_free(obx__series_row *rows, size_t n) {
    for (size_t i = 0; rows && i < n; i++) free(rows[i].sample);
    free(rows);
}

const char *obx__wire_id(const obx__event_row *r) {
    return r->logical_id[0] ? r->logical_id : r->env.event_id;
}

void obx__rows_free(obx__rows *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free(r->v[i].payload);
    free(r->v);
    r->v = NULL;
    r->n = r->cap = 0;
}

obx__event_row *obx__rows_push(obx__rows *r) {
    if (r->n == r->cap) {
        size_t c = r->cap ? r->cap * 2 : 16;
        obx__event_row *p = realloc(r->v, c * sizeof *p);
        if (!p) return NULL;
        r->v = p;
        r->cap = c;
    }
    obx__event_row *row = &r->v[r->n++];
    memset(row, 0, sizeof *row);
    return row;
}

const obx__store_methods *obx__store_backend(obx__url_scheme scheme) {
    switch (scheme) {
    case OBX__URL_SQLITE: return &obx__sqlite_store_methods;
#ifdef OBX_WITH_POSTGRES
    case OBX__URL_POSTGRES: return &obx__pg_store_methods;
#endif
    default: return NULL;
    }
}

/* every method has one entry in the lists of store.h: a method added to the struct without a
 * wrapper changes its size and stops the build here */
#define ONE_(...) +1
enum {
    N_METHODS_ = 0 OBX__STORE_FORWARD(ONE_) OBX__STORE_OPTIONAL(ONE_) OBX__STORE_CUSTOM(ONE_)
        OBX__STORE_OPTIONAL_CUSTOM(ONE_),
    N_INBOX_ = 0 OBX__STORE_INBOX_FORWARD(ONE_),
    N_READ_ = 0 OBX__STORE_READ_FORWARD(ONE_) OBX__STORE_READ_CUSTOM(ONE_)
};
#define FN_ sizeof(void (*)(void))
_Static_assert(sizeof(obx__store_methods) ==
                   offsetof(obx__store_methods, open) + (N_METHODS_ + 2) * FN_,
               "every store method needs an entry in OBX__STORE_FORWARD/OPTIONAL/CUSTOM");
_Static_assert(sizeof(obx__store_inbox_methods) ==
                   offsetof(obx__store_inbox_methods, inbox_get) + N_INBOX_ * FN_,
               "every inbox method needs an entry in OBX__STORE_INBOX_FORWARD");
_Static_assert(sizeof(obx__store_read_methods) ==
                   offsetof(obx__store_read_methods, counter_get) + N_READ_ * FN_,
               "every read-model method needs an entry in OBX__STORE_READ_FORWARD/CUSTOM");

static obx_err missing(const obx__store_methods *m, const char *method) {
    return obx__fail(OBX_EINTERNAL, "store backend %s: the method %s is missing", m->name, method);
}

static obx_err check_methods(const obx__store_methods *m) {
    if (m->version != OBX__STORE_METHODS_VERSION)
        return obx__fail(OBX_EINTERNAL, "store backend %s: methods version %d, expected %d",
                         m->name, m->version, OBX__STORE_METHODS_VERSION);
    if (!m->inbox || m->inbox->version != OBX__STORE_INBOX_VERSION)
        return obx__fail(OBX_EINTERNAL, "store backend %s: no inbox table of version %d", m->name,
                         OBX__STORE_INBOX_VERSION);
    if (!m->read || m->read->version != OBX__STORE_READ_VERSION)
        return obx__fail(OBX_EINTERNAL, "store backend %s: no read-model table of version %d",
                         m->name, OBX__STORE_READ_VERSION);
        /* refuse a backend with a missing callback rather than crash later; the capabilities
         * (OBX__STORE_OPTIONAL, OBX__STORE_OPTIONAL_CUSTOM) may be NULL */
#define REQUIRED_(name, ...)                                                                       \
    if (!m->name) return missing(m, #name);
    OBX__STORE_FORWARD(REQUIRED_)
#undef REQUIRED_
#define REQUIRED_(name)                                                                            \
    if (!m->name) return missing(m, #name);
    OBX__STORE_CUSTOM(REQUIRED_)
#undef REQUIRED_
#define REQUIRED_(name, ...)                                                                       \
    if (!m->inbox->name) return missing(m, #name);
    OBX__STORE_INBOX_FORWARD(REQUIRED_)
#undef REQUIRED_
#define REQUIRED_(name, ...)                                                                       \
    if (!m->read->name) return missing(m, #name);
    OBX__STORE_READ_FORWARD(REQUIRED_)
    OBX__STORE_READ_CUSTOM(REQUIRED_)
#undef REQUIRED_
    return OBX_OK;
}

/* ---- generated wrappers (the lists in store.h) ---------------------------------------------- */

#define FORWARD_(name, params, args)                                                               \
    obx_err obx__st_##name params {                                                                \
        if (!s) return obx__fail(OBX_EINTERNAL, #name ": store NULL");                             \
        FAULT(#name);                                                                              \
        return s->m->name args;                                                                    \
    }
OBX__STORE_FORWARD(FORWARD_)
#undef FORWARD_

#define FORWARD_TO_(table, name, params, args)                                                     \
    obx_err obx__st_##name params {                                                                \
        if (!s) return obx__fail(OBX_EINTERNAL, #name ": store NULL");                             \
        FAULT(#name);                                                                              \
        return s->m->table->name args;                                                             \
    }
#define INBOX_(name, params, args) FORWARD_TO_(inbox, name, params, args)
#define READ_(name, params, args) FORWARD_TO_(read, name, params, args)
OBX__STORE_INBOX_FORWARD(INBOX_)
OBX__STORE_READ_FORWARD(READ_)
#undef INBOX_
#undef READ_
#undef FORWARD_TO_

#define OPTIONAL_(name, params, args)                                                              \
    bool obx__st_has_##name(const obx__store *s) { return s && s->m->name; }                       \
    obx_err obx__st_##name params {                                                                \
        if (!s) return obx__fail(OBX_EINTERNAL, #name ": store NULL");                             \
        if (!s->m->name)                                                                           \
            return obx__fail(OBX_EUNSUPPORTED, "the %s store has no " #name, obx__st_name(s));     \
        FAULT(#name);                                                                              \
        return s->m->name args;                                                                    \
    }
OBX__STORE_OPTIONAL(OPTIONAL_)
#undef OPTIONAL_

const char *obx__st_name(const obx__store *s) { return s ? s->m->name : "?"; }

void obx__st_serve_dispatch(obx__store *s) {
    if (s && s->m->serve_dispatch) s->m->serve_dispatch(s);
}

obx_err obx__st_open(const char *url, obx__store **out) { return obx__st_open_with(url, 0, out); }

obx_err obx__st_open_with(const char *url, unsigned flags, obx__store **out) {
    /* ${NAME} / ${file:PATH} references are expanded here, at the connection, and nowhere
     * else: the handle keeps the URL as given (redacted), never the secret */
    char *x = NULL;
    obx_err e = obx__secret_expand(url, true, &x);
    if (e) return obx__fail_prefix(e, "store URL");
    obx__url u;
    e = obx__url_parse(x, "store", &u);
    if (!e && (flags & ~OBX_STORE_READ_ONLY))
        e = obx__fail(OBX_EINVAL, "flags: unknown bits %#x", flags & ~OBX_STORE_READ_ONLY);
    u.read_only = (flags & OBX_STORE_READ_ONLY) != 0;
    const obx__store_methods *m = e ? NULL : obx__store_backend(u.scheme);
    if (!e && !m) e = obx__fail(OBX_EUNSUPPORTED, "store URL: this build has no backend for it");
    if (!e) e = check_methods(m);
    if (!e) e = m->open(&u, out);
    obx__secret_free(x);
    OPENSSL_cleanse(&u, sizeof u);
    if (e) return e;
    char *red = NULL;
    if (obx_url_redact(url, &red) == OBX_OK) {
        obx__strlcpy((*out)->url_redacted, red, sizeof(*out)->url_redacted);
        free(red);
    }
    (*out)->payload_limit = OBX_PAYLOAD_DEFAULT_LIMIT;
    return OBX_OK;
}

void obx__st_close(obx__store *s) {
    if (!s) return;
    free(s->routes); /* one allocation (enqueue.c) */
    s->routes = NULL;
    s->m->close(s);
}

obx_err obx__st_begin(obx__store *s) {
    FAULT("begin");
    obx_err e = s->m->begin(s);
    if (!e) s->tx_depth++;
    return e;
}

obx_err obx__st_commit(obx__store *s) {
    if (s->tx_depth > 0) s->tx_depth--;
    if (s->fail_commits > 0) {
        s->fail_commits--;
        s->m->rollback(s);
        return obx__fail(OBX_EIO, "injected commit failure (the transaction rolled back)");
    }
    obx_err f = fault("commit");
    if (f) {
        s->m->rollback(s);
        return f;
    }
    return s->m->commit(s);
}

obx_err obx__st_rollback(obx__store *s) {
    if (s->tx_depth > 0) s->tx_depth--;
    return s->m->rollback(s);
}

/* The request names a known selector and carries what that selector reads. */
static obx_err check_read(const obx__read_req *req) {
    const void *need = NULL;
    switch (req->by) {
    case OBX__READ_IDS: need = req->ids || !req->n_ids ? (const void *)req : NULL; break;
    case OBX__READ_CLAIM: need = req->claim; break;
    case OBX__READ_SELECT: need = req->select; break;
    case OBX__READ_FILTER: need = req->filter; break;
    case OBX__READ_RETENTION: need = req->retention; break;
    case OBX__READ_CORRELATION:
        if (!req->limit) return obx__fail(OBX_EINTERNAL, "read_events: correlation limit 0");
        need = req->correlation_id;
        break;
    default: return obx__fail(OBX_EINTERNAL, "read_events: unknown selector %d", (int)req->by);
    }
    if (!need)
        return obx__fail(OBX_EINTERNAL, "read_events: selector %d without its request",
                         (int)req->by);
    const obx__retention_req *rt = req->by == OBX__READ_RETENTION ? req->retention : NULL;
    if (rt && rt->state != OBX__ST_PUBLISHED && rt->state != OBX__ST_RETAINED)
        return obx__fail(OBX_EINTERNAL, "retention candidates: state %s is not PUBLISHED/RETAINED",
                         obx__state_name(rt->state));
    if (rt && !rt->limit) return obx__fail(OBX_EINTERNAL, "retention candidates: limit 0");
    return OBX_OK;
}

obx_err obx__st_read_events(obx__store *s, const obx__read_req *req, obx__rows *out) {
    if (!s) return obx__fail(OBX_EINTERNAL, "read_events: store NULL");
    FAULT("read_events");
    obx_err e = check_read(req);
    if (e) return e;
    if (req->by == OBX__READ_IDS && !req->n_ids) return OBX_OK;
    return s->m->read_events(s, req, out);
}

obx_err obx__st_load_events(obx__store *s, const char *const *ids, size_t n, unsigned flags,
                            obx__rows *out) {
    return obx__st_read_events(
        s, &(obx__read_req){.by = OBX__READ_IDS, .ids = ids, .n_ids = n, .flags = flags}, out);
}

void obx__event_cols_of(const obx__event_row *r, obx__event_cols *out) {
    out->state = r->state;
    out->envelope_gen = r->envelope_gen;
    out->attempt_gen = r->attempt_gen;
    out->pinned_partition = r->pinned_partition;
    out->rejections = r->rejections;
    out->claim_gen = r->claim_gen;
    out->lease_until = r->lease_until;
    out->available_at = r->available_at;
    out->next_check_at = r->next_check_at;
    out->unknown_since = r->unknown_since;
    out->published_at = r->published_at;
    out->updated_at = r->updated_at;
    out->held_at = r->held_at;
    obx__strlcpy(out->owner, r->owner, sizeof out->owner);
    obx__strlcpy(out->attempt_id, r->attempt_id, sizeof out->attempt_id);
    obx__strlcpy(out->primary_attempt_id, r->primary_attempt_id, sizeof out->primary_attempt_id);
    obx__strlcpy(out->cluster, r->dest.cluster, sizeof out->cluster);
    obx__strlcpy(out->topic, r->dest.topic, sizeof out->topic);
    obx__strlcpy(out->routing_key, r->dest.routing_key, sizeof out->routing_key);
}

uint32_t obx__event_cols_same(const obx__event_cols *a, const obx__event_row *b) {
    uint32_t m = 0;
#define SAME(bit, eq) m |= (eq) ? (uint32_t)OBX__EVC_##bit : 0u
    SAME(ENVELOPE_GEN, a->envelope_gen == b->envelope_gen);
    SAME(STATE, a->state == b->state);
    SAME(CLAIM_GEN, a->claim_gen == b->claim_gen);
    SAME(OWNER, !strcmp(a->owner, b->owner));
    SAME(LEASE_UNTIL, a->lease_until == b->lease_until);
    SAME(ATTEMPT_GEN, a->attempt_gen == b->attempt_gen);
    SAME(ATTEMPT_ID, !strcmp(a->attempt_id, b->attempt_id));
    SAME(PINNED_PARTITION, a->pinned_partition == b->pinned_partition);
    SAME(REJECTIONS, a->rejections == b->rejections);
    SAME(AVAILABLE_AT, a->available_at == b->available_at);
    SAME(NEXT_CHECK_AT, a->next_check_at == b->next_check_at);
    SAME(UNKNOWN_SINCE, a->unknown_since == b->unknown_since);
    SAME(PRIMARY_ATTEMPT_ID, !strcmp(a->primary_attempt_id, b->primary_attempt_id));
    SAME(PUBLISHED_AT, a->published_at == b->published_at);
    SAME(UPDATED_AT, a->updated_at == b->updated_at);
    SAME(ORDER_KEY, !strcmp(a->cluster, b->dest.cluster) && !strcmp(a->topic, b->dest.topic) &&
                        !strcmp(a->routing_key, b->dest.routing_key));
    SAME(DEST_CLUSTER, !strcmp(a->cluster, b->dest.cluster));
    SAME(HELD_AT, a->held_at == b->held_at);
#undef SAME
    return m;
}

uint32_t obx__event_same(const obx__event_row *a, const obx__event_row *b) {
    obx__event_cols c;
    obx__event_cols_of(a, &c);
    return obx__event_cols_same(&c, b);
}

static obx_err check_updates(const obx__event_update *u, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (u[i].row->state >= OBX__ST_COUNT || u[i].row->state == OBX__ST_NONE)
            return obx__fail(OBX_EINTERNAL, "update_events: invalid target state");
    return OBX_OK;
}

static obx_err check_audit(const obx__audit_row *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i].from != a[i].to && a[i].to != OBX__ST_NONE &&
            !obx__transition_allowed(a[i].from, a[i].to, a[i].actor))
            return obx__fail(OBX_EINTERNAL, "audit: transition %s -> %s by %s is not in the table",
                             obx__state_name(a[i].from), obx__state_name(a[i].to),
                             obx__actor_name(a[i].actor));
    return OBX_OK;
}

obx_err obx__st_update_events(obx__store *s, const obx__event_update *u, size_t n, bool *applied) {
    FAULT("update_events");
    obx_err e = check_updates(u, n);
    if (e) return e;
    return n ? s->m->update_events(s, u, n, applied) : OBX_OK;
}

obx_err obx__st_insert_attempts(obx__store *s, const obx__attempt_row *a, size_t n) {
    FAULT("insert_attempts");
    return n ? s->m->insert_attempts(s, a, n) : OBX_OK;
}

obx_err obx__st_update_attempts(obx__store *s, const obx__attempt_row *a, size_t n) {
    FAULT("update_attempts");
    return n ? s->m->update_attempts(s, a, n) : OBX_OK;
}

obx_err obx__st_load_attempts(obx__store *s, const char *const *ids, size_t n, const char *event_id,
                              obx__attempt_row **out, size_t *n_out) {
    FAULT("load_attempts");
    if (!event_id && !n) {
        *out = NULL;
        *n_out = 0;
        return OBX_OK;
    }
    return s->m->load_attempts(s, ids, n, event_id, out, n_out);
}

obx_err obx__st_insert_receipts(obx__store *s, const obx__receipt_row *r, size_t n) {
    FAULT("insert_receipts");
    return n ? s->m->insert_receipts(s, r, n) : OBX_OK;
}

obx_err obx__st_insert_audit(obx__store *s, const obx__audit_row *a, size_t n) {
    FAULT("insert_audit");
    obx_err e = check_audit(a, n);
    if (e) return e;
    return n ? s->m->insert_audit(s, a, n) : OBX_OK;
}

obx_err obx__st_write_set(obx__store *s, const obx__write_set *w) {
    FAULT("update_events");
    obx_err e = check_updates(w->upd, w->n_upd);
    if (e) return e;
    FAULT("insert_attempts");
    FAULT("update_attempts");
    FAULT("insert_receipts");
    FAULT("insert_audit");
    if ((e = check_audit(w->au, w->n_au))) return e;
    if (!(w->n_upd || w->n_att_new || w->n_att || w->n_rc || w->n_au)) return OBX_OK;
    return s->m->write_set(s, w);
}

obx_err obx__st_load_slots(obx__store *s, const char *const *attempt_ids,
                           const char *const *event_ids, size_t n, unsigned flags,
                           obx__attempt_row **att, size_t *n_att, obx__rows *ev) {
    FAULT("load_attempts");
    FAULT("read_events");
    *att = NULL;
    *n_att = 0;
    if (!n) return OBX_OK;
    return s->m->load_slots(s, attempt_ids, event_ids, n, flags, att, n_att, ev);
}

obx_err obx__st_purge_payloads(obx__store *s, const char *const *ids, size_t n, int64_t *bytes) {
    FAULT("purge_payloads");
    if (bytes) *bytes = 0;
    return n ? s->m->purge_payloads(s, ids, n, bytes) : OBX_OK;
}

obx_err obx__st_aged(obx__store *s, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                     obx__aged_count *count) {
    FAULT("aged");
    *out = NULL;
    *n = 0;
    if (count) memset(count, 0, sizeof *count);
    if ((unsigned)req->kind >= OBX__AGED_COUNT)
        return obx__fail(OBX_EINTERNAL, "aged: unknown kind %d", (int)req->kind);
    if (req->kind == OBX__AGED_INBOX_QUARANTINED && !req->consumer)
        return obx__fail(OBX_EINTERNAL, "aged: inbox quarantines need a consumer");
    return s->m->read->aged(s, req, out, n, count);
}

obx_err obx__st_delivery_put(obx__store *s, const obx__delivery_row *d) {
    FAULT("delivery_put");
    if (d->n < 1 || d->n > OBX__SET_MAX)
        return obx__fail(OBX_EINTERNAL, "delivery_put: %d targets", (int)d->n);
    return s->m->delivery_put(s, d);
}

obx_err obx__st_set_alias(obx__store *s, const char *const *ids, size_t n, const char *from,
                          const char *to, bool *applied) {
    FAULT("set_alias");
    return n ? s->m->set_alias(s, ids, n, from, to, applied) : OBX_OK;
}

/* ---- public handle API --------------------------------------------------------------------- */

obx_err obx_store_open(const char *url, obx_store **out) {
    return obx_store_open_with(url, 0, out);
}

obx_err obx_store_open_with(const char *url, unsigned flags, obx_store **out) {
    if (!out) return obx__fail(OBX_EINVAL, "out: NULL");
    *out = NULL;
    obx__clear_error();
    return obx__st_open_with(url, flags, out);
}

static obx_err wrap(const obx__store_methods *m, void *conn, const char *label, obx_store **out) {
    if (!out) return obx__fail(OBX_EINVAL, "out: NULL");
    *out = NULL;
    obx__clear_error();
    obx_err e = m->wrap(conn, out);
    if (e) return e;
    obx__strlcpy((*out)->url_redacted, label, sizeof(*out)->url_redacted);
    (*out)->payload_limit = OBX_PAYLOAD_DEFAULT_LIMIT;
    return OBX_OK;
}

obx_err obx_store_wrap_sqlite(void *db, obx_store **out) {
    return wrap(&obx__sqlite_store_methods, db, "sqlite:(caller's connection)", out);
}

obx_err obx_store_wrap_pg(void *conn, obx_store **out) {
#ifdef OBX_WITH_POSTGRES
    return wrap(&obx__pg_store_methods, conn, "postgres:(caller's connection)", out);
#else
    (void)conn;
    (void)out;
    return obx__fail(OBX_EUNSUPPORTED, "this build has no PostgreSQL backend");
#endif
}

void obx_store_close(obx_store *s) { obx__st_close(s); }

obx_err obx_store_init(obx_store *s) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    return s->m->migrate(s);
}

obx_err obx_store_schema_version(obx_store *s, int *found, int *known) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    int f = 0;
    obx_err e = s->m->schema_version(s, &f);
    if (e) return e;
    if (found) *found = f;
    if (known) *known = OBX__SCHEMA_VERSION;
    return OBX_OK;
}

obx_err obx_store_set_payload_limit(obx_store *s, size_t limit) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    if (limit < 1 || limit > (size_t)256 * 1024 * 1024)
        return obx__fail(OBX_EINVAL, "payload_limit: %zu outside 1..268435456 bytes", limit);
    s->payload_limit = limit;
    return OBX_OK;
}

const char *obx_store_url(const obx_store *s) { return s ? s->url_redacted : ""; }

obx_err obx_store_producer_body(obx_store *s, char *buf, size_t cap) {
    if (!s || !buf || !cap) return obx__fail(OBX_EINVAL, "store, buf and cap are required");
    buf[0] = '\0';
    obx__clear_error();
    return s->m->producer_body(s, buf, cap);
}

obx_err obx_store_create_roles(obx_store *s, const char *prefix) {
    if (!s) return obx__fail(OBX_EINVAL, "store: NULL");
    obx__clear_error();
    if (!s->m->create_roles)
        return obx__fail(OBX_EUNSUPPORTED, "the %s store has no database roles", s->m->name);
    obx_err e = obx__check_field("prefix", prefix, 1, 40, OBX__CS_NAME);
    if (e) return e;
    return s->m->create_roles(s, prefix);
}

int64_t obx__st_now_ms(obx__store *s) {
    int64_t t0 = obx__mono_ms(), server = 0;
    if (s && s->m->server_ms && !s->m->server_ms(s, &server))
        obx__ref_sync(server, t0, obx__mono_ms());
    obx__clear_error(); /* a failed read is not the command's error */
    return obx__ref_ms();
}

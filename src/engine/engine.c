/*
 * engine.c — what every engine step shares: configuration defaults, initialization (the
 * broker's cluster identity), the transaction runner (obx__engine_tx), the audit-row helper,
 * backoff with jitter, and the test-only mutation switch.
 */
#include "engine/engine_int.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#ifdef OBX_MUTATIONS
obx__mutation obx__active_mutation = OBX__MUT_NONE;
#endif

static const char *const mutation_names[] = {"none",
#define OBX__M(n, s) s,
                                             OBX__MUTATION_LIST(OBX__M)
#undef OBX__M
};

const char *obx__mutation_name(obx__mutation m) {
    return (unsigned)m < OBX__MUT_COUNT ? mutation_names[m] : "?";
}

obx_err obx__mutation_set(const char *name) {
    obx__mutation m = OBX__MUT_NONE;
    if (name && *name && strcmp(name, "none")) {
        m = OBX__MUT_COUNT;
        for (int i = 1; i < OBX__MUT_COUNT; i++)
            if (!strcmp(name, mutation_names[i])) m = (obx__mutation)i;
        if (m == OBX__MUT_COUNT) return obx__fail(OBX_EINVAL, "mutation: unknown name '%s'", name);
    }
#ifdef OBX_MUTATIONS
    obx__active_mutation = m;
    return OBX_OK;
#else
    if (m == OBX__MUT_NONE) return OBX_OK;
    return obx__fail(OBX_EUNSUPPORTED,
                     "mutation '%s': this build has no mutations "
                     "(configure with -DOBX_MUTATIONS=ON)",
                     name);
#endif
}

const char *obx__note_kind_name(obx__note_kind k) {
    static const char *const n[] = {"PUBLISHED", "DUPLICATE", "QUARANTINED", "UNKNOWN", "REJECTED",
                                    "NOT_SENT",  "PARKED",    "RETRY",       "HELD",    "RESOLVED"};
    return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "?";
}

void obx__engine_cfg_defaults(obx__engine_cfg *c) {
    memset(c, 0, sizeof *c);
    obx__strlcpy(c->owner, "obx", sizeof c->owner);
    c->lease_ms = 30000;
    c->reconcile_lease_ms = 30000;
    c->recheck_ms = 5000;
    c->recheck_max_ms = 300000;
    c->backoff_base_ms = 500;
    c->backoff_max_ms = 60000;
    c->batch = 256;
    c->own_cluster = true;
}

obx_err obx__engine_init(obx__engine *e, obx__store *s, obx__broker *b, const obx__engine_cfg *c) {
    memset(e, 0, sizeof *e);
    if (!s) return obx__fail(OBX_EINVAL, "engine: store is NULL");
    e->s = s;
    e->b = b;
    if (c)
        e->cfg = *c;
    else
        obx__engine_cfg_defaults(&e->cfg);
    obx_err err = obx__check_field("owner", e->cfg.owner, 1, OBX__OWNER_MAX, OBX__CS_OWNER);
    if (err) return err;
    if (e->cfg.lease_ms <= 0 || e->cfg.reconcile_lease_ms <= 0 || !e->cfg.batch)
        return obx__fail(OBX_EINVAL, "engine: lease_ms, reconcile_lease_ms and batch must be > 0");
    if (b && (err = obx__br_cluster_id(b, e->cluster, sizeof e->cluster))) return err;
    uint64_t seed = e->cfg.seed;
    if (!seed && getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = 0x9e3779b97f4a7c15ull;
    e->rng = seed | 1;
    /* Deterministic IDs (simulator, tests) must still differ between actors: two engines with
     * the same seed and clock would otherwise mint the same attempt IDs. Mix in the owner. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = e->cfg.owner; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    e->gen.seed = e->cfg.seed ? (e->cfg.seed ^ 0x5851f42d4c957f2dull ^ h) | 1 : 0;
    return OBX_OK;
}

uint64_t obx__engine_rand(obx__engine *e) {
    uint64_t x = e->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return e->rng = x;
}

int64_t obx__engine_backoff(obx__engine *e, int n) {
    int64_t d = e->cfg.backoff_base_ms;
    for (int i = 1; i < n && d < e->cfg.backoff_max_ms; i++) d *= 2;
    if (d > e->cfg.backoff_max_ms) d = e->cfg.backoff_max_ms;
    /* +-20% jitter so that many events rejected together do not retry in lockstep */
    int64_t span = d / 5;
    if (span > 0) d += (int64_t)(obx__engine_rand(e) % (uint64_t)(2 * span + 1)) - span;
    return d > 0 ? d : 1;
}

/* One transaction of fn (begin, fn, commit), retried up to five times while the failure is
 * retriable (a serialization failure, a lost connection); fn must be safe to run again. Every
 * step of every engine module runs its transactions through here. */
obx_err obx__engine_tx(obx__engine *e, obx__tx_fn fn, void *arg) {
    obx_err err = OBX_OK;
    for (int attempt = 0; attempt < 5; attempt++) {
        if ((err = obx__st_begin(e->s))) {
            if (obx_err_is_retriable(err)) continue;
            break;
        }
        err = fn(e, arg);
        if (err) {
            obx__st_rollback(e->s);
            if (obx_err_is_retriable(err)) continue;
            break;
        }
        err = obx__st_commit(e->s);
        if (!err || !obx_err_is_retriable(err)) break;
    }
    if (err) e->st.store_errors++;
    return err;
}

/* Serializes j (consumed) as indented JSON into *out (malloc'ed); the documents of the
 * route, report, resolve and takeover entry points. */
obx_err obx__json_out(json_t *j, char **out) {
    if (!j) return obx__fail(OBX_ENOMEM, "JSON: out of memory");
    char *txt = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!txt) return obx__fail(OBX_ENOMEM, "JSON: out of memory");
    /* json_dumps uses jansson's allocator (malloc by default): obx_free() is free() */
    *out = txt;
    return OBX_OK;
}

void obx__audit(obx__audit_row *a, int64_t now, obx__actor actor, const char *who,
                const obx__event_row *r, obx__state from, obx__state to, const char *fmt, ...) {
    memset(a, 0, sizeof *a);
    a->at = now;
    a->actor = actor;
    obx__strlcpy(a->who, who, sizeof a->who);
    obx__strlcpy(a->event_id, r->env.event_id, sizeof a->event_id);
    a->envelope_gen = r->envelope_gen;
    a->from = from;
    a->to = to;
    a->claim_gen = r->claim_gen;
    obx__strlcpy(a->attempt_id, r->attempt_id, sizeof a->attempt_id);
    a->attempt_gen = r->attempt_gen;
    a->seq = r->seq;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->reason, sizeof a->reason, fmt, ap);
    va_end(ap);
}

obx__event_row *obx__rows_find(obx__rows *r, const char *event_id) {
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].env.event_id, event_id)) return &r->v[i];
    return NULL;
}

static int id_ent_cmp(const void *a, const void *b) {
    const struct obx__id_ent *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

obx_err obx__id_index_build(obx__id_index *x, const void *rows, size_t n,
                            const char *(*id_at)(const void *rows, size_t i)) {
    x->n = 0;
    x->v = NULL;
    if (!n) return OBX_OK; /* qsort and malloc of nothing: nothing to find */
    if (!(x->v = malloc(n * sizeof *x->v)))
        return obx__fail(OBX_ENOMEM, "batch index: out of memory");
    for (size_t i = 0; i < n; i++) x->v[i] = (struct obx__id_ent){id_at(rows, i), i};
    x->n = n;
    qsort(x->v, n, sizeof *x->v, id_ent_cmp);
    return OBX_OK;
}

static const char *attempt_id_at(const void *rows, size_t i) {
    return ((const obx__attempt_row *)rows)[i].attempt_id;
}

static const char *event_id_at(const void *rows, size_t i) {
    return ((const obx__event_row *)rows)[i].env.event_id;
}

obx_err obx__id_index_attempts(obx__id_index *x, const obx__attempt_row *a, size_t n) {
    return obx__id_index_build(x, a, n, attempt_id_at);
}

obx_err obx__id_index_events(obx__id_index *x, const obx__rows *r) {
    return obx__id_index_build(x, r->v, r->n, event_id_at);
}

long obx__id_index_find(const obx__id_index *x, const char *id) {
    size_t lo = 0, hi = x->n; /* the first entry whose id is >= id */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(x->v[mid].id, id) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < x->n && !strcmp(x->v[lo].id, id) ? (long)x->v[lo].at : -1;
}

void obx__id_index_free(obx__id_index *x) {
    free(x->v);
    x->v = NULL;
    x->n = 0;
}

/* The arrays of update/insert rows for one transaction, with room for n_events copied event
 * updates (copies) or references (!copies). */
static obx_err batch_reserve(obx__batch *b, bool copies, size_t n_events, size_t n_attempts,
                             size_t n_receipts, size_t n_audit) {
    memset(b, 0, sizeof *b);
    /* upd, upd_rows and au are written whole before use (obx__batch_update copies the row,
     * obx__audit clears it): zeroing them here was 2% of a simulated trace */
    b->upd = malloc((n_events ? n_events : 1) * sizeof *b->upd);
    if (copies) b->upd_rows = malloc((n_events ? n_events : 1) * sizeof *b->upd_rows);
    b->applied = calloc(n_events ? n_events : 1, sizeof *b->applied);
    b->att = calloc(n_attempts ? n_attempts : 1, sizeof *b->att);
    b->att_new = calloc(n_attempts ? n_attempts : 1, sizeof *b->att_new);
    b->rc = calloc(n_receipts ? n_receipts : 1, sizeof *b->rc);
    b->au = malloc((n_audit ? n_audit : 1) * sizeof *b->au);
    if (!b->upd || (copies && !b->upd_rows) || !b->applied || !b->att || !b->att_new || !b->rc ||
        !b->au) {
        obx__batch_free(b);
        return obx__fail(OBX_ENOMEM, "engine: out of memory for a batch of %zu", n_events);
    }
    return OBX_OK;
}

obx_err obx__batch_reserve(obx__batch *b, size_t n_events, size_t n_attempts, size_t n_receipts,
                           size_t n_audit) {
    return batch_reserve(b, true, n_events, n_attempts, n_receipts, n_audit);
}

obx_err obx__batch_reserve_refs(obx__batch *b, size_t n_events, size_t n_attempts,
                                size_t n_receipts, size_t n_audit) {
    return batch_reserve(b, false, n_events, n_attempts, n_receipts, n_audit);
}

void obx__batch_free(obx__batch *b) {
    free(b->upd);
    free(b->upd_rows);
    free(b->applied);
    free(b->att);
    free(b->att_new);
    free(b->rc);
    free(b->au);
    memset(b, 0, sizeof *b);
}

/* Writes the batch: compare-and-set updates (all must apply, else OBX_ECONFLICT), attempts,
 * receipts, audit rows. Inside the caller's transaction. */
obx_err obx__batch_write(obx__store *s, obx__batch *b) {
    obx_err e;
    obx__write_set w = {.upd = b->upd,
                        .n_upd = b->n_upd,
                        .applied = b->applied,
                        .att_new = b->att_new,
                        .n_att_new = b->n_att_new,
                        .att = b->att,
                        .n_att = b->n_att,
                        .rc = b->rc,
                        .n_rc = b->n_rc,
                        .au = b->au,
                        .n_au = b->n_au};
    if ((e = obx__st_write_set(s, &w))) return e;
    for (size_t i = 0; i < b->n_upd; i++)
        if (!b->applied[i])
            return obx__fail(OBX_ECONFLICT, "event %s changed under a locked transaction",
                             b->upd[i].row->env.event_id);
    return OBX_OK;
}

static void add_update(obx__batch *b, obx__state state, int64_t claim_gen,
                       const obx__event_row *next, uint32_t same) {
    b->upd[b->n_upd].row = next;
    b->upd[b->n_upd].expect_state = state;
    b->upd[b->n_upd].expect_claim_gen = claim_gen;
    b->upd[b->n_upd].same = same;
    b->n_upd++;
}

/* Adds an update of row `cur` (as loaded) to the new values `next`, copied. */
void obx__batch_update(obx__batch *b, const obx__event_row *cur, const obx__event_row *next) {
    obx__event_row *r = &b->upd_rows[b->n_upd];
    *r = *next;
    r->payload = NULL; /* rows in a batch never own payloads */
    /* cur: loaded in this transaction */
    add_update(b, cur->state, cur->claim_gen, r, obx__event_same(cur, next));
}

/* Adds an update of the row loaded as `expect` to the new values `next`, which stays the
 * caller's until the write. */
void obx__batch_update_ref(obx__batch *b, const obx__cas *expect, const obx__event_row *next) {
    add_update(b, expect->state, expect->claim_gen, next, obx__event_cols_same(expect, next));
}

obx__cas *obx__cas_of(const obx__rows *r) {
    obx__cas *c = malloc((r->n ? r->n : 1) * sizeof *c);
    for (size_t i = 0; c && i < r->n; i++) obx__event_cols_of(&r->v[i], &c[i]);
    return c;
}

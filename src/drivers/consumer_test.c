/*
 * consumer_test.c — the consumer test kit (obx_consumer_test_run, `obx consumer-test`): replays
 * a consumer's handler, through the real inbox, against the deliveries an at-least-once broker
 * produces, and reports which it mishandles. obx's release rules (docs/operations.md) ask every
 * consumer to have these tests before release: duplicates, reordering, an old contract version and
 * poison messages (and the consumer rule: validate contract and tenant first).
 *
 * Every scenario runs in a fresh in-memory SQLite consumer database (the obx schema plus the
 * consumer's own tables from its setup hook) and ends with a snapshot of the consumer's
 * observable state — its tables and, through its snapshot hook, any effect outside them. The
 * baseline (each sample once, in order) gives the reference snapshot:
 *
 *   duplicate          each message delivered twice, and the first again at the end;
 *                      state must equal the baseline's
 *   lost-commit        each message's handler runs, then the kit fails the transaction before
 *                      the commit (a crash), and the message is delivered again: an effect
 *                      made outside the consumer's transaction shows up twice, an in-process
 *                      "already processed" set loses it; state must equal the baseline's
 *   reordering         messages in reverse order, failed ones redelivered after the rest (as
 *                      a broker would); state must equal the baseline's, nothing parked
 *   older-contract     a message of the previous contract version: applied when the consumer
 *                      declares that version, otherwise parked as poison with no effect
 *   foreign-tenant     a message of a tenant the consumer does not serve: parked, no effect
 *   poison             a message whose payload cannot be processed, between valid ones:
 *                      parked after the consumer's failure limit, no effect, and the valid
 *                      messages after it still applied
 */
#include "drivers/config.h"
#include "drivers/log.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FOREIGN_TENANT "obx-kit-foreign-tenant"
#define DEFAULT_POISON "\x01{\"not json"

typedef struct kit {
    const obx_consumer_test *t;
    const char *consumer;
    int max_failures;
    /* the samples as delivered (kit-owned copies of the message structs) */
    obx_message *s;
    size_t n;
    char (*ids)[OBX_EVENT_ID_LEN + 1];
    char (*digests)[OBX_DIGEST_LEN + 1];
    /* extra messages */
    char old_type[OBX_NAME_MAX + 1];
    char extra_ids[3][OBX_EVENT_ID_LEN + 1]; /* older contract, foreign tenant, poison */
    char poison_digest[OBX_DIGEST_LEN + 1];
    /* per scenario */
    sqlite3 *db;
    obx_store *store;
    obx_inbox *in;
    int64_t offset;
    bool crash_after_handler; /* lost-commit: fail the transaction after the handler ran */
    /* generated samples */
    char gen_payload[3][128];
    char gen_agg_id[32];
} kit;

/* ---- the consumer's database ------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every table that is not obx's, rows as text, sorted: the state a consumer's effects left. */
static obx_err dump_tables(sqlite3 *db, char **out) {
    obx__buf b = {0};
    sqlite3_stmt *tl = NULL;
    int rc = sqlite3_prepare_v2(db,
                                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT "
                                "LIKE 'obx\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite\\_%' ESCAPE "
                                "'\\' ORDER BY name",
                                -1, &tl, NULL);
    while (rc == SQLITE_OK && sqlite3_step(tl) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(tl, 0);
        char *sql = sqlite3_mprintf("SELECT * FROM \"%w\"", name);
        sqlite3_stmt *st = NULL;
        if (!sql || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
            sqlite3_free(sql);
            rc = SQLITE_ERROR;
            break;
        }
        sqlite3_free(sql);
        char **rows = NULL;
        size_t n = 0, cap = 0;
        while (sqlite3_step(st) == SQLITE_ROW) {
            obx__buf r = {0};
            for (int c = 0; c < sqlite3_column_count(st); c++) {
                if (c) obx__buf_puts(&r, " | ");
                int ty = sqlite3_column_type(st, c);
                if (ty == SQLITE_NULL)
                    obx__buf_puts(&r, "NULL");
                else if (ty == SQLITE_BLOB) {
                    const unsigned char *p = sqlite3_column_blob(st, c);
                    int len = sqlite3_column_bytes(st, c);
                    obx__buf_puts(&r, "x'");
                    for (int k = 0; k < len; k++) obx__buf_printf(&r, "%02x", p[k]);
                    obx__buf_puts(&r, "'");
                } else
                    obx__buf_puts(&r, (const char *)sqlite3_column_text(st, c));
            }
            obx__buf_put(&r, "", 1);
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                char **p = realloc(rows, cap * sizeof *p);
                if (!p) {
                    obx__buf_free(&r);
                    b.oom = true;
                    break;
                }
                rows = p;
            }
            rows[n++] = (char *)r.data;
        }
        sqlite3_finalize(st);
        if (n) qsort(rows, n, sizeof *rows, cmp_str);
        obx__buf_printf(&b, "table %s (%zu rows)\n", name, n);
        for (size_t i = 0; i < n; i++) {
            obx__buf_printf(&b, "  %s\n", rows[i] ? rows[i] : "");
            free(rows[i]);
        }
        free(rows);
    }
    sqlite3_finalize(tl);
    obx__buf_put(&b, "", 1);
    if (rc != SQLITE_OK || b.oom) {
        obx__buf_free(&b);
        return obx__fail(OBX_ESTORE, "consumer test: cannot read the consumer's tables: %s",
                         sqlite3_errmsg(db));
    }
    *out = (char *)b.data;
    return OBX_OK;
}

static obx_err snapshot(kit *k, char **out) {
    *out = NULL;
    if (k->t->snapshot) {
        obx_err e = k->t->snapshot(k->t->user, k->db, out);
        if (!e && !*out) e = obx__fail(OBX_EINVAL, "consumer test: snapshot returned no text");
        return e ? obx__fail_prefix(e, "consumer test: snapshot") : OBX_OK;
    }
    return dump_tables(k->db, out);
}

static void close_db(kit *k) {
    obx_inbox_close(k->in);
    obx_store_close(k->store);
    if (k->db) sqlite3_close(k->db);
    k->in = NULL;
    k->store = NULL;
    k->db = NULL;
}

static obx_err fresh_db(kit *k) {
    close_db(k);
    if (k->t->reset) k->t->reset(k->t->user);
    if (sqlite3_open(":memory:", &k->db) != SQLITE_OK)
        return obx__fail(OBX_ESTORE, "consumer test: cannot open an in-memory database");
    obx_err e = obx_store_wrap_sqlite(k->db, &k->store);
    if (!e) e = obx_store_init(k->store);
    if (!e && k->t->setup && (e = k->t->setup(k->t->user, k->db)))
        e = obx__fail_prefix(e, "consumer test: setup");
    obx_inbox_options o = {.consumer_id = k->consumer,
                           .event_types = k->t->event_types,
                           .n_event_types = k->t->n_event_types,
                           .tenants = k->t->tenants,
                           .n_tenants = k->t->n_tenants,
                           .max_failures = k->max_failures,
                           /* the kit replays at once: what it judges is the handler */
                           .retry_backoff_ms = -1};
    if (!e) e = obx_inbox_open(k->store, &o, &k->in);
    k->offset = 0;
    return e;
}

/* ---- deliveries ---------------------------------------------------------------------------- */

static obx_err crashing_handler(void *user, void *db, const obx_message *m, const char *key,
                                char *result, size_t cap) {
    kit *k = user;
    obx_err e = k->t->handler(k->t->user, db, m, key, result, cap);
    if (e) return e;
    return obx__fail(OBX_EIO, "consumer test: simulated crash after the handler, before commit");
}

/* One delivery through the inbox. */
static obx_err deliver(kit *k, const obx_message *m, bool redelivered, obx_inbox_result *r) {
    obx_message d = *m;
    d.redelivered = redelivered;
    d.offset = k->offset++;
    if (k->crash_after_handler) return obx_inbox_process(k->in, &d, crashing_handler, k, k->db, r);
    return obx_inbox_process(k->in, &d, k->t->handler, k->t->user, k->db, r);
}

/* Delivers until the inbox says to acknowledge, as a broker redelivers an unacknowledged
 * message; bounded by the failure limit (the inbox parks it at max_failures). */
static obx_err deliver_acked(kit *k, const obx_message *m, obx_inbox_result *r) {
    obx_err e = OBX_OK;
    for (int i = 0; i <= k->max_failures; i++) {
        if ((e = deliver(k, m, i > 0, r))) return e;
        if (r->ack) return OBX_OK;
    }
    return OBX_OK;
}

static const char *outcome_name(obx_inbox_outcome o) {
    switch (o) {
    case OBX_INBOX_APPLIED: return "APPLIED";
    case OBX_INBOX_DUPLICATE: return "DUPLICATE";
    case OBX_INBOX_QUARANTINED: return "QUARANTINED";
    case OBX_INBOX_FAILED: return "FAILED";
    case OBX_INBOX_POISONED: return "POISONED";
    case OBX_INBOX_DELAYED: return "DELAYED";
    }
    return "?";
}

/* ---- verdicts -------------------------------------------------------------------------------- */

typedef struct verdict {
    bool ok;
    char detail[768];
} verdict;

static void bad(verdict *v, const char *fmt, ...) OBX__PRINTF(2, 3);
static void bad(verdict *v, const char *fmt, ...) {
    if (!v->ok) return; /* the first finding explains it */
    v->ok = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->detail, sizeof v->detail, fmt, ap);
    va_end(ap);
}

/* The first line where two snapshots differ, for the report. */
static void differs(verdict *v, const char *what, const char *want, const char *got) {
    const char *a = want, *b = got;
    while (*a && *a == *b) {
        a++;
        b++;
    }
    while (a > want && a[-1] != '\n') {
        a--;
        b--;
    }
    size_t la = strcspn(a, "\n"), lb = strcspn(b, "\n");
    bad(v,
        "%s: the consumer's state differs from one in-order delivery: expected '%.*s', got "
        "'%.*s'",
        what, (int)(la > 160 ? 160 : la), a, (int)(lb > 160 ? 160 : lb), b);
}

static obx_err compare(kit *k, verdict *v, const char *what, const char *want) {
    char *got = NULL;
    obx_err e = snapshot(k, &got);
    if (e) return e;
    if (strcmp(want, got)) differs(v, what, want, got);
    free(got);
    return OBX_OK;
}

/* ---- scenarios --------------------------------------------------------------------------------
 */

static obx_err in_order(kit *k, verdict *v, const char *scenario) {
    for (size_t i = 0; i < k->n; i++) {
        obx_inbox_result r = {0};
        obx_err e = deliver_acked(k, &k->s[i], &r);
        if (e) return e;
        if (r.outcome != OBX_INBOX_APPLIED)
            bad(v, "%s: in-order delivery of sample %zu (%s) ended %s: %s", scenario, i + 1,
                k->s[i].event_id, outcome_name(r.outcome), r.detail);
    }
    return OBX_OK;
}

static obx_err sc_duplicate(kit *k, verdict *v, const char *ref) {
    obx_err e = fresh_db(k);
    for (size_t i = 0; !e && i < k->n; i++) {
        obx_inbox_result r = {0};
        if ((e = deliver_acked(k, &k->s[i], &r))) break;
        if ((e = deliver(k, &k->s[i], true, &r))) break;
        if (r.outcome != OBX_INBOX_DUPLICATE)
            bad(v, "the second delivery of %s ended %s, not DUPLICATE", k->s[i].event_id,
                outcome_name(r.outcome));
    }
    obx_inbox_result r = {0};
    if (!e) e = deliver(k, &k->s[0], true, &r); /* a late duplicate, after the others */
    if (!e && r.outcome != OBX_INBOX_DUPLICATE)
        bad(v, "a late redelivery of %s ended %s, not DUPLICATE", k->s[0].event_id,
            outcome_name(r.outcome));
    if (!e) e = compare(k, v, "after duplicated deliveries", ref);
    return e;
}

static obx_err sc_lost_commit(kit *k, verdict *v, const char *ref) {
    obx_err e = fresh_db(k);
    for (size_t i = 0; !e && i < k->n; i++) {
        obx_inbox_result r = {0};
        k->crash_after_handler = true;
        e = deliver(k, &k->s[i], false, &r);
        k->crash_after_handler = false;
        if (!e) e = deliver_acked(k, &k->s[i], &r);
        if (!e && r.outcome != OBX_INBOX_APPLIED)
            bad(v, "the redelivery of %s after a crash before its commit ended %s: %s",
                k->s[i].event_id, outcome_name(r.outcome), r.detail);
    }
    if (!e) e = compare(k, v, "after a crash between effect and commit and a redelivery", ref);
    if (!e && !v->ok) {
        char d[sizeof v->detail];
        snprintf(d, sizeof d,
                 "%s (an effect made outside the consumer's transaction is applied again; an "
                 "in-process 'already processed' set skips it)",
                 v->detail);
        memcpy(v->detail, d, sizeof d);
    }
    return e;
}

static obx_err sc_reordering(kit *k, verdict *v, const char *ref) {
    obx_err e = fresh_db(k);
    size_t *pending = calloc(k->n, sizeof *pending), np = 0;
    if (!pending) return obx__fail(OBX_ENOMEM, "consumer test: out of memory");
    for (size_t i = k->n; i-- > 0;) pending[np++] = i;
    /* rounds: deliver what is pending, keep what failed (in the order it failed) */
    for (int round = 0; !e && np && round <= k->max_failures; round++) {
        size_t keep = 0;
        for (size_t j = 0; !e && j < np; j++) {
            obx_inbox_result r = {0};
            if ((e = deliver(k, &k->s[pending[j]], round > 0, &r))) break;
            if (r.outcome == OBX_INBOX_POISONED)
                bad(v, "%s (sample %zu) was parked as poison after arriving out of order: %s",
                    k->s[pending[j]].event_id, pending[j] + 1, r.detail);
            else if (!r.ack)
                pending[keep++] = pending[j];
        }
        np = keep;
    }
    if (!e && np) bad(v, "%zu message(s) still unacknowledged after every redelivery round", np);
    free(pending);
    if (!e) e = compare(k, v, "after deliveries in reverse order", ref);
    return e;
}

static bool declared(const char *const *v, size_t n, const char *x) {
    for (size_t i = 0; i < n; i++)
        if (v && v[i] && !strcmp(v[i], x)) return true;
    return false;
}

/* A rejected message: parked as poison (visible to operators) and no effect. */
static obx_err expect_parked(kit *k, verdict *v, const obx_message *m, const char *what,
                             const char *ref, const char *hint) {
    obx_inbox_result r = {0};
    obx_err e = deliver_acked(k, m, &r);
    if (e) return e;
    if (r.outcome != OBX_INBOX_POISONED)
        bad(v, "%s %s ended %s, not parked as poison%s%s", what, m->event_id,
            outcome_name(r.outcome), *hint ? ": " : "", hint);
    return compare(k, v, what, ref);
}

static obx_err sc_older_contract(kit *k, verdict *v, const char *ref) {
    obx_err e = fresh_db(k);
    verdict base = {.ok = true};
    if (!e) e = in_order(k, &base, "older-contract");
    if (e) return e;
    obx_message m = k->s[k->n - 1];
    m.event_id = k->extra_ids[0];
    m.event_type = k->old_type;
    m.aggregate_version++;
    if (declared(k->t->event_types, k->t->n_event_types, k->old_type)) {
        obx_inbox_result r = {0};
        if ((e = deliver_acked(k, &m, &r))) return e;
        if (r.outcome != OBX_INBOX_APPLIED)
            bad(v, "declared contract %s: %s ended %s: %s", k->old_type, m.event_id,
                outcome_name(r.outcome), r.detail);
        return OBX_OK;
    }
    return expect_parked(k, v, &m, "a message of the undeclared older contract", ref,
                         k->t->n_event_types
                             ? ""
                             : "the consumer declares no contracts (event_types), so the inbox "
                               "lets every version through and the handler did not refuse it");
}

static obx_err sc_foreign_tenant(kit *k, verdict *v, const char *ref) {
    obx_err e = fresh_db(k);
    verdict base = {.ok = true};
    if (!e) e = in_order(k, &base, "foreign-tenant");
    if (e) return e;
    obx_message m = k->s[k->n - 1];
    m.event_id = k->extra_ids[1];
    m.tenant = FOREIGN_TENANT;
    m.aggregate_version++;
    return expect_parked(k, v, &m, "a message of tenant " FOREIGN_TENANT, ref,
                         k->t->n_tenants ? ""
                                         : "the consumer declares no tenants, so the inbox lets "
                                           "every tenant through and the handler did not refuse "
                                           "it");
}

static obx_err sc_poison(kit *k, verdict *v, const char *ref) {
    obx_err e = fresh_db(k);
    if (e) return e;
    obx_inbox_result r = {0};
    if ((e = deliver_acked(k, &k->s[0], &r))) return e;
    obx_message m = k->s[1];
    m.event_id = k->extra_ids[2];
    m.payload = k->t->poison_payload ? k->t->poison_payload : DEFAULT_POISON;
    m.payload_len = k->t->poison_payload ? k->t->poison_len : strlen(DEFAULT_POISON);
    m.payload_digest = k->poison_digest;
    if ((e = deliver_acked(k, &m, &r))) return e;
    if (r.outcome != OBX_INBOX_POISONED)
        bad(v, "the poison message %s ended %s, not parked after %d failures", m.event_id,
            outcome_name(r.outcome), k->max_failures);
    for (size_t i = 1; i < k->n; i++) {
        if ((e = deliver_acked(k, &k->s[i], &r))) return e;
        if (r.outcome != OBX_INBOX_APPLIED)
            bad(v, "sample %zu after the poison message ended %s: %s", i + 1,
                outcome_name(r.outcome), r.detail);
    }
    return compare(k, v, "after a poison message between valid ones", ref);
}

/* ---- setup ----------------------------------------------------------------------------------- */

/* "order.created.v3" -> "order.created.v2" ("v1" -> "v0"). */
static obx_err older_type(const char *type, char *out, size_t cap) {
    const char *v = strrchr(type ? type : "", '.');
    char *end;
    long n = v && v[1] == 'v' ? strtol(v + 2, &end, 10) : -1;
    if (n < 1 || *end)
        return obx__fail(OBX_EINVAL, "consumer test: sample event type '%s' is not versioned",
                         type ? type : "");
    snprintf(out, cap, "%.*s.v%ld", (int)(v - type), type, n - 1);
    return OBX_OK;
}

static obx_err prepare(kit *k) {
    const obx_consumer_test *t = k->t;
    size_t n = t->samples ? t->n_samples : 3;
    if (n < 2) return obx__fail(OBX_EINVAL, "consumer test: at least 2 samples are needed");
    k->n = n;
    k->s = calloc(n, sizeof *k->s);
    k->ids = calloc(n, sizeof *k->ids);
    k->digests = calloc(n, sizeof *k->digests);
    if (!k->s || !k->ids || !k->digests) return obx__fail(OBX_ENOMEM, "consumer test: memory");
    obx_err e = OBX_OK;
    if (t->samples)
        memcpy(k->s, t->samples, n * sizeof *k->s);
    else {
        /* generated: one order aggregate, versions 1..3, JSON payloads */
        snprintf(k->gen_agg_id, sizeof k->gen_agg_id, "o-kit-1");
        for (size_t i = 0; i < n; i++) {
            snprintf(k->gen_payload[i], sizeof k->gen_payload[i],
                     "{\"order\":\"o-kit-1\",\"version\":%zu,\"total\":%zu}", i + 1, (i + 1) * 100);
            k->s[i] = (obx_message){.event_type =
                                        t->n_event_types ? t->event_types[0] : "order.created.v1",
                                    .tenant = t->n_tenants ? t->tenants[0] : "tenant-1",
                                    .aggregate_type = "order",
                                    .aggregate_id = k->gen_agg_id,
                                    .aggregate_version = (int64_t)(i + 1),
                                    .correlation_id = "obx-consumer-test",
                                    .payload = k->gen_payload[i],
                                    .payload_len = strlen(k->gen_payload[i])};
        }
    }
    for (size_t i = 0; !e && i < n; i++) {
        obx_message *m = &k->s[i];
        if (!m->payload || !m->payload_len)
            e = obx__fail(OBX_EINVAL, "consumer test: sample %zu has no payload", i + 1);
        if (!e && m->event_id && *m->event_id)
            obx__strlcpy(k->ids[i], m->event_id, sizeof k->ids[i]);
        else if (!e)
            e = obx_event_id_new(0, k->ids[i]);
        if (!e) e = obx_sha256_digest(m->payload, m->payload_len, k->digests[i]);
        m->event_id = k->ids[i];
        m->payload_digest = k->digests[i];
        if (!m->envelope_gen) m->envelope_gen = 1;
        if (!m->topic) m->topic = "obx-consumer-test";
        if (!m->aggregate_type) m->aggregate_type = "aggregate";
        if (!m->aggregate_id) m->aggregate_id = "kit-1";
        if (!m->occurred_at) m->occurred_at = obx__wall_ms();
        if (!e && (!m->event_type || !m->tenant))
            e = obx__fail(OBX_EINVAL, "consumer test: sample %zu needs event_type and tenant",
                          i + 1);
    }
    for (int i = 0; !e && i < 3; i++) e = obx_event_id_new(0, k->extra_ids[i]);
    if (!e) e = older_type(k->s[n - 1].event_type, k->old_type, sizeof k->old_type);
    if (!e)
        e = t->poison_payload
                ? obx_sha256_digest(t->poison_payload, t->poison_len, k->poison_digest)
                : obx_sha256_digest(DEFAULT_POISON, strlen(DEFAULT_POISON), k->poison_digest);
    return e;
}

/* How to fix a mishandled scenario: what a correct consumer does instead (in the report). */
static const char *fix_for(const kit *k, const char *scenario) {
    if (!strcmp(scenario, "baseline"))
        return "the handler must apply every sample delivered once, in order: fix the error the "
               "detail names, or give the kit samples the handler accepts "
               "(obx_consumer_test.samples)";
    if (!strcmp(scenario, "duplicate"))
        return "make the effect only through the database connection the handler gets and "
               "acknowledge the broker only after the inbox's commit: a redelivery is then "
               "answered DUPLICATE and changes nothing";
    if (!strcmp(scenario, "lost-commit"))
        return "make every effect inside the consumer's transaction (the handler's db "
               "connection), or key each external call on effect_key (obx_inbox_effect_key() "
               "for several per event); drop in-process 'already processed' sets: only the "
               "inbox's receipt commits together with the effect";
    if (!strcmp(scenario, "reordering"))
        return "make the effect independent of arrival order (keep the highest "
               "aggregate_version, ignore older ones), or return an error until the missing "
               "version arrived (the inbox retries it); never refuse an out-of-order message "
               "as poison";
    if (!strcmp(scenario, "older-contract"))
        return k->t->n_event_types
                   ? "the consumer declares this contract version: its handler must apply it, "
                     "or stop declaring it (obx_inbox_options.event_types, `--types`)"
                   : "declare the contracts the consumer understands "
                     "(obx_inbox_options.event_types, `obx consume --types`): the inbox then "
                     "parks any other version before the handler runs";
    if (!strcmp(scenario, "foreign-tenant"))
        return "declare the tenants the consumer serves (obx_inbox_options.tenants, `obx "
               "consume --tenants`): the inbox then parks another tenant's message before the "
               "handler runs";
    if (!strcmp(scenario, "poison"))
        return "validate the payload before any effect and return an error: OBX_EPOISON parks "
               "it at once, any other error is retried max_failures times and then parked; "
               "never make a partial effect or skip a message silently";
    return "";
}

obx_err obx_consumer_test_run(const obx_consumer_test *t, char **out, int *mishandled) {
    if (!t || !out || !t->handler) return obx__fail(OBX_EINVAL, "consumer test: NULL argument");
    obx__clear_error();
    *out = NULL;
    if (mishandled) *mishandled = 0;
    if (t->max_failures == 1 || t->max_failures < 0 || t->max_failures > 1000)
        return obx__fail(OBX_EINVAL,
                         "consumer test: max_failures %d (2..1000, 0 = 5): a crash before the "
                         "commit counts as one failure",
                         t->max_failures);
    kit k = {.t = t,
             .consumer = t->consumer_id ? t->consumer_id : "consumer-under-test",
             .max_failures = t->max_failures ? t->max_failures : 5};
    obx_err e = prepare(&k);
    static const struct {
        const char *name;
        obx_err (*run)(kit *, verdict *, const char *);
    } scenarios[] = {{"duplicate", sc_duplicate},           {"lost-commit", sc_lost_commit},
                     {"reordering", sc_reordering},         {"older-contract", sc_older_contract},
                     {"foreign-tenant", sc_foreign_tenant}, {"poison", sc_poison}};
    json_t *arr = json_array();
    int failed = 0;
    char *ref = NULL;
    verdict base = {.ok = true};
    if (!e) e = fresh_db(&k);
    if (!e) e = in_order(&k, &base, "baseline");
    if (!e) e = snapshot(&k, &ref);
    if (!e) {
        if (base.ok)
            snprintf(base.detail, sizeof base.detail,
                     "%zu samples applied in order; their state is the reference", k.n);
        failed += !base.ok;
        json_t *row = json_pack("{s:s,s:b,s:s}", "scenario", "baseline", "ok", base.ok, "detail",
                                base.detail);
        if (!base.ok) json_object_set_new(row, "fix", json_string(fix_for(&k, "baseline")));
        json_array_append_new(arr, row);
    }
    for (size_t i = 0; !e && i < sizeof scenarios / sizeof scenarios[0]; i++) {
        verdict v = {.ok = true};
        if (!base.ok) {
            v.ok = false;
            snprintf(v.detail, sizeof v.detail, "not run: the baseline failed");
        } else if ((e = scenarios[i].run(&k, &v, ref)))
            break;
        else if (v.ok)
            snprintf(v.detail, sizeof v.detail, "handled");
        failed += !v.ok;
        json_t *row = json_pack("{s:s,s:b,s:s}", "scenario", scenarios[i].name, "ok", v.ok,
                                "detail", v.detail);
        /* a scenario not run because the baseline failed is fixed by fixing the baseline */
        if (!v.ok && base.ok)
            json_object_set_new(row, "fix", json_string(fix_for(&k, scenarios[i].name)));
        json_array_append_new(arr, row);
    }
    close_db(&k);
    free(ref);
    free(k.s);
    free(k.ids);
    free(k.digests);
    if (e) {
        json_decref(arr);
        return e;
    }
    json_t *types = json_array(), *tenants = json_array();
    for (size_t i = 0; i < t->n_event_types; i++)
        json_array_append_new(types, json_string(t->event_types[i]));
    for (size_t i = 0; i < t->n_tenants; i++)
        json_array_append_new(tenants, json_string(t->tenants[i]));
    if (mishandled) *mishandled = failed;
    return obx__json_out(json_pack("{s:s,s:{s:o,s:o,s:i},s:o,s:i}", "consumer_id", k.consumer,
                                   "declared", "event_types", types, "tenants", tenants,
                                   "max_failures", k.max_failures, "scenarios", arr, "mishandled",
                                   failed),
                         out);
}

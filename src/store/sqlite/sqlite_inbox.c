/*
 * sqlite_inbox.c — a consumer's database on SQLite (obx__store_inbox_methods): inbox rows on
 * (consumer_id, event_id), watermarks, failure counts, poison rows, inbox quarantine and the
 * consume audit.
 *
 * Contracts: the store's (sqlite_store.c); every method runs inside the consumer's own
 * transaction when there is one (the inbox row, the effect, the receipt and the watermark
 * commit together: design.md, "Consumers and the inbox").
 */
#include "store/sqlite/sq_int.h"

/* ---- inbox ----------------------------------------------------------------------------------- */

obx_err obx__sq_inbox_get(obx__store *base, const char *consumer, const char *event_id,
                          obx__inbox_row *r) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_INBOX_GET, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        memset(r, 0, sizeof *r);
        CT(st, 0, r->consumer_id);
        CT(st, 1, r->event_id);
        CT(st, 2, r->payload_digest);
        CT(st, 3, r->event_type);
        CT(st, 4, r->tenant);
        CT(st, 5, r->outcome);
        CT(st, 6, r->result);
        CT(st, 7, r->topic);
        r->partition = (int32_t)ci(st, 8);
        r->offset = ci(st, 9);
        r->consumed_at = ci(st, 10);
        r->duration_us = ci(st, 11);
        r->envelope_gen = (int32_t)ci(st, 12);
        CT(st, 13, r->attempt_id);
        CT(st, 14, r->dest_digest);
        e = OBX_OK;
    } else
        e = rc == SQLITE_DONE ? OBX_ENOTFOUND : obx__sq_map_rc(s, rc, "inbox get");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_inbox_put(obx__store *base, const obx__inbox_row *r) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_INBOX_PUT, &st);
    if (e) return e;
    bt(st, 1, r->consumer_id);
    bt(st, 2, r->event_id);
    bt(st, 3, r->payload_digest);
    bt(st, 4, r->event_type);
    bt(st, 5, r->tenant);
    bt(st, 6, r->outcome);
    bt(st, 7, r->result);
    bt(st, 8, r->topic);
    bi(st, 9, r->partition);
    bi(st, 10, r->offset);
    bi(st, 11, r->consumed_at);
    bi(st, 12, r->duration_us);
    bi(st, 13, r->envelope_gen);
    bt(st, 14, r->attempt_id);
    bt(st, 15, r->dest_digest);
    return obx__sq_step_done(s, st, "inbox put");
}

obx_err obx__sq_inbox_finish(obx__store *base, const char *consumer, const char *event_id,
                             const char *result, int64_t duration_us) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_INBOX_FINISH, &st);
    if (e) return e;
    bt(st, 1, result);
    bi(st, 2, duration_us);
    bt(st, 3, consumer);
    bt(st, 4, event_id);
    return obx__sq_step_done(s, st, "inbox finish");
}

obx_err obx__sq_inbox_has(obx__store *base, const char *consumer, const obx__inbox_key *keys,
                          size_t n, bool *present) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, Q_INBOX_HAS, &st);
        if (e) return e;
        bt(st, 1, consumer);
        bt(st, 2, keys[i].event_id);
        bt(st, 3, keys[i].payload_digest ? keys[i].payload_digest : "");
        bi(st, 4, keys[i].envelope_gen);
        bt(st, 5, keys[i].dest_digest ? keys[i].dest_digest : "");
        int rc = sqlite3_step(st);
        present[i] = rc == SQLITE_ROW;
        sqlite3_reset(st);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) return obx__sq_map_rc(s, rc, "inbox has");
    }
    return OBX_OK;
}

obx_err obx__sq_watermark_put(obx__store *base, const obx__watermark_row *w) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_WM_PUT, &st);
    if (e) return e;
    bt(st, 1, w->consumer_id);
    bt(st, 2, w->topic);
    bi(st, 3, w->partition);
    bi(st, 4, w->offset);
    bt(st, 5, w->event_id);
    bi(st, 6, w->occurred_at);
    bi(st, 7, w->committed_at);
    return obx__sq_step_done(s, st, "watermark");
}

obx_err obx__sq_watermark_list(obx__store *base, const char *consumer, obx__watermark_row **out,
                               size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, consumer ? Q_WM_LIST : Q_WM_LIST_ALL, &st);
    if (e) return e;
    if (consumer) bt(st, 1, consumer);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        obx__watermark_row *w = &(*out)[(*n)++];
        memset(w, 0, sizeof *w);
        CT(st, 0, w->consumer_id);
        CT(st, 1, w->topic);
        w->partition = (int32_t)ci(st, 2);
        w->offset = ci(st, 3);
        CT(st, 4, w->event_id);
        w->occurred_at = ci(st, 5);
        w->committed_at = ci(st, 6);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "watermarks");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__sq_failure_bump(obx__store *base, const char *consumer, const char *event_id,
                             const char *error, int64_t now, int64_t next_at, int32_t *failures) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_FAIL_BUMP, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    bt(st, 3, error);
    bi(st, 4, now);
    bi(st, 5, next_at);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) *failures = (int32_t)ci(st, 0);
    e = rc == SQLITE_ROW ? OBX_OK : obx__sq_map_rc(s, rc, "failure count");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_failure_get(obx__store *base, const char *consumer, const char *event_id,
                            int32_t *failures, int64_t *next_at) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    /* one event's: the key, without the any-event query's OR and sort */
    obx_err e = obx__sq_stmt(s, event_id ? Q_FAIL_GET_ID : Q_FAIL_GET, &st);
    if (e) return e;
    bt(st, 1, consumer);
    if (event_id)
        bt(st, 2, event_id);
    else
        sqlite3_bind_null(st, 2);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *failures = (int32_t)ci(st, 0);
        *next_at = ci(st, 1);
    }
    e = rc == SQLITE_ROW    ? OBX_OK
        : rc == SQLITE_DONE ? OBX_ENOTFOUND
                            : obx__sq_map_rc(s, rc, "failure get");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_failure_clear(obx__store *base, const char *consumer, const char *event_id) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_FAIL_CLEAR, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    return obx__sq_step_done(s, st, "failure clear");
}

obx_err obx__sq_retry_copy_put(obx__store *base, const obx__retry_copy_row *r) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_RETRY_PUT, &st);
    if (e) return e;
    bt(st, 1, r->consumer_id);
    bt(st, 2, r->event_id);
    bt(st, 3, r->payload_digest);
    bt(st, 4, r->topic);
    bi(st, 5, r->partition);
    bi(st, 6, r->offset);
    bt(st, 7, r->headers_json ? r->headers_json : "{}");
    if (r->payload)
        sqlite3_bind_blob(st, 8, r->payload, (int)r->payload_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 8);
    bi(st, 9, r->kept_at);
    return obx__sq_step_done(s, st, "retry copy put");
}

static obx_err read_retry_copy(sqlite3_stmt *st, obx__retry_copy_row *r) {
    memset(r, 0, sizeof *r);
    CT(st, 0, r->consumer_id);
    CT(st, 1, r->event_id);
    CT(st, 2, r->payload_digest);
    CT(st, 3, r->topic);
    r->partition = (int32_t)ci(st, 4);
    r->offset = ci(st, 5);
    const unsigned char *h = sqlite3_column_text(st, 6);
    r->headers_json = obx__strdup(h ? (const char *)h : "{}");
    r->kept_at = ci(st, 8);
    r->due_at = ci(st, 9);
    if (!r->headers_json) return obx__fail(OBX_ENOMEM, "retry copy: out of memory");
    int n = sqlite3_column_bytes(st, 7);
    const void *b = sqlite3_column_blob(st, 7);
    if (b && n > 0) {
        if (!(r->payload = malloc((size_t)n)))
            return obx__fail(OBX_ENOMEM, "retry copy: out of memory");
        memcpy(r->payload, b, (size_t)n);
        r->payload_len = (size_t)n;
    }
    return OBX_OK;
}

obx_err obx__sq_retry_copy_list(obx__store *base, const char *consumer, int64_t due_by,
                                size_t limit, obx__retry_copy_row **out, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, Q_RETRY_LIST, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bi(st, 2, due_by);
    bi(st, 3, (int64_t)limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        e = read_retry_copy(st, &(*out)[(*n)++]);
        if (e) break;
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "retry copy list");
    sqlite3_reset(st);
    if (e) {
        obx__retry_copy_rows_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__sq_retry_copy_del(obx__store *base, const char *consumer, const char *event_id) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_RETRY_DEL, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    return obx__sq_step_done(s, st, "retry copy delete");
}

obx_err obx__sq_poison_put(obx__store *base, const obx__poison_row *p) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_POISON_PUT, &st);
    if (e) return e;
    bt(st, 1, p->consumer_id);
    bt(st, 2, p->event_id);
    bt(st, 3, p->state);
    bi(st, 4, p->failures);
    bt(st, 5, p->last_error);
    bt(st, 6, p->topic);
    bi(st, 7, p->partition);
    bi(st, 8, p->offset);
    bt(st, 9, p->headers_json ? p->headers_json : "{}");
    if (p->payload)
        sqlite3_bind_blob(st, 10, p->payload, (int)p->payload_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 10);
    bi(st, 11, p->parked_at);
    bi(st, 12, p->updated_at);
    bt(st, 13, p->payload_digest);
    return obx__sq_step_done(s, st, "poison put");
}

static obx_err read_poison(sqlite3_stmt *st, obx__poison_row *p, bool payload) {
    memset(p, 0, sizeof *p);
    CT(st, 0, p->consumer_id);
    CT(st, 1, p->event_id);
    CT(st, 2, p->state);
    p->failures = (int32_t)ci(st, 3);
    CT(st, 4, p->last_error);
    CT(st, 5, p->topic);
    p->partition = (int32_t)ci(st, 6);
    p->offset = ci(st, 7);
    const unsigned char *h = sqlite3_column_text(st, 8);
    p->headers_json = obx__strdup(h ? (const char *)h : "{}");
    p->parked_at = ci(st, 9);
    p->updated_at = ci(st, 10);
    CT(st, 11, p->payload_digest);
    if (!p->headers_json) return obx__fail(OBX_ENOMEM, "poison: out of memory");
    if (payload) {
        int n = sqlite3_column_bytes(st, 12);
        const void *b = sqlite3_column_blob(st, 12);
        if (b && n > 0) {
            p->payload = malloc((size_t)n);
            if (!p->payload) return obx__fail(OBX_ENOMEM, "poison: out of memory");
            memcpy(p->payload, b, (size_t)n);
            p->payload_len = (size_t)n;
        }
    }
    return OBX_OK;
}

obx_err obx__sq_poison_list(obx__store *base, const char *consumer, const char *state,
                            obx__poison_row **out, size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    obx_err e = obx__sq_stmt(s, Q_POISON_LIST, &st);
    if (e) return e;
    if (consumer) bt(st, 1, consumer);
    if (state) bt(st, 2, state);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        e = read_poison(st, &(*out)[(*n)++], false);
        if (e) break;
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "poison list");
    sqlite3_reset(st);
    if (e) {
        obx__poison_rows_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return e;
}

obx_err obx__sq_poison_get(obx__store *base, const char *consumer, const char *event_id,
                           const char *digest, obx__poison_row *out) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    /* one copy's: the key (at most one row), without the event's query's OR and sort */
    obx_err e = obx__sq_stmt(s, digest ? Q_POISON_GET_COPY : Q_POISON_GET, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    if (digest)
        bt(st, 3, digest);
    else
        sqlite3_bind_null(st, 3);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        e = read_poison(st, out, true);
    else
        e = rc == SQLITE_DONE ? obx__fail(OBX_ENOTFOUND, "no poison message %s for consumer %s",
                                          event_id, consumer)
                              : obx__sq_map_rc(s, rc, "poison get");
    sqlite3_reset(st);
    return e;
}

obx_err obx__sq_poison_set_state(obx__store *base, const char *consumer, const char *event_id,
                                 const char *state, int64_t now) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_POISON_STATE, &st);
    if (e) return e;
    bt(st, 1, state);
    bi(st, 2, now);
    bt(st, 3, consumer);
    bt(st, 4, event_id);
    if ((e = obx__sq_step_done(s, st, "poison state"))) return e;
    if (sqlite3_changes(s->db) < 1) /* every copy of the event */
        return obx__fail(OBX_ENOTFOUND, "no poison message %s for consumer %s", event_id, consumer);
    return OBX_OK;
}

obx_err obx__sq_inbox_quarantine_put(obx__store *base, const char *consumer, const char *event_id,
                                     const char *digest, const char *first_digest,
                                     const char *reason, int64_t at) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    obx_err e = obx__sq_stmt(s, Q_INBOX_QUAR, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    bt(st, 3, digest);
    bt(st, 4, first_digest);
    bt(st, 5, reason);
    bi(st, 6, at);
    return obx__sq_step_done(s, st, "inbox quarantine");
}

obx_err obx__sq_consume_audit_put(obx__store *base, const obx__consume_audit_row *a, size_t n) {
    sq_store *s = (sq_store *)base;
    for (size_t i = 0; i < n; i++) {
        sqlite3_stmt *st = NULL;
        obx_err e = obx__sq_stmt(s, Q_CONSUME_AUDIT, &st);
        if (e) return e;
        bi(st, 1, a[i].at);
        bt(st, 2, a[i].consumer_id);
        bt(st, 3, a[i].event_id);
        bt(st, 4, a[i].outcome);
        bi(st, 5, a[i].duration_us);
        bt(st, 6, a[i].detail);
        if ((e = obx__sq_step_done(s, st, "consume audit"))) return e;
    }
    return OBX_OK;
}

obx_err obx__sq_consume_audit_list(obx__store *base, const char *consumer, const char *event_id,
                                   int64_t after_id, size_t limit, obx__consume_audit_row **out,
                                   size_t *n) {
    sq_store *s = (sq_store *)base;
    sqlite3_stmt *st = NULL;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    int q = after_id < 0 ? Q_CAUDIT_NEWEST : event_id ? Q_CAUDIT_EVENT : Q_CAUDIT_AFTER;
    obx_err e = obx__sq_stmt(s, q, &st);
    if (e) return e;
    bt(st, 1, consumer);
    bt(st, 2, event_id);
    bi(st, 3, after_id);
    bi(st, 4, (int64_t)limit);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if ((e = obx__sq_grow_array((void **)out, &cap, *n + 1, sizeof **out))) break;
        obx__consume_audit_row *a = &(*out)[(*n)++];
        memset(a, 0, sizeof *a);
        a->id = ci(st, 0);
        a->at = ci(st, 1);
        CT(st, 2, a->consumer_id);
        CT(st, 3, a->event_id);
        CT(st, 4, a->outcome);
        a->duration_us = ci(st, 5);
        CT(st, 6, a->detail);
    }
    if (!e && rc != SQLITE_DONE) e = obx__sq_map_rc(s, rc, "consume audit");
    sqlite3_reset(st);
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

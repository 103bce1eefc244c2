/*
 * pg_inbox.c — a consumer's database on PostgreSQL (obx__store_inbox_methods): inbox rows on
 * (consumer_id, event_id), watermarks, failure counts, poison rows, inbox quarantine and the
 * consume audit.
 *
 * Contracts: every method runs inside the consumer's own transaction when there is one (the
 * inbox row, the effect, the receipt and the watermark commit together: design.md, "Consumers
 * and the inbox").
 */
#include "store/postgres/pg_int.h"

/* ---- inbox ----------------------------------------------------------------------------------- */

obx_err obx__pg_inbox_get(obx__store *base, const char *consumer, const char *event_id,
                          obx__inbox_row *o) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_INBOX_GET, &p, PGRES_TUPLES_OK, &r, "inbox get");
    if (e) return e;
    if (PQntuples(r) == 1) {
        memset(o, 0, sizeof *o);
        GT(r, 0, 0, o->consumer_id);
        GT(r, 0, 1, o->event_id);
        GT(r, 0, 2, o->payload_digest);
        GT(r, 0, 3, o->event_type);
        GT(r, 0, 4, o->tenant);
        GT(r, 0, 5, o->outcome);
        GT(r, 0, 6, o->result);
        GT(r, 0, 7, o->topic);
        o->partition = (int32_t)gi(r, 0, 8);
        o->offset = gi(r, 0, 9);
        o->consumed_at = gi(r, 0, 10);
        o->duration_us = gi(r, 0, 11);
        o->envelope_gen = (int32_t)gi(r, 0, 12);
        GT(r, 0, 13, o->attempt_id);
        GT(r, 0, 14, o->dest_digest);
    } else
        e = OBX_ENOTFOUND;
    PQclear(r);
    return e;
}

obx_err obx__pg_inbox_put(obx__store *base, const obx__inbox_row *i) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, i->consumer_id);
    p_text(&p, i->event_id);
    p_text(&p, i->payload_digest);
    p_text(&p, i->event_type);
    p_text(&p, i->tenant);
    p_text(&p, i->outcome);
    p_text(&p, i->result);
    p_text(&p, i->topic);
    p_int(&p, i->partition);
    p_int(&p, i->offset);
    p_int(&p, i->consumed_at);
    p_int(&p, i->duration_us);
    p_int(&p, i->envelope_gen);
    p_text(&p, i->attempt_id);
    p_text(&p, i->dest_digest);
    return obx__pg_run(s, Q_INBOX_PUT, &p, PGRES_COMMAND_OK, NULL, "inbox put");
}

obx_err obx__pg_inbox_has(obx__store *base, const char *consumer, const obx__inbox_key *keys,
                          size_t n, bool *present) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    ARR_TEXT(&p, n, keys[i].event_id);
    ARR_TEXT(&p, n, keys[i].payload_digest ? keys[i].payload_digest : "");
    ARR_INT(&p, n, keys[i].envelope_gen);
    ARR_TEXT(&p, n, keys[i].dest_digest ? keys[i].dest_digest : "");
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_INBOX_HAS, &p, PGRES_TUPLES_OK, &r, "inbox has");
    p_free(&p);
    if (e) return e;
    for (size_t i = 0; i < n; i++) present[i] = false;
    for (int k = 0; k < PQntuples(r); k++) {
        int64_t ord = gi(r, k, 0);
        if (ord >= 1 && (size_t)ord <= n) present[ord - 1] = true;
    }
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_watermark_put(obx__store *base, const obx__watermark_row *w) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, w->consumer_id);
    p_text(&p, w->topic);
    p_int(&p, w->partition);
    p_int(&p, w->offset);
    p_text(&p, w->event_id);
    p_int(&p, w->occurred_at);
    p_int(&p, w->committed_at);
    return obx__pg_run(s, Q_WM_PUT, &p, PGRES_COMMAND_OK, NULL, "watermark");
}

obx_err obx__pg_watermark_list(obx__store *base, const char *consumer, obx__watermark_row **out,
                               size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    if (consumer) p_text(&p, consumer);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, consumer ? Q_WM_LIST : Q_WM_LIST_ALL, consumer ? &p : NULL,
                            PGRES_TUPLES_OK, &r, "watermarks");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "watermarks: out of memory");
    }
    for (int i = 0; !e && i < rows; i++) {
        obx__watermark_row *w = &(*out)[i];
        GT(r, i, 0, w->consumer_id);
        GT(r, i, 1, w->topic);
        w->partition = (int32_t)gi(r, i, 2);
        w->offset = gi(r, i, 3);
        GT(r, i, 4, w->event_id);
        w->occurred_at = gi(r, i, 5);
        w->committed_at = gi(r, i, 6);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

obx_err obx__pg_failure_bump(obx__store *base, const char *consumer, const char *event_id,
                             const char *error, int64_t now, int64_t next_at, int32_t *failures) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_text(&p, error);
    p_int(&p, now);
    p_int(&p, next_at);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_FAIL_BUMP, &p, PGRES_TUPLES_OK, &r, "failure count");
    if (e) return e;
    *failures = (int32_t)gi(r, 0, 0);
    PQclear(r);
    return OBX_OK;
}

obx_err obx__pg_failure_get(obx__store *base, const char *consumer, const char *event_id,
                            int32_t *failures, int64_t *next_at) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_FAIL_GET, &p, PGRES_TUPLES_OK, &r, "failure get");
    if (e) return e;
    if (PQntuples(r)) {
        *failures = (int32_t)gi(r, 0, 0);
        *next_at = gi(r, 0, 1);
    } else
        e = OBX_ENOTFOUND;
    PQclear(r);
    return e;
}

obx_err obx__pg_inbox_finish(obx__store *base, const char *consumer, const char *event_id,
                             const char *result, int64_t duration_us) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, result);
    p_int(&p, duration_us);
    p_text(&p, consumer);
    p_text(&p, event_id);
    return obx__pg_run(s, Q_INBOX_FINISH, &p, PGRES_COMMAND_OK, NULL, "inbox finish");
}

obx_err obx__pg_failure_clear(obx__store *base, const char *consumer, const char *event_id) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    return obx__pg_run(s, Q_FAIL_CLEAR, &p, PGRES_COMMAND_OK, NULL, "failure clear");
}

obx_err obx__pg_retry_copy_put(obx__store *base, const obx__retry_copy_row *rc) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, rc->consumer_id);
    p_text(&p, rc->event_id);
    p_text(&p, rc->payload_digest);
    p_text(&p, rc->topic);
    p_int(&p, rc->partition);
    p_int(&p, rc->offset);
    p_text(&p, rc->headers_json ? rc->headers_json : "{}");
    if (rc->payload)
        p_bytes(&p, rc->payload, rc->payload_len);
    else
        p_text(&p, NULL);
    p_int(&p, rc->kept_at);
    return obx__pg_run(s, Q_RETRY_PUT, &p, PGRES_COMMAND_OK, NULL, "retry copy put");
}

static obx_err read_retry_copy(const PGresult *r, int row, obx__retry_copy_row *c) {
    memset(c, 0, sizeof *c);
    GT(r, row, 0, c->consumer_id);
    GT(r, row, 1, c->event_id);
    GT(r, row, 2, c->payload_digest);
    GT(r, row, 3, c->topic);
    c->partition = (int32_t)gi(r, row, 4);
    c->offset = gi(r, row, 5);
    c->headers_json = obx__strdup(PQgetisnull(r, row, 6) ? "{}" : PQgetvalue(r, row, 6));
    c->kept_at = gi(r, row, 8);
    c->due_at = gi(r, row, 9);
    if (!c->headers_json) return obx__fail(OBX_ENOMEM, "retry copy: out of memory");
    return obx__pg_get_bytea(r, row, 7, &c->payload, &c->payload_len);
}

obx_err obx__pg_retry_copy_list(obx__store *base, const char *consumer, int64_t due_by,
                                size_t limit, obx__retry_copy_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_int(&p, due_by);
    p_int(&p, (int64_t)limit);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_RETRY_LIST, &p, PGRES_TUPLES_OK, &r, "retry copy list");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "retry copy list: out of memory");
    for (int i = 0; !e && i < rows; i++) e = read_retry_copy(r, i, &(*out)[i]);
    PQclear(r);
    if (e) {
        obx__retry_copy_rows_free(*out, *out ? (size_t)rows : 0);
        *out = NULL;
        return e;
    }
    *n = (size_t)rows;
    return OBX_OK;
}

obx_err obx__pg_retry_copy_del(obx__store *base, const char *consumer, const char *event_id) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    return obx__pg_run(s, Q_RETRY_DEL, &p, PGRES_COMMAND_OK, NULL, "retry copy delete");
}

obx_err obx__pg_poison_put(obx__store *base, const obx__poison_row *pr) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, pr->consumer_id);
    p_text(&p, pr->event_id);
    p_text(&p, pr->state);
    p_int(&p, pr->failures);
    p_text(&p, pr->last_error);
    p_text(&p, pr->topic);
    p_int(&p, pr->partition);
    p_int(&p, pr->offset);
    p_text(&p, pr->headers_json ? pr->headers_json : "{}");
    if (pr->payload)
        p_bytes(&p, pr->payload, pr->payload_len);
    else
        p_text(&p, NULL);
    p_int(&p, pr->parked_at);
    p_int(&p, pr->updated_at);
    p_text(&p, pr->payload_digest);
    return obx__pg_run(s, Q_POISON_PUT, &p, PGRES_COMMAND_OK, NULL, "poison put");
}

static obx_err read_poison(const PGresult *r, int row, obx__poison_row *p, bool payload) {
    memset(p, 0, sizeof *p);
    GT(r, row, 0, p->consumer_id);
    GT(r, row, 1, p->event_id);
    GT(r, row, 2, p->state);
    p->failures = (int32_t)gi(r, row, 3);
    GT(r, row, 4, p->last_error);
    GT(r, row, 5, p->topic);
    p->partition = (int32_t)gi(r, row, 6);
    p->offset = gi(r, row, 7);
    p->headers_json = obx__strdup(PQgetisnull(r, row, 8) ? "{}" : PQgetvalue(r, row, 8));
    p->parked_at = gi(r, row, 9);
    p->updated_at = gi(r, row, 10);
    GT(r, row, 11, p->payload_digest);
    if (!p->headers_json) return obx__fail(OBX_ENOMEM, "poison: out of memory");
    if (payload) return obx__pg_get_bytea(r, row, 12, &p->payload, &p->payload_len);
    return OBX_OK;
}

obx_err obx__pg_poison_list(obx__store *base, const char *consumer, const char *state,
                            obx__poison_row **out, size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, state);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_POISON_LIST, &p, PGRES_TUPLES_OK, &r, "poison list");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0) {
        *out = calloc((size_t)rows, sizeof **out);
        if (!*out) e = obx__fail(OBX_ENOMEM, "poison list: out of memory");
    }
    size_t done = 0;
    for (int i = 0; !e && i < rows; i++, done++) e = read_poison(r, i, &(*out)[i], false);
    PQclear(r);
    if (e) {
        obx__poison_rows_free(*out, *out ? (size_t)rows : 0);
        *out = NULL;
        return e;
    }
    *n = done;
    return OBX_OK;
}

obx_err obx__pg_poison_get(obx__store *base, const char *consumer, const char *event_id,
                           const char *digest, obx__poison_row *out) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_text(&p, digest);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_POISON_GET, &p, PGRES_TUPLES_OK, &r, "poison get");
    if (e) return e;
    if (PQntuples(r) == 1) {
        e = read_poison(r, 0, out, true);
        if (e) {
            free(out->headers_json);
            out->headers_json = NULL;
        }
    } else
        e = obx__fail(OBX_ENOTFOUND, "no poison message %s for consumer %s", event_id, consumer);
    PQclear(r);
    return e;
}

obx_err obx__pg_poison_set_state(obx__store *base, const char *consumer, const char *event_id,
                                 const char *state, int64_t now) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, state);
    p_int(&p, now);
    p_text(&p, consumer);
    p_text(&p, event_id);
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, Q_POISON_STATE, &p, PGRES_COMMAND_OK, &r, "poison state");
    if (e) return e;
    bool any = atoll(PQcmdTuples(r)) >= 1; /* every copy of the event */
    PQclear(r);
    if (!any)
        return obx__fail(OBX_ENOTFOUND, "no poison message %s for consumer %s", event_id, consumer);
    return OBX_OK;
}

obx_err obx__pg_inbox_quarantine_put(obx__store *base, const char *consumer, const char *event_id,
                                     const char *digest, const char *first_digest,
                                     const char *reason, int64_t at) {
    pg_store *s = (pg_store *)base;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_text(&p, digest);
    p_text(&p, first_digest);
    p_text(&p, reason);
    p_int(&p, at);
    return obx__pg_run(s, Q_INBOX_QUAR, &p, PGRES_COMMAND_OK, NULL, "inbox quarantine");
}

obx_err obx__pg_consume_audit_put(obx__store *base, const obx__consume_audit_row *a, size_t n) {
    pg_store *s = (pg_store *)base;
    if (!n) return OBX_OK;
    params p;
    p_init(&p);
    ARR_INT(&p, n, a[i].at);
    ARR_TEXT(&p, n, a[i].consumer_id);
    ARR_TEXT(&p, n, a[i].event_id);
    ARR_TEXT(&p, n, a[i].outcome);
    ARR_INT(&p, n, a[i].duration_us);
    ARR_TEXT(&p, n, a[i].detail);
    obx_err e = obx__pg_run(s, Q_CONSUME_AUDIT, &p, PGRES_COMMAND_OK, NULL, "consume audit");
    p_free(&p);
    return e;
}

obx_err obx__pg_consume_audit_list(obx__store *base, const char *consumer, const char *event_id,
                                   int64_t after_id, size_t limit, obx__consume_audit_row **out,
                                   size_t *n) {
    pg_store *s = (pg_store *)base;
    *out = NULL;
    *n = 0;
    params p;
    p_init(&p);
    p_text(&p, consumer);
    p_text(&p, event_id);
    p_int(&p, after_id);
    p_int(&p, (int64_t)limit);
    int q = after_id < 0 ? Q_CAUDIT_NEWEST : event_id ? Q_CAUDIT_EVENT : Q_CAUDIT_AFTER;
    PGresult *r = NULL;
    obx_err e = obx__pg_run(s, q, &p, PGRES_TUPLES_OK, &r, "consume audit");
    if (e) return e;
    int rows = PQntuples(r);
    if (rows > 0 && !(*out = calloc((size_t)rows, sizeof **out)))
        e = obx__fail(OBX_ENOMEM, "consume audit: out of memory");
    for (int i = 0; !e && i < rows; i++) {
        obx__consume_audit_row *a = &(*out)[i];
        a->id = gi(r, i, 0);
        a->at = gi(r, i, 1);
        GT(r, i, 2, a->consumer_id);
        GT(r, i, 3, a->event_id);
        GT(r, i, 4, a->outcome);
        a->duration_us = gi(r, i, 5);
        GT(r, i, 6, a->detail);
    }
    if (!e) *n = (size_t)rows;
    PQclear(r);
    return e;
}

/*
 * inbox.c — the consumer's inbox (docs/design.md, "Consumers and the inbox"): applies each
 * event's effect once per consumer.
 *
 * obx_inbox_process, in order:
 *   1. validate the message: headers well formed, every field within the documented input rules
 *      (a message may come from an application's own broker client, not only from obx's
 *      header parser), payload matches its digest, the contract (event type version) and tenant
 *      are accepted — otherwise it is parked as poison (visible, re-drivable), never silently
 *      dropped. A message whose event ID is unusable is parked under "bad-<digest>", derived
 *      from its bytes, so that two such messages never overwrite each other's evidence;
 *   2. in one transaction on the consumer's database: look up (consumer, event_id);
 *        present, same payload digest  -> DUPLICATE: the original receipt, no effect;
 *        present, other payload digest -> QUARANTINED, no effect;
 *        absent -> claim the pair (insert the consume receipt: its unique key makes a second
 *        instance wait for this transaction and then answer DUPLICATE, never run the handler),
 *        run the handler (the effect), write its result into the receipt, move the watermark,
 *        commit;
 *   3. a handler failure rolls back; the failure is counted in its own transaction with the
 *      time its retry is due (the back-off: base * 2^(n-1), at most max, +-20 % jitter; a
 *      RETRY_SCHEDULED audit row); after max_failures the message is parked as poison, at once
 *      when the handler returned OBX_EPOISON. A delivery of a failed message before its retry
 *      is due is DELAYED (between 1 and 2: the failure row is the durable schedule, so a
 *      restarted consumer keeps it): nothing runs, nothing is written, no ack;
 *   4. only after the commit does the caller acknowledge the broker position (result.ack).
 * No in-process dedupe sets: the database is the only memory. Text written to the consumer's
 * database from outside input (field values in poison headers, the handler's result and error)
 * is valid UTF-8: PostgreSQL refuses anything else, and a refused row would leave the message
 * unacknowledged forever.
 */
#include "engine/engine_int.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

struct obx_inbox {
    obx__store *s; /* the consumer's database (borrowed) */
    char consumer[OBX_NAME_MAX + 1];
    char **types;
    size_t n_types;
    char **tenants;
    size_t n_tenants;
    int max_failures;
    const obx_keyring *keys; /* sealed bodies are opened with it (borrowed; NULL: none) */
    /* during obx__inbox_process_at of a sealed body: the message as received (borrowed). What
     * is parked is its bytes, never the clear ones the handler sees: the consumer's database
     * holds no opened payload, and a re-drive opens the body again. NULL otherwise. */
    const obx_message *received;
    int64_t backoff_ms, backoff_max_ms; /* 0: no back-off */
    uint64_t rng;                       /* the back-off's jitter (xorshift) */
};

static void free_list(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

static obx_err copy_list(const char *what, const char *const *src, size_t n, char ***out,
                         obx__charset cs) {
    *out = NULL;
    if (!n) return OBX_OK;
    if (!src) return obx__fail(OBX_EINVAL, "%s: NULL with count %zu", what, n);
    char **v = calloc(n, sizeof *v);
    if (!v) return obx__fail(OBX_ENOMEM, "inbox: out of memory");
    for (size_t i = 0; i < n; i++) {
        obx_err e = obx__check_field(what, src[i], 1, OBX_NAME_MAX, cs);
        if (!e && !(v[i] = obx__strdup(src[i]))) e = obx__fail(OBX_ENOMEM, "inbox: out of memory");
        if (e) {
            free_list(v, n);
            return e;
        }
    }
    *out = v;
    return OBX_OK;
}

obx_err obx_inbox_open(obx_store *db, const obx_inbox_options *o, obx_inbox **out) {
    if (!db || !o || !out) return obx__fail(OBX_EINVAL, "inbox: NULL argument");
    obx__clear_error();
    *out = NULL;
    obx_err e = obx__check_field("consumer_id", o->consumer_id, 1, OBX_NAME_MAX, OBX__CS_NAME);
    if (e) return e;
    if (o->max_failures < 0 || o->max_failures > 1000)
        return obx__fail(OBX_EINVAL, "max_failures: %d outside 1..1000 (0 = 5)", o->max_failures);
    int64_t base = o->retry_backoff_ms ? o->retry_backoff_ms : 1000;
    int64_t max = o->retry_backoff_max_ms ? o->retry_backoff_max_ms : 300000;
    if (base != -1 && (base < 1 || base > 86400000 || max < base || max > 86400000))
        return obx__fail(OBX_EINVAL,
                         "retry_backoff_ms: %lld, retry_backoff_max_ms: %lld: each 1..86400000 ms "
                         "and max >= base (0 = 1000 and 300000; base -1 = no back-off)",
                         (long long)o->retry_backoff_ms, (long long)o->retry_backoff_max_ms);
    int found = 0;
    if ((e = obx__st_schema_version(db, &found))) return e;
    if (found != OBX__SCHEMA_VERSION)
        return obx__fail(OBX_ESCHEMA,
                         "consumer database has schema version %d, need %d (run obx "
                         "init on it)",
                         found, OBX__SCHEMA_VERSION);
    obx_inbox *in = calloc(1, sizeof *in);
    if (!in) return obx__fail(OBX_ENOMEM, "inbox: out of memory");
    in->s = db;
    obx__strlcpy(in->consumer, o->consumer_id, sizeof in->consumer);
    in->max_failures = o->max_failures ? o->max_failures : 5;
    in->keys = o->keys;
    in->backoff_ms = base == -1 ? 0 : base;
    in->backoff_max_ms = base == -1 ? 0 : max;
    in->rng = (uint64_t)obx__wall_ms() ^ (uint64_t)(uintptr_t)in ^ 0x9e3779b97f4a7c15ull;
    /* each count is set as soon as its list is owned: a failure of the second list must
     * free the first one whole (fuzz_inbox found the leak when it was set after both) */
    e = copy_list("event_types", o->event_types, o->n_event_types, &in->types, OBX__CS_EVENT_TYPE);
    if (!e) {
        in->n_types = o->n_event_types;
        e = copy_list("tenants", o->tenants, o->n_tenants, &in->tenants, OBX__CS_NAME);
    }
    if (e) {
        obx_inbox_close(in);
        return e;
    }
    in->n_tenants = o->n_tenants;
    *out = in;
    return OBX_OK;
}

void obx_inbox_close(obx_inbox *in) {
    if (!in) return;
    free_list(in->types, in->n_types);
    free_list(in->tenants, in->n_tenants);
    free(in);
}

static bool listed(char **v, size_t n, const char *x) {
    if (!n) return true;
    for (size_t i = 0; i < n; i++)
        if (x && !strcmp(v[i], x)) return true;
    return false;
}

obx_err obx_inbox_effect_key(const char *consumer, const char *event_id, const char *effect,
                             char out[68]) {
    if (!consumer || !event_id || !effect || !out) return obx__fail(OBX_EINVAL, "NULL argument");
    obx__buf b = {0};
    const char *parts[] = {"obx.effect.v1", consumer, event_id, effect};
    for (size_t i = 0; i < 4; i++) {
        obx__buf_u32be(&b, (uint32_t)strlen(parts[i]));
        obx__buf_puts(&b, parts[i]);
    }
    char d[OBX_DIGEST_LEN + 1];
    obx_err e =
        b.oom ? obx__fail(OBX_ENOMEM, "out of memory") : obx_sha256_digest(b.data, b.len, d);
    obx__buf_free(&b);
    if (e) return e;
    memcpy(out, "fx-", 3);
    memcpy(out + 3, d + 7, 65);
    return OBX_OK;
}

/* A JSON string for a field of outside input: as is when it is valid UTF-8, else escaped
 * (the poison row keeps the evidence instead of losing the whole header object). */
static json_t *jstr(const char *v) {
    if (!v) return json_null();
    size_t n = strlen(v);
    if (obx__utf8_invalid_at((const unsigned char *)v, n) < 0) return json_string(v);
    size_t cap = 4 * n + 8;
    char *tmp = malloc(cap);
    if (!tmp) return NULL;
    json_t *j = json_string(obx__printable(v, n, tmp, cap));
    free(tmp);
    return j;
}

/* "att-" + a ULID (Crockford base 32, upper case), as dispatch.c mints attempt IDs. */
static bool attempt_id_ok(const char *s) {
    if (!s || strncmp(s, "att-", 4) || strlen(s) != OBX__ATTEMPT_ID_LEN) return false;
    for (const char *p = s + 4; *p; p++)
        if (!strchr("0123456789ABCDEFGHJKMNPQRSTVWXYZ", *p)) return false;
    return true;
}

static char *headers_of(const obx_message *m) {
    json_t *o = json_pack("{s:o*,s:i,s:o*,s:o*,s:o*,s:o*,s:I,s:o*,s:o*,s:o*,s:I,s:o*}", "event_id",
                          jstr(m->event_id), "envelope_gen", m->envelope_gen, "event_type",
                          jstr(m->event_type), "tenant", jstr(m->tenant), "aggregate_type",
                          jstr(m->aggregate_type), "aggregate_id", jstr(m->aggregate_id),
                          "aggregate_version", (json_int_t)m->aggregate_version, "correlation_id",
                          jstr(m->correlation_id), "causation_id", jstr(m->causation_id),
                          "traceparent", jstr(m->traceparent), "occurred_at",
                          (json_int_t)m->occurred_at, "payload_digest", jstr(m->payload_digest));
    if (o && m->attempt_id) json_object_set_new(o, "attempt_id", jstr(m->attempt_id));
    if (o && m->dest_digest) json_object_set_new(o, "dest_digest", jstr(m->dest_digest));
    if (o && m->encryption && *m->encryption)
        json_object_set_new(o, "encryption", jstr(m->encryption));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return s;
}

/* The key a message is parked under: its event ID, or for an unusable one "bad-" and 26 hex
 * digits of SHA-256 over the raw event ID and payload (stable over redeliveries). */
static void poison_key(const obx_message *m, char out[OBX_EVENT_ID_LEN + 1]) {
    if (m->event_id && !obx_event_id_check(m->event_id)) {
        obx__strlcpy(out, m->event_id, OBX_EVENT_ID_LEN + 1);
        return;
    }
    obx__buf b = {0};
    const char *id = m->event_id ? m->event_id : "";
    obx__buf_u32be(&b, (uint32_t)strlen(id));
    obx__buf_puts(&b, id);
    if (m->payload) obx__buf_put(&b, m->payload, m->payload_len);
    char d[OBX_DIGEST_LEN + 1] = "";
    if (b.oom || obx_sha256_digest(b.data, b.len, d)) memset(d, '0', sizeof d - 1);
    obx__buf_free(&b);
    snprintf(out, OBX_EVENT_ID_LEN + 1, "bad-%.26s", d + 7);
}

static obx_err audit_consume(obx_inbox *in, const obx_message *m, const char *outcome, int64_t now,
                             int64_t dur, const char *detail) {
    obx__consume_audit_row a;
    memset(&a, 0, sizeof a);
    a.at = now;
    obx__strlcpy(a.consumer_id, in->consumer, sizeof a.consumer_id);
    poison_key(m, a.event_id);
    obx__strlcpy(a.outcome, outcome, sizeof a.outcome);
    a.duration_us = dur;
    obx__text_copy(a.detail, detail, sizeof a.detail);
    return obx__st_consume_audit_put(in->s, &a, 1);
}

/* Parks m as poison in its own transaction, with an audit row: the bytes as received (a sealed
 * body stays sealed: in->received). */
static obx_err park(obx_inbox *in, const obx_message *m, int failures, const char *why, int64_t now,
                    obx_inbox_result *out) {
    if (in->received) m = in->received;
    obx__poison_row p;
    memset(&p, 0, sizeof p);
    obx__strlcpy(p.consumer_id, in->consumer, sizeof p.consumer_id);
    poison_key(m, p.event_id);
    obx__strlcpy(p.state, "PARKED", sizeof p.state);
    p.failures = failures;
    obx__text_copy(p.last_error, why, sizeof p.last_error);
    obx__text_copy(p.topic, m->topic, sizeof p.topic);
    p.partition = m->partition;
    p.offset = m->offset;
    p.headers_json = headers_of(m);
    p.payload = (unsigned char *)(uintptr_t)m->payload;
    p.payload_len = m->payload_len;
    p.parked_at = p.updated_at = now;
    obx_err e = obx__poison_digest(m->payload, m->payload_len, p.payload_digest);
    if (e) {
        free(p.headers_json);
        return e;
    }
    e = obx__st_begin(in->s);
    if (!e) e = obx__st_poison_put(in->s, &p);
    if (!e) e = audit_consume(in, m, "POISONED", now, 0, why);
    if (!e)
        e = obx__st_commit(in->s);
    else
        obx__st_rollback(in->s);
    free(p.headers_json);
    if (e) return e;
    out->outcome = OBX_INBOX_POISONED;
    out->ack = 1;
    out->failures = failures;
    obx__text_copy(out->detail, why, sizeof out->detail);
    return OBX_OK;
}

/* The fields a handler relies on, by the producer's input rules (obx_enqueue): a message that
 * breaks them did not come from an obx outbox, or was altered on the way. */
static obx_err check_fields(const obx_message *m) {
    obx_err e;
    if ((e = obx__check_field("event_type", m->event_type, 1, OBX_NAME_MAX, OBX__CS_EVENT_TYPE)) ||
        (e = obx__check_field("tenant", m->tenant, 1, OBX_NAME_MAX, OBX__CS_NAME)) ||
        (e = obx__check_field("aggregate_type", m->aggregate_type, 0, OBX_NAME_MAX,
                              OBX__CS_NAME)) ||
        (e = obx__check_field("aggregate_id", m->aggregate_id, 0, OBX_KEY_MAX, OBX__CS_TEXT)) ||
        (e = obx__check_field("correlation_id", m->correlation_id, 0, OBX_TEXT_MAX,
                              OBX__CS_TEXT)) ||
        (e = obx__check_field("causation_id", m->causation_id, 0, OBX_TEXT_MAX, OBX__CS_TEXT)) ||
        (e = obx__check_field("traceparent", m->traceparent, 0, OBX_TRACEPARENT_LEN,
                              OBX__CS_NAME)) ||
        (e = obx__check_field("topic", m->topic, 0, OBX_TOPIC_MAX, OBX__CS_NAME)))
        return e;
    if (m->aggregate_version < 0)
        return obx__fail(OBX_EINVAL, "aggregate_version: %lld is negative",
                         (long long)m->aggregate_version);
    if (!m->payload_len)
        return obx__fail(OBX_EINVAL, "payload: empty (an obx event carries 1 byte or more)");
    return OBX_OK;
}

obx_message obx__message_of(const obx__delivery *d) {
    return (obx_message){.event_id = d->env.event_id,
                         .envelope_gen = d->env.envelope_gen,
                         .event_type = d->env.event_type,
                         .tenant = d->env.tenant,
                         .aggregate_type = d->env.aggregate_type,
                         .aggregate_id = d->env.aggregate_id,
                         .aggregate_version = d->env.aggregate_version,
                         .correlation_id = d->env.correlation_id,
                         .causation_id = d->env.causation_id,
                         .traceparent = d->env.traceparent,
                         .occurred_at = d->env.occurred_at,
                         .payload_digest = d->env.payload_digest,
                         .attempt_id = d->attempt_id,
                         .dest_digest = d->dest_digest,
                         .payload = d->payload,
                         .payload_len = d->payload_len,
                         .topic = d->topic,
                         .partition = d->partition,
                         .offset = d->offset,
                         .redelivered = d->redelivered,
                         .header_error = d->header_error,
                         .encryption = d->enc_key};
}

obx_err obx__inbox_process_at(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                              void *conn, int64_t now, int64_t mono_us_start,
                              int64_t (*mono_us)(void), obx_inbox_result *out);

static obx_err process(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                       void *conn, int64_t now, int64_t mono_us_start, int64_t (*mono_us)(void),
                       obx_inbox_result *out, bool retried);

/* A body that does not open (crypt.c: tampered, moved to another event, another key under
 * the ID): refused; a quarantine of the event ID (the alarm: `obx audit`, and no retention rests
 * on this consumer for it) and the bytes parked for an operator. A key the ring lacks: parked
 * only, re-driven once the key is added. */
static obx_err refuse_sealed(obx_inbox *in, const obx_message *m, obx_err oe, int64_t now,
                             obx_inbox_result *out) {
    char why[256], dg[OBX_DIGEST_LEN + 1] = "";
    obx__printable(obx_errmsg(), strlen(obx_errmsg()), why, sizeof why);
    obx_err e = OBX_OK;
    if (oe == OBX_EREFUSED && !obx_event_id_check(m->event_id)) {
        if (!(e = obx_sha256_digest(m->payload, m->payload_len, dg)) &&
            !(e = obx__st_begin(in->s))) {
            e = obx__st_inbox_quarantine_put(in->s, in->consumer, m->event_id, dg,
                                             m->payload_digest ? m->payload_digest : "", why, now);
            if (!e) e = audit_consume(in, m, "QUARANTINED", now, 0, why);
            if (!e)
                e = obx__st_commit(in->s);
            else
                obx__st_rollback(in->s);
        }
    }
    if (!e) e = park(in, m, 0, why, now, out);
    if (!e && oe == OBX_EREFUSED) out->outcome = OBX_INBOX_QUARANTINED;
    return e;
}

obx_err obx__inbox_process_at(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                              void *conn, int64_t now, int64_t mono_us_start,
                              int64_t (*mono_us)(void), obx_inbox_result *out) {
    if (!in || !m || !m->encryption || !*m->encryption || !out)
        return process(in, m, h, user, conn, now, mono_us_start, mono_us, out, false);
    /* an encrypted route's message: opened before anything else, the handler sees the clear */
    memset(out, 0, sizeof *out);
    obx_message clear = *m;
    unsigned char *p = NULL;
    size_t n = 0;
    obx_err oe = obx__open(in->keys, m->encryption, m->event_id ? m->event_id : "", m->envelope_gen,
                           m->payload, m->payload_len, &p, &n);
    if (oe == OBX_ENOMEM || oe == OBX_EINTERNAL) return oe;
    if (oe) return refuse_sealed(in, m, oe, now, out);
    clear.payload = p;
    clear.payload_len = n;
    in->received = m;
    obx_err e = process(in, &clear, h, user, conn, now, mono_us_start, mono_us, out, false);
    in->received = NULL;
    free(p);
    return e;
}

/* Phase 1, validation before any effect: computes the payload's digest into `digest`. Returns an
 * error only when the digest cannot be computed; a message to be parked as poison gets the reason
 * in `why` (empty when the message is acceptable). Writes nothing. */
static obx_err check_message(const obx_inbox *in, const obx_message *m,
                             char digest[OBX_DIGEST_LEN + 1], char why[256]) {
    obx_err e;
    char shown[160];
    *why = 0;
    if (m->header_error && *m->header_error) {
        snprintf(why, 256, "malformed message headers: %s",
                 obx__printable(m->header_error, strlen(m->header_error), shown, sizeof shown));
        return OBX_OK;
    }
    if (obx_event_id_check(m->event_id)) {
        snprintf(why, 256, "bad event ID: %s", obx_errmsg());
        return OBX_OK;
    }
    if ((e = check_fields(m))) {
        snprintf(why, 256, "malformed message: %s", obx_errmsg());
        return OBX_OK;
    }
    if ((e = obx_sha256_digest(m->payload, m->payload_len, digest))) return e;
    if (!m->payload_digest || strcmp(digest, m->payload_digest)) {
        snprintf(why, 256, "payload does not match its digest header (%s)",
                 m->payload_digest
                     ? obx__printable(m->payload_digest, strnlen(m->payload_digest, 24), shown, 32)
                     : "(none)");
        return OBX_OK;
    }
    if (!listed(in->types, in->n_types, m->event_type)) {
        snprintf(why, 256, "contract '%s' is not accepted by consumer %s", m->event_type,
                 in->consumer);
        return OBX_OK;
    }
    if (!listed(in->tenants, in->n_tenants, m->tenant))
        snprintf(why, 256, "tenant '%s' is not served by consumer %s", m->tenant, in->consumer);
    return OBX_OK;
}

/* Phase 2a, inside the transaction process opened: looks for an earlier receipt or parking of
 * (consumer, event_id). Sets *done when the message is decided here (duplicate, quarantined,
 * already parked) or on an error: the transaction is then ended and the return value is the
 * call's result. Otherwise the transaction stays open and *seen says whether a receipt exists
 * (only under the SKIP_INBOX_DEDUPE mutation). */
static obx_err prior_receipt(obx_inbox *in, const obx_message *m, const char *digest, int64_t now,
                             obx_inbox_result *out, bool *seen, bool *done) {
    obx__inbox_row prev;
    obx_err e = obx__st_inbox_get(in->s, in->consumer, m->event_id, &prev);
    *done = true;
    if (e == OBX_OK && !OBX__MUTANT(SKIP_INBOX_DEDUPE)) {
        bool same = !strcmp(prev.payload_digest, digest);
        if (same) {
            out->outcome = OBX_INBOX_DUPLICATE;
            obx__strlcpy(out->result, prev.result, sizeof out->result);
            char at[32];
            obx__iso_ms(prev.consumed_at, at); /* details reach operators: ISO, not epoch ms */
            snprintf(out->detail, sizeof out->detail, "already applied at %s (offset %lld)", at,
                     (long long)prev.offset);
            e = audit_consume(in, m, "DUPLICATE", now, 0, out->detail);
        } else {
            out->outcome = OBX_INBOX_QUARANTINED;
            snprintf(out->detail, sizeof out->detail,
                     "same event ID, different payload digest (first %.20s..., now %.20s...)",
                     prev.payload_digest, digest);
            e = obx__st_inbox_quarantine_put(in->s, in->consumer, m->event_id, digest,
                                             prev.payload_digest, out->detail, now);
            if (!e) e = audit_consume(in, m, "QUARANTINED", now, 0, out->detail);
        }
        if (!e)
            e = obx__st_commit(in->s);
        else
            obx__st_rollback(in->s);
        if (!e) out->ack = 1;
        return e;
    }
    if (e != OBX_OK && e != OBX_ENOTFOUND) {
        obx__st_rollback(in->s);
        return e;
    }
    *seen = e == OBX_OK; /* only reachable under the SKIP_INBOX_DEDUPE mutation */
    /* A message this consumer already parked comes again when the acknowledgement of its
     * POISONED outcome was lost (connection or channel closed before the ack): it stays parked,
     * the handler does not run again and nothing is written. Only `obx poison redrive` runs it
     * again (the state is then REDRIVE, not PARKED). */
    if (!*seen) {
        obx__poison_row p; /* this copy's: a corrupt copy parked before never blocks it */
        e = obx__st_poison_get(in->s, in->consumer, m->event_id,
                               OBX__MUTANT(PARK_BY_EVENT_ID) ? NULL : digest, &p);
        if (e == OBX_OK) {
            bool parked = !strcmp(p.state, "PARKED");
            if (parked) {
                out->outcome = OBX_INBOX_POISONED;
                out->ack = 1;
                out->failures = p.failures;
                snprintf(out->detail, sizeof out->detail, "already parked: %.200s", p.last_error);
            }
            free(p.payload);
            free(p.headers_json);
            if (parked) {
                obx__st_rollback(in->s);
                return OBX_OK;
            }
        } else if (e != OBX_ENOTFOUND) {
            obx__st_rollback(in->s);
            return e;
        }
    }
    *done = false;
    return OBX_OK;
}

/* When failure number n (1-based) of a message that failed at now is retried: now plus the
 * back-off base * 2^(n-1), at most max, +-20 % jitter so that messages failing together do not
 * retry in lockstep; now itself when the inbox has no back-off. */
static int64_t backoff_step(const obx_inbox *in, int n) {
    int64_t d = in->backoff_ms;
    for (int i = 1; i < n && d < in->backoff_max_ms; i++) d *= 2;
    return d > in->backoff_max_ms ? in->backoff_max_ms : d;
}

void obx__inbox_set_backoff(obx_inbox *in, int64_t base_ms, int64_t max_ms, uint64_t seed) {
    in->backoff_ms = base_ms > 0 ? base_ms : 0;
    in->backoff_max_ms = base_ms > 0 ? (max_ms > base_ms ? max_ms : base_ms) : 0;
    in->rng = seed | 1; /* xorshift: never 0 */
}

static int64_t retry_due(obx_inbox *in, int n, int64_t now) {
    if (!in->backoff_ms) return now;
    int64_t d = backoff_step(in, n);
    uint64_t x = in->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    in->rng = x;
    int64_t span = d / 5;
    if (span > 0) d += (int64_t)(x % (uint64_t)(2 * span + 1)) - span;
    return now + (d > 0 ? d : 1);
}

/* Phase 1b, inside the transaction process opened, before the claim: a message that failed
 * before and whose retry is not due yet is DELAYED (the transaction rolled back, *done set). */
static obx_err retry_not_due(obx_inbox *in, const obx_message *m, int64_t now,
                             obx_inbox_result *out, bool *done) {
    int32_t failures = 0;
    int64_t next_at = 0;
    obx_err e = obx__st_failure_get(in->s, in->consumer, m->event_id, &failures, &next_at);
    bool due = next_at <= now || OBX__MUTANT(INBOX_IGNORES_NEXT_AT); /* test-only bug */
    *done = e != OBX_ENOTFOUND && (e || !due);
    if (e == OBX_ENOTFOUND) return OBX_OK;
    if (*done) obx__st_rollback(in->s);
    if (e || !*done) return e;
    out->outcome = OBX_INBOX_DELAYED;
    out->failures = failures;
    out->retry_at = next_at;
    snprintf(out->detail, sizeof out->detail, "retry %d not due for %.3f s", (int)failures,
             (double)(next_at - now) / 1000.0);
    return OBX_OK;
}

/* Phase 3: the handler returned he (its message in obx_errmsg()). Rolls back the open
 * transaction (the effect is undone), counts the failure in its own transaction with a FAILED
 * audit row and the time its retry is due (a RETRY_SCHEDULED audit row), and parks the message
 * when the handler said poison or max_failures is reached. */
static obx_err handler_failed(obx_inbox *in, const obx_message *m, obx_err he, int64_t now,
                              int64_t dur, obx_inbox_result *out) {
    obx_err e;
    char herr[256], hmsg[200], why[256];
    const char *em = obx_errmsg();   /* set by the application's handler: outside input */
    bool poison = he == OBX_EPOISON; /* the handler says no retry can succeed */
    if (poison)
        snprintf(herr, sizeof herr, "handler refused the message as poison: %s",
                 obx__printable(em, strlen(em), hmsg, sizeof hmsg));
    else
        snprintf(herr, sizeof herr, "handler failed: %s: %s", obx_errname(he),
                 obx__printable(em, strlen(em), hmsg, sizeof hmsg));
    obx__utf8_trim(herr);
    obx__st_rollback(in->s); /* 3. the effect is undone */
    int32_t failures = 0;
    int64_t next_at = 0;
    if ((e = obx__st_begin(in->s))) return e;
    e = obx__st_failure_get(in->s, in->consumer, m->event_id, &failures, &next_at);
    if (e == OBX_ENOTFOUND) failures = 0, e = OBX_OK;
    next_at = retry_due(in, failures + 1, now);
    if (!e)
        e = obx__st_failure_bump(in->s, in->consumer, m->event_id, herr, now, next_at, &failures);
    if (!e) e = audit_consume(in, m, "FAILED", now, dur, herr);
    bool parks = poison || failures >= in->max_failures;
    if (!e && !parks && next_at > now) {
        snprintf(why, sizeof why, "retry %d scheduled: back-off %lld ms +-20 %%", (int)failures,
                 (long long)backoff_step(in, failures));
        e = audit_consume(in, m, "RETRY_SCHEDULED", now, 0, why);
    }
    if (!e)
        e = obx__st_commit(in->s);
    else
        obx__st_rollback(in->s);
    if (e) return e;
    if (poison) return park(in, m, failures, herr, now, out);
    if (parks) {
        snprintf(why, sizeof why, "%d handler failures, last: %.200s", (int)failures, herr);
        return park(in, m, failures, why, now, out);
    }
    out->outcome = OBX_INBOX_FAILED;
    out->failures = failures;
    out->retry_at = next_at;
    obx__text_copy(out->detail, herr, sizeof out->detail);
    return OBX_OK;
}

/* Phase 2b, after the handler succeeded: fills the consume receipt r and the watermark w of m
 * (the handler's text in result, its duration dur). Pure. */
static void receipt_rows(const obx_inbox *in, const obx_message *m, const char *digest,
                         const char *result, int64_t now, int64_t dur, obx__inbox_row *r,
                         obx__watermark_row *w) {
    memset(r, 0, sizeof *r);
    obx__strlcpy(r->consumer_id, in->consumer, sizeof r->consumer_id);
    obx__strlcpy(r->event_id, m->event_id, sizeof r->event_id);
    obx__strlcpy(r->payload_digest, digest, sizeof r->payload_digest);
    obx__strlcpy(r->event_type, m->event_type ? m->event_type : "", sizeof r->event_type);
    obx__strlcpy(r->tenant, m->tenant ? m->tenant : "", sizeof r->tenant);
    obx__strlcpy(r->outcome, "APPLIED", sizeof r->outcome);
    obx__text_copy(r->result, result, sizeof r->result);               /* the handler's text */
    obx__strlcpy(r->topic, m->topic ? m->topic : "", sizeof r->topic); /* checked above */
    r->partition = m->partition;
    r->offset = m->offset;
    r->consumed_at = now;
    r->duration_us = dur;
    /* evidence for the reconciler only when well-formed (outside input): otherwise the row is
     * an ordinary consume receipt */
    if (m->envelope_gen > 0 && attempt_id_ok(m->attempt_id) && m->dest_digest &&
        obx__is_digest(m->dest_digest)) {
        r->envelope_gen = m->envelope_gen;
        obx__strlcpy(r->attempt_id, m->attempt_id, sizeof r->attempt_id);
        obx__strlcpy(r->dest_digest, m->dest_digest, sizeof r->dest_digest);
    }
    memset(w, 0, sizeof *w);
    obx__strlcpy(w->consumer_id, in->consumer, sizeof w->consumer_id);
    obx__strlcpy(w->topic, r->topic, sizeof w->topic);
    w->partition = m->partition;
    w->offset = m->offset;
    obx__strlcpy(w->event_id, m->event_id, sizeof w->event_id);
    w->occurred_at = m->occurred_at;
    w->committed_at = now;
}

/* The claim's insert or the commit failed with e (the transaction is rolled back). */
static obx_err write_failed(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                            void *conn, int64_t now, int64_t mono_us_start,
                            int64_t (*mono_us)(void), obx_inbox_result *out, bool retried,
                            obx_err e) {
    if (e == OBX_ECONFLICT) {
        /* a concurrent consumer instance claimed this event first: the unique key held, and
         * the next look finds its receipt. Once: a receipt that exists but cannot be seen
         * (row-level security hiding it from this role) would otherwise loop for ever. */
        if (!retried) return process(in, m, h, user, conn, now, mono_us_start, mono_us, out, true);
        return obx__fail(OBX_ESTORE,
                         "inbox: a consume receipt of %s for consumer %s exists but is not "
                         "visible to this database role (row-level security?)",
                         m->event_id, in->consumer);
    }
    if (e == OBX_EDENIED) {
        /* the database refused this consumer's receipt (PostgreSQL row-level security: the
         * role is not granted this consumer or tenant): nothing ran or the effect was rolled
         * back with it; park the message, visible, instead of stalling on it */
        char refused[200], why[256];
        obx__printable(obx_errmsg(), strlen(obx_errmsg()), refused, sizeof refused);
        snprintf(why, sizeof why, "the consumer's database refused the receipt: %s", refused);
        return park(in, m, 0, why, now, out);
    }
    return e;
}

static obx_err process(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                       void *conn, int64_t now, int64_t mono_us_start, int64_t (*mono_us)(void),
                       obx_inbox_result *out, bool retried) {
    obx_err e;
    if (!in || !m || !h || !out) return obx__fail(OBX_EINVAL, "inbox: NULL argument");
    memset(out, 0, sizeof *out);
    char why[256];
    /* a NULL payload with a length is the caller's bug, not the message's */
    if (!m->payload && m->payload_len)
        return obx__fail(OBX_EINVAL, "message: payload is NULL with payload_len %zu",
                         m->payload_len);
    /* 1. validation before any effect */
    char digest[OBX_DIGEST_LEN + 1];
    if ((e = check_message(in, m, digest, why))) return e;
    if (*why) return park(in, m, 0, why, now, out);
    char key[68];
    if ((e = obx_inbox_effect_key(in->consumer, m->event_id, "effect", key))) return e;

    /* 2. one transaction: dedupe and claim, effect, receipt, watermark */
    if ((e = obx__st_begin(in->s))) return e;
    bool seen = false, done = false;
    if ((e = prior_receipt(in, m, digest, now, out, &seen, &done)) || done) return e;
    if ((e = retry_not_due(in, m, now, out, &done)) || done) return e;
    obx__inbox_row r;
    obx__watermark_row w;
    receipt_rows(in, m, digest, "", now, 0, &r, &w);
    /* the claim: the receipt is inserted before the handler runs. Another instance's insert of
     * the same (consumer, event) waits for this transaction (PostgreSQL's unique index; SQLite's
     * single writer) and then finds the receipt: its handler never runs (issue 46, item 7) */
    bool late_claim = OBX__MUTANT(HANDLER_BEFORE_CLAIM); /* test-only bug: claim after */
    if (!seen && !late_claim && (e = obx__st_inbox_put(in->s, &r))) {
        obx__st_rollback(in->s);
        return write_failed(in, m, h, user, conn, now, mono_us_start, mono_us, out, retried, e);
    }
    char result[256] = "";
    obx_err he = h(user, conn, m, key, result, sizeof result);
    if (!he && !seen && late_claim && (e = obx__st_inbox_put(in->s, &r))) {
        obx__st_rollback(in->s);
        return write_failed(in, m, h, user, conn, now, mono_us_start, mono_us, out, retried, e);
    }
    int64_t dur = mono_us ? mono_us() - mono_us_start : 0;
    if (he) return handler_failed(in, m, he, now, dur, out); /* the claim is rolled back */
    obx__text_copy(r.result, result, sizeof r.result);
    r.duration_us = dur;
    e = seen ? OBX_OK : obx__st_inbox_finish(in->s, in->consumer, m->event_id, r.result, dur);
    if (!e) e = obx__st_watermark_put(in->s, &w);
    if (!e) e = obx__st_failure_clear(in->s, in->consumer, m->event_id);
    if (!e) e = audit_consume(in, m, "APPLIED", now, dur, r.result);
    if (!e)
        e = obx__st_commit(in->s);
    else
        obx__st_rollback(in->s);
    if (e) return write_failed(in, m, h, user, conn, now, mono_us_start, mono_us, out, retried, e);
    out->outcome = OBX_INBOX_APPLIED;
    out->ack = 1;
    obx__strlcpy(out->result, r.result, sizeof out->result);
    return OBX_OK;
}

obx_err obx__inbox_keep_copy(obx_inbox *in, const obx_message *m, int64_t now) {
    if (!in || !m || !m->event_id) return obx__fail(OBX_EINVAL, "inbox: NULL argument");
    obx__retry_copy_row r;
    memset(&r, 0, sizeof r);
    obx__strlcpy(r.consumer_id, in->consumer, sizeof r.consumer_id);
    obx__strlcpy(r.event_id, m->event_id, sizeof r.event_id);
    obx__text_copy(r.topic, m->topic, sizeof r.topic);
    r.partition = m->partition;
    r.offset = m->offset;
    r.payload = (unsigned char *)(uintptr_t)m->payload;
    r.payload_len = m->payload_len;
    r.kept_at = now;
    obx_err e = obx__poison_digest(m->payload, m->payload_len, r.payload_digest);
    if (!e && !(r.headers_json = headers_of(m))) e = obx__fail(OBX_ENOMEM, "inbox: out of memory");
    if (!e) e = obx__st_begin(in->s);
    if (!e) {
        e = obx__st_retry_copy_put(in->s, &r);
        if (!e)
            e = obx__st_commit(in->s);
        else
            obx__st_rollback(in->s);
    }
    free(r.headers_json);
    return e;
}

obx_message obx__message_of_headers(const json_t *hj) {
#define HS(k) json_string_value(json_object_get(hj, k))
    return (obx_message){
        .envelope_gen = (int)json_integer_value(json_object_get(hj, "envelope_gen")),
        .event_type = HS("event_type"),
        .tenant = HS("tenant"),
        .aggregate_type = HS("aggregate_type"),
        .aggregate_id = HS("aggregate_id"),
        .aggregate_version = json_integer_value(json_object_get(hj, "aggregate_version")),
        .correlation_id = HS("correlation_id"),
        .causation_id = HS("causation_id"),
        .traceparent = HS("traceparent"),
        .occurred_at = json_integer_value(json_object_get(hj, "occurred_at")),
        .payload_digest = HS("payload_digest"),
        .attempt_id = HS("attempt_id"),
        .dest_digest = HS("dest_digest"),
        .encryption = HS("encryption")};
#undef HS
}

/* The message a kept copy holds: its headers (hj, which the strings point into), bytes and
 * position. */
static obx_message message_of_copy(const json_t *hj, const obx__retry_copy_row *row) {
    obx_message m = obx__message_of_headers(hj);
    m.event_id = row->event_id;
    m.payload = row->payload ? (const void *)row->payload : "";
    m.payload_len = row->payload_len;
    m.topic = row->topic;
    m.partition = row->partition;
    m.offset = row->offset;
    m.redelivered = 1;
    return m;
}

obx_err obx__inbox_retry_copy(obx_inbox *in, const obx__retry_copy_row *row, obx_inbox_handler h,
                              void *user, void *conn, int64_t now, int64_t mono_us_start,
                              int64_t (*mono_us)(void), obx_inbox_result *out) {
    if (!in || !row || !out) return obx__fail(OBX_EINVAL, "inbox: NULL argument");
    memset(out, 0, sizeof *out);
    json_t *hj = json_loads(row->headers_json ? row->headers_json : "{}", 0, NULL);
    if (!hj) hj = json_object();
    if (!hj) return obx__fail(OBX_ENOMEM, "inbox: out of memory");
    obx_message m = message_of_copy(hj, row);
    char dg[OBX_DIGEST_LEN + 1], why[256];
    obx_err e = obx__poison_digest(row->payload, row->payload_len, dg);
    if (!e && strcmp(dg, row->payload_digest)) {
        /* evidence is the bytes: a copy that changed since it was kept is never run */
        snprintf(
            why, sizeof why,
            "the kept retry copy's bytes do not match its digest (kept %.20s..., now %.20s...)",
            row->payload_digest, dg);
        e = park(in, &m, 0, why, now, out);
    } else if (!e)
        e = obx__inbox_process_at(in, &m, h, user, conn, now, mono_us_start, mono_us, out);
    if (!e && out->ack) e = obx__st_retry_copy_del(in->s, in->consumer, row->event_id);
    json_decref(hj);
    return e;
}

static int64_t mono_us(void) { return obx__mono_ms() * 1000; }

obx_err obx_inbox_process(obx_inbox *in, const obx_message *m, obx_inbox_handler h, void *user,
                          void *conn, obx_inbox_result *out) {
    obx__clear_error();
    return obx__inbox_process_at(in, m, h, user, conn, obx__wall_ms(), mono_us(), mono_us, out);
}

obx_err obx_inbox_poison_list(obx_store *db, const char *consumer, char **out) {
    if (!db || !out) return obx__fail(OBX_EINVAL, "NULL argument");
    obx__clear_error();
    *out = NULL;
    obx__poison_row *rows = NULL;
    size_t n = 0;
    obx_err e = obx__st_poison_list(db, consumer, NULL, &rows, &n);
    if (e) return e;
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *h = json_loads(rows[i].headers_json ? rows[i].headers_json : "{}", 0, NULL);
        json_array_append_new(
            arr,
            json_pack("{s:s,s:s,s:s,s:s,s:i,s:s,s:s,s:i,s:I,s:I,s:I,s:o}", "consumer_id",
                      rows[i].consumer_id, "event_id", rows[i].event_id, "state", rows[i].state,
                      "payload_digest", rows[i].payload_digest, "failures", (int)rows[i].failures,
                      "last_error", rows[i].last_error, "topic", rows[i].topic, "partition",
                      (int)rows[i].partition, "offset", (json_int_t)rows[i].offset, "parked_at_ms",
                      (json_int_t)rows[i].parked_at, "updated_at_ms",
                      (json_int_t)rows[i].updated_at, "headers", h ? h : json_object()));
    }
    obx__poison_rows_free(rows, n);
    return obx__json_out(arr, out);
}

obx_err obx_inbox_redrive(obx_store *db, const char *consumer, const char *event_id) {
    if (!db) return obx__fail(OBX_EINVAL, "NULL argument");
    obx__clear_error();
    obx_err e = obx__check_field("consumer", consumer, 1, OBX_NAME_MAX, OBX__CS_NAME);
    if (!e) e = obx_event_id_check(event_id);
    if (!e) e = obx__st_begin(db);
    if (e) return e;
    obx__poison_row p; /* the event's parked copy, if any: every copy of it is re-driven */
    e = obx__st_poison_get(db, consumer, event_id, NULL, &p);
    if (!e) {
        if (strcmp(p.state, "PARKED"))
            e = obx__fail(OBX_EREFUSED, "poison message %s is %s, not PARKED", event_id, p.state);
        free(p.payload);
        free(p.headers_json);
    }
    if (!e) e = obx__st_poison_set_state(db, consumer, event_id, "REDRIVE", obx__wall_ms());
    /* a re-driven message starts with a clean failure count */
    if (!e) e = obx__st_failure_clear(db, consumer, event_id);
    if (e) {
        obx__st_rollback(db);
        return e;
    }
    return obx__st_commit(db);
}

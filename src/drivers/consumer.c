/*
 * consumer.c — the consumer loop: deliveries from a broker's consumer side, each through the
 * inbox in the consumer's database, and the broker position acknowledged only after the
 * inbox committed (docs/design.md, "Consumers and the inbox"). Also re-drives poison messages an
 * operator marked.
 *
 * The retry back-off: a delivery the inbox answers FAILED or DELAYED with a retry due later
 * (result.retry_at) is given back (consume_redeliver, as every failure) and its partition is
 * paused (consume_pause) until then: the broker hands nothing of it out meanwhile, and the
 * partition is resumed at the first poll past the due time. Per-key order is kept: everything
 * after the message on its partition waits behind it. A delivery of a paused partition that
 * still arrives (fetched before the pause) is given back unprocessed. The failure row in the
 * consumer's database is the durable schedule: a restarted consumer (or another instance) gets
 * DELAYED from the inbox and pauses again; the in-memory pause only spares the round trips.
 *
 * Unordered (obx_consumer_options.unordered): a delivery the inbox answers FAILED (not parked)
 * or DELAYED does not hold its partition. Its copy is kept in the consumer's database first
 * (obx__inbox_keep_copy; the first copy of an event stays), then the broker is acknowledged past
 * it and the batch goes on: later messages, of its key too, are applied meanwhile. Each poll
 * runs the kept copies whose retry is due (retry_copies, before the broker's deliveries) through
 * the inbox, which checks the copy's bytes against their digest first; a copy ends with a final
 * outcome. A killed consumer loses nothing: a copy is written before the ack (killed between the
 * two, the broker delivers the message again and the inbox answers DELAYED: absorbed, the copy
 * kept), and the failure row keeps the due time. Copies are run in either mode, so that a
 * consumer switched back to ordered still retries what an unordered run kept.
 */
#include "drivers/config.h"
#include "drivers/log.h"
#include "drivers/otel.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

struct obx_consumer {
    obx_store *db;
    void *conn;
    obx_inbox *in;
    obx__broker *b;
    obx_inbox_handler h;
    void *user;
    int (*stop)(void *stop_user); /* obx_consumer_options.stop, or NULL */
    void *stop_user;
    size_t max_batch;
    char consumer[OBX_NAME_MAX + 1];
    char group[OBX_NAME_MAX + 1]; /* the subscription, to make again (resubscribe) */
    char **topics;                /* owned copies */
    size_t n_topics;
    bool resubscribe; /* a redelivery could not be arranged: subscribe again before polling */
    char resub_why[OBX_TEXT_MAX + 1]; /* why (for the log) */
    obx_otel *otel;                   /* obx_consumer_options.otel (borrowed), NULL: no spans */
    struct hold {                     /* partitions paused until a retry is due (wall ms) */
        char topic[OBX_TOPIC_MAX + 1];
        int32_t partition;
        int64_t due;
    } * holds;
    size_t n_holds;
    bool unordered; /* obx_consumer_options.unordered */
    bool copies;    /* kept copies may exist (unordered; ordered: until a poll finds none) */
};

obx_err obx_consumer_open(obx_store *db, void *conn, const obx_consumer_options *o,
                          obx_inbox_handler h, void *user, obx_consumer **out) {
    if (!db || !o || !h || !out) return obx__fail(OBX_EINVAL, "consumer: NULL argument");
    obx__clear_error();
    *out = NULL;
    if (!o->n_topics) return obx__fail(OBX_EINVAL, "topics: at least one is required");
    obx_consumer *c = calloc(1, sizeof *c);
    if (!c) return obx__fail(OBX_ENOMEM, "consumer: out of memory");
    c->db = db;
    c->conn = conn;
    c->h = h;
    c->user = user;
    c->max_batch = o->max_batch ? o->max_batch : 64;
    c->stop = o->stop;
    c->stop_user = o->stop_user;
    c->otel = o->otel;
    c->unordered = o->unordered != 0;
    obx_err e = obx_inbox_open(db, &o->inbox, &c->in);
    if (!e) e = obx__br_open(o->broker_url, o->broker_props, o->n_broker_props, &c->b);
    if (!e && !(obx__br_caps(c->b) & OBX__BCAP_CONSUME))
        e = obx__fail(OBX_EUNSUPPORTED, "broker %s has no consumer side", obx__br_name(c->b));
    obx__strlcpy(c->group, o->group ? o->group : o->inbox.consumer_id, sizeof c->group);
    if (!e && !(c->topics = calloc(o->n_topics, sizeof *c->topics)))
        e = obx__fail(OBX_ENOMEM, "consumer: out of memory");
    for (size_t i = 0; !e && i < o->n_topics; i++, c->n_topics++)
        if (!(c->topics[i] = obx__strdup(o->topics[i])))
            e = obx__fail(OBX_ENOMEM, "consumer: out of memory");
    if (!e) e = obx__br_consume_open(c->b, c->group, (const char *const *)c->topics, c->n_topics);
    if (e) {
        obx_consumer_close(c);
        return e;
    }
    obx__strlcpy(c->consumer, o->inbox.consumer_id, sizeof c->consumer);
    c->copies = true; /* the first poll looks; an ordered consumer stops once none is left */
    *out = c;
    return OBX_OK;
}

static int64_t mono_us(void) { return obx__mono_ms() * 1000; }

static void count(obx_consumer_counts *k, obx_inbox_outcome o) {
    if (!k) return;
    switch (o) {
    case OBX_INBOX_APPLIED: k->applied++; break;
    case OBX_INBOX_DUPLICATE: k->duplicates++; break;
    case OBX_INBOX_QUARANTINED: k->quarantined++; break;
    case OBX_INBOX_FAILED: k->failed++; break;
    case OBX_INBOX_POISONED: k->poisoned++; break;
    case OBX_INBOX_DELAYED: k->delayed++; break;
    }
}

static size_t hold_at(const obx_consumer *c, const char *topic, int32_t partition) {
    size_t i = 0;
    while (i < c->n_holds &&
           (c->holds[i].partition != partition || strcmp(c->holds[i].topic, topic)))
        i++;
    return i;
}

/* Pauses d's partition until due (its redelivery already arranged). */
static obx_err hold(obx_consumer *c, const obx__delivery *d, int64_t due) {
    size_t i = hold_at(c, d->topic, d->partition);
    if (i == c->n_holds) {
        struct hold *h = realloc(c->holds, (c->n_holds + 1) * sizeof *h);
        if (!h) return obx__fail(OBX_ENOMEM, "consumer: out of memory");
        c->holds = h;
        obx__strlcpy(h[i].topic, d->topic, sizeof h[i].topic);
        h[i].partition = d->partition;
        c->n_holds++;
    }
    c->holds[i].due = due;
    return obx__br_consume_pause(c->b, d->topic, d->partition, true);
}

/* A broker call's error as obx_consumer_poll reports it: OBX_EBROKER, message kept, for all but
 * a caller's or a memory error, so that its caller can tell the broker's outage from its
 * database's (the two both say OBX_ECONNLOST: `obx consume` blamed its database for a RabbitMQ
 * node lost during an ack, test_rabbit_cluster). */
static obx_err from_broker(obx_err e) {
    if (!e || e == OBX_EBROKER || e == OBX_ENOMEM || e == OBX_EINVAL) return e;
    return obx_error_set(OBX_EBROKER, obx_errmsg());
}

/* Resumes the partitions whose retry is due. */
static obx_err resume_due(obx_consumer *c, int64_t now) {
    for (size_t i = 0; i < c->n_holds;) {
        if (c->holds[i].due > now) {
            i++;
            continue;
        }
        obx_err e = obx__br_consume_pause(c->b, c->holds[i].topic, c->holds[i].partition, false);
        if (e) return from_broker(e);
        c->holds[i] = c->holds[--c->n_holds];
    }
    return OBX_OK;
}

static obx_err redrive(obx_consumer *c, obx_consumer_counts *k) {
    obx__poison_row *rows = NULL;
    size_t n = 0;
    obx_err e = obx__st_poison_list(c->db, c->consumer, "REDRIVE", &rows, &n);
    for (size_t i = 0; !e && i < n; i++) {
        obx__poison_row p;
        if ((e = obx__st_poison_get(c->db, c->consumer, rows[i].event_id, rows[i].payload_digest,
                                    &p)))
            break;
        json_t *hj = json_loads(p.headers_json ? p.headers_json : "{}", 0, NULL);
        obx_message m = obx__message_of_headers(hj);
        m.event_id = p.event_id;
        m.payload = p.payload ? (const void *)p.payload : "";
        m.payload_len = p.payload_len;
        m.topic = p.topic;
        m.partition = p.partition;
        m.offset = p.offset;
        obx_inbox_result r;
        int64_t t0 = obx__wall_ms();
        e = obx__inbox_process_at(c->in, &m, c->h, c->user, c->conn, t0, mono_us(), mono_us, &r);
        if (!e) obx__otel_process(c->otel, c->consumer, &m, &r, t0);
        if (!e && (r.outcome == OBX_INBOX_APPLIED || r.outcome == OBX_INBOX_DUPLICATE)) {
            e = obx__st_poison_set_state(c->db, c->consumer, p.event_id, "DONE", obx__wall_ms());
            if (k) k->redriven++;
        }
        if (!e) count(k, r.outcome);
        json_decref(hj);
        free(p.payload);
        free(p.headers_json);
    }
    obx__poison_rows_free(rows, n);
    return e;
}

/* Runs the kept copies whose retry is due (unordered consumers keep them; the inbox checks
 * each copy's bytes and deletes it once its outcome is final). */
static obx_err retry_copies(obx_consumer *c, obx_consumer_counts *k) {
    obx__retry_copy_row *rows = NULL;
    size_t n = 0;
    if (!c->copies) return OBX_OK;
    obx_err e = obx__st_retry_copy_list(c->db, c->consumer, obx__wall_ms(), 16, &rows, &n);
    if (!e && !n && !c->unordered) { /* an ordered consumer: none due; any later? */
        e = obx__st_retry_copy_list(c->db, c->consumer, INT64_MAX, 1, &rows, &n);
        c->copies = e || n; /* none: an ordered consumer never keeps one */
        obx__retry_copy_rows_free(rows, n);
        return e;
    }
    for (size_t i = 0; !e && i < n; i++) {
        if (c->stop && c->stop(c->stop_user)) break;
        obx_inbox_result r;
        int64_t t0 = obx__wall_ms();
        e = obx__inbox_retry_copy(c->in, &rows[i], c->h, c->user, c->conn, t0, mono_us(), mono_us,
                                  &r);
        if (e) break;
        if (k) k->retried++;
        count(k, r.outcome);
        if (r.outcome == OBX_INBOX_FAILED)
            obx__log_event("consumer handler failures", OBX__LOG_WARN, "consumer", rows[i].event_id,
                           NULL, NULL, "handler failed on the kept copy (%d so far): %s%s",
                           r.failures, r.detail, r.retry_at > t0 ? " (retry scheduled)" : "");
    }
    obx__retry_copy_rows_free(rows, n);
    return e;
}

obx_err obx_consumer_next_retry(obx_consumer *c, int64_t *due_ms) {
    if (!c || !due_ms) return obx__fail(OBX_EINVAL, "consumer: NULL argument");
    obx__clear_error();
    *due_ms = 0;
    for (size_t i = 0; i < c->n_holds; i++)
        if (!*due_ms || c->holds[i].due < *due_ms) *due_ms = c->holds[i].due;
    obx__retry_copy_row *rows = NULL;
    size_t n = 0;
    obx_err e = obx__st_retry_copy_list(c->db, c->consumer, INT64_MAX, 1, &rows, &n);
    if (!e && n) {
        int64_t d = rows[0].due_at > 0 ? rows[0].due_at : 1;
        if (!*due_ms || d < *due_ms) *due_ms = d;
    }
    obx__retry_copy_rows_free(rows, n);
    /* the durable schedule: a failure not parked whose message is to come again (a restarted
     * ordered consumer has paused nothing yet) */
    int32_t failures = 0;
    int64_t next = 0;
    obx_err fe = e ? e : obx__st_failure_get(c->db, c->consumer, NULL, &failures, &next);
    if (!fe && next > 0 && (!*due_ms || next < *due_ms)) *due_ms = next;
    return fe == OBX_ENOTFOUND ? OBX_OK : fe;
}

/* Unordered: d (the inbox answered r: a failure not parked, or a retry not due) does not hold
 * its partition: its copy is kept, then the broker is acknowledged past it. */
static obx_err keep_and_ack(obx_consumer *c, const obx__delivery *d, const obx_message *m,
                            const obx_inbox_result *r, int64_t t0) {
    if (r->outcome == OBX_INBOX_FAILED)
        obx__log_event("consumer handler failures", OBX__LOG_WARN, "consumer", m->event_id, NULL,
                       m->correlation_id, "handler failed (%d so far): %s (copy kept, retry %s)",
                       r->failures, r->detail, r->retry_at > t0 ? "scheduled" : "at once");
    obx_err e = obx__inbox_keep_copy(c->in, m, t0);
    return e ? e : from_broker(obx__br_consume_ack(c->b, d));
}

/* Subscribes again: every backend's consume_open replaces the subscription, and the new one
 * starts from the committed positions (Kafka: a new group member; RabbitMQ: the channel closed,
 * what was not acknowledged requeued; the local log: its stored offsets). Whatever was not
 * acknowledged comes again; the inbox answers what was applied meanwhile as DUPLICATE. */
static obx_err resubscribe(obx_consumer *c, const char *why) {
    obx_err e = obx__br_consume_open(c->b, c->group, (const char *const *)c->topics, c->n_topics);
    if (e) return from_broker(e);
    c->resubscribe = false;
    c->n_holds = 0; /* a new subscription pauses nothing; the inbox answers DELAYED again */
    obx__log(OBX__LOG_WARN, "consumer", NULL, NULL, NULL,
             "subscribed again from the committed positions: a redelivery could not be arranged "
             "earlier (%s)",
             why);
    return OBX_OK;
}

obx_err obx_consumer_poll(obx_consumer *c, int timeout_ms, obx_consumer_counts *k) {
    if (!c) return obx__fail(OBX_EINVAL, "consumer: NULL");
    obx__clear_error();
    /* never a poll past a delivery that was to come again and did not: later positions would be
     * acknowledged over it, and it would never be applied */
    obx__log_fold_flush(false); /* a burst of handler failures: its count, once its window ends */
    obx_err e = c->resubscribe ? resubscribe(c, c->resub_why) : OBX_OK;
    if (!e) e = redrive(c, k);
    if (!e) e = retry_copies(c, k);
    if (!e) e = resume_due(c, obx__wall_ms());
    if (e) return e;
    obx__delivery *d = calloc(c->max_batch, sizeof *d);
    if (!d) return obx__fail(OBX_ENOMEM, "consumer: out of memory");
    size_t n = 0;
    e = from_broker(obx__br_consume_poll(c->b, timeout_ms, d, c->max_batch, &n));
    size_t i = 0;
    bool failed = false;
    int64_t due = 0; /* the failed delivery's retry, when later than now */
    for (; !e && i < n; i++) {
        /* a stop asked for: the rest of the batch is redelivered below, nothing acknowledged */
        if (c->stop && c->stop(c->stop_user)) break;
        /* fetched before its partition was paused: its position is set back already (to the
         * delivery that waits, at or before this one), so it comes again after the resume */
        if (hold_at(c, d[i].topic, d[i].partition) < c->n_holds) continue;
        obx_message m = obx__message_of(&d[i]);
        if (k) k->delivered++;
        obx_inbox_result r;
        int64_t t0 = obx__wall_ms();
        e = obx__inbox_process_at(c->in, &m, c->h, c->user, c->conn, t0, mono_us(), mono_us, &r);
        if (!e) obx__otel_process(c->otel, c->consumer, &m, &r, t0);
        if (e) break;
        count(k, r.outcome);
        if (r.ack)
            e = from_broker(obx__br_consume_ack(c->b, &d[i]));
        else if (c->unordered && (r.outcome == OBX_INBOX_FAILED || r.outcome == OBX_INBOX_DELAYED))
            e = keep_and_ack(c, &d[i], &m, &r, t0);
        else {
            /* a failed handler, or a retry not due: stop this batch here so that order is kept;
             * the message and everything after it come again (positions were not
             * acknowledged), its partition paused until the retry is due */
            if (r.outcome == OBX_INBOX_FAILED)
                obx__log_event("consumer handler failures", OBX__LOG_WARN, "consumer", m.event_id,
                               NULL, m.correlation_id, "handler failed (%d so far): %s%s",
                               r.failures, r.detail, r.retry_at > t0 ? " (retry scheduled)" : "");
            if (r.retry_at > t0 && obx__br_has_consume_pause(c->b)) due = r.retry_at;
            failed = true;
            break;
        }
    }
    /* The failed delivery and everything not yet processed must come again: for each
     * partition among d[i..n-1], redeliver from its first unprocessed delivery. (A failure on
     * the last delivery of a batch once skipped this, and later acks moved the committed
     * offset past it: tests/engine fault suite, consumer_loop_redelivers_failed_last.) This
     * holds as well when the inbox or the ack returned an error (a store fault, no memory):
     * the fault loops found the delivery skipped for the session, and the next acks moving
     * the committed offset past it — the event never applied (test_fault_loops, store call
     * k=117, store outage from k=35, allocation k=192). */
    /* A redelivery that fails (a Kafka seek that timed out: the fetcher goes on past it) would
     * let the next poll hand out later positions, whose acks then cover the skipped deliveries:
     * the demo saw 16 events never applied, each one behind a failed handler call or in the
     * same batch as one (tests/engine fault suite, consumer_redeliver_fails). Then the
     * consumer subscribes again, from the committed positions, before it polls again. */
    if (failed || i < n) {
        obx_err re = OBX_OK;
        for (size_t j = i; j < n && !re; j++) {
            bool first = hold_at(c, d[j].topic, d[j].partition) == c->n_holds;
            for (size_t k2 = i; k2 < j; k2++)
                if (d[k2].partition == d[j].partition && !strcmp(d[k2].topic, d[j].topic))
                    first = false;
            if (first) re = obx__br_consume_redeliver(c->b, &d[j]);
        }
        if (!re && due) re = hold(c, &d[i], due);
        if (re) {
            c->resubscribe = true;
            obx__strlcpy(c->resub_why, obx_errmsg(), sizeof c->resub_why);
            re = resubscribe(c,
                             c->resub_why); /* mended when it works; else again at the next poll */
        }
        if (!e) e = re;
    }
    for (size_t j = 0; j < n; j++) obx__delivery_free(&d[j]);
    free(d);
    return e;
}

void obx_consumer_close(obx_consumer *c) {
    if (!c) return;
    obx__log_fold_flush(true);
    obx_inbox_close(c->in);
    obx__br_close(c->b);
    free(c->holds);
    for (size_t i = 0; i < c->n_topics; i++) free(c->topics[i]);
    free(c->topics);
    free(c);
}

/*
 * shadow.c — shadow mode (docs/migration.md, the rollout's first step): for the events another
 * dispatcher owns, compute what obx would send — destination, partition, key, payload and
 * destination digests — and compare it with what that dispatcher actually published, as seen
 * on the broker or in a receipts feed.
 *
 * Contracts:
 *   1. Nothing here claims, sends or writes: the store is only read (read_events, by filter
 *      and by IDs), the broker is asked for partition counts and read through a consumer group
 *      of its own that never commits a position.
 *   2. Each publish slot is compared on its own: a delivery-set event is expected once per
 *      target, under its logical event ID, on that target's topic.
 *   3. Findings, each with the event ID and both sides: MISSING (nothing published for it and
 *      it is older than the grace time), DESTINATION (published elsewhere: another cluster or
 *      topic, or a destination digest that is not the frozen one), PARTITION, PAYLOAD (the
 *      published bytes' digest differs from the frozen one), UNKNOWN_ON_BROKER (an event ID the
 *      outbox never committed). Duplicates are counted, not findings: delivery is at least once.
 */
#include "engine/engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FINDINGS_MAX 1000 /* listed in the report; the counts are always exact */

/* ---- observations -----------------------------------------------------------------------------
 */

static obx_err push_obs(obx__observed **v, size_t *n, size_t *cap, obx__observed **slot) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        obx__observed *p = realloc(*v, c * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "shadow: out of memory");
        *v = p;
        *cap = c;
    }
    *slot = &(*v)[(*n)++];
    memset(*slot, 0, sizeof **slot);
    return OBX_OK;
}

obx_err obx__shadow_observe_broker(obx__engine *e, const char *const *topics, size_t n,
                                   int64_t since, obx__observed **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (!e->b) return obx__fail(OBX_EINVAL, "shadow: no broker to observe (give a feed)");
    if (!(obx__br_caps(e->b) & OBX__BCAP_CONSUME))
        return obx__fail(OBX_EUNSUPPORTED,
                         "shadow: the %s broker has no consumer side (give a "
                         "receipts feed)",
                         obx__br_name(e->b));
    /* reading a queue takes its messages from the consumers that own it */
    if (!strcmp(obx__br_name(e->b), "amqp"))
        return obx__fail(OBX_EUNSUPPORTED, "shadow: reading RabbitMQ queues would take messages "
                                           "from their consumers: give a receipts feed");
    if (!n) return OBX_OK;
    char group[64];
    obx_err err = obx__new_id(&e->gen, "obx-shadow-", obx__wall_ms(), group, sizeof group);
    if (!err) err = obx__br_consume_open(e->b, group, topics, n);
    if (err) return err;
    size_t cap = 0, empty = 0;
    enum { BATCH = 256 };
    obx__delivery *d = calloc(BATCH, sizeof *d);
    if (!d) return obx__fail(OBX_ENOMEM, "shadow: out of memory");
    /* until two polls in a row bring nothing (a networked consumer needs a moment to join) */
    while (!err && empty < 2) {
        size_t k = 0;
        err = obx__br_consume_poll(e->b, strcmp(obx__br_name(e->b), "log") ? 500 : 0, d, BATCH, &k);
        empty = k ? 0 : empty + 1;
        for (size_t i = 0; i < k; i++) {
            obx__observed *o = NULL;
            if (!err && !d[i].header_error[0] && (!since || d[i].broker_ts >= since) &&
                !(err = push_obs(out, n_out, &cap, &o))) {
                obx__strlcpy(o->event_id, d[i].env.event_id, sizeof o->event_id);
                o->envelope_gen = d[i].env.envelope_gen;
                obx__strlcpy(o->cluster, e->cluster, sizeof o->cluster);
                obx__strlcpy(o->topic, d[i].topic, sizeof o->topic);
                o->partition = d[i].partition;
                o->offset = d[i].offset;
                /* what was published, not what its header claims */
                err = obx_sha256_digest(d[i].payload, d[i].payload_len, o->payload_digest);
                obx__strlcpy(o->dest_digest, d[i].dest_digest, sizeof o->dest_digest);
                o->ts = d[i].broker_ts;
            }
            obx__delivery_free(&d[i]);
        }
    }
    free(d);
    if (err) {
        free(*out);
        *out = NULL;
        *n_out = 0;
    }
    return err;
}

static obx_err feed_field(json_t *o, const char *name, bool required, size_t max, int line,
                          obx__charset cs, char *out, size_t cap) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) {
        if (required) return obx__fail(OBX_EINVAL, "feed line %d: %s: missing", line, name);
        return OBX_OK;
    }
    if (!json_is_string(v))
        return obx__fail(OBX_EINVAL, "feed line %d: %s: not a string", line, name);
    obx_err e = obx__check_field(name, json_string_value(v), required ? 1 : 0, max, cs);
    if (e) return obx__fail_prefix(e, "feed line %d", line);
    obx__strlcpy(out, json_string_value(v), cap);
    return OBX_OK;
}

static obx_err feed_int(json_t *o, const char *name, bool required, int64_t min, int64_t max,
                        int line, int64_t *out) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) {
        if (required) return obx__fail(OBX_EINVAL, "feed line %d: %s: missing", line, name);
        return OBX_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        return obx__fail(OBX_EINVAL, "feed line %d: %s: not an integer in %lld..%lld", line, name,
                         (long long)min, (long long)max);
    *out = json_integer_value(v);
    return OBX_OK;
}

obx_err obx__shadow_parse_feed(const char *text, size_t len, obx__observed **out, size_t *n) {
    *out = NULL;
    *n = 0;
    size_t cap = 0;
    obx_err e = OBX_OK;
    int line = 0;
    for (size_t at = 0; !e && at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t l = nl ? (size_t)(nl - (text + at)) : len - at;
        const char *p = text + at;
        at += l + (nl ? 1 : 0);
        line++;
        while (l && (p[l - 1] == '\r' || p[l - 1] == ' ' || p[l - 1] == '\t')) l--;
        while (l && (*p == ' ' || *p == '\t')) p++, l--;
        if (!l || *p == '#') continue;
        json_error_t je;
        json_t *o = json_loadb(p, l, 0, &je);
        if (!o || !json_is_object(o)) {
            json_decref(o);
            e = obx__fail(OBX_EINVAL, "feed line %d: not a JSON object (%s)", line,
                          o ? "another JSON value" : je.text);
            break;
        }
        obx__observed *ob = NULL;
        int64_t part = 0, off = 0, gen = 0, ts = 0;
        if (!(e = push_obs(out, n, &cap, &ob)) &&
            !(e = feed_field(o, "event_id", true, OBX_EVENT_ID_LEN, line, OBX__CS_NAME,
                             ob->event_id, sizeof ob->event_id)) &&
            !(e = feed_field(o, "topic", true, OBX_TOPIC_MAX, line, OBX__CS_NAME, ob->topic,
                             sizeof ob->topic)) &&
            !(e = feed_int(o, "partition", true, 0, INT32_MAX, line, &part)) &&
            !(e = feed_int(o, "offset", true, -1, INT64_MAX, line, &off)) &&
            !(e = feed_field(o, "payload_digest", true, OBX_DIGEST_LEN, line, OBX__CS_OWNER,
                             ob->payload_digest, sizeof ob->payload_digest)) &&
            !(e = feed_field(o, "cluster", false, OBX_NAME_MAX, line, OBX__CS_NAME, ob->cluster,
                             sizeof ob->cluster)) &&
            !(e = feed_field(o, "dest_digest", false, OBX_DIGEST_LEN, line, OBX__CS_OWNER,
                             ob->dest_digest, sizeof ob->dest_digest)) &&
            !(e = feed_field(o, "key", false, OBX_KEY_MAX, line, OBX__CS_TEXT, ob->key,
                             sizeof ob->key)) &&
            !(e = feed_int(o, "envelope_gen", false, 1, INT32_MAX, line, &gen)) &&
            !(e = feed_int(o, "ts", false, 0, INT64_MAX, line, &ts))) {
            if (obx_event_id_check(ob->event_id))
                e = obx__fail_prefix(OBX_EINVAL, "feed line %d: event_id", line);
            else if (!obx__is_digest(ob->payload_digest))
                e = obx__fail(OBX_EINVAL,
                              "feed line %d: payload_digest: not \"sha256:\" + 64 "
                              "lowercase hex",
                              line);
            else if (ob->dest_digest[0] && !obx__is_digest(ob->dest_digest))
                e = obx__fail(OBX_EINVAL,
                              "feed line %d: dest_digest: not \"sha256:\" + 64 "
                              "lowercase hex",
                              line);
            ob->partition = (int32_t)part;
            ob->offset = off;
            ob->envelope_gen = (int32_t)gen;
            ob->ts = ts;
        }
        json_decref(o);
    }
    if (e) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return e;
}

/* ---- the expected side
 * --------------------------------------------------------------------------- */

/* The slots in scope (contract 2): the shadowed aliases' and types' events committed since. */
static obx_err expected(obx__engine *e, const obx__shadow_req *req, obx__rows *out) {
    size_t limit = req->limit ? req->limit : 100000;
    size_t rounds = req->n_types ? req->n_types : 1;
    obx_err err = OBX_OK;
    for (size_t t = 0; !err && t < rounds && out->n < limit; t++) {
        obx__event_filter f = {.event_type = req->n_types ? req->types[t] : NULL,
                               .aliases = req->aliases,
                               .n_aliases = req->n_aliases,
                               .committed_from = req->since};
        for (;;) {
            size_t before = out->n;
            f.limit = limit - out->n < 1000 ? limit - out->n : 1000;
            if ((err = obx__st_read_events(
                     e->s, &(obx__read_req){.by = OBX__READ_FILTER, .filter = &f}, out)))
                break;
            if (out->n == before || out->n >= limit) break;
            f.after_seq = out->v[out->n - 1].seq;
        }
    }
    return err;
}

obx_err obx__shadow_topics(obx__engine *e, int64_t now, const obx__shadow_req *req, char ***topics,
                           size_t *n) {
    (void)now;
    *topics = NULL;
    *n = 0;
    obx__rows rows = {0};
    obx_err err = expected(e, req, &rows);
    size_t cap = rows.n + req->n_topics + 1;
    char **v = err ? NULL : calloc(cap, sizeof *v);
    if (!err && !v) err = obx__fail(OBX_ENOMEM, "shadow: out of memory");
    for (size_t i = 0; !err && i < rows.n + req->n_topics; i++) {
        const char *t = i < rows.n ? rows.v[i].dest.topic : req->topics[i - rows.n];
        bool seen = false;
        for (size_t k = 0; k < *n && !seen; k++) seen = !strcmp(v[k], t);
        if (seen) continue;
        if (!(v[*n] = obx__strdup(t)))
            err = obx__fail(OBX_ENOMEM, "shadow: out of memory");
        else
            (*n)++;
    }
    obx__rows_free(&rows);
    if (err) {
        for (size_t i = 0; v && i < *n; i++) free(v[i]);
        free(v);
        *n = 0;
        return err;
    }
    *topics = v;
    return OBX_OK;
}

/* ---- the comparison ---------------------------------------------------------------------------
 */

static int cmp_obs(const void *a, const void *b) {
    const obx__observed *x = *(obx__observed *const *)a, *y = *(obx__observed *const *)b;
    int c = strcmp(x->event_id, y->event_id);
    return c ? c : (x->offset > y->offset) - (x->offset < y->offset);
}

/* One comparison: the findings (owned, FINDINGS_MAX at most), the counts, and the observations
 * sorted by event ID then offset (idx and used, n_obs of each; borrowed from the caller). */
typedef struct cmp_state {
    json_t *findings;
    int64_t missing, destination, partition, payload, unknown;
    int64_t matched, pending, duplicates, outside;
    const obx__observed **idx;
    bool *used; /* used[k]: idx[k] belongs to a slot in scope */
    size_t n_obs;
} cmp_state;

static json_t *obs_json(const obx__observed *o) {
    return json_pack("{s:s,s:s,s:i,s:I,s:s,s:s}", "cluster", o->cluster, "topic", o->topic,
                     "partition", (int)o->partition, "offset", (json_int_t)o->offset,
                     "payload_digest", o->payload_digest, "dest_digest", o->dest_digest);
}

static void finding(cmp_state *c, const char *kind, const char *event_id, json_t *exp,
                    const obx__observed *o, const char *why) {
    if (json_array_size(c->findings) >= FINDINGS_MAX) {
        json_decref(exp);
        return;
    }
    json_t *f = json_pack("{s:s,s:s,s:s}", "kind", kind, "event_id", event_id, "why", why);
    if (!f) {
        json_decref(exp);
        return;
    }
    if (exp) json_object_set_new(f, "would_send", exp);
    if (o) json_object_set_new(f, "observed", obs_json(o));
    json_array_append_new(c->findings, f);
}

/* Does observation o belong to slot r's frozen place (cluster when known, topic)? */
static bool same_place(const obx__event_row *r, const obx__observed *o) {
    return !strcmp(o->topic, r->dest.topic) &&
           (!o->cluster[0] || !strcmp(o->cluster, r->dest.cluster));
}

/* The observations of slot i (rows->v[i]), found in c->idx by its wire ID and marked used: *own
 * is the first at the slot's frozen place, *best the first there whose partition (when part >= 0)
 * and digests match, *stray the first at a place no other slot of the event owns; *n_own counts
 * those at the slot's place. Pure. */
static void slot_observations(cmp_state *c, const obx__rows *rows, size_t i, int32_t part,
                              const obx__observed **own, const obx__observed **best,
                              const obx__observed **stray, size_t *n_own) {
    const obx__event_row *r = &rows->v[i];
    const char *wid = obx__wire_id(r);
    size_t lo = 0, hi = c->n_obs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(c->idx[mid]->event_id, wid) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t end = lo;
    while (end < c->n_obs && !strcmp(c->idx[end]->event_id, wid)) end++;
    *own = *best = *stray = NULL;
    *n_own = 0;
    for (size_t k = lo; k < end; k++) {
        const obx__observed *o = c->idx[k];
        c->used[k] = true;
        if (!same_place(r, o)) {
            /* another slot of the same event owns that place: not a stray */
            bool other_slot = false;
            for (size_t j = 0; j < rows->n && !other_slot; j++)
                other_slot =
                    j != i && !strcmp(obx__wire_id(&rows->v[j]), wid) && same_place(&rows->v[j], o);
            if (!other_slot && !*stray) *stray = o;
            continue;
        }
        (*n_own)++;
        if (!*own) *own = o;
        if (!*best && (part < 0 || o->partition == part) &&
            !strcmp(o->payload_digest, r->env.payload_digest) &&
            (!o->dest_digest[0] || !strcmp(o->dest_digest, r->dest_digest)))
            *best = o;
    }
}

/* Compares slot i (rows->v[i]) with its observations: counts a match, a duplicate or a pending
 * slot, or adds one finding (which takes exp, what obx would send). Uses the broker only for the
 * partition count of a slot not yet pinned. */
static void compare_slot(obx__engine *e, cmp_state *c, const obx__rows *rows, size_t i, int64_t now,
                         const obx__shadow_req *req) {
    const obx__event_row *r = &rows->v[i];
    const char *wid = obx__wire_id(r);
    /* what obx would send: the frozen destination, the pinned (or computed) partition */
    int32_t part = r->pinned_partition;
    if (part < 0 && e->b && !strcmp(e->cluster, r->dest.cluster) &&
        obx__br_partition_for(e->b, &r->dest, &part)) {
        e->st.broker_errors++;
        part = -1;
    }
    json_t *exp = json_pack("{s:s,s:s,s:s,s:i,s:s,s:s,s:s}", "slot_id", r->env.event_id, "cluster",
                            r->dest.cluster, "topic", r->dest.topic, "partition", (int)part, "key",
                            r->dest.routing_key, "payload_digest", r->env.payload_digest,
                            "dest_digest", r->dest_digest);
    const obx__observed *own, *best, *stray;
    size_t n_own;
    slot_observations(c, rows, i, part, &own, &best, &stray, &n_own);
    char why[OBX_TEXT_MAX + 1];
    if (best) {
        c->matched++;
        c->duplicates += (int64_t)n_own - 1;
        json_decref(exp);
    } else if (own) {
        if (part >= 0 && own->partition != part) {
            c->partition++;
            snprintf(why, sizeof why, "published to partition %d, obx would send to %d",
                     (int)own->partition, (int)part);
            finding(c, "partition", wid, exp, own, why);
        } else if (strcmp(own->payload_digest, r->env.payload_digest)) {
            c->payload++;
            snprintf(why, sizeof why, "published payload digest differs from the frozen one");
            finding(c, "payload", wid, exp, own, why);
        } else {
            c->destination++;
            snprintf(why, sizeof why,
                     "published with destination digest %.20s..., the frozen one is %.20s...",
                     own->dest_digest, r->dest_digest);
            finding(c, "destination", wid, exp, own, why);
        }
    } else if (stray) {
        c->destination++;
        snprintf(why, sizeof why, "published to %.40s/%.60s, obx would send to %.40s/%.60s",
                 stray->cluster[0] ? stray->cluster : "?", stray->topic, r->dest.cluster,
                 r->dest.topic);
        finding(c, "destination", wid, exp, stray, why);
    } else if (r->committed_at <= now - req->grace_ms) {
        c->missing++;
        finding(c, "missing", wid, exp, NULL,
                "committed, and not published by the other "
                "dispatcher");
    } else {
        c->pending++; /* within the grace time */
        json_decref(exp);
    }
}

/* What nobody in scope explains: each run of unused observations of one event ID is looked up
 * (one store read per ID) and counted outside the scope, or listed as unknown on the broker. */
static obx_err unexplained(obx__engine *e, cmp_state *c) {
    obx_err err = OBX_OK;
    for (size_t k = 0; !err && k < c->n_obs;) {
        size_t end = k + 1;
        while (end < c->n_obs && !strcmp(c->idx[end]->event_id, c->idx[k]->event_id)) end++;
        if (!c->used[k]) {
            obx__rows known = {0};
            const char *id = c->idx[k]->event_id;
            err = obx__st_load_events(e->s, &id, 1, 0, &known);
            if (!err && !known.n) {
                c->unknown += (int64_t)(end - k);
                for (size_t j = k; j < end; j++)
                    finding(c, "unknown_on_broker", id, NULL, c->idx[j],
                            "this outbox never committed this event ID (bypass publishing)");
            } else if (!err) {
                c->outside += (int64_t)(end - k);
            }
            obx__rows_free(&known);
        }
        k = end;
    }
    return err;
}

obx_err obx__shadow_compare(obx__engine *e, int64_t now, const obx__shadow_req *req,
                            const obx__observed *obs, size_t n_obs, json_t **report,
                            size_t *differences) {
    *report = NULL;
    *differences = 0;
    obx__rows rows = {0};
    obx_err err = expected(e, req, &rows);
    const obx__observed **idx = err ? NULL : calloc(n_obs ? n_obs : 1, sizeof *idx);
    bool *used = err ? NULL : calloc(n_obs ? n_obs : 1, sizeof *used);
    cmp_state c = {.findings = json_array(), .idx = idx, .used = used, .n_obs = n_obs};
    if (!err && (!idx || !used || !c.findings))
        err = obx__fail(OBX_ENOMEM, "shadow: out of memory");
    if (!err) {
        for (size_t i = 0; i < n_obs; i++) idx[i] = &obs[i];
        qsort(idx, n_obs, sizeof *idx, cmp_obs);
    }
    for (size_t i = 0; !err && i < rows.n; i++) compare_slot(e, &c, &rows, i, now, req);
    if (!err) err = unexplained(e, &c);
    size_t n_expected = rows.n;
    obx__rows_free(&rows);
    free(idx);
    free(used);
    if (err) {
        json_decref(c.findings);
        return err;
    }
    int64_t total = c.missing + c.destination + c.partition + c.payload + c.unknown;
    *report = json_pack(
        "{s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:{s:I,s:I,s:I,s:I,s:I},s:o}", "shadow", 1, "compared",
        (json_int_t)n_expected, "observed", (json_int_t)n_obs, "matched", (json_int_t)c.matched,
        "pending", (json_int_t)c.pending, "duplicates", (json_int_t)c.duplicates, "outside_scope",
        (json_int_t)c.outside, "differences_total", (json_int_t)total, "differences", "missing",
        (json_int_t)c.missing, "destination", (json_int_t)c.destination, "partition",
        (json_int_t)c.partition, "payload", (json_int_t)c.payload, "unknown_on_broker",
        (json_int_t)c.unknown, "findings", c.findings);
    if (!*report) return obx__fail(OBX_ENOMEM, "shadow: out of memory");
    *differences = (size_t)total;
    return OBX_OK;
}

/* ---- the public entry point ---------------------------------------------------------------------
 */

obx_err obx_shadow(obx_store *s, const char *broker_url, const char *const *props, size_t n_props,
                   const obx_shadow_request *r, char **out) {
    if (!s || !r || !out) return obx__fail(OBX_EINVAL, "shadow: NULL argument");
    *out = NULL;
    obx__clear_error();
    obx_err err = OBX_OK;
    for (size_t i = 0; !err && i < r->n_aliases; i++)
        err = obx__check_field("aliases", r->aliases[i], 1, OBX_NAME_MAX, OBX__CS_NAME);
    for (size_t i = 0; !err && i < r->n_event_types; i++)
        err =
            obx__check_field("event_types", r->event_types[i], 1, OBX_NAME_MAX, OBX__CS_EVENT_TYPE);
    for (size_t i = 0; !err && i < r->n_topics; i++)
        err = obx__check_field("topics", r->topics[i], 1, OBX_TOPIC_MAX, OBX__CS_NAME);
    if (err) return err;
    if (r->since_ms < 0)
        return obx__fail(OBX_EINVAL, "since_ms: %lld is negative", (long long)r->since_ms);
    if (r->grace_ms < -1)
        return obx__fail(OBX_EINVAL, "grace_ms: %lld (>= 0, or -1 for none)",
                         (long long)r->grace_ms);
    if (r->limit > 10000000)
        return obx__fail(OBX_ETOOBIG, "limit: %zu, over the limit of 10000000", r->limit);
    if (!broker_url && !r->feed_path)
        return obx__fail(OBX_EINVAL, "broker_url: none, and no feed_path: nothing to compare with");
    int64_t now = obx__wall_ms();
    obx__shadow_req req = {.aliases = r->aliases,
                           .n_aliases = r->n_aliases,
                           .types = r->event_types,
                           .n_types = r->n_event_types,
                           .topics = r->topics,
                           .n_topics = r->n_topics,
                           .since = r->since_ms ? r->since_ms : now - 3600000,
                           .grace_ms = r->grace_ms == -1 ? 0 : (r->grace_ms ? r->grace_ms : 60000),
                           .limit = r->limit};
    /* the feed first: a bad line is an error before anything is read from the broker */
    obx__observed *obs = NULL;
    size_t n_obs = 0;
    if (r->feed_path) {
        FILE *f = fopen(r->feed_path, "rb");
        if (!f) return obx__fail(OBX_EIO, "feed_path: %s: cannot open", r->feed_path);
        obx__buf b = {0};
        char chunk[65536];
        size_t k;
        while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) obx__buf_put(&b, chunk, k);
        fclose(f);
        if (b.oom) {
            obx__buf_free(&b);
            return obx__fail(OBX_ENOMEM, "feed_path: out of memory");
        }
        err = obx__shadow_parse_feed((const char *)b.data, b.len, &obs, &n_obs);
        obx__buf_free(&b);
        if (err) return obx__fail_prefix(err, "%s", r->feed_path);
    }
    obx__broker *b = NULL;
    if (broker_url && (err = obx__br_open(broker_url, props, n_props, &b))) {
        free(obs);
        return err;
    }
    obx__engine e;
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    obx__strlcpy(c.owner, "shadow", sizeof c.owner);
    err = obx__engine_init(&e, s, b, &c);
    if (!err && !r->feed_path) {
        char **topics = NULL;
        size_t nt = 0;
        err = obx__shadow_topics(&e, now, &req, &topics, &nt);
        if (!err)
            err = obx__shadow_observe_broker(&e, (const char *const *)topics, nt, 0, &obs, &n_obs);
        for (size_t i = 0; i < nt; i++) free(topics[i]);
        free(topics);
    }
    json_t *rep = NULL;
    size_t diffs = 0;
    if (!err) err = obx__shadow_compare(&e, now, &req, obs, n_obs, &rep, &diffs);
    free(obs);
    obx__br_close(b);
    if (err) return err;
    json_object_set_new(rep, "source", json_string(r->feed_path ? r->feed_path : "broker"));
    if ((err = obx__json_out(rep, out))) return err;
    if (diffs)
        return obx__fail(OBX_EFINDINGS,
                         "shadow: %zu differences between what obx would send and "
                         "what was published",
                         diffs);
    return OBX_OK;
}

/*
 * log_broker.c — the local log broker: the embedded default broker, so that the whole pipeline
 * runs with no server. Topics are partitioned append-only logs in their own SQLite file (a
 * separate system from the outbox database). Several processes may share one file (WAL).
 *
 *   URL: log:PATH[?cluster=NAME&partitions=N&seed=S&<fault knobs>]
 *
 * Semantics:
 *   - append returns (partition, offset); offsets are dense per partition, assigned under
 *     SQLite's write lock;
 *   - lookup by event ID is authoritative (an append is committed before its ACK exists, so
 *     there is no quiet time);
 *   - consumers read from their group's committed offset; an ack commits offset + 1.
 *
 * Topics are created on first use, like a Kafka cluster with auto-creation, unless
 * auto_create=0: then a topic must exist (obx__log_broker_create_topic) and a destination
 * naming a missing one is refused — partition_for answers OBX_ENOTFOUND, a send REJECT.
 *
 * Fault knobs (probabilities 0..1, for tests and the demo), all seeded by `seed`:
 *   drop_ack   append, then report UNKNOWN after ack_timeout_ms (a timed-out ACK)
 *   lose_ack   append, then report nothing at all (the dispatcher's lease runs out)
 *   delay_ack  append, then deliver the ACK after delay_ack_ms
 *   reject     do not append; report a definite rejection
 *   dup        append the message twice (a producer-level retry)
 *   blackhole  the request is lost in transit: nothing appended, no answer ever
 *   hold       the write is held back (a frozen process, a slow network) and attempted only at
 *              a poll at least hold_ms later — where the attempt's deadline is checked
 *
 * Deadlines: a message is never appended after its attempt's deadline (obx__msg.deadline),
 * checked inside the append transaction against max(now, wall clock); such a message gets a
 * NOT_SENT outcome instead.
 *   down       1: unreachable — sends are NOT_SENT, lookups CANNOT_TELL
 *   lookup_down 1: lookups CANNOT_TELL (the old target is not queryable)
 *   lose_commit a consumer ack reports success but the position is not stored
 * Knobs can also be changed at run time with obx__log_broker_set() (tests, demo).
 */
#include "broker/broker.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pending {
    obx__outcome out;
    int64_t due; /* returned by poll once now >= due */
} pending;

/* A write held back by the `hold` knob: everything needed to append it later. */
typedef struct held {
    obx__envelope env;
    obx__dest dest;
    char dest_digest[OBX_DIGEST_LEN + 1];
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    int32_t attempt_gen, partition;
    unsigned char *payload;
    size_t payload_len;
    int64_t deadline, due;
} held;

typedef struct fetch_pos {
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t next; /* next offset to deliver in this session */
} fetch_pos;

typedef struct log_broker {
    obx__broker base;
    sqlite3 *db;
    char cluster[OBX_NAME_MAX + 1];
    int32_t default_partitions;
    uint64_t rng;
    /* knobs */
    double drop_ack, lose_ack, delay_ack, reject, dup, lose_commit, blackhole, hold;
    int64_t hold_ms;
    int64_t delay_ack_ms, ack_timeout_ms;
    bool down, lookup_down;
    bool no_auto_create; /* auto_create=0 */
    /* outcomes not yet polled */
    pending *q;
    size_t nq, capq;
    held *h;
    size_t nh;
    /* consumer */
    char group[OBX_NAME_MAX + 1];
    char (*topics)[OBX_TOPIC_MAX + 1];
    size_t n_topics;
    fetch_pos *pos;
    size_t n_pos;
    fetch_pos *paused; /* partitions not fetched (consume_pause; `next` unused) */
    size_t n_paused;
    sqlite3_stmt *st_append, *st_next, *st_bump, *st_lookup, *st_parts, *st_fetch, *st_commit,
        *st_committed, *st_ins_part;
} log_broker;

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS obx_log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS obx_log_topic (name TEXT PRIMARY KEY, partitions INTEGER NOT "
    "NULL);"
    "CREATE TABLE IF NOT EXISTS obx_log_partition (topic TEXT NOT NULL, partition INTEGER NOT "
    "NULL, next_offset INTEGER NOT NULL, PRIMARY KEY (topic, partition));"
    "CREATE TABLE IF NOT EXISTS obx_log_msg (topic TEXT NOT NULL, partition INTEGER NOT NULL, "
    "\"offset\" INTEGER NOT NULL, event_id TEXT NOT NULL, msg_key TEXT NOT NULL, headers TEXT NOT "
    "NULL, payload BLOB NOT NULL, ts INTEGER NOT NULL, PRIMARY KEY (topic, partition, "
    "\"offset\"));"
    "CREATE INDEX IF NOT EXISTS obx_log_msg_event ON obx_log_msg (topic, event_id);"
    "CREATE TABLE IF NOT EXISTS obx_log_group (grp TEXT NOT NULL, topic TEXT NOT NULL, "
    "partition INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, PRIMARY KEY (grp, topic, "
    "partition));";

static obx_err dberr(log_broker *b, const char *what) {
    int rc = sqlite3_errcode(b->db);
    obx_err e = (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) ? OBX_EBUSY : OBX_EBROKER;
    return obx__fail(e, "log broker: %s: %s", what, sqlite3_errmsg(b->db));
}

static obx_err prep(log_broker *b, sqlite3_stmt **st, const char *sql) {
    if (*st) {
        sqlite3_reset(*st);
        sqlite3_clear_bindings(*st);
        return OBX_OK;
    }
    if (sqlite3_prepare_v3(b->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) != SQLITE_OK)
        return dberr(b, "prepare");
    return OBX_OK;
}

static double rnd(log_broker *b) {
    uint64_t x = b->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b->rng = x;
    return (double)(x >> 11) / (double)(1ull << 53);
}

static bool chance(log_broker *b, double p) { return p > 0 && rnd(b) < p; }

/* ---- knobs ---------------------------------------------------------------------------------- */

static obx_err set_knob(log_broker *b, const char *k, const char *v) {
    char *end;
    double d = strtod(v, &end);
    if (*end || end == v)
        return obx__fail(OBX_EURL, "broker URL: log knob %s='%s' is not a number", k, v);
#define P(name)                                                                                    \
    if (!strcmp(k, #name)) {                                                                       \
        if (d < 0 || d > 1) return obx__fail(OBX_EURL, "broker URL: %s=%s outside 0..1", k, v);    \
        b->name = d;                                                                               \
        return OBX_OK;                                                                             \
    }
    P(drop_ack)
    P(lose_ack)
    P(delay_ack)
    P(reject)
    P(dup)
    P(lose_commit)
    P(blackhole)
    P(hold)
#undef P
    if (!strcmp(k, "delay_ack_ms"))
        b->delay_ack_ms = (int64_t)d;
    else if (!strcmp(k, "hold_ms"))
        b->hold_ms = (int64_t)d;
    else if (!strcmp(k, "ack_timeout_ms"))
        b->ack_timeout_ms = (int64_t)d;
    else if (!strcmp(k, "down"))
        b->down = d != 0;
    else if (!strcmp(k, "lookup_down"))
        b->lookup_down = d != 0;
    else if (!strcmp(k, "auto_create"))
        b->no_auto_create = d == 0;
    else if (!strcmp(k, "seed"))
        b->rng = (uint64_t)d ? (uint64_t)d : 88172645463325252ull;
    else if (!strcmp(k, "partitions")) {
        if (d < 1 || d > 1024)
            return obx__fail(OBX_EURL, "broker URL: partitions=%s outside 1..1024", v);
        b->default_partitions = (int32_t)d;
    } else
        return obx__fail(OBX_EURL,
                         "broker URL: unknown log broker option '%s' (cluster, partitions, seed, "
                         "drop_ack, lose_ack, delay_ack, delay_ack_ms, ack_timeout_ms, reject, "
                         "dup, blackhole, hold, hold_ms, down, lookup_down, lose_commit, "
                         "auto_create)",
                         k);
    return OBX_OK;
}

/* Sets a knob at run time ("drop_ack", "0.2"). Used by tests and `obx demo`. */
obx_err obx__log_broker_set(obx__broker *base, const char *knob, const char *value);
obx_err obx__log_broker_set(obx__broker *base, const char *knob, const char *value) {
    if (!base || base->m != &obx__log_broker_methods)
        return obx__fail(OBX_EINVAL, "not a log broker");
    return set_knob((log_broker *)base, knob, value);
}

/* ---- open / close ------------------------------------------------------------------------- */

static void lb_close(obx__broker *base) {
    log_broker *b = (log_broker *)base;
    if (!b) return;
    sqlite3_stmt *sts[] = {b->st_append, b->st_next,   b->st_bump,      b->st_lookup,  b->st_parts,
                           b->st_fetch,  b->st_commit, b->st_committed, b->st_ins_part};
    for (size_t i = 0; i < sizeof sts / sizeof sts[0]; i++) sqlite3_finalize(sts[i]);
    sqlite3_close_v2(b->db);
    for (size_t i = 0; i < b->nh; i++) free(b->h[i].payload);
    free(b->h);
    free(b->q);
    free(b->topics);
    free(b->pos);
    free(b->paused);
    free(b);
}

static obx_err lb_open(const obx__url *u, const char *const *props, size_t n_props,
                       obx__broker **out) {
    (void)props;
    (void)n_props;
    log_broker *b = calloc(1, sizeof *b);
    if (!b) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
    b->base.m = &obx__log_broker_methods;
    b->default_partitions = 4;
    b->delay_ack_ms = 2000;
    b->ack_timeout_ms = 1000;
    b->rng = 88172645463325252ull ^ (uint64_t)obx__mono_ms();
    char cluster[OBX_NAME_MAX + 1] = "";
    obx_err e = OBX_OK;
    /* options */
    char q[1024];
    obx__strlcpy(q, u->query, sizeof q);
    for (char *save = NULL, *kv = strtok_r(q, "&", &save); kv && !e;
         kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            e = obx__fail(OBX_EURL, "broker URL: log option '%s' needs a value", kv);
            break;
        }
        *eq = '\0';
        if (!strcmp(kv, "cluster")) {
            e = obx__check_field("cluster", eq + 1, 1, OBX_NAME_MAX, OBX__CS_NAME);
            if (!e) obx__strlcpy(cluster, eq + 1, sizeof cluster);
        } else
            e = set_knob(b, kv, eq + 1);
    }
    if (e) {
        free(b);
        return e;
    }
    if (sqlite3_open_v2(u->path, &b->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        e = obx__fail(OBX_EBROKER, "log broker: cannot open '%s': %s", u->path,
                      b->db ? sqlite3_errmsg(b->db) : "?");
        lb_close(&b->base);
        return e;
    }
    sqlite3_busy_timeout(b->db, 10000);
    /* Several relays (and each relay's threads) may open a new broker file at once: the first
     * switches it to WAL, which needs the file to itself, and SQLite answers the others BUSY
     * at once, without its busy handler. Under load (CI, ASan) a relay once died of that at
     * start. Retry for up to 10 s. */
    int rc = SQLITE_BUSY;
    for (int tries = 0; tries < 1000; tries++) {
        rc = sqlite3_exec(b->db,
                          strcmp(u->path, ":memory:")
                              ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                              : "PRAGMA synchronous=OFF;",
                          NULL, NULL, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_exec(b->db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if ((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) break;
        sqlite3_sleep(10);
    }
    if (rc != SQLITE_OK) {
        e = dberr(b, "open");
        lb_close(&b->base);
        return e;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_exec(b->db, schema, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(b->db, "SELECT value FROM obx_log_meta WHERE key='cluster'", -1, &st,
                           NULL) != SQLITE_OK)
        e = dberr(b, "schema");
    if (!e) {
        if (sqlite3_step(st) == SQLITE_ROW) {
            const char *have = (const char *)sqlite3_column_text(st, 0);
            if (cluster[0] && strcmp(cluster, have))
                e = obx__fail(OBX_EBROKER, "log broker '%s' is cluster '%s', the URL says '%s'",
                              u->path, have, cluster);
            obx__strlcpy(b->cluster, have, sizeof b->cluster);
        } else {
            obx__strlcpy(b->cluster, cluster[0] ? cluster : "local", sizeof b->cluster);
            char sql[256];
            snprintf(sql, sizeof sql, "INSERT INTO obx_log_meta VALUES ('cluster', '%s')",
                     b->cluster); /* validated [A-Za-z0-9._-] */
            if (sqlite3_exec(b->db, sql, NULL, NULL, NULL) != SQLITE_OK) e = dberr(b, "meta");
        }
    }
    sqlite3_finalize(st);
    if (sqlite3_exec(b->db, e ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL) != SQLITE_OK && !e)
        e = dberr(b, "commit");
    if (e) {
        lb_close(&b->base);
        return e;
    }
    *out = &b->base;
    return OBX_OK;
}

static obx_err lb_cluster_id(obx__broker *base, char *out, size_t cap) {
    log_broker *b = (log_broker *)base;
    obx__strlcpy(out, b->cluster, cap);
    return OBX_OK;
}

static obx_err create_topic(log_broker *b, const char *topic, int32_t parts, int32_t *n);

/* Whether topic has been created (by a producer's first append), creating nothing. */
static obx_err topic_exists(log_broker *b, const char *topic, bool *exists) {
    obx_err e = prep(b, &b->st_parts, "SELECT partitions FROM obx_log_topic WHERE name = ?");
    if (e) return e;
    sqlite3_bind_text(b->st_parts, 1, topic, -1, SQLITE_STATIC);
    int rc = sqlite3_step(b->st_parts);
    sqlite3_reset(b->st_parts);
    *exists = rc == SQLITE_ROW;
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? OBX_OK : dberr(b, "topic");
}

/* Partition count of a topic; creates the topic with the default count on first use (unless
 * auto_create=0: OBX_ENOTFOUND). */
static obx_err partitions(log_broker *b, const char *topic, int32_t *n) {
    obx_err e = prep(b, &b->st_parts, "SELECT partitions FROM obx_log_topic WHERE name = ?");
    if (e) return e;
    sqlite3_bind_text(b->st_parts, 1, topic, -1, SQLITE_STATIC);
    int rc = sqlite3_step(b->st_parts);
    if (rc == SQLITE_ROW) {
        *n = sqlite3_column_int(b->st_parts, 0);
        sqlite3_reset(b->st_parts);
        return OBX_OK;
    }
    sqlite3_reset(b->st_parts);
    if (rc != SQLITE_DONE) return dberr(b, "topic");
    if (b->no_auto_create)
        return obx__fail(OBX_ENOTFOUND, "log broker %s: topic '%s' does not exist (auto_create=0)",
                         b->cluster, topic);
    return create_topic(b, topic, b->default_partitions, n);
}

/* Creates topic with `parts` partitions (nothing when it exists); *n gets its count. */
static obx_err create_topic(log_broker *b, const char *topic, int32_t parts, int32_t *n) {
    obx_err e;
    int rc;
    if ((e = prep(b, &b->st_ins_part,
                  "INSERT INTO obx_log_topic (name, partitions) VALUES (?, ?) "
                  "ON CONFLICT (name) DO NOTHING")))
        return e;
    sqlite3_bind_text(b->st_ins_part, 1, topic, -1, SQLITE_STATIC);
    sqlite3_bind_int(b->st_ins_part, 2, parts);
    rc = sqlite3_step(b->st_ins_part);
    sqlite3_reset(b->st_ins_part);
    if (rc != SQLITE_DONE) return dberr(b, "create topic");
    bool saved = b->no_auto_create;
    b->no_auto_create = false;
    e = partitions(b, topic, n);
    b->no_auto_create = saved;
    return e;
}

/* Creates a topic (for auto_create=0 setups: tests, operators' scripts). */
obx_err obx__log_broker_create_topic(obx__broker *base, const char *topic, int32_t partitions_n);
obx_err obx__log_broker_create_topic(obx__broker *base, const char *topic, int32_t partitions_n) {
    if (!base || base->m != &obx__log_broker_methods)
        return obx__fail(OBX_EINVAL, "not a log broker");
    obx_err e = obx__check_field("topic", topic, 1, OBX_TOPIC_MAX, OBX__CS_NAME);
    if (e) return e;
    if (partitions_n < 1 || partitions_n > 1024)
        return obx__fail(OBX_EINVAL, "partitions: %d outside 1..1024", (int)partitions_n);
    int32_t n = 0;
    return create_topic((log_broker *)base, topic, partitions_n, &n);
}

static obx_err lb_partition_for(obx__broker *base, const obx__dest *d, int32_t *out) {
    log_broker *b = (log_broker *)base;
    int32_t n = 0;
    obx_err e = partitions(b, d->topic, &n);
    if (e) return e;
    *out = obx__partition(d->algorithm, d->routing_key, n);
    return OBX_OK;
}

static obx_err queue(log_broker *b, const obx__outcome *o, int64_t due) {
    if (b->nq == b->capq) {
        size_t c = b->capq ? b->capq * 2 : 64;
        pending *p = realloc(b->q, c * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
        b->q = p;
        b->capq = c;
    }
    b->q[b->nq].out = *o;
    b->q[b->nq].due = due;
    b->nq++;
    return OBX_OK;
}

static char *headers_json(const obx__msg *m) {
    obx__headers h;
    obx__headers_build(m, &h);
    json_t *o = json_object();
    for (size_t i = 0; o && i < h.n; i++)
        json_object_set_new(o, h.name[i], json_string(h.value[i]));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return s;
}

static obx_err append(log_broker *b, const obx__msg *m, int64_t now, int64_t *offset) {
    obx_err e;
    if ((e = prep(
             b, &b->st_next,
             "INSERT INTO obx_log_partition (topic, partition, next_offset) VALUES (?1, ?2, 1) "
             "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = next_offset + 1 "
             "RETURNING next_offset - 1")))
        return e;
    sqlite3_bind_text(b->st_next, 1, m->dest->topic, -1, SQLITE_STATIC);
    sqlite3_bind_int(b->st_next, 2, m->partition);
    if (sqlite3_step(b->st_next) != SQLITE_ROW) {
        e = dberr(b, "assign offset");
        sqlite3_reset(b->st_next);
        return e;
    }
    *offset = sqlite3_column_int64(b->st_next, 0);
    sqlite3_reset(b->st_next);
    char *hj = headers_json(m);
    if (!hj) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
    if ((e = prep(b, &b->st_append,
                  "INSERT INTO obx_log_msg (topic, partition, \"offset\", event_id, msg_key, "
                  "headers, payload, ts) VALUES (?,?,?,?,?,?,?,?)"))) {
        free(hj);
        return e;
    }
    sqlite3_bind_text(b->st_append, 1, m->dest->topic, -1, SQLITE_STATIC);
    sqlite3_bind_int(b->st_append, 2, m->partition);
    sqlite3_bind_int64(b->st_append, 3, *offset);
    sqlite3_bind_text(b->st_append, 4, m->env->event_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(b->st_append, 5, m->dest->routing_key, -1, SQLITE_STATIC);
    sqlite3_bind_text(b->st_append, 6, hj, -1, SQLITE_STATIC);
    sqlite3_bind_blob(b->st_append, 7, m->payload ? m->payload : "", (int)m->payload_len,
                      SQLITE_STATIC);
    sqlite3_bind_int64(b->st_append, 8, now);
    int rc = sqlite3_step(b->st_append);
    sqlite3_reset(b->st_append);
    free(hj);
    return rc == SQLITE_DONE ? OBX_OK : dberr(b, "append");
}

static void outcome_for(log_broker *b, const obx__msg *m, obx__outcome_kind k, obx__outcome *o) {
    memset(o, 0, sizeof *o);
    o->kind = k;
    obx__strlcpy(o->event_id, m->env->event_id, sizeof o->event_id);
    o->envelope_gen = m->env->envelope_gen;
    obx__strlcpy(o->attempt_id, m->attempt_id, sizeof o->attempt_id);
    obx__strlcpy(o->payload_digest, m->env->payload_digest, sizeof o->payload_digest);
    obx__strlcpy(o->dest_digest, m->dest_digest, sizeof o->dest_digest);
    obx__strlcpy(o->cluster, b->cluster, sizeof o->cluster);
    obx__strlcpy(o->topic, m->dest->topic, sizeof o->topic);
    o->partition = m->partition;
    o->offset = -1;
}

/* One message inside the caller's append transaction: deadline, faults, append, outcome. */
static obx_err append_one(log_broker *b, const obx__msg *m, int64_t now) {
    obx__outcome o;
    int32_t np = 0;
    obx_err e = partitions(b, m->dest->topic, &np);
    if (e == OBX_ENOTFOUND) { /* a definite answer for this message, not a failed send */
        outcome_for(b, m, OBX__OUT_REJECT, &o);
        snprintf(o.reason, sizeof o.reason, "%s", obx_errmsg());
        return queue(b, &o, now);
    }
    if (e) return e;
    int64_t wall = obx__ref_ms(); /* the relay's clock: its deadlines are on it */
    if (m->deadline && (now > wall ? now : wall) > m->deadline) {
        char at[32];
        obx__iso_ms(m->deadline, at); /* reasons are printed to operators: ISO, never epoch ms */
        outcome_for(b, m, OBX__OUT_NOT_SENT, &o);
        snprintf(o.reason, sizeof o.reason,
                 "attempt deadline %s passed before the write: not appended", at);
        return queue(b, &o, now);
    }
    if (m->partition >= np) {
        outcome_for(b, m, OBX__OUT_REJECT, &o);
        snprintf(o.reason, sizeof o.reason, "partition %d does not exist (topic %s has %d)",
                 (int)m->partition, m->dest->topic, (int)np);
        return queue(b, &o, now);
    }
    if (chance(b, b->blackhole)) return OBX_OK; /* lost before it reached the log */
    if (chance(b, b->reject)) {
        outcome_for(b, m, OBX__OUT_REJECT, &o);
        snprintf(o.reason, sizeof o.reason, "rejected by fault knob");
        return queue(b, &o, now);
    }
    int64_t off;
    if ((e = append(b, m, now, &off))) return e;
    if (chance(b, b->dup)) {
        int64_t off2;
        if ((e = append(b, m, now, &off2))) return e;
    }
    outcome_for(b, m, OBX__OUT_ACK, &o);
    o.offset = off;
    o.broker_ts = now;
    if (chance(b, b->lose_ack)) return OBX_OK; /* appended, and the ACK never comes */
    if (chance(b, b->drop_ack)) {
        obx__outcome u = o;
        u.kind = OBX__OUT_UNKNOWN;
        u.offset = -1;
        snprintf(u.reason, sizeof u.reason, "ACK timed out after %lld ms (possibly persisted)",
                 (long long)b->ack_timeout_ms);
        return queue(b, &u, now + b->ack_timeout_ms);
    }
    return queue(b, &o, chance(b, b->delay_ack) ? now + b->delay_ack_ms : now);
}

static obx_err hold_back(log_broker *b, const obx__msg *m, int64_t now) {
    held *h = realloc(b->h, (b->nh + 1) * sizeof *h);
    if (!h) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
    b->h = h;
    held *x = &b->h[b->nh];
    memset(x, 0, sizeof *x);
    x->env = *m->env;
    x->dest = *m->dest;
    obx__strlcpy(x->dest_digest, m->dest_digest, sizeof x->dest_digest);
    obx__strlcpy(x->attempt_id, m->attempt_id, sizeof x->attempt_id);
    x->attempt_gen = m->attempt_gen;
    x->partition = m->partition;
    x->payload = malloc(m->payload_len ? m->payload_len : 1);
    if (!x->payload) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
    memcpy(x->payload, m->payload, m->payload_len);
    x->payload_len = m->payload_len;
    x->deadline = m->deadline;
    x->due = now + b->hold_ms;
    b->nh++;
    return OBX_OK;
}

/* Appends msgs (or held writes when held != NULL) in one transaction. */
static obx_err append_batch(log_broker *b, const obx__msg *m, size_t n, int64_t now) {
    if (sqlite3_exec(b->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return dberr(b, "begin append");
    size_t nq0 = b->nq;
    obx_err e = OBX_OK;
    for (size_t i = 0; i < n && !e; i++) e = append_one(b, &m[i], now);
    if (e) {
        sqlite3_exec(b->db, "ROLLBACK", NULL, NULL, NULL);
        b->nq = nq0; /* nothing was appended: no outcomes either; the caller sees the error */
        return e;
    }
    if (sqlite3_exec(b->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        e = dberr(b, "commit append");
        sqlite3_exec(b->db, "ROLLBACK", NULL, NULL, NULL);
        b->nq = nq0;
    }
    return e;
}

static obx_err lb_send(obx__broker *base, const obx__msg *m, size_t n, int64_t now) {
    log_broker *b = (log_broker *)base;
    obx_err e = OBX_OK;
    if (b->down) {
        for (size_t i = 0; i < n && !e; i++) {
            obx__outcome o;
            outcome_for(b, &m[i], OBX__OUT_NOT_SENT, &o);
            snprintf(o.reason, sizeof o.reason, "log broker unreachable (down)");
            e = queue(b, &o, now);
        }
        return e;
    }
    if (b->hold > 0) { /* some writes are held back and attempted later, at a poll */
        obx__msg *now_msgs = calloc(n ? n : 1, sizeof *now_msgs);
        size_t k = 0;
        if (!now_msgs) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
        for (size_t i = 0; i < n && !e; i++) {
            if (chance(b, b->hold))
                e = hold_back(b, &m[i], now);
            else
                now_msgs[k++] = m[i];
        }
        if (!e && k) e = append_batch(b, now_msgs, k, now);
        free(now_msgs);
        return e;
    }
    return append_batch(b, m, n, now);
}

/* Writes held back by the `hold` knob whose time has come (deadline checked at the write). */
static obx_err release_held(log_broker *b, int64_t now) {
    size_t w = 0;
    obx_err e = OBX_OK;
    for (size_t i = 0; i < b->nh; i++) {
        held *x = &b->h[i];
        if (e || x->due > now) {
            b->h[w++] = *x;
            continue;
        }
        obx__msg m = {.env = &x->env,
                      .dest = &x->dest,
                      .dest_digest = x->dest_digest,
                      .attempt_id = x->attempt_id,
                      .attempt_gen = x->attempt_gen,
                      .partition = x->partition,
                      .payload = x->payload,
                      .payload_len = x->payload_len,
                      .deadline = x->deadline};
        e = append_batch(b, &m, 1, now);
        if (e) {
            b->h[w++] = *x;
            continue;
        }
        free(x->payload);
    }
    b->nh = w;
    return e;
}

static obx_err lb_poll(obx__broker *base, int64_t now, int timeout_ms, obx__outcome *out,
                       size_t cap, size_t *n) {
    log_broker *b = (log_broker *)base;
    (void)timeout_ms;
    if (b->nh) {
        obx_err e = release_held(b, now);
        if (e) return e;
    }
    size_t k = 0, w = 0;
    for (size_t i = 0; i < b->nq; i++) {
        if (k < cap && b->q[i].due <= now)
            out[k++] = b->q[i].out;
        else
            b->q[w++] = b->q[i];
    }
    b->nq = w;
    *n = k;
    return OBX_OK;
}

static size_t lb_in_flight(obx__broker *base) {
    log_broker *b = (log_broker *)base;
    return b->nq + b->nh;
}

static int64_t lb_quiet(obx__broker *base) {
    (void)base;
    return 0;
}

typedef struct {
    json_t *h;
} hj_user;

static const char *hj_get(void *user, const char *name, size_t *len) {
    json_t *v = json_object_get(((hj_user *)user)->h, name);
    const char *s = json_string_value(v);
    if (s) *len = json_string_length(v);
    return s;
}

/* Every copy under the event ID and generation on the pinned partition is read and its body
 * hashed (obx__lookup_copy): the first whose bytes are the event's message is the receipt, the
 * others that are not are counted as corrupt or foreign copies. */
static obx_err lb_lookup(obx__broker *base, const obx__lookup_req *req, obx__lookup_res *res) {
    log_broker *b = (log_broker *)base;
    if (b->down || b->lookup_down) {
        res->kind = OBX__LOOKUP_CANNOT_TELL;
        snprintf(res->reason, sizeof res->reason, "log broker not queryable");
        return OBX_OK;
    }
    obx_err e = prep(b, &b->st_lookup,
                     "SELECT \"offset\", ts, headers, payload FROM obx_log_msg WHERE topic = ? "
                     "AND event_id = ? AND partition = ? ORDER BY \"offset\"");
    if (e) return e;
    sqlite3_bind_text(b->st_lookup, 1, req->dest->topic, -1, SQLITE_STATIC);
    sqlite3_bind_text(b->st_lookup, 2, req->event_id, -1, SQLITE_STATIC);
    sqlite3_bind_int(b->st_lookup, 3, req->partition);
    res->kind = OBX__LOOKUP_NOT_FOUND;
    int rc;
    while ((rc = sqlite3_step(b->st_lookup)) == SQLITE_ROW) {
        json_t *h = json_loads((const char *)sqlite3_column_text(b->st_lookup, 2), 0, NULL);
        obx__delivery d;
        memset(&d, 0, sizeof d);
        hj_user u = {h};
        obx_err pe = obx__headers_parse(hj_get, &u, &d);
        json_decref(h);
        /* the message for this envelope generation (another generation is another target) */
        if (pe || d.env.envelope_gen != req->envelope_gen) continue;
        obx__outcome o;
        memset(&o, 0, sizeof o);
        obx__strlcpy(o.event_id, d.env.event_id, sizeof o.event_id);
        o.envelope_gen = d.env.envelope_gen;
        obx__strlcpy(o.attempt_id, d.attempt_id, sizeof o.attempt_id);
        obx__strlcpy(o.payload_digest, d.env.payload_digest, sizeof o.payload_digest);
        obx__strlcpy(o.dest_digest, d.dest_digest, sizeof o.dest_digest);
        obx__strlcpy(o.cluster, b->cluster, sizeof o.cluster);
        obx__strlcpy(o.topic, req->dest->topic, sizeof o.topic);
        o.partition = req->partition;
        o.offset = sqlite3_column_int64(b->st_lookup, 0);
        o.broker_ts = sqlite3_column_int64(b->st_lookup, 1);
        obx__lookup_copy(req, res, &o, sqlite3_column_blob(b->st_lookup, 3),
                         (size_t)sqlite3_column_bytes(b->st_lookup, 3));
    }
    if (rc != SQLITE_DONE) e = dberr(b, "lookup");
    sqlite3_reset(b->st_lookup);
    if (res->kind == OBX__LOOKUP_FOUND)
        snprintf(res->reason, sizeof res->reason, "found at %s/%d@%lld", req->dest->topic,
                 (int)req->partition, (long long)res->found.offset);
    else if (res->n_bad)
        snprintf(res->reason, sizeof res->reason,
                 "%d copies under event ID %s, none of them its "
                 "message: %s",
                 res->n_bad, req->event_id, res->bad.reason);
    else
        snprintf(res->reason, sizeof res->reason, "scanned %s/%d: no message with event ID %s",
                 req->dest->topic, (int)req->partition, req->event_id);
    return e;
}

static obx_err lb_scan(obx__broker *base, const char *topic, int64_t since, obx__scan_fn fn,
                       void *user) {
    log_broker *b = (log_broker *)base;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(b->db,
                           "SELECT event_id, partition, \"offset\", ts FROM obx_log_msg WHERE "
                           "topic = ? AND ts >= ? ORDER BY partition, \"offset\"",
                           -1, &st, NULL) != SQLITE_OK)
        return dberr(b, "scan");
    sqlite3_bind_text(st, 1, topic, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, since);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (fn(user, (const char *)sqlite3_column_text(st, 0), sqlite3_column_int(st, 1),
               sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3)))
            break;
    obx_err e = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? OBX_OK : dberr(b, "scan");
    sqlite3_finalize(st);
    return e;
}

/* ---- consumer ------------------------------------------------------------------------------- */

static obx_err lb_consume_open(obx__broker *base, const char *group, const char *const *topics,
                               size_t n) {
    log_broker *b = (log_broker *)base;
    obx_err e = obx__check_field("group", group, 1, OBX_NAME_MAX, OBX__CS_NAME);
    if (e) return e;
    free(b->topics);
    b->topics = calloc(n ? n : 1, sizeof *b->topics);
    free(b->pos);
    b->pos = NULL;
    b->n_pos = 0;
    b->n_paused = 0; /* a new subscription fetches every partition */
    if (!b->topics) return obx__fail(OBX_ENOMEM, "log broker: out of memory");
    for (size_t i = 0; i < n; i++) {
        if ((e = obx__check_field("topic", topics[i], 1, OBX_TOPIC_MAX, OBX__CS_NAME))) return e;
        obx__strlcpy(b->topics[i], topics[i], sizeof b->topics[i]);
        /* a misspelt topic consumes nothing, silently: say so (it is not created here) */
        bool exists = true;
        if (!(e = topic_exists(b, topics[i], &exists)) && !exists)
            obx__backend_log(OBX__BLOG_WARN, "log-broker",
                             "%s: topic '%s' does not exist: nothing to consume until a producer "
                             "writes to it",
                             b->cluster, topics[i]);
    }
    b->n_topics = n;
    obx__strlcpy(b->group, group, sizeof b->group);
    return OBX_OK;
}

static obx_err committed(log_broker *b, const char *topic, int32_t part, int64_t *off) {
    obx_err e = prep(b, &b->st_committed,
                     "SELECT \"offset\" FROM obx_log_group WHERE grp = ? AND topic = ? AND "
                     "partition = ?");
    if (e) return e;
    sqlite3_bind_text(b->st_committed, 1, b->group, -1, SQLITE_STATIC);
    sqlite3_bind_text(b->st_committed, 2, topic, -1, SQLITE_STATIC);
    sqlite3_bind_int(b->st_committed, 3, part);
    int rc = sqlite3_step(b->st_committed);
    *off = rc == SQLITE_ROW ? sqlite3_column_int64(b->st_committed, 0) : 0;
    sqlite3_reset(b->st_committed);
    return (rc == SQLITE_ROW || rc == SQLITE_DONE) ? OBX_OK : dberr(b, "committed offset");
}

static fetch_pos *position(log_broker *b, const char *topic, int32_t part) {
    for (size_t i = 0; i < b->n_pos; i++)
        if (b->pos[i].partition == part && !strcmp(b->pos[i].topic, topic)) return &b->pos[i];
    int64_t off = 0;
    if (committed(b, topic, part, &off)) return NULL;
    fetch_pos *p = realloc(b->pos, (b->n_pos + 1) * sizeof *p);
    if (!p) return NULL;
    b->pos = p;
    fetch_pos *f = &b->pos[b->n_pos++];
    obx__strlcpy(f->topic, topic, sizeof f->topic);
    f->partition = part;
    f->next = off;
    return f;
}

/* The index of (topic, part) among the paused partitions, or n_paused. */
static size_t paused_at(const log_broker *b, const char *topic, int32_t part) {
    size_t i = 0;
    while (i < b->n_paused && (b->paused[i].partition != part || strcmp(b->paused[i].topic, topic)))
        i++;
    return i;
}

/* A paused partition keeps its position (the consumer's own: rewound by consume_redeliver) and
 * is skipped by poll until resumed: nothing is read for it meanwhile. */
static obx_err lb_consume_pause(obx__broker *base, const char *topic, int32_t part, bool paused) {
    log_broker *b = (log_broker *)base;
    size_t i = paused_at(b, topic, part);
    if (!paused) {
        if (i < b->n_paused) b->paused[i] = b->paused[--b->n_paused];
        return OBX_OK;
    }
    if (i < b->n_paused) return OBX_OK;
    fetch_pos *p = realloc(b->paused, (b->n_paused + 1) * sizeof *p);
    if (!p) return obx__fail(OBX_ENOMEM, "log broker: paused partitions");
    b->paused = p;
    memset(&p[b->n_paused], 0, sizeof *p);
    obx__strlcpy(p[b->n_paused].topic, topic, sizeof p->topic);
    p[b->n_paused++].partition = part;
    return OBX_OK;
}

static obx_err lb_consume_poll(obx__broker *base, int timeout_ms, obx__delivery *out, size_t cap,
                               size_t *n) {
    log_broker *b = (log_broker *)base;
    (void)timeout_ms;
    *n = 0;
    if (b->down) return obx__fail(OBX_EBROKER, "log broker unreachable (down)");
    obx_err e = prep(b, &b->st_fetch,
                     "SELECT \"offset\", ts, headers, payload FROM obx_log_msg WHERE topic = ? AND "
                     "partition = ? AND \"offset\" >= ? ORDER BY \"offset\" LIMIT ?");
    if (e) return e;
    for (size_t t = 0; t < b->n_topics && *n < cap; t++) {
        int32_t np = 0;
        if ((e = partitions(b, b->topics[t], &np))) return e;
        for (int32_t p = 0; p < np && *n < cap; p++) {
            if (paused_at(b, b->topics[t], p) < b->n_paused) continue;
            fetch_pos *f = position(b, b->topics[t], p);
            if (!f) return obx__fail(OBX_ENOMEM, "log broker: consumer position");
            sqlite3_reset(b->st_fetch);
            sqlite3_bind_text(b->st_fetch, 1, b->topics[t], -1, SQLITE_STATIC);
            sqlite3_bind_int(b->st_fetch, 2, p);
            sqlite3_bind_int64(b->st_fetch, 3, f->next);
            sqlite3_bind_int64(b->st_fetch, 4, (int64_t)(cap - *n));
            int rc;
            while ((rc = sqlite3_step(b->st_fetch)) == SQLITE_ROW) {
                obx__delivery *d = &out[(*n)++];
                memset(d, 0, sizeof *d);
                obx__strlcpy(d->topic, b->topics[t], sizeof d->topic);
                d->partition = p;
                d->offset = sqlite3_column_int64(b->st_fetch, 0);
                d->broker_ts = sqlite3_column_int64(b->st_fetch, 1);
                json_t *h = json_loads((const char *)sqlite3_column_text(b->st_fetch, 2), 0, NULL);
                hj_user u = {h};
                obx__headers_parse(hj_get, &u, d); /* a bad header is reported in the delivery */
                json_decref(h);
                int len = sqlite3_column_bytes(b->st_fetch, 3);
                d->payload = malloc(len > 0 ? (size_t)len : 1);
                if (!d->payload) {
                    sqlite3_reset(b->st_fetch);
                    return obx__fail(OBX_ENOMEM, "log broker: payload");
                }
                if (len > 0) memcpy(d->payload, sqlite3_column_blob(b->st_fetch, 3), (size_t)len);
                d->payload_len = (size_t)(len > 0 ? len : 0);
                f->next = d->offset + 1;
            }
            sqlite3_reset(b->st_fetch);
            if (rc != SQLITE_DONE && rc != SQLITE_ROW) return dberr(b, "fetch");
        }
    }
    return OBX_OK;
}

static obx_err lb_consume_ack(obx__broker *base, const obx__delivery *d) {
    log_broker *b = (log_broker *)base;
    if (b->down) return obx__fail(OBX_EBROKER, "log broker unreachable (down)");
    if (chance(b, b->lose_commit)) return OBX_OK; /* the commit is lost on the way */
    obx_err e = prep(b, &b->st_commit,
                     "INSERT INTO obx_log_group (grp, topic, partition, \"offset\") VALUES (?1, "
                     "?2, ?3, ?4) ON CONFLICT (grp, topic, partition) DO UPDATE SET \"offset\" = "
                     "max(\"offset\", ?4)");
    if (e) return e;
    sqlite3_bind_text(b->st_commit, 1, b->group, -1, SQLITE_STATIC);
    sqlite3_bind_text(b->st_commit, 2, d->topic, -1, SQLITE_STATIC);
    sqlite3_bind_int(b->st_commit, 3, d->partition);
    sqlite3_bind_int64(b->st_commit, 4, d->offset + 1);
    int rc = sqlite3_step(b->st_commit);
    sqlite3_reset(b->st_commit);
    return rc == SQLITE_DONE ? OBX_OK : dberr(b, "commit offset");
}

/* Forgets this session's fetch positions: the next poll starts at the committed offsets (what a
 * restarted consumer sees). */
void obx__log_broker_rewind(obx__broker *base);
void obx__log_broker_rewind(obx__broker *base) {
    log_broker *b = (log_broker *)base;
    free(b->pos);
    b->pos = NULL;
    b->n_pos = 0;
}

static obx_err lb_consume_redeliver(obx__broker *base, const obx__delivery *d) {
    (void)d;
    obx__log_broker_rewind(base); /* every partition restarts at its committed offset */
    return OBX_OK;
}

/* the local log: one node, every append synchronous and durable: what it stores is stored on its
 * one node before the ACK, so every durability and acknowledgement level is honoured (a transient
 * message kept durably loses nothing it was promised). */
static void lb_contract(obx__broker *base, obx__contract *out) {
    (void)base;
    obx__strlcpy(out->durability, "persistent,transient", sizeof out->durability);
    obx__strlcpy(out->required_acks, "all,1,confirm", sizeof out->required_acks);
    obx__strlcpy(out->serializer, "*", sizeof out->serializer);
}

const obx__broker_methods obx__log_broker_methods = {
    .version = OBX__BROKER_METHODS_VERSION,
    .name = "log",
    .caps = OBX__BCAP_LOOKUP_AUTHORITATIVE | OBX__BCAP_SCAN | OBX__BCAP_CONSUME | OBX__BCAP_ORDERED,
    .open = lb_open,
    .close = lb_close,
    .cluster_id = lb_cluster_id,
    .partition_for = lb_partition_for,
    .send = lb_send,
    .poll = lb_poll,
    .in_flight = lb_in_flight,
    .lookup = lb_lookup,
    .quiet_time_ms = lb_quiet,
    .contract = lb_contract,
    .scan = lb_scan,
    .consume_open = lb_consume_open,
    .consume_poll = lb_consume_poll,
    .consume_ack = lb_consume_ack,
    .consume_redeliver = lb_consume_redeliver,
    .consume_pause = lb_consume_pause,
};

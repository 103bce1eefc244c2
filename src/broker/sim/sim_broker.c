/*
 * sim_broker.c — the simulated broker (see sim.h): worlds with a virtual clock and a seeded
 * network, and the broker vtable on top ("sim:NAME"). Everything here is deterministic for a
 * given seed and sequence of calls; nothing reads a real clock.
 *
 * Handles of one world are used from one thread (the simulator runs one world per worker);
 * only the name registry is shared between threads.
 */
#include "broker/sim/sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUPS 8
#define MAX_HANDLES 64

typedef enum { EV_APPEND, EV_OUTCOME } ev_kind;

typedef struct net_ev {
    int64_t at;
    uint64_t order; /* tie-break: scheduling order */
    ev_kind kind;
    int handle; /* sender */
    uint32_t handle_gen;
    obx__sim_msg msg; /* EV_APPEND: what to store */
    obx__outcome out; /* EV_OUTCOME */
    int64_t deadline; /* of the attempt (late-ACK accounting) */
    bool dup, drop, lose, delay, valid, corrupt;
    uint8_t forge; /* a copy appended before this one: 1 corrupt, 2 foreign; 3: this one's body
                      is another (forge_body) */
} net_ev;

typedef struct logent {
    obx__sim_msg m;
    uint8_t acked; /* bit per consumer group */
    /* its sender and what became of its ACK (for obx__sim_world_release_ack) */
    int handle;
    uint32_t handle_gen;
    int64_t deadline;
    uint8_t ack_fate; /* 0 on its way or delivered, 1 dropped (UNKNOWN reported), 2 lost */
    bool forged;      /* a copy the relay never sent (its bytes are not the event's) */
} logent;

typedef struct sim_handle sim_handle;

struct obx__sim_world {
    char name[64];
    char cluster[OBX_NAME_MAX + 1];
    int32_t partitions;
    obx__sim_lookup lookup;
    uint64_t rng, order;
    int64_t now; /* the world's clock (sim.h): the network's time, not a sender's */
    obx__sim_faults f;
    obx__sim_fired fired;
    logent *log;
    size_t nlog, caplog;
    int64_t next_offset[OBX__SIM_TOPICS][64];
    char topics[OBX__SIM_TOPICS][OBX_TOPIC_MAX + 1];
    int ntopics;
    net_ev *q;
    size_t nq, capq;
    char groups[MAX_GROUPS][OBX_NAME_MAX + 1];
    int ngroups;
    sim_handle *h[MAX_HANDLES];
    obx__sim_ack *acks;
    size_t nacks, capacks;
    obx__sim_world *next; /* registry */
};

struct sim_handle {
    obx__broker base;
    obx__sim_world *w;
    int id;
    uint32_t gen; /* incarnation: outcomes addressed to an older one are lost */
    obx__outcome *box;
    size_t nbox, capbox;
    uint8_t *box_ack;    /* per mailbox entry: 0 not an ACK; 1 ACK; 2 late ACK; +4 invalid */
    size_t *polled_acks; /* ack indexes handed out by the last poll */
    size_t npolled;
    /* consumer */
    int group; /* -1: not a consumer */
    char ctopics[4][OBX_TOPIC_MAX + 1];
    int nctopics;
    bool *delivered; /* per log index, this session */
    size_t capdel;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static obx__sim_world *registry;

static uint64_t rnd(obx__sim_world *w) {
    uint64_t x = w->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return w->rng = x;
}

static bool chance(obx__sim_world *w, double p) {
    return p > 0 && (double)(rnd(w) >> 11) / (double)(1ull << 53) < p;
}

static int64_t between(obx__sim_world *w, int64_t lo, int64_t hi) {
    return hi <= lo ? lo : lo + (int64_t)(rnd(w) % (uint64_t)(hi - lo + 1));
}

obx_err obx__sim_world_new(const char *name, obx__sim_world **out) {
    obx__sim_world *w = calloc(1, sizeof *w);
    if (!w) return obx__fail(OBX_ENOMEM, "sim: out of memory");
    obx__strlcpy(w->name, name, sizeof w->name);
    pthread_mutex_lock(&reg_mu);
    for (obx__sim_world *x = registry; x; x = x->next)
        if (!strcmp(x->name, name)) {
            pthread_mutex_unlock(&reg_mu);
            free(w);
            return obx__fail(OBX_EINVAL, "sim: world '%s' exists", name);
        }
    w->next = registry;
    registry = w;
    pthread_mutex_unlock(&reg_mu);
    *out = w;
    return OBX_OK;
}

void obx__sim_world_free(obx__sim_world *w) {
    if (!w) return;
    pthread_mutex_lock(&reg_mu);
    for (obx__sim_world **p = &registry; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    pthread_mutex_unlock(&reg_mu);
    free(w->log);
    free(w->q);
    free(w->acks);
    free(w);
}

void obx__sim_world_reset(obx__sim_world *w, uint64_t seed, const obx__sim_faults *f,
                          int32_t partitions, obx__sim_lookup lookup, const char *cluster) {
    w->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
    w->order = 0;
    w->now = 0;
    w->f = *f;
    memset(&w->fired, 0, sizeof w->fired);
    w->partitions = partitions < 1 ? 1 : partitions > 64 ? 64 : partitions;
    w->lookup = lookup;
    obx__strlcpy(w->cluster, cluster, sizeof w->cluster);
    w->nlog = 0;
    w->nq = 0;
    w->nacks = 0;
    w->ntopics = 0;
    w->ngroups = 0;
    memset(w->next_offset, 0, sizeof w->next_offset);
    for (int i = 0; i < MAX_HANDLES; i++)
        if (w->h[i]) {
            w->h[i]->nbox = 0;
            w->h[i]->npolled = 0;
        }
}

obx__sim_faults *obx__sim_world_faults(obx__sim_world *w) { return &w->f; }
const obx__sim_fired *obx__sim_world_fired(obx__sim_world *w) { return &w->fired; }

const obx__sim_msg *obx__sim_world_log(obx__sim_world *w, size_t *n) {
    *n = w->nlog;
    /* logent starts with the message: callers index with a stride (see src/sim) */
    return w->nlog ? &w->log[0].m : NULL;
}

size_t obx__sim_world_log_stride(void) { return sizeof(logent); }

size_t obx__sim_world_pending(obx__sim_world *w) { return w->nq; }

const obx__sim_ack *obx__sim_world_acks(obx__sim_world *w, size_t *n) {
    *n = w->nacks;
    return w->acks;
}

static int topic_index(obx__sim_world *w, const char *topic, bool create) {
    for (int i = 0; i < w->ntopics; i++)
        if (!strcmp(w->topics[i], topic)) return i;
    if (!create || w->ntopics == OBX__SIM_TOPICS) return -1;
    obx__strlcpy(w->topics[w->ntopics], topic, sizeof w->topics[0]);
    return w->ntopics++;
}

static obx_err schedule(obx__sim_world *w, const net_ev *e) {
    if (w->nq == w->capq) {
        size_t c = w->capq ? w->capq * 2 : 64;
        net_ev *p = realloc(w->q, c * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "sim: out of memory");
        w->q = p;
        w->capq = c;
    }
    w->q[w->nq] = *e;
    w->q[w->nq].order = w->order++;
    w->nq++;
    return OBX_OK;
}

static obx_err box_put(sim_handle *h, const obx__outcome *o, uint8_t ack) {
    if (h->nbox == h->capbox) {
        size_t c = h->capbox ? h->capbox * 2 : 32;
        obx__outcome *p = realloc(h->box, c * sizeof *p);
        uint8_t *q = realloc(h->box_ack, c * sizeof *q);
        if (p) h->box = p;
        if (q) h->box_ack = q;
        if (!p || !q) return obx__fail(OBX_ENOMEM, "sim: out of memory");
        h->capbox = c;
    }
    h->box[h->nbox] = *o;
    h->box_ack[h->nbox] = ack;
    h->nbox++;
    return OBX_OK;
}

static obx_err log_append(obx__sim_world *w, const obx__sim_msg *m, int64_t now, int64_t *off,
                          const net_ev *from) {
    int t = topic_index(w, m->topic, true);
    if (t < 0) return obx__fail(OBX_EBROKER, "sim: too many topics");
    if (w->nlog == w->caplog) {
        size_t c = w->caplog ? w->caplog * 2 : 64;
        logent *p = realloc(w->log, c * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "sim: out of memory");
        w->log = p;
        w->caplog = c;
    }
    logent *e = &w->log[w->nlog++];
    e->m = *m;
    e->m.offset = w->next_offset[t][m->partition]++;
    e->m.ts = now;
    e->acked = 0;
    e->handle = from->handle;
    e->handle_gen = from->handle_gen;
    e->deadline = from->deadline;
    e->ack_fate = from->lose ? 2 : from->drop ? 1 : 0;
    e->forged = false;
    *off = e->m.offset;
    return OBX_OK;
}

/* The ACK outcome of a logged message, on its way to its sender at `at`. */
static net_ev ack_of(const obx__sim_world *w, const logent *l, int64_t at, bool corrupt) {
    net_ev o;
    memset(&o, 0, sizeof o);
    o.kind = EV_OUTCOME;
    o.at = at;
    o.handle = l->handle;
    o.handle_gen = l->handle_gen;
    o.deadline = l->deadline;
    o.valid = !corrupt;
    o.out.kind = OBX__OUT_ACK;
    obx__strlcpy(o.out.event_id, l->m.env.event_id, sizeof o.out.event_id);
    o.out.envelope_gen = l->m.env.envelope_gen;
    obx__strlcpy(o.out.attempt_id, l->m.attempt_id, sizeof o.out.attempt_id);
    obx__strlcpy(o.out.payload_digest, l->m.env.payload_digest, sizeof o.out.payload_digest);
    obx__strlcpy(o.out.dest_digest, l->m.dest_digest, sizeof o.out.dest_digest);
    obx__strlcpy(o.out.cluster, w->cluster, sizeof o.out.cluster);
    obx__strlcpy(o.out.topic, l->m.topic, sizeof o.out.topic);
    o.out.partition = l->m.partition;
    o.out.offset = l->m.offset;
    o.out.broker_ts = l->m.ts;
    if (corrupt) /* a broken broker or proxy mangles the receipt (not the message) */
        o.out.payload_digest[8] = o.out.payload_digest[8] == 'a' ? 'b' : 'a';
    return o;
}

/* An ACK handed to the engine by a poll (only those can reach the acceptance point). */
static obx_err record_ack(obx__sim_world *w, const obx__outcome *o, uint8_t ack, size_t *idx) {
    if (w->nacks == w->capacks) {
        size_t c = w->capacks ? w->capacks * 2 : 64;
        obx__sim_ack *p = realloc(w->acks, c * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "sim: out of memory");
        w->acks = p;
        w->capacks = c;
    }
    obx__sim_ack *a = &w->acks[w->nacks];
    obx__strlcpy(a->attempt_id, o->attempt_id, sizeof a->attempt_id);
    obx__strlcpy(a->event_id, o->event_id, sizeof a->event_id);
    a->late = (ack & 3) == 2;
    a->valid = !(ack & 4);
    if (a->late) w->fired.late_ack++;
    *idx = w->nacks++;
    return OBX_OK;
}

/* Another body in m (same length, one byte changed). */
static void alter_body(obx__sim_msg *m) {
    if (!m->payload_len) m->payload[m->payload_len++] = '?';
    m->payload[m->payload_len / 2] ^= 0x20;
}

/* Appends a copy of m the relay never sent, before the genuine one: kind 1 keeps m's headers
 * with another body (corrupt), kind 2 is another producer's consistent message under the same
 * event ID (foreign: its header digest is its body's hash). No ACK of its own. */
static obx_err append_forged(obx__sim_world *w, const net_ev *e, int kind) {
    obx__sim_msg f = e->msg;
    alter_body(&f);
    if (kind == 2 && obx_sha256_digest(f.payload, f.payload_len, f.env.payload_digest))
        return obx__fail(OBX_ENOMEM, "sim: digest");
    int64_t off;
    obx_err err = log_append(w, &f, e->at, &off, e);
    if (err) return err;
    w->log[w->nlog - 1].ack_fate = 2;
    w->log[w->nlog - 1].forged = true;
    return OBX_OK;
}

bool obx__sim_world_forged(obx__sim_world *w, const char *event_id) {
    for (size_t i = 0; i < w->nlog; i++)
        if (w->log[i].forged && !strcmp(w->log[i].m.env.event_id, event_id)) return true;
    return false;
}

/* Applies one network event at time `at`. */
static obx_err apply(obx__sim_world *w, net_ev *e) {
    obx_err err = OBX_OK;
    if (e->kind == EV_APPEND) {
        int64_t off;
        if ((e->forge == 1 || e->forge == 2) && (err = append_forged(w, e, e->forge))) return err;
        if ((err = log_append(w, &e->msg, e->at, &off, e))) return err;
        if (e->forge == 3) w->log[w->nlog - 1].forged = true; /* forge_body: this copy */
        size_t first = w->nlog - 1;
        if (e->dup) {
            int64_t off2;
            if ((err = log_append(w, &e->msg, e->at, &off2, e))) return err;
            w->log[w->nlog - 1].ack_fate = 2; /* a producer-level retry's copy: no ACK of its own */
            w->log[w->nlog - 1].forged = e->forge == 3;
        }
        if (e->lose) return OBX_OK; /* the ACK never comes back */
        if (e->drop) return OBX_OK; /* the sender gets UNKNOWN from its timeout instead */
        net_ev o = ack_of(w, &w->log[first], 0, e->corrupt);
        o.valid = e->valid;
        o.at = e->at + between(w, 0, 20) + (e->delay ? w->f.delay_ack_ms : 0);
        return schedule(w, &o);
    }
    sim_handle *h = e->handle >= 0 && e->handle < MAX_HANDLES ? w->h[e->handle] : NULL;
    if (!h || h->gen != e->handle_gen) return OBX_OK; /* the sender is gone: lost with it */
    uint8_t ack = 0;
    if (e->out.kind == OBX__OUT_ACK)
        ack = (uint8_t)((e->deadline && e->at > e->deadline ? 2 : 1) | (e->valid ? 0 : 4));
    return box_put(h, &e->out, ack);
}

int64_t obx__sim_world_next_at(obx__sim_world *w) {
    int64_t t = INT64_MAX;
    for (size_t i = 0; i < w->nq; i++)
        if (w->q[i].at < t) t = w->q[i].at;
    return t;
}

bool obx__sim_world_release_ack(obx__sim_world *w, const char *attempt_id, int64_t at) {
    bool any = false;
    for (size_t i = 0; i < w->nq; i++) /* an ACK on its way (delayed): it arrives now */
        if (w->q[i].kind == EV_OUTCOME && w->q[i].out.kind == OBX__OUT_ACK &&
            !strcmp(w->q[i].out.attempt_id, attempt_id)) {
            if (w->q[i].at > at) w->q[i].at = at;
            any = true;
        }
    if (any) return true;
    for (size_t i = 0; i < w->nlog; i++) { /* a dropped or lost ACK: it was late, not lost */
        logent *l = &w->log[i];
        /* (a forged copy has no true ACK: the broker never stored what was sent) */
        if (!l->ack_fate || l->forged || strcmp(l->m.attempt_id, attempt_id)) continue;
        sim_handle *h = l->handle >= 0 && l->handle < MAX_HANDLES ? w->h[l->handle] : NULL;
        if (!h || h->gen != l->handle_gen) continue; /* its connection is gone: lost with it */
        net_ev o = ack_of(w, l, at, false);
        if (schedule(w, &o)) return false;
        l->ack_fate = 0;
        return true;
    }
    return false;
}

const obx__sim_msg *obx__sim_world_find(obx__sim_world *w, const char *event_id,
                                        int32_t envelope_gen) {
    for (size_t i = w->nlog; i-- > 0;)
        if (!w->log[i].forged && w->log[i].m.env.envelope_gen == envelope_gen &&
            !strcmp(w->log[i].m.env.event_id, event_id))
            return &w->log[i].m;
    return NULL;
}

void obx__sim_world_clock(obx__sim_world *w, int64_t now) { w->now = now; }

void obx__sim_world_tick(obx__sim_world *w, int64_t now) {
    if (now > w->now) w->now = now;
    now = w->now;
    for (;;) {
        size_t best = SIZE_MAX;
        for (size_t i = 0; i < w->nq; i++)
            if (w->q[i].at <= now &&
                (best == SIZE_MAX || w->q[i].at < w->q[best].at ||
                 (w->q[i].at == w->q[best].at && w->q[i].order < w->q[best].order)))
                best = i;
        if (best == SIZE_MAX) return;
        net_ev e = w->q[best];
        w->q[best] = w->q[--w->nq];
        if (apply(w, &e)) return; /* out of memory: the trace fails its checks */
    }
}

/* ---- the vtable ------------------------------------------------------------------------------ */

static obx_err sb_open(const obx__url *u, const char *const *props, size_t n_props,
                       obx__broker **out) {
    (void)props;
    (void)n_props;
    pthread_mutex_lock(&reg_mu);
    obx__sim_world *w = registry;
    while (w && strcmp(w->name, u->path)) w = w->next;
    pthread_mutex_unlock(&reg_mu);
    if (!w) return obx__fail(OBX_EBROKER, "sim: no world named '%s'", u->path);
    int id = -1;
    for (int i = 0; i < MAX_HANDLES; i++)
        if (!w->h[i]) {
            id = i;
            break;
        }
    if (id < 0) return obx__fail(OBX_EBROKER, "sim: too many handles on '%s'", u->path);
    sim_handle *h = calloc(1, sizeof *h);
    if (!h) return obx__fail(OBX_ENOMEM, "sim: out of memory");
    h->base.m = &obx__sim_broker_methods;
    h->w = w;
    h->id = id;
    h->gen = (uint32_t)rnd(w);
    h->group = -1;
    w->h[id] = h;
    *out = &h->base;
    return OBX_OK;
}

static void sb_close(obx__broker *b) {
    sim_handle *h = (sim_handle *)b;
    if (!h) return;
    if (h->w->h[h->id] == h) h->w->h[h->id] = NULL;
    free(h->box);
    free(h->box_ack);
    free(h->polled_acks);
    free(h->delivered);
    free(h);
}

static unsigned sb_caps_of(obx__broker *b) {
    sim_handle *h = (sim_handle *)b;
    return OBX__BCAP_CONSUME | OBX__BCAP_SCAN | OBX__BCAP_ORDERED |
           (h->w->lookup == OBX__SIM_LOOKUP_AUTHORITATIVE ? OBX__BCAP_LOOKUP_AUTHORITATIVE
            : h->w->lookup == OBX__SIM_LOOKUP_BEST_EFFORT ? OBX__BCAP_LOOKUP_BEST_EFFORT
                                                          : 0u);
}

static obx_err sb_cluster_id(obx__broker *b, char *out, size_t cap) {
    obx__strlcpy(out, ((sim_handle *)b)->w->cluster, cap);
    return OBX_OK;
}

static obx_err sb_partition_for(obx__broker *b, const obx__dest *d, int32_t *out) {
    *out = obx__partition(d->algorithm, d->routing_key, ((sim_handle *)b)->w->partitions);
    return OBX_OK;
}

static void outcome_of(const obx__msg *m, obx__outcome *o, obx__outcome_kind k, const char *why) {
    memset(o, 0, sizeof *o);
    o->kind = k;
    obx__strlcpy(o->event_id, m->env->event_id, sizeof o->event_id);
    o->envelope_gen = m->env->envelope_gen;
    obx__strlcpy(o->attempt_id, m->attempt_id, sizeof o->attempt_id);
    obx__strlcpy(o->topic, m->dest->topic, sizeof o->topic);
    o->partition = m->partition;
    o->offset = -1;
    obx__strlcpy(o->reason, why, sizeof o->reason);
}

/* now: the sender's clock, for the deadline check; the network runs on the world's (t). */
static obx_err sb_send(obx__broker *b, const obx__msg *m, size_t n, int64_t now) {
    sim_handle *h = (sim_handle *)b;
    obx__sim_world *w = h->w;
    int64_t t = w->now;
    obx__sim_world_tick(w, t);
    obx_err err = OBX_OK;
    for (size_t i = 0; i < n && !err; i++) {
        obx__outcome o;
        if (m[i].deadline && now > m[i].deadline) { /* broker.h: never after the deadline */
            w->fired.deadline_refused++;
            outcome_of(&m[i], &o, OBX__OUT_NOT_SENT, "attempt deadline passed: not sent");
            err = box_put(h, &o, 0);
            continue;
        }
        if (m[i].partition >= w->partitions) {
            outcome_of(&m[i], &o, OBX__OUT_REJECT, "no such partition");
            err = box_put(h, &o, 0);
            continue;
        }
        if (chance(w, w->f.reject)) {
            w->fired.reject++;
            bool late = chance(w, w->f.late_reject); /* lands after the attempt's lease */
            w->fired.late_reject += late;
            outcome_of(&m[i], &o, OBX__OUT_REJECT, "rejected (fault)");
            net_ev e = {.at = t + between(w, 0, 20) + (late ? w->f.delay_ack_ms : 0),
                        .kind = EV_OUTCOME,
                        .handle = h->id,
                        .handle_gen = h->gen,
                        .out = o};
            err = schedule(w, &e);
            continue;
        }
        if (chance(w, w->f.blackhole)) {
            w->fired.blackhole++;
            continue; /* lost in transit: no append, no answer */
        }
        net_ev e;
        memset(&e, 0, sizeof e);
        e.kind = EV_APPEND;
        e.at = t + between(w, 0, w->f.max_net_delay_ms);
        e.handle = h->id;
        e.handle_gen = h->gen;
        e.deadline = m[i].deadline;
        e.valid = true;
        obx__sim_msg *s = &e.msg;
        s->env = *m[i].env;
        obx__strlcpy(s->attempt_id, m[i].attempt_id, sizeof s->attempt_id);
        obx__strlcpy(s->dest_digest, m[i].dest_digest, sizeof s->dest_digest);
        obx__strlcpy(s->topic, m[i].dest->topic, sizeof s->topic);
        s->partition = m[i].partition;
        s->payload_len =
            m[i].payload_len < OBX__SIM_PAYLOAD_MAX ? m[i].payload_len : OBX__SIM_PAYLOAD_MAX;
        memcpy(s->payload, m[i].payload, s->payload_len);
        if ((e.corrupt = chance(w, w->f.corrupt))) {
            w->fired.corrupt++;
            e.valid = false;
        }
        if ((e.dup = chance(w, w->f.dup_append))) w->fired.dup_append++;
        if (chance(w, w->f.forge_body)) { /* good headers, another body: no valid ACK for it */
            w->fired.forge_body++;
            alter_body(s);
            e.forge = 3;
            e.drop = true;
        } else if (chance(w, w->f.corrupt_before)) {
            w->fired.corrupt_before++;
            e.forge = 1;
        } else if (chance(w, w->f.foreign_before)) {
            w->fired.foreign_before++;
            e.forge = 2;
        }
        if (!e.drop && (e.lose = chance(w, w->f.lose_ack))) w->fired.lose_ack++;
        if (!e.lose && (e.drop = e.drop || chance(w, w->f.drop_ack))) {
            w->fired.drop_ack++;
            net_ev u = {.at = t + w->f.ack_timeout_ms,
                        .kind = EV_OUTCOME,
                        .handle = h->id,
                        .handle_gen = h->gen};
            outcome_of(&m[i], &u.out, OBX__OUT_UNKNOWN, "ACK timed out (possibly persisted)");
            if ((err = schedule(w, &u))) break;
        }
        if (!e.lose && !e.drop && (e.delay = chance(w, w->f.delay_ack))) w->fired.delay_ack++;
        err = schedule(w, &e);
    }
    return err;
}

static obx_err sb_poll(obx__broker *b, int64_t now, int timeout_ms, obx__outcome *out, size_t cap,
                       size_t *n) {
    sim_handle *h = (sim_handle *)b;
    (void)timeout_ms;
    (void)now; /* the sender's clock: outcomes arrive on the world's */
    obx__sim_world_tick(h->w, h->w->now);
    size_t k = h->nbox < cap ? h->nbox : cap;
    size_t *pa = realloc(h->polled_acks, (k ? k : 1) * sizeof *pa);
    if (!pa) return obx__fail(OBX_ENOMEM, "sim: out of memory");
    h->polled_acks = pa;
    h->npolled = 0;
    for (size_t i = 0; i < k; i++) {
        out[i] = h->box[i];
        size_t idx = 0;
        if (h->box_ack[i]) {
            obx_err e = record_ack(h->w, &h->box[i], h->box_ack[i], &idx);
            if (e) return e;
            h->polled_acks[h->npolled++] = idx;
        }
    }
    if (k && h->nbox > k) { /* (never memmove from a NULL mailbox, even for 0 bytes) */
        memmove(h->box, h->box + k, (h->nbox - k) * sizeof *h->box);
        memmove(h->box_ack, h->box_ack + k, (h->nbox - k) * sizeof *h->box_ack);
    }
    h->nbox -= k;
    *n = k;
    return OBX_OK;
}

void obx__sim_handle_unrecord_acks(obx__broker *b) {
    sim_handle *h = (sim_handle *)b;
    /* mark them as not having reached a committed acceptance: they are excluded from the
     * late-ACK convergence count (docs/design.md, "The single acceptance point": a rolled-back
     * acceptance leaves the attempt to be reconciled) */
    for (size_t i = 0; i < h->npolled; i++) h->w->acks[h->polled_acks[i]].attempt_id[0] = '\0';
    h->npolled = 0;
}

static size_t sb_in_flight(obx__broker *b) {
    sim_handle *h = (sim_handle *)b;
    size_t n = h->nbox;
    for (size_t i = 0; i < h->w->nq; i++) n += h->w->q[i].handle == h->id;
    return n;
}

static int64_t sb_quiet(obx__broker *b) {
    const obx__sim_faults *f = &((sim_handle *)b)->w->f;
    return f->quiet_ms ? f->quiet_ms : f->max_net_delay_ms;
}

static obx_err sb_lookup(obx__broker *b, const obx__lookup_req *req, obx__lookup_res *res) {
    sim_handle *h = (sim_handle *)b;
    obx__sim_world *w = h->w;
    obx__sim_world_tick(w, w->now); /* req->now, the relay's clock, decided the quiet time */
    if (w->f.lookup_down) {
        w->fired.lookup_down++;
        res->kind = OBX__LOOKUP_CANNOT_TELL;
        snprintf(res->reason, sizeof res->reason, "sim: target not queryable");
        return OBX_OK;
    }
    /* every copy under the event ID and generation: its body is hashed (obx__lookup_copy), the
     * first whose bytes are the event's message is the receipt, the others are counted */
    res->kind = OBX__LOOKUP_NOT_FOUND;
    for (size_t i = 0; i < w->nlog; i++) {
        const obx__sim_msg *m = &w->log[i].m;
        if (m->partition != req->partition || strcmp(m->topic, req->dest->topic) ||
            strcmp(m->env.event_id, req->event_id) || m->env.envelope_gen != req->envelope_gen)
            continue;
        obx__outcome o;
        memset(&o, 0, sizeof o);
        obx__strlcpy(o.event_id, m->env.event_id, sizeof o.event_id);
        o.envelope_gen = m->env.envelope_gen;
        obx__strlcpy(o.attempt_id, m->attempt_id, sizeof o.attempt_id);
        obx__strlcpy(o.payload_digest, m->env.payload_digest, sizeof o.payload_digest);
        obx__strlcpy(o.dest_digest, m->dest_digest, sizeof o.dest_digest);
        obx__strlcpy(o.cluster, w->cluster, sizeof o.cluster);
        obx__strlcpy(o.topic, m->topic, sizeof o.topic);
        o.partition = m->partition;
        o.offset = m->offset;
        o.broker_ts = m->ts;
        obx__lookup_copy(req, res, &o, m->payload, m->payload_len);
    }
    if (res->kind == OBX__LOOKUP_FOUND) {
        const obx__outcome *o = &res->found;
        /* a best-effort lookup (an audit stream) proves routing, not every queue's copy */
        res->routed_only = w->lookup == OBX__SIM_LOOKUP_BEST_EFFORT;
        snprintf(res->reason, sizeof res->reason, "sim: found at offset %lld%s",
                 (long long)o->offset, res->routed_only ? " (best effort: routed only)" : "");
        return OBX_OK;
    }
    snprintf(res->reason, sizeof res->reason, "sim: scanned the partition, %s",
             res->n_bad ? "only copies of other bytes" : "not present");
    return OBX_OK;
}

static obx_err sb_scan(obx__broker *b, const char *topic, int64_t since, obx__scan_fn fn,
                       void *user) {
    obx__sim_world *w = ((sim_handle *)b)->w;
    for (size_t i = 0; i < w->nlog; i++) {
        const obx__sim_msg *m = &w->log[i].m;
        if (m->ts < since || strcmp(m->topic, topic)) continue;
        if (fn(user, m->env.event_id, m->partition, m->offset, m->ts)) break;
    }
    return OBX_OK;
}

static obx_err sb_consume_open(obx__broker *b, const char *group, const char *const *topics,
                               size_t n) {
    sim_handle *h = (sim_handle *)b;
    obx__sim_world *w = h->w;
    int g = -1;
    for (int i = 0; i < w->ngroups; i++)
        if (!strcmp(w->groups[i], group)) g = i;
    if (g < 0) {
        if (w->ngroups == MAX_GROUPS) return obx__fail(OBX_EBROKER, "sim: too many groups");
        g = w->ngroups++;
        obx__strlcpy(w->groups[g], group, sizeof w->groups[g]);
    }
    h->group = g;
    h->nctopics = 0;
    for (size_t i = 0; i < n && i < 4; i++)
        obx__strlcpy(h->ctopics[h->nctopics++], topics[i], sizeof h->ctopics[0]);
    if (h->delivered) memset(h->delivered, 0, h->capdel * sizeof *h->delivered);
    return OBX_OK;
}

void obx__sim_consumer_restart(obx__broker *b) {
    sim_handle *h = (sim_handle *)b;
    if (h->delivered) memset(h->delivered, 0, h->capdel * sizeof *h->delivered);
}

static bool subscribed(sim_handle *h, const char *topic) {
    for (int i = 0; i < h->nctopics; i++)
        if (!strcmp(h->ctopics[i], topic)) return true;
    return false;
}

static obx_err sb_consume_poll(obx__broker *b, int timeout_ms, obx__delivery *out, size_t cap,
                               size_t *n) {
    sim_handle *h = (sim_handle *)b;
    obx__sim_world *w = h->w;
    (void)timeout_ms;
    *n = 0;
    if (h->group < 0) return obx__fail(OBX_EINVAL, "sim: consume_poll before consume_open");
    if (h->capdel < w->nlog) {
        size_t c = w->caplog;
        bool *p = realloc(h->delivered, c * sizeof *p);
        if (!p) return obx__fail(OBX_ENOMEM, "sim: out of memory");
        memset(p + h->capdel, 0, (c - h->capdel) * sizeof *p);
        h->delivered = p;
        h->capdel = c;
    }
    for (size_t i = 0; i < w->nlog && *n < cap; i++) {
        logent *e = &w->log[i];
        if (h->delivered[i] || (e->acked >> h->group & 1) || !subscribed(h, e->m.topic)) continue;
        int copies = 1;
        if (*n + 1 < cap && chance(w, w->f.dup_deliver)) {
            w->fired.dup_deliver++;
            copies = 2;
        }
        for (int c = 0; c < copies; c++) {
            obx__delivery *d = &out[(*n)++];
            memset(d, 0, sizeof *d);
            obx__strlcpy(d->topic, e->m.topic, sizeof d->topic);
            d->partition = e->m.partition;
            d->offset = e->m.offset;
            d->broker_ts = e->m.ts;
            d->token = i;
            d->redelivered = c > 0;
            d->env = e->m.env;
            obx__strlcpy(d->dest_digest, e->m.dest_digest, sizeof d->dest_digest);
            obx__strlcpy(d->attempt_id, e->m.attempt_id, sizeof d->attempt_id);
            d->payload = malloc(e->m.payload_len ? e->m.payload_len : 1);
            if (!d->payload) return obx__fail(OBX_ENOMEM, "sim: out of memory");
            memcpy(d->payload, e->m.payload, e->m.payload_len);
            d->payload_len = e->m.payload_len;
        }
        h->delivered[i] = true;
    }
    /* reorder: deliveries are acknowledged one by one, so any order is legal */
    bool moved = false;
    for (size_t i = *n; i > 1; i--) {
        size_t j = (size_t)(rnd(w) % i);
        if (j != i - 1) {
            obx__delivery t = out[i - 1];
            out[i - 1] = out[j];
            out[j] = t;
            moved = moved || strcmp(out[j].env.event_id, out[i - 1].env.event_id);
        }
    }
    if (moved) w->fired.reorder++;
    return OBX_OK;
}

static obx_err sb_consume_ack(obx__broker *b, const obx__delivery *d) {
    sim_handle *h = (sim_handle *)b;
    obx__sim_world *w = h->w;
    if (chance(w, w->f.lose_commit)) {
        w->fired.lose_commit++;
        return OBX_OK; /* acknowledged, but the broker never hears of it */
    }
    if (d->token < w->nlog) w->log[d->token].acked |= (uint8_t)(1u << h->group);
    return OBX_OK;
}

static obx_err sb_consume_redeliver(obx__broker *b, const obx__delivery *d) {
    (void)d;
    obx__sim_consumer_restart(b); /* every unacknowledged delivery comes again */
    return OBX_OK;
}

/* the simulated broker: what it stores is stored on its one node before the ACK, so every
 * durability and acknowledgement level is honoured (a transient message kept durably loses nothing
 * it was promised). */
static void sb_contract(obx__broker *base, obx__contract *out) {
    (void)base;
    obx__strlcpy(out->durability, "persistent,transient", sizeof out->durability);
    obx__strlcpy(out->required_acks, "all,1,confirm", sizeof out->required_acks);
    obx__strlcpy(out->serializer, "*", sizeof out->serializer);
}

const obx__broker_methods obx__sim_broker_methods = {
    .version = OBX__BROKER_METHODS_VERSION,
    .name = "sim",
    .caps = OBX__BCAP_LOOKUP_AUTHORITATIVE | OBX__BCAP_LOOKUP_BEST_EFFORT | OBX__BCAP_SCAN |
            OBX__BCAP_CONSUME | OBX__BCAP_ORDERED,
    .open = sb_open,
    .close = sb_close,
    .cluster_id = sb_cluster_id,
    .partition_for = sb_partition_for,
    .send = sb_send,
    .poll = sb_poll,
    .in_flight = sb_in_flight,
    .lookup = sb_lookup,
    .quiet_time_ms = sb_quiet,
    .contract = sb_contract,
    .scan = sb_scan,
    .consume_open = sb_consume_open,
    .consume_poll = sb_consume_poll,
    .consume_ack = sb_consume_ack,
    .consume_redeliver = sb_consume_redeliver,
    .caps_of = sb_caps_of,
};

/*
 * broker.h — the broker backend interface (one vtable with declared capabilities).
 *
 * A backend is a `static const obx__broker_methods`; an instance struct starts with
 * `const obx__broker_methods *m`. The engine reaches backends only through the obx__br_*
 * wrappers in broker.c (argument checks, tracing, fault injection).
 *
 * Sending is asynchronous: send() hands a batch of attempts to the backend and returns; every
 * message handed over produces exactly one outcome, returned by a later poll() on the same
 * handle (unless the handle is closed first — then the attempt stays SENDING in the store and
 * the lease sweeper makes it UNKNOWN). An outcome is:
 *   ACK      the broker persisted it: a receipt (cluster, topic, partition, offset, time) plus
 *            the digests and attempt the message carried, for the acceptance point;
 *   REJECT   the broker definitely did not accept it and will not on a retry as is (unknown
 *            topic, too large, unroutable, nack): counts toward the route's max attempts;
 *   NOT_SENT definitely not persisted, transient (broker down before the send): back to PENDING
 *            with backoff, not counted toward parking;
 *   UNKNOWN  it may or may not have been persisted (timeout, lost connection after the send):
 *            the reconciler resolves it.
 *
 * Lookup capability (docs/design.md, "Reconciliation and UNKNOWN outcomes"): AUTHORITATIVE
 * backends can prove absence once an attempt's quiet time has passed; BEST_EFFORT ones can prove
 * presence only; NONE can prove nothing.
 */
#ifndef OBX_BROKER_H
#define OBX_BROKER_H

#include "core/core.h"

#define OBX__BROKER_METHODS_VERSION 1

#define OBX__BCAP_LOOKUP_AUTHORITATIVE 1u
#define OBX__BCAP_LOOKUP_BEST_EFFORT 2u
#define OBX__BCAP_SCAN 4u     /* can list event IDs present on a topic (bypass audit) */
#define OBX__BCAP_CONSUME 8u  /* has a consumer side for the inbox */
#define OBX__BCAP_ORDERED 16u /* per-partition order is preserved */

typedef struct obx_broker obx__broker;

/* Headers every message carries (same names on Kafka and AMQP). */
#define OBX__H_EVENT_ID "obx-event-id"
#define OBX__H_ENVELOPE_GEN "obx-envelope-gen"
#define OBX__H_ATTEMPT_ID "obx-attempt-id"
#define OBX__H_ATTEMPT_GEN "obx-attempt-gen"
#define OBX__H_PAYLOAD_DIGEST "obx-payload-digest"
#define OBX__H_DEST_DIGEST "obx-dest-digest"
#define OBX__H_EVENT_TYPE "obx-event-type"
#define OBX__H_TENANT "obx-tenant"
#define OBX__H_CORRELATION_ID "obx-correlation-id"
#define OBX__H_CAUSATION_ID "obx-causation-id"
#define OBX__H_TRACEPARENT "traceparent"
#define OBX__H_AGGREGATE "obx-aggregate" /* "type/id@version" */
#define OBX__H_OCCURRED_AT "obx-occurred-at"
#define OBX__H_PAYLOAD_SCHEMA "obx-payload-schema"
#define OBX__H_CONTENT_TYPE "content-type" /* the frozen destination's serializer */
#define OBX__H_ENCRYPTION "obx-encryption" /* the key ID of a sealed body (AES-256-GCM) */

/* One attempt to send. All pointers are borrowed for the duration of send(); a backend that
 * keeps the message until its outcome copies what it needs. */
typedef struct obx__msg {
    const obx__envelope *env;
    const obx__dest *dest;
    const char *dest_digest;
    const char *attempt_id;
    int32_t attempt_gen;
    int32_t partition; /* pinned partition (from partition_for at the first attempt) */
    const void *payload;
    size_t payload_len;
    /* The attempt's send deadline (its lease end, ms). A backend must never hand the message
     * to the broker after it (check as late as possible, against max(now, its own clock)); it
     * reports NOT_SENT instead. This is what lets a reconciler's lookup become authoritative
     * after the quiet time: a frozen sender cannot land its write later. 0 = none. */
    int64_t deadline;
    /* NULL, or the key ID payload is sealed with (header obx-encryption; docs/security.md) */
    const char *enc_key;
} obx__msg;

typedef enum obx__outcome_kind {
    OBX__OUT_ACK,
    OBX__OUT_REJECT,
    OBX__OUT_NOT_SENT,
    OBX__OUT_UNKNOWN,
} obx__outcome_kind;

const char *obx__outcome_kind_name(obx__outcome_kind k);

typedef struct obx__outcome {
    obx__outcome_kind kind;
    char event_id[OBX_EVENT_ID_LEN + 1];
    int32_t envelope_gen;
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    /* what the broker holds (ACK) — the digests are those the persisted message carries */
    char payload_digest[OBX_DIGEST_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1];
    char cluster[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t broker_ts;
    char reason[OBX_TEXT_MAX + 1]; /* REJECT / NOT_SENT / UNKNOWN: the broker's words */
    /* REJECT that no retry can cure (the frozen contract cannot be honoured, the payload no
     * longer matches its frozen digest): the event is PARKED at once, with the reason */
    bool park;
} obx__outcome;

/* What a broker handle honours of a frozen destination contract (destination.v1: durability,
 * required_acks, serializer), as comma-separated values; "*" = any. docs/design.md,
 * "Destination contract". */
typedef struct obx__contract {
    char durability[128];
    char required_acks[128];
    char serializer[128];
} obx__contract;

typedef struct obx__lookup_req {
    const obx__dest *dest;
    const char *dest_digest;
    /* the frozen payload digest: a copy counts only when its body hashes to it (NULL: to the
     * digest its own header names) */
    const char *payload_digest;
    int32_t partition;
    const char *event_id;
    int32_t envelope_gen;
    /* An encrypted route's key (docs/security.md): a copy counts only when its body opens under
     * enc_key for event_id and envelope_gen to a plaintext that hashes to payload_digest. NULL:
     * the body itself must hash to it. */
    const obx_keyring *keys;
    const char *enc_key;
    int64_t since;       /* the earliest attempt's start (ms) */
    int64_t quiet_until; /* NOT_FOUND may be authoritative only when now >= quiet_until */
    int64_t now;
} obx__lookup_req;

typedef enum obx__lookup_kind {
    OBX__LOOKUP_FOUND,
    OBX__LOOKUP_NOT_FOUND, /* authoritative: the scan covered the partition past quiet time */
    OBX__LOOKUP_CANNOT_TELL,
} obx__lookup_kind;

typedef struct obx__lookup_res {
    obx__lookup_kind kind;
    /* FOUND: the receipt of the first copy whose bytes are the event's message (kind ACK; its
     * payload_digest is the hash of the body read, not a header) */
    obx__outcome found;
    /* Copies under the event ID and generation whose body does not hash to the frozen payload
     * digest or that carry another destination digest (corrupt or foreign), whatever the kind:
     * how many, and the first (payload_digest = its body's hash, reason = what is wrong). The
     * engine quarantines it with an alarm; it never fills the publish slot. */
    int n_bad;
    obx__outcome bad;
    /* CANNOT_TELL only because the quiet time has not passed: when asking again can give an
     * authoritative answer (0 = unknown). */
    int64_t authoritative_at;
    /* Set by the engine (obx__reconcile_lookup), not by backends: when the quiet time of the
     * event's outstanding attempts ends, i.e. when no late write of theirs can appear any more.
     * The route's UNKNOWN policy applies only after it. */
    int64_t quiet_until;
    /* FOUND by a best-effort lookup that proves only that the broker routed the message, not
     * that every destination bound to it stored it (a RabbitMQ audit-stream copy: a queue may
     * have refused the same publish, and that nack may be the confirm that was lost). The
     * engine records it and lets the route's UNKNOWN policy decide (docs/amqp.md). */
    bool routed_only;
    char reason[OBX_TEXT_MAX + 1];
} obx__lookup_res;

/* A message delivered to a consumer. Strings are filled from the obx headers; payload is owned
 * by the delivery and freed with obx__delivery_free(). */
typedef struct obx__delivery {
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t broker_ts;
    bool redelivered;
    uint64_t token;    /* backend's handle for ack (AMQP delivery tag) */
    obx__envelope env; /* from headers: event_id, envelope_gen, event_type, tenant, ... */
    char dest_digest[OBX_DIGEST_LEN + 1];
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    char header_error[OBX_TEXT_MAX + 1]; /* non-empty: headers missing or malformed */
    char enc_key[OBX_KEY_ID_MAX + 1];    /* obx-encryption: the key ID a sealed body needs */
    unsigned char *payload;
    size_t payload_len;
} obx__delivery;

void obx__delivery_free(obx__delivery *d);

/* Called by scan() for every message on a topic. Return non-zero to stop. */
typedef int (*obx__scan_fn)(void *user, const char *event_id, int32_t partition, int64_t offset,
                            int64_t broker_ts);

typedef struct obx__broker_methods {
    int version; /* OBX__BROKER_METHODS_VERSION */
    const char *name;
    unsigned caps;

    /* props: "key=value" strings from configuration (backend properties), may be NULL. */
    obx_err (*open)(const obx__url *u, const char *const *props, size_t n_props, obx__broker **out);
    void (*close)(obx__broker *b);
    /* The cluster identity receipts carry; compared with the frozen destination's cluster. */
    obx_err (*cluster_id)(obx__broker *b, char *out, size_t cap);
    /* The partition for a destination's routing key per its frozen algorithm. OBX_ENOTFOUND
     * when the broker answered that the topic does not exist (a definite answer: the engine
     * rejects the attempt); any other error is taken as transient. */
    obx_err (*partition_for)(obx__broker *b, const obx__dest *d, int32_t *out);
    obx_err (*send)(obx__broker *b, const obx__msg *m, size_t n, int64_t now);
    /* Up to cap outcomes; waits at most timeout_ms for the first one (0 = do not wait). */
    obx_err (*poll)(obx__broker *b, int64_t now, int timeout_ms, obx__outcome *out, size_t cap,
                    size_t *n);
    /* Messages sent whose outcome has not been returned by poll yet. */
    size_t (*in_flight)(obx__broker *b);
    obx_err (*lookup)(obx__broker *b, const obx__lookup_req *req, obx__lookup_res *res);
    /* Quiet time of an attempt started at `started`: after it, no late append can appear. */
    int64_t (*quiet_time_ms)(obx__broker *b);
    /* OBX__BCAP_SCAN */
    obx_err (*scan)(obx__broker *b, const char *topic, int64_t since, obx__scan_fn fn, void *user);
    /* OBX__BCAP_CONSUME: subscribe as group to topics; poll deliveries; ack one after the
     * consumer's database commit (commits the position / basic.ack). */
    obx_err (*consume_open)(obx__broker *b, const char *group, const char *const *topics, size_t n);
    obx_err (*consume_poll)(obx__broker *b, int timeout_ms, obx__delivery *out, size_t cap,
                            size_t *n);
    obx_err (*consume_ack)(obx__broker *b, const obx__delivery *d);
    /* OBX__BCAP_CONSUME: d (not acknowledged) and every later delivery of its partition or
     * queue must be delivered again (Kafka: seek back; AMQP: nack with requeue; log: rewind to
     * the committed offsets). Used after a handler failure so that nothing is skipped. */
    obx_err (*consume_redeliver)(obx__broker *b, const obx__delivery *d);

    /* ---- optional methods (NULL when absent; added within version 1) ---- */
    /* The capabilities of this open handle, when they depend on its configuration (AMQP:
     * lookup and scan exist only with an audit stream). Must return a subset of `caps`, which
     * stays the union of what any configuration can do (the registry checks methods against
     * it). Absent: the handle has exactly `caps`. Read it through obx__br_caps(). */
    unsigned (*caps_of)(obx__broker *b);
    /* OBX__BCAP_CONSUME, for backends with per-message acknowledgement (AMQP): gives a
     * delivery back unacknowledged (basic.nack). requeue = true: the broker delivers it again,
     * to this or another consumer, with `redelivered` set (a handler failure the inbox wants
     * retried now); false: the broker drops it or dead-letters it per the queue's policy. Must
     * not be used for a delivery whose effect was committed: that one is acked. */
    obx_err (*consume_release)(obx__broker *b, const obx__delivery *d, bool requeue);
    /* OBX__BCAP_CONSUME: while paused, poll hands out nothing of (topic, partition) (AMQP: the
     * deliveries of that exchange are held unacknowledged, in order, and handed out once
     * resumed); the position stays where consume_redeliver put it. The retry back-off: the
     * consumer pauses the partition of a message whose retry is not due, and resumes it when it
     * is (consumer.c), without fetching it again meanwhile (Kafka: the partition paused). */
    obx_err (*consume_pause)(obx__broker *b, const char *topic, int32_t partition, bool paused);
    /* What this handle honours of a frozen destination contract (obx__contract). Absent:
     * durability persistent, required_acks all, any serializer (carried as content-type). */
    void (*contract)(obx__broker *b, obx__contract *out);
    /* A descriptor that becomes readable when poll may have an outcome it did not have when
     * the last poll returned (poll clears it; the caller only waits on it), or -1. It lets a
     * relay wait for outcomes and for the store's wake-up in one poll(2) rather than in turns
     * (relay.c, idle_wait). Owned by the handle, valid until close. Absent: -1. */
    int (*wake_fd)(obx__broker *b);
} obx__broker_methods;

struct obx_broker {
    const obx__broker_methods *m;
    char url_redacted[1024];
};

const obx__broker_methods *obx__broker_backend(obx__url_scheme scheme);
extern const obx__broker_methods obx__log_broker_methods;
extern const obx__broker_methods obx__sim_broker_methods;
#ifdef OBX_WITH_KAFKA
extern const obx__broker_methods obx__kafka_broker_methods;
#endif
#ifdef OBX_WITH_AMQP
extern const obx__broker_methods obx__amqp_broker_methods;
#endif

/* ---- shared helpers for backends (broker.c) ---------------------------------------------- */

/* Header pairs for a message; names are the OBX__H_* constants. values point into buf. */
typedef struct obx__headers {
    const char *name[16];
    char value[16][OBX_KEY_MAX + OBX_NAME_MAX + 32];
    size_t n;
} obx__headers;

void obx__headers_build(const obx__msg *m, obx__headers *h);
/* Parses received headers into a delivery's envelope fields; on a missing or malformed
 * required header sets d->header_error and returns OBX_EINVAL. get(name) returns the value
 * (NUL-terminated) or NULL. */
typedef const char *(*obx__header_get_fn)(void *user, const char *name, size_t *len);
obx_err obx__headers_parse(obx__header_get_fn get, void *user, obx__delivery *d);

/* Kafka's default partitioner: murmur2(key) & 0x7fffffff % n (Java and librdkafka agree). */
uint32_t obx__murmur2(const void *key, size_t len);
int32_t obx__partition(const char *algorithm, const char *key, int32_t n_partitions);

/* ---- wrappers: the engine's only way in ----------------------------------------------------
 * Every method of obx__broker_methods has one entry in the lists below (a static assertion in
 * broker.c checks the count against the struct). Nothing outside broker.c calls through
 * `->m->` (the `check` target fails on it): every call counts for fault injection.
 * OBX__BROKER_CONSUME: X(name, params, args): the consumer side (OBX__BCAP_CONSUME);
 * obx__br_<name> counts the call and returns OBX_EUNSUPPORTED when this handle has no consumer
 * side or the backend lacks the method, else b->m->name(args).
 * OBX__BROKER_REQUIRED: X(name): wrappers written by hand in broker.c, declared below; every
 * backend must supply the method (obx__broker_methods_check refuses one that does not).
 * OBX__BROKER_OPTIONAL: X(name): hand-written wrappers of methods a backend may leave NULL
 * (scan is required only with OBX__BCAP_SCAN; caps_of, contract and wake_fd have documented
 * defaults).
 * OBX__BROKER_CUSTOM: both. */
#define OBX__BROKER_CONSUME(X)                                                                     \
    X(consume_open, (obx__broker * b, const char *group, const char *const *topics, size_t n),     \
      (b, group, topics, n))                                                                       \
    X(consume_poll, (obx__broker * b, int timeout_ms, obx__delivery *out, size_t cap, size_t *n),  \
      (b, timeout_ms, out, cap, n))                                                                \
    X(consume_ack, (obx__broker * b, const obx__delivery *d), (b, d))                              \
    X(consume_redeliver, (obx__broker * b, const obx__delivery *d), (b, d))                        \
    X(consume_release, (obx__broker * b, const obx__delivery *d, bool requeue), (b, d, requeue))   \
    X(consume_pause, (obx__broker * b, const char *topic, int32_t partition, bool paused),         \
      (b, topic, partition, paused))

/* The consumer methods a backend declaring OBX__BCAP_CONSUME must supply (consume_release may
 * be NULL: obx__br_has_consume_release tells). */
#define OBX__BROKER_CONSUME_REQUIRED(X)                                                            \
    X(consume_open) X(consume_poll) X(consume_ack) X(consume_redeliver)

#define OBX__BROKER_REQUIRED(X)                                                                    \
    X(open)                                                                                        \
    X(close)                                                                                       \
    X(cluster_id)                                                                                  \
    X(partition_for)                                                                               \
    X(send)                                                                                        \
    X(poll)                                                                                        \
    X(in_flight)                                                                                   \
    X(lookup)                                                                                      \
    X(quiet_time_ms)

#define OBX__BROKER_OPTIONAL(X) X(scan) X(caps_of) X(contract) X(wake_fd)

#define OBX__BROKER_CUSTOM(X) OBX__BROKER_REQUIRED(X) OBX__BROKER_OPTIONAL(X)

/* Refuses (OBX_EINTERNAL, naming the backend and the method) a methods table of another
 * version, one without a required method, or one declaring a capability whose methods it lacks.
 * Run by obx__broker_open before the backend is used. m: borrowed. */
obx_err obx__broker_methods_check(const obx__broker_methods *m);

#define OBX__BR_DECLARE(name, params, args) obx_err obx__br_##name params;
OBX__BROKER_CONSUME(OBX__BR_DECLARE)
#undef OBX__BR_DECLARE
/* whether the backend has consume_pause (the retry back-off without fetching) */
bool obx__br_has_consume_pause(const obx__broker *b);
/* whether the backend has consume_release (per-message nack) */
bool obx__br_has_consume_release(const obx__broker *b);
/* the backend's name ("log", "kafka", "amqp", "sim") */
const char *obx__br_name(const obx__broker *b);
/* Messages sent whose outcome poll has not returned yet. */
size_t obx__br_in_flight(obx__broker *b);
/* The backend's wake_fd (-1 when it has none). */
int obx__br_wake_fd(obx__broker *b);
/* The backend's quiet time (ms) of an attempt: after it, no late append can appear. */
int64_t obx__br_quiet_time_ms(obx__broker *b);
obx_err obx__br_open(const char *url, const char *const *props, size_t n_props, obx__broker **out);
void obx__br_close(obx__broker *b);
obx_err obx__br_cluster_id(obx__broker *b, char *out, size_t cap);
obx_err obx__br_partition_for(obx__broker *b, const obx__dest *d, int32_t *out);
obx_err obx__br_send(obx__broker *b, const obx__msg *m, size_t n, int64_t now);
obx_err obx__br_poll(obx__broker *b, int64_t now, int timeout_ms, obx__outcome *out, size_t cap,
                     size_t *n);
obx_err obx__br_lookup(obx__broker *b, const obx__lookup_req *req, obx__lookup_res *res);

/* For backends' lookups: one stored copy under the looked-up event ID and generation, its
 * identity read from its headers into `copy` (cluster, topic, partition, offset, broker_ts
 * set), and its body. The bytes are the evidence: the body is hashed into copy's payload_digest;
 * a copy whose body hashes to req's payload digest and that carries req's destination digest is
 * the event's message: the first one becomes res->found (kind FOUND). Any other is counted in
 * res->n_bad (the first kept in res->bad). Returns whether the copy was the event's message. */
bool obx__lookup_copy(const obx__lookup_req *req, obx__lookup_res *res, obx__outcome *copy,
                      const void *body, size_t len);
/* OBX__BCAP_SCAN: every message on topic since `since` (ms, broker time) through fn
 * (OBX_EUNSUPPORTED when this handle cannot scan). */
obx_err obx__br_scan(obx__broker *b, const char *topic, int64_t since, obx__scan_fn fn, void *user);
/* The open handle's capabilities: caps_of(b) when the backend has it, else the static caps. */
unsigned obx__br_caps(obx__broker *b);
/* What the handle honours of a destination contract (the backend's contract(), or the
 * default). */
void obx__br_contract(obx__broker *b, obx__contract *out);
/* Whether the handle honours destination d's frozen contract; why (cap bytes) says what it
 * cannot honour, naming the field, the value and what the backend offers. */
bool obx__br_honours(obx__broker *b, const obx__dest *d, char *why, size_t cap);
/* Fault injection for tests: the k-th wrapper call (1-based, process-wide, counted from this
 * call) fails with OBX_EBROKER; 0 = off. obx__br_calls(): wrapper calls counted since.
 * obx__br_fault_code: the code the next armed fault fails with instead (a lost connection:
 * OBX_ECONNLOST), until obx__br_fault_after(0) disarms. */
void obx__br_fault_after(long k);
void obx__br_fault_code(obx_err code);
long obx__br_calls(void);
/* The wrapper (method name) the armed fault failed since it was armed, or NULL. */
const char *obx__br_fault_hit(void);

#endif /* OBX_BROKER_H */

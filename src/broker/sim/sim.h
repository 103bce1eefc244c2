/*
 * sim.h — the simulated broker's world: a deterministic, seeded model of a broker cluster and
 * the network in front of it, under a virtual clock. Broker handles (the vtable in
 * sim_broker.c, URL "sim:NAME") attach to a world by name; the simulator (src/sim)
 * owns the worlds, resets them per trace and reads their logs for its invariant checkers.
 *
 * Network model (what makes the faults honest):
 *   - a send hands a request to the network no later than the attempt's deadline (the sender
 *     checks it); the request reaches the log after a delay of at most max_net_delay, or never
 *     (blackhole); so max_net_delay is the broker's quiet time;
 *   - an append is followed by an outcome travelling back to the sending handle: an ACK (maybe
 *     delayed, maybe lost), or, when the ACK is dropped, an UNKNOWN at send + ack_timeout;
 *   - appends happen whether or not the sender is still alive; outcomes for a closed handle
 *     are lost with it;
 *   - consumers acknowledge each delivery separately (like AMQP); unacknowledged ones are
 *     delivered again after a restart or a redeliver, in any order.
 * Two clocks: the world's (the simulator's virtual clock, set by obx__sim_world_clock and
 * obx__sim_world_tick) times the network; the `now` a sender passes is its own clock (a relay's
 * reference clock, docs/design.md "One clock") and decides only the deadline check, as a real
 * backend checks the deadline against obx__ref_ms.
 */
#ifndef OBX_SIM_H
#define OBX_SIM_H

#include "broker/broker.h"

#define OBX__SIM_TOPICS 4
#define OBX__SIM_PAYLOAD_MAX 128

typedef struct obx__sim_msg {
    obx__envelope env; /* as carried by the headers */
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1];
    char topic[OBX_TOPIC_MAX + 1];
    int32_t partition;
    int64_t offset;
    int64_t ts;
    unsigned char payload[OBX__SIM_PAYLOAD_MAX];
    size_t payload_len;
} obx__sim_msg;

typedef struct obx__sim_faults {
    double drop_ack;    /* ACK lost; the sender sees UNKNOWN at send + ack_timeout */
    double lose_ack;    /* ACK lost and nothing reported (the lease runs out) */
    double delay_ack;   /* ACK comes back after delay_ack_ms more */
    double dup_append;  /* the request is appended twice (a producer-level retry) */
    double blackhole;   /* the request never reaches the log */
    double reject;      /* definite rejection, nothing appended */
    double corrupt;     /* an ACK's payload digest is altered on its way (a broken peer) */
    double dup_deliver; /* a consumer gets a delivery twice */
    double lose_commit; /* a consumer's ack is lost (redelivered later) */
    /* copies the relay never sent, under an event's ID and generation (issue 46): */
    double forge_body;     /* the append keeps the headers and carries another body; no ACK */
    double corrupt_before; /* a copy whose body does not hash to its header, before the genuine */
    double foreign_before; /* a consistent copy of other bytes (another producer), before it */
    double late_reject;    /* a rejection arrives delay_ack_ms late (after the lease) */
    int64_t delay_ack_ms, ack_timeout_ms, max_net_delay_ms;
    /* The broker's quiet time (quiet_time_ms): after an attempt's deadline plus this, no late
     * write of it can appear. 0 = max_net_delay_ms. Requests still reach the log within
     * max_net_delay_ms; the quiet time is what the adapter promises, e.g. Kafka's
     * message.timeout.ms + request.timeout.ms. */
    int64_t quiet_ms;
    bool lookup_down; /* lookups answer CANNOT_TELL (the target is not queryable) */
} obx__sim_faults;

/* A world's lookup capability (what the simulated adapter declares). */
typedef enum obx__sim_lookup {
    OBX__SIM_LOOKUP_NONE,         /* no lookup: every answer is CANNOT_TELL (RabbitMQ) */
    OBX__SIM_LOOKUP_BEST_EFFORT,  /* FOUND proves routing only, never absence (an audit stream) */
    OBX__SIM_LOOKUP_AUTHORITATIVE /* FOUND, and NOT_FOUND past the quiet time (Kafka, log) */
} obx__sim_lookup;

typedef struct obx__sim_world obx__sim_world;

/* Creates a world registered under name (NUL-terminated, unique in the process). */
obx_err obx__sim_world_new(const char *name, obx__sim_world **out);
void obx__sim_world_free(obx__sim_world *w);
/* Empties logs, queues, groups and handles' mailboxes; sets seed, faults, partitions and the
 * lookup capability for the next trace. */
void obx__sim_world_reset(obx__sim_world *w, uint64_t seed, const obx__sim_faults *f,
                          int32_t partitions, obx__sim_lookup lookup, const char *cluster);
/* When the next network event is due (INT64_MAX: none scheduled). */
int64_t obx__sim_world_next_at(obx__sim_world *w);
/* Injects the late true ACK of an attempt whose message is in the log: its ACK (on its way,
 * delayed, dropped or lost) arrives at the sending handle at time `at`, if that handle is still
 * open. Returns true when an ACK will arrive. (The seed's races: UNKNOWN racing a retry claim,
 * both old and new attempts ACKed.) */
bool obx__sim_world_release_ack(obx__sim_world *w, const char *attempt_id, int64_t at);
/* The newest message of (event_id, envelope_gen) the relay sent in the log, or NULL: what an
 * operator reading the broker would find (and tell from a forged copy). */
const obx__sim_msg *obx__sim_world_find(obx__sim_world *w, const char *event_id,
                                        int32_t envelope_gen);
obx__sim_faults *obx__sim_world_faults(obx__sim_world *w);
/* Whether the log holds a copy of event_id the relay never sent (forge_body, corrupt_before,
 * foreign_before): a consumer may then quarantine or park a copy of it. */
bool obx__sim_world_forged(obx__sim_world *w, const char *event_id);
/* Delivers every network event due by now (appends, outcomes); the world's clock moves to now
 * (never back). */
void obx__sim_world_tick(obx__sim_world *w, int64_t now);
/* Sets the world's clock to now (the simulator's, before an actor's step) and delivers nothing:
 * the broker calls of the step deliver and schedule on it. */
void obx__sim_world_clock(obx__sim_world *w, int64_t now);
/* The world's log (all topics), valid until the next append or reset. */
const obx__sim_msg *obx__sim_world_log(obx__sim_world *w, size_t *n);
/* The byte distance between consecutive log messages (entries carry consumer bookkeeping). */
size_t obx__sim_world_log_stride(void);
/* Network events still scheduled (appends in flight, outcomes on their way). */
size_t obx__sim_world_pending(obx__sim_world *w);
/* ACKs the world handed to open senders: attempt IDs, and whether each arrived after the
 * attempt's deadline (a late ACK). Valid until reset. */
typedef struct obx__sim_ack {
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    char event_id[OBX_EVENT_ID_LEN + 1];
    bool late;
    bool valid; /* digests as sent (not corrupted) */
} obx__sim_ack;
const obx__sim_ack *obx__sim_world_acks(obx__sim_world *w, size_t *n);
/* Forgets ACK records of outcomes a handle polled but then failed to apply (the poll step
 * returned an error: those ACKs never reached a committed acceptance). */
void obx__sim_handle_unrecord_acks(obx__broker *b);
/* Counters per fault, for "each fault shown to fire". */
typedef struct obx__sim_fired {
    long drop_ack, lose_ack, delay_ack, dup_append, blackhole, reject, corrupt, dup_deliver,
        lose_commit, late_ack, deadline_refused, lookup_down, reorder, forge_body, corrupt_before,
        foreign_before, late_reject;
} obx__sim_fired;
const obx__sim_fired *obx__sim_world_fired(obx__sim_world *w);

/* Consumer helpers: every unacknowledged delivery of this handle's group comes again (the
 * consumer restarted). */
void obx__sim_consumer_restart(obx__broker *b);

#endif

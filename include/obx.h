/*
 * obx.h — the public API of libobx, a transactional outbox with delivery reconciliation.
 *
 * This header is the contract: what is not declared here is not API. Every fallible call
 * returns an obx_err; OBX_OK is 0. On failure a message for humans naming the field, the
 * limit or the server's words is available from obx_errmsg() on the same thread until the
 * next failing call on that thread.
 *
 * Handles are opaque. Every _open has a _close, and _close(NULL) is harmless. Strings passed
 * in are borrowed for the duration of the call unless a declaration says otherwise. Strings
 * and buffers returned through an out-parameter of type char ** are owned by the caller and
 * freed with obx_free().
 *
 * Threads: a handle is used by one thread at a time. Different handles may be used from
 * different threads concurrently (each store handle owns its own database connection).
 */
#ifndef OBX_H
#define OBX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(OBX_BUILDING_LIBRARY) && defined(__GNUC__)
#define OBX_API __attribute__((visibility("default")))
#else
#define OBX_API
#endif

/* OBX_VERSION_MAJOR, _MINOR, _PATCH, _STRING and _NUMBER (major*10000 + minor*100 + patch): the
 * version this header belongs to, generated from CMake's project(VERSION). obx_libversion()
 * says which library a program actually runs with. */
#include "obx_version.h"

/* ---------------------------------------------------------------------------------------------
 * Errors. Numbers are never reused; names and messages come from this one list.
 * X(name, number, retriable, message)
 * ------------------------------------------------------------------------------------------- */
#define OBX_ERROR_LIST(X)                                                                          \
    X(OBX_OK, 0, 0, "success")                                                                     \
    X(OBX_EINVAL, 1, 0, "invalid argument")                                                        \
    X(OBX_ENOMEM, 2, 0, "out of memory")                                                           \
    X(OBX_ETOOBIG, 3, 0, "value over its limit")                                                   \
    X(OBX_ENOROUTE, 4, 0, "no route for event type")                                               \
    X(OBX_EURL, 5, 0, "malformed URL")                                                             \
    X(OBX_ESTORE, 6, 0, "outbox store error")                                                      \
    X(OBX_EBROKER, 7, 1, "broker error")                                                           \
    X(OBX_ESTALE, 8, 0, "stale claim generation or expired lease (fenced)")                        \
    X(OBX_ECONFLICT, 9, 1, "compare-and-set lost to a concurrent change")                          \
    X(OBX_ENOTFOUND, 10, 0, "not found")                                                           \
    X(OBX_ESCHEMA, 11, 0, "schema version not supported")                                          \
    X(OBX_EIMMUTABLE, 12, 0, "frozen envelope or destination cannot change")                       \
    X(OBX_EREFUSED, 13, 0, "refused by a protocol guard")                                          \
    X(OBX_EQUARANTINE, 14, 0, "receipt quarantined")                                               \
    X(OBX_EUNKNOWN, 15, 0, "outcome unknown (the operation may or may not have taken effect)")     \
    X(OBX_EBUSY, 16, 1, "database busy or locked")                                                 \
    X(OBX_ECONFIG, 17, 0, "configuration error")                                                   \
    X(OBX_EIO, 18, 1, "I/O error")                                                                 \
    X(OBX_EUNSUPPORTED, 19, 0, "not supported by this backend")                                    \
    X(OBX_EINTERNAL, 20, 0, "internal error")                                                      \
    X(OBX_EHANDLER, 21, 1, "consumer handler failed")                                              \
    X(OBX_ECONTRACT, 22, 0, "event contract (type version) not accepted by consumer")              \
    X(OBX_ETENANT, 23, 0, "event tenant not accepted by consumer")                                 \
    X(OBX_ECONNLOST, 24, 1, "connection lost")                                                     \
    X(OBX_EFINDINGS, 25, 0, "audit has findings")                                                  \
    X(OBX_EINVARIANT, 26, 0, "an invariant does not hold")                                         \
    X(OBX_ESTOPPED, 27, 0, "stopped by request")                                                   \
    X(OBX_EPOISON, 28, 0, "message refused for good by the consumer's handler (poison)")           \
    X(OBX_ENODB, 29, 1, "no such database")                                                        \
    X(OBX_EDENIED, 30, 0, "permission denied to this database role")

typedef enum obx_err {
#define OBX__ENUM(name, num, retr, msg) name = num,
    OBX_ERROR_LIST(OBX__ENUM)
#undef OBX__ENUM
} obx_err;

/* Static description of a code ("invalid argument"). Never NULL. */
OBX_API const char *obx_strerror(obx_err e);
/* Symbolic name of a code ("OBX_EINVAL"). Never NULL. */
OBX_API const char *obx_errname(obx_err e);
/* The version of the library running ("0.1.0"): with a shared libobx it may be newer than the
 * OBX_VERSION_STRING the program was compiled with. Static storage, never NULL; any thread. */
OBX_API const char *obx_libversion(void);
/* 1 when repeating the same call later may succeed (busy database, lost connection). */
OBX_API int obx_err_is_retriable(obx_err e);
/* Detail message of the last failing obx_ call on this thread, e.g.
 * "tenant: 'a b' has a character outside [A-Za-z0-9._-] (at byte 1)". Owned by the library,
 * valid until the next obx_ call on this thread. Never NULL (empty when nothing failed). */
OBX_API const char *obx_errmsg(void);

/* Sets the detail message obx_errmsg() returns on this thread (msg NULL: the code's static
 * description) and returns e. For an inbox handler that fails: the inbox records this message
 * with the failure, in the consume audit and the poison row. msg is copied (at most 1023
 * bytes). */
OBX_API obx_err obx_error_set(obx_err e, const char *msg);

/* Frees memory the library handed to the caller (char ** out-parameters). NULL is harmless. */
OBX_API void obx_free(void *p);

/* Lines the library writes that no call returns: librdkafka's own log lines, the PostgreSQL
 * server's notices and warnings on obx's connections, warnings such as a consumed topic that
 * does not exist. Without a handler each is one text line on stderr; with one, they go to it
 * (from any thread, at the same time: it must be thread-safe). Set it before opening anything;
 * NULL restores the default. The relay sets its own (log.format) when it starts. */
#define OBX_LOG_DEBUG 0
#define OBX_LOG_INFO 1
#define OBX_LOG_WARN 2
#define OBX_LOG_ERROR 3
typedef void (*obx_log_fn)(int level, const char *component, const char *message, void *user);
OBX_API void obx_log_set(obx_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * Limits (the documented input set; see README "Input limits").
 * ------------------------------------------------------------------------------------------- */
#define OBX_EVENT_ID_LEN 30 /* "evt-" + 26-character ULID */
#define OBX_DIGEST_LEN 71   /* "sha256:" + 64 lowercase hex */
#define OBX_NAME_MAX 128    /* tenant, aggregate type, cluster, serializer, ... */
#define OBX_TOPIC_MAX 249   /* Kafka's own topic name limit */
#define OBX_KEY_MAX 255     /* aggregate id, routing key, idempotency key */
#define OBX_TEXT_MAX 255    /* correlation id, causation id, owner, reason */
#define OBX_TRACEPARENT_LEN 55
#define OBX_PAYLOAD_DEFAULT_LIMIT (1024 * 1024)
#define OBX_SET_MAX 8 /* destinations of one delivery set, the route's own included */
/* A delayed event's not_before is at most this far after its enqueue (366 days, in ms). */
#define OBX_DELAY_MAX_MS (366LL * 24 * 3600 * 1000)

/* ---------------------------------------------------------------------------------------------
 * Event identities and digests (pure; no I/O).
 * ------------------------------------------------------------------------------------------- */

/* Writes a new "evt-<ULID>" and its NUL into out (OBX_EVENT_ID_LEN + 1 bytes). IDs from one
 * process are strictly increasing, also within one millisecond. now_ms is the wall clock in
 * milliseconds since the epoch (pass 0 to read the system clock). */
OBX_API obx_err obx_event_id_new(int64_t now_ms, char out[OBX_EVENT_ID_LEN + 1]);
/* OBX_OK when s is a well-formed event ID. */
OBX_API obx_err obx_event_id_check(const char *s);
/* "sha256:<hex>" of the bytes; out has OBX_DIGEST_LEN + 1 bytes. */
OBX_API obx_err obx_sha256_digest(const void *data, size_t len, char out[OBX_DIGEST_LEN + 1]);

/* ---------------------------------------------------------------------------------------------
 * Store: the outbox database. URLs: "sqlite:PATH" (":memory:" allowed), "postgres://..." or
 * "postgresql://...".
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_store obx_store;

/* Opens a store connection owned by the handle. *out is set only on success and is closed with
 * obx_store_close(). The schema is not created: see obx_store_init(). A SQLite file that does
 * not exist is created. */
OBX_API obx_err obx_store_open(const char *url, obx_store **out);
/* Flags of obx_store_open_with(). */
#define OBX_STORE_READ_ONLY                                                                        \
    1u /* for a tool that only reads (obx report, status, inspect, ...):                           \
          nothing is ever created or written. SQLite: a missing file is                            \
          OBX_ENODB; a file the user may not write is read, a WAL                                  \
          database too (immutable when its folder cannot be written and                            \
          it has no -wal file); transactions are read transactions.                                \
          PostgreSQL: a read-only session. */
/* obx_store_open() with flags (0: the same as obx_store_open). */
OBX_API obx_err obx_store_open_with(const char *url, unsigned flags, obx_store **out);
/* Wraps a caller's open SQLite connection (struct sqlite3 *). The caller keeps ownership of db
 * and must keep it open until obx_store_close() on the wrapper; closing the wrapper does not
 * close db. Used by producers to enqueue inside their own transactions. */
OBX_API obx_err obx_store_wrap_sqlite(void *sqlite3_db, obx_store **out);
/* Wraps a caller's libpq connection (PGconn *), with the same ownership rule as above. Keep
 * one wrapper for the connection's life: it remembers the routes it read, and an enqueue of a
 * type it knows takes one round trip instead of four (docs/postgres.md). */
OBX_API obx_err obx_store_wrap_pg(void *pg_conn, obx_store **out);
OBX_API void obx_store_close(obx_store *s);

/* Applies versioned schema migrations up to the version this library knows. Idempotent.
 * Refuses with OBX_ESCHEMA when the database carries a newer schema than this library. */
OBX_API obx_err obx_store_init(obx_store *s);
/* Schema version found in the database (0 when not initialized) and the one this library
 * knows. Either pointer may be NULL. */
OBX_API obx_err obx_store_schema_version(obx_store *s, int *found, int *known);
/* Payload size limit for enqueue on this handle (default OBX_PAYLOAD_DEFAULT_LIMIT). */
OBX_API obx_err obx_store_set_payload_limit(obx_store *s, size_t limit);
/* The store's URL with any password replaced by "***". Owned by the handle. */
OBX_API const char *obx_store_url(const obx_store *s);
/* One line for operators on how the SQL producer function obx.enqueue() runs in this database,
 * into buf (cap bytes, NUL-terminated, cut to fit): PostgreSQL: in C (the obx_pg extension and
 * its version) or its PL/pgSQL body and why (docs/postgres.md, "The obx_pg extension"); empty
 * for a store without one (SQLite). `obx init` prints it. */
OBX_API obx_err obx_store_producer_body(obx_store *s, char *buf, size_t cap);
/* Creates (or, when they exist, grants again) four least-privilege database roles on an
 * initialized PostgreSQL store: <prefix>_producer (may only enqueue through the SQL function
 * obx.enqueue() and read its own events), <prefix>_relay (moves event states, never rewrites an
 * envelope), <prefix>_auditor (reads) and <prefix>_consumer (the inbox rows of the consumer IDs
 * and tenants obx.obx_consumer_grant gives its login role: row-level security, enabled by this
 * call). They are NOLOGIN groups: grant them to login roles.
 * prefix: [a-z][a-z0-9_]{0,39}. Needs the CREATEROLE privilege. OBX_EUNSUPPORTED on SQLite. */
OBX_API obx_err obx_store_create_roles(obx_store *s, const char *prefix);

/* ---------------------------------------------------------------------------------------------
 * Route policy. Every obx_route_set() creates a new route policy generation; events enqueued
 * afterwards freeze it, events already enqueued keep the destination they froze.
 * ------------------------------------------------------------------------------------------- */

/* A further destination of a delivery set (docs/migration.md): when the business needs the
 * event on several targets, each target is frozen with its own digest and has its own
 * attempts and publish slot; consumers see the same event ID on every target. NULL fields
 * take the route's value. */
typedef struct obx_route_target {
    const char *cluster; /* required */
    const char *topic;   /* required; (cluster, topic) differs from every other target's */
    const char *routing_key;
    const char *algorithm;
    const char *serializer;
    const char *durability;
    const char *required_acks;
} obx_route_target;

/* ---------------------------------------------------------------------------------------------
 * Payload encryption (docs/security.md, "Payload encryption"). A key ring holds named AES-256
 * keys; a route with `encrypt` = KEY_ID has the relay seal every payload of the events it froze
 * with AES-256-GCM under that key before the send, and consumers open it before the handler.
 * Rotation adds a key to the ring and points new route generations at it; the old key stays in
 * the ring while events sealed under it may still be read.
 * ------------------------------------------------------------------------------------------- */
#define OBX_KEY_ID_MAX 64
typedef struct obx_keyring obx_keyring;
/* Opens a key ring from `spec`: the ring's text itself, or (the usual form) a secret reference
 * that holds it, `${file:/etc/obx/keys}` or `${OBX_KEYS}` (docs/security.md). The text is
 * "KEY_ID=HEX64" entries, one a line (or separated by ',' or ';'), '#' starting a comment.
 * Messages name key IDs and the reference, never key bytes. *out is the caller's
 * (obx_keyring_close, which wipes it; NULL is harmless). */
OBX_API obx_err obx_keyring_open(const char *spec, obx_keyring **out);
OBX_API void obx_keyring_close(obx_keyring *ring);
/* The number of keys in the ring (0 for NULL). */
OBX_API size_t obx_keyring_count(const obx_keyring *ring);

typedef struct obx_route {
    const char *event_type;    /* required: the event type this route applies to */
    const char *cluster;       /* required: broker cluster identity, e.g. "local", "kafka-prod" */
    const char *topic;         /* required: topic (Kafka) or exchange (AMQP) */
    const char *routing_key;   /* template; NULL = "{tenant}.{aggregate_type}.{aggregate_id}".
                                  Placeholders: {tenant} {aggregate_type} {aggregate_id}
                                  {event_type} */
    const char *algorithm;     /* partition algorithm: NULL = "murmur2" (Kafka default) */
    const char *serializer;    /* NULL = "raw" */
    const char *durability;    /* NULL = "persistent" */
    const char *required_acks; /* NULL = "all" */
    int max_attempts;          /* definite rejections before PARKED; 0 = 8 */
    /* The UNKNOWN policy, frozen with every event (docs/design.md, "Reconciliation and UNKNOWN
     * outcomes"): what the reconciler does when nothing can prove an UNKNOWN outcome either way
     * once the attempts' quiet time has passed. NULL or "retry" (the default): a new attempt to
     * the same frozen destination (consumers dedupe on (consumer, event) through the inbox).
     * "hold": the event is held for an operator (`obx resolve`), for routes whose consumers
     * cannot dedupe.
     * An authoritative NOT_FOUND always retries, a FOUND or a critical consumer's evidence
     * always publishes. */
    const char *on_unknown;
    int blind_retry;   /* kept for older callers: 1 = on_unknown "retry" (the default now) */
    int unordered;     /* do not hold back events behind an unpublished same key */
    const char *alias; /* dispatcher alias that owns this type; NULL = "obx" */
    /* Delivery set: further destinations (at most OBX_SET_MAX - 1), a contract frozen with each
     * event at enqueue; n_targets 0 = a single destination. */
    const obx_route_target *targets;
    size_t n_targets;
    const char *completion; /* when the event counts as delivered: "all" (NULL) or "any" */
    /* NULL or "": payloads travel as committed. A key ID: the relay seals each payload of the
     * events this generation routes with that key (AES-256-GCM) before the send; frozen with
     * the generation (docs/security.md, "Payload encryption"). */
    const char *encrypt;
} obx_route;

/* Creates a new generation for route->event_type. *out_gen (may be NULL) gets it. */
OBX_API obx_err obx_route_set(obx_store *s, const obx_route *route, int64_t *out_gen);
/* All current routes (latest generation per event type) as a JSON array; *out_json is the
 * caller's (obx_free). With all_generations != 0, every generation is listed. */
OBX_API obx_err obx_route_list(obx_store *s, int all_generations, char **out_json);
/* When a relay last said it serves `cluster` (its registration or heartbeat, epoch ms) into
 * *out_ms; 0 when no relay has ever served it: events routed there stay PENDING until one does
 * (`obx route set` warns; docs/operations.md, "Clusters nobody serves"). */
OBX_API obx_err obx_cluster_seen(obx_store *s, const char *cluster, int64_t *out_ms);

/* ---------------------------------------------------------------------------------------------
 * Enqueue (producer side). Runs inside the caller's open transaction on a wrapped connection
 * (or in its own transaction on a handle from obx_store_open, or on a wrapped connection with
 * none open). Either the PENDING envelope with its frozen destination is inserted completely or
 * nothing is. A failure obx can name (bad input, no route, a taken idempotency key, a lock
 * timeout or deadlock on the order-key lock) leaves the caller's transaction usable: a savepoint
 * undoes the partial insert. On PostgreSQL an event without an idempotency key whose route the
 * handle knows is written by one statement of the caller's transaction, without a savepoint
 * (docs/postgres.md, "Round trips"): a server fault in it (disk full, a cancelled statement, a
 * session reset by DISCARD ALL) fails the caller's transaction, as a failure of one of its own
 * statements would, and the caller rolls back. In its own transaction, OBX_EUNKNOWN means the
 * connection broke while it committed: the event may or may not be stored (an idempotency key
 * makes the retry safe).
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_event {
    const char *event_type;     /* required, versioned: "order.created.v2" */
    const char *aggregate_type; /* required */
    const char *aggregate_id;   /* required */
    int64_t aggregate_version;  /* required, >= 0 */
    const char *tenant;         /* required */
    const void *payload;        /* required bytes, 1..payload limit */
    size_t payload_len;
    const char *payload_schema;  /* "sha256:<64 hex>"; NULL = digest of "schema:" + event_type */
    const char *correlation_id;  /* optional */
    const char *causation_id;    /* optional */
    const char *traceparent;     /* optional, W3C "00-<32 hex>-<16 hex>-<2 hex>" */
    const char *idempotency_key; /* optional, unique per tenant */
    const char *txid;            /* optional creating-transaction identity where the store cannot
                                    read one (SQLite); PostgreSQL uses its own xid */
    int64_t occurred_at_ms;      /* 0 = now */
    /* A delayed event (docs/operations.md, "Delayed events"): not published before this time,
     * ms since the epoch, UTC; 0 = as soon as possible. At most OBX_DELAY_MAX_MS after now (a
     * time in the past means now). Frozen with the envelope (and in its digest, only when set).
     * A later event of the same order key waits behind it unless its route is unordered. */
    int64_t not_before_ms;
} obx_event;

typedef struct obx_enqueue_result {
    char event_id[OBX_EVENT_ID_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1]; /* with a delivery set: target 1's (obx_inspect: all) */
    char payload_digest[OBX_DIGEST_LEN + 1];
    int64_t route_gen;
    int existing; /* 1: the idempotency key was seen before; event_id is the first event's */
} obx_enqueue_result;

OBX_API obx_err obx_enqueue(obx_store *s, const obx_event *ev, obx_enqueue_result *out);

/* ---------------------------------------------------------------------------------------------
 * Inspection. JSON documents are the caller's (obx_free).
 * ------------------------------------------------------------------------------------------- */
/* Envelope, destination, digests, state, attempts, receipts and audit rows of one event (or of
 * one publish slot of a delivery set), its delivery set (targets, their states, whether it
 * counts as delivered) and the evidence of its migration receipts. */
OBX_API obx_err obx_inspect(obx_store *s, const char *event_id, char **out_json);

/* ---------------------------------------------------------------------------------------------
 * Operator actions.
 * ------------------------------------------------------------------------------------------- */
/* PARKED -> PENDING (rejection count reset). who names the operator in the audit row (NULL =
 * "operator"). OBX_EREFUSED when the event is not PARKED. */
OBX_API obx_err obx_requeue(obx_store *s, const char *event_id, const char *who);
/* A delayed event (not_before set) that no relay has claimed yet: PENDING -> CANCELLED, a final
 * state (never sent, counted, kept like a published event), with an audit row naming who and
 * why, in one transaction. who and reason are required (reason at most OBX_TEXT_MAX bytes).
 * OBX_EREFUSED when the event is not PENDING (claimed, sent or cancelled already), was never
 * delayed, or is a publish slot of a delivery set; OBX_ENOTFOUND when no such event exists. A
 * later event of the same order key no longer waits for it. */
OBX_API obx_err obx_cancel(obx_store *s, const char *event_id, const char *who, const char *reason);

/* Whole-outbox report as JSON: counts by state, receipts by kind, UNKNOWN resolution times
 * (count, p50, p99, max in ms), oldest PENDING, delivery sets (how many, how many complete),
 * and invariant checks (every PUBLISHED event has exactly one primary receipt, none has two).
 * Counts by state count publish slots: an event with a delivery set has one per target.
 * *out_json is the caller's (obx_free). */
OBX_API obx_err obx_report(obx_store *s, char **out_json);

/* ---------------------------------------------------------------------------------------------
 * Destination migration (docs/migration.md, docs/migration.md). An undelivered event moves to a new
 * destination only with proof that the old target did not accept it: never sent, a definite
 * rejection, or an authoritative NOT_FOUND (looked up now for attempts still UNKNOWN, through
 * broker_url, which must be connected to the old target's cluster). The move is a new envelope
 * generation with the new frozen destination and a MIGRATION receipt (old and new digests, the
 * proof, who, when); the original envelope is never edited, and a receipt that later arrives
 * for the old generation is quarantined. An event with an attempt SENDING or UNKNOWN whose
 * absence cannot be proven, a CLAIMED, DISPATCH_UNKNOWN or RECONCILING event (the reconciler
 * resolves those first) and a delivered one are refused, naming the blocking attempt or claim.
 *
 * With add_target, the destination is added to each event as a further delivery-set target (a
 * new publish slot), with the proof that the new target does not hold the event (an
 * authoritative NOT_FOUND there: broker_url must be connected to its cluster) and a receipt.
 *
 * Each event is its own transaction; with a new route (route), the route generation and every
 * event's change are one transaction, written only when at least one event changes (a store
 * failure writes nothing, the route included). dry_run writes nothing, routes included. *out_json
 * (set whenever the call got as far as deciding) lists every event with its outcome, proof or
 * reason, and the route ("route": its generation and whether it was written). OBX_OK: all selected
 * events migrated (or, with dry_run, would be); OBX_EREFUSED: at least one was refused,
 * obx_errmsg() names the first blocking attempt. Bad input is an error naming the field, with
 * nothing stored.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_migrate_request {
    const char *const *event_ids; /* these events (or delivery-set slots), or a selector: */
    size_t n_event_ids;
    const char *event_type; /* selector: this type (NULL = any) */
    const char *cluster;    /* selector: current frozen cluster (NULL = any) */
    const char *topic;      /* selector: current frozen topic (NULL = any) */
    const char *state;      /* selector: current state (NULL = any undelivered state) */
    size_t limit;           /* selector: at most this many events (0 = 1000, at most 100000) */
    int64_t route_gen;      /* destination: this route generation of the event's type (0 = the
                               type's current one; set a new route first to move elsewhere) */
    int add_target;         /* add the destination as a delivery-set target instead */
    int target;             /* add_target: the generation's target number (0 = the first one the
                               event does not have yet; 1 = the route's own destination) */
    const char *completion; /* add_target to an event without a set: "all" (NULL) or "any" */
    const char *who;        /* operator in receipts and audit rows (NULL = "operator") */
    const char *reason;     /* why, recorded with the receipt (may be NULL) */
    int dry_run;            /* decide and report, change nothing */
    const obx_route *route; /* a new route generation for event_type (NULL = none; no delivery
                               set), the destination: written in the same transaction as the
                               events' changes, not at all when none changes or with dry_run */
} obx_migrate_request;

OBX_API obx_err obx_migrate(obx_store *s, const char *broker_url, const char *const *broker_props,
                            size_t n_props, const obx_migrate_request *req, char **out_json);

/* ---------------------------------------------------------------------------------------------
 * Operator resolution of UNKNOWN outcomes (docs/operations.md, "Held UNKNOWN events").
 *
 * For events in DISPATCH_UNKNOWN — held for an operator or not — chosen by ID or by a selector,
 * always with who and why (audited):
 *   action "retry"   a new attempt to the event's frozen destination and pinned partition: the
 *                    event is handed to the reconciler (RETRY_CLAIMED with an expired lease),
 *                    whose next step sends it. No destination can be named: moving an event is
 *                    obx_migrate's, which refuses while its outcome is UNKNOWN.
 *   action "accept"  evidence that the broker has the message, through the single acceptance
 *                    point: what the operator found at the broker (topic, partition, offset and
 *                    the payload digest the message carries; one event ID), or a critical
 *                    consumer's consume receipt (consumer "ID=URL"). Evidence naming another
 *                    topic, partition, payload digest or attempt is refused, nothing changed.
 * Events in other states are refused, each with its reason. Each event is its own
 * transaction. *out_json (the caller's, obx_free) lists every event's result; *n_refused (may
 * be NULL) counts the refused ones. Bad input is an error naming the field, nothing changed.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_resolve_request {
    const char *const *event_ids; /* these events (or delivery-set slots), or a selector: */
    size_t n_event_ids;
    const char *event_type; /* selector: this type */
    int held;               /* selector: only events held for an operator */
    int64_t older_than_ms;  /* selector: UNKNOWN for at least this long (0 = any) */
    const char *action;     /* "retry" or "accept" (required) */
    /* accept, evidence found at the broker: */
    const char *topic; /* NULL = the frozen topic */
    int has_partition; /* 0 = the pinned partition; 1 = partition below */
    int32_t partition;
    int64_t offset;             /* the message's offset (>= 0) */
    const char *payload_digest; /* the obx-payload-digest the message carries */
    const char *attempt_id;     /* its obx-attempt-id (NULL = the newest outstanding attempt) */
    /* accept, evidence from a consumer's inbox instead: "ID=URL" */
    const char *consumer;
    const char *who;    /* required */
    const char *reason; /* required */
    int dry_run;        /* decide and report, change nothing */
    /* accept, evidence found at the broker: the broker of the event's cluster, where the named
     * offset is read and its body hashed (what does not match is refused). Required when that
     * cluster can be asked (an authoritative lookup, or no relay registered it); where it
     * cannot, the acceptance is an operator assertion (receipt source "asserted"), counted and
     * reported by obx audit until a critical consumer's receipt confirms it. */
    const char *broker_url;
    const char *const *broker_props; /* "key=value"; may be NULL */
    size_t n_broker_props;
    /* the declared critical consumers ("ID=URL", audit.critical_consumers): `consumer` must be
     * one of them, ID and URL alike */
    const char *const *critical_consumers;
    size_t n_critical_consumers;
} obx_resolve_request;

OBX_API obx_err obx_resolve(obx_store *s, const obx_resolve_request *req, char **out_json,
                            size_t *n_refused);

/* ---------------------------------------------------------------------------------------------
 * Shadow mode and scoped takeover (the rollout of docs/migration.md: shadow first, then take
 * over a small share of low-risk event types; rollback switches the dispatcher alias back).
 * ------------------------------------------------------------------------------------------- */

/* Computes what obx would send for the events the given dispatcher aliases (or event types)
 * own — destination, partition, key, digests — and compares it with what was actually
 * published, as seen on the broker (its topics read through a consumer group of its own that
 * never commits) or in a receipts feed file (JSON lines). Claims nothing, sends nothing,
 * writes nothing. The JSON report counts and lists: events missing on the broker (older than
 * the grace time), published to another destination or partition, with another payload
 * digest, and event IDs on the broker the outbox does not know. OBX_EFINDINGS when there is
 * any difference (the report is set too). */
typedef struct obx_shadow_request {
    const char *const *aliases; /* shadowed dispatcher aliases (NULL = any) */
    size_t n_aliases;
    const char *const *event_types; /* shadowed event types (NULL = any) */
    size_t n_event_types;
    const char *const *topics; /* also observe these topics (to see misrouted publications) */
    size_t n_topics;
    const char *feed_path; /* a receipts feed instead of the broker (NULL = the broker) */
    int64_t since_ms;      /* events committed at or after (0 = the last hour) */
    int64_t grace_ms;      /* younger events are not missing yet (0 = 60000; -1 = none) */
    size_t limit;          /* events compared at most (0 = 100000) */
} obx_shadow_request;

OBX_API obx_err obx_shadow(obx_store *s, const char *broker_url, const char *const *broker_props,
                           size_t n_props, const obx_shadow_request *req, char **out_json);

/* Hands event types to dispatcher alias `to_alias` — a new route generation per type with the
 * same destination and delivery set — so that only relays serving that alias dispatch events
 * enqueued from now on. With backlog, unclaimed events of those types (PENDING or PARKED:
 * nothing in flight) move to the new owner too. Events already sent keep their attempts and
 * slots and keep being reconciled, whoever owns the type: rollback is the same call back to the
 * old alias, and never makes anything publish blindly. *out_json lists the types and counts. */
typedef struct obx_takeover_request {
    const char *to_alias;           /* required */
    const char *const *event_types; /* these types, or: */
    size_t n_event_types;
    const char *from_alias; /* the types this alias owns now ... */
    int percent;            /* ... this share of them (1..100; 0 = all), chosen stably: a larger
                               share includes every type a smaller one chose */
    int backlog;
    const char *who; /* NULL = "operator" */
    int dry_run;
} obx_takeover_request;

OBX_API obx_err obx_takeover(obx_store *s, const obx_takeover_request *req, char **out_json);

/* ---------------------------------------------------------------------------------------------
 * Operations: what `obx status`, `obx trace` and the relay's dashboard show.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_ops_options {
    /* Critical consumers as "ID=URL" (their inbox databases): their consume receipts, consume
     * audit, watermarks and poison messages join the documents. NULL = none. */
    const char *const *consumers;
    size_t n_consumers;
    size_t limit; /* status: rows per list; trace: events per correlation ID. 0 = 50 */
} obx_ops_options;

/* The outbox at a glance as JSON, cheap on a big outbox (bounded, indexed reads): counts by
 * state, the oldest PENDING and UNKNOWN ages, receipts by kind, the UNKNOWN events with their
 * attempts, the PARKED events with the broker's last words, the quarantined receipts, and per
 * critical consumer its lag, watermarks and poison messages. o may be NULL. */
OBX_API obx_err obx_status(obx_store *s, const obx_ops_options *o, char **out_json);

/* The whole flow of one event (event_id) and/or of every event carrying correlation_id, as
 * JSON: the frozen envelope and destination (the producer's commit: txid, idempotency key,
 * causation), attempts, receipts, audit rows, and each critical consumer's consume receipt,
 * consume audit and poison state. OBX_ENOTFOUND when nothing matches. */
OBX_API obx_err obx_trace(obx_store *s, const char *event_id, const char *correlation_id,
                          const obx_ops_options *o, char **out_json);

/* ---------------------------------------------------------------------------------------------
 * Topic catalog (docs/operations.md): a YAML file of versioned topics, each with its owner,
 * event types and subscribers, checked against the route policy and the consumers' runtime
 * subscriptions.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_catalog_check_options {
    const char *catalog_path;   /* required */
    obx_store *routes;          /* the outbox whose current routes to compare; NULL = skip */
    const char *consumers_path; /* YAML "consumers: [{id, topics, event_types}]"; NULL = none */
    const char *const *subscriptions; /* more, as "CONSUMER=TOPIC[,TOPIC...]" */
    size_t n_subscriptions;
    const char *const *consumer_dbs; /* "ID=URL": topics the consumer consumed (watermarks) */
    size_t n_consumer_dbs;
} obx_catalog_check_options;

/* Reports, as JSON {"findings": [{"kind", "subject", "detail", "suggestion"?, "line"?}], ...},
 * every disagreement: topics nobody consumes, subscriptions to undeclared topics, routes of
 * undeclared types or to another topic, subscriber lists that differ from the runtime,
 * unversioned or ownerless topics, and spelling or version drift (a name one edit, a case or
 * separator change, or a version away from a declared one, with the suggestion).
 * *n_findings (may be NULL) counts them. OBX_ECONFIG names file and line of a malformed file. */
OBX_API obx_err obx_catalog_check(const obx_catalog_check_options *o, char **out_json,
                                  size_t *n_findings);

/* ---------------------------------------------------------------------------------------------
 * Inbox (consumer side, docs/design.md, "Consumers and the inbox"). Runs inside the consumer's
 * own database: the consume receipt (unique per consumer and event), the handler's effect and the
 * consumer watermark commit together; only then may the caller acknowledge the broker position.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_inbox obx_inbox;

/* A delivered message as the handler sees it. All pointers are borrowed for the call. */
typedef struct obx_message {
    const char *event_id;
    int envelope_gen;
    const char *event_type;
    const char *tenant;
    const char *aggregate_type;
    const char *aggregate_id;
    int64_t aggregate_version;
    const char *correlation_id;
    const char *causation_id;
    const char *traceparent;
    int64_t occurred_at;
    const char *payload_digest; /* as carried by the message; checked against the payload */
    const void *payload;
    size_t payload_len;
    const char *topic;
    int32_t partition;
    int64_t offset;
    int redelivered;
    const char *header_error; /* non-NULL/non-empty: the message's headers were malformed */
    /* The attempt and frozen destination digest the message carries (obx-attempt-id,
     * obx-dest-digest). May be NULL. Kept in the consume receipt: with them (and
     * envelope_gen) a critical consumer's receipt proves to the reconciler that the broker
     * accepted the message (docs/design.md, "Reconciliation and UNKNOWN outcomes", consumer
     * evidence). */
    const char *attempt_id;
    const char *dest_digest;
    /* The key ID of a sealed body (obx-encryption header; NULL or "" = clear). The inbox opens
     * the body with obx_inbox_options.keys before anything else: the handler sees the clear
     * payload; a body that does not open is quarantined (docs/security.md). */
    const char *encryption;
} obx_message;

/* Applies the effect using db (the consumer's connection given to obx_inbox_open: a sqlite3 *
 * or PGconn *) inside the inbox's transaction. Writes a short human result (may be empty) into
 * result. Return OBX_OK to commit, anything else to roll back (the message is retried, then
 * parked as poison after max_failures); OBX_EPOISON rolls back and parks it at once (the
 * handler knows no retry can succeed). effect_key is stable for (consumer, event): use it as
 * the idempotency key of external calls (payments, e-mail), with obx_inbox_effect_key() for
 * several effects per event. */
typedef obx_err (*obx_inbox_handler)(void *user, void *db, const obx_message *m,
                                     const char *effect_key, char *result, size_t result_cap);

typedef struct obx_inbox_options {
    const char *consumer_id;        /* required, [A-Za-z0-9._-] */
    const char *const *event_types; /* accepted contracts, exact versioned names; NULL = any */
    size_t n_event_types;
    const char *const *tenants; /* accepted tenants; NULL = any */
    size_t n_tenants;
    int max_failures; /* handler failures before parking as poison; 0 = 5 */
    /* The key ring sealed messages are opened with (borrowed: close it after the inbox). NULL:
     * none, a sealed message is parked until a ring with its key re-drives it. */
    const obx_keyring *keys;
    /* Retry back-off after a handler failure, in milliseconds: the n-th retry is due
     * retry_backoff_ms * 2^(n-1) after the failure, at most retry_backoff_max_ms, +-20 % jitter.
     * The due time is kept in the failure row (durable); a delivery before it is not run
     * (OBX_INBOX_DELAYED). 0 = 1000 and 300000; retry_backoff_ms -1 = no back-off (retried as
     * soon as it comes again). Range: 1..86400000, max >= base. */
    int64_t retry_backoff_ms;
    int64_t retry_backoff_max_ms;
} obx_inbox_options;

typedef enum obx_inbox_outcome {
    OBX_INBOX_APPLIED = 1,     /* effect applied and committed with its receipt */
    OBX_INBOX_DUPLICATE = 2,   /* seen before: the original receipt, effect not run again */
    OBX_INBOX_QUARANTINED = 3, /* same event ID, different payload digest: not applied */
    OBX_INBOX_FAILED = 4,      /* handler failed; rolled back; retry later (do not ack) */
    OBX_INBOX_POISONED = 5,    /* parked as poison (failures, contract, tenant, bad headers) */
    OBX_INBOX_DELAYED = 6,     /* a failed message whose retry is not due yet (retry_at): the
                                * handler did not run, nothing written; give it back (do not ack) */
} obx_inbox_outcome;

typedef struct obx_inbox_result {
    obx_inbox_outcome outcome;
    int ack;          /* 1: the caller may now acknowledge / commit the broker position */
    int failures;     /* handler failures so far for this event */
    char result[256]; /* the handler's result (the original one for a duplicate) */
    char detail[256]; /* why (quarantine, poison, failure) */
    int64_t retry_at; /* FAILED, DELAYED: when the next try is due (ms since the epoch); else 0 */
} obx_inbox_result;

/* Opens an inbox on the consumer's database handle (not owned; keep it open until close).
 * The obx schema must be initialized there (obx_store_init on a wrapper, or `obx init`). */
OBX_API obx_err obx_inbox_open(obx_store *consumer_db, const obx_inbox_options *opt,
                               obx_inbox **out);
OBX_API void obx_inbox_close(obx_inbox *in);
/* Processes one delivery. db_conn is passed to the handler (the connection behind
 * consumer_db). On OBX_OK, *out says what happened and whether to ack. */
OBX_API obx_err obx_inbox_process(obx_inbox *in, const obx_message *m, obx_inbox_handler h,
                                  void *user, void *db_conn, obx_inbox_result *out);
/* Parked poison messages as a JSON array (consumer NULL = all); the caller frees. */
OBX_API obx_err obx_inbox_poison_list(obx_store *consumer_db, const char *consumer,
                                      char **out_json);
/* Marks a parked poison message for re-drive; the consumer applies it on its next cycle. */
OBX_API obx_err obx_inbox_redrive(obx_store *consumer_db, const char *consumer,
                                  const char *event_id);
/* "fx-" + 64 hex: SHA-256 over (consumer, event_id, effect_name); out has 68 bytes. */
OBX_API obx_err obx_inbox_effect_key(const char *consumer, const char *event_id,
                                     const char *effect_name, char out[68]);

/* ---------------------------------------------------------------------------------------------
 * Consumer test kit: replays a consumer's handler through the inbox against what an
 * at-least-once broker delivers, and reports which cases it mishandles. Every scenario runs in
 * a fresh in-memory SQLite consumer database (the handler's db is a sqlite3 *):
 *   baseline        each sample once, in order: all APPLIED; its state is the reference
 *   duplicate       every message twice, and the first again at the end: same state
 *   lost-commit     the handler runs, the transaction fails before its commit (a crash), the
 *                   message comes again: same state (catches effects outside the consumer's
 *                   transaction and in-process dedupe sets)
 *   reordering      reverse order, failed ones redelivered after the rest: same state, none
 *                   parked
 *   older-contract  the previous contract version: APPLIED if declared, else parked, no effect
 *   foreign-tenant  a tenant the consumer does not serve: parked as poison, no effect
 *   poison          an unprocessable payload between valid ones: parked after max_failures, no
 *                   effect, the valid ones after it applied
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_consumer_test {
    const char *consumer_id; /* NULL = "consumer-under-test" */
    obx_inbox_handler handler;
    void *user;
    /* what the consumer declares, as in its obx_inbox_options (NULL = any) */
    const char *const *event_types;
    size_t n_event_types;
    const char *const *tenants;
    size_t n_tenants;
    int max_failures; /* 0 = 5; at least 2 (the simulated crash counts as one failure) */
    /* Creates the consumer's own tables in the fresh database (db: sqlite3 *). May be NULL. */
    obx_err (*setup)(void *user, void *db);
    /* The consumer's observable state as canonical text in *out (malloc'ed; the kit frees it):
     * its tables and every effect it makes outside them (e-mails sent, calls made). NULL =
     * every table of db whose name does not start with obx_ (then keep clocks and random
     * values out of your tables, or provide this hook). */
    obx_err (*snapshot)(void *user, void *db, char **out);
    /* Forgets effects outside the database before each scenario. May be NULL. */
    void (*reset)(void *user);
    /* Deliveries of one aggregate in commit order (aggregate_version increasing, type
     * versioned, payloads the handler accepts; event_id, payload_digest, topic may be left
     * NULL). At least 2. NULL = three generated JSON order events ({"order","version",
     * "total"}) of the first declared type and tenant. */
    const obx_message *samples;
    size_t n_samples;
    const void *poison_payload; /* bytes the handler cannot process; NULL = malformed JSON */
    size_t poison_len;
} obx_consumer_test;

/* Runs every scenario. *out_json: {"consumer_id", "declared", "scenarios": [{"scenario",
 * "ok", "detail", "fix"}], "mishandled"} ("fix", on a mishandled scenario: what a correct
 * consumer does instead); *mishandled (may be NULL) the count of failed scenarios.
 * OBX_OK when the kit ran (whatever it found); an error when it could not. */
OBX_API obx_err obx_consumer_test_run(const obx_consumer_test *t, char **out_json, int *mishandled);

/* ---------------------------------------------------------------------------------------------
 * Consumer loop: broker deliveries through the inbox, position acknowledged after commit.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_consumer obx_consumer;

typedef struct obx_consumer_options {
    const char *broker_url;          /* required: a broker with a consumer side */
    const char *const *broker_props; /* "key=value" backend properties; may be NULL */
    size_t n_broker_props;
    const char *group;         /* consumer group (Kafka), or NULL = consumer_id */
    const char *const *topics; /* topics (Kafka, log) or queues (AMQP) */
    size_t n_topics;
    obx_inbox_options inbox; /* consumer_id, accepted contracts/tenants, max failures */
    size_t max_batch;        /* deliveries per poll; 0 = 64 */
    /* May be NULL. Asked before each delivery of a poll's batch: nonzero ends the poll there,
     * after the message in hand, and what the batch holds beyond it is neither processed nor
     * acknowledged (it comes again, to this consumer or another). For a stop that must not
     * wait for a whole batch (obx consume's SIGTERM). */
    int (*stop)(void *stop_user);
    void *stop_user;
    /* May be NULL. A span ("process") per delivery through the inbox (borrowed: close it after
     * the consumer). */
    struct obx_otel *otel;
    /* Nonzero: the consumer is unordered (docs/operations.md, "Consumer retries with
     * back-off"). A message whose handler failed does not hold its partition or queue: a copy
     * of it (bytes, headers, position) is kept in the consumer's database, the broker is
     * acknowledged past it, and its retry runs from the copy when due; later messages, of its
     * key too, go on meanwhile. 0 (the default): ordered, a later message of the partition
     * waits behind the one being retried. */
    int unordered;
} obx_consumer_options;

typedef struct obx_consumer_counts {
    long delivered, applied, duplicates, quarantined, failed, poisoned, redriven;
    long delayed; /* deliveries whose retry was not due yet: given back (unordered: absorbed,
                   * their kept copy waits), the handler not run */
    long retried; /* retries run from a kept copy (unordered) */
} obx_consumer_counts;

/* consumer_db wraps the consumer's database (not owned); db_conn is what the handler gets
 * (the sqlite3 * or PGconn * behind it). */
OBX_API obx_err obx_consumer_open(obx_store *consumer_db, void *db_conn,
                                  const obx_consumer_options *opt, obx_inbox_handler h, void *user,
                                  obx_consumer **out);
/* One cycle: re-drives poison messages an operator marked, runs the kept copies whose retry is
 * due (unordered), then polls up to max_batch
 * deliveries (waiting up to timeout_ms), runs each through the inbox and acknowledges it once
 * the inbox says so. Counts are added to *counts (may be NULL). An error of the broker, its
 * connection lost included, is OBX_EBROKER; one of the consumer's database keeps its own code
 * (OBX_ECONNLOST, OBX_ESTORE, ...): a caller can tell which of the two to wait for. */
OBX_API obx_err obx_consumer_poll(obx_consumer *c, int timeout_ms, obx_consumer_counts *counts);
/* When the earliest retry this consumer waits for is due (wall ms): a partition it paused
 * behind a failed message (ordered), a kept copy (unordered), or a failure in its inbox not
 * parked (past due: its message is to come again). *due_ms 0: none. For a caller
 * that stops when idle (obx consume --until-idle): a consumer with a retry pending is not. */
OBX_API obx_err obx_consumer_next_retry(obx_consumer *c, int64_t *due_ms);
OBX_API void obx_consumer_close(obx_consumer *c);

/* ---------------------------------------------------------------------------------------------
 * Configuration (YAML; every key: obx help config, docs/operations.md "Configuration reference")
 * and the relay daemon.
 * ------------------------------------------------------------------------------------------- */
typedef struct obx_config obx_config;

/* Defaults that work: sqlite:obx.db, log:obx-broker.db, 2 dispatchers. */
OBX_API obx_err obx_config_new(obx_config **out);
/* Loads a YAML file over the defaults. Errors name the key and the line. */
OBX_API obx_err obx_config_load(const char *path, obx_config **out);
/* Sets one key by its dotted name ("db", "broker", "relay.dispatchers", ...), as a flag
 * override would; value is parsed like the YAML scalar. */
OBX_API obx_err obx_config_set(obx_config *c, const char *key, const char *value);
/* Effective configuration as JSON (secrets redacted); the caller frees. */
OBX_API obx_err obx_config_dump(const obx_config *c, char **out_json);
/* One key's value as text, secrets included (unlike obx_config_dump: for tools that connect
 * with the configured URLs, never for printing). Lists are joined with '\n'. The caller frees
 * *out_value (obx_free). */
OBX_API obx_err obx_config_get(const obx_config *c, const char *key, char **out_value);
OBX_API void obx_config_free(obx_config *c);
/* The configuration reference, from the one table the parser, the defaults and the dump follow:
 * a JSON array with an object per key in file order, {"key", "type" ("string", "integer",
 * "boolean", "list" or "map"), "default" (as a file would write it; "" when empty), "min" and
 * "max" (integers), "values" (a fixed set, such as "text|json"), "help"}. `man obx` and
 * `obx help config` print it. *out_json is the caller's (obx_free). */
OBX_API obx_err obx_config_reference(char **out_json);

/* ---- OpenTelemetry spans (docs/operations.md, "OpenTelemetry") ----------------------------
 * An exporter sends spans of the life of each event over OTLP/HTTP (JSON) to otel.endpoint, in
 * batches, from a thread of its own: a producer span per obx_enqueue() on a store it is set on
 * (obx_store_set_otel), a span per publish attempt and per reconciliation (the relay opens its
 * own from its configuration), a consumer span per delivery (obx_consumer_options.otel). Every
 * span of an event is in the trace of the event's traceparent (or, without one, in a trace of
 * its own). The callers never wait for the collector: past otel.queue_max spans are dropped and
 * counted. obx.enqueue() (SQL) emits no span. */
typedef struct obx_otel obx_otel;
/* Starts an exporter from c's otel.* keys. OBX_OK with *out NULL when otel.endpoint is empty
 * (spans off); OBX_EUNSUPPORTED when libobx was built without OBX_WITH_OTEL. The caller closes
 * it after everything it was given to (stores, consumers) is closed. */
OBX_API obx_err obx_otel_open(const obx_config *c, obx_otel **out);
/* Sends what is queued (within otel.timeout_ms), stops the thread, frees o. NULL is harmless. */
OBX_API void obx_otel_close(obx_otel *o);
/* Every later obx_enqueue() on s that writes an event emits its producer span ("create") to o
 * (borrowed; NULL: none again). The span is emitted when the enqueue returns, inside the
 * caller's transaction: a transaction rolled back afterwards leaves a span for an event that
 * never committed. */
OBX_API void obx_store_set_otel(obx_store *s, obx_otel *o);

typedef struct obx_relay obx_relay;

/* Starts the relay's threads (dispatchers, reconciler, sweeper; HTTP when configured). The
 * configuration is copied. */
OBX_API obx_err obx_relay_start(const obx_config *c, obx_relay **out);
/* Asks the relay to stop: it stops claiming, drains in-flight ACKs (bounded by
 * relay.drain_ms; obx_relay_stats's "in_flight" counts them) and its threads end. Safe to call from
 * any thread, not from a signal handler. */
OBX_API void obx_relay_stop(obx_relay *r);
/* Waits for the threads; returns the first fatal error, or OBX_OK after a clean stop. */
OBX_API obx_err obx_relay_wait(obx_relay *r);
/* Counters as JSON (claimed, sent, accepted, duplicates, ...); the caller frees. */
OBX_API obx_err obx_relay_stats(obx_relay *r, char **out_json);
OBX_API void obx_relay_close(obx_relay *r);
/* 1 when the relay's threads stopped on their own (a fatal error: see obx_relay_wait), or every
 * one of them has ended after a stop (obx_relay_wait then returns at once). */
OBX_API int obx_relay_stopped(obx_relay *r);
/* 1 when the relay serves: every thread reached the database (with this version's schema) and
 * the broker, and none fails on them now. 0 otherwise, with the reason (one line) in why (cap
 * bytes; may be NULL): while the relay waits for a database or broker that is not there yet or
 * went away (it keeps waiting: connect.retry_initial_ms, connect.retry_max_ms), or stops. Any
 * thread; answers at once. */
OBX_API int obx_relay_ready(obx_relay *r, char *why, size_t cap);
/* Like obx_relay_stop, without the drain: the threads end after their current step, and what
 * is outstanding is left as after a kill (the attempts stay SENDING; another relay's sweeper
 * turns them UNKNOWN when their lease ends, and its reconciler settles them). */
OBX_API void obx_relay_stop_now(obx_relay *r);
/* The wait before try attempt + 1 (attempt 0, 1, 2, ...) of something that failed: initial_ms
 * doubled per attempt up to max_ms, then drawn from the upper half of that (jitter, so that
 * daemons a shared outage stopped do not all come back at the same instant). */
OBX_API int64_t obx_retry_delay_ms(int64_t initial_ms, int64_t max_ms, int attempt);

/* ---------------------------------------------------------------------------------------------
 * The three-set audit and retention (docs/retention.md, docs/retention.md). These read the outbox
 * (`db`), the broker (`broker`) and the critical consumers' inbox databases
 * (`audit.critical_consumers`, each "ID=URL") named by a configuration, with its audit.* and
 * retention.* keys. The configuration is borrowed for the call.
 * ------------------------------------------------------------------------------------------- */
#define OBX_AUDIT_NO_BROKER 1u /* flag: do not open the broker; the bypass check is skipped */

/* Runs the audit now. *out_json (the caller's, obx_free) gets the audit document (schema
 * "obx.audit.v1": findings with their event IDs, counts and ages; every check with its status)
 * on OBX_OK, when there is no finding, and on OBX_EFINDINGS, when there are findings. On any
 * other error *out_json is NULL: an audit that could not see one of the sets vouches for
 * nothing. */
OBX_API obx_err obx_audit(const obx_config *c, unsigned flags, char **out_json);

typedef struct obx_purge_options {
    int dry_run;          /* decide and list, change and lock nothing */
    const char *event_id; /* NULL: every event the evidence allows; else only this one */
    const char *who;      /* the operator named in audit rows ([A-Za-z0-9._:@/-]); NULL =
                             "operator" */
    size_t max_listed;    /* events listed in the JSON (counts are always exact); 0 = 1000 */
} obx_purge_options;

/* Retention: PUBLISHED -> RETAINED once every critical consumer has consumed the event,
 * RETAINED -> PURGED (payload dropped, tombstone kept) once the replay window
 * (retention.replay_window_ms after publication) is over and the event is behind the forced
 * consumer watermark, in transactions of at most retention.batch events, paced to at most
 * retention.max_rate events per second when that is set. *out_json (schema
 * "obx.purge.v1": counts, the watermark, every decision with its reason) is set on OBX_OK and,
 * for one event, on OBX_EREFUSED: that event cannot go now, and obx_errmsg() names every unmet
 * condition (nothing was changed). OBX_ECONFIG when no critical consumer is declared: an ACK
 * alone never purges. */
OBX_API obx_err obx_purge(const obx_config *c, const obx_purge_options *o, char **out_json);

/* Each critical consumer's forced watermark and the current forced consumer watermark (the
 * oldest published event some critical consumer has no evidence for) as JSON. */
OBX_API obx_err obx_watermarks(const obx_config *c, char **out_json);

/* Forces critical consumer `consumer`'s watermark forward to until_ms (ms since the epoch, not in
 * the future): every event published up to then counts as consumed by it — for a consumer that
 * was decommissioned or rebuilt and needs nothing older. Recorded in the consumer's database
 * with who and reason (1..200 bytes of text). OBX_EREFUSED when it would not move forward. */
OBX_API obx_err obx_watermark_force(const obx_config *c, const char *consumer, int64_t until_ms,
                                    const char *who, const char *reason);

/* Appends one item to a list or map key (relay.aliases, audit.critical_consumers,
 * broker_properties) without splitting it at commas, as a repeated command-line flag does. */
OBX_API obx_err obx_config_append(obx_config *c, const char *key, const char *value);

/* Connects to a broker and writes its cluster identity (what routes must name as `cluster`). */
OBX_API obx_err obx_broker_cluster_id(const char *url, const char *const *props, size_t n_props,
                                      char *out, size_t cap);

/* ---------------------------------------------------------------------------------------------
 * URL helpers (pure).
 * ------------------------------------------------------------------------------------------- */
/* Checks a store or broker URL; on error the message names the bad part. kind is "store" or
 * "broker". */
OBX_API obx_err obx_url_check(const char *url, const char *kind);
/* Copy of url with the password replaced by "***"; the caller frees it (obx_free). */
OBX_API obx_err obx_url_redact(const char *url, char **out);

#ifdef __cplusplus
}
#endif
#endif /* OBX_H */

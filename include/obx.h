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

#define OBX_VERSION_MAJOR 0
#define OBX_VERSION_MINOR 1
#define OBX_VERSION_PATCH 0
#define OBX_VERSION_STRING "0.1.0"

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
    X(OBX_ESTOPPED, 27, 0, "stopped by request")

typedef enum obx_err {
#define OBX__ENUM(name, num, retr, msg) name = num,
    OBX_ERROR_LIST(OBX__ENUM)
#undef OBX__ENUM
} obx_err;

/* Static description of a code ("invalid argument"). Never NULL. */
OBX_API const char *obx_strerror(obx_err e);
/* Symbolic name of a code ("OBX_EINVAL"). Never NULL. */
OBX_API const char *obx_errname(obx_err e);
/* 1 when repeating the same call later may succeed (busy database, lost connection). */
OBX_API int obx_err_is_retriable(obx_err e);
/* Detail message of the last failing obx_ call on this thread, e.g.
 * "tenant: 'a b' has a character outside [A-Za-z0-9._-] (at byte 1)". Owned by the library,
 * valid until the next obx_ call on this thread. Never NULL (empty when nothing failed). */
OBX_API const char *obx_errmsg(void);

/* Frees memory the library handed to the caller (char ** out-parameters). NULL is harmless. */
OBX_API void obx_free(void *p);

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
 * obx_store_close(). The schema is not created: see obx_store_init(). */
OBX_API obx_err obx_store_open(const char *url, obx_store **out);
/* Wraps a caller's open SQLite connection (struct sqlite3 *). The caller keeps ownership of db
 * and must keep it open until obx_store_close() on the wrapper; closing the wrapper does not
 * close db. Used by producers to enqueue inside their own transactions. */
OBX_API obx_err obx_store_wrap_sqlite(void *sqlite3_db, obx_store **out);
/* Wraps a caller's libpq connection (PGconn *), with the same ownership rule as above. */
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
/* Creates (or, when they exist, grants again) three least-privilege database roles on an
 * initialized PostgreSQL store: <prefix>_producer (may only enqueue through the SQL function
 * obx.enqueue() and read its own events), <prefix>_relay (moves event states, never rewrites an
 * envelope) and <prefix>_auditor (reads). They are NOLOGIN groups: grant them to login roles.
 * prefix: [a-z][a-z0-9_]{0,39}. Needs the CREATEROLE privilege. OBX_EUNSUPPORTED on SQLite. */
OBX_API obx_err obx_store_create_roles(obx_store *s, const char *prefix);

/* ---------------------------------------------------------------------------------------------
 * Route policy. Every obx_route_set() creates a new route policy generation; events enqueued
 * afterwards freeze it, events already enqueued keep the destination they froze.
 * ------------------------------------------------------------------------------------------- */
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
    int blind_retry;           /* reconciler may retry the same frozen target without lookup */
    int unordered;             /* do not hold back events behind an unpublished same key */
    const char *alias;         /* dispatcher alias that owns this type; NULL = "obx" */
} obx_route;

/* Creates a new generation for route->event_type. *out_gen (may be NULL) gets it. */
OBX_API obx_err obx_route_set(obx_store *s, const obx_route *route, int64_t *out_gen);
/* All current routes (latest generation per event type) as a JSON array; *out_json is the
 * caller's (obx_free). With all_generations != 0, every generation is listed. */
OBX_API obx_err obx_route_list(obx_store *s, int all_generations, char **out_json);

/* ---------------------------------------------------------------------------------------------
 * Enqueue (producer side). Runs inside the caller's open transaction on a wrapped connection
 * (or in its own transaction on a handle from obx_store_open). Either the PENDING envelope with
 * its frozen destination is inserted completely or nothing is (an internal savepoint undoes a
 * partial insert; the caller's transaction stays usable).
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
} obx_event;

typedef struct obx_enqueue_result {
    char event_id[OBX_EVENT_ID_LEN + 1];
    char dest_digest[OBX_DIGEST_LEN + 1];
    char payload_digest[OBX_DIGEST_LEN + 1];
    int64_t route_gen;
    int existing; /* 1: the idempotency key was seen before; event_id is the first event's */
} obx_enqueue_result;

OBX_API obx_err obx_enqueue(obx_store *s, const obx_event *ev, obx_enqueue_result *out);

/* ---------------------------------------------------------------------------------------------
 * Inspection. JSON documents are the caller's (obx_free).
 * ------------------------------------------------------------------------------------------- */
/* Envelope, destination, digests, state, attempts, receipts and audit rows of one event. */
OBX_API obx_err obx_inspect(obx_store *s, const char *event_id, char **out_json);

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

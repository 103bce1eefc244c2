/*
 * core.h — the pure layer of libobx (no I/O): error reporting, byte buffers, the frozen
 * envelope and destination with their canonical encodings and digests, event IDs, input
 * validation, URLs and the state machine's transition table.
 *
 * Internal names are obx__; nothing here is exported from the shared library.
 */
#ifndef OBX_CORE_H
#define OBX_CORE_H

#include "obx.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define OBX__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define OBX__PRINTF(a, b)
#endif

/* ---- errors ------------------------------------------------------------------------------ */

/* Records a detail message for obx_errmsg() on this thread and returns e. */
obx_err obx__fail(obx_err e, const char *fmt, ...) OBX__PRINTF(2, 3);
obx_err obx__failv(obx_err e, const char *fmt, va_list ap);
/* Prefixes the current thread's detail message with "prefix: ". Returns e. */
obx_err obx__fail_prefix(obx_err e, const char *fmt, ...) OBX__PRINTF(2, 3);
/* Clears the detail message (called at the start of public entry points that succeed). */
void obx__clear_error(void);

/* ---- strings and buffers ----------------------------------------------------------------- */

/* Copies at most cap-1 bytes and NUL-terminates. Returns strlen(src). */
size_t obx__strlcpy(char *dst, const char *src, size_t cap);
/* Whether v is one of the comma-separated values of list ("*" in the list: any value). */
bool obx__csv_has(const char *list, const char *v);
/* malloc'ed copy or NULL. */
char *obx__strdup(const char *s);
/* printf into a fresh malloc'ed string; NULL on ENOMEM. */
char *obx__asprintf(const char *fmt, ...) OBX__PRINTF(1, 2);

typedef struct obx__buf {
    unsigned char *data; /* owned; NULL while empty */
    size_t len, cap;
    bool oom; /* sticky: a failed growth; the caller reports OBX_ENOMEM once at the end */
} obx__buf;

void obx__buf_free(obx__buf *b);
void obx__buf_put(obx__buf *b, const void *p, size_t n);
void obx__buf_puts(obx__buf *b, const char *s);
void obx__buf_printf(obx__buf *b, const char *fmt, ...) OBX__PRINTF(2, 3);
void obx__buf_u32be(obx__buf *b, uint32_t v);

/* Lowercase hex of n bytes into out (2n+1 bytes). */
void obx__hex(const unsigned char *p, size_t n, char *out);
int obx__unhex(const char *hex, unsigned char *out, size_t cap, size_t *outlen);

/* Wall clock in ms since the epoch. Only drivers and CLI call this; the engine takes now. */
int64_t obx__wall_ms(void);
/* The reference clock (docs/design.md, "One clock"): what a relay decides lease expiry, attempt
 * deadlines and quiet times on, and what its brokers check a deadline against. After
 * obx__ref_sync it is the database server's clock, read through this process's monotonic clock
 * (monotonic + the offset measured at the last sync), so a relay whose host clock is wrong or
 * steps decides on the same time as every other relay of that database; before any sync (and
 * for a store without a server: SQLite, on the same host) it is the wall clock. Process-wide. */
int64_t obx__ref_ms(void);
/* The server read server_ms between the local monotonic times sent_mono_ms and recv_mono_ms:
 * the offset is taken at the middle of that round trip (its error at most half of it). */
void obx__ref_sync(int64_t server_ms, int64_t sent_mono_ms, int64_t recv_mono_ms);
/* Monotonic ms, for drivers' timeouts; us where ms would tie (the relay's claim ordering). */
int64_t obx__mono_ms(void);
int64_t obx__mono_us(void);
/* ms since the epoch as RFC 3339 UTC, "2030-01-02T03:04:05.678Z" (out: 32 bytes). */
void obx__iso_ms(int64_t ms, char out[32]);

/* Lines a backend writes on its own (librdkafka's log callback, libpq's notices, warnings no
 * call returns): to the handler of obx_log_set (obx.h), which the drivers' log
 * (src/drivers/log.c) installs when a relay starts, so that they come out as records of
 * log.format like every other line; without one they go to stderr as one text line each, as
 * those libraries' own defaults would write them. Any thread. */
typedef enum {
    OBX__BLOG_DEBUG = OBX_LOG_DEBUG,
    OBX__BLOG_INFO = OBX_LOG_INFO,
    OBX__BLOG_WARN = OBX_LOG_WARN,
    OBX__BLOG_ERROR = OBX_LOG_ERROR
} obx__blog_level; /* the sink: obx_log_set (obx.h) */
void obx__backend_log(obx__blog_level level, const char *component, const char *fmt, ...)
    OBX__PRINTF(3, 4);

/* ---- envelope and destination (docs/canonical-encoding.md)
 * --------------------------------------------- */

typedef struct obx__dest {
    char cluster[OBX_NAME_MAX + 1];
    char topic[OBX_TOPIC_MAX + 1];
    char routing_key[OBX_KEY_MAX + 1];
    char algorithm[OBX_NAME_MAX + 1];
    int64_t route_gen;
    char serializer[OBX_NAME_MAX + 1];
    char durability[OBX_NAME_MAX + 1];
    char required_acks[OBX_NAME_MAX + 1];
} obx__dest;

typedef struct obx__envelope {
    char event_id[OBX_EVENT_ID_LEN + 1];
    int32_t envelope_gen;
    char aggregate_type[OBX_NAME_MAX + 1];
    char aggregate_id[OBX_KEY_MAX + 1];
    int64_t aggregate_version;
    char event_type[OBX_NAME_MAX + 1];
    char payload_schema[OBX_DIGEST_LEN + 1];
    char payload_digest[OBX_DIGEST_LEN + 1];
    char tenant[OBX_NAME_MAX + 1];
    int64_t occurred_at; /* ms since epoch, UTC */
    char created_txid[OBX_TEXT_MAX + 1];
    char correlation_id[OBX_TEXT_MAX + 1];
    char causation_id[OBX_TEXT_MAX + 1];
    char traceparent[OBX_TRACEPARENT_LEN + 1];
    char idempotency_key[OBX_KEY_MAX + 1];
    int64_t not_before; /* ms since epoch, UTC: not published before; 0 = no delay */
} obx__envelope;

#define OBX__DEST_TAG "obx.destination.v1"
#define OBX__ENV_TAG "obx.outboxEnvelope.v1"

/* Canonical encodings: the versioned tag first, then every field in fixed order, each as a
 * 4-byte big-endian length followed by its UTF-8 bytes; integers as decimal ASCII. An absent
 * optional field is the empty string. (docs/canonical-encoding.md; vectors in
 * tests/data/digest_vectors.json.) */
void obx__dest_canonical(const obx__dest *d, obx__buf *out);
void obx__envelope_canonical(const obx__envelope *e, obx__buf *out);
/* The envelope's encoding in two parts around created_txid's field, appended to out:
 * canonical = head || u32be(length) || created_txid || tail. For a store that learns the
 * transaction ID only as it writes (PostgreSQL's one-trip enqueue, pg_sql.c Q_ENQ_WRITE):
 * the client encodes the rest, the server adds the field and takes the digest. */
void obx__envelope_canonical_head(const obx__envelope *e, obx__buf *out);
void obx__envelope_canonical_tail(const obx__envelope *e, obx__buf *out);
obx_err obx__dest_digest(const obx__dest *d, char out[OBX_DIGEST_LEN + 1]);
obx_err obx__envelope_digest(const obx__envelope *e, char out[OBX_DIGEST_LEN + 1]);

/* Expands a routing-key template ({tenant} {aggregate_type} {aggregate_id} {event_type}). */
obx_err obx__routing_key_expand(const char *tpl, const obx__envelope *e, char *out, size_t cap);

/* ---- event IDs ---------------------------------------------------------------------------- */

/* ULID generator state: monotonic within a millisecond. One per thread or per actor. */
typedef struct obx__ulid_gen {
    int64_t last_ms;
    unsigned char last_rand[10];
    uint64_t seed; /* 0: seeded from the OS on first use; else a deterministic xorshift seed */
} obx__ulid_gen;

/* Next ID with time now_ms. With gen->seed set, the random part is deterministic (simulator). */
obx_err obx__ulid_next(obx__ulid_gen *gen, int64_t now_ms, char out[27]);
/* Decodes the time part of a ULID (first 10 chars). -1 on malformed input. */
int64_t obx__ulid_time(const char *ulid);

/* ---- validation (documented input set) ---------------------------------------------------- */

typedef enum obx__charset {
    OBX__CS_NAME,       /* [A-Za-z0-9._-] */
    OBX__CS_EVENT_TYPE, /* [a-z0-9._-], ends with ".v<digits>" */
    OBX__CS_TEXT,       /* valid UTF-8, no control characters */
    OBX__CS_OWNER,      /* [A-Za-z0-9._:@/-] */
} obx__charset;

/* Checks field `name` holds a value of length [min,max] in the given set. On failure the
 * message names the field, the limit and the offending byte. */
obx_err obx__check_field(const char *name, const char *value, size_t min, size_t max,
                         obx__charset cs);
/* UTF-8 validity (no overlongs, no surrogates). Returns the offset of the first bad byte or -1.
 */
long obx__utf8_invalid_at(const unsigned char *s, size_t n);
/* "sha256:" + 64 lowercase hex. */
bool obx__is_digest(const char *s);
/* W3C traceparent shape: "<2 hex>-<32 hex>-<16 hex>-<2 hex>", lowercase, 55 bytes. */
bool obx__is_traceparent(const char *s);

/* ---- outside input in messages and text columns (text.c) ---------------------------------- */

/* Copies n bytes of s into out (cap bytes) for a message: control characters, DEL and bytes
 * outside valid UTF-8 become "\xNN"; cut at a character boundary with "..." when long.
 * Returns out. */
const char *obx__printable(const char *s, size_t n, char *out, size_t cap);
/* Like obx__strlcpy for a text column filled from outside input: never cuts a UTF-8 sequence,
 * and control characters and invalid bytes become '?'. */
void obx__text_copy(char *dst, const char *src, size_t cap);
/* Drops an incomplete UTF-8 sequence at the end of s (what snprintf leaves when it cuts). */
void obx__utf8_trim(char *s);

/* ---- secrets (secret.c, docs/security.md) -------------------------------------------------- */

/* Expands ${NAME} (environment) and ${file:PATH} references in `in` into a malloc'ed *out
 * (obx__secret_free). in_url: substituted values are percent-encoded unless the reference is
 * the whole string. Messages name the reference, never its value. */
obx_err obx__secret_expand(const char *in, bool in_url, char **out);
/* Wipes and frees a string that may hold a secret. NULL is harmless. */
void obx__secret_free(char *s);
/* Equality of two secrets in time independent of their contents and lengths. */
bool obx__secret_equal(const void *a, size_t alen, const void *b, size_t blen);
/* True for property names that hold secrets (sasl.password, ssl.key.pem, ...). */
bool obx__secret_key(const char *key);

/* ---- payload encryption (crypt.c, docs/security.md "Payload encryption") ------------------ */

#define OBX__KEYS_MAX 64
#define OBX__NONCE_LEN 12
#define OBX__TAG_LEN 16
#define OBX__SEAL_OVERHEAD (OBX__NONCE_LEN + OBX__TAG_LEN)
#define OBX__AAD_MAX (17 + OBX_KEY_ID_MAX + 1 + OBX_EVENT_ID_LEN + 1 + 4)

/* A key ID's rules: 1..OBX_KEY_ID_MAX bytes of [A-Za-z0-9._-]. */
obx_err obx__key_id_check(const char *id);
/* Parses a key ring's text ("ID=HEX64" entries, one a line or separated by ',' or ';', '#'
 * comments) into *out (obx_keyring_close). Messages name key IDs, never key bytes. */
obx_err obx__keyring_parse(const char *text, obx_keyring **out);
bool obx__keyring_has(const obx_keyring *ring, const char *id);
/* Seals a payload for (event_id, gen) under key_id: *out (malloc'ed, len + OBX__SEAL_OVERHEAD
 * bytes, the caller frees) is nonce || ciphertext || tag; the same inputs give the same bytes.
 * payload_digest is the payload's frozen SHA-256 (hex). OBX_ECONFIG: key_id not in the ring. */
obx_err obx__seal(const obx_keyring *ring, const char *key_id, const char *event_id, int32_t gen,
                  const void *payload, size_t len, const char *payload_digest, unsigned char **out,
                  size_t *out_len);
/* Opens a sealed body into *out (malloc'ed, NUL-terminated beyond *out_len, the caller frees).
 * OBX_ENOTFOUND: key_id not in the ring (nothing can be said); OBX_EREFUSED: the body is not
 * what obx__seal gives for any plaintext under this key, event ID and generation. */
obx_err obx__open(const obx_keyring *ring, const char *key_id, const char *event_id, int32_t gen,
                  const void *body, size_t len, unsigned char **out, size_t *out_len);

/* ---- URLs ---------------------------------------------------------------------------------- */

typedef enum obx__url_scheme {
    OBX__URL_SQLITE,
    OBX__URL_POSTGRES,
    OBX__URL_LOG,
    OBX__URL_KAFKA,
    OBX__URL_AMQP,
    OBX__URL_AMQPS,
    OBX__URL_SIM,
} obx__url_scheme;

typedef struct obx__url {
    obx__url_scheme scheme;
    char raw[1024];   /* as given */
    char path[1024];  /* sqlite:/log:/sim: path or name */
    char hosts[1024]; /* kafka: "h:p,h:p"; amqp: "h:p" */
    char user[256];
    char password[256];
    char vhost[256];
    char query[1024]; /* after '?', undecoded */
    bool read_only;   /* not from the URL: set by the opener (obx_store_open_with) */
} obx__url;

/* Parses url of kind "store" or "broker". */
obx_err obx__url_parse(const char *url, const char *kind, obx__url *out);

/* ---- the state machine (docs/design.md, "States")
 * ------------------------------------------------------ */

#define OBX__STATE_LIST(X)                                                                         \
    X(NONE, "NONE")                                                                                \
    X(PENDING, "PENDING")                                                                          \
    X(CLAIMED, "CLAIMED")                                                                          \
    X(SENDING, "SENDING")                                                                          \
    X(PUBLISHED, "PUBLISHED")                                                                      \
    X(RETAINED, "RETAINED")                                                                        \
    X(PURGED, "PURGED")                                                                            \
    X(DISPATCH_UNKNOWN, "DISPATCH_UNKNOWN")                                                        \
    X(RECONCILING, "RECONCILING")                                                                  \
    X(RETRY_CLAIMED, "RETRY_CLAIMED")                                                              \
    X(PARKED, "PARKED")                                                                            \
    X(CANCELLED, "CANCELLED")

typedef enum obx__state {
#define OBX__S(n, s) OBX__ST_##n,
    OBX__STATE_LIST(OBX__S)
#undef OBX__S
        OBX__ST_COUNT
} obx__state;

#define OBX__ACTOR_LIST(X)                                                                         \
    X(PRODUCER, "producer")                                                                        \
    X(DISPATCHER, "dispatcher")                                                                    \
    X(ACCEPTOR, "acceptor")                                                                        \
    X(SWEEPER, "sweeper")                                                                          \
    X(RECONCILER, "reconciler")                                                                    \
    X(PURGER, "purger")                                                                            \
    X(MIGRATOR, "migrator")                                                                        \
    X(OPERATOR, "operator")

typedef enum obx__actor {
#define OBX__A(n, s) OBX__ACT_##n,
    OBX__ACTOR_LIST(OBX__A)
#undef OBX__A
        OBX__ACT_COUNT
} obx__actor;

typedef struct obx__transition {
    obx__state from, to;
    obx__actor actor;
    const char *performed_by; /* the C function that performs it */
    const char *why;
} obx__transition;

extern const obx__transition obx__transitions[];
extern const size_t obx__transition_count;

const char *obx__state_name(obx__state s);
obx__state obx__state_parse(const char *s); /* OBX__ST_COUNT when unknown */
const char *obx__actor_name(obx__actor a);
/* The table lookup every state change goes through. */
bool obx__transition_allowed(obx__state from, obx__state to, obx__actor actor);
/* States in which the publish slot is filled. */
bool obx__state_is_published(obx__state s);

/* Attempt states (per send; docs/design.md, "Claims, attempts and fencing" and "Reconciliation
 * and UNKNOWN outcomes"). */
#define OBX__ATTEMPT_STATE_LIST(X)                                                                 \
    X(SENDING, "SENDING")                                                                          \
    X(UNKNOWN, "UNKNOWN")                                                                          \
    X(ACCEPTED, "ACCEPTED")   /* its receipt filled the publish slot */                            \
    X(DUPLICATE, "DUPLICATE") /* acknowledged after the slot was full */                           \
    X(REJECTED, "REJECTED")   /* the broker definitely did not accept it */                        \
    X(NOT_FOUND, "NOT_FOUND") /* an authoritative lookup proved it absent */                       \
    X(QUARANTINED, "QUARANTINED")                                                                  \
    /* its outcome was still UNKNOWN when another attempt filled the publish slot: nothing is      \
     * left to decide (a late ACK of it is still a duplicate receipt) */                           \
    X(SUPERSEDED, "SUPERSEDED")

typedef enum obx__attempt_state {
#define OBX__AS(n, s) OBX__AT_##n,
    OBX__ATTEMPT_STATE_LIST(OBX__AS)
#undef OBX__AS
        OBX__AT_COUNT
} obx__attempt_state;

const char *obx__attempt_state_name(obx__attempt_state s);
obx__attempt_state obx__attempt_state_parse(const char *s);

#endif /* OBX_CORE_H */

/*
 * engine_fx.h — the engine fixture, written once for the suites that drive the engine or a store
 * directly (fault_suite.c, migration_suite.c, retention_suite.c, delay_suite.c, the store
 * conformance suite, test_ops.c, test_store_pg) (issue 47, item 5): a SQLite store in a test
 * folder, a route, an event enqueued at a virtual time, an engine with the suites' short
 * timings, and the counts a test asserts (an event's row, its receipts, attempts, audit rows).
 * Each function fails the running cmocka test (OK()) when a store call fails; what it allocates
 * it frees, except the row obx_t_ev returns (its strings are inline: nothing to free).
 */
#ifndef OBX_TEST_ENGINE_FX_H
#define OBX_TEST_ENGINE_FX_H

#include "engine/engine.h"
#include "store/store.h"

/* Opens and initializes a new SQLite store DIR/NAME<n>.db, n = ++*count: a store factory's
 * body. OBX_OK or the error. */
obx_err obx_t_sqlite_store(const char *dir, const char *name, int *count, obx__store **out);

/* For a cmocka setup: a store from factory into *s; on failure prints why and returns -1. */
int obx_t_factory(obx_err (*factory)(obx__store **), obx__store **s);

/* For a cmocka setup: url (size bytes) := the log broker "log:DIR/b<n>.db?seed=SEED&cluster=local",
 * and a connection to it into *b; on failure prints why and returns -1. */
int obx_t_log_broker(char *url, size_t size, const char *dir, int n, int seed, obx__broker **b);

/* Sets route TYPE to cluster "local", topic TOPIC; blind: UNKNOWN policy "retry", else "hold".
 * alias may be NULL. The route's generation is returned. */
int64_t obx_t_route(obx__store *s, int64_t now, const char *type, const char *topic, int blind,
                    int max_attempts, const char *alias);

/* An event of TYPE for aggregate AGG_TYPE/AGG_ID of TENANT with PAYLOAD (a string, not
 * copied); the other fields empty. */
obx_event obx_t_event(const char *type, const char *agg_type, const char *agg_id,
                      const char *tenant, const char *payload);

/* An order.created.v2 event of aggregate order/ID (version 1, tenant tenant-7, correlation
 * corr-1) with PAYLOAD (a string, not copied). */
obx_event obx_t_order_event(const char *id, const char *payload);

/* Enqueues an event of TYPE for aggregate order/AGG (version 1, tenant t1, correlation CORR or
 * none, payload PAYLOAD or {"order":"AGG"} when NULL) at NOW; its ID into id. */
void obx_t_enq(obx__store *s, int64_t now, const char *type, const char *agg, const char *corr,
               const char *payload, char id[31]);

/* Enqueues one event of each of the n types at NOW (aggregate order/o-<i+1>, tenant t1,
 * payload {}); the IDs into ids[i]. */
void obx_t_enq_types(obx__store *s, int64_t now, const char *const *types, int n,
                     char ids[][OBX_EVENT_ID_LEN + 1]);

/* Sets up engine e as OWNER on store s and broker b: lease and reconcile lease 1000 ms, recheck
 * 500 ms, back-off base 100 ms, the given seed. */
void obx_t_engine(obx__engine *e, obx__store *s, obx__broker *b, const char *owner, uint64_t seed,
                  const char *const *aliases, size_t n_aliases);

/* Sets up engine e on store s and broker b: the default configuration, but back-off
 * base_ms..max_ms and the given seed (0: the default's). */
void obx_t_engine_backoff(obx__engine *e, obx__store *s, obx__broker *b, int64_t base_ms,
                          int64_t max_ms, uint64_t seed);

/* The event's row (loaded with FLAGS; payload NULL): the test fails unless there is one. */
obx__event_row obx_t_ev(obx__store *s, const char *id, unsigned flags);

/* The number of receipts of kind k of the event; the last one's attempt ID into attempt_out and
 * its reason into reason_out when not NULL. */
int obx_t_receipts(obx__store *s, const char *id, obx__receipt_kind k, char *attempt_out,
                   char *reason_out);

/* The number of attempts of the event in state st (all of them when st < 0). */
int obx_t_attempts(obx__store *s, const char *id, int st);

/* Audit rows of the event whose reason contains needle (any if NULL), from -> to (-1: any). */
int obx_t_audit(obx__store *s, const char *id, int from, int to, const char *needle);

/* Polls e at now until nothing is left to apply; the number of outcomes applied. */
size_t obx_t_poll_all(obx__engine *e, int64_t now);

/* What the inbox gets of delivery d in these suites: the envelope's event ID, generation, type,
 * tenant, aggregate and payload digest, the payload, the topic and position, the header error
 * (not the version, times, attempt or destination digest: the caller adds what it needs). */
obx_message obx_t_message(const obx__delivery *d);

/* A message for the inbox: event id of type order.created.v1 (envelope generation 1) of TENANT,
 * payload {} on topic orders; its payload digest is computed into digest, which the message
 * points to. */
obx_message obx_t_inbox_message(const char *id, const char *tenant,
                                char digest[OBX_DIGEST_LEN + 1]);

/* A broker's ACK (envelope generation 1) of attempt attempt_id of event id, at cluster "local",
 * topic, partition, offset, carrying payload_digest and dest_digest. */
obx__outcome obx_t_ack(const char *id, const char *attempt_id, const char *payload_digest,
                       const char *dest_digest, const char *topic, int32_t partition,
                       int64_t offset);

/* A SENDING attempt attempt_id of event id: envelope, attempt and claim generation 1, no offset
 * before it (-1); the other fields empty. */
obx__attempt_row obx_t_attempt(const char *id, const char *attempt_id);

/* A cluster registry row (what a relay registers): CLUSTER served by RELAY with BACKEND,
 * authoritative lookups, DURABILITY and REQUIRED_ACKS (comma lists), any serializer, seen at
 * seen_at. */
obx__cluster_row obx_t_cluster(const char *cluster, const char *backend, const char *durability,
                               const char *required_acks, const char *relay, int64_t seen_at);

/* The missing-topic set-up (test_bad_input.c, test_broker_hardening.c) at NOW: order.created.v1
 * routed to topic no-such-topic of CLUSTER (max attempts 2) and order.paid.v1 to its topic
 * orders, one event of each enqueued (ids[0]: the one whose topic is missing). */
void obx_t_missing_topic(obx__store *s, int64_t now, const char *cluster,
                         char ids[2][OBX_EVENT_ID_LEN + 1]);

/* After the first dispatch of that set-up: the test fails unless ids[1] is PUBLISHED and ids[0]
 * PENDING after one rejection. */
void obx_t_missing_topic_backoff(obx__store *s, char ids[2][OBX_EVENT_ID_LEN + 1]);

/* The second dispatch (engine e at NOW, its outcomes polled): the test fails unless event id is
 * then PARKED (the route's max attempts, 2, reached). */
void obx_t_missing_topic_parks(obx__engine *e, obx__store *s, int64_t now, const char *id);

/* A receipt of kind k of attempt attempt_id of event id (envelope generation 1), at cluster
 * "local", topic "orders", made at `at`; the other fields empty. */
obx__receipt_row obx_t_receipt(const char *id, const char *attempt_id, obx__receipt_kind k,
                               int64_t at);

#endif

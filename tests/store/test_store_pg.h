/*
 * test_store_pg.h — what the files of the test_store_pg suite share (one binary, one ctest
 * entry; the files split the PostgreSQL-specific tests by concern, the table in
 * test_store_pg.c runs them): the includes, the fixture (pg_fixture.c: fresh databases, the
 * business connection, helpers), types and statements more than one file uses, and each
 * file's tests.
 */
#ifndef OBX_TEST_STORE_PG_H
#define OBX_TEST_STORE_PG_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/pg_fx.h"
#include "support/support.h"

#include "engine/engine.h"
#include "engine/delay_suite.h"
#include "engine/fault_suite.h"
#include "engine/migration_suite.h"
#include "store/conformance.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char base_url[1024];
extern PGconn *admin; /* maintenance connection to the URL's own database */
extern int db_count;
extern char created[256][64]; /* databases to drop at the end */

typedef struct fx {
    char db[64];
    char url[1200];
    PGconn *conn; /* the business service's connection */
    obx_store *s; /* wrapping conn */
} fx;

#define ROUTE_READ "SELECT gen, event_type"

#define ONE_TRIP                                                                                   \
    "WITH lk AS MATERIALIZED (SELECT CASE WHEN % THEN pg_advisory_xact_lock_shared(% END WHERE "   \
    "$21"

#define TRY_TRIP                                                                                   \
    "WITH lk AS MATERIALIZED (SELECT CASE WHEN % THEN pg_try_advisory_xact_lock_shared(% END AS "  \
    "got WHERE $21"

/* pg_fixture.c */
void db_url(const char *db, const char *extra, char *out, size_t cap);
void admin_exec(const char *sql);
int new_db(char *db, const char *options);
obx_err pg_factory(obx__store **out);
extern const store_app pg_app; /* the application's side of pg_factory's last database */
PGconn *connect_url(const char *url);
void exec_ok(PGconn *c, const char *sql);
long long qint(PGconn *c, const char *sql);
void exec_fail(PGconn *c, const char *sql, char state[6], char *msg, size_t cap);
void msleep(int ms);
long long qint_down_to(PGconn *c, const char *sql, long long most);
int setup(void **state);
int teardown(void **state);
obx_event order_event(const char *id, const char *payload);
obx__event_row load1(obx__store *s, const char *id, unsigned flags);
void check_first_row(obx__store *s, PGconn *c, const char *id, const char *who);
obx_store *open_own(fx *f, const char *app);
void kill_backend(const char *app);
int wait_lock_waiter(const char *app);
/* pg_producer.c */
void test_commit_together(void **state);
void test_rollback_together(void **state);
void test_caller_tx_survives(void **state);
long long runs_of(PGconn *c, const char *head);
void check_enqueued(fx *f, const char *id, const char *order_id, const char *topic);
obx_err business_enqueue(fx *f, const char *order_id, const char *key, char id[31], int *existing);
void lock_every_bucket(PGconn *holder);
void test_enqueue_one_round_trip(void **state);
void test_enqueue_server_fault(void **state);
void test_newer_schema_refused(void **state);
void test_read_only(void **state);
void test_frozen(void **state);
/* pg_sql.c */
void test_enqueue_own_one_round_trip(void **state);
void test_idempotency_concurrent(void **state);
void test_idempotency_concurrent_sql(void **state);
void test_seq_is_commit_order(void **state);
void test_digest_vectors_sql(void **state);
void assert_enqueue_impl(PGconn *c, const char *impl);
void test_sql_enqueue_matches_c(void **state);
void test_sql_enqueue_key_matches_c(void **state);
void test_sql_body_matches_c(void **state);
void test_sql_enqueue_delay(void **state);
void test_sql_body_delay(void **state);
int64_t route_topic(const char *url, const char *topic, obx_route_target *t, size_t n);
void remake_schema(fx *f);
void test_enqueue_route_schema_remade(void **state);
void test_sql_enqueue_route_changes(void **state);
void test_enqueue_without_extension(void **state);
void test_extension_versions(void **state);
void test_sql_validation_parity(void **state);
void test_psql_producer(void **state);
void login_role(PGconn *c, const char *db, const char *prefix, const char *kind, char *url);
/* pg_wake.c */
void test_roles(void **state);
void test_notify_wakes(void **state);
void test_notify_off(void **state);
void test_latch_wake(void **state);
void test_wake_gap(void **state);
void test_wake_c_dropped(void **state);
void test_wake_lock(void **state);
void test_connection_loss(void **state);
/* pg_relay.c */
void test_busy_mapping(void **state);
bool has(const obx__rows *r, const char *id);
void test_claim_skip_locked(void **state);
void test_claim_throughput(void **state);
void relay_until_published(PGconn *conn, obx__engine *e);
void test_write_set_schema_remade(void **state);
void test_dispatch_plans(void **state);
void test_dispatch_round_trips(void **state);
void stats_exact(obx__store *s, PGconn *conn);
void test_stats_exact(void **state);
void test_batch_semantics(void **state);
void test_write_set(void **state);
void test_held_write_set(void **state);
/* pg_schema.c */
void test_sql_enqueue_delivery_set(void **state);
void refused(PGconn *c, const char *sql, const char *want, const char *has);
void test_schema_checks(void **state);
void test_relay_tables_storage(void **state);
void test_sql_ids_digests(void **state);
void test_roles_write_paths(void **state);
void test_init_refuses_under_relay(void **state);
void test_schema_versions(void **state);

#endif

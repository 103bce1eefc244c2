/*
 * test_pg_security.c — transport security, secrets and least privilege on a real PostgreSQL
 * (OBX_TEST_PG_URL with OBX_TEST_PG_CACERT and OBX_TEST_WRONG_CACERT, set by
 * scripts/services.sh, which starts the server with TLS offered by a throwaway CA and a
 * pg_hba.conf where obx_secret_user must give its password and obx_tls_user must also come
 * over TLS). Fails, never skips, without them.
 *
 *   TLS              sslmode=verify-full with the CA: obx's own connection is encrypted; with
 *                    an unrelated CA, or a host name the certificate does not name: refused;
 *                    a TLS-only role: refused in plain text, accepted over TLS;
 *   secrets          the password from ${ENV}, from ${file:PATH}, the whole URL from ${ENV},
 *                    a password with reserved characters: each actually authenticates; a
 *                    planted password never appears in messages, in `obx config` dumps, in the
 *                    output of failing commands, nor in a running relay's debug logs;
 *   least privilege  <prefix>_consumer sees and writes only the inbox rows of the consumer IDs
 *                    and tenants obx.obx_consumer_grant gives its login role (row-level
 *                    security), nothing of the outbox, and cannot grant itself more; a receipt
 *                    the database refuses parks the message instead of stalling the consumer;
 *                    the relay cannot re-point an event at a forged envelope generation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support/engine_fx.h"
#include "support/pg_fx.h"
#include "support/support.h"

#include "engine/engine.h"

#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *base_url, *ca, *wrong_ca;
static obx__url base;
static PGconn *admin;
static char port[16];
static char dir[64]; /* scratch files */
static int dbs;

/* The planted secrets: none may ever appear in output. */
#define PLANTED "Pl4nted-pw-9Xq"
#define PLANTED_RESERVED "p@ss/w:rd?#%&x"

static void sql(PGconn *c, const char *q) { obx_t_pg_sql(c, q); }

static long long qint(PGconn *c, const char *q) { return obx_t_pg_qint(c, q); }

/* SQLSTATE of a statement that must fail ("" when it succeeded). */
static void sqlstate(PGconn *c, const char *q, char st[6]) {
    PGresult *r = PQexec(c, q);
    st[0] = '\0';
    if (PQresultStatus(r) == PGRES_FATAL_ERROR) {
        const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        snprintf(st, 6, "%s", s ? s : "?????");
    }
    PQclear(r);
}

static void new_db(char *db) {
    snprintf(db, 48, "obx_sec_%d_%d", (int)getpid(), ++dbs);
    char q[128];
    snprintf(q, sizeof q, "CREATE DATABASE %s", db);
    sql(admin, q);
}

static void drop_db(const char *db) {
    char q[128];
    snprintf(q, sizeof q, "DROP DATABASE IF EXISTS %s WITH (FORCE)", db);
    sql(admin, q);
}

static PGconn *connect_or_fail(const char *url) { return obx_t_pg_connect(url); }

/* Runs a shell command; its stdout and stderr into out. Returns the exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void no_secret(const char *what, const char *text) {
    if (strstr(text, PLANTED) || strstr(text, PLANTED_RESERVED))
        fail_msg("%s shows a planted password:\n%s", what, text);
}

/* ---- TLS ------------------------------------------------------------------------------------ */

static void test_tls_verify_full(void **st) {
    (void)st;
    char db[48], url[1024];
    new_db(db);
    snprintf(url, sizeof url, "postgres://%s@localhost:%s/%s?sslmode=verify-full&sslrootcert=%s",
             base.user[0] ? base.user : "postgres", port, db, ca);
    obx_store *s = NULL;
    OK(obx_store_open(url, &s));
    OK(obx_store_init(s));
    /* obx's own connection (application_name obx) is the encrypted one */
    char q[512];
    snprintf(q, sizeof q,
             "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
             "WHERE a.datname = '%s' AND a.application_name = 'obx' AND s.ssl",
             db);
    assert_int_equal(qint(admin, q), 1);
    obx_store_close(s);
    /* an unrelated CA: refused, saying why */
    snprintf(url, sizeof url,
             "postgres://postgres@localhost:%s/%s?sslmode=verify-full&sslrootcert=%s", port, db,
             wrong_ca);
    assert_int_equal(obx_store_open(url, &s), OBX_ECONNLOST);
    if (!strstr(obx_errmsg(), "certificate verify failed")) fail_msg("%s", obx_errmsg());
    /* the right CA, but a host name the certificate does not name */
    snprintf(url, sizeof url,
             "postgres://postgres@obx.invalid:%s/%s?hostaddr=127.0.0.1&sslmode=verify-full&"
             "sslrootcert=%s",
             port, db, ca);
    assert_int_equal(obx_store_open(url, &s), OBX_ECONNLOST);
    if (!strstr(obx_errmsg(), "does not match host name")) fail_msg("%s", obx_errmsg());
    /* a role that pg_hba.conf admits only over TLS */
    sql(admin, "DROP ROLE IF EXISTS obx_tls_user");
    sql(admin, "CREATE ROLE obx_tls_user LOGIN PASSWORD 'tls-only-pw'");
    snprintf(url, sizeof url, "postgres://obx_tls_user:tls-only-pw@127.0.0.1:%s/%s?sslmode=disable",
             port, db);
    assert_int_equal(obx_store_open(url, &s), OBX_ECONNLOST);
    if (!strstr(obx_errmsg(), "no encryption")) fail_msg("%s", obx_errmsg());
    assert_null(strstr(obx_errmsg(), "tls-only-pw"));
    snprintf(
        url, sizeof url,
        "postgres://obx_tls_user:tls-only-pw@localhost:%s/%s?sslmode=verify-full&sslrootcert=%s",
        port, db, ca);
    OK(obx_store_open(url, &s));
    obx_store_close(s);
    sql(admin, "DROP OWNED BY obx_tls_user");
    drop_db(db);
    sql(admin, "DROP ROLE obx_tls_user");
}

/* ---- secrets -------------------------------------------------------------------------------- */

static void test_secrets_authenticate(void **st) {
    (void)st;
    char db[48], url[1024], q[256];
    new_db(db);
    sql(admin, "DROP ROLE IF EXISTS obx_secret_user");
    snprintf(q, sizeof q, "CREATE ROLE obx_secret_user LOGIN PASSWORD '%s'", PLANTED);
    sql(admin, q);
    obx_store *s = NULL;
    /* from the environment */
    setenv("OBX_T_PGPW", PLANTED, 1);
    snprintf(url, sizeof url, "postgres://obx_secret_user:${OBX_T_PGPW}@127.0.0.1:%s/%s", port, db);
    OK(obx_store_open(url, &s));
    assert_non_null(strstr(obx_store_url(s), "obx_secret_user:***@")); /* never the value */
    obx_store_close(s);
    /* from a file */
    char path[96];
    snprintf(path, sizeof path, "%s/pgpass", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%s\n", PLANTED);
    fclose(f);
    snprintf(url, sizeof url, "postgres://obx_secret_user:${file:%s}@127.0.0.1:%s/%s", path, port,
             db);
    OK(obx_store_open(url, &s));
    obx_store_close(s);
    /* the whole URL from the environment, with a literal password in it */
    char full[512];
    snprintf(full, sizeof full, "postgres://obx_secret_user:%s@127.0.0.1:%s/%s", PLANTED, port, db);
    setenv("OBX_T_DBURL", full, 1);
    OK(obx_store_open("${OBX_T_DBURL}", &s));
    assert_string_equal(obx_store_url(s), "${OBX_T_DBURL}");
    obx_store_close(s);
    /* a password with the characters a URL reserves: percent-encoded on substitution */
    snprintf(q, sizeof q, "ALTER ROLE obx_secret_user PASSWORD '%s'", PLANTED_RESERVED);
    sql(admin, q);
    setenv("OBX_T_PGPW", PLANTED_RESERVED, 1);
    snprintf(url, sizeof url, "postgres://obx_secret_user:${OBX_T_PGPW}@127.0.0.1:%s/%s", port, db);
    OK(obx_store_open(url, &s));
    obx_store_close(s);
    /* the wrong password: refused with the server's words, the password not among them */
    setenv("OBX_T_PGPW", PLANTED, 1);
    assert_int_equal(obx_store_open(url, &s), OBX_ECONNLOST);
    if (!strstr(obx_errmsg(), "password authentication failed")) fail_msg("%s", obx_errmsg());
    no_secret("errmsg", obx_errmsg());
    /* a literal password: the handle's URL is redacted */
    snprintf(url, sizeof url, "postgres://obx_secret_user:%s@127.0.0.1:%s/%s", PLANTED_RESERVED,
             port, db);
    assert_int_equal(obx_store_open(url, &s), OBX_EURL); /* reserved characters unencoded */
    no_secret("errmsg", obx_errmsg());
    unlink(path);
    sql(admin, "DROP OWNED BY obx_secret_user");
    drop_db(db);
    sql(admin, "DROP ROLE obx_secret_user");
}

/* The obx command: errors, dumps and a running relay's debug log never show the password. */
static void test_planted_password_never_shown(void **st) {
    (void)st;
    char db[48], q[512], cmd[3072], out[65536];
    new_db(db);
    sql(admin, "DROP ROLE IF EXISTS obx_secret_user");
    snprintf(q, sizeof q, "CREATE ROLE obx_secret_user LOGIN PASSWORD '%s'", PLANTED);
    sql(admin, q);
    char owner[1024];
    snprintf(owner, sizeof owner, "postgres://postgres@127.0.0.1:%s/%s", port, db);
    snprintf(cmd, sizeof cmd, "%s init --db '%s' --roles obxsec", OBX_BIN, owner);
    if (run(cmd, out, sizeof out)) fail_msg("%s: %s", cmd, out);
    assert_non_null(strstr(out, "obxsec_consumer"));
    PGconn *oc = connect_or_fail(owner);
    sql(oc, "GRANT obxsec_relay TO obx_secret_user");
    PQfinish(oc);
    char lit[1024], wrong[1024];
    snprintf(lit, sizeof lit, "postgres://obx_secret_user:%s@127.0.0.1:%s/%s", PLANTED, port, db);
    snprintf(wrong, sizeof wrong, "postgres://obx_secret_user:x%sx@127.0.0.1:%s/%s", PLANTED, port,
             db);
    char yaml[128];
    snprintf(yaml, sizeof yaml, "%s/relay.yaml", dir);
    FILE *f = fopen(yaml, "w");
    fprintf(f,
            "db: %s\nbroker: amqp://guest:%s@127.0.0.1:1/%%2f\nbroker_properties:\n"
            "  sasl.password: %s\n  ssl.key.password: %s\n",
            lit, PLANTED, PLANTED, PLANTED);
    fclose(f);
    /* exit statuses: 0 done, 1 a finding, 2 usage, 3 could not check (README, "Commands") */
    struct {
        const char *fmt;
        int rc;
    } cases[] = {
        {"%s config --db '%s'", 0},
        {"%s config --config %s", 0},
        {"%s config --db 'postgres://obx_secret_user:%s@127.0.0.1:1/x' --set relay.batch=0", 2},
        {"%s init --db '%s'", 0},       /* the schema is current: says so, redacted */
        {"%s init --db '%s'", 3},       /* the wrong password */
        {"%s report --db '%s'", 3},     /* the wrong password */
        {"%s route list --db '%s'", 3}, /* the wrong password */
        {"%s relay --config %s --set relay.drain_ms=0", 2}, /* a configuration error */
        {"%s consume --consumer-db sqlite:%s/c.db --topic t --broker 'amqp://u:%s@127.0.0.1:1/' "
         "--until-idle 100",
         3},
        {"%s inspect evt-01HZX3K9QW8E7R6T5Y4V3J201P --db '%s'", 1},
    };
    const char *args[] = {lit, yaml, PLANTED, lit, wrong, wrong, wrong, yaml, NULL, lit};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (i == 8)
            snprintf(cmd, sizeof cmd, cases[i].fmt, OBX_BIN, dir, PLANTED);
        else
            snprintf(cmd, sizeof cmd, cases[i].fmt, OBX_BIN, args[i]);
        int rc = run(cmd, out, sizeof out);
        if (rc != cases[i].rc) fail_msg("%s: exit %d, expected %d:\n%s", cmd, rc, cases[i].rc, out);
        no_secret(cmd, out);
    }
    snprintf(cmd, sizeof cmd, "%s config --config %s", OBX_BIN, yaml);
    run(cmd, out, sizeof out);
    assert_non_null(strstr(out, "\"sasl.password=***\""));
    assert_non_null(strstr(out, "obx_secret_user:***@"));
    /* a relay that runs, with the password from the environment and debug logs in JSON */
    char log[128], ycfg[128];
    snprintf(log, sizeof log, "%s/relay.log", dir);
    snprintf(ycfg, sizeof ycfg, "%s/run.yaml", dir);
    f = fopen(ycfg, "w");
    fprintf(f,
            "db: postgres://obx_secret_user:${OBX_T_RELAY_PW}@127.0.0.1:%s/%s\n"
            "broker: log:%s/broker.db\nrelay:\n  poll_ms: 20\n  drain_ms: 100\n"
            "log:\n  format: json\n  level: debug\n",
            port, db, dir);
    fclose(f);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("OBX_T_RELAY_PW", PLANTED, 1);
        if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(126);
        execl(OBX_BIN, "obx", "relay", "--config", ycfg, (char *)NULL);
        _exit(127);
    }
    struct timespec ts = {1, 500000000};
    nanosleep(&ts, NULL);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    f = fopen(log, "r");
    size_t n = fread(out, 1, sizeof out - 1, f);
    out[n] = '\0';
    fclose(f);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) fail_msg("relay failed:\n%s", out);
    assert_non_null(strstr(out, "stopped on signal")); /* it did run */
    no_secret("relay log", out);
    sql(admin, "DROP OWNED BY obx_secret_user");
    drop_db(db);
    sql(admin, "DROP ROLE obx_secret_user");
    sql(admin,
        "DROP ROLE IF EXISTS obxsec_producer, obxsec_relay, obxsec_auditor, obxsec_consumer");
}

/* ---- least privilege: the consumer role ---------------------------------------------------- */

static int applied;

static obx_err effect(void *user, void *conn, const obx_message *m, const char *key, char *res,
                      size_t cap) {
    (void)user;
    (void)conn;
    (void)m;
    (void)key;
    applied++;
    snprintf(res, cap, "ok");
    return OBX_OK;
}

/* Processes one valid message of tenant on the store; returns the outcome. */
static obx_inbox_outcome deliver(obx_store *s, const char *consumer, const char *tenant,
                                 const char *event_id, obx_inbox_result *r) {
    obx_inbox_options o = {.consumer_id = consumer};
    obx_inbox *in;
    OK(obx_inbox_open(s, &o, &in));
    char d[OBX_DIGEST_LEN + 1];
    obx_message m = obx_t_inbox_message(event_id, tenant, d);
    OK(obx_inbox_process(in, &m, effect, NULL, NULL, r));
    obx_inbox_close(in);
    return r->outcome;
}

static void test_consumer_sees_only_its_tenants(void **st) {
    (void)st;
    char db[48], owner[512], url_a[512], url_b[512];
    new_db(db);
    snprintf(owner, sizeof owner, "postgres://postgres@127.0.0.1:%s/%s", port, db);
    obx_store *os;
    OK(obx_store_open(owner, &os));
    OK(obx_store_init(os));
    OK(obx_store_create_roles(os, "obxlp"));
    OK(obx_store_create_roles(os, "obxlp")); /* idempotent, policies included */
    PGconn *oc = connect_or_fail(owner);
    sql(admin, "DROP ROLE IF EXISTS obx_cons_a, obx_cons_b");
    sql(admin, "CREATE ROLE obx_cons_a LOGIN IN ROLE obxlp_consumer");
    sql(admin, "CREATE ROLE obx_cons_b LOGIN IN ROLE obxlp_consumer");
    sql(oc, "INSERT INTO obx.obx_consumer_grant VALUES ('obx_cons_a', 'proj-a', 'tenant-a'), "
            "('obx_cons_b', 'proj-b', 'tenant-b')");
    snprintf(url_a, sizeof url_a, "postgres://obx_cons_a@127.0.0.1:%s/%s", port, db);
    snprintf(url_b, sizeof url_b, "postgres://obx_cons_b@127.0.0.1:%s/%s", port, db);
    obx_store *sa, *sb;
    OK(obx_store_open(url_a, &sa));
    OK(obx_store_open(url_b, &sb));
    obx_inbox_result r;
    assert_int_equal(deliver(sa, "proj-a", "tenant-a", "evt-01HZX3K9QW8E7R6T5Y4V3J2A01", &r),
                     OBX_INBOX_APPLIED);
    assert_int_equal(deliver(sb, "proj-b", "tenant-b", "evt-01HZX3K9QW8E7R6T5Y4V3J2B01", &r),
                     OBX_INBOX_APPLIED);
    assert_int_equal(deliver(sa, "proj-a", "tenant-a", "evt-01HZX3K9QW8E7R6T5Y4V3J2A01", &r),
                     OBX_INBOX_DUPLICATE);
    /* a tenant-b message through proj-a: the database refuses the receipt; the effect is rolled
     * back with it and the message is parked, visible, instead of stalling the consumer */
    applied = 0;
    assert_int_equal(deliver(sa, "proj-a", "tenant-b", "evt-01HZX3K9QW8E7R6T5Y4V3J2A02", &r),
                     OBX_INBOX_POISONED);
    assert_non_null(strstr(r.detail, "refused the receipt"));
    assert_true(r.ack);
    /* acting as another consumer ID: not even the poison row may be written */
    obx_inbox_options o = {.consumer_id = "proj-b"};
    obx_inbox *in;
    OK(obx_inbox_open(sa, &o, &in));
    char d[OBX_DIGEST_LEN + 1];
    obx_message m = obx_t_inbox_message("evt-01HZX3K9QW8E7R6T5Y4V3J2A03", "tenant-b", d);
    assert_int_equal(obx_inbox_process(in, &m, effect, NULL, NULL, &r), OBX_EDENIED);
    obx_inbox_close(in);
    obx_store_close(sa);
    obx_store_close(sb);
    /* what consumer A sees and may do, in SQL */
    char url[600];
    snprintf(url, sizeof url, "%s", url_a);
    PGconn *a = connect_or_fail(url);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_inbox"), 1);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_inbox WHERE tenant = 'tenant-b'"), 0);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_consume_audit WHERE consumer_id = "
                             "'proj-b'"),
                     0);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_consumer_watermark"), 1);
    assert_int_equal(qint(a, "SELECT count(*) FROM obx.obx_consumer_grant"), 1);
    assert_int_equal(qint(a, "WITH u AS (UPDATE obx.obx_inbox SET result = 'x' WHERE tenant = "
                             "'tenant-b' RETURNING 1) SELECT count(*) FROM u"),
                     0);
    assert_int_equal(qint(a, "WITH d AS (DELETE FROM obx.obx_inbox WHERE consumer_id = 'proj-b' "
                             "RETURNING 1) SELECT count(*) FROM d"),
                     0);
    char stt[6];
    const char *denied[] = {
        ("INSERT INTO obx.obx_inbox VALUES ('proj-a', 'evt-x', 'd', 't.v1', 'tenant-b', 'APPLIED', "
         "'', 'orders', 0, 0, 0, 0)"),
        "UPDATE obx.obx_inbox SET tenant = 'tenant-b'",
        "INSERT INTO obx.obx_consumer_grant VALUES ('obx_cons_a', 'proj-b', '*')",
        "SELECT count(*) FROM obx.obx_event",
        "SELECT count(*) FROM obx.obx_envelope",
        "SELECT obx.enqueue('order.created.v1', 'order', 'o', 1, 'tenant-a', '\\x7b7d')",
    };
    for (size_t i = 0; i < sizeof denied / sizeof denied[0]; i++) {
        sqlstate(a, denied[i], stt);
        if (strcmp(stt, "42501")) fail_msg("consumer A: '%s': SQLSTATE '%s'", denied[i], stt);
    }
    PQfinish(a);
    /* the owner sees both tenants; the relay role sees every inbox row (audits) */
    assert_int_equal(qint(oc, "SELECT count(*) FROM obx.obx_inbox"), 2);
    sql(admin, "DROP ROLE IF EXISTS obx_relay_login");
    sql(admin, "CREATE ROLE obx_relay_login LOGIN IN ROLE obxlp_relay");
    snprintf(url, sizeof url, "postgres://obx_relay_login@127.0.0.1:%s/%s", port, db);
    PGconn *rl = connect_or_fail(url);
    assert_int_equal(qint(rl, "SELECT count(*) FROM obx.obx_inbox"), 2);
    /* the relay cannot rewrite an envelope, not even as a new generation */
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx_route_set(os, &rt, NULL));
    obx_event ev = obx_t_event("order.created.v1", "order", "o-1", "tenant-a", "{\"total\":1}");
    obx_enqueue_result er;
    OK(obx_enqueue(os, &ev, &er));
    char forge[1024];
    snprintf(forge, sizeof forge,
             "INSERT INTO obx.obx_envelope SELECT event_id, 2, aggregate_type, aggregate_id, "
             "aggregate_version, event_type, payload_schema, '%s', tenant, occurred_at, "
             "created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
             "envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm, "
             "dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, "
             "'\\x7b22746f74616c223a39397d', payload_len, created_at FROM obx.obx_envelope "
             "WHERE event_id = '%s'",
             d, er.event_id);
    sqlstate(rl, forge, stt);
    assert_string_equal(stt, "OB001");
    /* a generation that keeps the envelope and changes only the destination is allowed */
    snprintf(forge, sizeof forge,
             "INSERT INTO obx.obx_envelope SELECT event_id, 2, aggregate_type, aggregate_id, "
             "aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at, "
             "created_txid, correlation_id, causation_id, traceparent, idempotency_key, "
             "envelope_digest, dest_cluster, 'orders-v2', dest_routing_key, dest_algorithm, "
             "dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload, "
             "payload_len, created_at FROM obx.obx_envelope WHERE event_id = '%s'",
             er.event_id);
    sql(rl, forge);
    PQfinish(rl);
    PQfinish(oc);
    obx_store_close(os);
    drop_db(db);
    sql(admin, "DROP ROLE obx_cons_a, obx_cons_b, obx_relay_login");
    sql(admin, "DROP ROLE obxlp_producer, obxlp_relay, obxlp_auditor, obxlp_consumer");
}

int main(void) {
    ca = getenv("OBX_TEST_PG_CACERT");
    wrong_ca = getenv("OBX_TEST_WRONG_CACERT");
    if (!ca || !wrong_ca) {
        fprintf(stderr, "test_pg_security: OBX_TEST_PG_URL, OBX_TEST_PG_CACERT and "
                        "OBX_TEST_WRONG_CACERT must be set (scripts/services.sh) — failing, not "
                        "skipping.\n");
        return 1;
    }
    /* databases an earlier, failed run left behind hold grants to the cluster-wide roles this
     * test drops: remove them first */
    obx_t_pg pg;
    if (obx_t_pg_open(&pg, "test_pg_security", "obx_sec_")) return 1;
    base_url = pg.url;
    base = pg.base;
    admin = pg.admin;
    snprintf(port, sizeof port, "%s", pg.port);
    if (obx_t_tmpdir(dir, sizeof dir, "pgsec")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tls_verify_full),
        cmocka_unit_test(test_secrets_authenticate),
        cmocka_unit_test(test_planted_password_never_shown),
        cmocka_unit_test(test_consumer_sees_only_its_tenants),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    PQfinish(admin);
    if (obx_t_rmdir(dir)) failed++;
    return failed;
}

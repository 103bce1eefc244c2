/*
 * pg_store.c — the PostgreSQL outbox store (libpq): many relay processes on many machines
 * sharing one database, and producers in any language (the SQL function obx.enqueue() in
 * schema.sql).
 *
 * Owns: one PGconn (opened here, or borrowed from a producer/consumer with obx_store_wrap_pg),
 * the names of the statements prepared on it, the nesting of obx transactions on it, and its
 * LISTEN state. This file opens and closes it, migrates the schema (in one transaction, under an
 * advisory lock, and not while a relay holds the schema in use: migrate_in_tx,
 * migrate_exclusive, pg_schema_hold), creates the roles and holds the method tables; the rest
 * is split by concern (pg_int.h lists the files).
 *
 * Contracts (one that another file keeps is stated in full at the top of that file):
 *   1. Every object lives in schema obx and every statement names it (pg_sql.c).
 *   2. Statements are prepared once per connection, under names derived from a hash of all
 *      statement texts (pg_sql.c).
 *   3. Transactions nest: BEGIN outermost, SAVEPOINT inside; obx never commits nor rolls back a
 *      transaction it did not begin (pg_conn.c).
 *   4. A batch is one round trip; a batch that names the same row twice is cut into runs
 *      without repeats (pg_write.c).
 *   5. Errors become obx codes in one place, obx__pg_map_error; a connection lost while COMMIT was
 *      in flight is OBX_EUNKNOWN, never success (pg_conn.c).
 *   6. A lost owned connection is re-established outside a transaction; a borrowed one never
 *      (pg_conn.c).
 *   7. Per order key (cluster, topic, routing key), seq order is commit order (pg_sql.c,
 *      Q_INS_EVENT).
 *   8. wait_for_work LISTENs and waits; an inserted event wakes a waiting relay; a notification
 *      is a hint, never a row (pg_wake.c).
 *
 * Thread use: one thread at a time per handle (obx.h); the statement-name hash is computed
 * once per process under pthread_once.
 */
#include "store/postgres/pg_int.h"

extern const char obx__pg_schema[];

/* Migrations by target version: index v holds the script that takes a database from v-1 to v
 * (1: the baseline, schema.sql). */
static const char *const migrations[] = {NULL, obx__pg_schema};
_Static_assert(sizeof migrations / sizeof *migrations == OBX__SCHEMA_VERSION + 1,
               "one script per schema version");
/* ---- open / close / schema --------------------------------------------------------------- */

static void pg_close(obx__store *base) {
    pg_store *s = (pg_store *)base;
    if (!s) return;
    obx__pg_held_drop(s);
    if (s->owned) PQfinish(s->conn);
    free(s);
}

static obx_err pg_new(PGconn *conn, bool owned, obx__store **out) {
    pg_store *s = calloc(1, sizeof *s);
    if (!s) return obx__fail(OBX_ENOMEM, "postgres store: out of memory");
    s->base.m = &obx__pg_store_methods;
    s->conn = conn;
    s->owned = owned;
    *out = &s->base;
    return OBX_OK;
}

/* The server's notices and warnings on obx's own connections (libpq's default prints them to
 * stderr as text): through obx's log, in log.format like every other record (core.h). A
 * wrapped connection keeps its owner's receiver. */
static void pg_notice(void *arg, const PGresult *r) {
    (void)arg;
    const char *sev = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    obx__blog_level l = !sev                        ? OBX__BLOG_INFO
                        : !strcmp(sev, "WARNING")   ? OBX__BLOG_WARN
                        : !strncmp(sev, "DEBUG", 5) ? OBX__BLOG_DEBUG
                                                    : OBX__BLOG_INFO;
    obx__backend_log(l, "postgres", "%s: %s", sev ? sev : "NOTICE",
                     msg ? msg : PQresultErrorMessage(r));
}

static obx_err pg_open(const obx__url *u, obx__store **out) {
    /* Defaults first, the URL next (its settings win), then what obx needs: UTF-8 strings.
     * Keepalives detect a dead peer during a long wait_for_work; tcp_user_timeout one that
     * vanished (a machine lost, a network cut: nothing refuses, nothing answers) while a
     * statement was on its way, which keepalives never probe: without it the kernel retransmits
     * for about 15 minutes before the call fails and a multi-host URL can move to the promoted
     * standby (docs/reliability.md, "PostgreSQL failover"). */
    const char *const keys[] = {
        "connect_timeout",  "keepalives_idle",           "keepalives_interval",
        "keepalives_count", "tcp_user_timeout",          "dbname",
        "client_encoding",  "fallback_application_name", NULL};
    const char *const vals[] = {"10", "30", "10", "3", "15000", u->raw, "UTF8", "obx", NULL};
    PGconn *conn = PQconnectdbParams(keys, vals, 1);
    if (!conn) return obx__fail(OBX_ENOMEM, "postgres: out of memory");
    if (PQstatus(conn) != CONNECTION_OK) {
        char msg[512];
        obx__strlcpy(msg, PQerrorMessage(conn), sizeof msg);
        size_t n = strlen(msg);
        while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = '\0';
        PQfinish(conn);
        /* The server answered that the database does not exist (SQLSTATE 3D000; libpq gives a
         * failed connection's message only, in the server's words, lc_messages 'C' or 'en'
         * by default): OBX_ENODB, no lost connection; a read-only command says "no such
         * outbox". */
        if (strstr(msg, "FATAL:  database \"") && strstr(msg, "\" does not exist"))
            return obx__fail(OBX_ENODB, "postgres: %s", strstr(msg, "database \""));
        /* retriable: the server may come up later (a bad password stays bad, with a message
         * that says so) */
        return obx__fail(OBX_ECONNLOST, "postgres: cannot connect: %s", msg);
    }
    PQsetNoticeReceiver(conn, pg_notice, NULL);
    if (u->read_only) { /* OBX_STORE_READ_ONLY: the server refuses any write of this session */
        PGresult *r = PQexec(conn, "SET default_transaction_read_only = on");
        bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        if (!ok) {
            obx_err e = obx__fail(OBX_ESTORE, "postgres: cannot make the session read-only: %s",
                                  PQerrorMessage(conn));
            PQfinish(conn);
            return e;
        }
    }
    obx_err e = pg_new(conn, true, out);
    if (e) PQfinish(conn);
    return e;
}

static obx_err pg_wrap(void *conn, obx__store **out) {
    PGconn *c = conn;
    if (!c) return obx__fail(OBX_EINVAL, "pg_conn: NULL");
    if (PQstatus(c) != CONNECTION_OK)
        return obx__fail(OBX_ECONNLOST, "pg_conn: the connection is not open: %s",
                         PQerrorMessage(c));
    const char *enc = pg_encoding_to_char(PQclientEncoding(c));
    if (strcmp(enc, "UTF8"))
        return obx__fail(OBX_EINVAL,
                         "pg_conn: client_encoding is %s; obx exchanges UTF-8 (SET "
                         "client_encoding = 'UTF8')",
                         enc);
    return pg_new(c, false, out);
}

static obx_err pg_schema_version(obx__store *base, int *found) {
    pg_store *s = (pg_store *)base;
    *found = 0;
    obx_err e = obx__pg_ready(s, "schema version");
    if (e) return e;
    PGresult *r = NULL;
    /* to_regclass: a missing table must not raise (it would abort a caller's transaction) */
    e = obx__pg_check(s, PQexec(s->conn, "SELECT to_regclass('obx.obx_meta') IS NOT NULL"),
                      PGRES_TUPLES_OK, &r, "schema version");
    if (e) return e;
    bool present = gb(r, 0, 0);
    PQclear(r);
    if (!present) return OBX_OK;
    e = obx__pg_check(
        s, PQexec(s->conn, "SELECT value FROM obx.obx_meta WHERE key = 'schema_version'"),
        PGRES_TUPLES_OK, &r, "schema version");
    if (e) return e;
    if (PQntuples(r) == 1) *found = (int)gi(r, 0, 0);
    PQclear(r);
    return OBX_OK;
}

/* The schema version, for a relay: first the schema-in-use lock, shared and for the session,
 * then the version, in a statement of its own (a statement's snapshot is taken before a lock it
 * waits for, so a version read in the same statement could be the one a migration just
 * replaced). A migration holds the lock exclusively until it commits: a relay starting during
 * one waits for it, then reads the new version (and refuses it, when it is not its own);
 * `obx init` does not migrate while a relay holds it (migrate_in_tx). Held until the
 * connection closes. */
static obx_err pg_schema_hold(obx__store *base, int *found) {
    pg_store *s = (pg_store *)base;
    *found = 0;
    obx_err e = obx__pg_ready(s, "schema version");
    if (e) return e;
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_lock_shared(%d, %d)", LOCK_CLASS_INIT,
             LOCK_SCHEMA_IN_USE);
    if ((e = obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "schema in use")))
        return e;
    return pg_schema_version(base, found);
}

/* The server's clock (obx__ref_sync): clock_timestamp(), not now(), which is the start of a
 * transaction. */
static obx_err pg_server_ms(obx__store *base, int64_t *out) {
    pg_store *s = (pg_store *)base;
    obx_err e = obx__pg_ready(s, "server clock");
    if (e) return e;
    PGresult *r = NULL;
    e = obx__pg_check(
        s, PQexec(s->conn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"),
        PGRES_TUPLES_OK, &r, "server clock");
    if (e) return e;
    *out = gi(r, 0, 0);
    PQclear(r);
    return OBX_OK;
}

/* Before a migration from version `from` to `to`: the schema-in-use lock, exclusively for this
 * transaction, or OBX_EBUSY naming the sessions that hold it (relays of this database; a
 * session whose client is gone holds it until the server notices, or until
 * pg_terminate_backend ends it). Nothing is changed on refusal. */
static obx_err migrate_exclusive(pg_store *s, int from, int to) {
    char sql[640];
    snprintf(sql, sizeof sql, "SELECT pg_try_advisory_xact_lock(%d, %d)", LOCK_CLASS_INIT,
             LOCK_SCHEMA_IN_USE);
    PGresult *r = NULL;
    obx_err e = obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, &r, "schema in use");
    if (e) return e;
    bool got = gb(r, 0, 0);
    PQclear(r);
    if (got) return OBX_OK;
    /* who holds it: pg_locks is readable by every role; pg_stat_activity shows another role's
     * client address only to its members and pg_read_all_stats (NULL otherwise) */
    snprintf(sql, sizeof sql,
             "SELECT count(*), string_agg(l.pid::text || coalesce(' from ' || "
             "host(a.client_addr), ''), ', ' ORDER BY l.pid) FROM pg_locks l LEFT JOIN "
             "pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
             "AND l.classid = %d AND l.objid = %d AND l.objsubid = 2 AND l.database = (SELECT oid "
             "FROM pg_database WHERE datname = current_database()) AND l.pid <> "
             "pg_backend_pid()",
             LOCK_CLASS_INIT, LOCK_SCHEMA_IN_USE);
    if ((e = obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, &r, "schema in use")))
        return e;
    int64_t n = gi(r, 0, 0);
    char who[256];
    gt(r, 0, 1, who, sizeof who);
    PQclear(r);
    return obx__fail(OBX_EBUSY,
                     "postgres: %lld relay session%s of this database hold%s schema version %d "
                     "(server pids: %s): stop the relays, then run obx init again to migrate to "
                     "version %d (docs/operations.md, \"Upgrading obx\"); a session whose relay "
                     "is gone ends with SELECT pg_terminate_backend(pid)",
                     (long long)n, n == 1 ? "" : "s", n == 1 ? "s" : "", from, who[0] ? who : "?",
                     to);
}

static obx_err pg_begin(obx__store *base);
static obx_err pg_commit(obx__store *base);
static obx_err pg_rollback(obx__store *base);

/* the migration runner's statements (shared.c) */
static obx_err migrate_exec(obx__store *base, const char *sql) {
    pg_store *s = (pg_store *)base;
    return obx__pg_check(s, PQexec(s->conn, sql), PGRES_COMMAND_OK, NULL, "schema migration");
}

/* One DDL statement in a savepoint: true when it ran, false when the server refused it (the
 * transaction goes on as before it). */
static bool try_ddl(pg_store *s, const char *sql) {
    if (migrate_exec(&s->base, "SAVEPOINT obx_ddl")) return false;
    if (!migrate_exec(&s->base, sql)) return !migrate_exec(&s->base, "RELEASE SAVEPOINT obx_ddl");
    obx__clear_error();
    (void)migrate_exec(&s->base, "ROLLBACK TO SAVEPOINT obx_ddl");
    return false;
}

/* The obx_pg extension as this schema version needs it, the first two columns of a query that
 * starts with EXT_COLS (its $1: the version): whether the server has the extension's files of
 * version OBX__SCHEMA_VERSION, and the database's extension version (NULL: none). */
#define EXT_COLS                                                                                   \
    "EXISTS (SELECT 1 FROM pg_available_extension_versions WHERE name = 'obx_pg' AND version = "   \
    "$1::text), (SELECT extversion FROM pg_extension WHERE extname = 'obx_pg')"
typedef struct ext_state {
    char ver[16];     /* OBX__SCHEMA_VERSION as text: the version this obx needs */
    bool avail;       /* the server has its files */
    const char *have; /* the database's version (in *r), NULL when it has none */
} ext_state;

/* Runs sql (SELECT EXT_COLS, ...) into *r (the caller clears it) and reads its first columns. */
static obx_err ext_query(pg_store *s, const char *sql, const char *what, ext_state *x,
                         PGresult **r) {
    snprintf(x->ver, sizeof x->ver, "%d", OBX__SCHEMA_VERSION);
    const char *v[1] = {x->ver};
    obx_err e = obx__pg_check(s, PQexecParams(s->conn, sql, 1, NULL, v, NULL, NULL, 0),
                              PGRES_TUPLES_OK, r, what);
    if (e) return e;
    x->avail = gb(*r, 0, 0);
    x->have = PQgetisnull(*r, 0, 1) ? NULL : PQgetvalue(*r, 0, 1);
    return OBX_OK;
}

/* obx.enqueue()'s body (schema.sql, obx._point_enqueue): obx._enqueue_c() of the obx_pg extension
 * when the server has the extension's files of this schema version (OBX__SCHEMA_VERSION is the
 * extension's version, and its library is named for it: CMakeLists.txt) and the database has the
 * extension at that version, or this user may create it or update it to that version (a trusted
 * extension: CREATE on the database; the update: its owner); else obx._enqueue_sql(). So a
 * database whose server lost the files, or has only another obx version's, runs the PL/pgSQL
 * body rather than C code built for another schema. Decided at every init, by whoever owns
 * obx.enqueue(): a server that gains the extension uses it from the next `obx init`, and a relay
 * started with a role of its own (cmd_relay.c runs init) changes nothing. The choice is in obx_meta
 * (enqueue_impl), for operators, the benches and the tests (docs/postgres.md, "The obx_pg
 * extension"). */
static obx_err enqueue_impl(pg_store *s) {
    ext_state x = {0};
    PGresult *r = NULL;
    obx_err e = ext_query(s,
                          "SELECT " EXT_COLS ", p.prosrc LIKE '%obx._enqueue_c(%', "
                          "pg_has_role(p.proowner, 'MEMBER') FROM pg_proc p WHERE p.oid = "
                          "'obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, "
                          "text, text, timestamptz, timestamptz)'::regprocedure",
                          "enqueue body", &x, &r);
    if (e) return e;
    bool have = x.have != NULL, same = have && !strcmp(x.have, x.ver), uses_c = gb(r, 0, 2),
         owner = gb(r, 0, 3);
    PQclear(r);
    if (!owner) return OBX_OK;
    char ddl[96];
    snprintf(ddl, sizeof ddl,
             have ? "ALTER EXTENSION obx_pg UPDATE TO '%s'"
                  : "CREATE EXTENSION obx_pg VERSION '%s'",
             x.ver);
    bool c = x.avail && (same || try_ddl(s, ddl));
    char sql[160];
    snprintf(sql, sizeof sql, "SELECT obx._point_enqueue(%s)", c ? "true" : "false");
    if (c != uses_c &&
        (e = obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "enqueue body")))
        return e;
    /* written only when it changes: an init (every relay start by the owner) writes nothing */
    char meta[320];
    snprintf(meta, sizeof meta,
             "INSERT INTO obx.obx_meta (key, value) SELECT 'enqueue_impl', '%s' WHERE NOT EXISTS "
             "(SELECT 1 FROM obx.obx_meta WHERE key = 'enqueue_impl' AND value = '%s') ON "
             "CONFLICT (key) DO UPDATE SET value = excluded.value",
             c ? "c" : "sql", c ? "c" : "sql");
    return migrate_exec(&s->base, meta);
}

/* obx_store_producer_body: enqueue_impl's choice, and why the PL/pgSQL body runs when it does
 * (the same conditions, read again: the server's files, the database's extension). */
static obx_err pg_producer_body(obx__store *base, char *buf, size_t cap) {
    pg_store *s = (pg_store *)base;
    ext_state x = {0};
    PGresult *r = NULL;
    obx_err e = ext_query(s,
                          "SELECT " EXT_COLS ", (SELECT value FROM obx.obx_meta WHERE key = "
                          "'enqueue_impl')",
                          "producer body", &x, &r);
    if (e) return e;
    if (!strcmp(PQgetvalue(r, 0, 2), "c"))
        snprintf(buf, cap, "obx.enqueue() runs in C (the obx_pg extension, version %s)",
                 x.have ? x.have : "?");
    else if (!x.avail)
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: this server has no obx_pg files of "
                 "version %s (scripts/pg_ext.sh on the server, then obx init again)",
                 x.ver);
    else if (x.have && strcmp(x.have, x.ver))
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: the database's obx_pg is version %s and "
                 "this init could not update it (obx init as the extension's owner)",
                 x.have);
    else if (!x.have)
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: this init could not create the obx_pg "
                 "extension (obx init as a user with CREATE on the database)");
    else
        snprintf(buf, cap,
                 "obx.enqueue() runs its PL/pgSQL body: obx init as the owner of obx.enqueue() "
                 "points it at the obx_pg extension");
    PQclear(r);
    return OBX_OK;
}

/* The schema obx as init trusts it: owned by the role running init, by a superuser, or by a role
 * it is a member of (for a superuser, membership means nothing: it is a member of every role).
 * The owner of a schema may replace any function in it, obx.enqueue()'s body included, which
 * every producer then runs with obx.enqueue()'s owner's rights (docs/security.md, "Creating the
 * schema"). schema.sql checks it again after its CREATE SCHEMA, for one made in between. */
#define FOREIGN_SCHEMA_SQL                                                                         \
    "SELECT o.rolname, current_user FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner "    \
    "WHERE n.nspname = 'obx' AND NOT o.rolsuper AND o.rolname <> current_user AND (NOT "           \
    "pg_has_role(current_user, o.oid, 'MEMBER') OR (SELECT rolsuper FROM pg_roles WHERE "          \
    "rolname = current_user))"

/* OBX_EREFUSED, naming the owner, when a schema obx exists that init does not trust. */
static obx_err schema_owned(pg_store *s) {
    PGresult *r = NULL;
    obx_err e =
        obx__pg_check(s, PQexec(s->conn, FOREIGN_SCHEMA_SQL), PGRES_TUPLES_OK, &r, "schema owner");
    if (e) return e;
    char owner[OBX_NAME_MAX + 1] = "", me[OBX_NAME_MAX + 1] = "";
    bool foreign = PQntuples(r) == 1;
    if (foreign) {
        gt(r, 0, 0, owner, sizeof owner);
        gt(r, 0, 1, me, sizeof me);
    }
    PQclear(r);
    if (!foreign) return OBX_OK;
    return obx__fail(OBX_EREFUSED,
                     "postgres: the schema obx is owned by role %s, which %s, who runs obx init, "
                     "neither is nor belongs to: its owner could replace the functions every "
                     "producer runs; obx uses only a schema it made (DROP SCHEMA obx as %s if it "
                     "is empty, or run obx init as %s)",
                     owner, me, owner, owner);
}

/* The migration in the caller's transaction, to version `last` by scripts[1..last]. */
static obx_err migrate_in_tx(pg_store *s, const char *const *scripts, int last) {
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_xact_lock(%d, 0)", LOCK_CLASS_INIT);
    PGresult *r = NULL;
    obx_err e = obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "init lock");
    if (e) return e;
    /* canonical encodings hash UTF-8 bytes: the database must store UTF-8 */
    e = obx__pg_check(s,
                      PQexec(s->conn, "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE "
                                      "datname = current_database()"),
                      PGRES_TUPLES_OK, &r, "database encoding");
    if (e) return e;
    char enc[32];
    gt(r, 0, 0, enc, sizeof enc);
    PQclear(r);
    if (strcmp(enc, "UTF8"))
        return obx__fail(OBX_ECONFIG,
                         "postgres: database encoding is %s; obx needs a UTF8 database "
                         "(CREATE DATABASE ... ENCODING 'UTF8')",
                         enc);
    if ((e = schema_owned(s))) return e;
    /* a migration waits for no relay and runs under none (pg_schema_hold) */
    int from = 0;
    if ((e = pg_schema_version(&s->base, &from))) return e;
    if (from > 0 && from < last && (e = migrate_exclusive(s, from, last))) return e;
    e = obx__migrate_run(&s->base, from, scripts, last, "obx.obx_meta", migrate_exec);
    return e ? e : enqueue_impl(s);
}

obx_err obx__pg_migrate_to(obx__store *base, const char *const *scripts, int last) {
    pg_store *s = (pg_store *)base;
    obx_err e = pg_begin(base);
    if (e) return e;
    e = migrate_in_tx(s, scripts, last);
    if (e) {
        pg_rollback(base);
        return e;
    }
    return pg_commit(base);
}

/* Versioned migrations in one transaction (DDL is transactional in PostgreSQL) under an advisory
 * lock, so that two concurrent `obx init` do not both create the schema. */
static obx_err pg_migrate(obx__store *base) {
    return obx__pg_migrate_to(base, migrations, OBX__SCHEMA_VERSION);
}

OBX__TX_METHODS(pg, pg_store, obx__pg_tx)

/* ---- roles ---------------------------------------------------------------------------------- */

static obx_err pg_create_roles(obx__store *base, const char *prefix) {
    pg_store *s = (pg_store *)base;
    obx_err e = pg_begin(base);
    if (e) return e;
    const char *v[1] = {prefix};
    e = obx__pg_check(
        s, PQexecParams(s->conn, "SELECT obx.create_roles($1::text)", 1, NULL, v, NULL, NULL, 0),
        PGRES_TUPLES_OK, NULL, "create roles");
    if (e) {
        pg_rollback(base);
        return e;
    }
    return pg_commit(base);
}

static const obx__store_inbox_methods pg_inbox_methods = {
    .version = OBX__STORE_INBOX_VERSION,
    .inbox_get = obx__pg_inbox_get,
    .inbox_put = obx__pg_inbox_put,
    .inbox_finish = obx__pg_inbox_finish,
    .inbox_has = obx__pg_inbox_has,
    .watermark_put = obx__pg_watermark_put,
    .watermark_list = obx__pg_watermark_list,
    .failure_bump = obx__pg_failure_bump,
    .failure_get = obx__pg_failure_get,
    .failure_clear = obx__pg_failure_clear,
    .retry_copy_put = obx__pg_retry_copy_put,
    .retry_copy_list = obx__pg_retry_copy_list,
    .retry_copy_del = obx__pg_retry_copy_del,
    .poison_put = obx__pg_poison_put,
    .poison_list = obx__pg_poison_list,
    .poison_get = obx__pg_poison_get,
    .poison_set_state = obx__pg_poison_set_state,
    .inbox_quarantine_put = obx__pg_inbox_quarantine_put,
    .consume_audit_put = obx__pg_consume_audit_put,
    .consume_audit_list = obx__pg_consume_audit_list,
};

static const obx__store_read_methods pg_read_methods = {
    .version = OBX__STORE_READ_VERSION,
    .counter_get = obx__pg_counter_get,
    .stats = obx__pg_stats,
    .invariants = obx__pg_invariants,
    .unknown_resolutions = obx__pg_unknown_resolutions,
    .delivery_open = obx__pg_delivery_open,
    .unserved = obx__pg_unserved,
    .aged = obx__pg_aged,
    .delivery_stats = obx__pg_delivery_stats,
    .receipt_details = obx__pg_receipt_details,
    .receipts_by_kind = obx__pg_receipts_by_kind,
    .recent_published = obx__pg_recent_published,
    .envelope_at = obx__pg_envelope_at,
};

const obx__store_methods obx__pg_store_methods = {
    .version = OBX__STORE_METHODS_VERSION,
    .name = "postgres",
    .open = pg_open,
    .wrap = pg_wrap,
    .close = pg_close,
    .schema_version = pg_schema_version,
    .migrate = pg_migrate,
    .begin = pg_begin,
    .commit = pg_commit,
    .rollback = pg_rollback,
    .route_put = obx__pg_route_put,
    .route_get = obx__pg_route_get,
    .route_list = obx__pg_route_list,
    .idem_lookup = obx__pg_idem_lookup,
    .insert_event = obx__pg_insert_event,
    .insert_envelope = obx__pg_insert_envelope,
    .read_events = obx__pg_read_events,
    .update_events = obx__pg_update_events,
    .insert_attempts = obx__pg_insert_attempts,
    .update_attempts = obx__pg_update_attempts,
    .load_attempts = obx__pg_load_attempts,
    .insert_receipts = obx__pg_insert_receipts,
    .load_receipts = obx__pg_load_receipts,
    .insert_audit = obx__pg_insert_audit,
    .load_audit = obx__pg_load_audit,
    .counter_add = obx__pg_counter_add,
    .wait_for_work = obx__pg_wait_for_work,
    .write_set = obx__pg_write_set,
    .load_slots = obx__pg_load_slots,
    .cluster_put = obx__pg_cluster_put,
    .cluster_get = obx__pg_cluster_get,
    .series_put = obx__pg_series_put,
    .series_list = obx__pg_series_list,
    .serve_dispatch = obx__pg_serve_dispatch,
    .create_roles = pg_create_roles,
    .producer_body = pg_producer_body,
    .schema_hold = pg_schema_hold,
    .server_ms = pg_server_ms,
    .route_get_txid = obx__pg_route_get_txid,
    .insert_event_audit = obx__pg_insert_event_audit,
    .enqueue_write = obx__pg_enqueue_write,
    .purge_payloads = obx__pg_purge_payloads,
    .route_set_put = obx__pg_route_set_put,
    .route_set_get = obx__pg_route_set_get,
    .delivery_put = obx__pg_delivery_put,
    .delivery_get = obx__pg_delivery_get,
    .set_alias = obx__pg_set_alias,
    .inbox = &pg_inbox_methods,
    .read = &pg_read_methods,
};

/*
 * pg_wake.c — waiting for work on PostgreSQL (wait_for_work) and the wake lock.
 *
 * Contracts (numbered as in pg_store.c):
 *   8. wait_for_work LISTENs on channel obx_work (on first use) and polls the socket; the
 *      statement inserting an event NOTIFYs (delivered at commit; Q_INS_EVENT, obx.enqueue())
 *      while a relay of the event's cluster waits for work (NOTIFY_EXPR, the wake lock).
 *      A notification is a hint, never a row. Where the database has the obx_pg extension the
 *      wait is spent in the server (server_wait), and obx.enqueue()'s C body wakes it by its
 *      latch after the commit instead of a NOTIFY, which serializes commits.
 *
 * The wake lock (LOCK_CLASS_WAKE, pg_int.h) is held by this session from its wait until a
 * claim takes a whole batch (pg_read.c), and released when the cluster it claims for changes.
 */
#include "store/postgres/pg_int.h"

#include <errno.h>
#include <poll.h>

/* ---- idle wait (contract 8) ------------------------------------------------------------------ */

/* Releases the wake lock (a claim took a whole batch; the cluster changed). */
obx_err obx__pg_wake_release(pg_store *s) {
    char sql[96];
    snprintf(sql, sizeof sql, "SELECT pg_advisory_unlock(%s, %ld)", LOCK_CLASS_WAKE,
             (long)s->wake_key);
    s->wake_held = false;
    return obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, NULL, "release the wake lock");
}

/* A claim for `cluster` (NULL: every cluster) on this connection: the wake lock it waits on is
 * that cluster's from now on. */
obx_err obx__pg_wake_follow(pg_store *s, const char *cluster) {
    const char *c = cluster ? cluster : "";
    if (!strcmp(c, s->wake_cluster)) return OBX_OK;
    obx_err e = s->wake_held ? obx__pg_wake_release(s) : OBX_OK;
    obx__strlcpy(s->wake_cluster, c, sizeof s->wake_cluster);
    s->wake_key_known = false;
    return e;
}

/* Takes the wake lock of this connection's cluster for up to timeout_ms (0: only if free now).
 * *got: held now. Waiting (rather than trying once) matters: the lock is busy while a producer
 * that did not notify is between its statement and its commit, which under load is most of the
 * time, and a waiting exclusive request makes every later producer notify. A session lock taken
 * in a transaction outlives it; lock_timeout is the transaction's own. */
static obx_err wake_take(pg_store *s, int timeout_ms, bool *got) {
    *got = false;
    obx_err e;
    if (!s->wake_key_known) {
        const char *v[1] = {s->wake_cluster};
        PGresult *r = NULL;
        if ((e = obx__pg_check(
                 s, PQexecParams(s->conn, "SELECT hashtext($1::text)", 1, NULL, v, NULL, NULL, 0),
                 PGRES_TUPLES_OK, &r, "the wake lock's key")))
            return e;
        s->wake_key = (int32_t)strtol(PQgetvalue(r, 0, 0), NULL, 10);
        s->wake_key_known = true;
        PQclear(r);
    }
    char sql[200];
    if (timeout_ms <= 0)
        snprintf(sql, sizeof sql, "SELECT pg_try_advisory_lock(%s, %ld)", LOCK_CLASS_WAKE,
                 (long)s->wake_key);
    else
        snprintf(sql, sizeof sql,
                 "BEGIN; SET LOCAL lock_timeout = %d; SELECT pg_advisory_lock(%s, %ld), true; "
                 "COMMIT",
                 timeout_ms, LOCK_CLASS_WAKE, (long)s->wake_key);
    PGresult *r = PQexec(s->conn, sql);
    ExecStatusType st = PQresultStatus(r);
    const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (timeout_ms > 0 && st == PGRES_FATAL_ERROR && code && !strcmp(code, "55P03")) {
        /* lock_timeout: still busy; the transaction it ended is rolled back */
        PQclear(r);
        return obx__pg_check(s, PQexec(s->conn, "ROLLBACK"), PGRES_COMMAND_OK, NULL,
                             "wait for the wake lock");
    }
    if (timeout_ms > 0) {
        /* the last result is COMMIT's */
        if ((e = obx__pg_check(s, r, PGRES_COMMAND_OK, NULL, "wait for the wake lock"))) {
            if (PQstatus(s->conn) == CONNECTION_OK && PQtransactionStatus(s->conn) != PQTRANS_IDLE)
                PQclear(PQexec(s->conn, "ROLLBACK"));
            return e;
        }
        *got = true;
    } else {
        if ((e = obx__pg_check(s, r, PGRES_TUPLES_OK, &r, "take the wake lock"))) return e;
        *got = !strcmp(PQgetvalue(r, 0, 0), "t");
        PQclear(r);
    }
    s->wake_held = *got;
    return OBX_OK;
}

/* The shortest wait spent in the server (server_wait): the relay's turns of a few
 * milliseconds between a broker's outcomes poll the socket instead of sending a statement each. */
#define SERVER_WAIT_MIN_MS 20

/* The idle wait in the server: obx._wait_for_work() returns when a producer's commit sets this
 * backend's latch (obx_pg.c: the producers that find the wake lock held name its holders and
 * wake them after their commit, with no NOTIFY and so no commit queue; a NOTIFY to this LISTENing
 * session sets the latch too), or at its timeout (at most 1 s). *woke: the latch was set.
 * Without the extension (wait_fn -1) the caller polls the socket for the NOTIFY. */
static obx_err server_wait(pg_store *s, int ms, bool *woke) {
    *woke = false;
    PGresult *r = NULL;
    obx_err e;
    if (!s->wait_fn) {
        if ((e = obx__pg_check(s,
                               PQexec(s->conn,
                                      "SELECT to_regprocedure('obx._wait_for_work(integer)') "
                                      "IS NOT NULL"),
                               PGRES_TUPLES_OK, &r, "look up obx._wait_for_work")))
            return e;
        s->wait_fn = !strcmp(PQgetvalue(r, 0, 0), "t") ? 1 : -1;
        PQclear(r);
    }
    if (s->wait_fn < 0) return OBX_OK;
    char sql[64];
    snprintf(sql, sizeof sql, "SELECT obx._wait_for_work(%d)", ms > 1000 ? 1000 : ms);
    if ((e = obx__pg_check(s, PQexec(s->conn, sql), PGRES_TUPLES_OK, &r, "wait for work")))
        return e;
    *woke = !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    return OBX_OK;
}

/* How long a wait that also watches a broker's descriptor waits for the wake lock: the
 * server-side wait cannot watch the descriptor, so it stays as short as the relay's turns were
 * (relay.c, idle_wait). */
#define WAKE_TAKE_WITH_FD_MS 2

obx_err obx__pg_wait_for_work(obx__store *base, int timeout_ms, int also_fd, bool *notified) {
    pg_store *s = (pg_store *)base;
    *notified = false;
    if (s->tx.depth > 0 ||
        (PQstatus(s->conn) == CONNECTION_OK && PQtransactionStatus(s->conn) != PQTRANS_IDLE))
        return obx__fail(OBX_EINVAL, "wait_for_work: called inside a transaction (a "
                                     "notification is only delivered between transactions)");
    obx_err e = obx__pg_ready(s, "wait for work");
    if (e) return e;
    if (!s->listening) {
        if ((e = obx__pg_exec_simple(s, "LISTEN " NOTIFY_CHANNEL, "listen"))) return e;
        s->listening = true;
    }
    int64_t deadline = obx__mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    if (s->wake_cluster[0] && !s->wake_held) {
        /* Producers notify only while this lock is held. One that tested it before we took it
         * committed before we could, after our last claim began perhaps: look again (notified)
         * before sleeping on the lock. Not taken in time: producers are still in flight, or
         * another relay of the cluster waits (its wake-ups reach us too); the caller's next
         * turn tries again. */
        bool got = false;
        int wait =
            also_fd >= 0 && timeout_ms > WAKE_TAKE_WITH_FD_MS ? WAKE_TAKE_WITH_FD_MS : timeout_ms;
        if ((e = wake_take(s, wait, &got))) return e;
        if (got) {
            *notified = true;
            return OBX_OK;
        }
        /* without the lock producers may not notify: the caller's next turn tries again */
        if (also_fd >= 0) return OBX_OK;
    }
    /* also_fd turned readable: the broker's turn, once the hints that came are read */
    bool fd_ready = false;
    for (;;) {
        if (!PQconsumeInput(s->conn)) return obx__pg_map_error(s, NULL, "wait for work");
        PGnotify *nt;
        while ((nt = PQnotifies(s->conn)) != NULL) {
            if (!strcmp(nt->relname, NOTIFY_CHANNEL)) *notified = true;
            PQfreemem(nt);
        }
        if (*notified || fd_ready) return OBX_OK;
        int64_t left = deadline - obx__mono_ms();
        if (left <= 0) return OBX_OK;
        if (also_fd < 0 && left >= SERVER_WAIT_MIN_MS && s->wait_fn >= 0) {
            bool woke = false;
            if ((e = server_wait(s, (int)left, &woke))) return e;
            if (woke) *notified = true;
            if (s->wait_fn > 0) continue; /* the notifications that came are read first */
        }
        struct pollfd pfd[2] = {{.fd = PQsocket(s->conn), .events = POLLIN},
                                {.fd = also_fd, .events = POLLIN}};
        if (pfd[0].fd < 0) return obx__pg_map_error(s, NULL, "wait for work");
        int rc = poll(pfd, also_fd >= 0 ? 2 : 1, left > 60000 ? 60000 : (int)left);
        if (rc < 0 && errno != EINTR)
            return obx__fail(OBX_EIO, "wait for work: poll: %s", strerror(errno));
        fd_ready = rc > 0 && also_fd >= 0 && pfd[1].revents;
    }
}

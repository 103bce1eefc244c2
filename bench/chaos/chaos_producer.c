/*
 * chaos_producer.c — the C producer of the chaos soak (scripts/chaos.sh, docs/reliability.md).
 * A business service as a user writes one: each order is one PostgreSQL transaction on its own
 * libpq connection that inserts the order row, enqueues its event(s) with obx_enqueue() on the
 * borrowed connection (obx_store_wrap_pg) and records each returned event ID in the producer's
 * own ledger table, then commits — or, for a seeded share of orders, rolls everything back
 * after the enqueue (the event must then never appear anywhere).
 *
 * The producer keeps a second ledger of its own in a file, one line per decided order:
 *   C <order_id> <event_id>[,<event_id>] <unix_ms>    committed (COMMIT returned OK, or the
 *                                                     order row was found after a lost COMMIT)
 *   R <order_id> <event_id>[,<event_id>] <unix_ms>    rolled back on purpose after the enqueue
 * The verifier checks it against the ledger table: a C line without its rows, or an R line
 * with rows, is a ledger mismatch.
 *
 * Faults it lives through: the database stopped or cut (connect/statement errors: reconnect
 * with back-off and retry the same order with the same idempotency key), a COMMIT whose
 * outcome is unknown (reconnect and look the order up: present = committed, absent = retry).
 * Uses only the public API (obx.h) and libpq.
 *
 *   chaos_producer --db URL --name NAME --ledger FILE [--rate ORDERS_PER_S] [--seed S]
 *                  [--rollback-permille N] [--payment-permille N] [--max-orders N]
 * Runs until SIGTERM/SIGINT (finishes the order in hand) or --max-orders; prints its counts.
 */
#include <obx.h>

#include <libpq-fe.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static uint64_t rng_state;
static uint64_t rnd(void) { /* xorshift64*: seeded, reproducible order contents */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR && !stop) {
    }
}

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "chaos_producer: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* One order: its contents are drawn once, so a retry after a failure sends the same bytes with
 * the same idempotency keys. */
typedef struct order {
    char id[64];
    char tenant[8];
    long amount;
    int with_payment;
    int rollback;
    char payload[2][640];
    char event_id[2][OBX_EVENT_ID_LEN + 1];
} order;

static void draw_order(order *o, const char *name, long n, int rollback_pm, int payment_pm) {
    memset(o, 0, sizeof *o);
    snprintf(o->id, sizeof o->id, "%s-%07ld", name, n);
    snprintf(o->tenant, sizeof o->tenant, "t%d", (int)(rnd() % 3) + 1);
    o->amount = (long)(rnd() % 100000) + 1;
    o->with_payment = (int)(rnd() % 1000) < payment_pm;
    o->rollback = (int)(rnd() % 1000) < rollback_pm;
    char note[420];
    size_t nl = 16 + rnd() % 380;
    for (size_t i = 0; i < nl; i++) note[i] = (char)('a' + rnd() % 26);
    note[nl] = '\0';
    snprintf(o->payload[0], sizeof o->payload[0],
             "{\"order\":\"%s\",\"amount\":%ld,\"tenant\":\"%s\",\"note\":\"%s\"}", o->id,
             o->amount, o->tenant, note);
    snprintf(o->payload[1], sizeof o->payload[1],
             "{\"order\":\"%s\",\"payment\":\"pay-%s\",\"amount\":%ld}", o->id, o->id, o->amount);
}

static PGconn *conn;
static obx_store *store;

static void disconnect(void) {
    obx_store_close(store);
    store = NULL;
    if (conn) PQfinish(conn);
    conn = NULL;
}

/* Connects (or keeps the connection); 0 when usable. */
static int ensure_conn(const char *url) {
    if (conn && PQstatus(conn) == CONNECTION_OK) return 0;
    disconnect();
    conn = PQconnectdb(url);
    if (PQstatus(conn) != CONNECTION_OK) {
        say("connect: %s", PQerrorMessage(conn));
        disconnect();
        return -1;
    }
    if (obx_store_wrap_pg(conn, &store) != OBX_OK) {
        say("obx_store_wrap_pg: %s", obx_errmsg());
        disconnect();
        return -1;
    }
    return 0;
}

/* Runs a command; 0 on success. *sqlstate (may be NULL) gets the error's SQLSTATE. */
static int exec_params(const char *sql, int n, const char *const *vals, char *sqlstate) {
    PGresult *r = PQexecParams(conn, sql, n, NULL, vals, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) {
        const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        if (sqlstate) snprintf(sqlstate, 6, "%s", s ? s : "");
        say("%.60s...: %s", sql, PQerrorMessage(conn));
    }
    PQclear(r);
    return ok ? 0 : -1;
}

/* After a failure whose outcome is unknown: does the order row exist? 1 yes (the event IDs of
 * the committed transaction are read back into o), 0 no, -1 cannot tell now. */
static int order_committed(const char *url, order *o) {
    if (ensure_conn(url)) return -1;
    const char *v[1] = {o->id};
    PGresult *r = PQexecParams(conn,
                               "SELECT event_id, event_type FROM chaos_ledger WHERE order_id = $1 "
                               "ORDER BY event_type",
                               1, NULL, v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        PQclear(r);
        disconnect();
        return -1;
    }
    int n = PQntuples(r);
    for (int i = 0; i < n && i < 2; i++)
        snprintf(o->event_id[i], sizeof o->event_id[i], "%s", PQgetvalue(r, i, 0));
    PQclear(r);
    return n > 0;
}

enum { DONE_COMMITTED, DONE_ROLLED_BACK, RETRY };

/* One attempt at the order's transaction. */
static int attempt(const char *url, order *o) {
    if (ensure_conn(url)) return RETRY;
    char state[6] = "";
    char amount[32];
    snprintf(amount, sizeof amount, "%ld", o->amount);
    if (exec_params("BEGIN", 0, NULL, NULL)) goto broken;
    const char *ov[2] = {o->id, amount};
    if (exec_params("INSERT INTO chaos_order (order_id, producer, amount) VALUES ($1, "
                    "split_part($1, '-', 1), $2::bigint)",
                    2, ov, state)) {
        exec_params("ROLLBACK", 0, NULL, NULL);
        /* 23505: the order row exists, i.e. a COMMIT whose reply was lost did commit */
        if (!strcmp(state, "23505") && order_committed(url, o) == 1) return DONE_COMMITTED;
        goto broken;
    }
    int nev = o->with_payment ? 2 : 1;
    for (int i = 0; i < nev; i++) {
        char idem[96];
        snprintf(idem, sizeof idem, "%s:%s", o->id, i ? "payment" : "created");
        obx_event ev = {.event_type = i ? "payment.captured.v1" : "order.created.v1",
                        .aggregate_type = i ? "payment" : "order",
                        .aggregate_id = o->id,
                        .aggregate_version = 1,
                        .tenant = o->tenant,
                        .payload = o->payload[i],
                        .payload_len = strlen(o->payload[i]),
                        .correlation_id = o->id,
                        .idempotency_key = idem};
        obx_enqueue_result res;
        obx_err e = obx_enqueue(store, &ev, &res);
        if (e != OBX_OK) {
            say("obx_enqueue %s: %s: %s", o->id, obx_errname(e), obx_errmsg());
            exec_params("ROLLBACK", 0, NULL, NULL);
            goto broken;
        }
        snprintf(o->event_id[i], sizeof o->event_id[i], "%s", res.event_id);
        const char *lv[6] = {res.event_id,      o->id,        ev.event_type, o->tenant,
                             ev.aggregate_type, o->payload[i]};
        if (exec_params("INSERT INTO chaos_ledger (event_id, order_id, producer, event_type, "
                        "tenant, aggregate_type, aggregate_id, payload) VALUES ($1, $2, "
                        "split_part($2, '-', 1), $3, $4, $5, $2, convert_to($6, 'UTF8'))",
                        6, lv, NULL)) {
            exec_params("ROLLBACK", 0, NULL, NULL);
            goto broken;
        }
    }
    if (o->rollback) {
        if (exec_params("ROLLBACK", 0, NULL, NULL)) goto broken; /* nothing committed anyway */
        return DONE_ROLLED_BACK;
    }
    if (exec_params("COMMIT", 0, NULL, NULL) == 0) return DONE_COMMITTED;
    /* the COMMIT's outcome is unknown: look it up on a fresh connection */
    disconnect();
    for (;;) {
        int c = order_committed(url, o);
        if (c == 1) return DONE_COMMITTED;
        if (c == 0) return RETRY;
        if (stop) return RETRY; /* cannot tell: the order stays undecided in the file */
        sleep_s(0.5);
    }
broken:
    if (PQstatus(conn) != CONNECTION_OK) disconnect();
    return RETRY;
}

int main(int argc, char **argv) {
    const char *url = NULL, *name = "c", *ledger_path = NULL;
    double rate = 10;
    int rollback_pm = 50, payment_pm = 400;
    long max_orders = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "chaos_producer: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--db"))
            url = v;
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--ledger"))
            ledger_path = v;
        else if (!strcmp(a, "--rate"))
            rate = atof(v);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--rollback-permille"))
            rollback_pm = atoi(v);
        else if (!strcmp(a, "--payment-permille"))
            payment_pm = atoi(v);
        else if (!strcmp(a, "--max-orders"))
            max_orders = atol(v);
        else {
            fprintf(stderr, "chaos_producer: unknown option %s\n", a);
            return 2;
        }
    }
    if (!url || !ledger_path || rate <= 0 || strchr(name, '-')) {
        fprintf(stderr, "usage: chaos_producer --db URL --name NAME(no '-') --ledger FILE "
                        "[--rate R>0] [--seed S] [--rollback-permille N] [--payment-permille N] "
                        "[--max-orders N]\n");
        return 2;
    }
    rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
    FILE *ledger = fopen(ledger_path, "a");
    if (!ledger) {
        perror(ledger_path);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    long committed = 0, rolled_back = 0, retries = 0;
    double t0 = mono();
    for (long n = 1; !stop && (!max_orders || n <= max_orders); n++) {
        order o;
        draw_order(&o, name, n, rollback_pm, payment_pm);
        int r;
        double backoff = 0.1;
        while ((r = attempt(url, &o)) == RETRY && !stop) {
            retries++;
            sleep_s(backoff);
            backoff = backoff < 2 ? backoff * 2 : 2;
        }
        if (r == RETRY) break; /* stopped with the order undecided: not in the file */
        fprintf(ledger, "%c %s %s%s%s %lld\n", r == DONE_COMMITTED ? 'C' : 'R', o.id, o.event_id[0],
                o.event_id[1][0] ? "," : "", o.event_id[1], (long long)now_ms());
        fflush(ledger);
        if (r == DONE_COMMITTED)
            committed++;
        else
            rolled_back++;
        sleep_s(t0 + (double)n / rate - mono()); /* the offered rate, not faster after a stall */
    }
    fclose(ledger);
    disconnect();
    say("%s: %ld orders committed, %ld rolled back, %ld retried transactions", name, committed,
        rolled_back, retries);
    return 0;
}

/*
 * test_fault_loops.c — fault loops in the style of SQLite's I/O-error tests, over one whole
 * dispatch cycle: enqueue (with idempotency keys), claim + send, poll + accept, sweep of
 * expired leases, reconcile (lookup, acceptance, retry), poll of the retries, and a consumer
 * that applies the events through the inbox (its effect is a row in its own database, written
 * in the inbox's transaction). The broker is the local log broker with lost, timed-out,
 * rejected and duplicated ACKs and lost requests, so that every engine path runs; the stores
 * are SQLite in memory; the clock is virtual.
 *
 * For k = 1, 2, ...: build a fresh world, arm a fault at the k-th call, run the cycle, disarm.
 * The loop ends when a cycle completes without reaching k. After every run:
 *   - every failing step returned the injected error (OBX_EIO, OBX_EBROKER, OBX_ENOMEM), never
 *     another code and never a crash;
 *   - an enqueue that failed stored nothing (it is retried with its idempotency key);
 *   - the faults are then switched off and recovery rounds run (leases expire, the sweeper
 *     and the reconciler take over): every event ends PUBLISHED with exactly one primary
 *     receipt naming an ACCEPTED attempt, no event is lost or doubled, every attempt ends in
 *     a final state (accounted for), every audited transition is in the table, the store's
 *     invariant checks find nothing, and the consumer applied every event exactly once;
 *   - in ASan builds, LeakSanitizer checks for leaks after each loop (its report names the
 *     allocation); OBX_FAULT_LOOP_LEAK_EACH=1 checks after every k instead, to find the k
 *     (about 90 ms of CPU per check: too slow to be the default).
 *
 * Every store and broker call of the engine, the drivers and the CLI goes through the wrappers
 * (scripts/check_layers.sh), so the loops reach the producer's enqueue, the inbox and the
 * consumer too; each loop checks that it failed the methods of those paths (check_reach).
 *
 * Loops: the k-th store call fails (obx__st_fault_after); every store call from the k-th on
 * fails (obx__st_fault_from, an outage mid-cycle); the k-th broker call fails
 * (obx__br_fault_after); the k-th allocation fails — malloc, calloc, realloc and strdup of
 * the library's own objects are wrapped at link time (-Wl,--wrap=..., tests/CMakeLists.txt).
 * Allocations inside shared libraries (SQLite, jansson) are not counted: jansson 2.14 aborts
 * (assert in lex_scan_string) when an allocation fails while it lexes a string, so routing
 * its allocator here would test jansson, not obx (docs/security.md, known limits).
 *
 * Failing k found and fixed (each a regression test now):
 *   store call k=117, store outage from k=35, allocation k=192: the consumer loop did not
 *     redeliver a delivery whose inbox transaction failed (or whose ack failed); the next
 *     acks moved the committed position past it and the event was never applied
 *     (src/drivers/consumer.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/engine.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LEAK_CHECK() __lsan_do_recoverable_leak_check()
#else
#define LEAK_CHECK() 0
#endif

obx_err obx__log_broker_set(obx__broker *base, const char *knob, const char *value);

/* ---- the allocation counter ------------------------------------------------------------------ */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t sz);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);

static long alloc_at;  /* 0: off */
static long alloc_n;   /* allocations counted since arming */
static bool alloc_hit; /* the k-th allocation was refused */

static bool refuse(void) {
    if (!alloc_at) return false;
    if (++alloc_n != alloc_at) return false;
    alloc_hit = true;
    return true;
}

void *__wrap_malloc(size_t n);
void *__wrap_malloc(size_t n) { return refuse() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t sz);
void *__wrap_calloc(size_t n, size_t sz) { return refuse() ? NULL : __real_calloc(n, sz); }
void *__wrap_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n) { return refuse() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s);
char *__wrap_strdup(const char *s) { return refuse() ? NULL : __real_strdup(s); }

/* ---- the world ---------------------------------------------------------------------------------
 */

#define N_EVENTS 6
#define LEASE 1000

typedef enum { LOOP_STORE, LOOP_STORE_FROM, LOOP_BROKER, LOOP_ALLOC } loop_kind;
static const char *const loop_names[] = {"store call", "store calls from", "broker call",
                                         "allocation"};

typedef struct world {
    char path[128]; /* the log broker's file: the consumer opens its own handle on it */
    obx__store *s;
    obx__broker *b;
    sqlite3 *cdb;  /* the consumer's database */
    obx_store *cs; /* wrapping cdb */
    obx_consumer *con;
    obx__engine d, r;
    int64_t now;
    bool stored[N_EVENTS];
    char ids[N_EVENTS][OBX_EVENT_ID_LEN + 1];
    int errors; /* steps that reported an error in the armed cycle */
} world;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char m_[512];                                                                          \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
            fail_msg("%s k=%ld: %s (%s)", loop_names[cur_loop], cur_k, m_, #cond);                 \
        }                                                                                          \
    } while (0)

static loop_kind cur_loop;
static long cur_k;

#define OK(x)                                                                                      \
    do {                                                                                           \
        obx_err e_ = (x);                                                                          \
        CHECK(e_ == OBX_OK, "%s: %s", obx_errname(e_), obx_errmsg());                              \
    } while (0)

/* The consumer's effect: one row per application, in the inbox's transaction. */
static obx_err effect(void *user, void *conn, const obx_message *m, const char *key, char *res,
                      size_t cap) {
    (void)user;
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(conn, "INSERT INTO effect (event_id, effect_key) VALUES (?, ?)", -1, &st,
                           NULL) != SQLITE_OK)
        return obx__fail(OBX_ENOMEM, "effect: %s", sqlite3_errmsg(conn));
    sqlite3_bind_text(st, 1, m->event_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return obx__fail(OBX_EHANDLER, "effect: %s", sqlite3_errmsg(conn));
    snprintf(res, cap, "applied");
    return OBX_OK;
}

static int worlds;

static void world_open(world *w) {
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s/obx-loop-%d-%d.db",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid(), ++worlds);
    OK(obx__st_open("sqlite::memory:", &w->s));
    OK(obx_store_init(w->s));
    /* seed 67: with these knobs the first cycle takes every path (test_cycle_covers_paths) */
    char url[256];
    snprintf(url, sizeof url,
             "log:%s?cluster=local&partitions=2&seed=67&lose_ack=0.25&drop_ack=0.15&"
             "reject=0.15&dup=0.15&blackhole=0.15&ack_timeout_ms=200",
             w->path);
    OK(obx__br_open(url, NULL, 0, &w->b));
    w->now = 4102444800000; /* 2100-01-01: backends compare deadlines with max(now, wall) */
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    OK(obx__route_set_at(w->s, &rt, w->now, NULL));
    obx__engine_cfg c;
    obx__engine_cfg_defaults(&c);
    c.lease_ms = LEASE;
    c.reconcile_lease_ms = LEASE;
    c.recheck_ms = 200;
    c.backoff_base_ms = 100;
    c.backoff_max_ms = 1000;
    c.seed = 3;
    obx__strlcpy(c.owner, "relay-a", sizeof c.owner);
    OK(obx__engine_init(&w->d, w->s, w->b, &c));
    obx__strlcpy(c.owner, "reconciler", sizeof c.owner);
    OK(obx__engine_init(&w->r, w->s, w->b, &c));
    CHECK(sqlite3_open(":memory:", &w->cdb) == SQLITE_OK, "consumer db");
    CHECK(sqlite3_exec(w->cdb, "CREATE TABLE effect (event_id TEXT NOT NULL, effect_key TEXT)",
                       NULL, NULL, NULL) == SQLITE_OK,
          "effect table");
    OK(obx_store_wrap_sqlite(w->cdb, &w->cs));
    OK(obx_store_init(w->cs));
    const char *topics[] = {"orders"};
    snprintf(url, sizeof url, "log:%s", w->path);
    obx_consumer_options o = {.broker_url = url,
                              .topics = topics,
                              .n_topics = 1,
                              .inbox = {.consumer_id = "projection", .max_failures = 1000}};
    OK(obx_consumer_open(w->cs, w->cdb, &o, effect, NULL, &w->con));
}

static void world_close(world *w) {
    obx_consumer_close(w->con);
    obx_store_close(w->cs);
    sqlite3_close(w->cdb);
    obx__br_close(w->b);
    obx__st_close(w->s);
    char f[160];
    const char *sfx[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(f, sizeof f, "%s%s", w->path, sfx[i]);
        unlink(f);
    }
}

static obx_err enqueue_one(world *w, int i) {
    char agg[16], key[16], payload[48];
    /* the last event shares the first one's key: per-key order holds it back a cycle */
    snprintf(agg, sizeof agg, "o-%d", i == N_EVENTS - 1 ? 0 : i);
    snprintf(key, sizeof key, "create-%d", i);
    snprintf(payload, sizeof payload, "{\"order\":%d,\"total\":%d}", i, 100 * i);
    obx_event ev = {.event_type = "order.created.v1",
                    .aggregate_type = "order",
                    .aggregate_id = agg,
                    .aggregate_version = i,
                    .tenant = "t1",
                    .payload = payload,
                    .payload_len = strlen(payload),
                    .idempotency_key = key,
                    .correlation_id = "loop"};
    obx_enqueue_result r;
    obx_err e = obx__enqueue_at(w->s, &ev, w->now, NULL, &r);
    if (!e) {
        CHECK(!w->stored[i] || !strcmp(w->ids[i], r.event_id), "second event for key %s", key);
        w->stored[i] = true;
        obx__strlcpy(w->ids[i], r.event_id, sizeof w->ids[i]);
    }
    return e;
}

/* Nothing of a failed enqueue is in the store. */
static void not_stored(world *w, int i) {
    char key[16], id[OBX_EVENT_ID_LEN + 1];
    snprintf(key, sizeof key, "create-%d", i);
    obx_err e = w->s->m->idem_lookup(w->s, "t1", key, id);
    CHECK(e == OBX_ENOTFOUND, "a failed enqueue left event %s (%s)", id, obx_errname(e));
}

static obx_err poll_all(world *w, obx__engine *e) {
    size_t n = 0;
    obx_err err = OBX_OK;
    for (int i = 0; i < 8 && !err; i++) {
        err = obx__engine_poll(e, w->now, 0, &n);
        if (!n) break;
    }
    return err;
}

/* One cycle; with `expect` set, every step's error must be that code. */
static void cycle(world *w, obx_err expect) {
    obx_err rc[10];
    size_t n = 0;
    int k = 0;
    for (int i = 0; i < N_EVENTS; i++)
        if (!w->stored[i]) {
            obx_err e = enqueue_one(w, i);
            if (e && expect) not_stored(w, i);
            if (e) {
                CHECK(!expect || e == expect, "enqueue: %s: %s", obx_errname(e), obx_errmsg());
                w->errors++;
            }
        }
    rc[k++] = obx__engine_dispatch(&w->d, w->now, &n);
    rc[k++] = poll_all(w, &w->d);
    w->now += 300; /* timed-out ACKs come due */
    rc[k++] = poll_all(w, &w->d);
    w->now += LEASE + 1;
    rc[k++] = obx__engine_sweep(&w->r, w->now, &n);
    rc[k++] = obx__reconcile_step(&w->r, w->now, &n);
    rc[k++] = poll_all(w, &w->r);
    rc[k++] = obx_consumer_poll(w->con, 0, NULL);
    rc[k++] = obx_consumer_poll(w->con, 0, NULL);
    for (int i = 0; i < k; i++)
        if (rc[i]) {
            w->errors++;
            CHECK(expect && rc[i] == expect, "step %d: %s: %s", i, obx_errname(rc[i]),
                  obx_errmsg());
        }
}

static int64_t count_sql(world *w, obx__state st) {
    obx__store_stats s;
    OK(w->s->m->read->stats(w->s, &s));
    return s.by_state[st];
}

static long long effects(world *w, const char *id) {
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(w->cdb,
                             id ? "SELECT count(*) FROM effect WHERE event_id = ?"
                                : "SELECT count(*) FROM effect",
                             -1, &st, NULL) == SQLITE_OK,
          "count effects");
    if (id) sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    long long n = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    return n;
}

static void invariants(world *w) {
    obx__store_invariants inv;
    OK(w->s->m->read->invariants(w->s, &inv));
    CHECK(!inv.published_without_primary && !inv.primary_not_published && !inv.multi_primary,
          "store invariants: %lld %lld %lld", (long long)inv.published_without_primary,
          (long long)inv.primary_not_published, (long long)inv.multi_primary);
    CHECK(count_sql(w, OBX__ST_PUBLISHED) == N_EVENTS, "%lld of %d events published",
          (long long)count_sql(w, OBX__ST_PUBLISHED), N_EVENTS);
    for (int i = 0; i < N_EVENTS; i++) {
        CHECK(w->stored[i], "event %d was never stored", i);
        const char *id = w->ids[i];
        obx__rows rows = {0};
        OK(obx__st_load_events(w->s, &id, 1, 0, &rows));
        CHECK(rows.n == 1 && rows.v[0].state == OBX__ST_PUBLISHED, "event %s not published", id);
        char primary[OBX__ATTEMPT_ID_LEN + 1];
        obx__strlcpy(primary, rows.v[0].primary_attempt_id, sizeof primary);
        obx__rows_free(&rows);
        obx__receipt_row *rc;
        size_t nr;
        OK(w->s->m->load_receipts(w->s, id, &rc, &nr));
        int primaries = 0;
        for (size_t j = 0; j < nr; j++) {
            CHECK(rc[j].kind != OBX__RK_QUARANTINED, "%s: quarantined receipt: %s", id,
                  rc[j].reason);
            if (rc[j].kind == OBX__RK_PRIMARY) {
                primaries++;
                CHECK(!strcmp(rc[j].attempt_id, primary), "primary receipt names another attempt");
            }
        }
        free(rc);
        CHECK(primaries == 1, "%s: %d primary receipts", id, primaries);
        obx__attempt_row *a;
        size_t na;
        OK(obx__st_load_attempts(w->s, NULL, 0, id, &a, &na));
        int accepted = 0;
        for (size_t j = 0; j < na; j++) {
            /* no attempt is left open: one whose outcome nothing could prove when another
             * filled the slot (the route's UNKNOWN policy, retry, sent a newer one) ended
             * SUPERSEDED; its late ACK would be a duplicate receipt */
            CHECK(a[j].state == OBX__AT_ACCEPTED || a[j].state == OBX__AT_DUPLICATE ||
                      a[j].state == OBX__AT_REJECTED || a[j].state == OBX__AT_NOT_FOUND ||
                      a[j].state == OBX__AT_SUPERSEDED,
                  "%s: attempt %s left %s", id, a[j].attempt_id,
                  obx__attempt_state_name(a[j].state));
            accepted += a[j].state == OBX__AT_ACCEPTED;
        }
        free(a);
        CHECK(accepted == 1, "%s: %d accepted attempts", id, accepted);
        CHECK(effects(w, id) == 1, "%s: the consumer applied it %lld times", id, effects(w, id));
        obx__audit_row *au;
        size_t nau;
        OK(w->s->m->load_audit(w->s, id, &au, &nau));
        for (size_t j = 0; j < nau; j++)
            CHECK(au[j].from == au[j].to ||
                      obx__transition_allowed(au[j].from, au[j].to, au[j].actor),
                  "%s: audited %s -> %s by %s is not in the table", id, obx__state_name(au[j].from),
                  obx__state_name(au[j].to), obx__actor_name(au[j].actor));
        free(au);
    }
}

static void recover(world *w) {
    static const char *const knobs[] = {"lose_ack", "drop_ack", "reject", "dup", "blackhole"};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        OK(obx__log_broker_set(w->b, knobs[i], "0"));
    for (int round = 0; round < 40; round++) {
        w->now += 5 * LEASE;
        cycle(w, OBX_OK);
        if (count_sql(w, OBX__ST_PUBLISHED) == N_EVENTS && effects(w, NULL) >= N_EVENTS) break;
    }
}

static void arm(loop_kind kind, long k) {
    switch (kind) {
    case LOOP_STORE: obx__st_fault_after(k); break;
    case LOOP_STORE_FROM: obx__st_fault_from(k); break;
    case LOOP_BROKER: obx__br_fault_after(k); break;
    case LOOP_ALLOC:
        alloc_n = 0;
        alloc_hit = false;
        alloc_at = k;
        break;
    }
}

/* Calls made in the armed cycle (what k ranges over). */
static long disarm(loop_kind kind) {
    long n = 0;
    switch (kind) {
    case LOOP_STORE:
    case LOOP_STORE_FROM:
        n = obx__st_calls();
        obx__st_fault_after(0);
        break;
    case LOOP_BROKER:
        n = obx__br_calls();
        obx__br_fault_after(0);
        break;
    case LOOP_ALLOC:
        n = alloc_n;
        alloc_at = 0;
        break;
    }
    return n;
}

static obx_err expected(loop_kind kind) {
    return kind == LOOP_BROKER ? OBX_EBROKER : kind == LOOP_ALLOC ? OBX_ENOMEM : OBX_EIO;
}

/* The wrappers an armed fault failed, over one loop: the loops must reach the producer's
 * enqueue, the inbox and the consumer, not only the relay's engine. */
#define MAX_HITS 128
static const char *hits[MAX_HITS];
static size_t n_hits;

static void note_hit(loop_kind kind) {
    const char *h = kind == LOOP_BROKER                             ? obx__br_fault_hit()
                    : kind == LOOP_STORE || kind == LOOP_STORE_FROM ? obx__st_fault_hit()
                                                                    : NULL;
    if (!h) return;
    for (size_t i = 0; i < n_hits; i++)
        if (!strcmp(hits[i], h)) return;
    if (n_hits < MAX_HITS) hits[n_hits++] = h;
}

static bool was_hit(const char *name) {
    for (size_t i = 0; i < n_hits; i++)
        if (!strcmp(hits[i], name)) return true;
    return false;
}

/* Methods each loop must have failed at least once: the producer's enqueue (route, idempotency
 * key, event row, the one-call write with a known route), the inbox (receipt lookup and insert,
 * failure count, consume audit) and the consumer's broker side (poll, ack). */
static void check_reach(loop_kind kind) {
    static const char *const store_needs[] = {
        "route_get_txid", "idem_lookup", "insert_event_audit", "enqueue_write",
        "inbox_get",      "inbox_put",   "consume_audit_put"};
    static const char *const broker_needs[] = {"consume_poll", "consume_ack", "send", "poll",
                                               "lookup"};
    const char *const *need = kind == LOOP_BROKER ? broker_needs : store_needs;
    size_t n = kind == LOOP_ALLOC    ? 0
               : kind == LOOP_BROKER ? sizeof broker_needs / sizeof *broker_needs
                                     : sizeof store_needs / sizeof *store_needs;
    for (size_t i = 0; i < n; i++) CHECK(was_hit(need[i]), "the loop never failed %s", need[i]);
}

static void run_loop(loop_kind kind, long max_k) {
    n_hits = 0;
    cur_loop = kind;
    long k = 1, reported = 0;
    bool leak_each = getenv("OBX_FAULT_LOOP_LEAK_EACH") != NULL;
    for (;; k++) {
        cur_k = k;
        CHECK(k <= max_k, "the loop did not end by k=%ld", max_k);
        world w;
        world_open(&w);
        arm(kind, k);
        cycle(&w, expected(kind));
        note_hit(kind);
        long calls = disarm(kind);
        bool reached = calls >= k;
        reported += w.errors > 0;
        recover(&w);
        invariants(&w);
        world_close(&w);
        if (leak_each) CHECK(LEAK_CHECK() == 0, "leak (LeakSanitizer report above)");
        if (!reached) break;
    }
    cur_k = -1; /* the whole loop */
    CHECK(LEAK_CHECK() == 0, "leak in the loop (LeakSanitizer report above; "
                             "OBX_FAULT_LOOP_LEAK_EACH=1 finds the k)");
    fprintf(stderr, "fault loop over the k-th %s: k = 1..%ld, %ld runs reported an error\n",
            loop_names[kind], k, reported);
    if (n_hits) {
        fprintf(stderr, "  failed in:");
        for (size_t i = 0; i < n_hits; i++) fprintf(stderr, " %s", hits[i]);
        fprintf(stderr, "\n");
    }
    check_reach(kind);
}

/* The loops are only as good as the cycle: without faults it must go through every path the
 * loops are meant to break — ACKs accepted, definite rejections, timed-out ACKs (UNKNOWN), lost
 * ACKs swept and found by the reconciler, lost requests proven absent and retried. */
static void test_cycle_covers_paths(void **st) {
    (void)st;
    cur_loop = LOOP_STORE;
    cur_k = 0;
    world w;
    world_open(&w);
    cycle(&w, OBX_OK);
    obx__engine_stats d = w.d.st, r = w.r.st;
    fprintf(stderr,
            "cycle: sent %lld accepted %lld+%lld duplicates %lld rejected %lld unknown %lld "
            "swept %lld found %lld not_found %lld retries %lld\n",
            (long long)d.sent, (long long)d.accepted, (long long)r.accepted,
            (long long)(d.duplicates + r.duplicates), (long long)d.rejected, (long long)d.unknown,
            (long long)r.swept, (long long)r.reconciled_found, (long long)r.reconciled_not_found,
            (long long)r.retries);
    CHECK(d.sent == N_EVENTS - 1, "sent %lld", (long long)d.sent); /* one waits for its key */
    CHECK(d.accepted > 0 && d.rejected > 0 && d.unknown > 0, "dispatcher paths missing");
    CHECK(r.swept > 0 && r.reconciled_found > 0 && r.reconciled_not_found > 0 && r.retries > 0,
          "sweeper/reconciler paths missing");
    recover(&w);
    invariants(&w);
    world_close(&w);
}

/* The loops of the table in main: a kind and the k each must end by (allocations: more calls). */
typedef struct {
    loop_kind kind;
    long max_k;
} loop_case;
static loop_case store_loop = {LOOP_STORE, 2000}, store_outage_loop = {LOOP_STORE_FROM, 2000},
                 broker_loop = {LOOP_BROKER, 2000}, alloc_loop = {LOOP_ALLOC, 20000};

static void test_loop(void **st) {
    const loop_case *c = *st;
    run_loop(c->kind, c->max_k);
}

/* A cmocka table row test_C: test_loop over loop_case C. */
#define LOOP_TEST(c)                                                                               \
    { "test_" #c, test_loop, NULL, NULL, &c }

int main(void) {
    /* OBX_TEST_FILTER=PATTERN (cmocka's * and ?) runs only the matching tests */
    const char *filter = getenv("OBX_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cycle_covers_paths),
        LOOP_TEST(store_loop),
        LOOP_TEST(store_outage_loop),
        LOOP_TEST(broker_loop),
        LOOP_TEST(alloc_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

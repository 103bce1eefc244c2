/*
 * bench_relay_instr.c — a relay's work on PostgreSQL for N events, on one connection, for
 * counting the server's instructions per relayed event (bench/relay_instr.sh runs it against a
 * PostgreSQL under callgrind; docs/performance.md, section 1). The relay is the engine's
 * dispatcher as `obx relay` runs it (obx__engine_dispatch, then obx__engine_poll until the
 * batch's outcomes are accepted), on a store connection serving dispatch, with the log broker
 * (a local file: the broker's share is not in the server's count). Counting instead of timing,
 * as bench_producer_instr: the instructions of a claim, its attempts and an acceptance per batch
 * of B events repeat between runs where times on a 2-core machine do not.
 *
 *   bench_relay_instr URL setup          obx init, a route of order.created.v1 to local/orders
 *   bench_relay_instr URL N B DIR        N events enqueued (on a connection of their own, not
 *                                        counted), then relayed in batches of B through the log
 *                                        broker in DIR; prints the relay connection's backend
 *                                        process ID first (its callgrind file is named after it)
 *
 * Exits non-zero on the first error, or when an event did not end PUBLISHED.
 */
#include "bench.h"

#include "broker/broker.h"
#include "engine/engine.h"
#include "store/store.h"

#include <libpq-fe.h>
#include <obx.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what) {
    fprintf(stderr, "bench_relay_instr: %s: %s\n", what, obx_errmsg());
    exit(1);
}

static void setup(const char *url) {
    obx_store *s;
    if (obx_store_open(url, &s) || obx_store_init(s)) die("init");
    obx_route rt = {.event_type = "order.created.v1", .cluster = "local", .topic = "orders"};
    if (obx_route_set(s, &rt, NULL)) die("route set");
    obx_store_close(s);
}

/* n events, each in its own transaction, as producers commit them */
static void enqueue(const char *url, int n) {
    obx_store *s;
    if (obx_store_open(url, &s)) die("open (producer)");
    char agg[32], payload[600];
    for (int i = 0; i < n; i++) {
        snprintf(agg, sizeof agg, "o-%d", i);
        int len = bn_biz_payload(payload, sizeof payload, agg);
        obx_event ev = {.event_type = "order.created.v1",
                        .aggregate_type = "order",
                        .aggregate_id = agg,
                        .aggregate_version = 1,
                        .tenant = "tenant-7",
                        .payload = payload,
                        .payload_len = (size_t)len};
        obx_enqueue_result res;
        if (obx_enqueue(s, &ev, &res)) die("enqueue");
    }
    obx_store_close(s);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[2], "setup")) {
        setup(argv[1]);
        return 0;
    }
    int n = argc == 5 ? atoi(argv[2]) : 0, batch = argc == 5 ? atoi(argv[3]) : 0;
    if (n < 1 || batch < 1) {
        fprintf(stderr, "usage: bench_relay_instr URL setup | URL N BATCH DIR\n");
        return 2;
    }
    enqueue(argv[1], n);
    obx__store *s;
    if (obx__st_open(argv[1], &s)) die("open (relay)");
    obx__st_serve_dispatch(s);
    int found = 0;
    if (obx__st_schema_version(s, &found) || found != OBX__SCHEMA_VERSION) die("schema version");
    PGconn *c = PQconnectdb(argv[1]);
    if (PQstatus(c) != CONNECTION_OK) die("connect (check)");
    /* the relay connection's backend: the only session of this database besides c */
    PGresult *r = PQexec(c, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) die("the relay's backend");
    printf("%s\n", PQgetvalue(r, 0, 0));
    fflush(stdout);
    PQclear(r);
    char burl[1100];
    snprintf(burl, sizeof burl, "log:%s/broker.db", argv[4]);
    obx__broker *b;
    if (obx__br_open(burl, NULL, 0, &b)) die("broker");
    obx__engine_cfg ec;
    obx__engine_cfg_defaults(&ec);
    snprintf(ec.owner, sizeof ec.owner, "instr/d0");
    ec.batch = (size_t)batch;
    obx__engine e;
    if (obx__engine_init(&e, s, b, &ec)) die("engine");
    for (size_t done = 0; done < (size_t)n;) {
        size_t sent = 0, applied = 0;
        if (obx__engine_dispatch(&e, obx__wall_ms(), &sent)) die("dispatch");
        if (!sent) die("nothing to send before every event was published");
        for (size_t got = 0; got < sent; got += applied)
            if (obx__engine_poll(&e, obx__wall_ms(), 1000, &applied)) die("poll");
        done += sent;
    }
    obx__br_close(b);
    obx__st_close(s);
    r = PQexec(c, "SELECT count(*) FILTER (WHERE state <> 'PUBLISHED') FROM obx.obx_event");
    bool ok = PQresultStatus(r) == PGRES_TUPLES_OK && !strcmp(PQgetvalue(r, 0, 0), "0");
    PQclear(r);
    PQfinish(c);
    if (!ok) die("an event did not end PUBLISHED");
    return 0;
}

/*
 * bench_amqp.c — confirmed-publish rate to a quorum queue: a plain rabbitmq-c loop against the
 * obx RabbitMQ backend, in one run, with the same messages (payload size, the obx header set,
 * persistent, mandatory) and the same confirm window. Prints msgs/s for each round and the ratio
 * of the medians.
 *
 *   bench_amqp [URL] [-n MESSAGES] [-s PAYLOAD_BYTES] [-w WINDOW] [-b BATCH] [-r ROUNDS]
 *   URL defaults to $OBX_TEST_AMQP_URL. BATCH is how many messages go to one send() call (the
 *   dispatcher's batch); the raw loop publishes one by one, which is what it would do anyway.
 */
#include "broker/amqp/amqp_broker.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NMSG 1000 /* distinct prepared messages, used round-robin */

typedef struct prepared {
    obx__envelope env;
    obx__dest dest;
    char dest_digest[OBX_DIGEST_LEN + 1];
    char attempt_id[OBX_EVENT_ID_LEN + 1];
    obx__msg msg;
} prepared;

/* this process's CPU time, us: the client-side cost, steadier than the rate on a busy machine */
static double cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void die(const char *what) {
    fprintf(stderr, "bench_amqp: %s: %s\n", what, obx_errmsg());
    exit(1);
}

static void prepare(prepared *p, const char *exchange, const unsigned char *payload, size_t len,
                    int i) {
    memset(p, 0, sizeof *p);
    obx__envelope *e = &p->env;
    obx_event_id_new(0, e->event_id);
    e->envelope_gen = 1;
    strcpy(e->aggregate_type, "order");
    snprintf(e->aggregate_id, sizeof e->aggregate_id, "o-%d", i);
    e->aggregate_version = i;
    strcpy(e->event_type, "order.created.v1");
    obx_sha256_digest(payload, len, e->payload_digest);
    obx_sha256_digest("schema", 6, e->payload_schema);
    strcpy(e->tenant, "tenant-7");
    e->occurred_at = obx__wall_ms();
    strcpy(e->correlation_id, "corr-1");
    obx__strlcpy(p->dest.topic, exchange, sizeof p->dest.topic);
    strcpy(p->dest.cluster, "bench");
    strcpy(p->dest.routing_key, "tenant-7.order");
    strcpy(p->dest.algorithm, "none");
    p->dest.route_gen = 1;
    strcpy(p->dest.serializer, "raw");
    strcpy(p->dest.durability, "persistent");
    strcpy(p->dest.required_acks, "all");
    obx__dest_digest(&p->dest, p->dest_digest);
    snprintf(p->attempt_id, sizeof p->attempt_id, "att-bench-%d", i);
    p->msg = (obx__msg){.env = &p->env,
                        .dest = &p->dest,
                        .dest_digest = p->dest_digest,
                        .attempt_id = p->attempt_id,
                        .attempt_gen = 1,
                        .payload = payload,
                        .payload_len = len};
}

/* The plain loop: what an application would write with rabbitmq-c and publisher confirms. */
static double raw_round(const obx__url *u, const char *exchange, const prepared *pm, int n,
                        int window) {
    amqp_connection_state_t c = amqp_new_connection();
    amqp_socket_t *s = amqp_tcp_socket_new(c);
    char host[256];
    const char *colon = strrchr(u->hosts, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - u->hosts), u->hosts);
    if (amqp_socket_open(s, host, atoi(colon + 1)) != AMQP_STATUS_OK) die("raw: connect");
    if (amqp_login(c, u->vhost[0] ? u->vhost : "/", 0, 131072, 30, AMQP_SASL_METHOD_PLAIN, u->user,
                   u->password)
            .reply_type != AMQP_RESPONSE_NORMAL)
        die("raw: login");
    amqp_channel_open(c, 1);
    amqp_get_rpc_reply(c);
    amqp_confirm_select(c, 1);
    if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) die("raw: confirm.select");
    int64_t t0 = obx__mono_ms();
    uint64_t published = 0, confirmed = 0;
    while (confirmed < (uint64_t)n) {
        while (published < (uint64_t)n && published - confirmed < (uint64_t)window) {
            const prepared *p = &pm[published % NMSG];
            obx__headers h;
            obx__headers_build(&p->msg, &h);
            amqp_table_entry_t e[18];
            int k = 0;
            for (size_t i = 0; i < h.n; i++)
                e[k++] =
                    (amqp_table_entry_t){.key = amqp_cstring_bytes(h.name[i]),
                                         .value = {.kind = AMQP_FIELD_KIND_UTF8,
                                                   .value.bytes = amqp_cstring_bytes(h.value[i])}};
            amqp_basic_properties_t pr;
            memset(&pr, 0, sizeof pr);
            pr._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                        AMQP_BASIC_HEADERS_FLAG;
            pr.delivery_mode = 2;
            pr.message_id = amqp_cstring_bytes(p->env.event_id);
            pr.headers = (amqp_table_t){k, e};
            amqp_bytes_t body = {p->msg.payload_len, (void *)(uintptr_t)p->msg.payload};
            if (amqp_basic_publish(c, 1, amqp_cstring_bytes(exchange),
                                   amqp_cstring_bytes(p->dest.routing_key), 1, 0, &pr,
                                   body) != AMQP_STATUS_OK)
                die("raw: publish");
            published++;
        }
        amqp_frame_t f;
        if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK) die("raw: wait");
        if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
            const amqp_basic_ack_t *a = f.payload.method.decoded;
            confirmed = a->multiple ? a->delivery_tag : confirmed + 1;
        } else if (f.frame_type == AMQP_FRAME_METHOD)
            die("raw: unexpected method (nack/return/close)");
        amqp_maybe_release_buffers(c);
    }
    int64_t ms = obx__mono_ms() - t0;
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
    return n / (ms > 0 ? ms / 1000.0 : 0.001);
}

/* The same through the backend: send() in batches, poll() between them. */
static double obx_round(obx__broker *b, const prepared *pm, int n, int batch) {
    obx__msg *m = calloc((size_t)batch, sizeof *m);
    obx__outcome *o = calloc(1024, sizeof *o);
    if (!m || !o) die("out of memory");
    int64_t t0 = obx__mono_ms();
    int sent = 0, done = 0;
    while (done < n) {
        if (sent < n) {
            int k = n - sent < batch ? n - sent : batch;
            for (int i = 0; i < k; i++) m[i] = pm[(sent + i) % NMSG].msg;
            if (obx__br_send(b, m, (size_t)k, obx__wall_ms())) die("send");
            sent += k;
        }
        size_t got = 0;
        if (obx__br_poll(b, obx__wall_ms(), sent < n ? 0 : 100, o, 1024, &got)) die("poll");
        for (size_t i = 0; i < got; i++)
            if (o[i].kind != OBX__OUT_ACK) {
                fprintf(stderr, "bench_amqp: %s: %s\n", obx__outcome_kind_name(o[i].kind),
                        o[i].reason);
                exit(1);
            }
        done += (int)got;
    }
    int64_t ms = obx__mono_ms() - t0;
    free(m);
    free(o);
    return n / (ms > 0 ? ms / 1000.0 : 0.001);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *url = getenv("OBX_TEST_AMQP_URL");
    int n = 20000, size = 512, window = 500, batch = 100, rounds = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            size = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-w") && i + 1 < argc)
            window = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-b") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (argv[i][0] != '-')
            url = argv[i];
        else {
            fprintf(stderr, "usage: %s [URL] [-n N] [-s BYTES] [-w WINDOW] [-b BATCH] [-r R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!url || n <= 0 || size < 0 || window <= 0 || batch <= 0 || rounds <= 0 || rounds > 20) {
        fprintf(stderr, "bench_amqp: need a URL ($OBX_TEST_AMQP_URL) and positive numbers\n");
        return 2;
    }
    obx__url u;
    if (obx__url_parse(url, "broker", &u)) die("URL");
    char exchange[64], cfg[512], full[1400];
    snprintf(exchange, sizeof exchange, "obx-bench-%d", (int)getpid());
    snprintf(cfg, sizeof cfg,
             "declare_exchange=%s&declare_queue=%s.q&queue_type=quorum&confirm_window=%d", exchange,
             exchange, window);
    snprintf(full, sizeof full, "%s%s%s", url, strchr(url, '?') ? "&" : "?", cfg);
    obx__broker *b;
    if (obx__br_open(full, NULL, 0, &b)) die("open");
    unsigned char *payload = malloc((size_t)size + 1);
    for (int i = 0; i < size; i++) payload[i] = (unsigned char)('a' + i % 26);
    prepared *pm = calloc(NMSG, sizeof *pm);
    if (!payload || !pm) die("out of memory");
    for (int i = 0; i < NMSG; i++) prepare(&pm[i], exchange, payload, (size_t)size, i);

    /* purges the queue between rounds so that every round starts from the same state */
    amqp_connection_state_t adm = amqp_new_connection();
    amqp_socket_t *s = amqp_tcp_socket_new(adm);
    char host[256], q[80];
    const char *colon = strrchr(u.hosts, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - u.hosts), u.hosts);
    snprintf(q, sizeof q, "%s.q", exchange);
    if (amqp_socket_open(s, host, atoi(colon + 1)) != AMQP_STATUS_OK ||
        amqp_login(adm, u.vhost[0] ? u.vhost : "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, u.user,
                   u.password)
                .reply_type != AMQP_RESPONSE_NORMAL)
        die("admin connection");
    amqp_channel_open(adm, 1);
    amqp_get_rpc_reply(adm);

    printf("confirmed publish to a quorum queue: %d messages of %d bytes + obx headers, "
           "persistent, mandatory, window %d, backend batch %d\n",
           n, size, window, batch);
    double raw[20] = {0}, ob[20] = {0}, raw_cpu = 0, ob_cpu = 0;
    for (int r = 0; r < rounds; r++) {
        amqp_queue_purge(adm, 1, amqp_cstring_bytes(q));
        amqp_get_rpc_reply(adm);
        double c0 = cpu_us();
        raw[r] = raw_round(&u, exchange, pm, n, window);
        double c1 = cpu_us();
        amqp_queue_purge(adm, 1, amqp_cstring_bytes(q));
        amqp_get_rpc_reply(adm);
        double c2 = cpu_us();
        ob[r] = obx_round(b, pm, n, batch);
        double c3 = cpu_us();
        raw_cpu += c1 - c0;
        ob_cpu += c3 - c2;
        printf("round %d: rabbitmq-c loop %8.0f msgs/s (%.2f us cpu/msg)   obx backend %8.0f "
               "msgs/s (%.2f us cpu/msg)\n",
               r + 1, raw[r], (c1 - c0) / n, ob[r], (c3 - c2) / n);
        fflush(stdout);
    }
    qsort(raw, (size_t)rounds, sizeof raw[0], cmp_d);
    qsort(ob, (size_t)rounds, sizeof ob[0], cmp_d);
    double mr = raw[rounds / 2], mo = ob[rounds / 2];
    printf("median:  rabbitmq-c loop %8.0f msgs/s   obx backend %8.0f msgs/s   ratio %.2f\n", mr,
           mo, mo / mr);
    printf("client cpu per message, all rounds: rabbitmq-c loop %.2f us, obx backend %.2f us\n",
           raw_cpu / ((double)n * rounds), ob_cpu / ((double)n * rounds));
    amqp_queue_delete(adm, 1, amqp_cstring_bytes(q), 0, 0);
    amqp_get_rpc_reply(adm);
    amqp_exchange_delete(adm, 1, amqp_cstring_bytes(exchange), 0);
    amqp_get_rpc_reply(adm);
    amqp_connection_close(adm, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(adm);
    obx__br_close(b);
    free(pm);
    free(payload);
    return 0;
}

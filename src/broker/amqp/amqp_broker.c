/*
 * amqp_broker.c — the RabbitMQ broker backend (rabbitmq-c 0.11, AMQP 0-9-1). It owns:
 *   - the publisher: one connection, channel 1 in confirm mode, persistent messages published
 *     with `mandatory`, a window of unconfirmed publishes, and the mapping of what the broker
 *     says (basic.ack / basic.nack / basic.return / channel or connection close) to outcomes;
 *   - the optional audit stream: a RabbitMQ stream queue bound to the exchange, read over AMQP
 *     0-9-1 for best-effort lookups by event ID and for the bypass-publish scan;
 *   - the consumer side for the inbox (manual ack, prefetch, redelivery);
 *   - configuration (URL + properties), TLS, and the declaration helpers for tests and demos.
 *
 *   URL: amqp[s]://USER:PASS@HOST:PORT/VHOST[?key=value&...]   (VHOST percent-decoded: %2f = /)
 *   Properties (URL query or backend properties "key=value"; properties win): see docs/amqp.md
 *   and parse_kv() below.
 *
 * Outcome mapping (the contract of broker.h):
 *   basic.ack (incl. multiple)        ACK, receipt: cluster, topic = exchange, partition 0,
 *                                     offset = the publish sequence number on the channel
 *   basic.return then its ack/nack    REJECT (unroutable: no queue was bound for the key)
 *   basic.nack                        REJECT (a queue refused it, e.g. x-overflow=reject-publish)
 *   channel.close naming a message    that message REJECT (404 no exchange, 406 too large);
 *                                     earlier unconfirmed ones UNKNOWN; later ones NOT_SENT (a
 *                                     closing channel discards every later frame, AMQP 0-9-1
 *                                     §4.2.4 / channel.close)
 *   connection/channel lost, or no    UNKNOWN for exactly the unconfirmed publishes (a returned
 *   confirm within confirm_timeout_ms one stays REJECT: the return proves it was not routed)
 *   cannot connect / connection       NOT_SENT (nothing of the message reached the broker: a
 *   blocked / publish write failed    message counts only once its last frame is written)
 * Every message handed to send() gets exactly one outcome, returned by poll().
 *
 * Threads: a handle is used by one thread at a time (rabbitmq-c connections are not shared).
 */
#include "broker/amqp/amqp_broker.h"

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <openssl/x509.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define CH 1                              /* every connection of this backend uses one channel */
#define H_PUBLISH_SEQ "obx-publish-seq"   /* AMQP only: the publish sequence number (offset) */
#define H_AUDIT_MARKER "obx-audit-marker" /* end-of-scan marker in the audit stream */
#define WINDOW_MAX 10000
#define HOSTS_MAX 8 /* the nodes a URL may list: amqp://u:p@h1:p1,h2:p2,.../vhost */

/* ---- configuration ------------------------------------------------------------------------ */

typedef struct amqp_cfg {
    bool tls;
    /* the nodes of the URL, in its order; a connection tries them from the one it used last
     * (the next one after that connection died), so that a cluster's node lost is a reconnect
     * to another node (docs/amqp.md, "A RabbitMQ cluster") */
    char host[HOSTS_MAX][256];
    int port[HOSTS_MAX];
    int n_hosts;
    char user[256], password[256], vhost[256];
    char where[600]; /* redacted "amqp://user:***@host:port/vhost" for messages */
    char cluster[OBX_NAME_MAX + 1];
    int window, confirm_timeout_ms, connect_timeout_ms, rpc_timeout_ms, heartbeat_s;
    int reconnect_backoff_ms, reconnect_backoff_max_ms, prefetch;
    char cacert[1024], cert[1024], key[1024];
    bool verify_peer, verify_hostname;
    char declare_exchange[256], exchange_type[32];
    char declare_queue[256], queue_type[16], bind_key[256];
    long long queue_max_length; /* -1: not set (0 is a queue that holds nothing) */
    char queue_overflow[32];
    char audit_stream[256], audit_bind[256], audit_key[256], audit_max_age[32];
    /* a stream copy proves delivery (no queue bound to these exchanges ever refuses a message
     * the exchange routed): an operator's declaration, off by default (docs/amqp.md) */
    bool audit_stream_proves;
    int lookup_timeout_ms, lookup_prefetch;
    long long lookup_skew_ms;
} amqp_cfg;

/* ---- state -------------------------------------------------------------------------------- */

typedef struct aconn {
    amqp_connection_state_t st;
    bool up;
    uint32_t gen; /* incremented on every successful connect */
    int node;     /* index of the URL's node it is (or was last) connected to */
} aconn;

/* One publish waiting for its confirm. */
typedef struct pend {
    bool waiting;
    bool returned; /* basic.return seen: it ends as REJECT whatever follows */
    uint64_t seq;
    int64_t sent_ms; /* monotonic */
    size_t body_len;
    obx__outcome out; /* identity filled at send; kind, receipt and reason at resolution */
} pend;

typedef struct amqp_broker {
    obx__broker base;
    amqp_cfg cfg;
    char cluster[OBX_NAME_MAX + 1];
    /* publisher */
    aconn pub;
    int64_t next_connect_ms; /* no connect attempt before (monotonic) */
    int64_t backoff_ms;      /* doubles per failed attempt up to reconnect_backoff_max_ms */
    char down_reason[OBX_TEXT_MAX + 1];
    bool blocked;
    char blocked_reason[128];
    pend *ring; /* cfg.window slots; seq s lives at (head + s - head_seq) % window */
    size_t head;
    uint64_t head_seq, next_seq; /* occupied: [head_seq, next_seq) */
    size_t n_waiting;
    obx__outcome *ready; /* decided outcomes, returned by poll in order */
    size_t ready_head, ready_n, ready_cap;
    /* consumer */
    aconn con;
    char group[OBX_NAME_MAX + 1];
    char (*queues)[256];
    size_t n_queues;
    char con_error[OBX_TEXT_MAX + 1];
    /* the retry back-off (consume_pause): exchanges paused, and their deliveries held
     * unacknowledged, in arrival order, until resumed */
    char (*paused)[OBX_TOPIC_MAX + 1];
    size_t n_paused;
    obx__delivery *held;
    size_t n_held;
    /* copies of the deliveries handed out and not yet settled in this session, in arrival
     * (delivery tag) order: consume_redeliver hands them out again from here */
    obx__delivery *unacked;
    size_t n_unacked;
    obx__amqp_stats stats;
} amqp_broker;

static int64_t mono(void) { return obx__mono_ms(); }

static struct timeval tv_ms(int64_t ms) {
    if (ms < 0) ms = 0;
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

static amqp_bytes_t bytes_of(const char *s) { return amqp_cstring_bytes(s); }

static bool bytes_eq(amqp_bytes_t b, const char *s) {
    size_t n = strlen(s);
    return b.len == n && (n == 0 || !memcmp(b.bytes, s, n));
}

/* What an RPC reply says, for messages (the server's own words where there are some). */
static void reply_text(amqp_rpc_reply_t r, char *out, size_t cap) {
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL: snprintf(out, cap, "ok"); break;
    case AMQP_RESPONSE_NONE: snprintf(out, cap, "no RPC reply"); break;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(out, cap, "%s", amqp_error_string2(r.library_error));
        break;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            const amqp_connection_close_t *m = r.reply.decoded;
            snprintf(out, cap, "server closed the connection: %u %.*s", (unsigned)m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            const amqp_channel_close_t *m = r.reply.decoded;
            snprintf(out, cap, "server closed the channel: %u %.*s", (unsigned)m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        } else
            snprintf(out, cap, "server error (method 0x%08x)", (unsigned)r.reply.id);
        break;
    }
}

/* Fails with "amqp <where>: <what>: <reply>"; the password is never part of any of these. */
static obx_err rpc_fail(amqp_broker *b, obx_err e, const char *what, amqp_rpc_reply_t r) {
    char t[300];
    reply_text(r, t, sizeof t);
    return obx__fail(e, "amqp %s: %s: %s", b->cfg.where, what, t);
}

/* ---- configuration parsing ---------------------------------------------------------------- */

static obx_err cfg_int(const char *k, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return obx__fail(OBX_ECONFIG, "amqp property %s='%s': not an integer in %lld..%lld", k, v,
                         lo, hi);
    *out = x;
    return OBX_OK;
}

static obx_err cfg_str(const char *k, const char *v, char *out, size_t cap) {
    if (strlen(v) >= cap)
        return obx__fail(OBX_ECONFIG, "amqp property %s: longer than %zu bytes", k, cap - 1);
    for (const char *p = v; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return obx__fail(OBX_ECONFIG, "amqp property %s: contains a control character", k);
    obx__strlcpy(out, v, cap);
    return OBX_OK;
}

static obx_err cfg_bool(const char *k, const char *v, bool *out) {
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes"))
        *out = true;
    else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no"))
        *out = false;
    else
        return obx__fail(OBX_ECONFIG, "amqp property %s='%s': expected 1/0, true/false", k, v);
    return OBX_OK;
}

static obx_err parse_kv(amqp_cfg *c, const char *k, const char *v) {
    long long x = 0;
    obx_err e;
#define INT(name, field, lo, hi)                                                                   \
    if (!strcmp(k, name)) {                                                                        \
        if ((e = cfg_int(k, v, lo, hi, &x))) return e;                                             \
        c->field = (int)x;                                                                         \
        return OBX_OK;                                                                             \
    }
#define STR(name, field)                                                                           \
    if (!strcmp(k, name)) return cfg_str(k, v, c->field, sizeof c->field);
#define BOOL(name, field)                                                                          \
    if (!strcmp(k, name)) return cfg_bool(k, v, &c->field);
    if (!strcmp(k, "cluster")) {
        if ((e = obx__check_field("amqp property cluster", v, 1, OBX_NAME_MAX, OBX__CS_NAME)))
            return obx__fail(OBX_ECONFIG, "%s", obx_errmsg());
        obx__strlcpy(c->cluster, v, sizeof c->cluster);
        return OBX_OK;
    }
    INT("confirm_window", window, 1, WINDOW_MAX)
    INT("confirm_timeout_ms", confirm_timeout_ms, 100, 3600000)
    INT("connect_timeout_ms", connect_timeout_ms, 100, 600000)
    INT("rpc_timeout_ms", rpc_timeout_ms, 100, 600000)
    INT("heartbeat", heartbeat_s, 0, 3600)
    INT("reconnect_backoff_ms", reconnect_backoff_ms, 0, 600000)
    INT("reconnect_backoff_max_ms", reconnect_backoff_max_ms, 0, 3600000)
    INT("prefetch", prefetch, 1, 65535)
    INT("lookup_timeout_ms", lookup_timeout_ms, 100, 3600000)
    INT("lookup_prefetch", lookup_prefetch, 1, 65535)
    if (!strcmp(k, "lookup_skew_ms")) return cfg_int(k, v, 0, 86400000LL * 30, &c->lookup_skew_ms);
    if (!strcmp(k, "queue_max_length"))
        return cfg_int(k, v, 0, (long long)1 << 40, &c->queue_max_length);
    STR("cacert", cacert)
    STR("cert", cert)
    STR("key", key)
    BOOL("verify_peer", verify_peer)
    BOOL("verify_hostname", verify_hostname)
    BOOL("audit_stream_proves", audit_stream_proves)
    STR("declare_exchange", declare_exchange)
    STR("exchange_type", exchange_type)
    STR("declare_queue", declare_queue)
    STR("queue_type", queue_type)
    STR("bind_key", bind_key)
    STR("queue_overflow", queue_overflow)
    STR("audit_stream", audit_stream)
    STR("audit_bind", audit_bind)
    STR("audit_key", audit_key)
    STR("audit_max_age", audit_max_age)
#undef INT
#undef STR
#undef BOOL
    return obx__fail(OBX_ECONFIG,
                     "amqp: unknown property '%s' (cluster, confirm_window, confirm_timeout_ms, "
                     "connect_timeout_ms, rpc_timeout_ms, heartbeat, reconnect_backoff_ms, "
                     "reconnect_backoff_max_ms, "
                     "prefetch, cacert, cert, key, verify_peer, verify_hostname, "
                     "declare_exchange, exchange_type, declare_queue, queue_type, bind_key, "
                     "queue_max_length, queue_overflow, audit_stream, audit_bind, audit_key, "
                     "audit_max_age, audit_stream_proves, lookup_timeout_ms, lookup_prefetch, "
                     "lookup_skew_ms)",
                     k);
}

static int pct_decode(const char *in, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; in[i]; i++) {
        char ch = in[i];
        if (ch == '%') {
            unsigned char v;
            size_t l;
            char h[3] = {in[i + 1], in[i + 1] ? in[i + 2] : 0, 0};
            if (!h[0] || !h[1] || obx__unhex(h, &v, 1, &l)) return -1;
            ch = (char)v;
            i += 2;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = ch;
    }
    out[o] = '\0';
    return 0;
}

/* "h1:p1,h2:p2,..." (obx__url's hosts) into c->host/port; a bracketed IPv6 address keeps its
 * brackets off. */
static obx_err parse_hosts(amqp_cfg *c, const char *hosts) {
    char list[1024];
    obx__strlcpy(list, hosts, sizeof list);
    c->n_hosts = 0;
    for (char *save = NULL, *h = strtok_r(list, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        const char *colon = strrchr(h, ':');
        if (c->n_hosts == HOSTS_MAX)
            return obx__fail(OBX_EURL, "broker URL: amqp lists more than %d hosts", HOSTS_MAX);
        if (!colon || colon == h || (size_t)(colon - h) >= sizeof c->host[0] || !colon[1])
            return obx__fail(OBX_EURL, "broker URL: amqp needs HOST:PORT (each of a list)");
        bool v6 = h[0] == '[' && colon[-1] == ']';
        size_t len = (size_t)(colon - h) - (v6 ? 2 : 0);
        memcpy(c->host[c->n_hosts], h + (v6 ? 1 : 0), len);
        c->host[c->n_hosts][len] = '\0';
        c->port[c->n_hosts++] = atoi(colon + 1);
    }
    return c->n_hosts ? OBX_OK : obx__fail(OBX_EURL, "broker URL: amqp needs HOST:PORT");
}

static obx_err parse_cfg(const obx__url *u, const char *const *props, size_t n_props, amqp_cfg *c) {
    memset(c, 0, sizeof *c);
    c->tls = u->scheme == OBX__URL_AMQPS;
    c->window = 500;
    c->confirm_timeout_ms = 30000;
    c->connect_timeout_ms = 5000;
    c->rpc_timeout_ms = 15000;
    c->heartbeat_s = 30;
    c->reconnect_backoff_ms = 1000;
    c->reconnect_backoff_max_ms = 30000;
    c->prefetch = 100;
    c->verify_peer = c->verify_hostname = true;
    strcpy(c->exchange_type, "topic");
    strcpy(c->queue_type, "quorum");
    strcpy(c->bind_key, "#");
    strcpy(c->audit_key, "#");
    c->lookup_timeout_ms = 10000;
    c->lookup_prefetch = 1000;
    c->lookup_skew_ms = 60000;
    c->queue_max_length = -1;
    obx_err he = parse_hosts(c, u->hosts);
    if (he) return he;
    obx__strlcpy(c->user, u->user[0] ? u->user : "guest", sizeof c->user);
    obx__strlcpy(c->password, u->user[0] ? u->password : "guest", sizeof c->password);
    obx__strlcpy(c->vhost, u->vhost[0] ? u->vhost : "/", sizeof c->vhost);
    char vh[3 * sizeof c->vhost]; /* the vhost as a URL writes it ("/" is %2f) */
    size_t o = 0;
    for (const char *p = u->vhost; *p && o + 4 < sizeof vh; p++) {
        if (*p == '/' || *p == '%' || *p == '?' || *p == '&')
            o += (size_t)snprintf(vh + o, sizeof vh - o, "%%%02x", (unsigned char)*p);
        else
            vh[o++] = *p;
    }
    vh[o] = '\0';
    snprintf(c->where, sizeof c->where, "%s://%s:***@%s/%s", c->tls ? "amqps" : "amqp", c->user,
             u->hosts, vh);
    /* URL query first, then properties (a property overrides the URL) */
    char q[1024];
    obx__strlcpy(q, u->query, sizeof q);
    obx_err e = OBX_OK;
    for (char *save = NULL, *kv = strtok_r(q, "&", &save); kv && !e;
         kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return obx__fail(OBX_EURL, "broker URL: amqp option '%s' needs a value", kv);
        *eq = '\0';
        char val[1024];
        if (pct_decode(eq + 1, val, sizeof val))
            return obx__fail(OBX_EURL, "broker URL: amqp option '%s': bad %%-escape", kv);
        e = parse_kv(c, kv, val);
    }
    for (size_t i = 0; i < n_props && !e; i++) {
        const char *eq = props[i] ? strchr(props[i], '=') : NULL;
        /* not echoed: it may be a password typed without its key */
        if (!eq) return obx__fail(OBX_ECONFIG, "amqp property #%zu: expected key=value", i + 1);
        char k[64];
        if ((size_t)(eq - props[i]) >= sizeof k)
            return obx__fail(OBX_ECONFIG, "amqp property name too long");
        memcpy(k, props[i], (size_t)(eq - props[i]));
        k[eq - props[i]] = '\0';
        e = parse_kv(c, k, eq + 1);
    }
    if (e) return e;
    if (strcmp(c->queue_type, "quorum") && strcmp(c->queue_type, "classic") &&
        strcmp(c->queue_type, "stream"))
        return obx__fail(OBX_ECONFIG, "amqp property queue_type='%s': quorum, classic or stream",
                         c->queue_type);
    if (strcmp(c->exchange_type, "topic") && strcmp(c->exchange_type, "direct") &&
        strcmp(c->exchange_type, "fanout") && strcmp(c->exchange_type, "headers"))
        return obx__fail(OBX_ECONFIG,
                         "amqp property exchange_type='%s': topic, direct, fanout or headers",
                         c->exchange_type);
    if (c->queue_overflow[0] && strcmp(c->queue_overflow, "drop-head") &&
        strcmp(c->queue_overflow, "reject-publish") &&
        strcmp(c->queue_overflow, "reject-publish-dlx"))
        return obx__fail(OBX_ECONFIG,
                         "amqp property queue_overflow='%s': drop-head, reject-publish or "
                         "reject-publish-dlx",
                         c->queue_overflow);
    if (c->declare_queue[0] && !c->declare_exchange[0])
        return obx__fail(OBX_ECONFIG,
                         "amqp property declare_queue needs declare_exchange (the queue is bound "
                         "to it)");
    if ((c->cert[0] != 0) != (c->key[0] != 0))
        return obx__fail(OBX_ECONFIG, "amqp properties cert and key go together");
    if (!c->tls && (c->cacert[0] || c->cert[0]))
        return obx__fail(OBX_ECONFIG, "amqp: cacert/cert/key need an amqps:// URL");
    if (!c->audit_bind[0] && c->audit_stream[0])
        obx__strlcpy(c->audit_bind, c->declare_exchange, sizeof c->audit_bind);
    return OBX_OK;
}

/* ---- connections ---------------------------------------------------------------------------- */

static void aconn_drop(aconn *c, bool polite, int timeout_ms) {
    if (!c->st) return;
    if (polite && c->up) {
        struct timeval tv = tv_ms(timeout_ms);
        amqp_set_rpc_timeout(c->st, &tv);
        amqp_connection_close(c->st, AMQP_REPLY_SUCCESS);
    }
    amqp_destroy_connection(c->st);
    c->st = NULL;
    c->up = false;
}

/* RabbitMQ's cluster name ("rabbit@host") mapped into the cluster identity charset. */
static void sanitize_cluster(const char *in, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < cap && o < OBX_NAME_MAX; i++) {
        char ch = in[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-';
        out[o++] = ok ? ch : '-';
    }
    out[o] = '\0';
}

static void learn_cluster(amqp_broker *b, amqp_connection_state_t st) {
    if (b->cfg.cluster[0]) {
        obx__strlcpy(b->cluster, b->cfg.cluster, sizeof b->cluster);
        return;
    }
    const amqp_table_t *sp = amqp_get_server_properties(st);
    for (int i = 0; sp && i < sp->num_entries; i++) {
        const amqp_table_entry_t *en = &sp->entries[i];
        if (bytes_eq(en->key, "cluster_name") &&
            (en->value.kind == AMQP_FIELD_KIND_UTF8 || en->value.kind == AMQP_FIELD_KIND_BYTES)) {
            sanitize_cluster(en->value.value.bytes.bytes, en->value.value.bytes.len, b->cluster,
                             sizeof b->cluster);
            return;
        }
    }
    if (!b->cluster[0]) snprintf(b->cluster, sizeof b->cluster, "rabbitmq-%s", b->cfg.host[0]);
}

/* The CA file libcrypto would use by default (honours SSL_CERT_FILE). */
static const char *default_ca_file(void) {
    const char *env = getenv(X509_get_default_cert_file_env());
    return env && *env ? env : X509_get_default_cert_file();
}

/* Opens a connection with channel CH to the URL's node `node`. `purpose` names it in messages
 * and on the broker; NULL: the connection every handle opens first, a publisher's or a
 * consumer's (messages name no role; the broker sees "publisher"). */
static obx_err aconn_open_node(amqp_broker *b, aconn *c, const char *purpose, int node) {
    const amqp_cfg *cf = &b->cfg;
    aconn_drop(c, false, 0);
    c->st = amqp_new_connection();
    if (!c->st) return obx__fail(OBX_ENOMEM, "amqp: out of memory");
    amqp_socket_t *sock = cf->tls ? amqp_ssl_socket_new(c->st) : amqp_tcp_socket_new(c->st);
    obx_err e = OBX_OK;
    if (!sock) {
        e = obx__fail(OBX_EBROKER, "amqp %s: cannot create the %s socket", cf->where,
                      cf->tls ? "TLS" : "TCP");
        goto fail;
    }
    if (cf->tls) {
        amqp_ssl_socket_set_verify_peer(sock, cf->verify_peer);
        amqp_ssl_socket_set_verify_hostname(sock, cf->verify_hostname);
        const char *ca = cf->cacert[0] ? cf->cacert : default_ca_file();
        if (cf->verify_peer || cf->cacert[0]) {
            if (access(ca, R_OK) != 0) {
                e = obx__fail(OBX_ECONFIG,
                              "amqp %s: CA file '%s' is not readable (set cacert=PATH, or "
                              "verify_peer=0 to skip verification)",
                              cf->where, ca);
                goto fail;
            }
            if (amqp_ssl_socket_set_cacert(sock, ca) != AMQP_STATUS_OK) {
                e = obx__fail(OBX_ECONFIG, "amqp %s: CA file '%s' could not be loaded", cf->where,
                              ca);
                goto fail;
            }
        }
        if (cf->cert[0] && amqp_ssl_socket_set_key(sock, cf->cert, cf->key) != AMQP_STATUS_OK) {
            e = obx__fail(OBX_ECONFIG, "amqp %s: client certificate '%s' / key '%s' not loaded",
                          cf->where, cf->cert, cf->key);
            goto fail;
        }
    }
    struct timeval tv = tv_ms(cf->connect_timeout_ms);
    int rc = amqp_socket_open_noblock(sock, cf->host[node], cf->port[node], &tv);
    if (rc != AMQP_STATUS_OK) {
        e = obx__fail(OBX_EBROKER, "amqp %s: %s%scannot connect%s%s:%d: %s", cf->where,
                      purpose ? purpose : "", purpose ? ": " : "", cf->n_hosts > 1 ? " to " : "",
                      cf->n_hosts > 1 ? cf->host[node] : "", cf->port[node],
                      amqp_error_string2(rc));
        goto fail;
    }
    amqp_set_handshake_timeout(c->st, &tv);
    struct timeval rpc = tv_ms(cf->rpc_timeout_ms);
    amqp_set_rpc_timeout(c->st, &rpc);
    char cname[128];
    snprintf(cname, sizeof cname, "obx %s (pid %d)", purpose ? purpose : "publisher",
             (int)getpid());
    amqp_table_entry_t caps[2] = {
        {.key = bytes_of("connection.blocked"),
         .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1}},
        {.key = bytes_of("consumer_cancel_notify"),
         .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1}},
    };
    amqp_table_entry_t pe[2] = {
        {.key = bytes_of("connection_name"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of(cname)}},
        {.key = bytes_of("capabilities"),
         .value = {.kind = AMQP_FIELD_KIND_TABLE, .value.table = {2, caps}}},
    };
    amqp_table_t props = {2, pe};
    amqp_rpc_reply_t r =
        amqp_login_with_properties(c->st, cf->vhost, 0, 131072, cf->heartbeat_s, &props,
                                   AMQP_SASL_METHOD_PLAIN, cf->user, cf->password);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        e = rpc_fail(b, OBX_EBROKER, "login", r);
        goto fail;
    }
    amqp_channel_open(c->st, CH);
    r = amqp_get_rpc_reply(c->st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        e = rpc_fail(b, OBX_EBROKER, "channel.open", r);
        goto fail;
    }
    c->up = true;
    c->gen++;
    c->node = node;
    b->stats.connects++;
    learn_cluster(b, c->st);
    return OBX_OK;
fail:
    aconn_drop(c, false, 0);
    return e;
}

/* Opens c on the first node of the URL that takes it, from the node c used last, or from the
 * next one when c had been connected (its connection died or was dropped: its node may be the
 * one that is gone). The error is the last node's. */
static obx_err aconn_open(amqp_broker *b, aconn *c, const char *purpose) {
    int n = b->cfg.n_hosts, first = (c->node + (c->gen > 0 ? 1 : 0)) % n;
    obx_err e = OBX_OK;
    for (int k = 0; k < n; k++) {
        e = aconn_open_node(b, c, purpose, (first + k) % n);
        if (e != OBX_EBROKER) return e; /* connected, or an error no other node changes */
    }
    return e;
}

/* ---- declarations (open time; for tests, demos and the audit stream) --------------------- */

static obx_err declare_queue(amqp_broker *b, amqp_connection_state_t st, const char *name,
                             const char *type, long long max_len, const char *overflow,
                             const char *max_age) {
    amqp_table_entry_t a[4];
    int n = 0;
    a[n++] = (amqp_table_entry_t){
        .key = bytes_of("x-queue-type"),
        .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of(type)}};
    if (max_len >= 0)
        a[n++] = (amqp_table_entry_t){
            .key = bytes_of("x-max-length"),
            .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = (int64_t)max_len}};
    if (overflow && overflow[0])
        a[n++] = (amqp_table_entry_t){
            .key = bytes_of("x-overflow"),
            .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of(overflow)}};
    if (max_age && max_age[0])
        a[n++] = (amqp_table_entry_t){
            .key = bytes_of("x-max-age"),
            .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of(max_age)}};
    amqp_table_t args = {n, a};
    amqp_queue_declare(st, CH, bytes_of(name), 0, 1, 0, 0, args);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        char what[300];
        snprintf(what, sizeof what, "declare %s queue '%s'", type, name);
        return rpc_fail(b, OBX_EBROKER, what, r);
    }
    return OBX_OK;
}

static obx_err bind_queue(amqp_broker *b, amqp_connection_state_t st, const char *queue,
                          const char *exchange, const char *key) {
    amqp_queue_bind(st, CH, bytes_of(queue), bytes_of(exchange), bytes_of(key), amqp_empty_table);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        char what[600];
        snprintf(what, sizeof what, "bind queue '%s' to exchange '%s' with key '%s'", queue,
                 exchange, key);
        return rpc_fail(b, OBX_EBROKER, what, r);
    }
    return OBX_OK;
}

static obx_err run_declarations(amqp_broker *b, amqp_connection_state_t st) {
    const amqp_cfg *c = &b->cfg;
    obx_err e;
    amqp_rpc_reply_t r;
    if (c->declare_exchange[0]) {
        amqp_exchange_declare(st, CH, bytes_of(c->declare_exchange), bytes_of(c->exchange_type), 0,
                              1, 0, 0, amqp_empty_table);
        r = amqp_get_rpc_reply(st);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            char what[300];
            snprintf(what, sizeof what, "declare %s exchange '%s'", c->exchange_type,
                     c->declare_exchange);
            return rpc_fail(b, OBX_EBROKER, what, r);
        }
    }
    if (c->declare_queue[0]) {
        if ((e = declare_queue(b, st, c->declare_queue, c->queue_type, c->queue_max_length,
                               c->queue_overflow, NULL)) ||
            (e = bind_queue(b, st, c->declare_queue, c->declare_exchange, c->bind_key)))
            return e;
    }
    if (c->audit_stream[0] && c->audit_bind[0]) {
        /* declared and bound by us; without audit_bind, ab_open checks that it exists */
        if ((e = declare_queue(b, st, c->audit_stream, "stream", -1, NULL, c->audit_max_age)) ||
            (e = bind_queue(b, st, c->audit_stream, c->audit_bind, c->audit_key)))
            return e;
    }
    return OBX_OK;
}

/* ---- outcomes ------------------------------------------------------------------------------ */

/* Makes room for k more outcomes, so that settling what send() and poll() can settle never
 * fails for memory: every message handed over must get its outcome. */
static obx_err reserve(amqp_broker *b, size_t k) {
    if (b->ready_head > 0 && b->ready_head + b->ready_n + k > b->ready_cap) {
        memmove(b->ready, b->ready + b->ready_head, b->ready_n * sizeof *b->ready);
        b->ready_head = 0;
    }
    if (b->ready_n + k <= b->ready_cap) return OBX_OK;
    size_t c = b->ready_cap ? b->ready_cap : 256;
    while (c < b->ready_n + k) c *= 2;
    obx__outcome *p = realloc(b->ready, c * sizeof *p);
    if (!p) return obx__fail(OBX_ENOMEM, "amqp: out of memory (outcomes)");
    b->ready = p;
    b->ready_cap = c;
    return OBX_OK;
}

static obx_err push_ready(amqp_broker *b, const obx__outcome *o) {
    obx_err e = reserve(b, 1);
    if (e) return e;
    b->ready[b->ready_head + b->ready_n++] = *o;
    switch (o->kind) {
    case OBX__OUT_UNKNOWN: b->stats.unknown++; break;
    case OBX__OUT_NOT_SENT: b->stats.not_sent++; break;
    default: break;
    }
    return OBX_OK;
}

static void identity(amqp_broker *b, const obx__msg *m, obx__outcome *o) {
    memset(o, 0, sizeof *o);
    obx__strlcpy(o->event_id, m->env->event_id, sizeof o->event_id);
    o->envelope_gen = m->env->envelope_gen;
    obx__strlcpy(o->attempt_id, m->attempt_id, sizeof o->attempt_id);
    obx__strlcpy(o->payload_digest, m->env->payload_digest, sizeof o->payload_digest);
    obx__strlcpy(o->dest_digest, m->dest_digest, sizeof o->dest_digest);
    obx__strlcpy(o->cluster, b->cluster, sizeof o->cluster);
    obx__strlcpy(o->topic, m->dest->topic, sizeof o->topic);
    o->partition = 0;
    o->offset = -1;
}

static obx_err decided(amqp_broker *b, const obx__msg *m, obx__outcome_kind k, const char *fmt, ...)
    OBX__PRINTF(4, 5);
static obx_err decided(amqp_broker *b, const obx__msg *m, obx__outcome_kind k, const char *fmt,
                       ...) {
    obx__outcome o;
    identity(b, m, &o);
    o.kind = k;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o.reason, sizeof o.reason, fmt, ap);
    va_end(ap);
    return push_ready(b, &o);
}

static pend *slot(amqp_broker *b, uint64_t seq) {
    return &b->ring[(b->head + (size_t)(seq - b->head_seq)) % (size_t)b->cfg.window];
}

static void advance(amqp_broker *b) {
    while (b->head_seq < b->next_seq && !b->ring[b->head].waiting) {
        b->head = (b->head + 1) % (size_t)b->cfg.window;
        b->head_seq++;
    }
}

/* Settles one waiting publish. A returned one is a REJECT whatever the confirm says. */
static obx_err settle(amqp_broker *b, pend *p, obx__outcome_kind k, const char *reason) {
    obx__outcome *o = &p->out;
    if (p->returned) {
        o->kind = OBX__OUT_REJECT; /* reason was set by the return */
    } else {
        o->kind = k;
        if (k == OBX__OUT_ACK) {
            o->offset = (int64_t)p->seq;
            o->broker_ts = obx__wall_ms();
            o->reason[0] = '\0';
        } else
            obx__strlcpy(o->reason, reason, sizeof o->reason);
    }
    p->waiting = false;
    b->n_waiting--;
    return push_ready(b, o);
}

static obx_err on_confirm(amqp_broker *b, uint64_t tag, bool multiple, bool ack) {
    if (tag < b->head_seq || tag >= b->next_seq) return OBX_OK; /* already settled */
    uint64_t from = multiple ? b->head_seq : tag;
    obx_err e = OBX_OK;
    for (uint64_t s = from; s <= tag && !e; s++) {
        pend *p = slot(b, s);
        if (!p->waiting) continue;
        if (ack && !p->returned) b->stats.acked++;
        if (!ack) b->stats.nacked++;
        e = settle(b, p, ack ? OBX__OUT_ACK : OBX__OUT_REJECT,
                   "basic.nack: the broker refused the message (a queue rejected it, e.g. "
                   "x-overflow=reject-publish, or failed to store it)");
    }
    advance(b);
    return e;
}

/* The connection is gone (or is being dropped): every unconfirmed publish is settled. With a
 * culprit (the message a channel.close names), those before it are UNKNOWN, it is REJECT, and
 * those after it NOT_SENT — the broker discards everything on a channel after closing it. */
static void lose(amqp_broker *b, const char *why, uint64_t culprit, const char *culprit_reason) {
    char unk[OBX_TEXT_MAX + 1], after[OBX_TEXT_MAX + 1];
    snprintf(unk, sizeof unk, "no confirm before the connection was lost (%s): possibly persisted",
             why);
    snprintf(after, sizeof after, "discarded by the broker after it closed the channel (%s)", why);
    for (uint64_t s = b->head_seq; s < b->next_seq; s++) {
        pend *p = slot(b, s);
        if (!p->waiting) continue;
        if (culprit && s == culprit) {
            p->returned = false;
            settle(b, p, OBX__OUT_REJECT, culprit_reason);
        } else if (culprit && s > culprit && !p->returned)
            settle(b, p, OBX__OUT_NOT_SENT, after);
        else
            settle(b, p, OBX__OUT_UNKNOWN, unk);
    }
    b->head = 0;
    b->head_seq = b->next_seq = 1;
    b->blocked = false;
    if (b->pub.st) b->stats.losses++;
    aconn_drop(&b->pub, false, 0);
    obx__strlcpy(b->down_reason, why, sizeof b->down_reason);
}

/* Which unconfirmed publish a channel.close is about, when the broker's words name one:
 * "NOT_FOUND - no exchange 'X' in vhost 'V'" -> the first unconfirmed publish to X;
 * "PRECONDITION_FAILED - message size N is larger than configured max size M" -> the first of
 * N bytes. 0 when it names none (then all are UNKNOWN). */
static uint64_t culprit_of(amqp_broker *b, unsigned code, const char *text) {
    const char *p;
    if (code == 404 && (p = strstr(text, "no exchange '"))) {
        p += strlen("no exchange '");
        const char *q = strchr(p, '\'');
        if (!q) return 0;
        for (uint64_t s = b->head_seq; s < b->next_seq; s++) {
            pend *x = slot(b, s);
            if (x->waiting && strlen(x->out.topic) == (size_t)(q - p) &&
                !memcmp(x->out.topic, p, (size_t)(q - p)))
                return s;
        }
    }
    if (code == 406 && (p = strstr(text, "message size "))) {
        unsigned long long n = strtoull(p + strlen("message size "), NULL, 10);
        for (uint64_t s = b->head_seq; s < b->next_seq; s++) {
            pend *x = slot(b, s);
            if (x->waiting && x->body_len == n) return s;
        }
    }
    return 0;
}

static int64_t header_i64(const amqp_table_t *t, const char *name, int64_t dflt) {
    for (int i = 0; t && i < t->num_entries; i++) {
        const amqp_table_entry_t *en = &t->entries[i];
        if (!bytes_eq(en->key, name)) continue;
        switch (en->value.kind) {
        case AMQP_FIELD_KIND_I64: return en->value.value.i64;
        case AMQP_FIELD_KIND_U64: return (int64_t)en->value.value.u64;
        case AMQP_FIELD_KIND_I32: return en->value.value.i32;
        case AMQP_FIELD_KIND_U32: return en->value.value.u32;
        case AMQP_FIELD_KIND_I16: return en->value.value.i16;
        case AMQP_FIELD_KIND_U16: return en->value.value.u16;
        default: return dflt;
        }
    }
    return dflt;
}

static const amqp_bytes_t *header_bytes(const amqp_table_t *t, const char *name) {
    for (int i = 0; t && i < t->num_entries; i++) {
        const amqp_table_entry_t *en = &t->entries[i];
        if (bytes_eq(en->key, name) &&
            (en->value.kind == AMQP_FIELD_KIND_UTF8 || en->value.kind == AMQP_FIELD_KIND_BYTES))
            return &en->value.value.bytes;
    }
    return NULL;
}

/* Handles one frame on the publisher connection. */
static void pub_frame(amqp_broker *b, const amqp_frame_t *f) {
    if (f->frame_type != AMQP_FRAME_METHOD) return;
    amqp_connection_state_t st = b->pub.st;
    switch (f->payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
        const amqp_basic_ack_t *a = f->payload.method.decoded;
        on_confirm(b, a->delivery_tag, a->multiple, true);
        break;
    }
    case AMQP_BASIC_NACK_METHOD: {
        const amqp_basic_nack_t *n = f->payload.method.decoded;
        on_confirm(b, n->delivery_tag, n->multiple, false);
        break;
    }
    case AMQP_BASIC_RETURN_METHOD: {
        const amqp_basic_return_t *r = f->payload.method.decoded;
        char reason[OBX_TEXT_MAX + 1];
        snprintf(reason, sizeof reason,
                 "unroutable: basic.return %u %.*s (exchange '%.*s', routing key '%.*s')",
                 (unsigned)r->reply_code, (int)r->reply_text.len, (const char *)r->reply_text.bytes,
                 (int)r->exchange.len, (const char *)r->exchange.bytes, (int)r->routing_key.len,
                 (const char *)r->routing_key.bytes);
        amqp_message_t msg;
        amqp_rpc_reply_t rr = amqp_read_message(st, f->channel, &msg, 0);
        if (rr.reply_type != AMQP_RESPONSE_NORMAL) {
            char t[200];
            reply_text(rr, t, sizeof t);
            lose(b, t, 0, NULL);
            return;
        }
        const amqp_table_t *h =
            (msg.properties._flags & AMQP_BASIC_HEADERS_FLAG) ? &msg.properties.headers : NULL;
        int64_t seq = header_i64(h, H_PUBLISH_SEQ, 0);
        if (seq >= (int64_t)b->head_seq && (uint64_t)seq < b->next_seq) {
            pend *p = slot(b, (uint64_t)seq);
            if (p->waiting && !p->returned) {
                p->returned = true;
                b->stats.returned++;
                obx__strlcpy(p->out.reason, reason, sizeof p->out.reason);
            }
        }
        amqp_destroy_message(&msg);
        break;
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
        const amqp_channel_close_t *m = f->payload.method.decoded;
        char text[OBX_TEXT_MAX + 1];
        snprintf(text, sizeof text, "channel closed by the broker: %u %.*s",
                 (unsigned)m->reply_code, (int)m->reply_text.len,
                 (const char *)m->reply_text.bytes);
        uint64_t c = culprit_of(b, m->reply_code, text);
        amqp_channel_close_ok_t ok = {0};
        amqp_send_method(st, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
        lose(b, text, c, text);
        break;
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
        const amqp_connection_close_t *m = f->payload.method.decoded;
        char text[OBX_TEXT_MAX + 1];
        snprintf(text, sizeof text, "connection closed by the broker: %u %.*s",
                 (unsigned)m->reply_code, (int)m->reply_text.len,
                 (const char *)m->reply_text.bytes);
        amqp_connection_close_ok_t ok = {0};
        amqp_send_method(st, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        lose(b, text, 0, NULL);
        break;
    }
    case AMQP_CONNECTION_BLOCKED_METHOD: {
        const amqp_connection_blocked_t *m = f->payload.method.decoded;
        b->blocked = true;
        snprintf(b->blocked_reason, sizeof b->blocked_reason, "%.*s", (int)m->reason.len,
                 (const char *)m->reason.bytes);
        break;
    }
    case AMQP_CONNECTION_UNBLOCKED_METHOD: b->blocked = false; break;
    default: break; /* nothing else is expected on a publishing channel */
    }
}

/* Reads publisher frames: waits up to wait_ms for the first one that settles something, then
 * takes whatever else is already there without waiting. Services heartbeats on the way. */
static void pump(amqp_broker *b, int64_t wait_ms) {
    if (!b->pub.up) return;
    int64_t deadline = mono() + wait_ms;
    size_t settled0 = b->ready_n;
    for (;;) {
        int64_t left = deadline - mono();
        if (b->ready_n != settled0) left = 0; /* progress: only drain what is there */
        struct timeval tv = tv_ms(left);
        amqp_frame_t f;
        int rc = amqp_simple_wait_frame_noblock(b->pub.st, &f, &tv);
        if (rc == AMQP_STATUS_TIMEOUT) break;
        if (rc != AMQP_STATUS_OK) {
            char why[160];
            snprintf(why, sizeof why, "%s", amqp_error_string2(rc));
            lose(b, why, 0, NULL);
            return;
        }
        pub_frame(b, &f);
        if (!b->pub.up) return;
    }
    if (!amqp_frames_enqueued(b->pub.st)) amqp_maybe_release_buffers(b->pub.st);
}

/* A publish unconfirmed for longer than confirm_timeout_ms: something is wrong with this
 * connection; drop it so that its outcomes become UNKNOWN now rather than never. */
static void check_confirm_timeout(amqp_broker *b) {
    if (!b->pub.up || b->head_seq == b->next_seq) return;
    const pend *oldest = slot(b, b->head_seq);
    if (mono() - oldest->sent_ms > b->cfg.confirm_timeout_ms) {
        char why[96];
        snprintf(why, sizeof why, "no confirm within confirm_timeout_ms=%d",
                 b->cfg.confirm_timeout_ms);
        lose(b, why, 0, NULL);
    }
}

/* Connects the publisher (confirm mode), unless it is up or the backoff has not passed. */
static void ensure_pub(amqp_broker *b) {
    if (b->pub.up) return;
    if (mono() < b->next_connect_ms) return; /* down_reason still says why */
    obx_err e = aconn_open(b, &b->pub, "publisher");
    if (!e) {
        amqp_confirm_select(b->pub.st, CH);
        amqp_rpc_reply_t r = amqp_get_rpc_reply(b->pub.st);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            e = rpc_fail(b, OBX_EBROKER, "confirm.select", r);
            aconn_drop(&b->pub, false, 0);
        }
    }
    if (e) {
        /* a host that does not answer costs connect_timeout_ms per attempt: back off so that
         * sends meanwhile come back NOT_SENT at once instead of each waiting for it */
        obx__strlcpy(b->down_reason, obx_errmsg(), sizeof b->down_reason);
        b->backoff_ms = b->backoff_ms ? b->backoff_ms * 2 : b->cfg.reconnect_backoff_ms;
        if (b->backoff_ms > b->cfg.reconnect_backoff_max_ms)
            b->backoff_ms = b->cfg.reconnect_backoff_max_ms;
        b->next_connect_ms = mono() + b->backoff_ms;
        return;
    }
    b->backoff_ms = 0;
    b->head = 0;
    b->head_seq = b->next_seq = 1; /* confirm.select numbers publishes from 1 */
    b->blocked = false;
}

/* ---- vtable: open / close / identity ------------------------------------------------------ */

/* Forgets the held and the unsettled deliveries: after a lost session (or a new subscription)
 * the broker has them requeued already, and delivers them again. */
static void held_clear(amqp_broker *b) {
    for (size_t i = 0; i < b->n_held; i++) obx__delivery_free(&b->held[i]);
    b->n_held = 0;
    for (size_t i = 0; i < b->n_unacked; i++) obx__delivery_free(&b->unacked[i]);
    b->n_unacked = 0;
}

static void ab_close(obx__broker *base) {
    amqp_broker *b = (amqp_broker *)base;
    if (!b) return;
    /* unconfirmed publishes get no outcome: they stay SENDING and the lease sweeper makes them
     * UNKNOWN (broker.h) */
    aconn_drop(&b->pub, true, 2000);
    aconn_drop(&b->con, true, 2000);
    free(b->ring);
    free(b->ready);
    free(b->queues);
    held_clear(b);
    free(b->held);
    free(b->unacked);
    free(b->paused);
    explicit_bzero(b->cfg.password, sizeof b->cfg.password); /* none left in freed memory */
    free(b);
}

static obx_err ab_open(const obx__url *u, const char *const *props, size_t n_props,
                       obx__broker **out) {
    amqp_broker *b = calloc(1, sizeof *b);
    if (!b) return obx__fail(OBX_ENOMEM, "amqp: out of memory");
    b->base.m = &obx__amqp_broker_methods;
    obx_err e = parse_cfg(u, props, n_props, &b->cfg);
    if (!e) {
        b->ring = calloc((size_t)b->cfg.window, sizeof *b->ring);
        if (!b->ring) e = obx__fail(OBX_ENOMEM, "amqp: out of memory (confirm window)");
    }
    /* connect now: a wrong password, vhost or TLS setting is a configuration error the
     * operator should see at start, not as NOT_SENT outcomes later (a consumer's process too:
     * its messages name no publisher) */
    if (!e) e = aconn_open(b, &b->pub, NULL);
    if (!e) e = run_declarations(b, b->pub.st);
    if (!e && b->cfg.audit_stream[0] && !b->cfg.audit_bind[0]) {
        /* not declared by us: it must exist */
        amqp_queue_declare(b->pub.st, CH, bytes_of(b->cfg.audit_stream), 1, 0, 0, 0,
                           amqp_empty_table);
        amqp_rpc_reply_t r = amqp_get_rpc_reply(b->pub.st);
        if (r.reply_type != AMQP_RESPONSE_NORMAL)
            e = rpc_fail(b, OBX_ECONFIG, "audit_stream (set audit_bind to declare it)", r);
    }
    if (!e) {
        amqp_confirm_select(b->pub.st, CH);
        amqp_rpc_reply_t r = amqp_get_rpc_reply(b->pub.st);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) e = rpc_fail(b, OBX_EBROKER, "confirm.select", r);
    }
    if (e) {
        ab_close(&b->base);
        return e;
    }
    b->head_seq = b->next_seq = 1;
    *out = &b->base;
    return OBX_OK;
}

static obx_err ab_cluster_id(obx__broker *base, char *out, size_t cap) {
    amqp_broker *b = (amqp_broker *)base;
    obx__strlcpy(out, b->cluster, cap); /* set at open (URL/property or the server's name) */
    return OBX_OK;
}

static obx_err ab_partition_for(obx__broker *base, const obx__dest *d, int32_t *out) {
    (void)base;
    (void)d;
    *out = 0; /* an exchange has no partitions: routing is by the routing key */
    return OBX_OK;
}

static unsigned ab_caps_of(obx__broker *base) {
    amqp_broker *b = (amqp_broker *)base;
    unsigned c = OBX__BCAP_CONSUME;
    if (b->cfg.audit_stream[0]) c |= OBX__BCAP_LOOKUP_BEST_EFFORT | OBX__BCAP_SCAN;
    return c;
}

/* Durability is the delivery mode; required_acks "all"/"confirm" is what publisher confirms
 * give (for a quorum queue, a majority of its replicas); nothing here can acknowledge before the
 * broker stored the message ("1"). The serializer travels as the content-type header. */
static void ab_contract(obx__broker *base, obx__contract *out) {
    (void)base;
    obx__strlcpy(out->durability, "persistent,transient", sizeof out->durability);
    obx__strlcpy(out->required_acks, "all,confirm", sizeof out->required_acks);
    obx__strlcpy(out->serializer, "*", sizeof out->serializer);
}

static int64_t ab_quiet(obx__broker *base) {
    amqp_broker *b = (amqp_broker *)base;
    /* a publish can still land while its connection lives: at most until the confirm timeout
     * drops it, or until the broker notices a dead client (two missed heartbeats) */
    return (int64_t)b->cfg.confirm_timeout_ms +
           2000LL * (b->cfg.heartbeat_s ? b->cfg.heartbeat_s : 60);
}

/* ---- send / poll ---------------------------------------------------------------------------- */

static int publish_one(amqp_broker *b, const obx__msg *m, uint64_t seq, int64_t now) {
    obx__headers h;
    obx__headers_build(m, &h);
    amqp_table_entry_t e[18];
    int n = 0;
    for (size_t i = 0; i < h.n; i++)
        e[n++] = (amqp_table_entry_t){
            .key = bytes_of(h.name[i]),
            .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of(h.value[i])}};
    e[n++] =
        (amqp_table_entry_t){.key = bytes_of(H_PUBLISH_SEQ),
                             .value = {.kind = AMQP_FIELD_KIND_I64, .value.i64 = (int64_t)seq}};
    amqp_basic_properties_t p;
    memset(&p, 0, sizeof p);
    p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
               AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG |
               AMQP_BASIC_HEADERS_FLAG;
    /* the frozen contract's durability (honoured: ab_contract); transient = delivery mode 1 */
    p.delivery_mode = m->dest && !strcmp(m->dest->durability, "transient") ? 1 : 2;
    p.message_id = bytes_of(m->env->event_id);
    p.timestamp = (uint64_t)(now > 0 ? now / 1000 : 0);
    p.type = bytes_of(m->env->event_type);
    p.app_id = bytes_of("obx");
    p.headers = (amqp_table_t){n, e};
    if (m->env->correlation_id[0]) {
        p._flags |= AMQP_BASIC_CORRELATION_ID_FLAG;
        p.correlation_id = bytes_of(m->env->correlation_id);
    }
    amqp_bytes_t body = {m->payload_len, (void *)(uintptr_t)(m->payload ? m->payload : "")};
    return amqp_basic_publish(b->pub.st, CH, bytes_of(m->dest->topic),
                              bytes_of(m->dest->routing_key), 1, 0, &p, body);
}

static obx_err ab_send(obx__broker *base, const obx__msg *m, size_t n, int64_t now) {
    amqp_broker *b = (amqp_broker *)base;
    obx_err e = reserve(b, n + (size_t)b->cfg.window);
    if (e) return e;
    pump(b, 0); /* confirms, a close, a block, heartbeats: learn them before sending more */
    ensure_pub(b);
    for (size_t i = 0; i < n && !e; i++) {
        const obx__msg *msg = &m[i];
        if (msg->partition != 0) {
            e = decided(b, msg, OBX__OUT_REJECT,
                        "partition %d does not exist (an AMQP exchange has partition 0 only)",
                        (int)msg->partition);
            continue;
        }
        /* wait for room in the confirm window; this is the only place send() blocks */
        while (b->pub.up && !b->blocked && b->next_seq - b->head_seq >= (uint64_t)b->cfg.window) {
            int64_t left = slot(b, b->head_seq)->sent_ms + b->cfg.confirm_timeout_ms - mono();
            if (left <= 0) {
                check_confirm_timeout(b);
                break;
            }
            pump(b, left);
        }
        if (!b->pub.up) {
            e = decided(b, msg, OBX__OUT_NOT_SENT, "not sent: no connection: %s", b->down_reason);
            continue;
        }
        if (b->blocked) {
            e = decided(b, msg, OBX__OUT_NOT_SENT,
                        "not sent: the broker blocked the connection (%s)", b->blocked_reason);
            continue;
        }
        int64_t wall = obx__ref_ms(); /* the clock the deadline is on */
        if (msg->deadline && (now > wall ? now : wall) > msg->deadline) {
            /* broker.h: never publish an attempt after its deadline (it may have waited here
             * for room in the confirm window, or the process was frozen) */
            char at[32];
            obx__iso_ms(msg->deadline, at); /* reasons reach operators: ISO, never epoch ms */
            e = decided(b, msg, OBX__OUT_NOT_SENT, "attempt deadline %s passed before publish", at);
            continue;
        }
        uint64_t seq = b->next_seq;
        int rc = publish_one(b, msg, seq, now);
        if (rc != AMQP_STATUS_OK) {
            /* the last frame of this message was not written: the broker cannot have it */
            char why[160];
            snprintf(why, sizeof why, "publish failed: %s", amqp_error_string2(rc));
            e = decided(b, msg, OBX__OUT_NOT_SENT, "not sent: %s", why);
            if (!e) lose(b, why, 0, NULL);
            continue;
        }
        pend *p = slot(b, seq);
        p->waiting = true;
        p->returned = false;
        p->seq = seq;
        p->sent_ms = mono();
        p->body_len = msg->payload_len;
        identity(b, msg, &p->out);
        b->next_seq++;
        b->n_waiting++;
        b->stats.published++;
        if (b->next_seq - b->head_seq > b->stats.max_outstanding)
            b->stats.max_outstanding = (size_t)(b->next_seq - b->head_seq);
        if ((seq & 63) == 0) pump(b, 0);
    }
    pump(b, 0);
    return e;
}

static obx_err ab_poll(obx__broker *base, int64_t now, int timeout_ms, obx__outcome *out,
                       size_t cap, size_t *n) {
    amqp_broker *b = (amqp_broker *)base;
    (void)now;
    obx_err e = reserve(b, (size_t)b->cfg.window);
    if (e) return e;
    pump(b, 0);
    check_confirm_timeout(b);
    if (!b->ready_n && b->n_waiting && timeout_ms > 0) {
        int64_t left = slot(b, b->head_seq)->sent_ms + b->cfg.confirm_timeout_ms - mono();
        pump(b, left < timeout_ms ? (left > 0 ? left : 0) : timeout_ms);
        check_confirm_timeout(b);
    }
    size_t k = 0;
    while (k < cap && b->ready_n) {
        out[k++] = b->ready[b->ready_head++];
        b->ready_n--;
    }
    if (!b->ready_n) b->ready_head = 0;
    *n = k;
    return OBX_OK;
}

static size_t ab_in_flight(obx__broker *base) {
    amqp_broker *b = (amqp_broker *)base;
    return b->n_waiting + b->ready_n;
}

/* ---- the audit stream: lookup and scan ------------------------------------------------------ */

typedef int (*audit_fn)(void *user, const amqp_envelope_t *env, int64_t stream_offset);

/* audit_read, step 1: appends the end marker to the audit stream and waits for its confirm. */
static obx_err audit_append_marker(amqp_broker *b, amqp_connection_state_t st, const char *marker) {
    amqp_confirm_select(st, CH);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL)
        return rpc_fail(b, OBX_EBROKER, "audit: confirm.select", r);
    amqp_table_entry_t me = {
        .key = bytes_of(H_AUDIT_MARKER),
        .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = bytes_of(marker)}};
    amqp_basic_properties_t p;
    memset(&p, 0, sizeof p);
    p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_APP_ID_FLAG;
    p.delivery_mode = 2;
    p.app_id = bytes_of("obx-audit");
    p.headers = (amqp_table_t){1, &me};
    int rc = amqp_basic_publish(st, CH, amqp_empty_bytes, bytes_of(b->cfg.audit_stream), 1, 0, &p,
                                amqp_empty_bytes);
    if (rc != AMQP_STATUS_OK)
        return obx__fail(OBX_EBROKER, "amqp %s: audit: marker publish: %s", b->cfg.where,
                         amqp_error_string2(rc));
    for (bool acked = false; !acked;) {
        struct timeval tv = tv_ms(b->cfg.lookup_timeout_ms);
        amqp_frame_t f;
        rc = amqp_simple_wait_frame_noblock(st, &f, &tv);
        if (rc != AMQP_STATUS_OK)
            return obx__fail(OBX_EBROKER, "amqp %s: audit: marker confirm: %s", b->cfg.where,
                             amqp_error_string2(rc));
        if (f.frame_type != AMQP_FRAME_METHOD) continue;
        if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) acked = true;
        if (f.payload.method.id == AMQP_BASIC_RETURN_METHOD ||
            f.payload.method.id == AMQP_BASIC_NACK_METHOD ||
            f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
            f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD)
            return obx__fail(OBX_EBROKER, "amqp %s: audit stream '%s' did not take the end marker",
                             b->cfg.where, b->cfg.audit_stream);
    }
    return OBX_OK;
}

/* audit_read, step 2: consumes the stream from (since - lookup_skew_ms); streams need manual
 * ack and a prefetch. */
static obx_err audit_subscribe(amqp_broker *b, amqp_connection_state_t st, int64_t since) {
    amqp_basic_qos(st, CH, 0, (uint16_t)b->cfg.lookup_prefetch, 0);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL)
        return rpc_fail(b, OBX_EBROKER, "audit: basic.qos", r);
    amqp_table_entry_t off;
    off.key = bytes_of("x-stream-offset");
    int64_t from = since - b->cfg.lookup_skew_ms;
    if (from > 0) {
        off.value.kind = AMQP_FIELD_KIND_TIMESTAMP;
        off.value.value.u64 = (uint64_t)(from / 1000);
    } else {
        off.value.kind = AMQP_FIELD_KIND_UTF8;
        off.value.value.bytes = bytes_of("first");
    }
    amqp_basic_consume(st, CH, bytes_of(b->cfg.audit_stream), amqp_empty_bytes, 0, 0, 0,
                       (amqp_table_t){1, &off});
    r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL)
        return rpc_fail(b, OBX_EBROKER, "audit: basic.consume on the stream", r);
    return OBX_OK;
}

/* audit_read, step 3: reads deliveries until the marker, fn's stop, or the lookup timeout
 * (then *complete stays false); acknowledges them in batches so the stream sends more. */
static obx_err audit_scan(amqp_broker *b, amqp_connection_state_t st, const char *marker,
                          audit_fn fn, void *user, bool *complete, uint64_t *n_read) {
    int64_t deadline = mono() + b->cfg.lookup_timeout_ms;
    uint64_t unacked = 0, last_tag = 0;
    for (;;) {
        struct timeval tv = tv_ms(deadline - mono());
        amqp_envelope_t env;
        amqp_rpc_reply_t r = amqp_consume_message(st, &env, &tv, 0);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                r.library_error == AMQP_STATUS_TIMEOUT)
                break; /* incomplete: *complete stays false */
            if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
                amqp_frame_t f;
                struct timeval z = {0, 0};
                if (amqp_simple_wait_frame_noblock(st, &f, &z) == AMQP_STATUS_OK &&
                    f.frame_type == AMQP_FRAME_METHOD &&
                    (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
                     f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD ||
                     f.payload.method.id == AMQP_BASIC_CANCEL_METHOD))
                    return obx__fail(OBX_EBROKER,
                                     "amqp %s: audit: the broker ended the stream read",
                                     b->cfg.where);
                continue;
            }
            return rpc_fail(b, OBX_EBROKER, "audit: reading the stream", r);
        }
        const amqp_table_t *h = (env.message.properties._flags & AMQP_BASIC_HEADERS_FLAG)
                                    ? &env.message.properties.headers
                                    : NULL;
        const amqp_bytes_t *mk = header_bytes(h, H_AUDIT_MARKER);
        int stop = 0;
        if (mk) {
            if (mk->len == strlen(marker) && !memcmp(mk->bytes, marker, mk->len)) {
                *complete = true;
                stop = 1;
            }
        } else {
            (*n_read)++;
            stop = fn(user, &env, header_i64(h, "x-stream-offset", -1));
        }
        last_tag = env.delivery_tag;
        amqp_destroy_envelope(&env);
        /* the stream sends more only as deliveries are acknowledged */
        if (++unacked >= (uint64_t)(b->cfg.lookup_prefetch / 2 + 1)) {
            amqp_basic_ack(st, CH, last_tag, 1);
            unacked = 0;
        }
        amqp_maybe_release_buffers(st);
        if (stop) break;
    }
    return OBX_OK;
}

/* Reads the audit stream from (since - lookup_skew_ms) up to an end marker this call appends
 * first, calling fn for every message but the markers until fn returns non-zero. The marker
 * makes the end exact: every message the stream held before the marker was confirmed is read.
 * *complete is true when the marker was reached. Runs on its own short-lived connection so
 * that stream deliveries never mix with publisher confirms. */
static obx_err audit_read(amqp_broker *b, int64_t since, audit_fn fn, void *user, bool *complete,
                          uint64_t *n_read) {
    *complete = false;
    *n_read = 0;
    aconn a = {0};
    obx_err e = aconn_open(b, &a, "audit reader");
    if (e) return e;
    char marker[OBX_EVENT_ID_LEN + 1];
    obx_event_id_new(0, marker);
    e = audit_append_marker(b, a.st, marker);
    if (!e) e = audit_subscribe(b, a.st, since);
    if (!e) e = audit_scan(b, a.st, marker, fn, user, complete, n_read);
    aconn_drop(&a, true, 2000);
    return e;
}

typedef struct lookup_ctx {
    amqp_broker *b;
    const obx__lookup_req *req;
    obx__lookup_res *res;
    bool found;
    int64_t stream_offset;
} lookup_ctx;

typedef struct tbl_get {
    const amqp_table_t *t;
    char buf[1024];
} tbl_get;

/* Header accessor for obx__headers_parse over an AMQP table: strings as they are, integers
 * in decimal (another producer may send obx-envelope-gen as a number). */
static const char *tbl_get_fn(void *user, const char *name, size_t *len) {
    tbl_get *g = user;
    for (int i = 0; g->t && i < g->t->num_entries; i++) {
        const amqp_table_entry_t *en = &g->t->entries[i];
        if (!bytes_eq(en->key, name)) continue;
        if (en->value.kind == AMQP_FIELD_KIND_UTF8 || en->value.kind == AMQP_FIELD_KIND_BYTES) {
            const amqp_bytes_t *v = &en->value.value.bytes;
            *len = v->len;
            if (v->len >= sizeof g->buf) return v->bytes; /* the parser rejects it by length */
            memcpy(g->buf, v->bytes, v->len);
            g->buf[v->len] = '\0';
            return g->buf;
        }
        int64_t x = header_i64(g->t, name, INT64_MIN);
        if (x == INT64_MIN) return NULL;
        *len = (size_t)snprintf(g->buf, sizeof g->buf, "%lld", (long long)x);
        return g->buf;
    }
    return NULL;
}

static int lookup_fn(void *user, const amqp_envelope_t *env, int64_t stream_offset) {
    lookup_ctx *c = user;
    const obx__lookup_req *q = c->req;
    if (!bytes_eq(env->exchange, q->dest->topic)) return 0;
    const amqp_message_t *msg = &env->message;
    if (!(msg->properties._flags & AMQP_BASIC_HEADERS_FLAG)) return 0;
    const amqp_bytes_t *id = header_bytes(&msg->properties.headers, OBX__H_EVENT_ID);
    if (!id || !bytes_eq(*id, q->event_id)) return 0;
    obx__delivery d;
    memset(&d, 0, sizeof d);
    tbl_get g = {.t = &msg->properties.headers};
    if (obx__headers_parse(tbl_get_fn, &g, &d) != OBX_OK) return 0;
    /* the message for this envelope generation (another generation is another target) */
    if (d.env.envelope_gen != q->envelope_gen) return 0;
    obx__outcome o;
    memset(&o, 0, sizeof o);
    obx__strlcpy(o.event_id, d.env.event_id, sizeof o.event_id);
    o.envelope_gen = d.env.envelope_gen;
    obx__strlcpy(o.attempt_id, d.attempt_id, sizeof o.attempt_id);
    obx__strlcpy(o.payload_digest, d.env.payload_digest, sizeof o.payload_digest);
    obx__strlcpy(o.dest_digest, d.dest_digest, sizeof o.dest_digest);
    obx__strlcpy(o.cluster, c->b->cluster, sizeof o.cluster);
    obx__strlcpy(o.topic, q->dest->topic, sizeof o.topic);
    o.partition = 0;
    /* the receipt the lost confirm would have carried: offset = its publish sequence number */
    o.offset = header_i64(&msg->properties.headers, H_PUBLISH_SEQ, -1);
    o.broker_ts = (msg->properties._flags & AMQP_BASIC_TIMESTAMP_FLAG)
                      ? (int64_t)msg->properties.timestamp * 1000
                      : 0;
    /* the bytes are the evidence: a copy whose body is not the event's message is counted as
     * corrupt or foreign and the scan goes on */
    if (!obx__lookup_copy(q, c->res, &o, msg->body.bytes, msg->body.len)) return 0;
    c->stream_offset = stream_offset;
    c->found = true;
    return 1;
}

static obx_err ab_lookup(obx__broker *base, const obx__lookup_req *req, obx__lookup_res *res) {
    amqp_broker *b = (amqp_broker *)base;
    res->kind = OBX__LOOKUP_CANNOT_TELL;
    if (!b->cfg.audit_stream[0]) {
        snprintf(res->reason, sizeof res->reason,
                 "amqp: no audit stream configured: a plain exchange cannot be queried");
        return OBX_OK;
    }
    if (req->partition != 0) {
        snprintf(res->reason, sizeof res->reason, "amqp: partition %d does not exist",
                 (int)req->partition);
        return OBX_OK;
    }
    lookup_ctx c = {.b = b, .req = req, .res = res, .stream_offset = -1};
    bool complete = false;
    uint64_t n_read = 0;
    obx_err e = audit_read(b, req->since, lookup_fn, &c, &complete, &n_read);
    if (e) {
        /* not queryable now: that is an answer (CANNOT_TELL), not a failure of the caller */
        snprintf(res->reason, sizeof res->reason, "audit stream not readable: %s", obx_errmsg());
        return OBX_OK;
    }
    if (c.found) {
        res->kind = OBX__LOOKUP_FOUND;
        /* The copy proves that the exchange routed the publish to the stream, not that every
         * queue bound to it stored it: a reject-publish queue may have refused the same
         * publish, and that basic.nack may be the confirm that was lost. Proof only where the
         * operator declared it (audit_stream_proves=1); otherwise evidence the engine records
         * while the route's UNKNOWN policy decides. */
        res->routed_only = !b->cfg.audit_stream_proves;
        snprintf(res->reason, sizeof res->reason, "found in audit stream '%s' at offset %lld%s",
                 b->cfg.audit_stream, (long long)c.stream_offset,
                 res->routed_only ? " (proves routing, not every queue's copy)" : "");
        return OBX_OK;
    }
    /* absence in the audit stream is never proof: retention, a binding added later, or a
     * message routed to the queues but not (yet) to the stream */
    snprintf(res->reason, sizeof res->reason,
             "not in audit stream '%s' (%llu messages read%s); absence is not authoritative",
             b->cfg.audit_stream, (unsigned long long)n_read,
             complete ? ", to its end" : ", stopped at lookup_timeout_ms");
    return OBX_OK;
}

typedef struct scan_ctx {
    const char *topic;
    obx__scan_fn fn;
    void *user;
} scan_ctx;

static int scan_fn(void *user, const amqp_envelope_t *env, int64_t stream_offset) {
    scan_ctx *c = user;
    if (!bytes_eq(env->exchange, c->topic)) return 0;
    const amqp_message_t *msg = &env->message;
    if (!(msg->properties._flags & AMQP_BASIC_HEADERS_FLAG)) return 0;
    const amqp_bytes_t *id = header_bytes(&msg->properties.headers, OBX__H_EVENT_ID);
    if (!id || id->len > OBX_EVENT_ID_LEN) return 0; /* no event ID: nothing to compare */
    char ev[OBX_EVENT_ID_LEN + 1];
    memcpy(ev, id->bytes, id->len);
    ev[id->len] = '\0';
    int64_t ts = (msg->properties._flags & AMQP_BASIC_TIMESTAMP_FLAG)
                     ? (int64_t)msg->properties.timestamp * 1000
                     : 0;
    return c->fn(c->user, ev, 0, stream_offset, ts);
}

static obx_err ab_scan(obx__broker *base, const char *topic, int64_t since, obx__scan_fn fn,
                       void *user) {
    amqp_broker *b = (amqp_broker *)base;
    if (!b->cfg.audit_stream[0])
        return obx__fail(OBX_EUNSUPPORTED,
                         "amqp: scan needs an audit stream (property audit_stream=NAME)");
    scan_ctx c = {topic, fn, user};
    bool complete = false;
    uint64_t n_read = 0;
    obx_err e = audit_read(b, since, scan_fn, &c, &complete, &n_read);
    if (e) return e;
    if (!complete)
        return obx__fail(OBX_EBROKER,
                         "amqp: scan of audit stream '%s' incomplete: the end was not reached "
                         "within lookup_timeout_ms=%d (%llu messages read)",
                         b->cfg.audit_stream, b->cfg.lookup_timeout_ms, (unsigned long long)n_read);
    return OBX_OK;
}

/* ---- consumer --------------------------------------------------------------------------- */

/* Tokens: the delivery tag in the low 48 bits, the consumer connection's generation above, so
 * that an ack for a delivery of a closed session is refused here instead of closing the new
 * channel with PRECONDITION_FAILED (unknown delivery tag). */
#define TAG_BITS 48
#define TAG_MASK ((UINT64_C(1) << TAG_BITS) - 1)

static void con_down(amqp_broker *b, const char *why) {
    obx__strlcpy(b->con_error, why, sizeof b->con_error);
    aconn_drop(&b->con, false, 0);
}

static obx_err con_subscribe(amqp_broker *b) {
    obx_err e = aconn_open(b, &b->con, "consumer");
    if (e) return e;
    amqp_connection_state_t st = b->con.st;
    amqp_basic_qos(st, CH, 0, (uint16_t)b->cfg.prefetch, 0);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        e = rpc_fail(b, OBX_EBROKER, "consumer basic.qos", r);
        goto fail;
    }
    for (size_t i = 0; i < b->n_queues; i++) {
        char tag[OBX_NAME_MAX + 64];
        snprintf(tag, sizeof tag, "%s.%d.%u.%zu", b->group, (int)getpid(), (unsigned)b->con.gen, i);
        amqp_basic_consume(st, CH, bytes_of(b->queues[i]), bytes_of(tag), 0, 0, 0,
                           amqp_empty_table);
        r = amqp_get_rpc_reply(st);
        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            char what[320];
            snprintf(what, sizeof what, "basic.consume on queue '%s'", b->queues[i]);
            e = rpc_fail(b, OBX_EBROKER, what, r);
            goto fail;
        }
    }
    return OBX_OK;
fail:
    aconn_drop(&b->con, false, 0);
    return e;
}

static obx_err ab_consume_open(obx__broker *base, const char *group, const char *const *queues,
                               size_t n) {
    amqp_broker *b = (amqp_broker *)base;
    obx_err e = obx__check_field("group", group, 1, OBX_NAME_MAX, OBX__CS_NAME);
    if (e) return e;
    if (n == 0) return obx__fail(OBX_EINVAL, "amqp: consume_open needs at least one queue");
    for (size_t i = 0; i < n; i++)
        if ((e = obx__check_field("queue", queues[i], 1, 255, OBX__CS_TEXT))) return e;
    aconn_drop(&b->con, true, 2000); /* a second consume_open replaces the subscription */
    char(*q)[256] = calloc(n, sizeof *q);
    if (!q) return obx__fail(OBX_ENOMEM, "amqp: out of memory");
    for (size_t i = 0; i < n; i++) obx__strlcpy(q[i], queues[i], sizeof q[i]);
    free(b->queues);
    b->queues = q;
    b->n_queues = n;
    held_clear(b); /* the old session's deliveries were requeued with it */
    b->n_paused = 0;
    obx__strlcpy(b->group, group, sizeof b->group);
    return con_subscribe(b);
}

static obx_err fill_delivery(amqp_broker *b, const amqp_envelope_t *env, obx__delivery *d) {
    memset(d, 0, sizeof *d);
    const amqp_message_t *msg = &env->message;
    size_t tl = env->exchange.len < OBX_TOPIC_MAX ? env->exchange.len : OBX_TOPIC_MAX;
    memcpy(d->topic, env->exchange.bytes, tl);
    d->topic[tl] = '\0';
    d->partition = 0;
    const amqp_table_t *h =
        (msg->properties._flags & AMQP_BASIC_HEADERS_FLAG) ? &msg->properties.headers : NULL;
    d->offset = header_i64(h, "x-stream-offset", -1); /* queues have no position: -1 */
    d->broker_ts = (msg->properties._flags & AMQP_BASIC_TIMESTAMP_FLAG)
                       ? (int64_t)msg->properties.timestamp * 1000
                       : 0;
    d->redelivered = env->redelivered != 0;
    d->token = ((uint64_t)(b->con.gen & 0xffffu) << TAG_BITS) | (env->delivery_tag & TAG_MASK);
    tbl_get g = {.t = h};
    obx__headers_parse(tbl_get_fn, &g, d); /* a bad header is reported in d->header_error */
    obx__clear_error();
    d->payload = malloc(msg->body.len ? msg->body.len : 1);
    if (!d->payload) return obx__fail(OBX_ENOMEM, "amqp: out of memory (payload)");
    if (msg->body.len) memcpy(d->payload, msg->body.bytes, msg->body.len);
    d->payload_len = msg->body.len;
    return OBX_OK;
}

static size_t paused_at(const amqp_broker *b, const char *topic) {
    size_t i = 0;
    while (i < b->n_paused && strcmp(b->paused[i], topic)) i++;
    return i;
}

/* The retry back-off without traffic: a paused exchange's deliveries (the one whose retry is
 * not due, given back by consume_redeliver, and whatever arrives after it) are held here,
 * unacknowledged, and handed out in order once resumed. The prefetch window bounds them, and
 * the broker sends nothing more meanwhile: the channel stays quiet, where a nack with requeue
 * would bring the message back at once, again and again, and a wait queue with a TTL would need
 * queues and dead-letter routes declared per consumer and put the message behind later ones. */
static obx_err ab_consume_pause(obx__broker *base, const char *topic, int32_t part, bool paused) {
    amqp_broker *b = (amqp_broker *)base;
    (void)part; /* an AMQP delivery's partition is 0 */
    size_t i = paused_at(b, topic);
    if (!paused) {
        if (i < b->n_paused) memmove(b->paused[i], b->paused[--b->n_paused], sizeof b->paused[i]);
        return OBX_OK;
    }
    if (i < b->n_paused) return OBX_OK;
    char(*p)[OBX_TOPIC_MAX + 1] = realloc(b->paused, (b->n_paused + 1) * sizeof *p);
    if (!p) return obx__fail(OBX_ENOMEM, "amqp: out of memory (paused)");
    b->paused = p;
    obx__strlcpy(p[b->n_paused++], topic, sizeof *p);
    return OBX_OK;
}

/* Moves d (just received) into the held list when its exchange is paused. */
static obx_err hold_if_paused(amqp_broker *b, obx__delivery *d, bool *held) {
    *held = paused_at(b, d->topic) < b->n_paused;
    if (!*held) return OBX_OK;
    obx__delivery *h = realloc(b->held, (b->n_held + 1) * sizeof *h);
    if (!h) return obx__fail(OBX_ENOMEM, "amqp: out of memory (held deliveries)");
    b->held = h;
    h[b->n_held++] = *d; /* the payload moves with it */
    memset(d, 0, sizeof *d);
    return OBX_OK;
}

/* Hands out the held deliveries of exchanges no longer paused, in order (those of an older
 * session are dropped: the broker requeued them). */
static void held_out(amqp_broker *b, obx__delivery *out, size_t cap, size_t *n) {
    size_t k = 0;
    for (size_t i = 0; i < b->n_held; i++) {
        obx__delivery *d = &b->held[i];
        if ((d->token >> TAG_BITS) != (b->con.gen & 0xffffu))
            obx__delivery_free(d);
        else if (*n < cap && paused_at(b, d->topic) == b->n_paused)
            out[(*n)++] = *d;
        else
            b->held[k++] = *d;
    }
    b->n_held = k;
}

static bool of_session(const amqp_broker *b, const obx__delivery *d) {
    return b->con.up && (d->token >> TAG_BITS) == (b->con.gen & 0xffffu);
}

/* Forgets the copy of a settled delivery (its tag is unique in the session). */
static void unacked_drop(amqp_broker *b, uint64_t token) {
    for (size_t i = 0; i < b->n_unacked; i++)
        if (b->unacked[i].token == token) {
            obx__delivery_free(&b->unacked[i]);
            memmove(&b->unacked[i], &b->unacked[i + 1],
                    (b->n_unacked - i - 1) * sizeof *b->unacked);
            b->n_unacked--;
            return;
        }
}

/* Keeps a copy of each delivery of this session handed out (the prefetch window bounds them;
 * an older session's were requeued by the broker and are dropped). */
static obx_err unacked_keep(amqp_broker *b, const obx__delivery *out, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < b->n_unacked; i++) {
        if (of_session(b, &b->unacked[i]))
            b->unacked[k++] = b->unacked[i];
        else
            obx__delivery_free(&b->unacked[i]);
    }
    b->n_unacked = k;
    if (!n) return OBX_OK;
    obx__delivery *u = realloc(b->unacked, (b->n_unacked + n) * sizeof *u);
    if (!u) return obx__fail(OBX_ENOMEM, "amqp: out of memory (unacknowledged deliveries)");
    b->unacked = u;
    for (size_t i = 0; i < n; i++) {
        if (!of_session(b, &out[i])) continue;
        obx__delivery *c = &u[b->n_unacked];
        *c = out[i];
        c->payload = malloc(out[i].payload_len ? out[i].payload_len : 1);
        if (!c->payload)
            return obx__fail(OBX_ENOMEM, "amqp: out of memory (unacknowledged deliveries)");
        if (out[i].payload_len) memcpy(c->payload, out[i].payload, out[i].payload_len);
        b->n_unacked++;
    }
    return OBX_OK;
}

static obx_err consume_poll(amqp_broker *b, int timeout_ms, obx__delivery *out, size_t cap,
                            size_t *n);

/* The deliveries handed out are kept (unacked_keep) until settled. Without the copy a redelivery
 * could only go through the broker: basic.recover raced the deliveries already on the wire
 * (they arrived after it and were taken as live: handed out again, out of order, their acks
 * refused as unknown delivery tags, the channel closed), and a quorum queue's requeue need not
 * keep the messages' order. When the copy cannot be kept the session is dropped: the broker
 * requeues everything unsettled, and the acks of this poll's deliveries are refused. */
static obx_err ab_consume_poll(obx__broker *base, int timeout_ms, obx__delivery *out, size_t cap,
                               size_t *n) {
    amqp_broker *b = (amqp_broker *)base;
    obx_err e = consume_poll(b, timeout_ms, out, cap, n);
    if (e) return e;
    e = unacked_keep(b, out, *n);
    if (e) con_down(b, obx_errmsg());
    return e;
}

static obx_err consume_poll(amqp_broker *b, int timeout_ms, obx__delivery *out, size_t cap,
                            size_t *n) {
    *n = 0;
    if (!b->n_queues) return obx__fail(OBX_EINVAL, "amqp: consume_poll before consume_open");
    pump(b, 0); /* keeps an idle publisher connection's heartbeats going */
    if (b->con.up) held_out(b, out, cap, n);
    if (!b->con.up) {
        obx_err e = con_subscribe(b);
        if (e)
            return obx__fail(OBX_EBROKER, "amqp: consumer reconnect failed (%s): %s", b->con_error,
                             obx_errmsg());
    }
    amqp_connection_state_t st = b->con.st;
    int64_t deadline = mono() + (timeout_ms > 0 ? timeout_ms : 0);
    while (*n < cap) {
        struct timeval tv = tv_ms(*n ? 0 : deadline - mono());
        amqp_envelope_t env;
        amqp_rpc_reply_t r = amqp_consume_message(st, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            bool held = false;
            obx_err e = fill_delivery(b, &env, &out[*n]);
            amqp_destroy_envelope(&env);
            amqp_maybe_release_buffers(st);
            if (!e) e = hold_if_paused(b, &out[*n], &held);
            if (e) return e;
            if (!held) (*n)++;
            continue;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT)
            break;
        char why[OBX_TEXT_MAX + 1];
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            amqp_frame_t f;
            struct timeval z = {0, 0};
            if (amqp_simple_wait_frame_noblock(st, &f, &z) != AMQP_STATUS_OK ||
                f.frame_type != AMQP_FRAME_METHOD)
                continue;
            if (f.payload.method.id == AMQP_BASIC_CANCEL_METHOD)
                snprintf(why, sizeof why, "the broker cancelled the consumer (queue deleted?)");
            else if (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD) {
                const amqp_channel_close_t *m = f.payload.method.decoded;
                snprintf(why, sizeof why, "channel closed by the broker: %u %.*s",
                         (unsigned)m->reply_code, (int)m->reply_text.len,
                         (const char *)m->reply_text.bytes);
            } else if (f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) {
                const amqp_connection_close_t *m = f.payload.method.decoded;
                snprintf(why, sizeof why, "connection closed by the broker: %u %.*s",
                         (unsigned)m->reply_code, (int)m->reply_text.len,
                         (const char *)m->reply_text.bytes);
                amqp_connection_close_ok_t ok = {0};
                amqp_send_method(st, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
            } else
                continue; /* e.g. basic.qos-ok leftovers, connection.blocked */
        } else
            reply_text(r, why, sizeof why);
        con_down(b, why);
        /* deliveries already taken stay valid to process; their acks will fail and the broker
         * redelivers them, which the inbox dedupes */
        if (*n) return OBX_OK;
        /* the broker's trouble (OBX_EBROKER, as Kafka's and the log's): OBX_ECONNLOST is a
         * store's, and obx consume then named its database as the one gone */
        return obx__fail(OBX_EBROKER, "amqp %s: consumer: %s", b->cfg.where, why);
    }
    return OBX_OK;
}

static obx_err settle_delivery(amqp_broker *b, const obx__delivery *d, bool ack, bool requeue) {
    if (!of_session(b, d))
        return obx__fail(OBX_ECONNLOST,
                         "amqp: delivery belongs to a closed consumer session; the broker "
                         "redelivers it");
    unacked_drop(b, d->token);
    uint64_t tag = d->token & TAG_MASK;
    int rc = ack ? amqp_basic_ack(b->con.st, CH, tag, 0)
                 : amqp_basic_nack(b->con.st, CH, tag, 0, requeue);
    if (rc != AMQP_STATUS_OK) {
        con_down(b, amqp_error_string2(rc));
        return obx__fail(OBX_ECONNLOST, "amqp %s: basic.%s: %s", b->cfg.where, ack ? "ack" : "nack",
                         amqp_error_string2(rc));
    }
    return OBX_OK;
}

static obx_err ab_consume_ack(obx__broker *base, const obx__delivery *d) {
    return settle_delivery((amqp_broker *)base, d, true, false);
}

static obx_err ab_consume_release(obx__broker *base, const obx__delivery *d, bool requeue) {
    return settle_delivery((amqp_broker *)base, d, false, requeue);
}

static int by_tag(const void *x, const void *y) {
    uint64_t a = ((const obx__delivery *)x)->token, c = ((const obx__delivery *)y)->token;
    return a < c ? -1 : a > c;
}

/* After a handler failure: d and every later unsettled delivery of this session come again, in
 * their order. The consumer settles in order, so the unsettled ones are exactly d and those
 * after it (and any it skipped): their copies join the held deliveries, sorted by delivery tag
 * (arrival order), and are handed out again from here. Nothing goes back to the broker, which
 * keeps them unacknowledged on this channel: no requeue that could reorder them, no deliveries
 * on the wire to tell apart from new ones. A lost session instead: the broker requeued them. */
static obx_err ab_consume_redeliver(obx__broker *base, const obx__delivery *d) {
    amqp_broker *b = (amqp_broker *)base;
    if (!of_session(b, d))
        return OBX_OK; /* the session is gone: the broker requeued everything unacked already */
    if (!b->n_unacked) return OBX_OK;
    obx__delivery *h = realloc(b->held, (b->n_held + b->n_unacked) * sizeof *h);
    if (!h) return obx__fail(OBX_ENOMEM, "amqp: out of memory (held deliveries)");
    b->held = h;
    for (size_t i = 0; i < b->n_unacked; i++) {
        b->unacked[i].redelivered = true;
        h[b->n_held++] = b->unacked[i]; /* the payload moves with it */
    }
    b->n_unacked = 0;
    qsort(h, b->n_held, sizeof *h, by_tag);
    return OBX_OK;
}

/* Counters (tests, benchmark). */
obx_err obx__amqp_broker_stats(obx__broker *base, obx__amqp_stats *out) {
    if (!base || base->m != &obx__amqp_broker_methods)
        return obx__fail(OBX_EINVAL, "not an amqp broker");
    *out = ((amqp_broker *)base)->stats;
    return OBX_OK;
}

const obx__broker_methods obx__amqp_broker_methods = {
    .version = OBX__BROKER_METHODS_VERSION,
    .name = "amqp",
    /* the union; per handle see caps_of (lookup and scan only with an audit stream). Not
     * ORDERED: a nack or a lost connection inside a window lets a later message of the same
     * key be confirmed before an earlier one is retried. */
    .caps = OBX__BCAP_LOOKUP_BEST_EFFORT | OBX__BCAP_SCAN | OBX__BCAP_CONSUME,
    .open = ab_open,
    .close = ab_close,
    .cluster_id = ab_cluster_id,
    .partition_for = ab_partition_for,
    .send = ab_send,
    .poll = ab_poll,
    .in_flight = ab_in_flight,
    .lookup = ab_lookup,
    .quiet_time_ms = ab_quiet,
    .scan = ab_scan,
    .consume_open = ab_consume_open,
    .consume_poll = ab_consume_poll,
    .consume_ack = ab_consume_ack,
    .caps_of = ab_caps_of,
    .consume_release = ab_consume_release,
    .contract = ab_contract,
    .consume_redeliver = ab_consume_redeliver,
    .consume_pause = ab_consume_pause,
};

/*
 * pg_int.h — what the files of the PostgreSQL store share (not an interface: only
 * src/store/postgres/ includes it).
 *
 * Owns: the handle (pg_store), the statement table's IDs (Q_*), the batch row types (RT_*),
 * what a relay transaction has not sent yet (P_*), a statement's parameters (params: text
 * values, binary arrays and records, built by the tiny inline helpers below), a pipeline's
 * statements (ws_stmt), the readers of result rows, and the functions one file of the store
 * calls in another (obx__pg_*, listed by the file that defines them).
 *
 * The store's files (pg_store.c lists its contracts and which file keeps each):
 *   pg_sql.c      statement text and table, statement names and preparing, parameter framing
 *   pg_conn.c     errors, the connection and its reconnection, running a statement, transactions
 *   pg_enqueue.c  routes and the producer's writes (enqueue)
 *   pg_read.c     reading events: claims, selections, IDs, filters, retention candidates
 *   pg_write.c    the relay's batch writes (events, attempts, receipts, audit) and the write set
 *   pg_ops.c      the other methods, by table: counters, chart history, clusters, statistics,
 *                 retention, route sets and delivery sets, receipt details
 *   pg_inbox.c    the consumer's inbox, watermarks, failures, poison, consume audit
 *   pg_wake.c     waiting for work: LISTEN/NOTIFY, the wake lock, the wait in the server
 *   pg_store.c    open, close, schema and migration, roles, the method tables
 */
#ifndef OBX_STORE_PG_INT_H
#define OBX_STORE_PG_INT_H

#include "store/shared.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Advisory lock class IDs ("OBX" and "OBY"): the two-key form keeps obx's locks apart from an
 * application's single-bigint advisory locks. */
#define LOCK_CLASS_ORDER "5194328" /* per order-key bucket: seq order = commit order */
#define LOCK_CLASS_INIT 5194329    /* serializes concurrent `obx init` */
/* With LOCK_CLASS_INIT: the schema in use (pg_schema_hold). Each relay connection holds it
 * shared for its life; `obx init` takes it exclusively, for its transaction, to migrate. */
#define LOCK_SCHEMA_IN_USE 1
/* The wake lock, one per cluster (key hashtext(cluster)): held exclusively by the relay
 * connection that waits for that cluster's work (obx__pg_wait_for_work), tested shared by each
 * event-inserting statement, which NOTIFYs only when it cannot take it (NOTIFY_EXPR). */
#define LOCK_CLASS_WAKE "5194330"
#define NOTIFY_CHANNEL "obx_work"

enum {
    Q_ROUTE_PUT,
    Q_ROUTE_GET,
    Q_ROUTE_LIST_CUR,
    Q_ROUTE_LIST_ALL,
    Q_IDEM,
    Q_ROUTE_GET_TXID,
    Q_INS_ENV,
    Q_INS_EVENT,
    Q_INS_EVENT_AUDIT,
    Q_ENQ_WRITE,
    Q_ENQ_TRY,
    Q_ENQ_WRITE_WC, /* Q_ENQ_WRITE and Q_ENQ_TRY waking by obx._wake_c() (pg_store.wake_c) */
    Q_ENQ_TRY_WC,
    Q_CLAIM,
    Q_RELAY_PLANS,
    Q_CLAIM_PLANS,
    Q_SEL_EXPIRED,
    Q_SEL_EXPIRED_LOCK,
    Q_SEL_RECONCILE,
    Q_SEL_RECONCILE_LOCK,
    Q_SEL_STATE,
    Q_SEL_STATE_LOCK,
    Q_SEL_PUBBEFORE,
    Q_SEL_PUBBEFORE_LOCK,
    Q_LOAD,
    Q_LOAD_LOCK,
    Q_LOAD_SLOTS,
    Q_LOAD_SLOTS_LOCK,
    Q_UPD_EVENTS,
    Q_INS_ATT,
    Q_UPD_ATT,
    Q_LOAD_ATT,
    Q_LOAD_ATT_EVENT,
    Q_INS_RCPT,
    Q_LOAD_RCPT,
    Q_INS_AUDIT,
    Q_INS_AUDIT_FIND,
    Q_LOAD_AUDIT,
    Q_COUNTER_ADD,
    Q_COUNTER_GET,
    Q_STATS,
    Q_STATS_INV,
    Q_UNKNOWN_RES,
    Q_FIND_CORR,
    Q_INBOX_GET,
    Q_INBOX_PUT,
    Q_INBOX_FINISH,
    Q_INBOX_HAS,
    Q_WM_PUT,
    Q_WM_LIST,
    Q_WM_LIST_ALL,
    Q_FAIL_BUMP,
    Q_FAIL_GET,
    Q_FAIL_CLEAR,
    Q_RETRY_PUT,
    Q_RETRY_LIST,
    Q_RETRY_DEL,
    Q_POISON_PUT,
    Q_POISON_LIST,
    Q_POISON_GET,
    Q_POISON_STATE,
    Q_INBOX_QUAR,
    Q_CONSUME_AUDIT,
    Q_FIND,
    Q_RSET_PUT,
    Q_RSET_GET,
    Q_DSET_PUT,
    Q_DGET,
    Q_DSTATS,
    Q_RCPT_DETAIL,
    Q_SET_ALIAS,
    Q_RET_CANDIDATES,
    Q_RET_CANDIDATES_LOCK,
    Q_PURGE_PAYLOADS,
    Q_RCPT_KIND_SPARSE,
    Q_RCPT_KIND_ANY,
    Q_RECENT_PUB,
    Q_CAUDIT_EVENT,
    Q_CAUDIT_AFTER,
    Q_CAUDIT_NEWEST,
    Q_SEL_UNPUB_STATE,
    Q_SEL_UNPUB_STATE_LOCK,
    Q_CLUSTER_PUT,
    Q_CLUSTER_GET,
    Q_SERIES_PUT,
    Q_SERIES_LIST,
    Q_UNSERVED,
    Q_DOPEN,
    Q_ENV_AT,
    Q_AGED_LIST,                                  /* + obx__aged_kind */
    Q_AGED_COUNT = Q_AGED_LIST + OBX__AGED_COUNT, /* + obx__aged_kind */
    Q_COUNT = Q_AGED_COUNT + OBX__AGED_COUNT
};

struct ws_stmt;

/* The row types of the relay's batch statements' parameters (schema.sql), by name. */
enum { RT_EVENT_UPDATE, RT_ATTEMPT_INSERT, RT_ATTEMPT_UPDATE, RT_RECEIPT_INSERT, RT_COUNT };

typedef struct pg_store {
    obx__store base;
    PGconn *conn;
    bool owned;
    obx__tx_nest tx; /* transaction nesting (shared.c) */
    bool lost;       /* the connection was lost inside the current obx transaction */
    bool listening;  /* LISTEN obx_work issued on this connection */
    /* obx._wait_for_work() (the obx_pg extension) in this database: 0 not looked up yet, 1 yes,
     * -1 no (obx__pg_wait_for_work) */
    int wait_fn;
    /* obx._wake_c() (the obx_pg extension) in this database as of the last route read
     * (Q_ROUTE_GET_TXID): 0 not known, 1 yes, -1 no. With 1 the cached-route enqueue runs
     * Q_ENQ_WRITE_WC and Q_ENQ_TRY_WC, which call it directly instead of obx._wake() (pg_enqueue.c,
     * enqueue_write) */
    int wake_c;
    /* The wake lock of the cluster this connection claims for (obx__pg_wait_for_work): the cluster
     * of its last claim (read_claim), the lock's key once read, and whether this session holds
     * it (from its wait until a claim takes a whole batch). */
    char wake_cluster[OBX_NAME_MAX + 1];
    int32_t wake_key;
    bool wake_key_known, wake_held;
    bool dispatch; /* serve_dispatch: every BEGIN sets the relay's planner options */
    unsigned pend; /* P_*: what goes in front of the next statement (obx__pg_ws_run, pend_flush) */
    /* a relay transaction's write set, held back for its COMMIT's pipeline (obx__pg_write_set);
     * owned; sent before anything else the transaction sends (obx__pg_conn_ready) */
    struct ws_stmt *held;
    size_t n_held;
    bool names_checked; /* borrowed connection: pg_prepared_statements read */
    bool prepared[Q_COUNT];
    uint32_t rec_oid[RT_COUNT]; /* the row types' OIDs (obx__pg_rec_oids); 0: not read yet */
    bool rec_stale; /* a row type changed under the connection: prepare its statements again */
} pg_store;

#define EVENT_COLS OBX__EVENT_COLS   /* shared.h */
#define EVENT_NCOLS OBX__EVENT_NCOLS /* the payload, when selected, is column EVENT_NCOLS */

/* The relay's planner options, for the rest of a transaction (relay_plans): plan once, without
 * sequential scans, hash or merge joins, or JIT compilation (a generic plan's cost estimate for
 * a LIMIT $n walk of a million-row index passes jit_above_cost: 165 ms of compilation for a
 * 2 ms claim, on every call). */
#define RELAY_PLANS                                                                                \
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; "                            \
    "SET LOCAL enable_mergejoin = off; SET LOCAL jit = off; "                                      \
    "SET LOCAL plan_cache_mode = force_generic_plan"
/* The claim must walk obx_event_claimable in (available_at, seq) order and stop at the limit
 * (relay_plans). */
#define CLAIM_PLANS "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off"

/* What a relay transaction has not sent yet (pg_store.pend): a relay connection's BEGIN waits
 * for the transaction's first statement and goes in its pipeline (tx_begin), with the planner
 * settings its statements need. P_RELAY and P_CLAIM alone: settings for a transaction already
 * open. */
enum { P_BEGIN = 1, P_RELAY = 2, P_CLAIM = 4 };

/* ---- parameters ------------------------------------------------------------------------------ */

#define PMAX 64

/* Array parameters travel in PostgreSQL's binary array format (array_recv): the relay prints
 * no decimals and quotes no strings, and the server parses no literals (text arrays cost about
 * 12 % of the relay's CPU and array_in 2 % of the server's under a backlog). The elements are
 * collected first (a text element as its length and bytes, an integer as an int64 in host
 * order) and framed by frame_arrays() when the statement is known: every array parameter is
 * written in the SQL with its cast ($n::text[], $n::int[], $n::bigint[]), and that cast says
 * which element type and width the server expects. */
enum { A_NONE, A_TEXT, A_INT, A_RECORD, A_FRAMED };

/* Parameters of one statement: text values (NULL = SQL NULL), binary bytea, and arrays built
 * in owned buffers. Out of memory is sticky and reported by obx__pg_run(). */
typedef struct params {
    int n;
    const char *val[PMAX];
    int len[PMAX];
    int fmt[PMAX];
    char num[PMAX][24];
    obx__buf arr[PMAX];
    unsigned char akind[PMAX]; /* A_* */
    int acount[PMAX];          /* elements */
    bool anull[PMAX];          /* some element is NULL */
    unsigned char rtype[PMAX]; /* A_RECORD: its row type (RT_*) */
} params;

static inline void p_init(params *p) { memset(p, 0, sizeof *p); }

static inline void p_free(params *p) {
    for (int i = 0; i < p->n; i++) obx__buf_free(&p->arr[i]);
}

static inline void p_text(params *p, const char *v) {
    p->val[p->n] = v;
    p->n++;
}

static inline void p_int(params *p, int64_t v) {
    snprintf(p->num[p->n], sizeof p->num[0], "%lld", (long long)v);
    p->val[p->n] = p->num[p->n];
    p->n++;
}

static inline void p_bool(params *p, bool v) {
    p->val[p->n] = v ? "t" : "f";
    p->n++;
}

/* Binary bytea; a NULL pointer with length 0 is an empty value, not SQL NULL. */
static inline void p_bytes(params *p, const void *data, size_t len) {
    p->val[p->n] = data ? (const char *)data : "";
    p->len[p->n] = (int)len;
    p->fmt[p->n] = 1;
    p->n++;
}

/* Array parameters: a_begin, one a_text or a_int per element, a_end. */
static inline obx__buf *a_begin(params *p, unsigned char kind) {
    p->akind[p->n] = kind;
    return &p->arr[p->n];
}

/* A text value as binary arrays and records carry it: its length (-1: NULL), then its bytes. */
static inline void put_text(obx__buf *b, const char *v) {
    if (!v) {
        obx__buf_u32be(b, UINT32_MAX);
        return;
    }
    size_t len = strlen(v);
    obx__buf_u32be(b, (uint32_t)len);
    obx__buf_put(b, v, len);
}

static inline void a_text(params *p, obx__buf *b, const char *v) {
    p->acount[p->n]++;
    if (!v) p->anull[p->n] = true;
    put_text(b, v);
}

static inline void a_int(params *p, obx__buf *b, int64_t v) {
    p->acount[p->n]++;
    obx__buf_put(b, &v, sizeof v);
}

static inline void a_end(params *p) { p->n++; }

/* An array of rows of a row type (A_RECORD: $n::obx._event_update[] and the others of
 * schema.sql), one function for the server to set up where an array per column took one
 * each: r_begin, then per row r_row, its columns in the type's order (r_text, r_int4,
 * r_int8), r_row_end; then r_end. The elements are written as they go, each a length and
 * record_recv's format (the column count, then per column its type OID, length and bytes);
 * frame_arrays puts the array's header, with the row type's OID, in front. */
static inline obx__buf *r_begin(params *p, unsigned char rtype) {
    p->akind[p->n] = A_RECORD;
    p->rtype[p->n] = rtype;
    return &p->arr[p->n];
}

/* Starts a row of ncols columns; returns where its length goes (r_row_end). */
static inline size_t r_row(params *p, obx__buf *b, uint32_t ncols) {
    p->acount[p->n]++;
    size_t at = b->len;
    obx__buf_u32be(b, 0);
    obx__buf_u32be(b, ncols);
    return at;
}

static inline void r_text(obx__buf *b, const char *v) {
    obx__buf_u32be(b, 25); /* text */
    put_text(b, v);
}

/* An int4 or int8 value as binary arrays and records carry it: its length, then its bytes in
 * network order. */
static inline void put_int4(obx__buf *b, int32_t v) {
    obx__buf_u32be(b, 4);
    obx__buf_u32be(b, (uint32_t)v);
}

static inline void put_int8(obx__buf *b, int64_t v) {
    obx__buf_u32be(b, 8);
    obx__buf_u32be(b, (uint32_t)((uint64_t)v >> 32));
    obx__buf_u32be(b, (uint32_t)(uint64_t)v);
}

static inline void r_int4(obx__buf *b, int32_t v) {
    obx__buf_u32be(b, 23); /* int4 */
    put_int4(b, v);
}

static inline void r_int8(obx__buf *b, int64_t v) {
    obx__buf_u32be(b, 20); /* int8 */
    put_int8(b, v);
}

static inline void r_row_end(obx__buf *b, size_t at) {
    if (b->oom || !b->data) return;
    uint32_t len = (uint32_t)(b->len - at - 4);
    unsigned char *d = b->data + at;
    d[0] = (unsigned char)(len >> 24);
    d[1] = (unsigned char)(len >> 16);
    d[2] = (unsigned char)(len >> 8);
    d[3] = (unsigned char)len;
}

static inline void r_end(params *p) { p->n++; }

/* Column arrays over n rows; the expression sees the row index as i. */
#define ARR_TEXT(p, n, expr)                                                                       \
    do {                                                                                           \
        obx__buf *b_ = a_begin(p, A_TEXT);                                                         \
        for (size_t i = 0; i < (n); i++) a_text(p, b_, (expr));                                    \
        a_end(p);                                                                                  \
    } while (0)
#define ARR_INT(p, n, expr)                                                                        \
    do {                                                                                           \
        obx__buf *b_ = a_begin(p, A_INT);                                                          \
        for (size_t i = 0; i < (n); i++) a_int(p, b_, (int64_t)(expr));                            \
        a_end(p);                                                                                  \
    } while (0)

/* One statement of a pipeline (obx__pg_ws_run), and which part's rows its result answers for. */
enum { WS_PLAIN, WS_UPD_EVENTS, WS_UPD_ATT, WS_KEEP };
typedef struct ws_stmt {
    int id;
    int kind;      /* WS_*; WS_KEEP: the result goes to the caller */
    size_t off, n; /* its rows within the part */
    const char *what;
    ExecStatusType want;
    params p;
} ws_stmt;

/* ---- reading results ------------------------------------------------------------------------ */

static inline int64_t gi(const PGresult *r, int row, int col) {
    return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static inline bool gb(const PGresult *r, int row, int col) {
    return !PQgetisnull(r, row, col) && PQgetvalue(r, row, col)[0] == 't';
}

static inline void gt(const PGresult *r, int row, int col, char *out, size_t cap) {
    obx__strlcpy(out, PQgetisnull(r, row, col) ? "" : PQgetvalue(r, row, col), cap);
}
#define GT(r, row, col, field) gt(r, row, col, field, sizeof(field))

/* the shared decoders' view of one result row (shared.h) */
typedef struct pg_cell {
    const PGresult *r;
    int row;
} pg_cell;
static inline int64_t rd_i64(void *c, int col) {
    return gi(((pg_cell *)c)->r, ((pg_cell *)c)->row, col);
}
static inline bool rd_flag(void *c, int col) {
    return gb(((pg_cell *)c)->r, ((pg_cell *)c)->row, col);
}
static inline void rd_text(void *c, int col, char *out, size_t cap) {
    gt(((pg_cell *)c)->r, ((pg_cell *)c)->row, col, out, cap);
}
#define READER(res, i) (&(obx__col_reader){rd_i64, rd_flag, rd_text, &(pg_cell){(res), (i)}})

#define ORDER_KEY_CAP (OBX_NAME_MAX + OBX_TOPIC_MAX + OBX_KEY_MAX + 4)

/* pg_sql.c */
extern const bool obx__pg_q_readonly[Q_COUNT];
void obx__pg_stmt_name(int id, char out[40]);
obx_err obx__pg_p_ready(pg_store *s, params *p, int id, const char *what);
obx_err obx__pg_prepare(pg_store *s, int id);

/* pg_conn.c */
bool obx__pg_conn_lost_state(const char *st);
obx_err obx__pg_map_error(pg_store *s, const PGresult *r, const char *what);
obx_err obx__pg_check(pg_store *s, PGresult *r, ExecStatusType want, PGresult **out,
                      const char *what);
obx_err obx__pg_rec_oids(pg_store *s);
obx_err obx__pg_conn_ready(pg_store *s, const char *what);
obx_err obx__pg_ready(pg_store *s, const char *what);
obx_err obx__pg_exec_simple(pg_store *s, const char *sql, const char *what);
void obx__pg_ws_free(ws_stmt *st, size_t ns);
void obx__pg_held_drop(pg_store *s);
obx_err obx__pg_run(pg_store *s, int id, params *p, ExecStatusType want, PGresult **out,
                    const char *what);
obx_err obx__pg_get_bytea(const PGresult *r, int row, int col, unsigned char **out, size_t *len);
obx_err obx__pg_tx_in_tx(obx__store *base, bool *in_tx);
obx_err obx__pg_commit_result(pg_store *s, PGresult *r);
extern const obx__tx_ops obx__pg_tx;
void obx__pg_serve_dispatch(obx__store *base);

/* pg_enqueue.c */
obx_err obx__pg_route_put(obx__store *base, const obx__route_row *rt, int64_t *gen);
obx_err obx__pg_route_get(obx__store *base, const char *event_type, obx__route_row *out);
obx_err obx__pg_route_get_txid(obx__store *base, const char *event_type, obx__route_row *out,
                               char *txid, size_t cap);
obx_err obx__pg_route_list(obx__store *base, bool all, obx__route_row **out, size_t *n);
obx_err obx__pg_idem_lookup(obx__store *base, const char *tenant, const char *key,
                            char existing[OBX_EVENT_ID_LEN + 1]);
void obx__pg_order_key(const obx__event_row *r, char *out, size_t cap);
obx_err obx__pg_insert_envelope(obx__store *base, const obx__event_row *r, const void *payload,
                                size_t len);
obx_err obx__pg_insert_event(obx__store *base, const obx__event_row *r, const void *payload,
                             size_t len);
obx_err obx__pg_insert_event_audit(obx__store *base, const obx__event_row *r, const void *payload,
                                   size_t len, const obx__audit_row *a);
bool obx__pg_send_plain(pg_store *s, const char *sql);
bool obx__pg_send_prepared(pg_store *s, int id, const params *p);
obx_err obx__pg_enqueue_write(obx__store *base, const obx__event_row *r, const void *payload,
                              size_t len, const obx__audit_row *a, bool *written);

/* pg_read.c */
obx_err obx__pg_collect(PGresult *r, bool with_payload, obx__rows *out, const char *what);
obx_err obx__pg_read_events(obx__store *base, const obx__read_req *req, obx__rows *out);

/* pg_write.c */
obx_err obx__pg_update_events(obx__store *base, const obx__event_update *u, size_t n,
                              bool *applied);
obx_err obx__pg_insert_attempts(obx__store *base, const obx__attempt_row *a, size_t n);
obx_err obx__pg_update_attempts(obx__store *base, const obx__attempt_row *a, size_t n);
obx_err obx__pg_load_attempts(obx__store *base, const char *const *ids, size_t n,
                              const char *event_id, obx__attempt_row **out, size_t *n_out);
obx_err obx__pg_load_slots(obx__store *base, const char *const *aids, const char *const *eids,
                           size_t n, unsigned flags, obx__attempt_row **att, size_t *n_att,
                           obx__rows *ev);
obx_err obx__pg_insert_receipts(obx__store *base, const obx__receipt_row *rc, size_t n);
obx_err obx__pg_read_receipts(PGresult *r, const char *what, obx__receipt_row **out, size_t *n_out);
obx_err obx__pg_load_receipts(obx__store *base, const char *event_id, obx__receipt_row **out,
                              size_t *n_out);
obx_err obx__pg_insert_audit(obx__store *base, const obx__audit_row *a, size_t n);
obx_err obx__pg_ws_run(pg_store *s, ws_stmt *st, size_t ns, const obx__write_set *w,
                       PGresult **keep, bool commit);
obx_err obx__pg_write_set(obx__store *base, const obx__write_set *w);

/* pg_ops.c */
obx_err obx__pg_load_audit(obx__store *base, const char *event_id, obx__audit_row **out,
                           size_t *n_out);
obx_err obx__pg_counter_add(obx__store *base, const char *name, int64_t delta);
obx_err obx__pg_counter_get(obx__store *base, const char *name, int64_t *value);
obx_err obx__pg_series_put(obx__store *base, const obx__series_row *r, int64_t keep_from);
obx_err obx__pg_series_list(obx__store *base, int64_t from, size_t limit, obx__series_row **out,
                            size_t *n);
obx_err obx__pg_cluster_put(obx__store *base, const obx__cluster_row *c);
obx_err obx__pg_cluster_get(obx__store *base, const char *cluster, obx__cluster_row *c);
obx_err obx__pg_envelope_at(obx__store *base, const char *id, int32_t gen,
                            obx__envelope_at_row *out);
obx_err obx__pg_unserved(obx__store *base, int64_t now, obx__unserved_row **out, size_t *n);
obx_err obx__pg_delivery_open(obx__store *base, int64_t out[3]);
obx_err obx__pg_stats(obx__store *base, obx__store_stats *out);
obx_err obx__pg_invariants(obx__store *base, obx__store_invariants *out);
obx_err obx__pg_unknown_resolutions(obx__store *base, int64_t **ms, size_t *n);
obx_err obx__pg_purge_payloads(obx__store *base, const char *const *ids, size_t n, int64_t *bytes);
obx_err obx__pg_aged(obx__store *base, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                     obx__aged_count *count);
obx_err obx__pg_route_set_put(obx__store *base, const obx__route_set_row *rs);
obx_err obx__pg_route_set_get(obx__store *base, int64_t gen, obx__route_set_row *out);
obx_err obx__pg_delivery_put(obx__store *base, const obx__delivery_row *d);
obx_err obx__pg_delivery_get(obx__store *base, const char *id, obx__delivery_row *out);
obx_err obx__pg_delivery_stats(obx__store *base, int64_t *sets, int64_t *complete);
obx_err obx__pg_receipt_details(obx__store *base, const char *event_id, obx__receipt_kind kind,
                                char ***out, size_t *n);
obx_err obx__pg_set_alias(obx__store *base, const char *const *ids, size_t n, const char *from,
                          const char *to, bool *applied);
obx_err obx__pg_receipts_by_kind(obx__store *base, obx__receipt_kind kind, size_t limit,
                                 obx__receipt_row **out, size_t *n);
obx_err obx__pg_recent_published(obx__store *base, size_t limit, obx__published_ref **out,
                                 size_t *n);

/* pg_inbox.c */
obx_err obx__pg_inbox_get(obx__store *base, const char *consumer, const char *event_id,
                          obx__inbox_row *o);
obx_err obx__pg_inbox_put(obx__store *base, const obx__inbox_row *i);
obx_err obx__pg_inbox_has(obx__store *base, const char *consumer, const obx__inbox_key *keys,
                          size_t n, bool *present);
obx_err obx__pg_watermark_put(obx__store *base, const obx__watermark_row *w);
obx_err obx__pg_watermark_list(obx__store *base, const char *consumer, obx__watermark_row **out,
                               size_t *n);
obx_err obx__pg_failure_bump(obx__store *base, const char *consumer, const char *event_id,
                             const char *error, int64_t now, int64_t next_at, int32_t *failures);
obx_err obx__pg_failure_get(obx__store *base, const char *consumer, const char *event_id,
                            int32_t *failures, int64_t *next_at);
obx_err obx__pg_inbox_finish(obx__store *base, const char *consumer, const char *event_id,
                             const char *result, int64_t duration_us);
obx_err obx__pg_failure_clear(obx__store *base, const char *consumer, const char *event_id);
obx_err obx__pg_retry_copy_put(obx__store *base, const obx__retry_copy_row *r);
obx_err obx__pg_retry_copy_list(obx__store *base, const char *consumer, int64_t due_by,
                                size_t limit, obx__retry_copy_row **out, size_t *n);
obx_err obx__pg_retry_copy_del(obx__store *base, const char *consumer, const char *event_id);
obx_err obx__pg_poison_put(obx__store *base, const obx__poison_row *pr);
obx_err obx__pg_poison_list(obx__store *base, const char *consumer, const char *state,
                            obx__poison_row **out, size_t *n);
obx_err obx__pg_poison_get(obx__store *base, const char *consumer, const char *event_id,
                           const char *digest, obx__poison_row *out);
obx_err obx__pg_poison_set_state(obx__store *base, const char *consumer, const char *event_id,
                                 const char *state, int64_t now);
obx_err obx__pg_inbox_quarantine_put(obx__store *base, const char *consumer, const char *event_id,
                                     const char *digest, const char *first_digest,
                                     const char *reason, int64_t at);
obx_err obx__pg_consume_audit_put(obx__store *base, const obx__consume_audit_row *a, size_t n);
obx_err obx__pg_consume_audit_list(obx__store *base, const char *consumer, const char *event_id,
                                   int64_t after_id, size_t limit, obx__consume_audit_row **out,
                                   size_t *n);

/* pg_wake.c */
obx_err obx__pg_wake_release(pg_store *s);
obx_err obx__pg_wake_follow(pg_store *s, const char *cluster);
obx_err obx__pg_wait_for_work(obx__store *base, int timeout_ms, int also_fd, bool *notified);

#endif /* OBX_STORE_PG_INT_H */

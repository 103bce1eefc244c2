/*
 * sq_int.h — what the files of the SQLite store share (only src/store/sqlite/ includes it):
 * the handle (sq_store), the statement table's IDs (Q_*), the binders and column readers, and
 * the functions one file calls in another (obx__sq_*, listed by the file that defines them).
 *
 *   sqlite_store.c  statement text, errors, open and close, schema, transactions, routes, the
 *                   producer's writes, reading events, the relay's writes, the method tables
 *   sqlite_ops.c    the other methods, by table: chart history, clusters, statistics,
 *                   retention, route sets and delivery sets, receipt details
 *   sqlite_inbox.c  the consumer's inbox, watermarks, failures, poison, consume audit
 */
#ifndef OBX_STORE_SQ_INT_H
#define OBX_STORE_SQ_INT_H

#include "store/shared.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    Q_ROUTE_PUT,
    Q_ROUTE_GET,
    Q_ROUTE_LIST_CUR,
    Q_ROUTE_LIST_ALL,
    Q_IDEM,
    Q_INS_ENV,
    Q_INS_EVENT,
    Q_CLAIM,
    Q_SEL_EXPIRED,
    Q_SEL_RECONCILE,
    Q_LOAD,
    Q_LOAD_PAYLOAD,
    Q_UPD_EVENT,
    Q_INS_ATT,
    Q_UPD_ATT,
    Q_LOAD_ATT,
    Q_LOAD_ATT_EVENT,
    Q_INS_RCPT,
    Q_LOAD_RCPT,
    Q_INS_AUDIT,
    Q_LOAD_AUDIT,
    Q_COUNTER_ADD,
    Q_COUNTER_GET,
    Q_STATS_STATE,
    Q_STATS_OLDEST,
    Q_STATS_RCPT,
    Q_STATS_ATT,
    Q_FIND_CORR,
    Q_STATS_INV,
    Q_UNKNOWN_RES,
    Q_INBOX_GET,
    Q_INBOX_PUT,
    Q_INBOX_FINISH,
    Q_INBOX_HAS,
    Q_WM_PUT,
    Q_WM_LIST,
    Q_WM_LIST_ALL,
    Q_FAIL_BUMP,
    Q_FAIL_GET,
    Q_FAIL_GET_ID, /* one event's: a key lookup */
    Q_FAIL_CLEAR,
    Q_RETRY_PUT,
    Q_RETRY_LIST,
    Q_RETRY_DEL,
    Q_POISON_PUT,
    Q_POISON_LIST,
    Q_POISON_GET,
    Q_POISON_GET_COPY, /* one copy's (its digest): a key lookup, no sort */
    Q_POISON_STATE,
    Q_INBOX_QUAR,
    Q_CONSUME_AUDIT,
    Q_FIND,
    Q_RSET_PUT,
    Q_RTGT_PUT,
    Q_RSET_GET,
    Q_RTGT_GET,
    Q_DSET_PUT,
    Q_DTGT_PUT,
    Q_DGET,
    Q_DSTATS,
    Q_RCPT_DETAIL,
    Q_SET_ALIAS,
    Q_RET_CANDIDATES_PUB, /* state = PUBLISHED */
    Q_RET_CANDIDATES_RET, /* state = RETAINED */
    Q_PURGE_GENS,         /* an event's generations that hold a payload */
    Q_PURGE_PAYLOAD,
    Q_RCPT_KIND_SPARSE,
    Q_RCPT_KIND_ANY,
    Q_RECENT_PUB,
    Q_CAUDIT_EVENT,
    Q_CAUDIT_AFTER,
    Q_CAUDIT_NEWEST,
    Q_CLUSTER_PUT,
    Q_CLUSTER_GET,
    Q_SERIES_PUT,
    Q_SERIES_TRIM,
    Q_SERIES_LIST,
    Q_RELAY_CLUSTER_PUT,
    Q_UNSERVED,
    Q_DOPEN,
    Q_ENV_AT,
    Q_SEL_STATE,                                   /* + obx__state: the state is a literal */
    Q_SEL_PUBBEFORE = Q_SEL_STATE + OBX__ST_COUNT, /* + obx__state */
    Q_AGED_LIST = Q_SEL_PUBBEFORE + OBX__ST_COUNT, /* + obx__aged_kind: one statement per kind */
    Q_AGED_COUNT = Q_AGED_LIST + OBX__AGED_COUNT,  /* + obx__aged_kind: one count per kind */
    Q_COUNT = Q_AGED_COUNT + OBX__AGED_COUNT
};

#define SQ_UPD_SLOTS 64
#define SQ_AUDIT_ROWS 16

typedef struct sq_store {
    obx__store base;
    sqlite3 *db;
    bool owned;
    obx__tx_nest tx; /* transaction nesting (shared.c) */
    int64_t busy_since;
    uint64_t busy_rng;
    sqlite3_stmt *q[Q_COUNT];
    /* SAVEPOINT / RELEASE / ROLLBACK TO per nesting depth, prepared once: obx opens a
     * savepoint for every transaction inside a caller's (and the simulator's) transaction */
    sqlite3_stmt *sp[8][3];
    /* BEGIN IMMEDIATE, COMMIT, ROLLBACK of the outermost transaction, prepared once (parsing
     * them is a measurable part of a short transaction: the simulator opens one per trace) */
    sqlite3_stmt *tx_st[3];
    /* the event updates by the set of columns they write (update_stmt, sqlite_store.c) */
    struct sq_upd {
        uint32_t cols;
        sqlite3_stmt *st;
    } upd[SQ_UPD_SLOTS];
    /* the INSERTs of 2 .. SQ_AUDIT_ROWS audit rows (audit_stmt, sqlite_store.c) */
    sqlite3_stmt *audit_n[SQ_AUDIT_ROWS - 1];
    bool read_only;         /* OBX_STORE_READ_ONLY: opened read-only, transactions are read ones */
    obx__ulid_gen txid_gen; /* the producer's created_txid (mint_txid) */
} sq_store;

static inline void bt(sqlite3_stmt *st, int i, const char *v) {
    sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
}
static inline void bi(sqlite3_stmt *st, int i, int64_t v) { sqlite3_bind_int64(st, i, v); }

static inline void ct(sqlite3_stmt *st, int i, char *out, size_t cap) {
    const unsigned char *t = sqlite3_column_text(st, i);
    obx__strlcpy(out, t ? (const char *)t : "", cap);
}
#define CT(st, i, field) ct(st, i, field, sizeof(field))
static inline int64_t ci(sqlite3_stmt *st, int i) { return sqlite3_column_int64(st, i); }

/* the shared decoders' view of a stepped statement (shared.h) */
static inline int64_t rd_i64(void *st, int i) { return sqlite3_column_int64(st, i); }
static inline bool rd_flag(void *st, int i) { return sqlite3_column_int64(st, i) != 0; }
static inline void rd_text(void *st, int i, char *out, size_t cap) { ct(st, i, out, cap); }
#define READER(st) (&(obx__col_reader){rd_i64, rd_flag, rd_text, (st)})

/* sqlite_store.c */
obx_err obx__sq_map_rc(sq_store *s, int rc, const char *what);
obx_err obx__sq_stmt(sq_store *s, int id, sqlite3_stmt **out);
obx_err obx__sq_step_done(sq_store *s, sqlite3_stmt *st, const char *what);
obx_err obx__sq_grow_array(void **arr, size_t *cap, size_t need, size_t elem);
obx_err obx__sq_collect_receipts(sq_store *s, sqlite3_stmt *st, const char *what,
                                 obx__receipt_row **out, size_t *n_out);

/* sqlite_ops.c */
obx_err obx__sq_series_put(obx__store *base, const obx__series_row *r, int64_t keep_from);
obx_err obx__sq_series_list(obx__store *base, int64_t from, size_t limit, obx__series_row **out,
                            size_t *n);
obx_err obx__sq_cluster_put(obx__store *base, const obx__cluster_row *c);
obx_err obx__sq_unserved(obx__store *base, int64_t now, obx__unserved_row **out, size_t *n);
obx_err obx__sq_cluster_get(obx__store *base, const char *cluster, obx__cluster_row *c);
obx_err obx__sq_envelope_at(obx__store *base, const char *id, int32_t gen,
                            obx__envelope_at_row *out);
obx_err obx__sq_delivery_open(obx__store *base, int64_t out[3]);
obx_err obx__sq_stats(obx__store *base, obx__store_stats *out);
obx_err obx__sq_invariants(obx__store *base, obx__store_invariants *out);
obx_err obx__sq_unknown_resolutions(obx__store *base, int64_t **ms, size_t *n);
obx_err obx__sq_purge_payloads(obx__store *base, const char *const *ids, size_t n, int64_t *bytes);
obx_err obx__sq_aged(obx__store *base, const obx__aged_req *req, obx__aged_row **out, size_t *n,
                     obx__aged_count *count);
obx_err obx__sq_route_set_put(obx__store *base, const obx__route_set_row *r);
obx_err obx__sq_route_set_get(obx__store *base, int64_t gen, obx__route_set_row *out);
obx_err obx__sq_delivery_put(obx__store *base, const obx__delivery_row *d);
obx_err obx__sq_delivery_get(obx__store *base, const char *id, obx__delivery_row *out);
obx_err obx__sq_delivery_stats(obx__store *base, int64_t *sets, int64_t *complete);
obx_err obx__sq_receipt_details(obx__store *base, const char *event_id, obx__receipt_kind kind,
                                char ***out, size_t *n);
obx_err obx__sq_set_alias(obx__store *base, const char *const *ids, size_t n, const char *from,
                          const char *to, bool *applied);
obx_err obx__sq_receipts_by_kind(obx__store *base, obx__receipt_kind kind, size_t limit,
                                 obx__receipt_row **out, size_t *n);
obx_err obx__sq_recent_published(obx__store *base, size_t limit, obx__published_ref **out,
                                 size_t *n);

/* sqlite_inbox.c */
obx_err obx__sq_inbox_get(obx__store *base, const char *consumer, const char *event_id,
                          obx__inbox_row *r);
obx_err obx__sq_inbox_put(obx__store *base, const obx__inbox_row *r);
obx_err obx__sq_inbox_finish(obx__store *base, const char *consumer, const char *event_id,
                             const char *result, int64_t duration_us);
obx_err obx__sq_inbox_has(obx__store *base, const char *consumer, const obx__inbox_key *keys,
                          size_t n, bool *present);
obx_err obx__sq_watermark_put(obx__store *base, const obx__watermark_row *w);
obx_err obx__sq_watermark_list(obx__store *base, const char *consumer, obx__watermark_row **out,
                               size_t *n);
obx_err obx__sq_failure_bump(obx__store *base, const char *consumer, const char *event_id,
                             const char *error, int64_t now, int64_t next_at, int32_t *failures);
obx_err obx__sq_failure_get(obx__store *base, const char *consumer, const char *event_id,
                            int32_t *failures, int64_t *next_at);
obx_err obx__sq_failure_clear(obx__store *base, const char *consumer, const char *event_id);
obx_err obx__sq_retry_copy_put(obx__store *base, const obx__retry_copy_row *r);
obx_err obx__sq_retry_copy_list(obx__store *base, const char *consumer, int64_t due_by,
                                size_t limit, obx__retry_copy_row **out, size_t *n);
obx_err obx__sq_retry_copy_del(obx__store *base, const char *consumer, const char *event_id);
obx_err obx__sq_poison_put(obx__store *base, const obx__poison_row *p);
obx_err obx__sq_poison_list(obx__store *base, const char *consumer, const char *state,
                            obx__poison_row **out, size_t *n);
obx_err obx__sq_poison_get(obx__store *base, const char *consumer, const char *event_id,
                           const char *digest, obx__poison_row *out);
obx_err obx__sq_poison_set_state(obx__store *base, const char *consumer, const char *event_id,
                                 const char *state, int64_t now);
obx_err obx__sq_inbox_quarantine_put(obx__store *base, const char *consumer, const char *event_id,
                                     const char *digest, const char *first_digest,
                                     const char *reason, int64_t at);
obx_err obx__sq_consume_audit_put(obx__store *base, const obx__consume_audit_row *a, size_t n);
obx_err obx__sq_consume_audit_list(obx__store *base, const char *consumer, const char *event_id,
                                   int64_t after_id, size_t limit, obx__consume_audit_row **out,
                                   size_t *n);

#endif /* OBX_STORE_SQ_INT_H */

/*
 * engine_int.h — helpers shared by the engine's files (not used outside src/engine).
 */
#ifndef OBX_ENGINE_INT_H
#define OBX_ENGINE_INT_H

#include "engine/engine.h"

#include <stdlib.h>

uint64_t obx__engine_rand(obx__engine *e);

/* seal.c: the key ID ("" = none) route generation gen seals payloads with, into out. */
obx_err obx__route_key(obx__engine *e, int64_t gen, char out[OBX_KEY_ID_MAX + 1]);
/* Whether r may be sent as far as encryption goes: its route seals nothing, or this engine has
 * the key. false: why (cap bytes); *transient when the store could not say (not a park). */
bool obx__sealable(obx__engine *e, const obx__event_row *r, char *why, size_t cap, bool *transient);
/* r's payload sealed for the send under wire_id (*sealed malloc'ed, the caller frees; NULL and
 * *key_out NULL when its route seals nothing); *key_out is the key ID, valid while e lives. */
obx_err obx__seal_row(obx__engine *e, const obx__event_row *r, const char *wire_id,
                      unsigned char **sealed, size_t *len, const char **key_out);
/* Sets q's key ring and key ID when route generation route_gen seals payloads (a lookup then
 * opens the copies it reads). */
obx_err obx__lookup_keys(obx__engine *e, int64_t route_gen, obx__lookup_req *q);
/* Backoff before retry number n (1-based), with jitter. */
int64_t obx__engine_backoff(obx__engine *e, int n);
void obx__audit(obx__audit_row *a, int64_t now, obx__actor actor, const char *who,
                const obx__event_row *r, obx__state from, obx__state to, const char *fmt, ...)
    OBX__PRINTF(8, 9);
obx__event_row *obx__rows_find(obx__rows *r, const char *event_id);

/* Finds rows of a batch by ID in O(log n) with the answer of a linear scan: the first row, in
 * array order, with that ID (a batch may hold one row twice, and the first copy is the one that
 * accumulates changes). A linear scan per outcome made a batch of 256 ACKs cost 65,000 string
 * comparisons (5 % of the relay's CPU). The index points into the rows: build it after they are
 * loaded, use it while neither the array nor the IDs change. */
typedef struct obx__id_index {
    struct obx__id_ent {
        const char *id;
        size_t at;
    } * v;
    size_t n;
} obx__id_index;
/* id_at(rows, i) is row i's ID; OBX_ENOMEM leaves an index that finds nothing. */
obx_err obx__id_index_build(obx__id_index *x, const void *rows, size_t n,
                            const char *(*id_at)(const void *rows, size_t i));
/* The same over a batch's attempts (by attempt ID) or events (by event ID). */
obx_err obx__id_index_attempts(obx__id_index *x, const obx__attempt_row *a, size_t n);
obx_err obx__id_index_events(obx__id_index *x, const obx__rows *r);
/* The position of the first row with this ID, or -1. */
long obx__id_index_find(const obx__id_index *x, const char *id);
void obx__id_index_free(obx__id_index *x);

/* The rows one transaction writes. An event update's new values are either a copy in upd_rows
 * (obx__batch_update) or the caller's own row (obx__batch_update_ref: a batch from
 * obx__batch_reserve_refs, which has no upd_rows; the row must stay put until the write). */
typedef struct obx__batch {
    obx__event_update *upd;
    obx__event_row *upd_rows; /* NULL in a batch of references */
    bool *applied;
    size_t n_upd;
    obx__attempt_row *att; /* updates */
    size_t n_att;
    obx__attempt_row *att_new; /* inserts */
    size_t n_att_new;
    obx__receipt_row *rc;
    size_t n_rc;
    obx__audit_row *au;
    size_t n_au;
} obx__batch;

obx_err obx__batch_reserve(obx__batch *b, size_t n_events, size_t n_attempts, size_t n_receipts,
                           size_t n_audit);
void obx__batch_free(obx__batch *b);
obx_err obx__batch_write(obx__store *s, obx__batch *b);
void obx__batch_update(obx__batch *b, const obx__event_row *cur, const obx__event_row *next);
/* An event as its transaction loaded it: the compare-and-set expectation of its update (state
 * and claim generation) and the other columns an update writes, so that the update writes only
 * the columns that changed. A transaction that changes its loaded rows in place keeps these
 * instead of a copy of each row (a row is 3.9 KB, these about 1 KB: a relay's accept of 256
 * receipts kept three copies of its rows, the largest part of its peak memory). */
typedef obx__event_cols obx__cas;
obx_err obx__batch_reserve_refs(obx__batch *b, size_t n_events, size_t n_attempts,
                                size_t n_receipts, size_t n_audit);
void obx__batch_update_ref(obx__batch *b, const obx__cas *expect, const obx__event_row *next);
/* The loaded columns of rows r (n of them), to cas[n] (the caller's to free); NULL on ENOMEM. */
obx__cas *obx__cas_of(const obx__rows *r);

/* Runs fn in a transaction, retrying it (up to 4 times) when the store reports a retriable
 * error (busy, serialization failure, lost connection before commit). */
typedef obx_err (*obx__tx_fn)(obx__engine *e, void *arg);
obx_err obx__engine_tx(obx__engine *e, obx__tx_fn fn, void *arg);

/* p in [0,1]; sorts v in place. */
int64_t obx__percentile(int64_t *v, size_t n, double p);
obx_err obx__report_json(obx__store *s, json_t **out);

/* A note about row's current attempt (no latency, no UNKNOWN episode length). */
static inline obx__note obx__note_of(obx__note_kind k, const obx__event_row *row,
                                     const char *detail) {
    return (obx__note){.kind = k,
                       .event_id = row->env.event_id,
                       .attempt_id = row->attempt_id,
                       .correlation_id = row->env.correlation_id,
                       .latency_ms = -1,
                       .unknown_ms = -1,
                       .detail = detail,
                       .ev = row,
                       .attempt_gen = row->attempt_gen};
}

#endif

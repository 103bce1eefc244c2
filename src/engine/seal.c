/*
 * seal.c — payload encryption in the engine (docs/security.md, "Payload encryption"): which key
 * an event's route generation seals with, the payload sealed for a send, and the key a lookup
 * opens the broker's copies with.
 *
 * Invariants:
 *   1. An event is sealed with the key of the route generation frozen in its destination
 *      (dest.route_gen): the route row's encrypt_key, which no later `route set` changes. A
 *      generation is read from the store once per engine (route rows never change), so a route
 *      without encryption costs a memory lookup per sent event.
 *   2. An event of an encrypted route is never sent in the clear: a relay without its key parks
 *      it (sendable, dispatch.c) instead of sending; a store that cannot say which key makes the
 *      attempt NOT_SENT (back to PENDING with backoff).
 *   3. Every check of a broker's copy of an encrypted event opens it with the same key, event ID
 *      and generation (obx__lookup_copy): only the exact body the relay sends counts as evidence.
 */
#include "engine/engine_int.h"

#include <string.h>

static const char *cached(const obx__engine *e, int64_t gen) {
    for (size_t i = 0; i < e->n_keys_cached; i++)
        if (e->key_cache[i].gen == gen) return e->key_cache[i].key;
    return NULL;
}

static void remember(obx__engine *e, int64_t gen, const char *key) {
    size_t cap = sizeof e->key_cache / sizeof e->key_cache[0];
    size_t at = e->n_keys_cached < cap ? e->n_keys_cached++ : e->key_cache_next++ % cap;
    e->key_cache[at].gen = gen;
    obx__strlcpy(e->key_cache[at].key, key, sizeof e->key_cache[at].key);
}

obx_err obx__route_key(obx__engine *e, int64_t gen, char out[OBX_KEY_ID_MAX + 1]) {
    const char *k = cached(e, gen);
    if (!k) {
        obx__route_row *rows = NULL;
        size_t n = 0;
        obx_err err = obx__st_route_list(e->s, true, &rows, &n);
        if (err) return err;
        for (size_t i = 0; i < n; i++)
            if (rows[i].gen == gen) remember(e, gen, rows[i].encrypt_key);
        free(rows);
        if (!(k = cached(e, gen)))
            return obx__fail(OBX_ENOTFOUND, "route generation %lld: not in the store",
                             (long long)gen);
    }
    obx__strlcpy(out, k, OBX_KEY_ID_MAX + 1);
    return OBX_OK;
}

bool obx__sealable(obx__engine *e, const obx__event_row *r, char *why, size_t cap,
                   bool *transient) {
    char key[OBX_KEY_ID_MAX + 1];
    *transient = false;
    if (obx__route_key(e, r->dest.route_gen, key)) {
        *transient = true;
        snprintf(why, cap, "which key seals route generation %lld is not known: %s",
                 (long long)r->dest.route_gen, obx_errmsg());
        obx__utf8_trim(why);
        return false;
    }
    if (!key[0] || obx__keyring_has(e->cfg.keys, key)) return true;
    snprintf(why, cap,
             "route generation %lld seals payloads with key '%s', which is not in this relay's "
             "key ring (encryption.keys): refused to send the payload in the clear",
             (long long)r->dest.route_gen, key);
    return false;
}

obx_err obx__seal_row(obx__engine *e, const obx__event_row *r, const char *wire_id,
                      unsigned char **sealed, size_t *len, const char **key_out) {
    *sealed = NULL;
    *len = 0;
    *key_out = NULL;
    char key[OBX_KEY_ID_MAX + 1];
    obx_err err = obx__route_key(e, r->dest.route_gen, key);
    if (err || !key[0]) return err;
    err = obx__seal(e->cfg.keys, key, wire_id, r->envelope_gen, r->payload, r->payload_len,
                    r->env.payload_digest, sealed, len);
    if (!err) *key_out = cached(e, r->dest.route_gen);
    return err;
}

obx_err obx__lookup_keys(obx__engine *e, int64_t route_gen, obx__lookup_req *q) {
    char key[OBX_KEY_ID_MAX + 1];
    obx_err err = obx__route_key(e, route_gen, key);
    if (err || !key[0]) return err;
    q->keys = e->cfg.keys;
    q->enc_key = cached(e, route_gen);
    return OBX_OK;
}

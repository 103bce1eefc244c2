/*
 * canon.c — canonical encodings of destination.v1 and outboxEnvelope.v1 and their SHA-256
 * digests (docs/canonical-encoding.md). This file is a compatibility contract: the PostgreSQL
 * function obx.enqueue() and any other implementation must produce the same bytes. The vectors in
 * tests/data/digest_vectors.json pin it; change them only with a new tag (".v2").
 *
 * Encoding: for the tag and then each field in the fixed order below,
 *   u32 big-endian byte length || UTF-8 bytes
 * Integers are written as decimal ASCII (no sign for non-negative, no leading zeros).
 * An absent optional field is encoded as the empty string. not_before, the one field added
 * since the tag, is a trailing field present only when set: an event without a delay encodes
 * (and digests) exactly as before it existed.
 */
#include "core.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static void field(obx__buf *b, const char *s) {
    size_t n = strlen(s);
    obx__buf_u32be(b, (uint32_t)n);
    obx__buf_put(b, s, n);
}

static void field_i64(obx__buf *b, int64_t v) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)v);
    field(b, tmp);
}

void obx__dest_canonical(const obx__dest *d, obx__buf *b) {
    field(b, OBX__DEST_TAG);
    field(b, d->cluster);
    field(b, d->topic);
    field(b, d->routing_key);
    field(b, d->algorithm);
    field_i64(b, d->route_gen);
    field(b, d->serializer);
    field(b, d->durability);
    field(b, d->required_acks);
}

void obx__envelope_canonical_head(const obx__envelope *e, obx__buf *b) {
    field(b, OBX__ENV_TAG);
    field(b, e->event_id);
    field_i64(b, e->envelope_gen);
    field(b, e->aggregate_type);
    field(b, e->aggregate_id);
    field_i64(b, e->aggregate_version);
    field(b, e->event_type);
    field(b, e->payload_schema);
    field(b, e->payload_digest);
    field(b, e->tenant);
    field_i64(b, e->occurred_at);
}

void obx__envelope_canonical_tail(const obx__envelope *e, obx__buf *b) {
    field(b, e->correlation_id);
    field(b, e->causation_id);
    field(b, e->traceparent);
    field(b, e->idempotency_key);
    if (e->not_before) field_i64(b, e->not_before);
}

/* Written as head, created_txid, tail, so that the split a store relies on (core.h) is the
 * encoding itself, not a copy of it. */
void obx__envelope_canonical(const obx__envelope *e, obx__buf *b) {
    obx__envelope_canonical_head(e, b);
    field(b, e->created_txid);
    obx__envelope_canonical_tail(e, b);
}

/* OpenSSL 3 resolves EVP_sha256() through the provider store on every use, under a global
 * lock: with several threads digesting at once that lock dominates. Fetch the algorithm once. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static void sha256_init(void) { sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL); }

obx_err obx_sha256_digest(const void *data, size_t len, char out[OBX_DIGEST_LEN + 1]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (!out) return obx__fail(OBX_EINVAL, "out: NULL");
    if (!data && len) return obx__fail(OBX_EINVAL, "data: NULL with length %zu", len);
    pthread_once(&sha256_once, sha256_init);
    const EVP_MD *alg = sha256_md ? sha256_md : EVP_sha256();
    if (EVP_Digest(data ? data : "", len, md, &mdlen, alg, NULL) != 1 || mdlen != 32)
        return obx__fail(OBX_EINTERNAL, "SHA-256 failed in libcrypto");
    memcpy(out, "sha256:", 7);
    obx__hex(md, 32, out + 7);
    return OBX_OK;
}

static obx_err digest_buf(obx__buf *b, char out[OBX_DIGEST_LEN + 1]) {
    obx_err rc = b->oom ? obx__fail(OBX_ENOMEM, "canonical encoding: out of memory")
                        : obx_sha256_digest(b->data, b->len, out);
    obx__buf_free(b);
    return rc;
}

obx_err obx__dest_digest(const obx__dest *d, char out[OBX_DIGEST_LEN + 1]) {
    obx__buf b = {0};
    obx__dest_canonical(d, &b);
    return digest_buf(&b, out);
}

obx_err obx__envelope_digest(const obx__envelope *e, char out[OBX_DIGEST_LEN + 1]) {
    obx__buf b = {0};
    obx__envelope_canonical(e, &b);
    return digest_buf(&b, out);
}

obx_err obx__routing_key_expand(const char *tpl, const obx__envelope *e, char *out, size_t cap) {
    static const struct {
        const char *name;
        size_t off;
    } vars[] = {
        {"{tenant}", offsetof(obx__envelope, tenant)},
        {"{aggregate_type}", offsetof(obx__envelope, aggregate_type)},
        {"{aggregate_id}", offsetof(obx__envelope, aggregate_id)},
        {"{event_type}", offsetof(obx__envelope, event_type)},
    };
    size_t o = 0;
    for (const char *p = tpl; *p;) {
        const char *val = NULL;
        size_t skip = 1;
        if (*p == '{') {
            for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
                size_t n = strlen(vars[i].name);
                if (!strncmp(p, vars[i].name, n)) {
                    val = (const char *)e + vars[i].off;
                    skip = n;
                    break;
                }
            }
            if (!val) {
                char shown[64];
                return obx__fail(OBX_EINVAL,
                                 "routing_key: unknown placeholder at '%s' (known: {tenant} "
                                 "{aggregate_type} {aggregate_id} {event_type})",
                                 obx__printable(p, strnlen(p, 20), shown, sizeof shown));
            }
        }
        size_t n = val ? strlen(val) : 1;
        if (o + n >= cap)
            return obx__fail(OBX_ETOOBIG,
                             "routing_key: expands to more than %zu bytes with this event's "
                             "tenant (%zu bytes), aggregate_type (%zu) and aggregate_id (%zu)",
                             cap - 1, strlen(e->tenant), strlen(e->aggregate_type),
                             strlen(e->aggregate_id));
        memcpy(out + o, val ? val : p, n);
        o += n;
        p += skip;
    }
    out[o] = '\0';
    return OBX_OK;
}

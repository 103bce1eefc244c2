/*
 * crypt.c — payload encryption: AES-256-GCM under a key ring of named keys (docs/security.md,
 * "Payload encryption").
 *
 * Owns the key ring (obx_keyring: up to OBX__KEYS_MAX keys, each a key ID and 32 bytes), its text
 * form, and the sealed body a broker holds for an event of an encrypted route:
 *
 *     body = nonce (12 bytes) || ciphertext (as long as the payload) || GCM tag (16 bytes)
 *     AAD  = "obx-aes256gcm-v1" NUL key_id NUL event_id NUL envelope_gen (4 bytes, big endian)
 *     nonce = the first 12 bytes of HMAC-SHA256(key, "obx-nonce-v1" NUL AAD payload_digest)
 *
 * payload_digest is the frozen digest as obx writes it ("sha256:" and 64 hex digits). The format
 * is also written in Python (examples/crypt/obx_seal.py), from which tests/data/seal_vectors.json
 * comes.
 *
 * Invariants:
 *   1. Deterministic: the same key, event ID, envelope generation and payload give the same
 *      body, so a resend (a retry, a reconciler's same-target retry) puts the same bytes at the
 *      broker, and a lookup can tell the event's copy from any other by its bytes.
 *   2. A nonce is never reused for two payloads under one key: it is derived from the payload's
 *      digest and the AAD (a synthetic IV), so two bodies share a nonce only when they are the
 *      same encryption of the same payload of the same event generation.
 *   3. obx__open() accepts a body only when the tag verifies for this key, event ID and envelope
 *      generation (a copy moved to another event, or sealed under another key, is refused) and
 *      the nonce is the one invariant 1 derives from the plaintext: a body is accepted only when
 *      it is exactly what obx__seal() gives for the plaintext it opens to.
 *   4. Key bytes never leave this file except into libcrypto: no message names more than the key
 *      ID, and the ring is wiped when freed.
 *
 * Pure: no I/O. The relay and consumers hand the ring's text to obx_keyring_open() through the
 * secret reference syntax (secret.c: `${file:PATH}`, `${NAME}`), which reads it.
 */
#include "core.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define AAD_TAG "obx-aes256gcm-v1"
#define NONCE_TAG "obx-nonce-v1"

typedef struct keyslot {
    char id[OBX_KEY_ID_MAX + 1];
    unsigned char key[32];
} keyslot;

struct obx_keyring {
    keyslot k[OBX__KEYS_MAX];
    size_t n;
};

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

obx_err obx__key_id_check(const char *id) {
    return obx__check_field("key ID", id, 1, OBX_KEY_ID_MAX, OBX__CS_NAME);
}

/* One "ID=HEX" entry (len bytes at p) into ring. */
static obx_err parse_entry(obx_keyring *ring, const char *p, size_t len, int no) {
    const char *eq = memchr(p, '=', len);
    if (!eq) eq = memchr(p, ':', len);
    if (!eq) return obx__fail(OBX_ECONFIG, "key ring entry %d: not ID=HEX", no);
    size_t idlen = (size_t)(eq - p), hexlen = len - idlen - 1;
    while (idlen && (p[idlen - 1] == ' ' || p[idlen - 1] == '\t')) idlen--;
    while (hexlen && (eq[1] == ' ' || eq[1] == '\t')) eq++, hexlen--;
    char id[OBX_KEY_ID_MAX + 1];
    if (!idlen || idlen > OBX_KEY_ID_MAX)
        return obx__fail(OBX_ECONFIG, "key ring entry %d: key ID of %zu bytes (1..%d)", no, idlen,
                         OBX_KEY_ID_MAX);
    memcpy(id, p, idlen);
    id[idlen] = '\0';
    if (obx__key_id_check(id)) {
        char why[OBX_TEXT_MAX + 1]; /* obx__fail writes where obx_errmsg() reads */
        obx__strlcpy(why, obx_errmsg(), sizeof why);
        return obx__fail(OBX_ECONFIG, "key ring entry %d: %s", no, why);
    }
    if (hexlen != 64)
        return obx__fail(OBX_ECONFIG,
                         "key ring: key '%s' has %zu hex digits, an AES-256 key has 64", id,
                         hexlen);
    if (ring->n == OBX__KEYS_MAX)
        return obx__fail(OBX_ECONFIG, "key ring: more than %d keys", OBX__KEYS_MAX);
    for (size_t i = 0; i < ring->n; i++)
        if (!strcmp(ring->k[i].id, id))
            return obx__fail(OBX_ECONFIG, "key ring: key ID '%s' given twice", id);
    keyslot *s = &ring->k[ring->n];
    for (size_t i = 0; i < 32; i++) {
        int hi = hexval((unsigned char)eq[1 + 2 * i]), lo = hexval((unsigned char)eq[2 + 2 * i]);
        if (hi < 0 || lo < 0) {
            OPENSSL_cleanse(s->key, sizeof s->key);
            return obx__fail(OBX_ECONFIG, "key ring: key '%s' is not hexadecimal", id);
        }
        s->key[i] = (unsigned char)(hi << 4 | lo);
    }
    obx__strlcpy(s->id, id, sizeof s->id);
    ring->n++;
    return OBX_OK;
}

static bool is_sep(char c) { return c == '\n' || c == '\r' || c == ',' || c == ';'; }

obx_err obx__keyring_parse(const char *text, obx_keyring **out) {
    *out = NULL;
    if (!text) return obx__fail(OBX_EINVAL, "key ring: NULL");
    obx_keyring *ring = calloc(1, sizeof *ring);
    if (!ring) return obx__fail(OBX_ENOMEM, "key ring: out of memory");
    obx_err e = OBX_OK;
    int no = 0;
    for (const char *p = text; !e && *p;) {
        while (*p && (is_sep(*p) || *p == ' ' || *p == '\t')) p++;
        const char *end = p;
        while (*end && !is_sep(*end)) end++;
        size_t len = (size_t)(end - p);
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len && *p != '#') e = parse_entry(ring, p, len, ++no);
        p = end;
    }
    if (!e && !ring->n) e = obx__fail(OBX_ECONFIG, "key ring: no key (one ID=HEX64 a line)");
    if (e) {
        obx_keyring_close(ring);
        return e;
    }
    *out = ring;
    return OBX_OK;
}

void obx_keyring_close(obx_keyring *ring) {
    if (!ring) return;
    OPENSSL_cleanse(ring, sizeof *ring);
    free(ring);
}

size_t obx_keyring_count(const obx_keyring *ring) { return ring ? ring->n : 0; }

bool obx__keyring_has(const obx_keyring *ring, const char *id) {
    for (size_t i = 0; ring && id && i < ring->n; i++)
        if (!strcmp(ring->k[i].id, id)) return true;
    return false;
}

static const keyslot *slot(const obx_keyring *ring, const char *id) {
    for (size_t i = 0; ring && i < ring->n; i++)
        if (!strcmp(ring->k[i].id, id)) return &ring->k[i];
    return NULL;
}

/* AAD of invariant 3 into aad (cap bytes); its length. */
static size_t make_aad(const char *key_id, const char *event_id, int32_t gen, unsigned char *aad,
                       size_t cap) {
    size_t a = strlen(AAD_TAG) + 1, b = strlen(key_id) + 1, c = strlen(event_id) + 1;
    if (a + b + c + 4 > cap) return 0;
    memcpy(aad, AAD_TAG, a);
    memcpy(aad + a, key_id, b);
    memcpy(aad + a + b, event_id, c);
    uint32_t g = (uint32_t)gen;
    unsigned char *t = aad + a + b + c;
    t[0] = (unsigned char)(g >> 24), t[1] = (unsigned char)(g >> 16);
    t[2] = (unsigned char)(g >> 8), t[3] = (unsigned char)g;
    return a + b + c + 4;
}

static bool derive_nonce(const keyslot *k, const unsigned char *aad, size_t aad_len,
                         const char *digest, unsigned char nonce[OBX__NONCE_LEN]) {
    unsigned char mac[EVP_MAX_MD_SIZE], msg[sizeof NONCE_TAG + OBX__AAD_MAX + OBX_DIGEST_LEN];
    unsigned int mac_len = 0;
    size_t dl = strlen(digest);
    if (aad_len > OBX__AAD_MAX || dl > OBX_DIGEST_LEN) return false;
    memcpy(msg, NONCE_TAG, sizeof NONCE_TAG);
    memcpy(msg + sizeof NONCE_TAG, aad, aad_len);
    memcpy(msg + sizeof NONCE_TAG + aad_len, digest, dl);
    bool ok = HMAC(EVP_sha256(), k->key, sizeof k->key, msg, sizeof NONCE_TAG + aad_len + dl, mac,
                   &mac_len) &&
              mac_len >= OBX__NONCE_LEN;
    if (ok) memcpy(nonce, mac, OBX__NONCE_LEN);
    return ok;
}

/* One AES-256-GCM pass: enc (seal: tag out) or open (tag in, verified). */
static bool gcm(bool enc, const keyslot *k, const unsigned char *nonce, const unsigned char *aad,
                size_t aad_len, const unsigned char *in, size_t len, unsigned char *out,
                unsigned char *tag) {
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int n = 0, fin = 0;
    bool ok = c && EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) &&
              EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, OBX__NONCE_LEN, NULL) &&
              EVP_CipherInit_ex(c, NULL, NULL, k->key, nonce, enc) &&
              EVP_CipherUpdate(c, NULL, &n, aad, (int)aad_len) &&
              (len == 0 || EVP_CipherUpdate(c, out, &n, in, (int)len)) &&
              (enc || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, OBX__TAG_LEN, tag)) &&
              EVP_CipherFinal_ex(c, out + (len ? n : 0), &fin) == 1 &&
              (!enc || EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, OBX__TAG_LEN, tag));
    EVP_CIPHER_CTX_free(c);
    return ok;
}

obx_err obx__seal(const obx_keyring *ring, const char *key_id, const char *event_id, int32_t gen,
                  const void *payload, size_t len, const char *payload_digest, unsigned char **out,
                  size_t *out_len) {
    const keyslot *k = slot(ring, key_id);
    if (!k) return obx__fail(OBX_ECONFIG, "encryption: key '%s' is not in the key ring", key_id);
    if (len > (size_t)INT32_MAX - OBX__SEAL_OVERHEAD)
        return obx__fail(OBX_ETOOBIG, "encryption: payload of %zu bytes", len);
    unsigned char aad[OBX__AAD_MAX];
    size_t aad_len = make_aad(key_id, event_id, gen, aad, sizeof aad);
    *out = NULL;
    *out_len = 0;
    if (!aad_len) return obx__fail(OBX_EINVAL, "encryption: event ID or key ID too long");
    unsigned char *b = malloc(len + OBX__SEAL_OVERHEAD);
    if (!b) return obx__fail(OBX_ENOMEM, "encryption: out of memory");
    if (!derive_nonce(k, aad, aad_len, payload_digest, b) ||
        !gcm(true, k, b, aad, aad_len, payload, len, b + OBX__NONCE_LEN,
             b + OBX__NONCE_LEN + len)) {
        free(b);
        return obx__fail(OBX_EINTERNAL, "encryption: AES-256-GCM failed (libcrypto)");
    }
    *out = b;
    *out_len = len + OBX__SEAL_OVERHEAD;
    return OBX_OK;
}

obx_err obx__open(const obx_keyring *ring, const char *key_id, const char *event_id, int32_t gen,
                  const void *body, size_t len, unsigned char **out, size_t *out_len) {
    const keyslot *k = slot(ring, key_id);
    *out = NULL;
    *out_len = 0;
    if (!k) return obx__fail(OBX_ENOTFOUND, "decryption: key '%s' is not in the key ring", key_id);
    if (len < OBX__SEAL_OVERHEAD)
        return obx__fail(OBX_EREFUSED,
                         "decryption refused: a body of %zu bytes is shorter than "
                         "a nonce and a tag",
                         len);
    unsigned char aad[OBX__AAD_MAX];
    size_t aad_len = make_aad(key_id, event_id ? event_id : "", gen, aad, sizeof aad);
    size_t plen = len - OBX__SEAL_OVERHEAD;
    if (!aad_len) return obx__fail(OBX_EINVAL, "decryption: event ID or key ID too long");
    unsigned char *p = malloc(plen + 1);
    if (!p) return obx__fail(OBX_ENOMEM, "decryption: out of memory");
    const unsigned char *b = body;
    unsigned char tag[OBX__TAG_LEN], nonce[OBX__NONCE_LEN];
    char digest[OBX_DIGEST_LEN + 1];
    memcpy(tag, b + OBX__NONCE_LEN + plen, sizeof tag);
    if (!gcm(false, k, b, aad, aad_len, b + OBX__NONCE_LEN, plen, p, tag)) {
        free(p);
        return obx__fail(OBX_EREFUSED,
                         "decryption refused: the body does not authenticate under key '%s' for "
                         "%s generation %d (tampered, moved or sealed under another key)",
                         key_id, event_id ? event_id : "?", (int)gen);
    }
    /* invariant 3: only the body obx__seal gives for this plaintext */
    if (obx_sha256_digest(p, plen, digest) || !derive_nonce(k, aad, aad_len, digest, nonce) ||
        CRYPTO_memcmp(nonce, b, sizeof nonce)) {
        OPENSSL_cleanse(p, plen);
        free(p);
        return obx__fail(OBX_EREFUSED, "decryption refused: the nonce is not the one derived "
                                       "from the plaintext (not a body obx sealed)");
    }
    p[plen] = '\0';
    *out = p;
    *out_len = plen;
    return OBX_OK;
}

obx_err obx_keyring_open(const char *spec, obx_keyring **out) {
    if (!out) return obx__fail(OBX_EINVAL, "key ring: NULL out");
    *out = NULL;
    if (!spec || !*spec) return obx__fail(OBX_ECONFIG, "key ring: empty (give ${file:PATH})");
    obx__clear_error();
    char *text = NULL;
    obx_err e = obx__secret_expand(spec, false, &text);
    if (!e) e = obx__keyring_parse(text, out);
    obx__secret_free(text);
    return e;
}

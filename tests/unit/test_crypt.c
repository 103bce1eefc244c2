/*
 * test_crypt.c — payload encryption (src/core/crypt.c) and the broker-side evidence check of a
 * sealed copy (obx__lookup_copy, src/broker/broker.c): the key ring's text, the sealed body
 * against vectors made by an independent implementation (examples/crypt/obx_seal.py), the
 * associated data binding a body to its event ID, generation and key, refusal of tampered
 * bodies, of a wrong key and of a body sealed with another nonce, and a lookup that accepts only
 * the exact body the relay sends as evidence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "broker/broker.h"
#include "core/core.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#define K1 "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define K2 "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
#define EID "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1W"
#define PAYLOAD "{\"order\":\"o-1\",\"total\":100}"

static obx_keyring *ring(const char *text) {
    obx_keyring *r = NULL;
    assert_int_equal(obx__keyring_parse(text, &r), OBX_OK);
    return r;
}

static void test_keyring_text(void **st) {
    (void)st;
    obx_keyring *r = ring("# keys\nk1=" K1 "\n  k2 = " K2 "  \n");
    assert_int_equal(obx_keyring_count(r), 2);
    assert_true(obx__keyring_has(r, "k1") && obx__keyring_has(r, "k2"));
    assert_false(obx__keyring_has(r, "k3"));
    obx_keyring_close(r);
    r = ring("k1=" K1 ";k2:" K2);
    assert_int_equal(obx_keyring_count(r), 2);
    obx_keyring_close(r);
    static const char *const bad[][2] = {
        {"", "no key"},
        {"k1", "not ID=HEX"},
        {"k1=abcd", "has 4 hex digits"},
        {"k 1=" K1, "key ID"},
        {"k1=" K1 "\nk1=" K2, "given twice"},
        {"k1=zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", "not hexadecimal"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = (obx_keyring *)1;
        assert_int_equal(obx__keyring_parse(bad[i][0], &r), OBX_ECONFIG);
        assert_null(r);
        assert_non_null(strstr(obx_errmsg(), bad[i][1]));
        assert_null(strstr(obx_errmsg(), "0a0b0c")); /* never key bytes */
    }
}

/* obx_keyring_open reads the ring through a secret reference, and names only the reference */
static void test_keyring_open(void **st) {
    (void)st;
    setenv("OBX_TEST_RING", "k1=" K1, 1);
    obx_keyring *r = NULL;
    assert_int_equal(obx_keyring_open("${OBX_TEST_RING}", &r), OBX_OK);
    assert_int_equal(obx_keyring_count(r), 1);
    obx_keyring_close(r);
    assert_int_equal(obx_keyring_open("${OBX_TEST_NO_SUCH_RING}", &r), OBX_ECONFIG);
    assert_null(r);
    obx_keyring_close(NULL);
}

static void unhex(const char *hex, unsigned char *out, size_t *n) {
    assert_int_equal(obx__unhex(hex, out, 4096, n), 0);
}

/* the sealed bodies of an independent implementation, byte for byte, both ways */
static void test_vectors(void **st) {
    (void)st;
    json_error_t je;
    json_t *doc = json_load_file(OBX_TEST_DATA "/seal_vectors.json", 0, &je);
    assert_non_null(doc);
    json_t *v;
    size_t i;
    json_array_foreach(json_object_get(doc, "seal"), i, v) {
        const char *kid = json_string_value(json_object_get(v, "key_id"));
        const char *eid = json_string_value(json_object_get(v, "event_id"));
        const char *pl = json_string_value(json_object_get(v, "payload"));
        int gen = (int)json_integer_value(json_object_get(v, "envelope_gen"));
        char text[256], dg[OBX_DIGEST_LEN + 1];
        snprintf(text, sizeof text, "%s=%s", kid, json_string_value(json_object_get(v, "key_hex")));
        obx_keyring *r = ring(text);
        unsigned char want[4096], *body = NULL, *plain = NULL;
        size_t wn = 0, bn = 0, pn = 0;
        unhex(json_string_value(json_object_get(v, "body_hex")), want, &wn);
        assert_int_equal(obx_sha256_digest(pl, strlen(pl), dg), OBX_OK);
        assert_int_equal(obx__seal(r, kid, eid, gen, pl, strlen(pl), dg, &body, &bn), OBX_OK);
        assert_int_equal(bn, wn);
        assert_memory_equal(body, want, wn);
        assert_int_equal(obx__open(r, kid, eid, gen, want, wn, &plain, &pn), OBX_OK);
        assert_int_equal(pn, strlen(pl));
        assert_memory_equal(plain, pl, pn);
        free(body);
        free(plain);
        obx_keyring_close(r);
    }
    assert_true(i >= 3);
    json_decref(doc);
}

static void seal1(obx_keyring *r, const char *kid, const char *eid, int32_t gen,
                  unsigned char **body, size_t *n) {
    char dg[OBX_DIGEST_LEN + 1];
    assert_int_equal(obx_sha256_digest(PAYLOAD, strlen(PAYLOAD), dg), OBX_OK);
    assert_int_equal(obx__seal(r, kid, eid, gen, PAYLOAD, strlen(PAYLOAD), dg, body, n), OBX_OK);
}

static obx_err open1(obx_keyring *r, const char *kid, const char *eid, int32_t gen,
                     const unsigned char *body, size_t n) {
    unsigned char *p = NULL;
    size_t pn = 0;
    obx_err e = obx__open(r, kid, eid, gen, body, n, &p, &pn);
    if (!e) assert_memory_equal(p, PAYLOAD, pn);
    if (e) assert_null(p);
    free(p);
    return e;
}

/* deterministic; bound to event ID, generation and key; a flipped bit anywhere is refused */
static void test_binding_and_tamper(void **st) {
    (void)st;
    obx_keyring *r = ring("k1=" K1 "\nk2=" K2);
    unsigned char *a = NULL, *b = NULL;
    size_t an = 0, bn = 0;
    seal1(r, "k1", EID, 1, &a, &an);
    seal1(r, "k1", EID, 1, &b, &bn);
    assert_int_equal(an, strlen(PAYLOAD) + OBX__SEAL_OVERHEAD);
    assert_memory_equal(a, b, an); /* a resend puts the same bytes at the broker */
    free(b);
    seal1(r, "k1", EID, 2, &b, &bn);
    assert_memory_not_equal(a, b, OBX__NONCE_LEN); /* another generation: another nonce */
    free(b);
    assert_int_equal(open1(r, "k1", EID, 1, a, an), OBX_OK);
    assert_int_equal(open1(r, "k1", EID, 2, a, an), OBX_EREFUSED); /* another generation */
    assert_int_equal(open1(r, "k1", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1X", 1, a, an), OBX_EREFUSED);
    assert_int_equal(open1(r, "k2", EID, 1, a, an), OBX_EREFUSED);  /* another key */
    assert_int_equal(open1(r, "k9", EID, 1, a, an), OBX_ENOTFOUND); /* a key not in the ring */
    assert_int_equal(open1(r, "k1", EID, 1, a, 10), OBX_EREFUSED);  /* truncated */
    for (size_t i = 0; i < an; i++) {
        a[i] ^= 0x01;
        assert_int_equal(open1(r, "k1", EID, 1, a, an), OBX_EREFUSED);
        a[i] ^= 0x01;
    }
    /* a wrong key under the right ID: refused, and the message names no key bytes */
    obx_keyring *w = ring("k1=" K2);
    assert_int_equal(open1(w, "k1", EID, 1, a, an), OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "does not authenticate"));
    assert_null(strstr(obx_errmsg(), "ffeedd"));
    obx_keyring_close(w);
    free(a);
    obx_keyring_close(r);
}

/* A body that authenticates under the right key, event and generation but with a nonce of its
 * own (someone holding the key sealed the same plaintext again): not the body obx sends, so not
 * accepted (invariant 3 of crypt.c). */
static void test_foreign_nonce(void **st) {
    (void)st;
    unsigned char key[32], body[256], aad[OBX__AAD_MAX];
    size_t kn = 0, pl = strlen(PAYLOAD);
    assert_int_equal(obx__unhex(K1, key, sizeof key, &kn), 0);
    size_t a = 0;
    memcpy(aad, "obx-aes256gcm-v1", 17), a = 17;
    memcpy(aad + a, "k1", 3), a += 3;
    memcpy(aad + a, EID, sizeof EID), a += sizeof EID;
    memcpy(aad + a, "\0\0\0\1", 4), a += 4;
    memset(body, 7, OBX__NONCE_LEN);
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int n = 0;
    assert_true(EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, body));
    assert_true(EVP_EncryptUpdate(c, NULL, &n, aad, (int)a));
    assert_true(
        EVP_EncryptUpdate(c, body + OBX__NONCE_LEN, &n, (const unsigned char *)PAYLOAD, (int)pl));
    assert_true(EVP_EncryptFinal_ex(c, body + OBX__NONCE_LEN + n, &n));
    assert_true(EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, body + OBX__NONCE_LEN + pl));
    EVP_CIPHER_CTX_free(c);
    obx_keyring *r = ring("k1=" K1);
    assert_int_equal(open1(r, "k1", EID, 1, body, pl + OBX__SEAL_OVERHEAD), OBX_EREFUSED);
    assert_non_null(strstr(obx_errmsg(), "nonce"));
    obx_keyring_close(r);
}

/* The lookup's evidence rule on an encrypted route: only the exact sealed body counts; the
 * clear payload, a tampered body and one sealed for another event are corrupt copies; a copy the
 * ring cannot open is neither. */
static void test_lookup_copy(void **st) {
    (void)st;
    obx_keyring *r = ring("k1=" K1);
    char dg[OBX_DIGEST_LEN + 1];
    assert_int_equal(obx_sha256_digest(PAYLOAD, strlen(PAYLOAD), dg), OBX_OK);
    unsigned char *good = NULL, *other = NULL;
    size_t gn = 0, on = 0;
    seal1(r, "k1", EID, 1, &good, &gn);
    seal1(r, "k1", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1X", 1, &other, &on);
    obx__lookup_req q = {
        .payload_digest = dg, .event_id = EID, .envelope_gen = 1, .keys = r, .enc_key = "k1"};
    struct {
        const void *body;
        size_t n;
        bool found;
    } cases[] = {{PAYLOAD, strlen(PAYLOAD), false}, {other, on, false}, {good, gn, true}};
    for (size_t i = 0; i < 3; i++) {
        obx__lookup_res res;
        memset(&res, 0, sizeof res);
        res.kind = OBX__LOOKUP_NOT_FOUND; /* as a backend starts its scan */
        obx__outcome copy;
        memset(&copy, 0, sizeof copy);
        obx__strlcpy(copy.payload_digest, dg, sizeof copy.payload_digest); /* good headers */
        assert_int_equal(obx__lookup_copy(&q, &res, &copy, cases[i].body, cases[i].n),
                         cases[i].found);
        assert_int_equal(res.kind == OBX__LOOKUP_FOUND, cases[i].found);
        assert_int_equal(res.n_bad, !cases[i].found);
        if (cases[i].found) assert_string_equal(res.found.payload_digest, dg);
    }
    good[gn - 1] ^= 0x80; /* tampered tag */
    obx__lookup_res res;
    memset(&res, 0, sizeof res);
    res.kind = OBX__LOOKUP_NOT_FOUND;
    obx__outcome copy;
    memset(&copy, 0, sizeof copy);
    assert_false(obx__lookup_copy(&q, &res, &copy, good, gn));
    assert_int_equal(res.n_bad, 1);
    assert_non_null(strstr(res.bad.reason, "does not authenticate"));
    q.enc_key = "k9"; /* not in this ring: judged neither way */
    memset(&res, 0, sizeof res);
    res.kind = OBX__LOOKUP_NOT_FOUND;
    assert_false(obx__lookup_copy(&q, &res, &copy, good, gn));
    assert_int_equal(res.n_bad, 0);
    assert_int_equal(res.kind, OBX__LOOKUP_NOT_FOUND);
    assert_non_null(strstr(res.reason, "not in this key ring"));
    free(good);
    free(other);
    obx_keyring_close(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keyring_text),  cmocka_unit_test(test_keyring_open),
        cmocka_unit_test(test_vectors),       cmocka_unit_test(test_binding_and_tamper),
        cmocka_unit_test(test_foreign_nonce), cmocka_unit_test(test_lookup_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

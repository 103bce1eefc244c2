/*
 * ulid.c — event IDs: "evt-" + ULID (48-bit ms time, 80 random bits, Crockford base32).
 * Within one millisecond a generator increments the random part, so IDs from one generator
 * are strictly increasing (monotonic ULID). Randomness comes from the OS unless the
 * generator carries a seed (the simulator's deterministic traces).
 */
#include "core.h"

#include <pthread.h>
#include <string.h>
#include <sys/random.h>

static const char b32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static obx_err fill_random(obx__ulid_gen *g, unsigned char r[10]) {
    if (g->seed) {
        uint64_t a = xorshift(&g->seed), b = xorshift(&g->seed);
        memcpy(r, &a, 8);
        memcpy(r + 8, &b, 2);
        return OBX_OK;
    }
    if (getrandom(r, 10, 0) != 10) return obx__fail(OBX_EIO, "getrandom failed");
    return OBX_OK;
}

obx_err obx__ulid_next(obx__ulid_gen *g, int64_t now_ms, char out[27]) {
    unsigned char r[10];
    if (now_ms < 0 || now_ms >= (int64_t)1 << 48)
        return obx__fail(OBX_EINVAL, "ULID time %lld out of range", (long long)now_ms);
    if (now_ms <= g->last_ms) {
        /* Same (or earlier: clock stepped back) millisecond: keep the last time and add one
         * to the 80-bit random part so that the order stays strict. */
        now_ms = g->last_ms;
        memcpy(r, g->last_rand, 10);
        int i = 9;
        while (i >= 0 && ++r[i] == 0) i--;
        if (i < 0) { /* 2^80 IDs in one ms: move to the next millisecond */
            now_ms++;
            obx_err rc = fill_random(g, r);
            if (rc) return rc;
        }
    } else {
        obx_err rc = fill_random(g, r);
        if (rc) return rc;
        r[0] &= 0x7f; /* leave headroom so increments rarely overflow */
    }
    g->last_ms = now_ms;
    memcpy(g->last_rand, r, 10);

    uint64_t t = (uint64_t)now_ms;
    for (int i = 9; i >= 0; i--) {
        out[i] = b32[t & 31];
        t >>= 5;
    }
    /* 80 bits -> 16 chars, 5 bits each, big-endian */
    for (int i = 0; i < 16; i++) {
        int bit = i * 5, v = 0;
        for (int k = 0; k < 5; k++) {
            int bb = bit + k;
            v = (v << 1) | ((r[bb / 8] >> (7 - bb % 8)) & 1);
        }
        out[10 + i] = b32[v];
    }
    out[26] = '\0';
    return OBX_OK;
}

static int b32val(char c) {
    const char *p = c ? strchr(b32, c) : NULL;
    return p ? (int)(p - b32) : -1;
}

int64_t obx__ulid_time(const char *u) {
    int64_t t = 0;
    for (int i = 0; i < 10; i++) {
        int v = b32val(u[i]);
        if (v < 0) return -1;
        t = (t << 5) | v;
    }
    return t;
}

static pthread_mutex_t proc_mu = PTHREAD_MUTEX_INITIALIZER;
static obx__ulid_gen proc_gen;

obx_err obx_event_id_new(int64_t now_ms, char out[OBX_EVENT_ID_LEN + 1]) {
    if (!out) return obx__fail(OBX_EINVAL, "out: NULL");
    if (!now_ms) now_ms = obx__wall_ms();
    pthread_mutex_lock(&proc_mu);
    obx_err rc = obx__ulid_next(&proc_gen, now_ms, out + 4);
    pthread_mutex_unlock(&proc_mu);
    if (rc) return rc;
    memcpy(out, "evt-", 4);
    return OBX_OK;
}

obx_err obx_event_id_check(const char *s) {
    if (!s) return obx__fail(OBX_EINVAL, "event_id: missing");
    /* an event ID arrives from brokers and command lines: echo it printable only */
    char shown[64];
    obx__printable(s, strnlen(s, 40), shown, sizeof shown);
    if (strncmp(s, "evt-", 4) != 0)
        return obx__fail(OBX_EINVAL, "event_id: '%s' does not start with 'evt-'", shown);
    if (strlen(s) != OBX_EVENT_ID_LEN)
        return obx__fail(OBX_EINVAL, "event_id: '%s' is %zu bytes, expected %d", shown, strlen(s),
                         OBX_EVENT_ID_LEN);
    for (int i = 4; i < OBX_EVENT_ID_LEN; i++)
        if (b32val(s[i]) < 0)
            return obx__fail(OBX_EINVAL,
                             "event_id: '%s' has byte 0x%02x at %d, outside the ULID alphabet",
                             shown, (unsigned char)s[i], i);
    if (b32val(s[4]) > 7) return obx__fail(OBX_EINVAL, "event_id: '%s' time overflows", shown);
    return OBX_OK;
}

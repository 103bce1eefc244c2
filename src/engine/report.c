/*
 * report.c — the whole outbox at a glance as JSON (obx_report): counts by state, receipts by
 * kind, UNKNOWN resolution times, the oldest PENDING event, delivery sets (how many count as
 * delivered under their rule), and the invariants every outbox must satisfy at all times
 * (exactly one primary receipt per published slot and generation).
 */
#include "engine/engine_int.h"

#include <string.h>

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int64_t obx__percentile(int64_t *v, size_t n, double p) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_i64);
    size_t k = (size_t)(p * (double)(n - 1) + 0.5);
    return v[k < n ? k : n - 1];
}

obx_err obx__report_json(obx__store *s, json_t **out) {
    obx__store_stats st;
    obx__store_invariants inv;
    obx_err e = obx__st_stats(s, &st);
    if (!e) e = obx__st_invariants(s, &inv);
    if (e) return e;
    int64_t sets = 0, complete = 0;
    if ((e = obx__st_delivery_stats(s, &sets, &complete))) return e;
    int64_t *ms = NULL;
    size_t n = 0;
    if ((e = obx__st_unknown_resolutions(s, &ms, &n))) return e;
    json_t *states = json_object();
    int64_t total = 0;
    for (int i = 1; i < OBX__ST_COUNT; i++) {
        json_object_set_new(states, obx__state_name((obx__state)i), json_integer(st.by_state[i]));
        total += st.by_state[i];
    }
    int64_t published = st.by_state[OBX__ST_PUBLISHED] + st.by_state[OBX__ST_RETAINED] +
                        st.by_state[OBX__ST_PURGED];
    int64_t p50 = obx__percentile(ms, n, 0.50), p99 = obx__percentile(ms, n, 0.99);
    int64_t max = n ? ms[n - 1] : 0;
    free(ms);
    bool ok = !inv.published_without_primary && !inv.primary_not_published && !inv.multi_primary &&
              !inv.cancelled_with_attempt;
    *out = json_pack(
        "{s:I,s:I,s:o,s:{s:I,s:I,s:I,s:I},s:{s:I,s:I,s:I,s:I,s:I},s:I,s:I,s:{s:I,s:I,s:I,s:b}}",
        "committed", (json_int_t)total, "published", (json_int_t)published, "states", states,
        "receipts", "primary", (json_int_t)st.receipts_primary, "duplicate",
        (json_int_t)st.receipts_duplicate, "quarantined", (json_int_t)st.receipts_quarantined,
        "migration", (json_int_t)st.receipts_migration, "unknown", "resolved", (json_int_t)n,
        "p50_ms", (json_int_t)p50, "p99_ms", (json_int_t)p99, "max_ms", (json_int_t)max,
        "open_attempts", (json_int_t)st.attempts_unknown, "oldest_pending_committed_at_ms",
        (json_int_t)st.oldest_pending_committed_at, "oldest_unknown_since_ms",
        (json_int_t)st.oldest_unknown_since, "invariants", "published_without_primary",
        (json_int_t)inv.published_without_primary, "primary_not_published",
        (json_int_t)inv.primary_not_published, "multiple_primary", (json_int_t)inv.multi_primary,
        "hold", (int)ok);
    if (*out)
        json_object_set_new(json_object_get(*out, "invariants"), "cancelled_with_attempt",
                            json_integer(inv.cancelled_with_attempt));
    if (*out)
        json_object_set_new(
            *out, "delivery_sets",
            json_pack("{s:I,s:I}", "sets", (json_int_t)sets, "complete", (json_int_t)complete));
    return *out ? OBX_OK : obx__fail(OBX_ENOMEM, "report: out of memory");
}

obx_err obx_report(obx_store *s, char **out) {
    if (!s || !out) return obx__fail(OBX_EINVAL, "NULL argument");
    obx__clear_error();
    *out = NULL;
    json_t *j;
    obx_err e = obx__report_json(s, &j);
    return e ? e : obx__json_out(j, out);
}

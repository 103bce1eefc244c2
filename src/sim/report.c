/*
 * report.c — the simulator's results: per-trace counts summed across traces and workers, and
 * the JSON report of a run (the keys are a contract: tests/sim and the release gate read them).
 * A run passes when no checker found a violation (the six criteria of issue 46 included:
 * issue46_clean, and issue 51's published_before_not_before and retry_before_due), every wanted
 * fault class fired (runs of 2,000 traces or more) and the UNKNOWN
 * resolution p99 is under 15 minutes.
 */
#include "sim/sim.h"

#include <string.h>

void obx__sim_results_add(results *a, const results *b) {
    a->traces += b->traces;
#define ADD(f) a->f += b->f
    ADD(lost_events);
    ADD(second_event_ids);
    ADD(cross_destination_retries);
    ADD(digest_divergence);
    ADD(consumer_duplicate_effects);
    ADD(stale_claim_sends);
    ADD(late_ack_total);
    ADD(late_ack_converged);
    ADD(unknown_total);
    ADD(unknown_untraceable);
    ADD(internal_errors);
    ADD(liveness_failures);
    ADD(quarantined);
    ADD(premature_purges);
    ADD(purged);
    ADD(migrated);
    ADD(migration_refused);
    ADD(migrated_with_old_copy);
    ADD(unknown_unresolved);
    ADD(held);
    ADD(op_retries);
    ADD(op_accepts);
    ADD(racing_observed);
    ADD(both_acked_observed);
    ADD(hold_traces);
    ADD(published_without_evidence);
    ADD(route_changed_by_dry_run_or_refusal);
    ADD(genuine_copy_parked);
    ADD(attempts_left_open);
    ADD(handler_runs_twice);
    ADD(purged_without_matching_evidence);
    ADD(op_dry_runs);
    ADD(op_refusals);
    ADD(op_false_accepts);
    ADD(op_false_refused);
    ADD(op_redrives);
    ADD(published_before_not_before);
    ADD(retry_before_due);
    ADD(delayed_events);
    ADD(retries_delayed);
    for (int i = 0; i < 4; i++) ADD(adapter_traces[i]);
#undef ADD
    for (int i = 0; i < F_COUNT; i++) a->fired[i] += b->fired[i];
}

/* The timings the gate ran on: the relay's shipped defaults, each adapter's, the operator's,
 * and how many traces each adapter and UNKNOWN policy had. */
static json_t *timing_json(const results *x) {
    wk tmp;
    memset(&tmp, 0, sizeof tmp);
    json_t *t = json_object();
    if (obx__sim_shipped_timings(&tmp)) return t;
    json_object_set_new(t, "profile", json_string("production"));
    json_object_set_new(
        t, "relay",
        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "lease_ms", (json_int_t)tmp.base.lease_ms,
                  "reconcile_lease_ms", (json_int_t)tmp.base.reconcile_lease_ms, "recheck_ms",
                  (json_int_t)tmp.base.recheck_ms, "recheck_max_ms",
                  (json_int_t)tmp.base.recheck_max_ms, "backoff_base_ms",
                  (json_int_t)tmp.base.backoff_base_ms, "backoff_max_ms",
                  (json_int_t)tmp.base.backoff_max_ms, "sweep_ms", (json_int_t)tmp.sweep_ms,
                  "reconcile_ms", (json_int_t)tmp.reconcile_ms));
    json_t *ads = json_object();
    static const char *const lookups[] = {"none", "best_effort", "authoritative"};
    for (int i = 0; i < 4; i++)
        json_object_set_new(ads, obx__sim_adapters[i].name,
                            json_pack("{s:s,s:I,s:I,s:I}", "lookup",
                                      lookups[obx__sim_adapters[i].lookup], "ack_timeout_ms",
                                      (json_int_t)obx__sim_adapters[i].ack_timeout_ms, "quiet_ms",
                                      (json_int_t)obx__sim_adapters[i].quiet_ms, "traces",
                                      (json_int_t)x->adapter_traces[i]));
    json_object_set_new(t, "adapters", ads);
    json_object_set_new(t, "unknown_policy",
                        json_pack("{s:I,s:I}", "retry", (json_int_t)(x->traces - x->hold_traces),
                                  "hold", (json_int_t)x->hold_traces));
    json_object_set_new(t, "operator",
                        json_pack("{s:I,s:I,s:I}", "react_min_ms", (json_int_t)OP_REACT_MIN_MS,
                                  "react_max_ms", (json_int_t)OP_REACT_MAX_MS, "poll_ms",
                                  (json_int_t)OP_POLL_MS));
    return t;
}

/* The six criteria of issue 46 (item 11): each 0 in a passing run. */
static bool issue46_clean(const results *x) {
    return x->published_without_evidence == 0 && x->route_changed_by_dry_run_or_refusal == 0 &&
           x->genuine_copy_parked == 0 && x->attempts_left_open == 0 &&
           x->handler_runs_twice == 0 && x->purged_without_matching_evidence == 0;
}

/* The criteria of issue 46 and what the operator actor tried, into j. */
static void issue46_json(json_t *j, const results *x) {
    json_object_set_new(j, "published_without_evidence",
                        json_integer(x->published_without_evidence));
    json_object_set_new(j, "route_changed_by_dry_run_or_refusal",
                        json_integer(x->route_changed_by_dry_run_or_refusal));
    json_object_set_new(j, "genuine_copy_parked", json_integer(x->genuine_copy_parked));
    json_object_set_new(j, "attempts_left_open", json_integer(x->attempts_left_open));
    json_object_set_new(j, "handler_runs_twice", json_integer(x->handler_runs_twice));
    json_object_set_new(j, "purged_without_matching_evidence",
                        json_integer(x->purged_without_matching_evidence));
    json_object_set_new(j, "operator_paths",
                        json_pack("{s:I,s:I,s:I,s:I,s:I}", "dry_runs", (json_int_t)x->op_dry_runs,
                                  "refused_route_changes", (json_int_t)x->op_refusals,
                                  "false_accepts", (json_int_t)x->op_false_accepts,
                                  "false_accepts_refused", (json_int_t)x->op_false_refused,
                                  "redrives", (json_int_t)x->op_redrives));
}

/* Everything obx_sim_run reports (the caller owns the result). */
json_t *obx__sim_report(const obx__sim_summary *s) {
    const results *x = s->x;
    bool all_fired = true;
    json_t *fired = json_object();
    for (int i = 0; i < F_COUNT; i++) {
        bool wanted = !s->o->faults_mask || (s->o->faults_mask >> i & 1);
        json_object_set_new(fired, obx_sim_fault_name((size_t)i), json_integer(x->fired[i]));
        if (wanted && s->n >= 2000 && x->fired[i] == 0) all_fired = false;
    }
    bool passed = x->unknown_unresolved == 0 && x->lost_events == 0 && x->second_event_ids == 0 &&
                  x->cross_destination_retries == 0 && x->digest_divergence == 0 &&
                  x->consumer_duplicate_effects == 0 && x->stale_claim_sends == 0 &&
                  x->late_ack_converged == x->late_ack_total && x->unknown_untraceable == 0 &&
                  x->internal_errors == 0 && x->liveness_failures == 0 &&
                  x->premature_purges == 0 && x->migrated_with_old_copy == 0 && s->p99 < 900.0 &&
                  all_fired && issue46_clean(x) && x->published_before_not_before == 0 &&
                  x->retry_before_due == 0;
    json_t *failing = json_array();
    for (long i = 0; i < x->nfailing; i++)
        json_array_append_new(failing, json_integer(x->failing[i]));
    json_t *j = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:o,s:s,s:b,s:I,s:I,s:I,s:I,s:f,"
        "s:f,s:f,s:f,s:i,s:o,s:s,s:s,s:b}",
        "traces", (json_int_t)x->traces, "seed", (json_int_t)s->o->seed, "lost_events",
        (json_int_t)x->lost_events, "second_event_ids", (json_int_t)x->second_event_ids,
        "cross_destination_retries", (json_int_t)x->cross_destination_retries, "digest_divergence",
        (json_int_t)x->digest_divergence, "consumer_duplicate_effects",
        (json_int_t)x->consumer_duplicate_effects, "late_ack_total", (json_int_t)x->late_ack_total,
        "late_ack_converged", (json_int_t)x->late_ack_converged, "unknown_total",
        (json_int_t)x->unknown_total, "unknown_untraceable", (json_int_t)x->unknown_untraceable,
        "unknown_resolved", (json_int_t)(s->nres - (size_t)x->unknown_unresolved), "unknown_p99_s",
        s->p99, "faults_fired", fired, "trace_hash", s->hash, "passed", (int)passed,
        "stale_claim_sends", (json_int_t)x->stale_claim_sends, "internal_errors",
        (json_int_t)x->internal_errors, "liveness_failures", (json_int_t)x->liveness_failures,
        "quarantined_receipts", (json_int_t)x->quarantined, "unknown_p50_s", s->p50,
        "unknown_max_s", s->maxs, "seconds", s->secs, "traces_per_second",
        s->secs > 0 ? (double)x->traces / s->secs : 0.0, "jobs", s->jobs, "failing_traces", failing,
        "first_failure", x->first_failure, "mutation", s->o->mutation ? s->o->mutation : "none",
        "every_fault_fired", (int)all_fired);
    json_object_set_new(j, "premature_purges", json_integer(x->premature_purges));
    json_object_set_new(j, "purged", json_integer(x->purged));
    json_object_set_new(j, "migrated", json_integer(x->migrated));
    json_object_set_new(j, "migration_refused", json_integer(x->migration_refused));
    json_object_set_new(j, "migrated_with_old_copy", json_integer(x->migrated_with_old_copy));
    json_object_set_new(j, "store", json_string(s->o->db_url ? "postgres" : "sqlite"));
    /* every UNKNOWN ends: the open ones (they count in the percentile as never resolved), the
     * events held for an operator and what the operator actor did */
    json_object_set_new(j, "unknown_unresolved", json_integer(x->unknown_unresolved));
    json_object_set_new(j, "unknown_held", json_integer(x->held));
    json_object_set_new(j, "operator_resolutions",
                        json_pack("{s:I,s:I}", "retry", (json_int_t)x->op_retries, "accept",
                                  (json_int_t)x->op_accepts));
    json_object_set_new(j, "races_observed",
                        json_pack("{s:I,s:I}", "unknown_racing_retry_claim",
                                  (json_int_t)x->racing_observed, "both_attempts_acked",
                                  (json_int_t)x->both_acked_observed));
    issue46_json(j, x);
    /* issue 51 (item 3): each 0 in a passing run; and how much of it the run exercised */
    json_object_set_new(j, "published_before_not_before",
                        json_integer(x->published_before_not_before));
    json_object_set_new(j, "retry_before_due", json_integer(x->retry_before_due));
    json_object_set_new(j, "delayed_events", json_integer(x->delayed_events));
    json_object_set_new(j, "retries_delayed", json_integer(x->retries_delayed));
    json_object_set_new(j, "timing", timing_json(x));
    return j;
}

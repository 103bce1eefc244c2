#!/usr/bin/env bash
# test_mutations.sh — the simulator's checkers can fail: for each engine mutation (a deliberate
# protocol bug compiled into test-only builds, OBX_MUTATIONS) the release gate must fail within
# 10,000 traces, on the checker that guards against that bug (every criterion of the release
# gate has one: lost or orphan event, second event ID, cross-destination retry, divergence,
# duplicate effect, late-ACK convergence, untraceable UNKNOWN, UNKNOWN p99 and unresolved
# UNKNOWNs; plus stale claims, premature purges and migration without proof; and issue 46's:
# a publish on a copy's header, a dry run or refusal that changes the routes, a genuine copy
# parked, attempts left open, a handler run twice, a purge on evidence of other bytes; and a
# relay deciding on its stepped host clock; and issue 51's: a delayed event published early, a
# retry before its due time). A control run
# without mutation must pass. Usage: test_mutations.sh OBX (an obx built with -DOBX_MUTATIONS=ON)
set -euo pipefail
OBX=${1:?usage: test_mutations.sh OBX}
fails=0
check() { # check MUTATION KEY_EXPRESSION
  local m=$1 expr=$2 out
  out=$("$OBX" sim --traces 10000 --seed 11 --jobs 2 --mutation "$m" --fail-fast --json || true)
  if echo "$out" | python3 -c "
import json, sys
r = json.load(sys.stdin)
m, expr = sys.argv[1], sys.argv[2]
ok = (not r['passed']) and eval(expr, {}, r)
print('%-30s %s after %d traces: %s' % (m, 'caught' if ok else 'NOT CAUGHT', r['traces'], r['first_failure'][:90]))
sys.exit(0 if ok else 1)" "$m" "$expr"; then :; else fails=$((fails + 1)); fi
}
check accept-stale-digest     'digest_divergence > 0'
check stale-claim-sends       'stale_claim_sends > 0'
check retry-other-destination 'cross_destination_retries > 0'
check skip-inbox-dedupe       'consumer_duplicate_effects > 0'
check ignore-idempotency-key  'second_event_ids > 0'
check drop-duplicate-receipt  'late_ack_converged < late_ack_total'
check purge-before-watermark  'premature_purges > 0'
check migrate-while-unknown   'migrated_with_old_copy > 0'
# issue 46 (item 10): a relay that decides on its stepped host clock instead of the database
# server's stamps its publications out of order (published_at minutes in the past or future),
# and retention, which purges behind the consumers in published_at order, purges ahead of them;
# a host clock stepped forwards also claims a delayed event before its time (issue 51)
check relay-host-clock        'premature_purges > 0 or published_before_not_before > 0'
# a guessed receipt names no copy at the broker: the evidence check sees it first (offset -1)
check reconcile-guess-published 'lost_events > 0 or published_without_evidence > 0'
check sweep-forgets-attempt   'unknown_untraceable > 0'
check stay-unknown            'unknown_unresolved > 0 and unknown_p99_s >= 900'
# issue 46 (item 11): the operator's paths, the evidence, two instances of a consumer ID
check lookup-trusts-header      'published_without_evidence > 0'
check route-before-decision     'route_changed_by_dry_run_or_refusal > 0'
check park-by-event-id          'genuine_copy_parked > 0'
check superseded-stay-open      'attempts_left_open > 0'
check handler-before-claim      'handler_runs_twice > 0'
check purge-any-inbox-row       'purged_without_matching_evidence > 0'
# the operator actor's false evidence (resolve --accept with an offset the broker does not hold)
check accept-unread-offset      'published_without_evidence > 0'
# issue 51 (item 3): the relay claims a delayed event at once (enqueue leaves it available at its
# commit time), and the inbox runs a failed message's handler again before its back-off is over
check claim-delayed-early       'published_before_not_before > 0'
check inbox-ignores-next-at     'retry_before_due > 0'
# accept-superseded-generation is an equivalent mutant here: a migration always changes the
# destination digest (destination.v1 carries the route generation), so the digest rule refuses
# the old generation's receipt before the generation rule is reached; the migration suite
# (tests/engine/migration_suite.c) tests the rule's own refusal message.
# the control: the same build without a mutation passes
out=$("$OBX" sim --traces 3000 --seed 11 --jobs 2 --json || true)
if echo "$out" | python3 -c "import json,sys; sys.exit(0 if json.load(sys.stdin)['passed'] else 1)"; then
  echo "control (no mutation)          passed"
else
  echo "control (no mutation)          FAILED"; fails=$((fails + 1))
fi
if ((fails)); then echo "$fails mutation checks failed"; exit 1; fi

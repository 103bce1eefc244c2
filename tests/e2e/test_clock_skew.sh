#!/usr/bin/env bash
# test_clock_skew.sh OBX — one clock for leases and deadlines (issue 46, defect 10): two relays
# on one PostgreSQL outbox and one log broker, relay "skewed" with its host clock 10 minutes
# behind (libfaketime, wall and monotonic clocks), its writes held back 2 s (a slow network:
# the log broker's `hold` knob), the producer's clock behind as well. The skewed relay claims
# the events; its leases and attempt deadlines must be on the database server's clock, so the
# other relay leaves its live claims alone and its held writes land before their deadlines.
# Before (each relay on its own clock): the other relay saw every lease expired, proved the
# attempts absent and retried, and the held writes landed after their deadlines as the other
# relay saw them: 100 broker copies of 50 events, 50 receipts quarantined.
# Checked from outside: the broker's file (copies per event ID) and the outbox's attempts. Then
# an operator whose host clock is 8 days ahead runs `obx purge --dry-run`: nothing is due; one
# 10 minutes ahead runs `obx status` while the relays run: their cluster is served. Last, a
# PARKED event requeued by an operator 10 minutes ahead is due at once, and a relay 10 minutes
# ahead serves /api/status and /metrics with its own cluster served and writes its HTTP
# requeue's audit row at the database server's time. Then a producer 10 minutes ahead enqueues
# with `obx enqueue` (the C library): its events are due at once on the server's clock, and
# their committed_at and audit rows are the server's times (occurred_at stays the producer's).
set -euo pipefail
OBX=$(realpath "${1:?usage: test_clock_skew.sh OBX}")
FAKETIME_LIB=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -1)
[[ -n $FAKETIME_LIB ]] || { echo "FAIL: libfaketime is not installed (scripts/deps.sh test)"; exit 1; }
source "$(dirname "$0")/../support/prologue.sh" skew
use_store postgres
fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log; do echo "---- $f"; tail -5 "$f" | cut -c1-300; done
  exit 1
}
n=50
# a process whose clocks are 10 minutes behind (ASan must not insist on coming first)
behind() {
  LD_PRELOAD=$FAKETIME_LIB FAKETIME=-10m ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 "$@"
}
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
for i in $(seq $n); do
  printf '{"order":"o-%d"}' "$i" | behind "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$i@1" --tenant t1 >/dev/null
done
# (the relay itself in the background, not a subshell running behind(): $! must be its PID, or
# the kill at the end leaves it running)
LD_PRELOAD=$FAKETIME_LIB FAKETIME=-10m ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 \
  "$OBX" relay --db "$db" --broker "log:$T/b.db?hold=1&hold_ms=2000" --set relay.id=skewed \
  --set relay.reconciler=false >"$T/skewed.log" 2>&1 &
pids+=($!)
sleep 0.5
"$OBX" relay --db "$db" --broker "log:$T/b.db" --set relay.id=honest >"$T/honest.log" 2>&1 &
pids+=($!)
pub=0
for _ in $(seq 120); do
  pub=$("$OBX" status --db "$db" --json | jq ".states.PUBLISHED // 0" || true)
  [[ $pub == "$n" ]] && break
  sleep 0.5
done
[[ $pub == "$n" ]] || fail "$pub of $n published"
sleep 3 # any write still held back lands (or is refused at its deadline) now
# `obx status` of an operator whose host clock is 10 minutes ahead, while the relays run: it
# judges their heartbeats on the database server's clock, as they are written, so cluster local
# (a delayed event PENDING in it) is served. (Before, on the operator's clock: every heartbeat 10
# minutes stale, cluster local listed as served by no live relay.)
printf '{"order":"later"}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/later@1 --tenant t1 --delay 1h >/dev/null
unserved() { "$@" "$OBX" status --db "$db" --json 2>"$T/status.err" | jq -c '[.unserved_clusters[] | [.cluster, .pending]]'; }
ahead=$(unserved env LD_PRELOAD="$FAKETIME_LIB" FAKETIME=+10m ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0) ||
  fail "obx status: $(cat "$T/status.err")"
[[ $ahead == "[]" ]] || fail "an operator 10 minutes ahead sees the live relays' cluster as unserved: $ahead"
for p in "${pids[@]}"; do kill "$p"; done
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()
# the relays stopped cleanly (their heartbeats end at once): the same check sees cluster local
stopped=$(unserved env) || fail "obx status: $(cat "$T/status.err")"
[[ $stopped == '[["local",1]]' ]] || fail "with the relays stopped, obx status lists $stopped as unserved: the check above proves nothing"
echo "ok: an operator whose clock is 10 minutes ahead sees the live relays serving cluster local"
copies=$(sqlite3 "$T/b.db" 'SELECT count(*) FROM obx_log_msg')
distinct=$(sqlite3 "$T/b.db" 'SELECT count(DISTINCT event_id) FROM obx_log_msg')
skewed=$(psql "$db" -Atc "SELECT count(*) FROM obx.obx_attempt WHERE owner LIKE 'skewed%'")
quarantined=$("$OBX" report --db "$db" --json | jq ".receipts.quarantined" || true) # exit 1: a finding
echo "broker copies $copies of $distinct events; attempts by the skewed relay $skewed; quarantined $quarantined"
((skewed > 0)) || fail "the skewed relay made no attempt: the test did not take the path it is for"
[[ $distinct == "$n" ]] || fail "$distinct of $n events at the broker"
[[ $copies == "$n" ]] || fail "$copies broker copies of $n events: a relay sent what the other still held"
[[ $quarantined == 0 ]] || fail "$quarantined receipts quarantined"
# An operator whose host clock is 8 days ahead: `obx purge` decides the replay window (7 days
# after publication, the default) on the database server's clock, so it finds nothing to drop
# yet. (Before, on the operator's clock: every published event's payload due to go.)
# (the consumer that matters has applied all 50: retention's evidence is there)
"$OBX" consume --consumer-db "sqlite:$T/c.db" --broker "log:$T/b.db" --topic orders \
  --consumer proj --types '*' --tenants '*' --until-idle 1500 >"$T/consume.log" 2>&1 ||
  fail "consume: $(tail -3 "$T/consume.log")"
cons=(--consumer "proj=sqlite:$T/c.db")
LD_PRELOAD=$FAKETIME_LIB FAKETIME=+8d ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 \
  "$OBX" purge --db "$db" "${cons[@]}" --dry-run --json >"$T/purge.json" 2>"$T/purge.log" || true
early=$(jq '.purged' "$T/purge.json") || fail "obx purge --dry-run: $(cat "$T/purge.log")"
[[ $early == 0 ]] || fail "an operator 8 days ahead would drop $early payloads inside the replay window"
# the same dry run with the window closed sees them all due: the check above can fail
"$OBX" purge --db "$db" "${cons[@]}" --dry-run --json --set retention.replay_window_ms=0 \
  >"$T/purge0.json" 2>"$T/purge0.log" || true
due=$(jq '.purged' "$T/purge0.json") || fail "obx purge --dry-run: $(cat "$T/purge0.log")"
[[ $due == "$n" ]] || fail "with the window closed $due of $n payloads would go: the check above proves nothing"
echo "ok: an operator whose clock is 8 days ahead purges nothing inside the replay window"

# Operator actions and a relay's own pages on the database server's clock. Two PARKED events:
# a route that parks after one rejection, a relay whose broker rejects every send.
ahead() { LD_PRELOAD=$FAKETIME_LIB FAKETIME=+10m ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 "$@"; }
"$OBX" route set order.parked.v1 --db "$db" --cluster local --topic parked --max-attempts 1 >/dev/null
p=()
for k in 1 2; do
  p+=("$(printf '{"p":%d}' "$k" | "$OBX" enqueue --db "$db" --type order.parked.v1 \
    --aggregate "order/p-$k@1" --tenant t1 --json | jq -r .event_id)")
done
parked() { [[ $(psql "$db" -Atc "SELECT count(*) FROM obx.obx_event WHERE state = 'PARKED' AND event_id IN ('${p[0]}', '${p[1]}')") == 2 ]]; }
"$OBX" relay --db "$db" --broker "log:$T/rej.db?reject=1" --set relay.id=rejecting >"$T/rejecting.log" 2>&1 &
pids+=($!)
wait_for 20 parked || fail "the two events were not PARKED"
kill "${pids[-1]}"
wait "${pids[-1]}" || true
# how far from the database server's clock a time in ms is (positive: ahead of it)
drift() { psql "$db" -Atc "SELECT $1 - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"; }
ahead "$OBX" requeue "${p[0]}" --db "$db" >/dev/null || fail "obx requeue"
d=$(drift "(SELECT available_at FROM obx.obx_event WHERE event_id = '${p[0]}')")
# (before: the operator's clock, 600,000 ms ahead: the event held back 10 minutes)
((d > -60000 && d < 60000)) || fail "a requeue by an operator 10 minutes ahead made the event due in $d ms"
echo "ok: an event requeued by an operator 10 minutes ahead is due at once (available_at $d ms from the server's clock)"
token=tok-$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')
printf '%s\n' "$token" >"$T/token"
chmod 600 "$T/token"
# (not through ahead(): $! would be the subshell's PID, and the kill below left the relay running)
LD_PRELOAD=$FAKETIME_LIB FAKETIME=+10m ASAN_OPTIONS=${ASAN_OPTIONS:-}:verify_asan_link_order=0 \
  "$OBX" relay --db "$db" --broker "log:$T/rej.db?reject=1" --set relay.id=ahead \
  --http 127.0.0.1:0 --set http.token_file="$T/token" >"$T/ahead.log" 2>&1 &
pids+=($!)
port=$(http_addr "$T/ahead.log" 10 "${pids[-1]}") || fail "no HTTP address in the relay's log"
base=http://$port
wait_for 10 curl -sf "$base/readyz" -o /dev/null || fail "the relay 10 minutes ahead is not ready"
# its own cluster, with the delayed event PENDING in it, is served by itself (before: its
# heartbeat judged on its host clock, 10 minutes stale: cluster local unserved)
st=$(curl -sf "$base/api/status" | jq -c '[.unserved_clusters[] | .cluster]') || fail "/api/status"
[[ $st == "[]" ]] || fail "a relay 10 minutes ahead lists $st as unserved on /api/status"
# (a scrape renders the family once the relay has read its outbox's figures)
scraped() { curl -sf "$base/metrics" -o "$T/metrics.txt" && grep -q '^# TYPE obx_pending_unserved_events gauge' "$T/metrics.txt"; }
wait_for 10 scraped || fail "/metrics has no obx_pending_unserved_events"
un=$(awk '$1 ~ /^obx_pending_unserved_events[{]/ && $2 > 0' "$T/metrics.txt")
[[ -z $un ]] || fail "a relay 10 minutes ahead reports on /metrics: $un"
code=$(curl -s -o "$T/requeue.json" -w '%{http_code}' -X POST -H "Authorization: Bearer $token" \
  "$base/api/requeue" -d "{\"event_id\":\"${p[1]}\"}")
[[ $code == 200 ]] || fail "POST /api/requeue: $code $(cat "$T/requeue.json")"
d=$(drift "(SELECT max(at) FROM obx.obx_audit_all WHERE event_id = '${p[1]}' AND reason LIKE 'requeued%')")
((d > -60000 && d < 60000)) || fail "the HTTP requeue's audit row is $d ms from the server's clock"
echo "ok: a relay 10 minutes ahead: its cluster served on /api/status and /metrics, its requeue audited at the server's time ($d ms)"
kill "${pids[-1]}"
wait "${pids[-1]}" || true
# A producer whose host clock is 10 minutes ahead enqueues through the C library (`obx enqueue`)
# while a relay runs: the database server supplies the event's committed_at, updated_at, its
# audit row's time and available_at (greatest of not_before and the server's now), so the events
# are due at once and published within seconds, their ages on the server's clock. (Before: the
# producer's clock wrote available_at 10 minutes ahead, nothing published for 10 minutes.)
"$OBX" route set order.ahead.v1 --db "$db" --cluster local --topic ahead >/dev/null
"$OBX" relay --db "$db" --broker "log:$T/ahead-b.db" --set relay.id=fresh >"$T/fresh.log" 2>&1 &
pids+=($!)
q=()
for k in 1 2 3; do
  q+=("$(printf '{"a":%d}' "$k" | ahead "$OBX" enqueue --db "$db" --type order.ahead.v1 \
    --aggregate "order/a-$k@1" --tenant t1 --json | jq -r .event_id)")
done
ids="'${q[0]}', '${q[1]}', '${q[2]}'"
published() { [[ $(psql "$db" -Atc "SELECT count(*) FROM obx.obx_event WHERE state = 'PUBLISHED' AND event_id IN ($ids)") == 3 ]]; }
wait_for 10 published || fail "events enqueued by a producer 10 minutes ahead not published in 10 s: $(psql "$db" -Atc "SELECT string_agg(state || ' due in ' || (available_at - floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) || ' ms', ', ') FROM obx.obx_event WHERE event_id IN ($ids)")"
kill "${pids[-1]}"
wait "${pids[-1]}" || true
for col in "max(committed_at)" "min(committed_at)" "max(updated_at)"; do
  d=$(drift "(SELECT $col FROM obx.obx_event WHERE event_id IN ($ids))")
  ((d > -60000 && d < 60000)) || fail "$col of events enqueued by a producer 10 minutes ahead is $d ms from the server's clock"
done
d=$(drift "(SELECT max(at) FROM obx.obx_audit_all WHERE event_id IN ($ids) AND actor = 'producer')")
((d > -60000 && d < 60000)) || fail "the producer's audit rows are $d ms from the server's clock"
# the producer's own statements stay its own: occurred_at (in the envelope's digest) is its clock's
d=$(drift "(SELECT min(occurred_at) FROM obx.obx_envelope WHERE event_id IN ($ids))")
((d > 540000)) || fail "occurred_at is $d ms from the server's clock: not the producer's (10 minutes ahead)"
echo "ok: events enqueued by a producer 10 minutes ahead are published at once, committed_at on the server's clock ($d ms occurred_at ahead)"
echo "all passed"

#!/usr/bin/env bash
# test_multirelay.sh — several relay processes on one outbox while producers commit; relays are
# killed with SIGKILL at random points and replaced, in a loop. At the end every committed
# event has exactly one primary receipt, none lacks one, and `obx report` says the invariants
# hold. Usage: test_multirelay.sh OBX [sqlite|postgres]   (default sqlite; postgres uses a fresh
# database on OBX_TEST_PG_URL). The event count (default 1200) is the third argument: the
# sanitizer build passes fewer, since each `obx enqueue` is a process whose start-up ASan slows.
set -euo pipefail
OBX=${1:?usage: test_multirelay.sh OBX [sqlite|postgres]}
source "$(dirname "$0")/../support/prologue.sh" multirelay
use_store "${2:-sqlite}"
broker="log:$dir/broker.db"
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --max-attempts 50 >/dev/null
relay() { # relay ID FAULTS; sets $last
  "$OBX" relay --db "$db" --broker "$broker?$2" --id "$1" --set relay.lease_ms=800 \
    --set relay.sweep_ms=100 --set relay.reconcile_ms=100 --set relay.recheck_ms=200 \
    --set relay.poll_ms=10 --set relay.backoff_base_ms=50 --set relay.batch=50 \
    --set relay.drain_ms=500 >>"$dir/relays.log" 2>&1 &
  last=$!
  pids+=("$last")
}
produce() { # produce FROM COUNT
  # the relays are what this test checks for leaks; a producer's exit-time leak scan (ASan
  # builds) doubled each short `obx enqueue` process's run time
  local ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
  export ASAN_OPTIONS
  for ((i = $1; i < $1 + $2; i++)); do
    printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
      --aggregate "order/o-$((i % 50))@$i" --tenant t1 --idempotency-key "k-$i" >/dev/null
  done
}
relay r1 "drop_ack=0.02&ack_timeout_ms=200&dup=0.02"
r1=$last
relay r2 "lose_ack=0.01&delay_ack=0.02&delay_ack_ms=1200"
r2=$last
relay r3 "blackhole=0.01"
r3=$last
half=$(((${3:-1200} + 1) / 2))
produce 0 "$half" &
prod1=$!
produce "$half" "$half" &
prod2=$!
# kill relays at random points while the producers run, and replace them
victims=("$r1" "$r2" "$r3")
for round in 1 2 3 4; do
  sleep "0.$((RANDOM % 8 + 2))"
  idx=$((RANDOM % ${#victims[@]}))
  kill -9 "${victims[$idx]}" 2>/dev/null || true
  wait "${victims[$idx]}" 2>/dev/null || true
  echo "round $round: killed relay pid ${victims[$idx]} with SIGKILL"
  victims=("${victims[@]:0:$idx}" "${victims[@]:$((idx + 1))}")
  relay "r$((round + 3))" "dup=0.01&drop_ack=0.01&ack_timeout_ms=200"
  victims+=("$last")
done
wait "$prod1" "$prod2"
echo "producers done after ${SECONDS} s"
expected=$((half * 2))
deadline=$((SECONDS + 120))
while ((SECONDS < deadline)); do
  pub=$("$OBX" report --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["published"])')
  [[ $pub == "$expected" ]] && break
  sleep 0.5
done
echo "drained after ${SECONDS} s"
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
report=$("$OBX" report --db "$db" --json)
echo "$report" | python3 -c '
import json, sys
r = json.load(sys.stdin)
exp = int(sys.argv[1])
errors = []
if r["committed"] != exp: errors.append("committed %d != %d" % (r["committed"], exp))
if r["published"] != exp: errors.append("published %d != %d" % (r["published"], exp))
if r["receipts"]["primary"] != exp: errors.append("primary receipts %d != %d" % (r["receipts"]["primary"], exp))
if not r["invariants"]["hold"]: errors.append("invariants: %s" % r["invariants"])
print("committed %d published %d primary %d duplicate %d unknown-resolved %d p99 %d ms" % (
    r["committed"], r["published"], r["receipts"]["primary"], r["receipts"]["duplicate"],
    r["unknown"]["resolved"], r["unknown"]["p99_ms"]))
if errors:
    print("FAIL: " + "; ".join(errors)); sys.exit(1)
print("ok: every committed event has exactly one primary receipt")
' "$expected"

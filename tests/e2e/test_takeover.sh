#!/usr/bin/env bash
# test_takeover.sh — the rollout of docs/migration.md with real processes: a "legacy" relay and
# an "obx" relay serve different dispatcher aliases while producers commit; the event type is
# handed to obx (with its unclaimed backlog), rolled back, and handed over again, mid-stream.
# Every event is published exactly once (one message on the broker, one primary receipt), on
# its frozen destination. A relay in shadow mode claims nothing and sends nothing, and reports
# the events nobody published; `obx shadow` reports planted differences from a receipts feed.
# Usage: test_takeover.sh OBX [sqlite|postgres]
set -euo pipefail
OBX=${1:?usage: test_takeover.sh OBX [sqlite|postgres]}
source "$(dirname "$0")/../support/prologue.sh" takeover
use_store "${2:-sqlite}"
broker="log:$dir/broker.db"
report() { "$OBX" report --db "$db" --json | js "$1"; }
relay() { # relay ID LOG EXTRA...; sets $last
  local id=$1 log=$2
  shift 2
  "$OBX" relay --db "$db" --broker "$broker" --id "$id" --set relay.lease_ms=2000 \
    --set relay.sweep_ms=100 --set relay.reconcile_ms=100 --set relay.poll_ms=10 \
    --set relay.batch=20 --set relay.drain_ms=1000 "$@" >"$dir/$log" 2>&1 &
  last=$!
  pids+=("$last")
}
stop() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
produce() { # produce FROM COUNT
  for ((i = $1; i < $1 + $2; i++)); do
    printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
      --aggregate "order/o-$((i % 40))@$i" --tenant t1 --idempotency-key "k-$i" >/dev/null
  done
}
counter() { # counter LOG NAME: a relay's final counter (printed as JSON when it stops)
  python3 - "$dir/$1" "$2" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
at = text.rfind("counters: ")
print(json.JSONDecoder().raw_decode(text[at + len("counters: "):])[0][sys.argv[2]] if at >= 0 else "none")
PY
}

"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --alias legacy >/dev/null
relay legacy-relay legacy.log --set relay.aliases=legacy
legacy=$last
relay obx-relay obx.log --set relay.aliases=obx
obx=$last
# Phases gated on what has been published, so both relays provably get work on a fast machine
# too (CI once produced all 300 before the first takeover): legacy publishes the first events,
# the takeover lands while producers may still be committing, obx gets every event committed
# after it, and the rollback and the second takeover happen mid-stream again.
wait_published() { # wait_published N: until at least N events are PUBLISHED (60 s at most)
  local deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    (($(report 'd["published"]') >= $1)) && return 0
    sleep 0.2
  done
  return 1
}
produce 0 100 &
p1=$!
wait_published 10 || bad "legacy published nothing in 60 s"
"$OBX" takeover --db "$db" --to obx --type order.created.v1 --backlog --who ops >"$dir/t1.out"
ok "takeover: $(tail -1 "$dir/t1.out" | cut -c1-60)..."
produce 100 100 &
p2=$!
wait "$p1" "$p2"
wait_published 200 || bad "the first 200 events were not published in 60 s"
produce 200 50 &
p3=$!
sleep 0.5
"$OBX" takeover --db "$db" --to legacy --type order.created.v1 --backlog --who ops >"$dir/t2.out"
ok "rollback: $(head -1 "$dir/t2.out" | cut -c1-90)"
produce 250 50 &
p4=$!
sleep 0.5
"$OBX" takeover --db "$db" --to obx --type order.created.v1 --who ops >/dev/null
wait "$p3" "$p4"
expected=300
deadline=$((SECONDS + 90))
while ((SECONDS < deadline)); do
  [[ $(report 'd["published"]') == "$expected" ]] && break
  sleep 0.3
done
stop "$legacy"
stop "$obx"
r=$("$OBX" report --db "$db" --json)
[[ $(js 'd["committed"]' <<<"$r") == $expected && $(js 'd["published"]' <<<"$r") == $expected ]] &&
  ok "all $expected committed events published" || bad "published: $(js 'd["states"]' <<<"$r")"
[[ $(js 'd["receipts"]["primary"]' <<<"$r") == $expected && $(js 'd["receipts"]["duplicate"]' <<<"$r") == 0 ]] &&
  ok "one primary receipt each, no duplicate" || bad "receipts: $(js 'd["receipts"]' <<<"$r")"
[[ $(js 'd["invariants"]["hold"]' <<<"$r") == True ]] && ok "invariants hold" || bad "invariants"
read -r msgs distinct < <(python3 - "$dir/broker.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(*c.execute("select count(*), count(distinct event_id) from obx_log_msg where topic='orders'").fetchone())
PY
)
[[ $msgs == $expected && $distinct == $expected ]] && ok "broker: $msgs messages, $distinct event IDs (nothing lost, nothing twice)" ||
  bad "broker: $msgs messages, $distinct distinct"
sl=$(counter legacy.log sent)
so=$(counter obx.log sent)
((sl > 0 && so > 0 && sl + so == expected)) && ok "both relays dispatched: legacy $sl, obx $so" || bad "sent: legacy $sl obx $so"
# the comparison as an auditor: every event on its frozen destination, partition and payload
set +e
out=$("$OBX" shadow --db "$db" --broker "$broker" --alias legacy --alias obx --since-ms 1 \
  --grace-ms -1 --json); rc=$?
set -e
[[ $rc == 0 && $(js 'd["matched"]' <<<"$out") == $expected && $(js 'd["duplicates"]' <<<"$out") == 0 ]] &&
  ok "shadow comparison: $expected matched, no difference" || bad "shadow: rc=$rc $(js 'd["differences"]' <<<"$out")"

# shadow mode: events of an alias nobody dispatches yet
"$OBX" route set payment.done.v1 --db "$db" --cluster local --topic payments --alias legacy2 >/dev/null
for i in 1 2 3; do
  printf '{"payment":%d}' "$i" | "$OBX" enqueue --db "$db" --type payment.done.v1 \
    --aggregate "payment/p-$i@1" --tenant t1 >>"$dir/pay_ids"
done
before=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from obx_log_msg').fetchone()[0])" "$dir/broker.db")
relay shadow-relay shadow.log --set relay.shadow=true --set relay.aliases=legacy2 \
  --set relay.shadow_interval_ms=200 --set relay.shadow_grace_ms=0
shadow=$last
deadline=$((SECONDS + 30))
until grep -qs "missing 3" "$dir/shadow.log" || ((SECONDS > deadline)); do sleep 0.2; done
stop "$shadow"
grep -q "SHADOW mode" "$dir/shadow.log" && grep -q "missing 3" "$dir/shadow.log" &&
  ok "shadow relay reports the 3 unpublished events" || bad "shadow relay log: $(tail -3 "$dir/shadow.log")"
[[ $(counter shadow.log sent) == 0 && $(counter shadow.log claimed) == 0 ]] && ok "shadow relay claimed and sent nothing" ||
  bad "shadow relay counters: sent $(counter shadow.log sent), claimed $(counter shadow.log claimed)"
after=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from obx_log_msg').fetchone()[0])" "$dir/broker.db")
[[ $before == "$after" && $(report 'd["states"]["PENDING"]') == 3 ]] && ok "nothing published, still PENDING" ||
  bad "broker $before -> $after, PENDING $(report 'd["states"]["PENDING"]')"
# a receipts feed from the other dispatcher, with planted differences
set +e
plan=$("$OBX" shadow --db "$db" --broker "$broker" --alias legacy2 --since-ms 1 --grace-ms -1 --json)
set -e
python3 - "$plan" "$dir/feed.jsonl" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
w = sorted((f["event_id"], f["would_send"]) for f in d["findings"] if f["kind"] == "missing")
with open(sys.argv[2], "w") as out:
    out.write("# published by the legacy dispatcher\n")
    e0, s0 = w[0]   # correct
    out.write(json.dumps({"event_id": e0, "topic": s0["topic"], "partition": s0["partition"],
                          "offset": 1, "payload_digest": s0["payload_digest"]}) + "\n")
    e1, s1 = w[1]   # other bytes
    out.write(json.dumps({"event_id": e1, "topic": s1["topic"], "partition": s1["partition"],
                          "offset": 2, "payload_digest": "sha256:" + "0" * 64}) + "\n")
    # w[2] never published; and a publication of an event ID nobody committed
    out.write(json.dumps({"event_id": "evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G", "topic": s0["topic"],
                          "partition": 0, "offset": 3, "payload_digest": s0["payload_digest"]}) + "\n")
PY
set +e
out=$("$OBX" shadow --db "$db" --broker "$broker" --alias legacy2 --feed "$dir/feed.jsonl" \
  --since-ms 1 --grace-ms -1); rc=$?
set -e
echo "$out" | sed 's/^/    /'
[[ $rc == 1 && $out == *"matched 1"* && $out == *"missing 1"* && $out == *"payload 1"* && $out == *"unknown on the broker 1"* ]] &&
  ok "shadow from a feed reports the planted differences (exit 1)" || bad "shadow feed: rc=$rc"
echo '{"event_id":"evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G","topic":"payments"}' >"$dir/bad.jsonl"
set +e
out=$("$OBX" shadow --db "$db" --alias legacy2 --feed "$dir/bad.jsonl" 2>&1); rc=$?
set -e
[[ $rc == 2 && $out == *"feed line 1: partition: missing"* ]] && ok "a bad feed line is named" || bad "bad feed: rc=$rc $out"
if ((fails)); then
  for f in legacy.log obx.log; do echo "---- $f (last 15 lines)"; tail -15 "$dir/$f"; done
  echo "$fails failed"
  exit 1
fi
echo "all passed"

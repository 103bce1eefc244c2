#!/usr/bin/env bash
# test_retention.sh — `obx audit`, `obx purge` and `obx watermark` as cron, CI and an operator
# meet them, on a real pipeline (SQLite outbox, local log broker, `obx relay`, `obx consume`):
# audit exit codes and JSON for each finding produced on purpose, the dry run, a premature purge
# refused with its reason, the purge itself (inspect and report still fine), forcing a
# watermark, and the relay's periodic audit and purge seen on /metrics.
# Usage: test_retention.sh path/to/obx
set -u
OBX=$(readlink -f "${1:?usage: test_retention.sh path/to/obx}")
dir=$(mktemp -d /tmp/obx-retcli-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [[ -n $p ]] && kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
cd "$dir" || exit 1
fails=0
check() { # check NAME EXPECTED_RC NEEDLE -- command...
  local name=$1 want=$2 needle=$3; shift 4
  local rc
  out=$("$@" 2>&1); rc=$?
  if [[ $rc -ne $want ]] || [[ -n $needle && $out != *"$needle"* ]]; then
    echo "FAIL $name: rc=$rc (want $want), output: $out"; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
# json_check NAME PYTHON_EXPR: evaluates the expression with j = the last output as JSON
json_check() {
  if python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); sys.exit(0 if eval("(" + sys.argv[1] + ")") else 1)' "$2" <<<"$out" 2>/dev/null; then
    echo "ok   $1"
  else
    echo "FAIL $1: $2 on: $out"; fails=$((fails + 1))
  fi
}
db=sqlite:$dir/o.db
broker=log:$dir/b.db
proj=proj=sqlite:$dir/c.db
ghost=ghost=sqlite:$dir/ghost.db
"$OBX" init --db "$db" >/dev/null
"$OBX" init --db "sqlite:$dir/ghost.db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
ids=()
for i in 1 2 3 4 5; do
  ids+=("$(printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$i@1" --tenant t1)")
done
wait_published() { # wait_published N: until N events are published (10 s)
  for _ in $(seq 100); do
    n=$("$OBX" report --db "$db" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["published"])' 2>/dev/null)
    [[ ${n:-0} -ge $1 ]] && return 0
    sleep 0.1
  done
  return 1
}
"$OBX" relay --db "$db" --broker "$broker" --set audit.interval_ms=0 --set relay.poll_ms=10 \
  >relay1.log 2>&1 &
pids+=($!)
wait_published 5 || { echo "FAIL relay did not publish"; fails=$((fails + 1)); }
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
"$OBX" consume --consumer-db "sqlite:$dir/c.db" --broker "$broker" --topic orders \
  --consumer proj --tenants t1 --until-idle 400 >/dev/null 2>&1

# ---- obx audit ----
check "audit clean: exit 0" 0 "no findings" -- "$OBX" audit --db "$db" --broker "$broker" --consumer "$proj"
check "audit clean json" 0 "" -- "$OBX" audit --db "$db" --broker "$broker" --consumer "$proj" --json
json_check "audit json: schema, no findings, bypass scanned" \
  'j["schema"]=="obx.audit.v1" and j["findings_total"]==0 and j["findings"]==[] and
   any(c["check"]=="bypass orders" and c["status"]=="ok" for c in j["checks"])'
pending=$(echo '{"order":6}' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-6@1 --tenant t1)
sleep 0.05
check "audit pending past its age: exit 1" 1 "" -- "$OBX" audit --db "$db" --consumer "$proj" \
  --set audit.pending_max_age_ms=20 --json
json_check "audit json names the pending event" \
  "[f['event_ids'] for f in j['findings'] if f['kind']=='pending_overdue']==[['$pending']] and j['counts']['pending_overdue']==1"
check "audit table lists it" 1 "$pending" -- "$OBX" audit --db "$db" --consumer "$proj" \
  --set audit.pending_max_age_ms=20
check "audit unconsumed by a critical consumer" 1 "" -- "$OBX" audit --db "$db" \
  --consumer "$proj" --consumer "$ghost" --set audit.unconsumed_max_age_ms=1 --json
json_check "audit json: ghost lacks all five, proj none" \
  "[(f['consumer'],f['count'],sorted(f['event_ids'])) for f in j['findings'] if f['kind']=='unconsumed']==[('ghost',5,sorted('${ids[*]}'.split()))]"
now_ms=$(($(date +%s%N) / 1000000))
sqlite3 "$dir/b.db" "INSERT INTO obx_log_msg (topic, partition, \"offset\", event_id, msg_key, headers, payload, ts) VALUES
  ('orders', 0, 1000001, 'evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G', 'k', '{}', x'7b7d', $now_ms),
  ('orders', 0, 1000002, '', 'k', '{}', x'7b7d', $now_ms)"
check "audit bypass publishing: exit 1" 1 "" -- "$OBX" audit --db "$db" --broker "$broker" --json
json_check "audit json: bypass with the unknown ID and the message without one" \
  "[(f['count'],f['event_ids'],f['without_event_id']) for f in j['findings'] if f['kind']=='bypass']==[(2,['evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G'],1)]"
check "audit --no-broker skips the broker" 0 "bypass" -- "$OBX" audit --db "$db" --broker "$broker" --no-broker
check "audit bad consumer entry" 2 "is not ID=URL" -- "$OBX" audit --db "$db" --consumer nonsense
sqlite3 "$dir/none.db" 'PRAGMA user_version = 0' # an empty SQLite database, no inbox in it
check "audit consumer db without schema" 3 "run obx init" -- "$OBX" audit --db "$db" --consumer "x=sqlite:$dir/none.db"
check "audit consumer db missing" 3 "no such database file" -- "$OBX" audit --db "$db" --consumer "x=sqlite:$dir/gone.db"
check "audit usage" 2 "usage: obx audit" -- "$OBX" audit --db "$db" --frobnicate
check "audit bad threshold" 2 "audit.pending_max_age_ms: -5 is outside" -- "$OBX" audit --db "$db" --set audit.pending_max_age_ms=-5

# ---- obx purge ----
check "purge without critical consumers" 2 "an ACK alone never purges" -- "$OBX" purge --db "$db"
check "purge dry run inside the replay window" 0 "would retain 5, would purge 0" -- "$OBX" purge --db "$db" --consumer "$proj" --dry-run
check "dry run changed nothing" 0 "PUBLISHED         5" -- "$OBX" report --db "$db"
check "premature purge of one event: refused, says why" 1 "the replay window ends at" -- "$OBX" purge "${ids[0]}" --db "$db" --consumer "$proj" --consumer "$ghost"
check "... and names the consumer" 1 "critical consumer ghost has not consumed it" -- "$OBX" purge "${ids[0]}" --db "$db" --consumer "$proj" --consumer "$ghost"
check "... and nothing moved" 0 "PUBLISHED         5" -- "$OBX" report --db "$db"
check "purge one PENDING event: refused" 1 "it is PENDING" -- "$OBX" purge "$pending" --db "$db" --consumer "$proj"
check "dry run with the window over lists what would go" 0 "would retain 5, would purge 5" -- "$OBX" purge --db "$db" --consumer "$proj" --set retention.replay_window_ms=0 --dry-run
t0=$(date +%s%N)
check "purge, paced at 4 events/s" 0 "" -- "$OBX" purge --db "$db" --consumer "$proj" --set retention.replay_window_ms=0 --set retention.batch=2 --set retention.max_rate=4 --json --who ops:alice
took=$((($(date +%s%N) - t0) / 1000000))
# 10 decisions at 4/s: the last step may not end before 2.5 s (a lower bound: sleeps only add)
if ((took >= 2400)); then echo "ok   retention.max_rate paced the purge (${took} ms)"; else echo "FAIL retention.max_rate: 10 events in ${took} ms"; fails=$((fails + 1)); fi
json_check "purge json: 5 retained, 5 purged, in batches of 2" \
  'j["retained"]==5 and j["purged"]==5 and j["batches"]==6 and j["dry_run"] is False and j["forced_consumer_watermark"] is None'
check "inspect a purged event" 0 "" -- "$OBX" inspect "${ids[2]}" --db "$db" --json
json_check "inspect: PURGED, payload gone, tombstone kept" \
  'j["status"]["state"]=="PURGED" and j["status"]["payload_purged"] and j["envelope"]["payload_digest"].startswith("sha256:") and len(j["receipts"])==1 and j["audit"][-1]["who"]=="ops:alice"'
check "report: invariants hold after the purge" 0 "PURGED            5" -- "$OBX" report --db "$db"
check "purge again: already purged" 0 "already PURGED" -- "$OBX" purge "${ids[2]}" --db "$db" --consumer "$proj"

# ---- obx watermark ----
check "watermark list" 0 "ghost" -- "$OBX" watermark --db "$db" --consumer "$proj" --consumer "$ghost"
check "watermark force needs a reason" 2 "--reason" -- "$OBX" watermark force ghost --until now --db "$db" --consumer "$ghost"
check "watermark force into the future" 2 "in the future" -- "$OBX" watermark force ghost --until 4102444800000 --reason x --db "$db" --consumer "$ghost"
check "watermark force unknown consumer" 2 "not a critical consumer" -- "$OBX" watermark force nobody --until now --reason x --db "$db" --consumer "$ghost"
check "watermark force" 0 "watermark forced to" -- "$OBX" watermark force ghost --until now --reason "ghost retired" --db "$db" --consumer "$ghost"
check "watermark force backwards" 1 "only moves forward" -- "$OBX" watermark force ghost --until 2020-01-01T00:00:00Z --reason x --db "$db" --consumer "$ghost"
check "watermark list json" 0 "" -- "$OBX" watermark --db "$db" --consumer "$ghost" --json
json_check "watermark json: forced" '[c["forced_watermark_ms"]>0 for c in j["critical_consumers"]]==[True]'
n=$(sqlite3 "$dir/ghost.db" "select count(*) from obx_consume_audit where outcome='WATERMARK_FORCED' and detail like '%ghost retired%'")
if [[ $n == 1 ]]; then echo "ok   force recorded in the consumer's database"; else echo "FAIL force audit rows: $n"; fails=$((fails + 1)); fi

# ---- the relay: periodic audit on /metrics, periodic purge ----
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# relay_metrics CONFIG LOG PATTERN...: starts a relay with CONFIG (output into LOG) and waits up
# to 10 s until its /metrics holds every PATTERN; $m is the last page read
relay_metrics() {
  local config=$1 log=$2 p miss
  shift 2
  "$OBX" relay --config "$config" --set relay.poll_ms=10 >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    m=$(curl -s "http://127.0.0.1:$port/metrics") miss=
    for p in "$@"; do [[ $m == *"$p"* ]] || miss=1; done
    [[ -z $miss ]] && return 0
    sleep 0.1
  done
  return 1
}
"$OBX" init --db "sqlite:$dir/ghost2.db" >/dev/null
cat >audit.yaml <<YAML
db: $db
broker: $broker
audit:
  critical_consumers: ["ghost2=sqlite:$dir/ghost2.db"]
  interval_ms: 200
  unconsumed_max_age_ms: 1
http:
  listen: 127.0.0.1:$port
YAML
if relay_metrics audit.yaml relay2.log 'obx_audit_findings{kind="unconsumed"} 1' 'obx_audit_up 1'; then
  echo "ok   relay exports obx_audit_findings on /metrics"
else echo "FAIL metrics: $m"; fails=$((fails + 1)); fi
[[ $m == *'obx_audit_findings{kind="bypass"}'* ]] && echo "ok   every finding kind has a gauge" || { echo "FAIL no bypass gauge"; fails=$((fails + 1)); }
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
"$OBX" consume --consumer-db "sqlite:$dir/c.db" --broker "$broker" --topic orders \
  --consumer proj --tenants t1 --until-idle 400 >/dev/null 2>&1
cat >purge.yaml <<YAML
db: $db
broker: $broker
audit:
  critical_consumers: ["$proj"]
  interval_ms: 0
retention:
  interval_ms: 200
  replay_window_ms: 0
http:
  listen: 127.0.0.1:$port
YAML
if relay_metrics purge.yaml relay3.log 'obx_retention_total{what="purged"} 1'; then
  echo "ok   relay purges periodically"
else echo "FAIL relay purge metrics: $m"; fails=$((fails + 1)); fi
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null
check "report after the relay's purge" 0 "PURGED            6" -- "$OBX" report --db "$db"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

#!/usr/bin/env bash
# test_log_fold.sh — per-event log records are folded during an incident (issue 48, item 3):
# 400 events whose ACKs the log broker drops (every outcome UNKNOWN, each then resolved by the
# reconciler's lookup). With log.fold_after=5 and log.fold_interval_ms=1000, no window holds
# more than 5 records of one kind one by one, the rest is counted on one line per window
# ("N events: outcome UNKNOWN in the last 1 s (the first 5 logged one by one)"), and the lines'
# counts add up to the exact counts of /metrics (400 UNKNOWN outcomes). log.fold_after=0 writes
# every record. Text and JSON formats.
# Usage: test_log_fold.sh OBX
set -euo pipefail
OBX=${1:?usage: test_log_fold.sh OBX}
source "$(dirname "$0")/../support/prologue.sh" fold
fail_tail=20
n=400
# the outbox of $n events every run starts from (a copy: enqueued once, not once per run)
"$OBX" init --db "sqlite:$T/template.db" >/dev/null
"$OBX" route set order.created.v1 --db "sqlite:$T/template.db" --cluster local --topic orders >/dev/null
for i in $(seq 1 $n); do
  printf '{"order":"o-%d"}' "$i" | "$OBX" enqueue --db "sqlite:$T/template.db" \
    --type order.created.v1 --aggregate "order/o-$i@1" --tenant t1 >/dev/null
done
# run NAME FOLD_AFTER FORMAT — a relay over a fresh outbox of $n events until all are published
run() {
  local name=$1 after=$2 format=$3 db=sqlite:$T/$1.db
  cp "$T/template.db" "$T/$name.db"
  "$OBX" relay --db "$db" --broker "log:$T/$name-b.db?drop_ack=1&ack_timeout_ms=50" --http 127.0.0.1:0 \
    --set log.fold_after="$after" --set log.fold_interval_ms=1000 --set log.format="$format" \
    --set relay.recheck_ms=50 --set relay.reconcile_ms=50 --set relay.poll_ms=20 --set relay.batch=50 \
    >"$T/$name.log" 2>&1 &
  local r=$!
  pids+=($r)
  local http pub
  http=$(http_addr "$T/$name.log") || fail "$name: no HTTP server"
  pub=$(wait_published "$db" "$n" 60) || fail "$name: $pub of $n published"
  sleep 1.2 # the last window ends; its count comes from the relay's loop
  curl -s "http://$http/metrics" >"$T/$name.metrics"
  kill -TERM $r
  wait $r || fail "$name: relay exit $?"
}

# kind_total LOG KIND_TEXT RECORD_PREFIX — records written one by one plus what the fold lines
# counted beyond them (each fold line: "<total> events: <kind> in the last 1 s (the first <k>
# logged one by one)")
kind_total() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, re, sys
log, kind, prefix = sys.argv[1:4]
one = folded = 0
per_window_max = 0
for line in open(log):
    line = line.rstrip("\n")
    if line.startswith("{"):
        try: msg = json.loads(line)["msg"]
        except Exception: continue
    else:
        m = re.match(r"\S+ +\S+ +[a-z]+: (.*)$", line)
        if not m: continue
        msg = m.group(1)
    m = re.match(r"([0-9,]+) events: (.*) in the last 1 s \(the first (\d+) logged one by one\)$", msg)
    if m and m.group(2) == kind:
        total, first = int(m.group(1).replace(",", "")), int(m.group(3))
        folded += total - first
        per_window_max = max(per_window_max, first)
    elif msg.startswith(prefix):
        one += 1
print(one, folded, per_window_max)
PY
}
metric() { awk -v k="$2" '$1 == k {print $2}' "$1"; }

for format in text json; do
  run "fold-$format" 5 "$format"
  unknown=$(metric "$T/fold-$format.metrics" obx_unknown_outcomes_total)
  [[ $unknown == "$n" ]] || fail "$format: obx_unknown_outcomes_total is $unknown, not $n"
  read -r one folded maxw < <(kind_total "$T/fold-$format.log" "outcome UNKNOWN" "outcome UNKNOWN: ")
  ((folded > 0)) || fail "$format: nothing folded ($one UNKNOWN records one by one)"
  ((one + folded == n)) || fail "$format: $one records + $folded folded != $n UNKNOWN outcomes (metrics)"
  ((maxw <= 5)) || fail "$format: a window logged $maxw one by one (log.fold_after=5)"
  read -r one2 folded2 _ < <(kind_total "$T/fold-$format.log" "UNKNOWN resolved by lookup" "UNKNOWN resolved: ")
  ((one2 + folded2 == n)) || fail "$format: $one2 + $folded2 'UNKNOWN resolved' != $n"
  lines=$(wc -l <"$T/fold-$format.log")
  ((lines < n)) || fail "$format: $lines lines for $n events (folded: far fewer)"
  echo "ok: $format: $n UNKNOWN outcomes in $one records + fold lines counting $folded more; resolved: $one2 + $folded2; $lines lines in all"
done
grep -q "events: outcome UNKNOWN in the last 1 s (the first 5 logged one by one)" "$T/fold-text.log" ||
  fail "no fold line in the documented form"

run nofold 0 text
read -r one folded _ < <(kind_total "$T/nofold.log" "outcome UNKNOWN" "outcome UNKNOWN: ")
((one == n && folded == 0)) || fail "log.fold_after=0: $one records, $folded folded (want $n, 0)"
echo "ok: log.fold_after=0 writes all $n records"
echo "PASS: test_log_fold"

#!/usr/bin/env bash
# test_consume_twice.sh — issue 46, item 7: two `obx consume --consumer billing --exec CMD`
# processes on one inbox (the consumer's database: SQLite or PostgreSQL) and one log broker,
# both reading every message (each event reaches both instances: broker duplicates across
# instances). The command appends its event ID to a file: counted from outside, it runs once
# per event, never twice; the inbox holds one APPLIED receipt per event and the other instance
# answers DUPLICATE without running it. Usage: test_consume_twice.sh OBX [sqlite|postgres]
set -euo pipefail
OBX=${1:?usage: test_consume_twice.sh OBX [sqlite|postgres]}
N=${OBX_CONSUME_TWICE_EVENTS:-200}
source "$(dirname "$0")/../support/prologue.sh" twice
use_store "${2:-sqlite}"
cdb=${db/outbox.db/c.db}
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/relay.log "$T"/consume*.log; do [[ -f $f ]] && { echo "---- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
db=sqlite:$T/o.db
"$OBX" init --db "$db" >/dev/null
"$OBX" init --db "$cdb" >/dev/null
"$OBX" route set invoice.due.v1 --db "$db" --cluster local --topic invoices >/dev/null
for i in $(seq 1 "$N"); do
  printf '{"invoice":%d}' "$i" | "$OBX" enqueue --db "$db" --type invoice.due.v1 \
    --aggregate "invoice/i-$i@1" --tenant t1 >/dev/null
done
publish_all "$db" "log:$T/b.db" "$N" 30 --set relay.poll_ms=10 --set relay.drain_ms=300

# the charge: outside the inbox's transaction; a short pause widens the window between the
# inbox's look and its commit
cat >"$T/charge.sh" <<'SH'
#!/bin/sh
cat >/dev/null
echo "$OBX_EVENT_ID" >>"$T/runs"
sleep 0.02
echo charged
SH
chmod +x "$T/charge.sh"
export T
for k in 1 2; do
  "$OBX" consume --consumer-db "$cdb" --broker "log:$T/b.db" --topic invoices --consumer billing \
    --exec "$T/charge.sh" --until-idle 3000 >"$T/consume$k.log" 2>&1 &
  pids+=($!)
done
for k in 1 2; do
  wait "${pids[-k]}" || fail "consumer $k exited $?"
done
runs=$(wc -l <"$T/runs")
twice=$(sort "$T/runs" | uniq -d | wc -l)
distinct=$(sort -u "$T/runs" | wc -l)
echo "handler runs: $runs for $distinct events ($twice events run more than once)"
if [[ $cdb == postgres* ]]; then
  applied=$(psql "$cdb" -Atc "SELECT count(*) FROM obx.obx_inbox WHERE consumer_id = 'billing'")
else
  applied=$(sqlite3 "${cdb#sqlite:}" "SELECT count(*) FROM obx_inbox WHERE consumer_id = 'billing'")
fi
((distinct == N)) || fail "$distinct of $N events handled"
((applied == N)) || fail "$applied receipts, want $N"
((twice == 0)) || fail "$twice events: the handler ran more than once ($runs runs for $N events)"
((runs == N)) || fail "$runs runs for $N events"
echo "all passed: $N events, $runs handler runs, $applied receipts"

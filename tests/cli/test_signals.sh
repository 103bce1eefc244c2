#!/usr/bin/env bash
# test_signals.sh — how obx consume and obx relay stop (issue 48, item 4), measured:
#   1. obx consume --exec 'sleep 1' with a backlog of 30 messages, SIGTERM 1.5 s in: the command
#      in hand runs to its end, the consumer exits within 1 s after it, no other command starts;
#      nothing that was not applied is acknowledged: a second consumer applies every other
#      message, each once;
#   2. obx consume (the sample projection, no --exec) 0.3 s into a backlog of 1,000 messages:
#      exits within 1 s of SIGTERM, and a second consumer applies the rest, each once;
#   3. obx relay with 20 outcomes outstanding (ACKs held back by the log broker): the first
#      SIGTERM says "draining 20 outstanding outcomes (up to 20000 ms); signal again to stop
#      now", the second stops it within 1 s; the 20 attempts stay SENDING (as after a kill) and a
#      second relay's sweeper and reconciler publish every event.
# Usage: test_signals.sh OBX
set -euo pipefail
OBX=${1:?usage: test_signals.sh OBX}
source "$(dirname "$0")/../support/prologue.sh" signals
now_ms() { echo $(($(date +%s%N) / 1000000)); }
state_count() { # DB STATE
  "$OBX" status --db "$1" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['states'].get('$2', 0))"
}
# publish DB BROKER N — N orders committed and published to topic orders
publish() {
  local db=$1 broker=$2 n=$3
  "$OBX" init --db "$db" >/dev/null
  "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
  # four producers at once (one process per event: slow under the sanitizers)
  seq 0 $((n - 1)) | OBX=$OBX DB=$db xargs -P 4 -I{} sh -c \
    'printf "{\"order\":\"o-%d\",\"total_cents\":100,\"currency\":\"EUR\"}" {} |
       "$OBX" enqueue --db "$DB" --type order.created.v1 --aggregate "order/o-{}@1" --tenant tenant-7 >/dev/null' ||
    fail "enqueue"
  "$OBX" relay --db "$db" --broker "$broker" --set relay.poll_ms=20 --set relay.drain_ms=500 \
    >"$T/publish.log" 2>&1 &
  local relay=$!
  pids+=($relay)
  for _ in $(seq 600); do
    [[ $(state_count "$db" PUBLISHED) == "$n" ]] && break
    sleep 0.1
  done
  [[ $(state_count "$db" PUBLISHED) == "$n" ]] || fail "the relay published $(state_count "$db" PUBLISHED) of $n"
  kill -TERM $relay
  wait $relay || fail "the publishing relay exited $?"
}

# term_after SECONDS PID: lets PID run for SECONDS, then SIGTERM (at $t_sig, ms); its exit status
term_after() {
  pids+=("$2")
  sleep "$1"
  t_sig=$(now_ms)
  kill -TERM "$2"
  wait "$2"
}

# ---- 1. --exec: the command in hand finishes, then stop within 1 s ----
publish "sqlite:$T/o1.db" "log:$T/b1.db" 30
cat >"$T/handler.sh" <<SH
#!/bin/sh
cat >/dev/null
echo "start \$(( \$(date +%s%N) / 1000000 )) \$OBX_EVENT_ID" >>"$T/runs"
sleep 1
echo "\$OBX_EVENT_ID" >>"$T/effects"
echo "end \$(( \$(date +%s%N) / 1000000 )) \$OBX_EVENT_ID" >>"$T/runs"
SH
chmod +x "$T/handler.sh"
"$OBX" consume --consumer-db "sqlite:$T/c1.db" --broker "log:$T/b1.db" --topic orders \
  --consumer exec1 --exec "$T/handler.sh" >"$T/consume1.log" 2>&1 &
term_after 1.5 $! || fail "obx consume --exec exited $? after SIGTERM"
t_exit=$(now_ms)
last_end=$(awk '$1 == "end" {print $2}' "$T/runs" | sort -n | tail -1)
started_after=$(awk -v t="$t_sig" '$1 == "start" && $2 > t' "$T/runs" | wc -l)
((started_after == 0)) || fail "$started_after commands started after SIGTERM"
after_cmd=$((t_exit - last_end))
((after_cmd <= 1000)) || fail "obx consume --exec exited $after_cmd ms after the command in hand ended (within 1 s)"
((t_exit - t_sig <= 2000)) || fail "obx consume --exec took $((t_exit - t_sig)) ms to stop (sleep 1 + 1 s)"
[[ $(grep -c '^start' "$T/runs") == $(grep -c '^end' "$T/runs") ]] || fail "a command was cut off"
done1=$(wc -l <"$T/effects")
echo "ok: --exec stopped $((t_exit - t_sig)) ms after SIGTERM, $after_cmd ms after the command in hand ended ($done1 of 30 applied)"
"$OBX" consume --consumer-db "sqlite:$T/c1.db" --broker "log:$T/b1.db" --topic orders \
  --consumer exec1 --exec "$T/handler.sh" --until-idle 1500 >"$T/consume1b.log" 2>&1 ||
  fail "the second consumer exited $?"
[[ $(sort -u "$T/effects" | wc -l) == 30 ]] || fail "$(sort -u "$T/effects" | wc -l) of 30 applied after the restart"
[[ $(wc -l <"$T/effects") == 30 ]] || fail "a command ran twice for one event ($(wc -l <"$T/effects") runs for 30)"
echo "ok: the rest was redelivered: 30 of 30 applied, each once"

# ---- 2. the sample projection during a backlog ----
publish "sqlite:$T/o2.db" "log:$T/b2.db" 1000
"$OBX" consume --consumer-db "sqlite:$T/c2.db" --broker "log:$T/b2.db" --topic orders \
  >"$T/consume2.log" 2>&1 &
term_after 0.3 $! || fail "obx consume exited $? after SIGTERM"
ms=$(($(now_ms) - t_sig))
((ms <= 1000)) || fail "obx consume took $ms ms to stop during a backlog (within 1 s)"
applied=$(sqlite3 "$T/c2.db" "SELECT count(DISTINCT event_id) FROM order_projection")
((applied < 1000)) || fail "the backlog was gone before the signal ($applied): nothing measured"
echo "ok: obx consume stopped $ms ms after SIGTERM during a backlog ($applied of 1000 applied)"
"$OBX" consume --consumer-db "sqlite:$T/c2.db" --broker "log:$T/b2.db" --topic orders \
  --until-idle 1500 >"$T/consume2b.log" 2>&1 || fail "the second consumer exited $?"
[[ $(sqlite3 "$T/c2.db" "SELECT count(DISTINCT event_id) || ' ' || count(*) FROM order_projection") == "1000 1000" ]] ||
  fail "after the restart: $(sqlite3 "$T/c2.db" "SELECT count(DISTINCT event_id) || ' distinct, ' || count(*) || ' rows' FROM order_projection")"
echo "ok: 1000 of 1000 applied once after the restart"

# ---- 3. the relay: first signal drains and says so, the second stops at once ----
db=sqlite:$T/o3.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
for i in $(seq 1 20); do
  printf '{"order":"o-%d"}' "$i" |
    "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/o-$i@1" --tenant t1 >/dev/null
done
"$OBX" relay --db "$db" --broker "log:$T/b3.db?delay_ack=1&delay_ack_ms=60000" --id held \
  --set relay.dispatchers=1 --set relay.drain_ms=20000 --set relay.lease_ms=2000 \
  --set relay.sweep_ms=3600000 --set relay.poll_ms=20 >"$T/relay3.log" 2>&1 &
r=$!
pids+=($r)
# The short lease lets the next relay sweep the attempts at once; this one never sweeps
# (sweep_ms an hour), or its own sweep would make them UNKNOWN 2 s after it sent them, which a
# loaded machine's polling can miss (CI: "20 events not SENDING (0)").
for _ in $(seq 100); do [[ $(state_count "$db" SENDING) == 20 ]] && break; sleep 0.1; done
[[ $(state_count "$db" SENDING) == 20 ]] || fail "20 events not SENDING ($(state_count "$db" SENDING))"
sleep 0.5
kill -TERM $r
for _ in $(seq 50); do grep -q "draining" "$T/relay3.log" && break; sleep 0.05; done
grep -q "draining 20 outstanding outcomes (up to 20000 ms); signal again to stop now" "$T/relay3.log" ||
  fail "the first SIGTERM did not say what it drains"
sleep 0.5
kill -0 $r 2>/dev/null || fail "the relay stopped before its drain ended, on one signal"
t_sig=$(now_ms)
kill -TERM $r
wait $r || fail "the relay exited $? after the second signal"
ms=$(($(now_ms) - t_sig))
((ms <= 1000)) || fail "the relay took $ms ms to stop after the second signal (at once: within 1 s)"
[[ $(state_count "$db" SENDING) == 20 ]] || fail "outstanding attempts are not left SENDING as after a kill"
echo "ok: relay: the first signal said 'draining 20 outstanding outcomes', the second stopped it in $ms ms"
"$OBX" relay --db "$db" --broker "log:$T/b3.db" --id after --set relay.sweep_ms=100 \
  --set relay.reconcile_ms=100 --set relay.recheck_ms=100 --set relay.poll_ms=20 >"$T/relay3b.log" 2>&1 &
r=$!
pids+=($r)
for _ in $(seq 300); do [[ $(state_count "$db" PUBLISHED) == 20 ]] && break; sleep 0.1; done
[[ $(state_count "$db" PUBLISHED) == 20 ]] || fail "the next relay published $(state_count "$db" PUBLISHED) of 20"
kill -TERM $r
wait $r || true
echo "ok: the next relay swept and reconciled them: 20 of 20 published"
echo "PASS: test_signals"

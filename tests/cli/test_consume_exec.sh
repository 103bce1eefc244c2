#!/usr/bin/env bash
# test_consume_exec.sh — `obx consume --exec CMD`: a handler command per message with the inbox
# around it, on a real pipeline (SQLite outbox, `obx relay`, the local log broker or RabbitMQ).
# Usage: test_consume_exec.sh OBX [log|amqp]
#
# Twelve orders, one payload that is not an order, one order whose handler always fails, one
# whose handler hangs. The handler (a shell script) reads the payload on stdin and the headers
# from its environment, records every run, and makes its effect idempotent on OBX_EFFECT_KEY.
# Injected:
#   - a crash between the command's effect and the inbox's commit: the handler kills the
#     consumer (SIGKILL) right after its effect; the restarted consumer runs it again with the
#     same effect key, and the effect happens once;
#   - a crash between the inbox's commit and the broker's acknowledgement:
#       log   lost acknowledgements (every one in the first run, then lose_commit=0.3) and
#             consumer restarts;
#       amqp  the consumer reaches RabbitMQ through a socat proxy; the handler stops the proxy
#             (SIGSTOP) and exits 0, the inbox commits, the ack is stuck in the stopped proxy,
#             the consumer and the proxy are killed (SIGKILL): RabbitMQ redelivers the message
#             and the inbox answers DUPLICATE without running the command again;
#   - a handler failure once (retried, then applied), exit 65 (parked at once), exit 3 every
#     time (parked after --max-failures), a hang (killed after --exec-timeout, then parked), a
#     command that exits 0 leaving a background process with its stdout open (applied).
# Checked from the outside: the handler's own effect log has every order exactly once
# (duplicate effects 0), the command ran once per order except the one killed before its commit,
# the inbox's receipts, duplicates, failures and poison rows are the expected ones, and the
# broker holds nothing unacknowledged at the end (amqp). Usage errors exit 2.
set -euo pipefail
OBX=${1:?usage: test_consume_exec.sh OBX [log|amqp]}
mode=${2:-log}
source "$(dirname "$0")/../support/prologue.sh" exec
cleanup() {
  [[ -s $T/socat.pid ]] && kill -9 -"$(cat "$T/socat.pid")" 2>/dev/null || true
}
on_exit cleanup
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/relay.log "$T"/consume*.log; do [[ -f $f ]] && { echo "---- $f" >&2; tail -30 "$f" >&2; }; done
  exit 1
}
q() { sqlite3 -cmd '.timeout 10000' "$T/c.db" "$1"; } # beside a running consumer: wait for its lock

db=sqlite:$T/o.db
tag=exec$$
case $mode in
  log)
    cluster=local topic=orders
    relay_broker=log:$T/b.db
    # the first run's acknowledgements are all lost (as if it crashed after each inbox commit,
    # before the ack), later runs lose some
    consume_broker="log:$T/b.db?lose_commit=0.3&seed=7"
    source_=orders
    ;;
  amqp)
    url=${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set: run scripts/test.sh}
    cluster=obx-exec topic=obx-exec-$tag
    relay_broker="$url?cluster=$cluster&declare_exchange=$topic&declare_queue=obx-exec-q-$tag"
    source_=obx-exec-q-$tag
    # the consumer's connections go through a proxy the handler can stop
    hostport=${url#*@}; hostport=${hostport%%/*}
    rport=${hostport##*:}
    pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    consume_broker=amqp://guest:guest@127.0.0.1:$pport/%2f?cluster=$cluster
    ;;
  *) echo "mode: log or amqp" >&2; exit 2 ;;
esac

proxy_start() {
  setsid socat TCP-LISTEN:"$pport",bind=127.0.0.1,reuseaddr,fork TCP:127.0.0.1:"$rport" \
    >/dev/null 2>&1 &
  echo $! >"$T/socat.pid"
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$pport") 2>/dev/null && return 0
    sleep 0.05
  done
  fail "socat proxy did not start"
}

# ---- the outbox: 12 orders, a payload that is not an order, one failing, one hanging ----
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster "$cluster" --topic "$topic" >/dev/null
for i in $(seq 1 12); do
  printf '{"order":"o-%d","total":%d}' "$i" "$((i * 100))" |
    "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/o-$i@1" --tenant t1 \
      --correlation-id "c-$i" >>"$T/ids"
done
printf 'not an order' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-bad@1 --tenant t1 >"$T/bad.id"
printf '{"order":"o-fails"}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-fails@1 --tenant t1 >"$T/fails.id"
printf '{"order":"o-hangs"}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-hangs@1 --tenant t1 >"$T/hangs.id"
publish_all "$db" "$relay_broker" 15 20 --set relay.poll_ms=20 --set relay.drain_ms=500
echo "ok: 15 events published to $mode"

# ---- the handler ----
cat >"$T/handler.sh" <<'SH'
#!/bin/sh
# A consumer's handler command: payload on stdin, obx headers in the environment.
p=$(cat)
echo "$OBX_EVENT_ID" >>"$T/runs"
case "$p" in
  '{'*) ;;
  *) echo "not an order: $p" >&2; exit 65 ;;        # poison: no retry can help
esac
case "$OBX_AGGREGATE_ID" in
  o-fails) echo "downstream refuses $OBX_AGGREGATE_ID" >&2; exit 3 ;;
  o-hangs) sleep 30 ;;
  o-3) if [ ! -e "$T/flaked" ]; then touch "$T/flaked"; echo "downstream busy" >&2; exit 1; fi ;;
  o-2) sleep 3 & ;;  # leaves a process holding stdout and stderr open: the command's exit counts
esac
# the effect, in a system that dedupes on the effect key (a payment API's idempotency key)
grep -q "^$OBX_EFFECT_KEY " "$T/effects" 2>/dev/null ||
  echo "$OBX_EFFECT_KEY $OBX_EVENT_ID $OBX_TENANT $OBX_EVENT_TYPE $OBX_AGGREGATE_ID@$OBX_AGGREGATE_VERSION $OBX_CORRELATION_ID $p" >>"$T/effects"
echo "$OBX_EVENT_ID" >>"$T/applied_runs"
# crash between this effect and the inbox's commit (once)
if [ "$OBX_AGGREGATE_ID" = o-5 ] && [ ! -e "$T/crashed1" ]; then
  touch "$T/crashed1"; kill -9 "$(cat "$T/consumer.pid")"; exit 0
fi
# amqp: crash between the inbox's commit and the broker's ack (once): the ack cannot pass
if [ "$MODE" = amqp ] && [ "$OBX_AGGREGATE_ID" = o-9 ] && [ ! -e "$T/crashed2" ]; then
  touch "$T/crashed2"; kill -STOP -"$(cat "$T/socat.pid")"
fi
echo "applied $OBX_AGGREGATE_ID for $OBX_CONSUMER_ID"
SH
chmod +x "$T/handler.sh"
export T MODE=$mode

run=0
consume() { # one consumer run in the background; its pid in consumer.pid
  run=$((run + 1))
  local b=$consume_broker
  [[ $mode == log && $run == 1 ]] && b="log:$T/b.db?lose_commit=1"
  "$OBX" consume --consumer-db "sqlite:$T/c.db" --broker "$b" --topic "$source_" \
    --consumer shell-proj --types order.created.v1 --tenants t1 --max-failures 2 \
    --exec "$T/handler.sh" --exec-timeout 1500 --until-idle 1500 >"$T/consume$run.log" 2>&1 &
  echo $! >"$T/consumer.pid"
}
[[ $mode == amqp ]] && proxy_start
for round in $(seq 1 8); do
  consume
  pid=$(cat "$T/consumer.pid")
  # wait for this run to end (idle, or killed by the handler); amqp: the second crash
  while kill -0 "$pid" 2>/dev/null; do
    if [[ $mode == amqp && -e $T/crashed2 && ! -e $T/killed2 ]]; then
      id9=$(sed -n 9p "$T/ids")
      for _ in $(seq 100); do
        [[ $(q "SELECT count(*) FROM obx_inbox WHERE event_id = '$id9'") == 1 ]] && break
        sleep 0.05
      done
      [[ $(q "SELECT count(*) FROM obx_inbox WHERE event_id = '$id9'") == 1 ]] ||
        fail "o-9's receipt was not committed while the proxy was stopped"
      sleep 0.5 # its ack is written into the stopped proxy by now
      kill -9 "$pid"
      kill -9 -"$(cat "$T/socat.pid")"
      touch "$T/killed2"
      echo "ok: consumer and proxy killed after o-9's inbox commit, before its ack reached RabbitMQ"
      sleep 1
      proxy_start
      break
    fi
    sleep 0.1
  done
  wait "$pid" 2>/dev/null || true
  applied=$(q "SELECT count(*) FROM obx_inbox" 2>/dev/null || echo 0)
  parked=$(q "SELECT count(*) FROM obx_poison WHERE state = 'PARKED'" 2>/dev/null || echo 0)
  echo "round $round: $applied applied, $parked parked"
  [[ $applied == 12 && $parked == 3 && ($mode == log || -e $T/killed2) && $round -ge 3 ]] && break
done
[[ -e $T/crashed1 ]] || fail "the crash before the commit was not injected"

# ---- what happened, from the outside ----
sort "$T/ids" >"$T/ids.sorted"
cut -d' ' -f2 "$T/effects" | sort >"$T/effects.ids"
diff "$T/ids.sorted" "$T/effects.ids" >/dev/null ||
  fail "effects are not the 12 orders exactly once: $(diff "$T/ids.sorted" "$T/effects.ids" | head)"
dups=$(cut -d' ' -f1 "$T/effects" | sort | uniq -d | wc -l)
[[ $dups == 0 ]] || fail "duplicate effects: $dups"
echo "ok: 12 effects, duplicate effects 0"
grep -q "t1 order.created.v1 o-4@1 c-4 {\"order\":\"o-4\",\"total\":400}" "$T/effects" ||
  fail "headers in the environment / payload on stdin: $(grep o-4 "$T/effects")"
# the command ran once per order, except o-5, killed between its effect and the commit
id5=$(sed -n 5p "$T/ids")
while read -r id; do
  want=1
  [[ $id == "$id5" ]] && want=2
  got=$(grep -c "^$id\$" "$T/applied_runs")
  [[ $got == "$want" ]] || fail "the command made its effect for $id $got times, want $want"
done <"$T/ids"
echo "ok: the command ran again only after the crash before the commit (same effect key)"
[[ $(q "SELECT count(*) FROM obx_inbox WHERE consumer_id = 'shell-proj' AND outcome = 'APPLIED'") == 12 ]] ||
  fail "receipts"
[[ $(q "SELECT result FROM obx_inbox WHERE event_id = '$id5'") == "applied o-5 for shell-proj" ]] ||
  fail "the command's stdout is the receipt's result: $(q "SELECT result FROM obx_inbox WHERE event_id = '$id5'")"
dupl=$(q "SELECT count(*) FROM obx_consume_audit WHERE outcome = 'DUPLICATE'")
[[ $dupl -ge 1 ]] || fail "no redelivery answered as a duplicate"
echo "ok: $dupl redeliveries answered DUPLICATE by the inbox"
if [[ $mode == amqp ]]; then
  id9=$(sed -n 9p "$T/ids")
  [[ $(q "SELECT count(*) FROM obx_consume_audit WHERE event_id = '$id9' AND outcome = 'DUPLICATE'") -ge 1 ]] ||
    fail "o-9 was not redelivered after the crash before its ack"
  echo "ok: o-9 redelivered by RabbitMQ after the crash, the command not run again"
fi
id3=$(sed -n 3p "$T/ids")
[[ $(q "SELECT count(*) FROM obx_consume_audit WHERE event_id = '$id3' AND outcome = 'FAILED'") == 1 ]] ||
  fail "o-3 failed once, then applied"
bad=$(cat "$T/bad.id") fails=$(cat "$T/fails.id") hangs=$(cat "$T/hangs.id")
[[ $(q "SELECT last_error FROM obx_poison WHERE event_id = '$bad'") == "handler refused the message as poison: exit 65: not an order: not an order" ]] ||
  fail "exit 65 parks: $(q "SELECT failures, last_error FROM obx_poison WHERE event_id = '$bad'")"
# at once: every delivery of it (redeliveries included) ended POISONED, none was retried
[[ $(q "SELECT count(*) FROM obx_consume_audit WHERE event_id = '$bad' AND outcome = 'FAILED'") == \
   $(q "SELECT count(*) FROM obx_consume_audit WHERE event_id = '$bad' AND outcome = 'POISONED'") ]] ||
  fail "exit 65 was retried: $(q "SELECT outcome FROM obx_consume_audit WHERE event_id = '$bad'")"
[[ $(q "SELECT last_error FROM obx_poison WHERE event_id = '$fails'") == "2 handler failures, last: handler failed: OBX_EHANDLER: exit 3: downstream refuses o-fails" ]] ||
  fail "exit 3 is retried, then parked: $(q "SELECT last_error FROM obx_poison WHERE event_id = '$fails'")"
grep -q "timed out after 1500 ms (killed)" <<<"$(q "SELECT last_error FROM obx_poison WHERE event_id = '$hangs'")" ||
  fail "a hanging command is killed: $(q "SELECT last_error FROM obx_poison WHERE event_id = '$hangs'")"
echo "ok: exit 65 parked at once, exit 3 parked after 2 failures, a hang killed after 1.5 s"
# nothing is left unacknowledged: a fresh consumer on the broker itself gets nothing
direct=$consume_broker
[[ $mode == amqp ]] && direct="$url?cluster=$cluster"
[[ $mode == log ]] && direct=log:$T/b.db
"$OBX" consume --consumer-db "sqlite:$T/c.db" --broker "$direct" --topic "$source_" \
  --consumer shell-proj --types order.created.v1 --tenants t1 --exec "$T/handler.sh" \
  --until-idle 1500 --json >"$T/last.json" 2>"$T/last.log" || fail "last consumer run"
python3 - "$T/last.json" "$mode" <<'PY' || fail "left on the broker: $(cat "$T/last.json")"
import json, sys
d = json.load(open(sys.argv[1]))
# amqp: every message was acknowledged; log: positions whose ack was lost come again, and the
# inbox answers them without running the command
assert d["applied"] == 0 and d["failed"] == 0, d
assert d["delivered"] == 0 if sys.argv[2] == "amqp" else d["delivered"] == d["duplicates"] + d["poisoned"], d
PY
echo "ok: nothing left to apply on the broker ($(cat "$T/last.json"))"

# ---- usage ----
for args in "--exec ''" "--exec x --poison-exit 0" "--exec x --poison-exit 256" \
  "--exec x --exec-timeout 0" "--exec x --fail-permille 5"; do
  set +e
  eval "\"$OBX\" consume --consumer-db sqlite:$T/u.db --topic t $args" >"$T/usage" 2>&1
  rc=$?
  set -e
  [[ $rc == 2 ]] || fail "obx consume $args: exit $rc, want 2: $(cat "$T/usage")"
done
[[ ! -e $T/u.db ]] || fail "a usage error created the consumer database"
echo "ok: usage errors exit 2 and store nothing"
echo "ok: obx consume --exec ($mode)"

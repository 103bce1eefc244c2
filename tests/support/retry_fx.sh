#!/usr/bin/env bash
# retry_fx.sh — the pipeline the consumer-retry tests share (test_consume_retry.sh and
# test_consume_unordered.sh), written once. A test sources it after reading OBX and mode:
#   source "$(dirname "$0")/../support/retry_fx.sh" NAME
# and gets all of prologue.sh (T is /tmp/obx-NAME-XXXXXX; fail shows the last 30 lines of the
# relay's and the consumers' logs and of the handler's runs), and:
#   q SQL                      runs SQL on the consumer's SQLite database $T/c.db
#   (at exit the consumer whose PID is in $T/consumer.pid is killed)
#   retry_broker NAME [KMOCK]  sets cluster, topic, source_, relay_broker and consume_broker for
#                              $mode (log, amqp: names of its own from NAME; kafka: the mock
#                              cluster, started from KMOCK or beside the obx binary)
#   retry_publish AGG:ORDER:VERSION...
#                              a SQLite outbox ($db) with those order events, published by a relay
#                              that is stopped once every one is PUBLISHED
#   retry_handler              $T/handler.sh: logs each run to $T/runs, always fails o-dead, fails
#                              o-flaky three times, writes each effect once to $T/effects
#   retry_outcome CONSUMER N   fails unless CONSUMER applied N events (receipts), parked one
#                              after 4 failures, kept no failure row of an applied event, and
#                              scheduled 6 retries (RETRY_SCHEDULED audit rows)
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh" "${1:?usage: source retry_fx.sh NAME}"
fail_tail=30 fail_files='relay.log consume*.log consume*.json runs'
on_exit '[[ -s $T/consumer.pid ]] && kill -9 "$(cat "$T/consumer.pid")" 2>/dev/null'
q() { sqlite3 -cmd '.timeout 10000' "$T/c.db" "$1"; }

retry_broker() {
  local name=$1 kmock=${2:-$(dirname "$OBX")/bench/chaos_kmock}
  case $mode in
    log)
      cluster=local topic=orders source_=orders
      relay_broker=log:$T/b.db consume_broker=log:$T/b.db
      ;;
    amqp)
      local url=${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set: run scripts/test.sh}
      cluster=obx-$name topic=obx-$name-$$ source_=obx-$name-q-$$
      relay_broker="$url?cluster=$cluster&declare_exchange=$topic&declare_queue=$source_"
      consume_broker="$url?cluster=$cluster"
      ;;
    kafka)
      # shellcheck source=tests/support/kmock.sh
      source "$(dirname "${BASH_SOURCE[0]}")/kmock.sh"
      kmock_start "$kmock"
      cluster=kafka-$name topic=orders source_=orders
      relay_broker="kafka://$boot?cluster=$cluster" consume_broker=$relay_broker
      ;;
    *) echo "mode: log, amqp or kafka" >&2; exit 2 ;;
  esac
}

retry_publish() {
  db=sqlite:$T/o.db
  "$OBX" init --db "$db" >/dev/null
  "$OBX" route set order.created.v1 --db "$db" --cluster "$cluster" --topic "$topic" >/dev/null
  local e
  for e in "$@"; do
    IFS=: read -r agg order version <<<"$e"
    printf '{"order":"%s"}' "$order" | "$OBX" enqueue --db "$db" --type order.created.v1 \
      --aggregate "order/$agg@$version" --tenant t1 >>"$T/ids"
  done
  publish_all "$db" "$relay_broker" $# 20 --set relay.poll_ms=20 --set relay.drain_ms=500
}

retry_handler() {
  cat >"$T/handler.sh" <<'SH'
#!/bin/sh
p=$(cat)
o=$(printf '%s' "$p" | sed 's/.*"order":"\([^"]*\)".*/\1/')
echo "$(date +%s.%N) $o" >>"$T/runs"
case "$o" in
  o-dead) echo "downstream refuses $o" >&2; exit 3 ;;
  o-flaky)
    n=$(grep -c ' o-flaky$' "$T/runs")
    if [ "$n" -le 3 ]; then echo "downstream busy ($n)" >&2; exit 1; fi ;;
esac
grep -q "^$OBX_EFFECT_KEY " "$T/effects" 2>/dev/null || echo "$OBX_EFFECT_KEY $o" >>"$T/effects"
echo "applied $o"
SH
  chmod +x "$T/handler.sh"
  export T
}

retry_outcome() {
  local c=$1
  [[ $(q "SELECT count(*) FROM obx_inbox WHERE consumer_id = '$c' AND outcome = 'APPLIED'") == "$2" ]] ||
    fail "receipts: $(q 'SELECT event_id, outcome FROM obx_inbox')"
  [[ $(q "SELECT state || ' ' || failures FROM obx_poison WHERE consumer_id = '$c'") == "PARKED 4" ]] ||
    fail "poison: $(q 'SELECT event_id, state, failures FROM obx_poison')"
  [[ $(q "SELECT count(*) FROM obx_inbox_failure WHERE consumer_id = '$c' AND event_id IN (SELECT event_id FROM obx_inbox)") == 0 ]] ||
    fail "an applied event kept its failure row"
  [[ $(q "SELECT count(*) FROM obx_consume_audit WHERE consumer_id = '$c' AND outcome = 'RETRY_SCHEDULED'") == 6 ]] ||
    fail "RETRY_SCHEDULED rows: $(q "SELECT outcome, detail FROM obx_consume_audit WHERE outcome = 'RETRY_SCHEDULED'")"
}

#!/usr/bin/env bash
# retry_fx.sh — the pipeline the consumer-retry tests share (test_consume_retry.sh and
# test_consume_unordered.sh), written once. Sourced; uses the caller's OBX, T, mode, pids, fail.
#   retry_broker NAME [KMOCK]  sets cluster, topic, source_, relay_broker and consume_broker for
#                              $mode (log, amqp: names of its own from NAME; kafka: the mock
#                              cluster, started from KMOCK or beside the obx binary)
#   retry_publish AGG:ORDER:VERSION...
#                              a SQLite outbox ($db) with those order events, published by a relay
#                              that is stopped once every one is PUBLISHED
#   retry_handler              $T/handler.sh: logs each run to $T/runs, always fails o-dead, fails
#                              o-flaky three times, writes each effect once to $T/effects
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
  local e n=0
  for e in "$@"; do
    IFS=: read -r agg order version <<<"$e"
    printf '{"order":"%s"}' "$order" | "$OBX" enqueue --db "$db" --type order.created.v1 \
      --aggregate "order/$agg@$version" --tenant t1 >>"$T/ids"
  done
  "$OBX" relay --db "$db" --broker "$relay_broker" --set relay.poll_ms=20 --set relay.drain_ms=500 \
    >"$T/relay.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 400); do
    n=$("$OBX" status --db "$db" --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["states"]["PUBLISHED"])')
    [[ $n == "$#" ]] && break
    sleep 0.05
  done
  [[ $n == "$#" ]] || fail "relay published $n of $#"
  kill -TERM "${pids[-1]}"
  wait "${pids[-1]}" 2>/dev/null || true
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

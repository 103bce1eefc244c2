#!/usr/bin/env bash
# test_daemon_wait.sh — `obx relay` and `obx consume` started before what they need keep running,
# say why they are not ready, and serve once it appears (issue 48, item 1).
# Usage: test_daemon_wait.sh OBX MODE [CHAOS_KMOCK]
#   pg     the outbox's and the consumer's PostgreSQL databases do not exist yet; they are created
#          (and the outbox initialised) while both wait
#   log    the local log broker's file is in a folder that does not exist yet
#   amqp   RabbitMQ is not reachable yet: the broker URL names a port where nothing listens, and
#          a proxy to the test's RabbitMQ starts on it later
#   kafka  the Kafka cluster is not there yet: the bootstrap port answers only once a mock
#          cluster (bench/chaos_kmock, started later) is behind it
# Checked from the outside: both processes stay up while they wait; /readyz answers 503 with the
# reason, then 200; one log line when they start waiting and one when it is over (not one per
# try or per thread); every event is published and applied once; a configuration error still
# exits at once with 2.
set -euo pipefail
OBX=${1:?usage: test_daemon_wait.sh OBX pg|log|amqp|kafka [CHAOS_KMOCK]}
mode=${2:?mode}
KMOCK=${3:-}
source "$(dirname "$0")/../support/prologue.sh" wait
cleanup() {
  [[ -s $T/socat.pid ]] && kill -9 "$(cat "$T/socat.pid")" 2>/dev/null || true
  if [[ $mode == pg ]]; then
    psql "$OBX_TEST_PG_URL" -qc "DROP DATABASE IF EXISTS $odb WITH (FORCE)" >/dev/null 2>&1 || true
    psql "$OBX_TEST_PG_URL" -qc "DROP DATABASE IF EXISTS $cdb WITH (FORCE)" >/dev/null 2>&1 || true
  fi
}
on_exit cleanup
fail_tail=20
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
alive() { kill -0 "$1" 2>/dev/null || fail "$2 exited while waiting (it must wait)"; }
# proxy PORT HOST:PORT — a TCP proxy, started now: the dependency "appears"
proxy() {
  setsid socat TCP-LISTEN:"$1",bind=127.0.0.1,reuseaddr,fork TCP:"$2" >/dev/null 2>&1 &
  echo $! >"$T/socat.pid"
}

n_events=5
relay_args=(--set relay.poll_ms=20 --set relay.drain_ms=500 --set connect.retry_initial_ms=100
  --set connect.retry_max_ms=800 --http 127.0.0.1:0)
consume_args=(--set connect.retry_initial_ms=100 --set connect.retry_max_ms=800)
db=sqlite:$T/o.db
cdb_url=sqlite:$T/c.db
topic=orders
cluster=local
case $mode in
pg)
  : "${OBX_TEST_PG_URL:?OBX_TEST_PG_URL is not set: run scripts/test.sh}"
  odb=obx_wait_o_$$ cdb=obx_wait_c_$$
  base=${OBX_TEST_PG_URL%/*}
  db=$base/$odb
  cdb_url=$base/$cdb
  broker=log:$T/b.db
  consume_broker=$broker
  what="database unreachable"
  ;;
log)
  broker=log:$T/later/b.db
  consume_broker=$broker
  what="broker unreachable"
  ;;
amqp)
  url=${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set: run scripts/test.sh}
  hostport=${url#*@}
  hostport=${hostport%%/*}
  port=$(free_port)
  tag=wait$$
  cluster=obx-wait topic=obx-wait-$tag
  decl="cluster=$cluster&declare_exchange=$topic&declare_queue=obx-wait-q-$tag"
  broker="amqp://guest:guest@127.0.0.1:$port/%2f?$decl"
  consume_broker=$broker
  source_=obx-wait-q-$tag
  what="broker unreachable"
  ;;
kafka)
  [[ -x $KMOCK ]] || fail "kafka mode needs bench/chaos_kmock (argument 3)"
  port=$(free_port)
  cluster=kwait
  broker="kafka://127.0.0.1:$port?cluster=$cluster"
  consume_broker=$broker
  relay_args+=(--broker-prop message.timeout.ms=10000 --broker-prop obx.open.timeout.ms=2000)
  consume_args+=(--broker-prop consumer.session.timeout.ms=6000 --broker-prop obx.open.timeout.ms=2000)
  what="broker unreachable"
  ;;
*) fail "mode: pg, log, amqp or kafka" ;;
esac
source_=${source_:-$topic}

if [[ $mode != pg ]]; then
  "$OBX" init --db "$db" >/dev/null
fi

# ---- a configuration error exits at once, with 2 ----
t0=$(date +%s%N)
set +e
timeout 10 "$OBX" relay --db "$db" --broker "$broker" --set relay.dispatchers=0 >"$T/cfg.log" 2>&1
rc=$?
timeout 10 "$OBX" consume --consumer-db "$cdb_url" --broker "nosuch://x" --topic "$source_" \
  --exec true >"$T/cfg2.log" 2>&1
rc2=$?
set -e
ms=$((($(date +%s%N) - t0) / 1000000))
[[ $rc == 2 ]] || fail "a configuration error (relay.dispatchers=0) exited $rc, not 2"
[[ $rc2 == 2 ]] || fail "a configuration error (a bad broker URL) exited $rc2 in obx consume, not 2"
((ms < 5000)) || fail "configuration errors took $ms ms to exit (at once: under 5 s)"
echo "ok: configuration errors exit 2 at once ($ms ms for both)"

# ---- both start before what they need ----
"$OBX" relay --db "$db" --broker "$broker" "${relay_args[@]}" >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
cat >"$T/handler.sh" <<SH
#!/bin/sh
cat >/dev/null
echo "\$OBX_EVENT_ID" >>"$T/effects"
SH
chmod +x "$T/handler.sh"
"$OBX" consume --consumer-db "$cdb_url" --broker "$consume_broker" --topic "$source_" \
  --consumer waiter --exec "$T/handler.sh" "${consume_args[@]}" >"$T/consume.log" 2>&1 &
consumer=$!
pids+=($consumer)
http=$(http_addr "$T/relay.log") || fail "the relay's HTTP server did not start while it waits"
sleep 4 # several tries of every thread (back-off 100..800 ms)
alive "$relay" "obx relay"
alive "$consumer" "obx consume"
code=$(curl -s -o "$T/readyz" -w '%{http_code}' "http://$http/readyz")
[[ $code == 503 ]] || fail "/readyz answered $code while waiting (want 503)"
grep -q "not ready: .*unreachable" "$T/readyz" || fail "/readyz does not say why: $(cat "$T/readyz")"
n=$(grep -c "$what" "$T/relay.log" || true)
[[ $n == 1 ]] || fail "the relay logged '$what' $n times in 4 s of tries by 3 threads (want 1)"
grep -q "$what: .*; retrying in " "$T/relay.log" || fail "no 'retrying in' in the relay's line"
n=$(grep -c "unreachable" "$T/consume.log" || true)
[[ $n == 1 ]] || fail "obx consume logged 'unreachable' $n times while waiting (want 1)"
echo "ok: relay and consumer wait ($what; /readyz: $(head -c 120 "$T/readyz"))"

# ---- it appears ----
case $mode in
pg)
  psql "$OBX_TEST_PG_URL" -qc "CREATE DATABASE $odb" >/dev/null
  psql "$OBX_TEST_PG_URL" -qc "CREATE DATABASE $cdb" >/dev/null
  "$OBX" init --db "$db" >/dev/null
  ;;
log) mkdir -p "$T/later" ;;
amqp) proxy "$port" "$hostport" ;;
kafka)
  coproc KM { "$KMOCK" --brokers 1 --topic orders:4; }
  read -r -t 20 word boots <&"${KM[0]}" || fail "chaos_kmock did not start"
  pids+=($KM_PID)
  proxy "$port" "${boots%%,*}"
  ;;
esac
"$OBX" route set order.created.v1 --db "$db" --cluster "$cluster" --topic "$topic" >/dev/null
for i in $(seq 1 $n_events); do
  printf '{"order":"o-%d"}' "$i" |
    "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/o-$i@1" --tenant t1 >>"$T/ids"
done
for _ in $(seq 600); do
  applied=$(cat "$T/effects" 2>/dev/null | sort -u | wc -l) || true
  ((applied >= n_events)) && break
  sleep 0.1
done
((applied == n_events)) || fail "$applied of $n_events events applied after the $mode dependency appeared"
[[ $(sort "$T/effects" | uniq -d | wc -l) == 0 ]] || fail "an effect ran twice"
[[ $(sort -u "$T/effects") == $(sort "$T/ids") ]] || fail "the effects are not the enqueued events"
for _ in $(seq 100); do
  code=$(curl -s -o "$T/readyz" -w '%{http_code}' "http://$http/readyz")
  [[ $code == 200 ]] && break
  sleep 0.1
done
[[ $code == 200 ]] || fail "/readyz answered $code once everything is there: $(cat "$T/readyz")"
grep -Eq "(database|broker) reachable (again )?after [0-9.]+ s" "$T/relay.log" ||
  fail "the relay did not log that it got through"
grep -Eq "reachable (again )?after [0-9.]+ s" "$T/consume.log" ||
  fail "obx consume did not log that it got through"
echo "ok: $n_events events published and applied once after the $mode dependency appeared; /readyz 200"

kill -TERM "$relay" "$consumer"
wait "$relay" || fail "the relay exited $? after SIGTERM"
wait "$consumer" || fail "obx consume exited $? after SIGTERM"
pids=()
echo "PASS: test_daemon_wait $mode"

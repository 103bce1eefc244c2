#!/usr/bin/env bash
# test_example.sh — the examples/ consumers (Python: psycopg2 + pika; Node: pg + amqplib) on a
# real pipeline: PostgreSQL outbox and consumer database (OBX_TEST_PG_URL), RabbitMQ
# (OBX_TEST_AMQP_URL), `obx relay`. Usage: test_example.sh OBX python|node
#
# A producer commits 60 orders with obx.enqueue() in SQL, plus a payload that is not JSON and
# an order of a tenant the consumer does not serve; the relay publishes them to an exchange
# bound to the consumer's queue and to a tap queue. From the tap, 20 messages are published to
# the consumer's queue a second time (broker duplicates). The consumer runs as a least-privilege
# login role (<prefix>_consumer, granted its consumer ID and tenants) and is restarted while:
#   run 1  crashes after its 7th commit, before acknowledging it (RabbitMQ redelivers);
#   run 2  crashes after its 5th effect, before its commit (the effect is rolled back);
#   run 3  crashes after its 4th commit again;
#   then   runs until idle, every 4th handler call failing (nack, redelivered, retried).
# Checked from the outside, in the database: order_projection has each of the 60 orders once
# (duplicate effects 0), the inbox answered the redeliveries DUPLICATE, the two bad messages
# are parked, the queue is empty at the end.
set -euo pipefail
OBX=${1:?usage: test_example.sh OBX python|node}
lang=${2:?python or node}
root=$(cd "$(dirname "$0")/../.." && pwd)
pg=${OBX_TEST_PG_URL:?OBX_TEST_PG_URL is not set: run scripts/test.sh}
amqp_url=${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set: run scripts/test.sh}
case $lang in
  # Debian's python3, with python3-psycopg2 and python3-pika
  python) cmd=(/usr/bin/python3 "$root/examples/python/consumer.py") ;;
  node)
    [[ -d $root/examples/node/node_modules/amqplib && -d $root/examples/node/node_modules/pg ]] ||
      { echo "FAIL: examples/node/node_modules missing: run npm ci in examples/node (scripts/test.sh does)"; exit 1; }
    cmd=(node "$root/examples/node/consumer.js") ;;
  *) echo "python or node" >&2; exit 2 ;;
esac
tag=ex${lang}$$
T=$(mktemp -d /tmp/obx-example-XXXXXX)
dbname=obx_example_${lang}_$$
base=${pg%/*}
db=$base/$dbname
relay_pid=
role=obx_ex_${lang}_$$
cleanup() {
  [[ -n $relay_pid ]] && kill -9 "$relay_pid" 2>/dev/null || true
  psql -qX "$pg" -c "DROP DATABASE IF EXISTS $dbname WITH (FORCE)" >/dev/null 2>&1 || true
  psql -qX "$pg" -c "DROP ROLE IF EXISTS $role" >/dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.log; do [[ -f $f ]] && { echo "---- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
sqlq() { psql -qXAt "$db" -c "$1"; }

psql -qX "$pg" -c "CREATE DATABASE $dbname" >/dev/null
"$OBX" init --db "$db" --roles obxex >/dev/null
# the consumer's login role: the inbox rows of its consumer ID and tenants, its own table
role=obx_ex_${lang}_$$
psql -qX "$pg" -c "CREATE ROLE $role LOGIN IN ROLE obxex_consumer" >/dev/null
sqlq "INSERT INTO obx.obx_consumer_grant VALUES ('$role', 'order-projection', 'tenant-7'), ('$role', 'order-projection', 'tenant-9')"
sqlq "GRANT CREATE ON SCHEMA public TO $role"
hostport=${base#*://}
hostport=${hostport#*@}
consumer_db=postgres://$role@$hostport/$dbname

# ---- producer (SQL, any language) and relay ----
exchange=obx-$tag queue=obx-$tag-projection tap=obx-$tag-tap
"$OBX" route set order.created.v1 --db "$db" --cluster obx-ex --topic "$exchange" >/dev/null
sqlq "SELECT count(obx.enqueue('order.created.v1', 'order', 'o-' || i, 1,
        CASE WHEN i % 2 = 0 THEN 'tenant-7' ELSE 'tenant-9' END,
        convert_to(format('{\"order\":\"o-%s\",\"total\":%s}', i, i * 100), 'UTF8'),
        correlation_id => 'c-' || i)) FROM generate_series(1, 60) i" >/dev/null
sqlq "SELECT obx.enqueue('order.created.v1', 'order', 'o-bad', 1, 'tenant-7', convert_to('not json', 'UTF8'))" >/dev/null
sqlq "SELECT obx.enqueue('order.created.v1', 'order', 'o-foreign', 1, 'tenant-1', convert_to('{\"order\":\"o-foreign\",\"total\":1}', 'UTF8'))" >/dev/null
# a tap queue on the same exchange (declared as obx declares it: a durable topic exchange)
/usr/bin/python3 - "$amqp_url" "$exchange" "$tap" <<'PY' || fail "declaring the tap queue"
import sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
ch.exchange_declare(sys.argv[2], "topic", durable=True)
ch.queue_declare(sys.argv[3], durable=True)
ch.queue_bind(sys.argv[3], sys.argv[2], "#")
conn.close()
PY
"$OBX" relay --db "$db" --broker "$amqp_url?cluster=obx-ex&declare_exchange=$exchange&declare_queue=$queue" \
  --set relay.poll_ms=20 >"$T/relay.log" 2>&1 &
relay_pid=$!
for _ in $(seq 600); do
  [[ $(sqlq "SELECT count(*) FROM obx.obx_event WHERE state = 'PUBLISHED'") == 62 ]] && break
  sleep 0.1
done
[[ $(sqlq "SELECT count(*) FROM obx.obx_event WHERE state = 'PUBLISHED'") == 62 ]] || fail "relay did not publish 62 events"
kill -TERM "$relay_pid"; wait "$relay_pid" 2>/dev/null || true
relay_pid=
echo "ok: 62 events committed in SQL and published to $exchange"

# ---- 20 broker duplicates: copies from the tap, into the consumer's queue ----
/usr/bin/python3 - "$amqp_url" "$tap" "$queue" <<'PY' || fail "duplicating messages"
import sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
n = 0
for method, props, body in ch.consume(sys.argv[2], inactivity_timeout=2):
    if method is None:
        break
    if n < 20 and (props.headers or {}).get("obx-event-id"):
        ch.basic_publish("", sys.argv[3], body, props)
        n += 1
    ch.basic_ack(method.delivery_tag)
assert n == 20, n
ch.queue_delete(sys.argv[2])
conn.close()
PY
echo "ok: 20 messages published to $queue a second time"

# ---- the consumer, crashed and restarted ----
export OBX_PG_URL=$consumer_db OBX_AMQP_URL=$amqp_url OBX_QUEUE=$queue OBX_IDLE_EXIT_S=3
run() { # run N, extra environment...
  local n=$1
  shift
  set +e
  env "$@" "${cmd[@]}" >"$T/run$n.log" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}
rc=$(run 1 CRASH_AFTER_COMMIT=7)
[[ $rc == 18 ]] || fail "run 1 should crash after its 7th commit (exit $rc)"
rc=$(run 2 CRASH_BEFORE_COMMIT=5)
[[ $rc == 17 ]] || fail "run 2 should crash before its 5th commit (exit $rc)"
rc=$(run 3 CRASH_AFTER_COMMIT=4)
[[ $rc == 18 ]] || fail "run 3 should crash after its 4th commit (exit $rc)"
for n in 4 5 6; do
  rc=$(run $n FAIL_EVERY=4)
  [[ $rc == 0 ]] || fail "run $n exit $rc"
  [[ $(sqlq "SELECT count(DISTINCT event_id) FROM order_projection") == 60 ]] && break
done
echo "ok: consumer crashed after a commit (twice) and before one, restarted; last run: $(tail -1 "$T/run$n.log")"

# ---- from the outside ----
[[ $(sqlq "SELECT count(*) FROM order_projection") == 60 ]] ||
  fail "order_projection has $(sqlq "SELECT count(*) FROM order_projection") rows for 60 orders"
[[ $(sqlq "SELECT count(DISTINCT event_id) FROM order_projection") == 60 ]] || fail "missing orders"
[[ $(sqlq "SELECT count(*) FROM (SELECT event_id FROM order_projection GROUP BY 1 HAVING count(*) > 1) x") == 0 ]] ||
  fail "duplicate effects"
[[ $(sqlq "SELECT sum(total) FROM order_projection") == $((100 * 60 * 61 / 2)) ]] || fail "totals"
echo "ok: 60 orders projected once each: duplicate effects 0"
[[ $(sqlq "SELECT count(*) FROM obx.obx_inbox WHERE outcome = 'APPLIED'") == 60 ]] || fail "receipts"
dups=$(sqlq "SELECT count(*) FROM obx.obx_consume_audit WHERE outcome = 'DUPLICATE'")
[[ $dups -ge 22 ]] || fail "only $dups deliveries answered DUPLICATE (20 broker duplicates + 2 after crashes)"
failed=$(sqlq "SELECT count(*) FROM obx.obx_consume_audit WHERE outcome = 'FAILED' AND detail LIKE 'handler failed: injected%'")
[[ $failed -ge 1 ]] || fail "no injected handler failure was recorded"
echo "ok: $dups deliveries answered DUPLICATE, $failed injected failures retried"
[[ $(sqlq "SELECT count(*) FROM obx.obx_poison WHERE state = 'PARKED' AND last_error LIKE 'handler refused the message as poison: payload is not JSON%'") == 1 ]] ||
  fail "the non-JSON payload is not parked: $(sqlq "SELECT event_id, last_error FROM obx.obx_poison")"
[[ $(sqlq "SELECT count(*) FROM obx.obx_poison WHERE last_error = 'tenant ''tenant-1'' is not served by consumer order-projection'") == 1 ]] ||
  fail "the foreign tenant is not parked: $(sqlq "SELECT event_id, last_error FROM obx.obx_poison")"
echo "ok: the non-JSON payload and the foreign tenant are parked"
# the role saw only its own rows and never the outbox
psql -qXAt "$consumer_db" -c "SELECT count(*) FROM obx.obx_event" >/dev/null 2>&1 &&
  fail "the consumer role can read the outbox"
# nothing is left: a last run gets no message
rc=$(run 9 OBX_IDLE_EXIT_S=2)
[[ $rc == 0 ]] || fail "last run exit $rc"
python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); assert d["delivered"] == 0, d' \
  "$T/run9.log" || fail "the queue still held messages: $(tail -1 "$T/run9.log")"
echo "ok: the queue is empty"
echo "ok: examples/$lang consumer"

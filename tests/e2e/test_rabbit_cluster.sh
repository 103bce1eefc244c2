#!/usr/bin/env bash
# test_rabbit_cluster.sh — a RabbitMQ cluster loses a node (issue 48, item 8): three nodes
# (scripts/rabbit_cluster.sh), a quorum queue, and an AMQP URL that lists the three. Producers
# commit events (obx enqueue into a SQLite outbox), a relay publishes them through the cluster,
# a consumer applies them with the sample projection (its own SQLite database). While they run,
# the node the relay and the consumer are connected to (the URL's first) is killed (SIGKILL of
# its Erlang VM), and started again later. Then, checked from outside obx: every event whose
# enqueue returned has exactly one projection row (0 lost; a message the broker delivered twice
# is absorbed by the inbox), the relay and the consumer kept running and moved to another node.
# Usage: test_rabbit_cluster.sh OBX
set -euo pipefail
OBX=${1:?usage: test_rabbit_cluster.sh OBX}
source "$(dirname "$0")/../support/cluster_fx.sh" rcluster rabbit

rc_start "$T/rabbit" >/dev/null || fail "the RabbitMQ cluster did not start"
db=sqlite:$T/outbox.db
# short confirm timeout and heartbeat: a confirm lost with the node is UNKNOWN for 15 s (the
# quiet time) before the reconciler retries it (docs/amqp.md)
broker="$OBX_RC_URL?cluster=rc&declare_exchange=orders&declare_queue=orders-q&confirm_timeout_ms=5000&heartbeat=5"
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster rc --topic orders >/dev/null 2>&1
fast=(--set connect.retry_initial_ms=100 --set connect.retry_max_ms=1000)
"$OBX" relay --db "$db" --broker "$broker" --set relay.poll_ms=50 --set relay.recheck_ms=1000 \
  "${fast[@]}" >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
printf '{"order":"warm-up"}' | "$OBX" enqueue --db "$db" --type order.created.v1 --tenant tenant-7 \
  --aggregate order/warm-up@1 --idempotency-key warm-up >"$T/ids.warm"
"$OBX" consume --consumer-db "sqlite:$T/projection.db" --broker "$broker" --topic orders-q \
  --consumer projection "${fast[@]}" >"$T/consume.log" 2>&1 &
consumer=$!
pids+=($consumer)

producers a b c # cluster_fx.sh: "KEY ID" for each enqueue that returned
sleep 5
rc_kill 1 || fail "node 1 could not be killed"
echo "node 1 killed" >&2
sleep 8
producers_stop
rc_start_node 1 || fail "node 1 did not start again"
echo "node 1 started again" >&2

n=$(committed)
((n >= 20)) || fail "only $n events committed"
for _ in $(seq 1800); do
  got=$(sqlite3 "$T/projection.db" "SELECT count(DISTINCT event_id) FROM order_projection" 2>/dev/null || echo 0)
  ((got >= n)) && break
  sleep 0.1
done
sqlite3 "$T/projection.db" "SELECT event_id FROM order_projection" | sort >"$T/projected"
missing=$(comm -23 "$T/ids" <(sort -u "$T/projected") | wc -l)
[[ $missing == 0 ]] || bad "$missing of $n committed events never applied (lost)"
twice=$(uniq -d "$T/projected" | wc -l)
[[ $twice == 0 ]] || bad "$twice events applied twice"
"$OBX" status --db "$db" --json >"$T/status.json"
read -r pub unknown < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); s=d["states"]; print(s.get("PUBLISHED",0), d["unknown"]["events"])' "$T/status.json")
echo "$n events committed; $pub PUBLISHED, $unknown UNKNOWN; projection: $(wc -l <"$T/projected") rows; consumer: $(grep -o 'duplicates [0-9]*' "$T/consume.log" | tail -1)" >&2
alive "$relay" "obx relay"
alive "$consumer" "obx consume"
grep -q "broker unreachable\|broker reachable" "$T/relay.log" || echo "note: the relay logged no broker outage" >&2
# the consumer's database (SQLite) never went away: the node's loss is the broker's
grep -q "consumer database" "$T/consume.log" && bad "obx consume blamed its database: $(grep "consumer database" "$T/consume.log" | head -1)"
grep -Eq "broker reachable again after" "$T/consume.log" || bad "obx consume did not log that it reached the broker again"
kill -TERM "$relay" "$consumer"
wait "$relay" || bad "the relay exited $? after SIGTERM"
wait "$consumer" || bad "obx consume exited $? after SIGTERM"
pids=()
[[ $fails == 0 ]] || fail "$fails checks failed"
echo "PASS: test_rabbit_cluster ($n events, 0 lost, 0 applied twice across the loss of a node)"

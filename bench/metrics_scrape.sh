#!/usr/bin/env bash
# metrics_scrape.sh — what one /metrics scrape and one dashboard refresh cost on a big outbox.
#
# Builds an outbox of N events (default 1,000,000) directly in SQL: almost all PUBLISHED with a
# primary receipt, 5,000 PENDING, 100 UNKNOWN (with their attempts), 50 PARKED; and, in the
# same database, a critical consumer whose inbox holds every published event but the newest
# 2,000 and whose consume audit has one row per event. The events are frozen for a cluster the
# relay is not connected to, so the relay only serves HTTP. Then it times SCRAPES scrapes of
# /metrics and of /api/status, and, for comparison, the full-table counts the metrics avoid.
#
# Usage: bench/metrics_scrape.sh OBX postgres|sqlite [N] [SCRAPES]
#   postgres: a fresh database on OBX_TEST_PG_URL (scripts/services.sh starts a private one)
#   KEEP=1 keeps the database (and prints where) to look at query plans afterwards.
set -euo pipefail
OBX=${1:?usage: metrics_scrape.sh OBX postgres|sqlite [N] [SCRAPES]}
kind=${2:?postgres or sqlite}
N=${3:-1000000}
SCRAPES=${4:-30}
dir=$(mktemp -d /tmp/obx-bench-metrics-XXXXXX)
relay=
db=
cleanup() {
  [[ -n $relay ]] && kill -TERM "$relay" 2>/dev/null && wait "$relay" 2>/dev/null
  if [[ -n ${KEEP:-} ]]; then
    echo "kept: $db"
    return 0
  fi
  [[ $db == postgres* ]] && pg_drop_db "$db"
  rm -rf "$dir"
}
trap cleanup EXIT
now=$(($(date +%s%N) / 1000000))
PUB=$((N - 5150))

# The generating SQL is the same for both databases but for a few spellings.
gen_sql() { # PREFIX SERIES_FROM SERIES_TO ...
  local p=$1 lo=$2 hi=$3 series=$4 id=$5 hex=$6
  cat <<SQL
INSERT INTO ${p}obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id, aggregate_version,
  event_type, payload_schema, payload_digest, tenant, occurred_at, created_txid, correlation_id,
  causation_id, traceparent, idempotency_key, envelope_digest, dest_cluster, dest_topic,
  dest_routing_key, dest_algorithm, dest_route_gen, dest_serializer, dest_durability, dest_acks,
  dest_digest, payload, payload_len, created_at)
SELECT $id, 1, 'order', 'o-' || g, 1, 'order.created.v1', 'sha256:' || $hex,
  'sha256:' || $hex, 't1', $now - ($N - g) * 3, 'tx-' || g, 'checkout-' || g, '', '', '',
  'sha256:' || $hex, 'kafka-prod', 'orders', 't1.order.o-' || g, 'murmur2', 1, 'raw',
  'persistent', 'all', 'sha256:' || $hex, '{"order":1}', 11, $now - ($N - g) * 3
FROM $series;
INSERT INTO ${p}obx_event (event_id, tenant, idempotency_key, event_type, correlation_id, order_key,
  envelope_gen, state, claim_gen, owner, lease_until, attempt_gen, attempt_id, pinned_partition,
  rejections, available_at, next_check_at, unknown_since, primary_attempt_id, published_at,
  committed_at, updated_at, max_attempts, blind_retry, unordered, alias, dest_cluster)
SELECT $id, 't1', NULL, 'order.created.v1', 'checkout-' || g, 'kafka-prod/orders/t1.order.o-' || g, 1,
  CASE WHEN g <= $PUB THEN 'PUBLISHED' WHEN g <= $PUB + 5000 THEN 'PENDING'
       WHEN g <= $PUB + 5100 THEN 'DISPATCH_UNKNOWN' ELSE 'PARKED' END,
  1, '', 0, 1, 'att-' || substr($id, 5), 0, 0, 0, 0,
  CASE WHEN g > $PUB + 5000 AND g <= $PUB + 5100 THEN $now - 60000 ELSE 0 END,
  CASE WHEN g <= $PUB THEN 'att-' || substr($id, 5) ELSE '' END,
  CASE WHEN g <= $PUB THEN $now - ($N - g) * 3 + 20 ELSE 0 END,
  $now - ($N - g) * 3, $now, 8, \$false, \$true, 'obx', 'kafka-prod'
FROM $series;
INSERT INTO ${p}obx_receipt (event_id, envelope_gen, attempt_id, kind, cluster, topic, partition,
  "offset", broker_ts, payload_digest, dest_digest, reason, created_at)
SELECT $id, 1, 'att-' || substr($id, 5), 'PRIMARY', 'kafka-prod', 'orders', 0, g, 0,
  'sha256:' || $hex, 'sha256:' || $hex, 'accepted in SENDING', $now - ($N - g) * 3 + 20
FROM $series WHERE g <= $PUB;
INSERT INTO ${p}obx_attempt (attempt_id, event_id, envelope_gen, attempt_gen, claim_gen, owner,
  dest_digest, partition, state, started_at, unknown_at, ended_at, offset_before, quiet_until, detail)
SELECT 'att-' || substr($id, 5), $id, 1, 1, 1, 'relay-x/d0', 'sha256:' || $hex, 0,
  CASE WHEN g <= $PUB + 5100 THEN 'UNKNOWN' ELSE 'REJECTED' END, $now - 61000, $now - 60000, 0, -1, 0,
  CASE WHEN g <= $PUB + 5100 THEN 'UNKNOWN: ack timed out' ELSE 'REJECT: unknown topic' END
FROM $series WHERE g > $PUB + 5000;
INSERT INTO ${p}obx_inbox (consumer_id, event_id, payload_digest, event_type, tenant, outcome, result,
  topic, partition, "offset", consumed_at, duration_us)
SELECT 'proj', $id, 'sha256:' || $hex, 'order.created.v1', 't1', 'APPLIED', 'ok', 'orders', 0, g,
  $now - ($N - g) * 3 + 40, 800
FROM $series WHERE g <= $PUB - 2000;
INSERT INTO ${p}obx_consume_audit (at, consumer_id, event_id, outcome, duration_us, detail)
SELECT $now - ($N - g) * 3 + 40, 'proj', $id, 'APPLIED', 800, 'ok' FROM $series WHERE g <= $PUB - 2000;
INSERT INTO ${p}obx_consumer_watermark (consumer_id, topic, partition, "offset", event_id, occurred_at,
  committed_at) VALUES ('proj', 'orders', 0, $((PUB - 2000)), 'evt-x', 0, $now - 6000)
  ON CONFLICT DO NOTHING;
SQL
}

t0=$(date +%s)
if [[ $kind == postgres ]]; then
  source "$(dirname "$0")/../tests/e2e/pgdb.sh"
  db=$(pg_fresh_db)
  "$OBX" init --db "$db" >/dev/null
  for ((lo = 1; lo <= N; lo += 250000)); do
    hi=$((lo + 249999 < N ? lo + 249999 : N))
    gen_sql obx. "$lo" "$hi" "generate_series($lo, $hi) AS g" \
      "'evt-' || lpad(g::text, 26, '0')" "md5(g::text) || md5(g::text)" |
      sed "s/\$false/false/; s/\$true/true/" | psql -q -v ON_ERROR_STOP=1 "$db" >/dev/null
  done
  psql -q "$db" -c 'ANALYZE' >/dev/null
  size=$(psql -qAt "$db" -c "SELECT pg_size_pretty(pg_database_size(current_database()))")
  naive() { psql -qAt "$db" -c '\timing on' -c "$1" | awk '/^Time:/ { print $2 }'; }
else
  db=sqlite:$dir/outbox.db
  "$OBX" init --db "$db" >/dev/null
  gen_sql "" 1 "$N" "(WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < $N) SELECT g FROM s)" \
    "'evt-' || substr('00000000000000000000000000' || g, -26)" "hex(randomblob(32))" |
    sed "s/\$false/0/; s/\$true/1/" | sqlite3 "$dir/outbox.db"
  sqlite3 "$dir/outbox.db" 'ANALYZE'
  size=$(du -h "$dir/outbox.db" | cut -f1)
  naive() {
    local t1 t2
    t1=$(date +%s%N)
    sqlite3 "$dir/outbox.db" "$1" >/dev/null
    t2=$(date +%s%N)
    echo "$(((t2 - t1) / 1000000))"
  }
fi
echo "$kind: $N events generated in $(($(date +%s) - t0)) s (database $size)"

"$OBX" relay --db "$db" --broker "log:$dir/broker.db" --http 127.0.0.1:0 \
  --set relay.dispatchers=1 --set relay.reconciler=false --set audit.critical_consumers="proj=$db" --set log.level=info \
  >"$dir/relay.log" 2>&1 &
relay=$!
port=
for _ in $(seq 200); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$dir/relay.log" | grep -o '[0-9]*$' || true)
  [[ -n $port ]] && break
  sleep 0.05
done
[[ -n $port ]] || { cat "$dir/relay.log"; exit 1; }

measure() { # PATH: prints p50 / p99 / max in ms over SCRAPES requests (after one warm-up)
  curl -s -o /dev/null "http://127.0.0.1:$port$1"
  for ((i = 0; i < SCRAPES; i++)); do
    curl -s -o /dev/null -w '%{time_total}\n' "http://127.0.0.1:$port$1"
    sleep 0.2
  done | sort -n | awk '{ v[NR] = $1 * 1000 } END {
    printf "p50 %.1f ms, p99 %.1f ms, max %.1f ms", v[int(NR * 0.5 + 0.5)], v[int(NR * 0.99 + 0.5)], v[NR] }'
}
echo "/metrics     $(measure /metrics)"
echo "/api/status  $(measure /api/status)"
curl -s "http://127.0.0.1:$port/metrics" >"$dir/metrics.txt"
grep -E '^obx_(scrape_duration_seconds|stats_age_seconds|events\{state="PUBLISHED"\}|consumer_lag_events|consumer_lag_seconds)' "$dir/metrics.txt" | sed 's/^/  /'
if [[ $kind == postgres ]]; then p=obx.; else p=; fi
echo "for comparison, the full-table queries a scrape does not run:"
echo "  count by state            $(naive "SELECT state, count(*) FROM ${p}obx_event GROUP BY state") ms"
echo "  receipts by kind          $(naive "SELECT kind, count(*) FROM ${p}obx_receipt GROUP BY kind") ms"
echo "  unconsumed (anti-join)    $(naive "SELECT count(*) FROM ${p}obx_event e WHERE e.state = 'PUBLISHED' AND NOT EXISTS (SELECT 1 FROM ${p}obx_inbox i WHERE i.consumer_id = 'proj' AND i.event_id = e.event_id)") ms"
echo "  handler durations (all)   $(naive "SELECT count(*), sum(duration_us) FROM ${p}obx_consume_audit WHERE outcome = 'APPLIED'") ms"

#!/usr/bin/env bash
# test_series_restart.sh — the dashboard's charts survive a relay restart (issue 50, item 10):
#   1. a relay with the dashboard (a sample every 200 ms, a window of 600 samples, 2 min) and a critical
#      consumer publishes a burst of orders; /api/series has the rates, the backlog and the
#      consumer's lag;
#   2. the relay stops and another starts on the same outbox: its first /api/series already holds
#      the earlier samples (their times and values, the consumer's lag series too), read back
#      from the outbox (obx_series), and its first own sample has a published rate (taken from
#      the last kept sample's totals, not left a gap);
#   3. the kept rows stay within the window (the older ones deleted as the relay writes), and
#      the read is a range of the table's primary key, never a scan (the query plan).
# Usage: test_series_restart.sh OBX [sqlite|pg]
set -euo pipefail
OBX=${1:?usage: test_series_restart.sh OBX [sqlite|pg]}
mode=${2:-sqlite}
source "$(dirname "$0")/../support/prologue.sh" series
sql() {
  if [[ $mode == pg ]]; then psql "$db" -Atqc "$1"; else sqlite3 "${db#sqlite:}" "$1"; fi
}

use_store "$mode" || fail "no PostgreSQL database"
cdb=sqlite:$T/c.db
"$OBX" init --db "$db" >/dev/null
"$OBX" init --db "$cdb" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null

# start_relay NAME — a relay with the dashboard; sets $relay (its PID) and $base
start_relay() {
  "$OBX" relay --db "$db" --broker "log:$T/b.db" --id "$1" --http 127.0.0.1:0 \
    --set relay.poll_ms=20 --set http.series_interval_ms=200 --set http.series_points=600 \
    --set audit.critical_consumers=proj="$cdb" >"$T/$1.log" 2>&1 &
  relay=$!
  pids+=($relay)
  local port
  port=$(http_addr "$T/$1.log" 10) || fail "relay $1 did not start its HTTP server"
  base=http://${port}
}

# 1. samples of a burst
start_relay r1
for i in $(seq 20); do
  echo "{\"order\":\"o-$i\"}" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$i@1" --tenant t1 >/dev/null
  sleep 0.05
done
ok=
for _ in $(seq 200); do
  curl -sf "$base/api/series" >"$T/s1.json" || fail "/api/series"
  if jq -e '(.t | length) >= 20 and ([.published_per_s[] | select(. != null and . > 0)] | length) > 0
            and .backlog[-1] == 0 and .consumers[0].consumer_id == "proj"
            and (.consumers[0].lag_events[-1] // 0) > 0' "$T/s1.json" >/dev/null; then
    ok=1
    break
  fi
  sleep 0.1
done
[[ -n $ok ]] || fail "no samples of the burst: $(jq -c '{t: (.t|length), published_per_s, backlog}' "$T/s1.json")"
kill -TERM "$relay"
wait "$relay" || true
n1=$(jq '.t | length' "$T/s1.json")
echo "relay r1: $n1 samples, published/s up to $(jq '[.published_per_s[] | select(. != null)] | max' "$T/s1.json")"

# 2. another relay on the same outbox: the earlier samples are there at once
started=$(now_ms)
start_relay r2
got=
for _ in $(seq 100); do
  if curl -sf "$base/api/series" >"$T/s2.json" && jq -e '.t | length > 0' "$T/s2.json" >/dev/null; then
    got=1
    break
  fi
  sleep 0.05
done
[[ -n $got ]] || fail "relay r2: /api/series empty"
kill -TERM "$relay"
wait "$relay" || true
# the samples of r1 that r2 shows, matched by time: every one from r2's oldest on (all of them,
# unless r2 started so late that the oldest left the 2 min window), with the same values (every
# sample is kept in a slot of its own)
jq -n --slurpfile a "$T/s1.json" --slurpfile b "$T/s2.json" --argjson started "$started" '
  ($a[0]) as $a | ($b[0]) as $b
  | [range($b.t | length) as $j | {key: ($b.t[$j] | tostring), value: $j}] | from_entries as $at
  | [range($a.t | length) as $i | select($at[$a.t[$i] | tostring] != null)
     | {i: $i, j: $at[$a.t[$i] | tostring]}] as $m
  | {matched: ($m | length), of: ([$a.t[] | select(. >= $b.t[0])] | length),
     same_values: all($m[]; ($a.published_per_s[.i] == $b.published_per_s[.j]) and
                            ($a.backlog[.i] == $b.backlog[.j]) and
                            ($a.consumers[0].lag_events[.i] == $b.consumers[0].lag_events[.j])),
     consumer: $b.consumers[0].consumer_id,
     before_start: ([$b.t[] | select(. * 1000 < $started)] | length),
     first_own_rate: ([range($b.t | length) as $j | select($b.t[$j] * 1000 >= $started)
                       | $b.published_per_s[$j]] | first)}' >"$T/cmp.json"
jq -c . "$T/cmp.json"
jq -e '.matched == .of and .matched >= 20 and .before_start >= .matched' "$T/cmp.json" >/dev/null ||
  fail "relay r2 lost r1's samples: $(jq -c . "$T/cmp.json")"
jq -e '.same_values and .consumer == "proj"' "$T/cmp.json" >/dev/null ||
  fail "relay r2's samples differ from r1's: $(jq -c . "$T/cmp.json")"
jq -e '.first_own_rate != null' "$T/cmp.json" >/dev/null ||
  fail "relay r2's first sample has no published rate: $(jq -c . "$T/cmp.json")"

# 3. bounded: the rows stay within the window; the read is a range of the primary key
tbl=obx_series
[[ $mode == pg ]] && tbl=obx.obx_series
rows=$(sql "SELECT count(*) FROM $tbl")
((rows <= 601)) || fail "obx_series holds $rows rows, window 600"
if [[ $mode == pg ]]; then
  plan=$(sql "SET enable_seqscan = off; EXPLAIN SELECT slot, at, sample FROM obx.obx_series WHERE slot >= 0 ORDER BY slot LIMIT 600")
  grep -q 'obx_series_pkey' <<<"$plan" && ! grep -q 'Seq Scan' <<<"$plan" || fail "plan: $plan"
else
  plan=$(sql "EXPLAIN QUERY PLAN SELECT slot, at, sample FROM obx_series WHERE slot >= 0 ORDER BY slot LIMIT 600")
  grep -q 'SEARCH obx_series USING INTEGER PRIMARY KEY' <<<"$plan" || fail "plan: $plan"
fi
echo "ok: $rows rows kept; plan: $(tr '\n' ' ' <<<"$plan")"

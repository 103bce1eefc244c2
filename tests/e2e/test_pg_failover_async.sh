#!/usr/bin/env bash
# test_pg_failover_async.sh — a failover to an asynchronous standby that lost commits (issue 48,
# item 7): the broker holds events the promoted outbox never committed, and obx audit reports
# them (finding bypass: messages on the broker this outbox never committed), never passing over
# them in silence. Deterministic: the standby is stopped, events are committed on the primary
# alone and published, the primary is killed, and the standby (which never saw them) is started
# and promoted. The relay goes on against the promoted standby.
# Usage: test_pg_failover_async.sh OBX   (OBX_PG_BIN: the server binaries, with obx_pg installed)
set -euo pipefail
OBX=${1:?usage: test_pg_failover_async.sh OBX}
source "$(dirname "$0")/../support/cluster_fx.sh" foasync pg
OBX_FO_SYNC=0 pgfo_start "$T/pg" >/dev/null || fail "the primary and standby did not start"
psql -XAtq "$OBX_FO_PRIMARY_URL" -c "CREATE DATABASE outbox" >/dev/null
db=$OBX_FO_URL_BASE/outbox?target_session_attrs=read-write
broker=log:$T/broker.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null 2>&1
enqueue() { # KEY: the event's ID on stdout
  printf '{"order":"%s"}' "$1" | "$OBX" enqueue --db "$db" --type order.created.v1 --tenant tenant-7 \
    --aggregate "order/$1@1" --idempotency-key "$1"
}
"$OBX" relay --db "$db" --broker "$broker" --set relay.poll_ms=50 --set connect.retry_initial_ms=100 \
  --set connect.retry_max_ms=500 >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
published() { # ID: on the broker
  for _ in $(seq 100); do
    [[ $(sqlite3 "$T/broker.db" "SELECT count(*) FROM obx_log_msg WHERE event_id = '$1'" 2>/dev/null) == 1 ]] && return 0
    sleep 0.1
  done
  return 1
}
kept=$(enqueue kept)
published "$kept" || fail "the first event was not published"
# replicated: the standby has everything so far
for _ in $(seq 100); do
  lag=$(psql -XAtq "$OBX_FO_PRIMARY_URL" -c "SELECT pg_current_wal_lsn() = replay_lsn FROM pg_stat_replication") || true
  [[ $lag == t ]] && break
  sleep 0.1
done
[[ $lag == t ]] || fail "the standby did not catch up"
pgfo_stop_standby || fail "the standby did not stop"
lost=()
for k in lost-1 lost-2 lost-3; do lost+=("$(enqueue $k)"); done
for id in "${lost[@]}"; do published "$id" || fail "$id (committed on the primary alone) was not published"; done
pgfo_kill_primary || fail "the primary did not stop"
pgfo_start_standby || fail "the standby did not start again"
pgfo_promote || fail "the standby was not promoted"
after=$(enqueue after)
published "$after" || bad "the relay did not publish an event committed on the promoted standby"
# the promoted outbox never committed the lost events
n=$(psql -XAtq "$OBX_FO_URL_BASE/outbox?target_session_attrs=read-write&connect_timeout=3" \
  -c "SELECT count(*) FROM obx.obx_event WHERE event_id IN ('${lost[0]}','${lost[1]}','${lost[2]}')")
[[ $n == 0 ]] || fail "the promoted standby has $n of the lost events: nothing was lost"
"$OBX" audit --db "$db" --broker "$broker" --json >"$T/audit.json" 2>"$T/audit.err" || true
python3 - "$T/audit.json" "${lost[@]}" <<'PY' || bad "audit: $(head -c 600 "$T/audit.json") $(cat "$T/audit.err")"
import json, sys
d = json.load(open(sys.argv[1]))
lost = set(sys.argv[2:])
f = [f for f in d["findings"] if f["kind"] == "bypass"]
assert f, "no bypass finding"
named = set(f[0]["event_ids"])
assert lost <= named, ("not named", lost - named)
assert f[0]["count"] == len(lost), f[0]["count"]
assert "lost by a failover" in f[0]["detail"], f[0]["detail"]
PY
kill -0 "$relay" 2>/dev/null || bad "the relay exited"
[[ $fails == 0 ]] || fail "$fails checks failed"
echo "PASS: test_pg_failover_async (3 events lost with the primary, on the broker, reported by obx audit as bypass)"

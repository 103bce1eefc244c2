#!/usr/bin/env bash
# test_pg_failover.sh — PostgreSQL failover (issue 48, item 7): a primary and a synchronous
# streaming standby (scripts/pg_failover.sh); the outbox and a consumer's inbox are databases of
# that pair, named by libpq multi-host URLs with target_session_attrs=read-write. Producers commit
# events (obx enqueue, each with an idempotency key, retried with it while the database is gone),
# a relay publishes them to a log broker, two consumers apply them: one with the sample order
# projection in its own SQLite database, one whose inbox is on the failing pair (--exec). The
# primary is killed with `pg_ctl -m immediate` while they run and the standby is promoted.
# Then, checked from outside obx: every event whose enqueue returned is on the broker, has
# exactly one row in the projection and one inbox row of the PostgreSQL consumer; the relay and
# both consumers kept running (one reconnected to the new primary) and events were committed on
# the new primary too.
# Mode vanish: the primary first vanishes from the network (iptables drops its packets: nothing
# refuses, nothing answers, as when its machine is lost), then is killed; the relay and the
# consumer must notice within the store's tcp_user_timeout and move to the promoted standby.
# Usage: test_pg_failover.sh OBX [kill|vanish]   (OBX_PG_BIN: the server binaries, with obx_pg
#        installed; vanish: root, iptables)
set -euo pipefail
OBX=${1:?usage: test_pg_failover.sh OBX [kill|vanish]}
mode=${2:-kill}
source "$(dirname "$0")/../support/cluster_fx.sh" failover pg

pgfo_start "$T/pg" >/dev/null || fail "the primary and standby did not start"
psql -XAtq "$OBX_FO_PRIMARY_URL" -c "CREATE DATABASE outbox" -c "CREATE DATABASE inbox" >/dev/null
q='?target_session_attrs=read-write'
qp="$q&connect_timeout=3" # psql's: libpq has no connect_timeout of its own (obx sets one)
db=$OBX_FO_URL_BASE/outbox$q
cdb=$OBX_FO_URL_BASE/inbox$q
broker=log:$T/broker.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null 2>&1
fast=(--set connect.retry_initial_ms=100 --set connect.retry_max_ms=500)

"$OBX" relay --db "$db" --broker "$broker" --http 127.0.0.1:0 --set relay.poll_ms=50 "${fast[@]}" \
  >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
# one event first: the topic exists before the consumers subscribe
printf '{"order":"warm-up"}' | "$OBX" enqueue --db "$db" --type order.created.v1 --tenant tenant-7 \
  --aggregate order/warm-up@1 --idempotency-key warm-up >"$T/ids.warm"
for _ in $(seq 100); do
  [[ $(sqlite3 "$T/broker.db" "SELECT count(*) FROM obx_log_msg" 2>/dev/null) -ge 1 ]] && break
  sleep 0.1
done
cat >"$T/handler.sh" <<SH
#!/bin/sh
cat >/dev/null
echo "\$OBX_EVENT_ID" >>"$T/effects"
SH
chmod +x "$T/handler.sh"
"$OBX" consume --consumer-db "sqlite:$T/projection.db" --broker "$broker" --topic orders \
  --consumer projection >"$T/consume-projection.log" 2>&1 &
cproj=$!
pids+=($cproj)
"$OBX" consume --consumer-db "$cdb" --broker "$broker" --topic orders --consumer pgc \
  --exec "$T/handler.sh" "${fast[@]}" >"$T/consume-pg.log" 2>&1 &
cpg=$!
pids+=($cpg)

# six producers (cluster_fx.sh): "KEY ID PHASE" lines for the events whose enqueue returned
echo before >"$T/phase"
producers a b c d e f
sleep 4
if [[ $mode == vanish ]]; then
  pgfo_cut_primary || fail "iptables could not cut the primary off"
  echo "primary cut off (iptables)" >&2
fi
pgfo_kill_primary || fail "pg_ctl -m immediate stop failed"
echo "primary killed (immediate)" >&2
echo during >"$T/phase"
sleep 1
pgfo_promote || fail "the standby was not promoted"
echo after >"$T/phase"
echo "standby promoted" >&2
# vanish: each new connection first waits out connect_timeout (10 s) on the lost host
[[ $mode == vanish ]] && sleep 25 || sleep 5
producers_stop

n=$(committed)
n_after=$(cat "$T"/ids-* | awk '$3 == "after"' | wc -l)
((n >= 20)) || fail "only $n events committed"
((n_after >= 1)) || fail "no event committed on the promoted standby"
dup_keys=$(cat "$T"/ids-* | awk '{print $1}' | sort | uniq -d | wc -l)
[[ $dup_keys == 0 ]] || bad "$dup_keys idempotency keys returned twice"
echo "$n events committed ($n_after after the promotion)" >&2

# every committed event: on the broker, in the projection once, in the PostgreSQL inbox
for _ in $(seq 1200); do
  done_proj=$(sqlite3 "$T/projection.db" "SELECT count(DISTINCT event_id) FROM order_projection" 2>/dev/null || echo 0)
  done_pg=$(sort -u "$T/effects" 2>/dev/null | wc -l)
  ((done_proj >= n && done_pg >= n)) && break
  sleep 0.1
done
sqlite3 "$T/broker.db" "SELECT DISTINCT event_id FROM obx_log_msg WHERE topic = 'orders'" | sort >"$T/on_broker"
missing=$(comm -23 "$T/ids" "$T/on_broker" | wc -l)
[[ $missing == 0 ]] || bad "$missing of $n committed events are not on the broker: $(comm -23 "$T/ids" "$T/on_broker" | head -3)"
sqlite3 "$T/projection.db" "SELECT event_id FROM order_projection" | sort >"$T/projected"
missing=$(comm -23 "$T/ids" <(sort -u "$T/projected") | wc -l)
[[ $missing == 0 ]] || bad "$missing of $n committed events not in the projection"
twice=$(uniq -d "$T/projected" | wc -l)
[[ $twice == 0 ]] || bad "$twice events applied twice by the projection"
psql -XAtq "$OBX_FO_URL_BASE/inbox$qp" -c "SELECT event_id FROM obx.obx_inbox WHERE consumer_id = 'pgc' AND outcome = 'APPLIED'" |
  sort >"$T/pg_inbox"
missing=$(comm -23 "$T/ids" <(sort -u "$T/pg_inbox") | wc -l)
[[ $missing == 0 ]] || bad "$missing of $n committed events not applied in the PostgreSQL consumer's inbox"
missing=$(comm -23 "$T/ids" <(sort -u "$T/effects") | wc -l)
[[ $missing == 0 ]] || bad "$missing of $n committed events never reached the PostgreSQL consumer's handler"
extra=$(comm -13 "$T/ids" "$T/on_broker" | wc -l)
if ((extra)); then # committed, though the enqueue that wrote it did not return: which keys?
  list=$(comm -13 "$T/ids" "$T/on_broker" | sed "s/.*/'&'/" | paste -sd,)
  psql -XAtq "$OBX_FO_URL_BASE/outbox$qp" -c "SELECT event_id || ' key ' || coalesce(idempotency_key, '-') FROM obx.obx_event WHERE event_id IN ($list)" >&2 || true
fi
echo "broker: $(wc -l <"$T/on_broker") events ($(sqlite3 "$T/broker.db" "SELECT count(*) FROM obx_log_msg") messages; $extra events whose enqueue did not return); projection: $(wc -l <"$T/projected") rows; PostgreSQL inbox: $(wc -l <"$T/pg_inbox") applied" >&2

alive "$relay" "obx relay"
alive "$cproj" "obx consume (projection)"
alive "$cpg" "obx consume (PostgreSQL inbox)"
# (vanish: a relay thread whose read found its connection gone may reconnect within the call,
# with nothing to log)
if [[ $mode == kill ]]; then
  grep -q "database unreachable" "$T/relay.log" || bad "the relay did not log the outage"
  grep -Eq "database reachable again after [0-9.]+ s" "$T/relay.log" || bad "the relay did not log that it got through again"
fi
grep -Eq "reachable again after [0-9.]+ s" "$T/consume-pg.log" || bad "the PostgreSQL consumer did not log that it got through again"
psql -XAtq "$OBX_FO_URL_BASE/outbox$qp" -c "SELECT inet_server_port()" | grep -qx "$OBX_FO_STANDBY_PORT" ||
  bad "the multi-host URL does not reach the promoted standby"
kill -TERM "$relay" "$cproj" "$cpg"
wait "$relay" || bad "the relay exited $? after SIGTERM"
wait "$cproj" || bad "obx consume (projection) exited $? after SIGTERM"
wait "$cpg" || bad "obx consume (PostgreSQL inbox) exited $? after SIGTERM"
pids=()
[[ $fails == 0 ]] || fail "$fails checks failed"
echo "PASS: test_pg_failover ($n events, every one published and applied once across the failover)"

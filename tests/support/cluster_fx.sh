#!/usr/bin/env bash
# cluster_fx.sh — the start the tests on a PostgreSQL failover pair or a RabbitMQ cluster share
# (test_pg_failover.sh, test_pg_failover_async.sh, test_rabbit_cluster.sh), written once. A test
# sources it right after `set -euo pipefail` and reading its obx binary into OBX:
#   source "$(dirname "$0")/../support/cluster_fx.sh" NAME pg|rabbit
# and gets all of prologue.sh (T, pids, fail, bad, fails, on_exit, ... KEEP=1 keeps $T), and:
#   root          the source tree
#   pg: scripts/pg_failover.sh (pgfo_*), $T readable by the server's user; rabbit:
#       scripts/rabbit_cluster.sh (rc_*). At exit $T/stop is touched (the producers end), then
#       the pair or the cluster is stopped
#   alive PID WHAT    bad "WHAT exited" unless PID still runs
#   producers P...    starts producer P for each P in the background (PIDs in producers and pids):
#                     it enqueues order.created.v1 events P-1, P-2, ... into $db (tenant-7,
#                     aggregate order/P-i@1, idempotency key P-i) until $T/stop; an enqueue that
#                     fails is tried again with the same key (it may have committed), so each key
#                     is one event; for each enqueue that returned, a line "KEY ID [PHASE]" in
#                     $T/ids-P (PHASE: what $T/phase holds then, when it exists)
#   producers_stop    touches $T/stop and waits for the producers
#   committed         $T/ids := the IDs of every event whose enqueue returned (the producers' and
#                     $T/ids.warm's), sorted; prints how many
source "$(dirname "${BASH_SOURCE[0]}")/prologue.sh" "${1:?usage: source cluster_fx.sh NAME pg|rabbit}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
on_exit touch "$T/stop"
case ${2:?usage: source cluster_fx.sh NAME pg|rabbit} in
  pg)
    chmod 755 "$T"
    source "$root/scripts/pg_failover.sh"
    on_exit pgfo_stop
    ;;
  rabbit)
    source "$root/scripts/rabbit_cluster.sh"
    on_exit rc_stop
    ;;
esac
alive() { kill -0 "$1" 2>/dev/null || bad "$2 exited"; }
producer() {
  local p=$1 i=0 id
  while [[ ! -e $T/stop ]]; do
    i=$((i + 1))
    while [[ ! -e $T/stop ]]; do
      if id=$(printf '{"order":"%s-%d"}' "$p" "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
        --tenant tenant-7 --aggregate "order/$p-$i@1" --idempotency-key "$p-$i" 2>>"$T/producer-$p.err"); then
        echo "$p-$i $id $(cat "$T/phase" 2>/dev/null)" >>"$T/ids-$p"
        break
      fi
      sleep 0.1
    done
  done
}
producers=()
producers() {
  local p
  for p in "$@"; do
    producer "$p" &
    producers+=($!)
    pids+=($!)
  done
}
producers_stop() {
  local p
  touch "$T/stop"
  for p in "${producers[@]}"; do wait "$p" || true; done
}
committed() {
  { awk '{print $2}' "$T"/ids-*; cat "$T/ids.warm"; } | sort -u >"$T/ids"
  wc -l <"$T/ids"
}

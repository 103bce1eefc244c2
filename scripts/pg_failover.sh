#!/usr/bin/env bash
# scripts/pg_failover.sh — a PostgreSQL primary and a synchronous streaming standby on this
# machine, for failover tests (tests/e2e/test_pg_failover.sh; docs/reliability.md, "PostgreSQL
# failover"). Source it, then:
#   pgfo_start DIR        initdb a primary, pg_basebackup a standby (application_name standby1),
#                         start both on free ports from OBX_FO_PORT (default OBX_SVC_PG_PORT + 20)
#                         and wait until the standby is synchronous; exports OBX_FO_DIR,
#                         OBX_FO_PRIMARY_PORT, OBX_FO_STANDBY_PORT, OBX_FO_PRIMARY_URL (the
#                         primary's postgres database) and OBX_FO_URL_BASE (both hosts, libpq's
#                         multi-host form: append /DB?target_session_attrs=read-write)
#                         OBX_FO_SYNC=0: the standby is asynchronous (a commit does not wait
#                         for it)
#   pgfo_stop_standby     the standby stopped (fast): the primary goes on alone (asynchronous
#                         only: a synchronous primary would wait for it)
#   pgfo_start_standby    the standby started again; it replays what it has and, while the
#                         primary is gone, stays a standby until pgfo_promote
#   pgfo_kill_primary     the primary stopped with `pg_ctl -m immediate` (as a crash: no
#                         shutdown checkpoint, clients cut off)
#   pgfo_cut_primary      the primary vanishes from the network: iptables drops every packet
#                         to and from its port (as a machine lost: nothing refuses a connection,
#                         nothing answers a statement); tagged rules, removed by pgfo_stop
#   pgfo_promote          the standby promoted (`pg_ctl promote`), waiting until it accepts
#                         writes
#   pgfo_stop             both servers stopped (immediate) and DIR removed
# By node (NODE: primary or standby, the data directory's name, i.e. its role at pgfo_start;
# the chaos soak swaps the roles on each failover):
#   pgfo_node_kill NODE   NODE stopped with `-m immediate` (pgfo_kill_primary is NODE primary)
#   pgfo_node_start NODE  NODE started again on its data (after a crash), keeping its role
#   pgfo_promote NODE     NODE promoted (pgfo_promote alone: the standby); it then waits for no
#                         synchronous standby until pgfo_rebuild gives it one
#   pgfo_rebuild NODE     NODE's data replaced by a base backup of the other node (the primary
#                         now), NODE started as its standby (application_name standby1) and,
#                         unless OBX_FO_SYNC=0, made the primary's synchronous standby
# OBX_FO_PG_OPTS: more server options for every node (`-c max_connections=200`).
# The servers are the binaries of OBX_PG_BIN (default Debian's PostgreSQL 15), run as the
# postgres user like scripts/services.sh's; the primary alone has synchronous_standby_names
# (on the command line, so that the promoted standby, which has no standby of its own, does not
# wait for one); fsync is off (a killed process loses nothing the kernel has, and these tests
# kill processes, not machines).
# By hand: scripts/pg_failover.sh start DIR | kill DIR [NODE] | cut DIR | promote DIR [NODE] |
# restart DIR NODE | rebuild DIR NODE | stop DIR (the commands after start read DIR/ports.env)
FO_PG_BIN=${OBX_PG_BIN:-/usr/lib/postgresql/15/bin}

fo_as_pg() { su postgres -s /bin/sh -c "$1"; }

# fo_free_port VAR: the first port from ${!VAR} on that no TCP socket uses, exported into VAR.
fo_free_port() {
  local var=$1 p=${!1} hex
  for ((; p < ${!1} + 200; p++)); do
    printf -v hex ':%04X' "$p"
    awk -v p="$hex" 'substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null || { printf -v "$var" '%d' "$p"; export "${var?}"; return 0; }
  done
  echo "pg_failover: no free port from ${!1}" >&2
  return 1
}

fo_node_start() { # NAME PORT EXTRA
  local d=$OBX_FO_DIR
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$d/$1' -l '$d/$1.log' -o '-p $2 -k $d/sock -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off -c wal_level=replica -c max_wal_senders=5 -c hot_standby=on -c wal_keep_size=256MB ${OBX_FO_PG_OPTS:-} $3' -w -t 60 start >/dev/null"
}

fo_port() { [[ $1 == primary ]] && echo "$OBX_FO_PRIMARY_PORT" || echo "$OBX_FO_STANDBY_PORT"; }
fo_other() { [[ $1 == primary ]] && echo standby || echo primary; }
fo_sql() { psql -XAtq "postgres://postgres@127.0.0.1:$1/postgres" -c "$2"; }

# fo_wait_standby PORT WANT: until the primary on PORT has standby1 in sync_state WANT (30 s).
fo_wait_standby() {
  local state=
  for _ in $(seq 300); do
    state=$(fo_sql "$1" "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'" 2>/dev/null) || true
    [[ $state == "$2" ]] && return 0
    sleep 0.1
  done
  echo "pg_failover: the standby is not $2 ('$state')" >&2
  return 1
}

pgfo_start() {
  export OBX_FO_DIR=${1:?pgfo_start DIR}
  export OBX_FO_PRIMARY_PORT=${OBX_FO_PORT:-$((${OBX_SVC_PG_PORT:-25432} + 20))}
  fo_free_port OBX_FO_PRIMARY_PORT || return 1
  export OBX_FO_STANDBY_PORT=$((OBX_FO_PRIMARY_PORT + 1))
  fo_free_port OBX_FO_STANDBY_PORT || return 1
  mkdir -p "$OBX_FO_DIR/sock"
  chown -R postgres:postgres "$OBX_FO_DIR"
  local d=$OBX_FO_DIR p=$OBX_FO_PRIMARY_PORT s=$OBX_FO_STANDBY_PORT
  fo_as_pg "$FO_PG_BIN/initdb -D '$d/primary' -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >'$d/initdb.log' 2>&1" ||
    { cat "$d/initdb.log" >&2; return 1; }
  local sync="-c synchronous_standby_names=standby1 -c synchronous_commit=on"
  [[ ${OBX_FO_SYNC:-1} == 0 ]] && sync=""
  fo_node_start primary "$p" "$sync" ||
    { cat "$d/primary.log" >&2; return 1; }
  fo_as_pg "$FO_PG_BIN/pg_basebackup -h 127.0.0.1 -p $p -U postgres -D '$d/standby' -R -X stream >'$d/basebackup.log' 2>&1" ||
    { cat "$d/basebackup.log" >&2; return 1; }
  fo_as_pg "echo \"primary_conninfo = 'host=127.0.0.1 port=$p user=postgres application_name=standby1'\" >>'$d/standby/postgresql.auto.conf'"
  fo_node_start standby "$s" "" || { cat "$d/standby.log" >&2; return 1; }
  local want=sync
  [[ ${OBX_FO_SYNC:-1} == 0 ]] && want=async
  fo_wait_standby "$p" $want || return 1
  # also in postgresql.auto.conf, for a restart on its data (pgfo_node_start) after a crash
  [[ $want == sync ]] && { fo_sql "$p" "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" >/dev/null || return 1; }
  printf 'OBX_FO_PRIMARY_PORT=%s\nOBX_FO_STANDBY_PORT=%s\n' "$p" "$s" >"$d/ports.env"
  export OBX_FO_PRIMARY_URL="postgres://postgres@127.0.0.1:$p/postgres"
  export OBX_FO_URL_BASE="postgres://postgres@127.0.0.1:$p,127.0.0.1:$s"
  echo "pg_failover: primary on 127.0.0.1:$p, ${want}hronous standby on 127.0.0.1:$s"
}

pgfo_stop_standby() {
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$OBX_FO_DIR/standby' -m fast -w stop >/dev/null 2>&1"
}

pgfo_start_standby() {
  fo_node_start standby "$OBX_FO_STANDBY_PORT" "" || { cat "$OBX_FO_DIR/standby.log" >&2; return 1; }
}

pgfo_kill_primary() { pgfo_node_kill primary; }

pgfo_node_kill() {
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$OBX_FO_DIR/${1:?NODE}' -m immediate -w stop >/dev/null 2>&1"
}

pgfo_node_start() {
  fo_node_start "${1:?NODE}" "$(fo_port "$1")" "" || { tail -n 20 "$OBX_FO_DIR/$1.log" >&2; return 1; }
}

pgfo_rebuild() {
  local n=${1:?NODE} d=$OBX_FO_DIR o op
  o=$(fo_other "$n")
  op=$(fo_port "$o")
  [[ -f $d/$n/postmaster.pid ]] && pgfo_node_kill "$n"
  rm -rf "${d:?}/$n"
  # -c fast: the backup's checkpoint at once, not spread over minutes of checkpoint_timeout
  fo_as_pg "$FO_PG_BIN/pg_basebackup -h 127.0.0.1 -p $op -U postgres -D '$d/$n' -R -X stream -c fast >'$d/basebackup.log' 2>&1" ||
    { cat "$d/basebackup.log" >&2; return 1; }
  fo_as_pg "echo \"primary_conninfo = 'host=127.0.0.1 port=$op user=postgres application_name=standby1'\" >>'$d/$n/postgresql.auto.conf'"
  pgfo_node_start "$n" || return 1
  [[ ${OBX_FO_SYNC:-1} == 0 ]] && { fo_wait_standby "$op" async; return; }
  fo_sql "$op" "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" >/dev/null &&
    fo_sql "$op" "SELECT pg_reload_conf()" >/dev/null && fo_wait_standby "$op" sync
}

fo_ipt_tag() { echo "obx-pgfo-$OBX_FO_PRIMARY_PORT"; }

pgfo_cut_primary() {
  local dir
  for dir in --dport --sport; do
    iptables -w 5 -I INPUT -p tcp "$dir" "$OBX_FO_PRIMARY_PORT" -m comment --comment "$(fo_ipt_tag)" -j DROP || return 1
  done
}

# Removes this pair's iptables rules (only those: they carry its tag).
fo_ipt_flush() {
  command -v iptables >/dev/null && [[ -n ${OBX_FO_PRIMARY_PORT:-} ]] || return 0
  local rules
  rules=$(iptables -w 5 -S INPUT 2>/dev/null | grep -- "--comment $(fo_ipt_tag)\( \|$\)") || return 0
  while read -r _ rule; do
    eval "iptables -w 5 -D $rule" || true
  done <<<"$rules"
}

pgfo_promote() {
  local n=${1:-standby} p ro=
  p=$(fo_port "$n")
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$OBX_FO_DIR/$n' -w -t 60 promote >/dev/null" || return 1
  for _ in $(seq 300); do
    ro=$(fo_sql "$p" "SHOW transaction_read_only" 2>/dev/null) || true
    [[ $ro == off ]] && break
    sleep 0.1
  done
  # a base backup of a primary carries its synchronous_standby_names: a promoted node with no
  # standby of its own would make every commit wait
  [[ $ro == off ]] && fo_sql "$p" "ALTER SYSTEM RESET synchronous_standby_names" >/dev/null &&
    fo_sql "$p" "SELECT pg_reload_conf()" >/dev/null && return 0
  echo "pg_failover: the promoted standby does not accept writes" >&2
  return 1
}

pgfo_stop() {
  fo_ipt_flush
  [[ -n ${OBX_FO_DIR:-} && -d $OBX_FO_DIR ]] || return 0
  local n
  for n in primary standby; do
    [[ -f $OBX_FO_DIR/$n/postmaster.pid ]] &&
      fo_as_pg "$FO_PG_BIN/pg_ctl -D '$OBX_FO_DIR/$n' -m immediate -w stop >/dev/null 2>&1"
  done
  rm -rf "$OBX_FO_DIR"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  cmd=${1:?usage: pg_failover.sh start|kill|cut|promote|restart|rebuild|stop DIR [NODE]} OBX_FO_DIR=${2:?DIR}
  export OBX_FO_DIR
  # the ports of a start, for the commands after it
  [[ $cmd != start && -f $OBX_FO_DIR/ports.env ]] && source "$OBX_FO_DIR/ports.env"
  case $cmd in
  start)
    pgfo_start "$OBX_FO_DIR"
    echo "outbox URL: $OBX_FO_URL_BASE/DB?target_session_attrs=read-write"
    ;;
  kill) pgfo_node_kill "${3:-primary}" ;;
  cut) pgfo_cut_primary ;;
  promote) pgfo_promote "${3:-standby}" ;;
  restart) pgfo_node_start "${3:?NODE}" ;;
  rebuild) pgfo_rebuild "${3:?NODE}" ;;
  stop) pgfo_stop ;;
  *) echo "usage: pg_failover.sh start|kill|cut|promote|restart|rebuild|stop DIR [NODE]" >&2; exit 2 ;;
  esac
fi

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
# The servers are the binaries of OBX_PG_BIN (default Debian's PostgreSQL 15), run as the
# postgres user like scripts/services.sh's; the primary alone has synchronous_standby_names
# (on the command line, so that the promoted standby, which has no standby of its own, does not
# wait for one); fsync is off (a killed process loses nothing the kernel has, and these tests
# kill processes, not machines).
# By hand: scripts/pg_failover.sh start DIR | kill DIR | cut DIR | promote DIR | stop DIR
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
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$d/$1' -l '$d/$1.log' -o '-p $2 -k $d/sock -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off -c wal_level=replica -c max_wal_senders=5 -c hot_standby=on -c wal_keep_size=256MB $3' -w -t 60 start >/dev/null"
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
  local state= want=sync
  [[ ${OBX_FO_SYNC:-1} == 0 ]] && want=async
  for _ in $(seq 300); do
    state=$(psql -XAtq "postgres://postgres@127.0.0.1:$p/postgres" \
      -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'" 2>/dev/null) || true
    [[ $state == "$want" ]] && break
    sleep 0.1
  done
  [[ $state == "$want" ]] || { echo "pg_failover: the standby is not $want ('$state')" >&2; return 1; }
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

pgfo_kill_primary() {
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$OBX_FO_DIR/primary' -m immediate -w stop >/dev/null 2>&1"
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
  fo_as_pg "$FO_PG_BIN/pg_ctl -D '$OBX_FO_DIR/standby' -w -t 60 promote >/dev/null" || return 1
  local ro=
  for _ in $(seq 300); do
    ro=$(psql -XAtq "postgres://postgres@127.0.0.1:$OBX_FO_STANDBY_PORT/postgres" -c "SHOW transaction_read_only" 2>/dev/null) || true
    [[ $ro == off ]] && return 0
    sleep 0.1
  done
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
  cmd=${1:?usage: pg_failover.sh start|kill|cut|promote|stop DIR} OBX_FO_DIR=${2:?DIR}
  export OBX_FO_DIR
  # the ports of a start, for the commands after it
  [[ $cmd != start && -f $OBX_FO_DIR/ports.env ]] && source "$OBX_FO_DIR/ports.env"
  case $cmd in
  start)
    pgfo_start "$OBX_FO_DIR"
    printf 'OBX_FO_PRIMARY_PORT=%s\nOBX_FO_STANDBY_PORT=%s\n' "$OBX_FO_PRIMARY_PORT" \
      "$OBX_FO_STANDBY_PORT" >"$OBX_FO_DIR/ports.env"
    echo "outbox URL: $OBX_FO_URL_BASE/DB?target_session_attrs=read-write"
    ;;
  kill) pgfo_kill_primary ;;
  cut) pgfo_cut_primary ;;
  promote) pgfo_promote ;;
  stop) pgfo_stop ;;
  *) echo "usage: pg_failover.sh start|kill|cut|promote|stop DIR" >&2; exit 2 ;;
  esac
fi

#!/usr/bin/env bash
# prologue.sh — the start every shell test shares, written once (issue 47, item 5). A test
# sources it right after `set -euo pipefail` and reading its obx binary into OBX:
#   source "$(dirname "$0")/../support/prologue.sh" NAME
# and gets:
#   T, dir        one new folder /tmp/obx-NAME-XXXXXX (both names), removed at exit
#   pids          background processes (pids+=("$!")), kill -9'd at exit
#   use_store S   sets db: sqlite ($T/outbox.db) or postgres (a fresh database on
#                 OBX_TEST_PG_URL, tests/e2e/pgdb.sh, dropped at exit)
#   on_exit CMD   one more command for the exit trap, run first (the test sets no trap itself)
#   fail MSG      prints "FAIL: MSG" and the last $fail_tail (15) lines of each file of $T that
#                 $fail_files names (globs, '*.log' unless the test sets it); exit 1
#   ok MSG, bad MSG   print "ok   MSG" / "FAIL MSG"; bad counts into $fails
#   now_ms        the wall clock in ms
#   js EXPR       prints python's EXPR over the JSON document on stdin (named d)
#   wait_for SECONDS CMD...   runs CMD every 0.1 s until it succeeds; returns 1 after SECONDS
#   http_addr LOG [SECONDS [PID]]   waits up to SECONDS (5) for a daemon's "listening on
#                 http://HOST:PORT" line in LOG and prints HOST:PORT; returns 1 when none came in
#                 time or, PID given, when that process has exited
#   orders DB N   obx init, a route for order.created.v1 (cluster local, topic orders) and N
#                 events {"order":i} of aggregate order/o-i@1, tenant t1, correlation ID corr-i
#                 (i = 0..N-1); returns 1 when a command fails
#   in_state DB STATE   prints how many events of DB are in STATE (obx status --json, $OBX)
#   published DB  in_state DB PUBLISHED
#   wait_state DB STATE N [SECONDS]   waits up to SECONDS (10) until N events of DB are in STATE;
#                 when they are not, prints how many are and returns 1
#   wait_published DB N [SECONDS]   wait_state DB PUBLISHED N [SECONDS]
#   publish_all DB BROKER N SECONDS [FLAG...]   runs `obx relay --db DB --broker BROKER FLAG...`
#                 (its log appended to $T/relay.log) until N events of DB are PUBLISHED, then
#                 stops it (SIGTERM); fails (fail) when they are not within SECONDS
#   check NAME STATUS REGEX -- CMD...   runs CMD (output into $T/out); fails unless it exits
#                 with STATUS and its stdout+stderr match REGEX (grep -E); prints "ok: NAME"
# KEEP=1 in the environment keeps $T.
# The exit trap keeps the test's exit status.
T=$(mktemp -d "/tmp/obx-${1:?usage: source prologue.sh NAME}-XXXXXX")
dir=$T
pids=()
db=
fails=0
fail_tail=15
fail_files='*.log'
_obx_pg_db=
_obx_on_exit=()
on_exit() { _obx_on_exit+=("$*"); }
_obx_cleanup() {
  local h p
  for h in "${_obx_on_exit[@]:-}"; do [[ -n $h ]] && { eval "$h" || true; }; done
  for p in "${pids[@]:-}"; do [[ -n $p ]] && { kill -9 "$p" 2>/dev/null || true; }; done
  [[ -n $_obx_pg_db ]] && pg_drop_db "$_obx_pg_db"
  [[ -n ${KEEP:-} ]] || rm -rf "$T"
}
trap _obx_cleanup EXIT
use_store() {
  db=sqlite:$T/outbox.db
  if [[ $1 == postgres || $1 == pg ]]; then
    source "$(dirname "${BASH_SOURCE[0]}")/../e2e/pgdb.sh"
    db=$(pg_fresh_db) || return 1
    _obx_pg_db=$db
  fi
}
fail() {
  echo "FAIL: $*" >&2
  local g f
  for g in $fail_files; do
    for f in "$T"/$g; do [[ -f $f ]] && { echo "---- $f" >&2; tail -"$fail_tail" "$f" >&2; }; done
  done
  exit 1
}
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
js() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
wait_for() {
  local until=$(($(date +%s) + $1))
  shift
  until "$@"; do
    (($(date +%s) >= until)) && return 1
    sleep 0.1
  done
}
http_addr() {
  local log=$1 n=$((${2:-5} * 20)) pid=${3:-} a i
  for ((i = 0; i < n; i++)); do
    a=$(grep -o 'listening on http://[0-9.:]*' "$log" 2>/dev/null | head -1 | sed 's|.*http://||') || true
    [[ -n $a ]] && { echo "$a"; return 0; }
    [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null && return 1
    sleep 0.05
  done
  return 1
}
orders() {
  local i
  "$OBX" init --db "$1" >/dev/null || return 1
  "$OBX" route set order.created.v1 --db "$1" --cluster local --topic orders >/dev/null || return 1
  for ((i = 0; i < $2; i++)); do
    printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$1" --type order.created.v1 \
      --aggregate "order/o-$i@1" --tenant t1 --correlation-id "corr-$i" >/dev/null || return 1
  done
}
in_state() { "$OBX" status --db "$1" --json | js "d['states'].get('$2', 0)"; }
published() { in_state "$1" PUBLISHED; }
wait_state() {
  local i got
  for ((i = 0; i < ${4:-10} * 10; i++)); do
    got=$(in_state "$1" "$2")
    [[ $got == "$3" ]] && return 0
    sleep 0.1
  done
  echo "$got"
  return 1
}
wait_published() { wait_state "$1" PUBLISHED "$2" "${3:-10}"; }
publish_all() {
  local db_=$1 broker_=$2 n_=$3 secs=$4 got
  shift 4
  "$OBX" relay --db "$db_" --broker "$broker_" "$@" >>"$T/relay.log" 2>&1 &
  pids+=($!)
  got=$(wait_published "$db_" "$n_" "$secs") || fail "relay published $got of $n_"
  kill -TERM "${pids[-1]}"
  wait "${pids[-1]}" 2>/dev/null || true
}
check() {
  local name=$1 want=$2 pat=$3
  shift 4
  set +e
  "$@" >"$T/out" 2>&1
  local got=$?
  set -e
  [[ $got == "$want" ]] || fail "$name: exit $got, want $want: $(head -c 2000 "$T/out")"
  grep -Eq -- "$pat" "$T/out" || fail "$name: no /$pat/ in: $(head -c 2000 "$T/out")"
  echo "ok: $name"
}

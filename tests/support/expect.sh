#!/usr/bin/env bash
# expect.sh — the counted checks of the command-line contract tests (test_cli.sh,
# test_cli_hardening.sh, test_cli_exit.sh, test_cli_dryrun.sh, test_cli_readonly.sh,
# test_cli_pg_roles.sh), written once. Sourced; defines:
#   fails         the count of failed checks (the test exits non-zero when it is not 0)
#   bad MSG       prints "FAIL MSG" and counts it
#   t NAME WANT NEEDLE -- CMD...   runs CMD (stdin closed; at most 60 s unless CMD is a shell
#                 function); a check passes when it exits with WANT and NEEDLE is a substring of
#                 its stdout+stderr; a failure is counted and the test goes on (unlike
#                 prologue.sh's `check`, which stops). It leaves CMD's stdout+stderr in t_out.
#   t_run         the same as t, for a test that defines a t or check of its own around it
#   three_orders DB   obx init, a route for order.created.v1 (cluster local, topic orders) and
#                 events {"order":i} of aggregates order/o-i@1, tenant tenant-7 (i = 1..3); each
#                 step that fails is counted
#   as_reader     a command prefix that runs as someone who cannot write the test's files
#                 (nobody, when the test runs as root; empty otherwise)
fails=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
t_out=
t_run() {
  local name=$1 want=$2 needle=$3
  shift 4
  local rc
  if declare -F "$1" >/dev/null; then # a shell function of the test: timeout cannot run it
    t_out=$("$@" 2>&1 </dev/null)
  else
    t_out=$(timeout 60 "$@" 2>&1 </dev/null)
  fi
  rc=$?
  if [[ $rc != "$want" || $t_out != *"$needle"* ]]; then
    bad "$name: exit $rc (want $want), output: ${t_out:0:500}"
  else
    echo "ok   $name"
  fi
}
t() { t_run "$@"; }
three_orders() {
  local i
  "$OBX" init --db "$1" >/dev/null || bad "init"
  "$OBX" route set order.created.v1 --db "$1" --cluster local --topic orders >/dev/null 2>&1 || bad "route set"
  for i in 1 2 3; do
    echo "{\"order\":$i}" | "$OBX" enqueue --db "$1" --type order.created.v1 \
      --aggregate "order/o-$i@1" --tenant tenant-7 >/dev/null || bad "enqueue $i"
  done
}
as_reader=()
if ((EUID == 0)); then as_reader=(setpriv --reuid=nobody --regid=nogroup --clear-groups); fi

#!/usr/bin/env bash
# expect.sh — the counted checks of the command-line contract tests (test_cli_dryrun.sh,
# test_cli_readonly.sh, test_cli_pg_roles.sh), written once. Sourced; defines:
#   fails         the count of failed checks (the test exits non-zero when it is not 0)
#   bad MSG       prints "FAIL MSG" and counts it
#   t NAME WANT NEEDLE -- CMD...   runs CMD (stdin closed, at most 60 s); a check passes when it
#                 exits with WANT and NEEDLE is a substring of its stdout+stderr; a failure is
#                 counted and the test goes on (unlike prologue.sh's `check`, which stops)
#   as_reader     a command prefix that runs as someone who cannot write the test's files
#                 (nobody, when the test runs as root; empty otherwise)
fails=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
t() {
  local name=$1 want=$2 needle=$3
  shift 4
  local out rc
  out=$(timeout 60 "$@" 2>&1 </dev/null)
  rc=$?
  if [[ $rc != "$want" || $out != *"$needle"* ]]; then
    bad "$name: exit $rc (want $want), output: ${out:0:500}"
  else
    echo "ok   $name"
  fi
}
as_reader=()
if ((EUID == 0)); then as_reader=(setpriv --reuid=nobody --regid=nogroup --clear-groups); fi

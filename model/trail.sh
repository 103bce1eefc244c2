#!/usr/bin/env bash
# model/trail.sh [SWITCH...] -- finds and prints a counterexample of model/obx.pml built with
# the given switches (e.g. `model/trail.sh NO_FENCE`, `model/trail.sh COVER=4`), one line per
# step: the process and the guard it passed (d_step bodies are not shown), then the violation.
# Options through the environment: MODE=safety|cycles|ltl (default safety), WIDTH (default 200).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=${MODE:-safety}
width=${WIDTH:-200}
work=$(mktemp -d "${TMPDIR:-/tmp}/obx-trail.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
cp "$here/obx.pml" .
defs=()
for s in "$@"; do defs+=("-D$s"); done
spin -a "${defs[@]}" obx.pml >/dev/null
case $mode in
  safety) gcc -O0 -w -DNOCLAIM -DSAFETY -o pan pan.c; args=() ;;
  cycles) gcc -O0 -w -DNOCLAIM -DNP -o pan pan.c; args=(-l) ;;
  ltl) gcc -O0 -w -DNFAIR=3 -o pan pan.c; args=(-a -f) ;;
  *) echo "MODE must be safety, cycles or ltl" >&2; exit 2 ;;
esac
# -i: iteratively shorten the counterexample (still exhaustive below the depth found)
./pan -m20000 -w22 -i "${args[@]}" >out.txt 2>&1 || true
if ! grep -q '^pan:[0-9]*: ' out.txt; then
  echo "no counterexample: $(grep -m1 'errors:' out.txt)"
  exit 1
fi
grep -m1 '^pan:[0-9]*: ' out.txt | cut -c1-"$width"
spin -t -p "${defs[@]}" obx.pml 2>&1 |
  awk '/^ *[0-9]+:[ \t]+proc/ { if ($1 != last) { last = $1; sub(/^[ \t]+/, ""); print } next }
       /START OF CYCLE/ || /violated/ || /acceptance cycle/ { print }' |
  sed -E 's/[ \t]+/ /g; s/ obx\.pml:[0-9]+ \(state [0-9]+\)//' | cut -c1-"$width"

#!/usr/bin/env bash
# test_check_layers.sh — scripts/check_layers.sh passes on the tree and fails on each rule it
# states: a copy of the sources with one vtable call above the backends, and one with the CLI
# including an internal header.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
expect() { # expect STATUS WHAT ROOT
  local got=0
  "$src/scripts/check_layers.sh" "$3" >"$work/out" 2>&1 || got=$?
  if [[ $got -eq $1 ]]; then echo "ok   $2"; else
    echo "FAIL $2: exit $got, expected $1"; cat "$work/out"; fails=$((fails + 1)); fi
}
expect 0 "the tree keeps the layering rules" "$src"
copy() { rm -rf "$work/t"; mkdir -p "$work/t"; cp -r "$src/src" "$work/t/"; }
copy
printf 'static void f(obx__store *s) { s->m->stats(s, 0); }\n' >>"$work/t/src/engine/report.c"
expect 1 "a vtable call in the engine is refused" "$work/t"
grep -q 'src/engine/report.c' "$work/out" || { echo "FAIL the report names no file"; fails=$((fails + 1)); }
copy
sed -i '1i #include "store/store.h"' "$work/t/src/cli/main.c"
expect 1 "an internal header in the CLI is refused" "$work/t"
exit $fails

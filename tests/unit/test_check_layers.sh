#!/usr/bin/env bash
# test_check_layers.sh — scripts/check_layers.sh passes on the tree and fails on each rule it
# states: a copy of the sources with one vtable call above the backends, one with the CLI
# including an internal header, one with SQL in the simulator (SQLite's and libpq's), one
# with the application doubles including an internal header, and one with the engine branching
# on a store's optional method.
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
copy
printf 'static int f(sqlite3 *db) { return sqlite3_exec(db, "DELETE FROM obx_event", 0, 0, 0); }\n' \
  >>"$work/t/src/sim/checkers.c"
expect 1 "SQLite SQL in the simulator is refused" "$work/t"
grep -q 'src/sim/checkers.c' "$work/out" || { echo "FAIL the report names no file"; fails=$((fails + 1)); }
copy
printf 'static void f(PGconn *c) { PQclear(PQexec (c, "SELECT 1")); }\n' >>"$work/t/src/sim/world.c"
expect 1 "libpq SQL in the simulator is refused" "$work/t"
copy
sed -i '1i #include "store/store.h"' "$work/t/src/app/app.c"
expect 1 "an internal header in the application doubles is refused" "$work/t"
copy
printf 'static bool f(obx__store *s) { return obx__st_has_server_ms(s); }\n' \
  >>"$work/t/src/engine/enqueue.c"
expect 1 "an obx__st_has_ branch in the engine is refused" "$work/t"
grep -q 'src/engine/enqueue.c' "$work/out" || { echo "FAIL the report names no file"; fails=$((fails + 1)); }
exit $fails

#!/usr/bin/env bash
# check_layers.sh [ROOT] — the layering rules a compiler cannot see (run by the `check` target;
# tests/unit/test_check_layers.sh makes each rule fail on a fixture):
#   1. Above the backends nobody calls a store or broker method through its vtable
#      (`->m->`): every call goes through the obx__st_* / obx__br_* wrappers of
#      src/store/store.c and src/broker/broker.c, which check arguments and count the call for
#      fault injection (docs/architecture.md).
#   2. The CLI uses the public headers only (obx.h, obx_test.h), never an internal one.
#   3. The simulator runs no SQL (issue 20): obx's tables are read and written through the store
#      interface, the business tables through the application doubles (src/app); no
#      sqlite3_exec/prepare/step or PQexec/prepare/sendQuery call in src/sim.
#   4. The application doubles (src/app) are an obx user's code: the public header only.
#   5. One engine path per operation (issue 47): the engine never asks whether a store has a
#      method (`obx__st_has_`). Every operation is a required method; a backend without a fast
#      path runs its own sequence inside its own file. The optional methods are capabilities
#      (waiting for work, roles, the schema lock, planner settings, a server clock), which only
#      the drivers ask about (src/store/store.h).
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
fail=0
dirs=()
for d in src/engine src/drivers src/cli src/sim; do [[ -d $root/$d ]] && dirs+=("$root/$d"); done
if hits=$(grep -rn --include='*.c' --include='*.h' -- '->m->' "${dirs[@]}"); then
  echo "check_layers: a vtable call above the backends (use the obx__st_*/obx__br_* wrapper):"
  echo "$hits"
  fail=1
fi
if hits=$(grep -rnE '^#include "(core|store|broker|engine|drivers|sim)/' "$root/src/cli"); then
  echo "check_layers: the CLI includes an internal header (it may use include/obx*.h only):"
  echo "$hits"
  fail=1
fi
sql='(sqlite3_(exec|prepare[a-z0-9_]*|step|get_table)|PQ(exec[A-Za-z]*|prepare|sendQuery[A-Za-z]*|sendPrepare))[[:space:]]*\('
if [[ -d $root/src/sim ]] && hits=$(grep -rnE --include='*.c' --include='*.h' "$sql" "$root/src/sim"); then
  echo "check_layers: SQL in the simulator (go through the store interface or src/app):"
  echo "$hits"
  fail=1
fi
if [[ -d $root/src/app ]] &&
  hits=$(grep -rnE '^#include "(core|store|broker|engine|drivers|sim|cli)/' "$root/src/app"); then
  echo "check_layers: the application doubles include an internal header (obx.h only):"
  echo "$hits"
  fail=1
fi
if [[ -d $root/src/engine ]] &&
  hits=$(grep -rn --include='*.c' --include='*.h' -- 'obx__st_has_' "$root/src/engine"); then
  echo "check_layers: the engine branches on a store's optional method (one path per operation:"
  echo "make the operation a required method, the backend's own sequence in its own file):"
  echo "$hits"
  fail=1
fi
exit $fail

#!/usr/bin/env bash
# test_migrate_dryrun.sh — issue 46, item 1: `obx migrate --dry-run` with a new route (--cluster,
# --topic) writes nothing at all, routes included; a migrate or --add-target whose events are all
# refused leaves the whole database as it was (compared by a full dump before and after); a run
# that changes an event writes its route generation with it, and the messages say which. Usage:
# test_migrate_dryrun.sh OBX [sqlite|postgres]
set -euo pipefail
OBX=${1:?usage: test_migrate_dryrun.sh OBX [sqlite|postgres]}
source "$(dirname "$0")/../support/prologue.sh" migdry
use_store "${2:-sqlite}"
broker="log:$dir/broker.db"
dump() { # the whole database, schema and rows
  if [[ $db == postgres* ]]; then
    pg_dump --no-owner "$db" | grep -Ev '^\\(un)?restrict ' # a random key each run
  else
    sqlite3 "${db#sqlite:}" .dump
  fi
}
same_as_before() { # same_as_before WHAT
  dump >"$dir/after.sql"
  if diff -q "$dir/before.sql" "$dir/after.sql" >/dev/null; then
    ok "$1: the database is as it was"
  else
    bad "$1: the database changed"
    diff "$dir/before.sql" "$dir/after.sql" | head -20 | sed 's/^/    /' || true
  fi
}
route_topic() { "$OBX" route list --db "$db" --json | python3 -c \
  'import json,sys; print([r["topic"] for r in json.load(sys.stdin) if r["event_type"]=="order.created.v1"][-1])'; }

"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
evt=$(printf '{"order":1}' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-1@1 --tenant t1)
dump >"$dir/before.sql"

# 1. a dry run with a new route: nothing written, and it says so
set +e
out=$("$OBX" migrate "$evt" --dry-run --db "$db" --broker "$broker" --type order.created.v1 \
  --cluster local --topic orders-dry 2>&1); rc=$?
set -e
echo "$out" | sed 's/^/    /'
[[ $rc == 0 && $out == *"would migrate"* ]] && ok "dry run: would migrate" || bad "dry run rc=$rc"
[[ $out == *"orders-dry: not written (dry run)"* && $out != *"generation 2"* ]] &&
  ok "dry run: says the route is not written" || bad "dry run message claims a route generation"
same_as_before "dry run"
[[ $(route_topic) == orders ]] && ok "dry run: the route still goes to orders" || bad "dry run rerouted to $(route_topic)"

# 2. the same with --json: one document, nothing written
set +e
"$OBX" migrate "$evt" --dry-run --json --db "$db" --broker "$broker" --type order.created.v1 \
  --cluster local --topic orders-dry >"$dir/dry.json" 2>&1; rc=$?
set -e
[[ $rc == 0 && $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["route"]["written"], d["route"]["gen"])' "$dir/dry.json") == "False None" ]] &&
  ok "dry run --json: route written false" || bad "dry run --json: rc=$rc $(cat "$dir/dry.json")"
same_as_before "dry run --json"

# 3. --add-target that is refused (the new target cannot be queried): nothing written
set +e
out=$("$OBX" migrate "$evt" --add-target --db "$db" --broker "$broker?lookup_down=1" \
  --type order.created.v1 --cluster local --topic orders-x 2>&1); rc=$?
set -e
echo "$out" | sed 's/^/    /'
[[ $rc == 1 && $out == *"REFUSED"* && $out == *"not written (no event changed)"* ]] &&
  ok "refused --add-target: exit 1, says nothing was written" || bad "refused --add-target: rc=$rc"
same_as_before "refused --add-target"

# 4. a move that is refused (the event is not in the outbox's undelivered states: PUBLISHED is
#    refused; here a bogus ID is refused): nothing written
set +e
out=$("$OBX" migrate evt-01ZZZZZZZZZZZZZZZZZZZZZZZZ --db "$db" --broker "$broker" \
  --type order.created.v1 --cluster local --topic orders-z 2>&1); rc=$?
set -e
[[ $rc == 1 && $out == *"not written"* ]] && ok "refused migrate: exit 1, route not written" || bad "refused migrate: rc=$rc $out"
same_as_before "refused migrate"

# 5. --add-target that succeeds: the target is added and the route written with it, as said
set +e
out=$("$OBX" migrate "$evt" --add-target --db "$db" --broker "$broker" --type order.created.v1 \
  --cluster local --topic orders-x 2>&1)
echo "$out" | sed 's/^/    /'
[[ $out == *"target added: target 2 local/orders-x"* ]] && ok "--add-target: target 2 added" || bad "--add-target failed"
[[ $out == *"generation 2 written"* && $(route_topic) == orders-x ]] &&
  ok "--add-target: route generation 2 written with it" || bad "route after --add-target: $(route_topic)"
n=$("$OBX" inspect "$evt" --db "$db" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d.get("delivery_set",{}).get("targets",[])))')
[[ $n == 2 ]] && ok "the event has a delivery set of 2" || bad "delivery set: $n targets"

# 6. a real move: migrated, route written, the event's new destination is the route's
out=$("$OBX" migrate "$evt" --db "$db" --broker "$broker" --type order.created.v1 --cluster local \
  --topic orders-y 2>&1)
set -e
[[ $out == *"migrated: local/orders (gen 1) -> local/orders-y (gen 2)"* && $out == *"generation 3 written"* ]] &&
  ok "migrate: moved with route generation 3" || bad "migrate: $out"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

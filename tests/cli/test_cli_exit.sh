#!/usr/bin/env bash
# test_cli_exit.sh OBX — the exit-status contract of every command, as a script or a monitoring
# check meets it (issue 50): 0 done / all good; 1 a finding (an invariant violated, an open
# alarm such as a quarantined receipt, audit findings, some selected events refused); 2 a
# usage error (unknown option, malformed URL, missing required option); 3 could not check
# (unreachable, no such outbox, permission). Every command `obx help` lists is exercised here
# (the test fails on a command it has no case for), and each one's --help states the contract.
set -u
OBX=$(realpath "${1:?usage: test_cli_exit.sh path/to/obx}")
source "$(dirname "$0")/../support/prologue.sh" exit
source "$(dirname "$0")/../support/expect.sh"
cd "$dir"
declare -A seen
# t CMD WANT NEEDLE -- command...: the exit status, and NEEDLE in stdout+stderr; CMD has a case
t() {
  seen[$1]+="$2"
  t_run "$1 $2: ${*:6}" "${@:2}"
}
db=sqlite:$dir/o.db
cons=sqlite:$dir/c.db
down=postgres://obx@127.0.0.1:1/nothing # nothing listens on port 1: unreachable at once
"$OBX" init --db "$db" >/dev/null
"$OBX" init --db "$cons" >/dev/null
echo '{"order":"o-1"}' >p.json
enq() { "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/$1@1" --tenant tenant-7 --payload-file p.json; }

t init 0 "migrated" -- "$OBX" init --db "sqlite:$dir/fresh.db"
t init 2 "no scheme" -- "$OBX" init --db foo.db
t init 2 "unknown scheme 'sqlit'" -- "$OBX" init --db sqlit:
t init 2 "OBX_EUNSUPPORTED" -- "$OBX" init --db "$db" --roles app
t init 3 "OBX_ECONNLOST" -- "$OBX" init --db "$down"

t route 0 "generation 1" -- "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders
t route 0 "order.created.v1" -- "$OBX" route list --db "$db"
t route 2 "topic:" -- "$OBX" route set order.created.v1 --db "$db" --cluster local --topic "a b"
t route 2 "" -- "$OBX" route list --db "$db" --no-such-option
t route 3 "OBX_ECONNLOST" -- "$OBX" route list --db "$down"

t enqueue 0 "evt-" -- "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-1@1 --tenant tenant-7 --payload-file p.json
t enqueue 1 "OBX_ENOROUTE" -- "$OBX" enqueue --db "$db" --type x.y.v1 --aggregate order/o-2@1 --tenant tenant-7 --payload-file p.json
t enqueue 2 "--tenant: required" -- "$OBX" enqueue --db "sqlite:$dir/never.db" --type order.created.v1 --aggregate order/o-2@1 --payload-file p.json
[[ ! -e $dir/never.db ]] || { echo "FAIL enqueue: a refused command line created never.db"; fails=$((fails + 1)); }
t enqueue 2 "tenant:" -- "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-2@1 --tenant "t'1" --payload-file p.json
t enqueue 2 "cannot open" -- "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-2@1 --tenant tenant-7 --payload-file none.json
t enqueue 3 "OBX_ECONNLOST" -- "$OBX" enqueue --db "$down" --type order.created.v1 --aggregate order/o-2@1 --tenant tenant-7 --payload-file p.json

id=$(enq o-3)
t inspect 0 "PENDING" -- "$OBX" inspect "$id" --db "$db"
t inspect 1 "not in this outbox" -- "$OBX" inspect evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G --db "$db"
t inspect 2 "" -- "$OBX" inspect --db "$db"
t inspect 3 "OBX_ECONNLOST" -- "$OBX" inspect "$id" --db "$down"

t report 0 "invariants (one primary receipt per published event): hold" -- "$OBX" report --db "$db"
t status 0 "" -- "$OBX" status --db "$db"
t audit 0 "no findings" -- "$OBX" audit --db "$db" --consumer "proj=$cons" --set audit.pending_max_age_ms=3600000
# a quarantined receipt (a broker contradicted the outbox) is an open alarm: report, status
# and audit find it, though the invariants hold
sqlite3 "$dir/o.db" "INSERT INTO obx_receipt (event_id, envelope_gen, attempt_id, kind, cluster, topic, partition, \"offset\", broker_ts, payload_digest, dest_digest, reason, created_at) VALUES ('$id', 1, 'att-x', 'QUARANTINED', 'local', 'orders', 0, 7, 0, 'sha256:00', 'sha256:00', 'payload digest differs', 1700000000000)"
t report 1 "ALARM: 1 quarantined receipt" -- "$OBX" report --db "$db"
t report 1 "" -- "$OBX" report --db "$db" --json
t report 2 "no scheme" -- "$OBX" report --db foo.db
t report 3 "OBX_ECONNLOST" -- "$OBX" report --db "$down"
t status 1 "quarantined receipts (1 listed)" -- "$OBX" status --db "$db"
t status 2 "--limit" -- "$OBX" status --db "$db" --limit 0
t status 3 "OBX_ECONNLOST" -- "$OBX" status --db "$down"
t audit 1 "quarantined_receipt" -- "$OBX" audit --db "$db" --consumer "proj=$cons" --set audit.pending_max_age_ms=3600000
t audit 2 "" -- "$OBX" audit --db "$db" --no-such-option
t audit 3 "OBX_ECONNLOST" -- "$OBX" audit --db "$down"

t trace 0 "producer    committed" -- "$OBX" trace "$id" --db "$db"
t trace 1 "OBX_ENOTFOUND" -- "$OBX" trace --correlation nobody --db "$db"
t trace 2 "" -- "$OBX" trace --db "$db"
t trace 3 "OBX_ECONNLOST" -- "$OBX" trace "$id" --db "$down"

t requeue 1 "OBX_EREFUSED" -- "$OBX" requeue "$id" --db "$db"
t requeue 2 "" -- "$OBX" requeue --db "$db"
t requeue 3 "OBX_ECONNLOST" -- "$OBX" requeue "$id" --db "$down"

t cancel 1 "has no delay" -- "$OBX" cancel "$id" --who alice --reason paid --db "$db"
t cancel 2 "--reason: required" -- "$OBX" cancel "$id" --who alice --db "$db"
t cancel 3 "OBX_ECONNLOST" -- "$OBX" cancel "$id" --who alice --reason paid --db "$down"

t resolve 1 "1 refused" -- "$OBX" resolve "$id" --retry --who alice --reason INC-1 --db "$db"
t resolve 2 "--who: required" -- "$OBX" resolve "$id" --retry --reason INC-1 --db "$db"
t resolve 3 "OBX_ECONNLOST" -- "$OBX" resolve "$id" --retry --who alice --reason INC-1 --db "$down"

t migrate 1 "not in this outbox" -- "$OBX" migrate evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G --db "$db"
t migrate 2 "no EVENT_ID and no selector" -- "$OBX" migrate --db "$db"
t migrate 3 "OBX_ECONNLOST" -- "$OBX" migrate "$id" --db "$down"

: >empty.jsonl
t shadow 0 "" -- "$OBX" shadow --db "$db" --feed empty.jsonl --grace-ms 3600000
t shadow 1 "missing" -- "$OBX" shadow --db "$db" --feed empty.jsonl --grace-ms -1
t shadow 2 "--limit" -- "$OBX" shadow --db "$db" --feed empty.jsonl --limit 0
t shadow 3 "OBX_ECONNLOST" -- "$OBX" shadow --db "$down" --feed empty.jsonl

t takeover 0 "dry run" -- "$OBX" takeover --db "$db" --to other --from obx --dry-run
t takeover 1 "no route for 'x.y.v1'" -- "$OBX" takeover --db "$db" --to obx --type x.y.v1
t takeover 2 "--to: required" -- "$OBX" takeover --db "$db" --type order.created.v1
t takeover 3 "OBX_ECONNLOST" -- "$OBX" takeover --db "$down" --to other --from obx --dry-run

t purge 0 "dry run" -- "$OBX" purge --dry-run --db "$db" --consumer "proj=$cons"
t purge 1 "OBX_EREFUSED" -- "$OBX" purge "$id" --db "$db" --consumer "proj=$cons"
t purge 2 "none declared" -- "$OBX" purge --dry-run --db "$db"
t purge 3 "OBX_ECONNLOST" -- "$OBX" purge --dry-run --db "$down" --consumer "proj=$cons"

t watermark 0 "CONSUMER" -- "$OBX" watermark list --db "$db" --consumer "proj=$cons"
t watermark 0 "watermark forced" -- "$OBX" watermark force proj --until 1000 --reason test --db "$db" --consumer "proj=$cons"
t watermark 1 "OBX_EREFUSED" -- "$OBX" watermark force proj --until 1 --reason test --db "$db" --consumer "proj=$cons"
t watermark 2 "--until: missing" -- "$OBX" watermark force proj --reason test --db "$db" --consumer "proj=$cons"
t watermark 3 "OBX_ECONNLOST" -- "$OBX" watermark list --db "$down" --consumer "proj=$cons"

t poison 0 "[]" -- "$OBX" poison list --consumer-db "$cons"
t poison 1 "OBX_E" -- "$OBX" poison redrive "$id" --consumer-db "$cons" --consumer proj
t poison 2 "--consumer-db: required" -- "$OBX" poison list
t poison 3 "OBX_ECONNLOST" -- "$OBX" poison list --consumer-db "$down"

t consume 0 "delivered 0" -- "$OBX" consume --consumer-db "sqlite:$dir/proj.db" --broker "log:$dir/b.db" --topic orders --until-idle 200
t consume 2 "--topic: required" -- "$OBX" consume --consumer-db "sqlite:$dir/proj.db"
t consume 3 "OBX_ECONNLOST" -- "$OBX" consume --consumer-db "$down" --exec cat --broker "log:$dir/b.db" --topic orders --until-idle 200

t relay 2 "" -- "$OBX" relay --no-such-option
t relay 2 "relay.batch" -- "$OBX" relay --db "$db" --set relay.batch=0
# an unreachable database or one without its schema is waited for (issue 48); a schema newer
# than this obx ends the relay: it could not run
cp o.db newer.db
sqlite3 newer.db "UPDATE obx_meta SET value = '99' WHERE key = 'schema_version'"
t relay 3 "OBX_ESCHEMA" -- "$OBX" relay --db "sqlite:$dir/newer.db" --broker "log:$dir/b.db"

t config 0 '"db"' -- "$OBX" config --db "$db"
t config 2 "unknown configuration key" -- "$OBX" config --set relay.nope=1

printf 'topics:\n  - name: orders.v1\n    owner: shop\n    event_types: [order.created.v1]\n    subscribers: [proj]\n' >catalog.yaml
t catalog 0 "0 finding(s)" -- "$OBX" catalog check --catalog catalog.yaml --subscription proj=orders.v1
t catalog 1 "orders.v2" -- "$OBX" catalog check --catalog catalog.yaml --subscription proj=orders.v2
t catalog 2 "--catalog: required" -- "$OBX" catalog check
t catalog 3 "OBX_ECONNLOST" -- "$OBX" catalog check --catalog catalog.yaml --db "$down"

t consumer-test 0 "0 scenario(s) mishandled" -- "$OBX" consumer-test --builtin order-projection
t consumer-test 1 "MISHANDLED" -- "$OBX" consumer-test --builtin order-projection --types '*' --tenants '*'
t consumer-test 2 "" -- "$OBX" consumer-test --builtin nope

t sim 0 "gate: PASSED" -- "$OBX" sim --traces 20 --seed 3
t sim 2 "unknown class" -- "$OBX" sim --traces 20 --fault nope

t demo 2 "--events" -- "$OBX" demo --events 0
t demo 3 "cannot create" -- "$OBX" demo --dir /proc/obx-demo --events 10

t completion 0 "complete -F _obx obx" -- "$OBX" completion bash
t completion 2 "" -- "$OBX" completion tcsh
t help 0 "commands:" -- "$OBX" help
t help 2 "" -- "$OBX" help no-such-command
t version 0 "obx " -- "$OBX" version
t version 2 "" -- "$OBX" version extra

# every command is covered, and states the contract in its help
for c in $("$OBX" help | awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on {print $1}'); do
  [[ -n ${seen[$c]:-} ]] || { echo "FAIL $c: no exit-status case in this test"; fails=$((fails + 1)); }
  h=$("$OBX" "$c" --help)
  if [[ $h != *$'exit status:\n  0  done'* || $h != *"  2  usage error"* || $h != *"  3  could not check"* ]]; then
    echo "FAIL $c --help does not state the exit statuses"; fails=$((fails + 1))
  fi
  if [[ ${seen[$c]} == *1* && $h != *$'\n  1  '* ]]; then
    echo "FAIL $c exits 1, its --help does not say when"; fails=$((fails + 1))
  fi
done
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

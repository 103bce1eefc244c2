#!/usr/bin/env bash
# test_cli.sh — the obx command as a shell user meets it: exit codes, messages that name the
# bad field, nothing stored on bad input, JSON output.
set -u
OBX=${1:?usage: test_cli.sh path/to/obx}
dir=$(mktemp -d /tmp/obx-cli-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
fails=0
check() { # check NAME EXPECTED_RC NEEDLE -- command...
  local name=$1 want=$2 needle=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [[ $rc -ne $want ]] || [[ -n $needle && $out != *"$needle"* ]]; then
    echo "FAIL $name: rc=$rc (want $want), output: $out"; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}
db=sqlite:$dir/o.db
check "init" 0 "migrated from version 0 to 2" -- "$OBX" init --db "$db"
check "init again" 0 "is current" -- "$OBX" init --db "$db"
check "init roles on sqlite" 1 "OBX_EUNSUPPORTED" -- "$OBX" init --db "$db" --roles app
check "bad store url" 1 "unknown scheme 'mysql'" -- "$OBX" init --db mysql://x
check "empty sqlite path" 1 "path after 'sqlite:' is empty" -- "$OBX" init --db sqlite:
check "uninitialized db" 1 "run \`obx init" -- "$OBX" route list --db "sqlite:$dir/other.db"
check "route set" 0 "generation 1" -- "$OBX" route set order.created.v2 --db "$db" --cluster local --topic orders
check "route bad topic" 1 "topic:" -- "$OBX" route set order.created.v2 --db "$db" --cluster local --topic "a b"
check "route bad max" 2 "--max-attempts" -- "$OBX" route set order.created.v2 --db "$db" --cluster local --topic t --max-attempts 0
check "route list" 0 "order.created.v2" -- "$OBX" route list --db "$db"
echo '{"o":1}' > p.json
check "enqueue" 0 "evt-" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file p.json --idempotency-key k1
check "enqueue same key" 0 "first event's ID" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file p.json --idempotency-key k1
check "enqueue bad aggregate" 2 "TYPE/ID@VERSION" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order-o-1 --tenant t1 --payload-file p.json
check "enqueue bad tenant" 1 "tenant: byte 0x27" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant "t'1" --payload-file p.json
check "enqueue no route" 1 "no route for 'x.y.v1'" -- "$OBX" enqueue --db "$db" --type x.y.v1 --aggregate order/o-1@1 --tenant t1 --payload-file p.json
: > empty.json
check "enqueue empty payload" 1 "payload: empty" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file empty.json
head -c 2000 /dev/zero > big.bin
check "enqueue over limit" 1 "over the limit of 1000 bytes" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file big.bin --payload-limit 1000
n=$(sqlite3 "$dir/o.db" "select count(*) from obx_event")
if [[ $n == 1 ]]; then echo "ok   only one event stored"; else echo "FAIL events stored: $n"; fails=$((fails + 1)); fi
id=$("$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-2@1 --tenant t1 --payload-file p.json --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["event_id"])')
check "inspect" 0 "PENDING" -- "$OBX" inspect "$id" --db "$db"
check "inspect json" 0 "\"dest_digest\": \"sha256:" -- "$OBX" inspect "$id" --db "$db" --json
check "inspect bad id" 1 "does not start with 'evt-'" -- "$OBX" inspect nope --db "$db"
check "inspect unknown id" 1 "not in this outbox" -- "$OBX" inspect evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G --db "$db"
check "unknown command" 2 "unknown command" -- "$OBX" frobnicate
check "help" 0 "commands:" -- "$OBX" help
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

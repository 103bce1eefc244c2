#!/usr/bin/env bash
# test_cli.sh — the obx command as a shell user meets it: exit codes, messages that name the
# bad field, nothing stored on bad input, JSON output.
set -u
OBX=${1:?usage: test_cli.sh path/to/obx}
source "$(dirname "$0")/../support/prologue.sh" cli
source "$(dirname "$0")/../support/expect.sh"
cd "$dir"
check() { t_run "$@"; } # check NAME EXPECTED_RC NEEDLE -- command...: counted, goes on
db=sqlite:$dir/o.db
check "init" 0 "migrated from version 0 to 1" -- "$OBX" init --db "$db"
check "init again" 0 "is current" -- "$OBX" init --db "$db"
check "init roles on sqlite" 2 "OBX_EUNSUPPORTED" -- "$OBX" init --db "$db" --roles app
check "bad store url" 2 "unknown scheme 'mysql'" -- "$OBX" init --db mysql://x
check "empty sqlite path" 2 "path after 'sqlite:' is empty" -- "$OBX" init --db sqlite:
sqlite3 "$dir/other.db" 'PRAGMA user_version = 0' # an empty SQLite database, not an outbox
check "uninitialized db" 3 "run \`obx init" -- "$OBX" route list --db "sqlite:$dir/other.db"
check "missing db" 3 "no such outbox: $dir/none.db" -- "$OBX" route list --db "sqlite:$dir/none.db"
check "route set" 0 "generation 1" -- "$OBX" route set order.created.v2 --db "$db" --cluster local --topic orders
check "route bad topic" 2 "topic:" -- "$OBX" route set order.created.v2 --db "$db" --cluster local --topic "a b"
check "route bad max" 2 "--max-attempts" -- "$OBX" route set order.created.v2 --db "$db" --cluster local --topic t --max-attempts 0
check "route list" 0 "order.created.v2" -- "$OBX" route list --db "$db"
echo '{"o":1}' > p.json
check "enqueue" 0 "evt-" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file p.json --idempotency-key k1
check "enqueue same key" 0 "first event's ID" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file p.json --idempotency-key k1
check "enqueue bad aggregate" 2 "TYPE/ID@VERSION" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order-o-1 --tenant t1 --payload-file p.json
check "enqueue bad tenant" 2 "tenant: byte 0x27" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant "t'1" --payload-file p.json
check "enqueue no route" 1 "no route for 'x.y.v1'" -- "$OBX" enqueue --db "$db" --type x.y.v1 --aggregate order/o-1@1 --tenant t1 --payload-file p.json
: > empty.json
check "enqueue empty payload" 2 "payload: empty" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file empty.json
head -c 2000 /dev/zero > big.bin
check "enqueue over limit" 2 "over the limit of 1000 bytes" -- "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 --tenant t1 --payload-file big.bin --payload-limit 1000
n=$(sqlite3 "$dir/o.db" "select count(*) from obx_event")
if [[ $n == 1 ]]; then echo "ok   only one event stored"; else echo "FAIL events stored: $n"; fails=$((fails + 1)); fi
# a database a newer obx initialized is refused, naming both versions, and left as it is
cp "$dir/o.db" "$dir/newer.db"
sqlite3 "$dir/newer.db" "update obx_meta set value = '99' where key = 'schema_version'"
check "init refuses a newer schema" 3 "schema version 99 is newer than this obx knows" -- "$OBX" init --db "sqlite:$dir/newer.db"
v=$(sqlite3 "$dir/newer.db" "select value from obx_meta where key = 'schema_version'")
if [[ $v == 99 ]]; then echo "ok   the newer database is left as it is"; else echo "FAIL schema_version now $v"; fails=$((fails + 1)); fi
id=$("$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-2@1 --tenant t1 --payload-file p.json --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["event_id"])')
check "inspect" 0 "PENDING" -- "$OBX" inspect "$id" --db "$db"
check "inspect json" 0 "\"dest_digest\": \"sha256:" -- "$OBX" inspect "$id" --db "$db" --json
check "inspect bad id" 2 "does not start with 'evt-'" -- "$OBX" inspect nope --db "$db"
check "inspect unknown id" 1 "not in this outbox" -- "$OBX" inspect evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G --db "$db"
# delivery sets, migration, shadow, takeover: usage and bad input (nothing stored)
check "route set with delivery set" 0 "delivery set, complete on any" -- "$OBX" route set order.set.v1 --db "$db" --cluster local --topic orders --also eu/orders-eu --also "local/audit/{tenant}" --completion any
check "route list shows the set" 0 "set=eu/orders-eu,local/audit complete=any" -- "$OBX" route list --db "$db"
check "route --also malformed" 2 "is not CLUSTER/TOPIC" -- "$OBX" route set order.set.v1 --db "$db" --cluster local --topic orders --also eu
check "route --also repeats a target" 2 "targets[0]: local/orders is the route's own destination" -- "$OBX" route set order.set.v1 --db "$db" --cluster local --topic orders --also local/orders
check "route completion unknown" 2 "completion: 'some' unknown" -- "$OBX" route set order.set.v1 --db "$db" --cluster local --topic orders --also eu/x --completion some
check "route completion without targets" 2 "completion: given without targets" -- "$OBX" route set order.set.v1 --db "$db" --cluster local --topic orders --completion all
check "migrate without selector" 2 "no EVENT_ID and no selector" -- "$OBX" migrate --db "$db"
check "migrate bad event ID" 2 "event_ids[0]" -- "$OBX" migrate --db "$db" nope
check "migrate IDs and a selector" 2 "choose one" -- "$OBX" migrate --db "$db" "$id" --from-topic orders
check "migrate unknown event" 1 "not in this outbox" -- "$OBX" migrate --db "$db" evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G
check "migrate bad completion" 2 "completion: only with add_target" -- "$OBX" migrate --db "$db" "$id" --completion any
check "takeover without --to" 2 "--to: required" -- "$OBX" takeover --db "$db" --type order.created.v2
check "takeover unknown type" 1 "no route for 'x.y.v1'" -- "$OBX" takeover --db "$db" --to obx --type x.y.v1
check "takeover dry run" 0 "dry run: nothing changed" -- "$OBX" takeover --db "$db" --to new-owner --from obx --percent 50 --dry-run
check "shadow missing feed" 3 "cannot open" -- "$OBX" shadow --db "$db" --feed "$dir/none.jsonl"
n=$(sqlite3 "$dir/o.db" "select count(*) from obx_receipt where kind='MIGRATION'")
g=$(sqlite3 "$dir/o.db" "select count(*) from obx_route where alias='new-owner'")
if [[ $n == 0 && $g == 0 ]]; then echo "ok   nothing stored by refused or dry-run commands"; else echo "FAIL migration receipts $n, routes $g"; fails=$((fails + 1)); fi
check "unknown command" 2 "unknown command" -- "$OBX" frobnicate
# a typo: the likely command in at most three lines (issue 50), not the whole help
check "typo" 2 "obx: unknown command 'reprot'; did you mean 'report'?" -- "$OBX" reprot
n=$("$OBX" reprot 2>&1 | wc -l)
if ((n <= 3)); then echo "ok   a typo answers in $n lines"; else echo "FAIL a typo answers in $n lines"; fails=$((fails + 1)); fi
check "typo, a transposition in a long name" 2 "did you mean 'consumer-test'?" -- "$OBX" consumer-tset
check "typo in obx help" 2 "did you mean 'watermark'?" -- "$OBX" help watremark
check "no near command" 2 "unknown command 'frobnicate'"$'\n'"(\`obx help\` lists the commands)" -- "$OBX" frobnicate
check "typo under --json" 2 '{"code":"usage","message":"unknown command '"'reprot'"'; did you mean '"'report'"'?"' -- "$OBX" reprot --json
check "help" 0 "commands:" -- "$OBX" help
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

#!/usr/bin/env bash
# test_cli_hardening.sh — the obx command fed hostile input: NUL bytes in a payload, invalid
# UTF-8 and control bytes in arguments, SQL metacharacters, oversized payloads, broken
# configuration files, secret references. Each refusal names what was wrong and stores
# nothing; what is accepted reads back byte for byte; no message carries a control byte.
set -u
OBX=${1:?usage: test_cli_hardening.sh path/to/obx}
source "$(dirname "$0")/../support/prologue.sh" clih
source "$(dirname "$0")/../support/expect.sh"
cd "$dir"
# check NAME EXPECTED_RC NEEDLE -- command...: counted, goes on; no escape byte may reach the
# terminal either
check() {
  t_run "$@"
  [[ $t_out != *$'\e'* ]] || bad "$1: an escape byte reached the terminal: $t_out"
}
events() { sqlite3 "$dir/o.db" "select count(*) from obx_event"; }
db=sqlite:$dir/o.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
enq() { "$OBX" enqueue --db "$db" --type order.created.v1 --tenant t1 "$@"; }
echo '{}' >p.json
# refused, nothing stored
check "invalid UTF-8 in aggregate id" 2 "aggregate_id: invalid UTF-8 at byte 2" -- enq --aggregate $'order/o-\xff@1' --payload-file p.json
check "control byte in correlation id" 2 "correlation_id: byte 0x1b" -- enq --aggregate order/o-1@1 --correlation-id $'c\e[2J' --payload-file p.json
check "SQL in tenant" 2 "tenant: byte 0x27" -- "$OBX" enqueue --db "$db" --type order.created.v1 --tenant "t'; DROP TABLE obx_event;--" --aggregate order/o-1@1 --payload-file p.json
check "SQL in topic" 2 "topic: byte 0x27" -- "$OBX" route set x.y.v1 --db "$db" --cluster local --topic "orders'; --"
check "SQL in event type" 2 "event_type: byte 0x27" -- enq --aggregate order/o-1@1 --type "o'.v1" --payload-file p.json
head -c 1048577 /dev/zero >big.bin
check "payload over 1 MiB" 2 "payload: 1048577 bytes, over the limit of 1048576 bytes" -- enq --aggregate order/o-1@1 --payload-file big.bin
: >empty.bin
check "empty payload" 2 "payload: empty" -- enq --aggregate order/o-1@1 --payload-file empty.bin
check "escape in inspected ID" 2 "does not start with 'evt-'" -- "$OBX" inspect $'\e[31mevt' --db "$db"
n=$(events)
if [[ $n == 0 ]]; then echo "ok   nothing stored by the refusals"; else echo "FAIL $n events stored"; fails=$((fails + 1)); fi
# accepted, read back byte for byte: NUL bytes in the payload, SQL metacharacters in free text
printf 'a\0b\0\xff\n' >nul.bin
want=sha256:$(sha256sum nul.bin | cut -d' ' -f1)
id=$(enq --aggregate "order/o'); DELETE FROM obx_event;--@1" --idempotency-key "k' OR '1'='1" --payload-file nul.bin)
check "NUL bytes in the payload: digest of the bytes" 0 "\"payload_digest\": \"$want\"" -- "$OBX" inspect "$id" --db "$db" --json
check "SQL metacharacters stored as data" 0 "o'); DELETE FROM obx_event;--" -- "$OBX" inspect "$id" --db "$db" --json
stored=$(sqlite3 "$dir/o.db" "select hex(payload) from obx_envelope where event_id = '$id'")
if [[ $stored == 61006200FF0A ]]; then echo "ok   payload bytes intact"; else echo "FAIL payload stored as $stored"; fails=$((fails + 1)); fi
# configuration
printf 'db: "sqlite:a.db\\0junk"\n' >nul.yaml
check "NUL escape in configuration" 2 "db (line 1): contains a NUL byte" -- "$OBX" config --config nul.yaml
printf 'relay:\n  dispatchrs: 2\n' >typo.yaml
check "unknown key" 2 "relay.dispatchrs (line 2): unknown configuration key" -- "$OBX" config --config typo.yaml
printf 'relay:\n  dispatchers: [1]\n' >type.yaml
check "wrong type" 2 "relay.dispatchers (line 2): expected a single value" -- "$OBX" config --config type.yaml
"$OBX" config --set relay.batch=7 --broker-prop sasl.password=hunter2 >saved.json
check "config output loads back" 0 '"relay.batch": 7' -- "$OBX" config --config saved.json
check "config output hides the secret" 0 '"sasl.password=***"' -- cat saved.json
# secret references
export OBX_T_PW=hunter2
check "reference in a dumped URL" 0 'u:***@h/db' -- "$OBX" config --db 'postgres://u:${OBX_T_PW}@h/db'
check "unset variable" 2 '${OBX_T_UNSET}: the environment variable is not set' -- "$OBX" init --db 'sqlite:${OBX_T_UNSET}/x.db'
if grep -q hunter2 saved.json; then echo "FAIL secret in the dump"; fails=$((fails + 1)); fi
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

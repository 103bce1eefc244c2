#!/usr/bin/env bash
# test_cli_json.sh OBX [kafka] — `--json` is for programs (issue 50, item 2), checked with jq as a
# program meets it:
#   - every command that takes --json prints exactly one JSON document on stdout (whatever its
#     exit status), and with --json an error is one JSON object on stderr with "code" and
#     "message" (nothing else on stderr, nothing on stdout);
#   - `obx status --watch 1 --json` into a pipe prints one object per line, no terminal codes;
#   - with log.format=json every line the relay writes is a JSON record: its own, librdkafka's
#     (with "kafka", through its log callback) and its final "run:" error.
# (libpq's notices: test_cli_json_pg.sh.)
set -u
OBX=$(realpath "${1:?usage: test_cli_json.sh OBX [kafka]}")
with_kafka=${2:-}
source "$(dirname "$0")/../support/prologue.sh" json
cd "$dir"
fails=0
t0=$SECONDS
bad() { echo "FAIL [$((SECONDS - t0)) s] $*"; fails=$((fails + 1)); }
declare -A seen
# one NAME -- command...: stdout is exactly one JSON document; stderr is empty or JSON objects
one() {
  local name=$1
  shift 2
  seen[${2:-}]=1
  timeout 120 "$@" >out.json 2>err.txt </dev/null
  local rc=$? docs
  docs=$(jq -s length <out.json 2>/dev/null) || docs=invalid
  if [[ $docs != 1 ]]; then
    bad "$name: stdout holds $docs JSON documents (exit $rc): $(head -c 400 out.json)"
  elif [[ -s err.txt ]] && ! jq -e 'type == "object" and has("code") and has("message")' err.txt >/dev/null 2>&1; then
    bad "$name: stderr is not JSON objects with code and message: $(head -c 400 err.txt)"
  else
    echo "ok   [$((SECONDS - t0)) s] $name (exit $rc)"
  fi
}
# err NAME WANT_RC CODE -- command...: one JSON object on stderr with that code, stdout empty
err() {
  local name=$1 want=$2 code=$3
  shift 4
  timeout 60 "$@" >out.txt 2>err.txt </dev/null
  local rc=$?
  if [[ $rc != "$want" ]]; then
    bad "$name: exit $rc, want $want: $(head -c 400 err.txt)"
  elif [[ -s out.txt ]]; then
    bad "$name: stdout not empty: $(head -c 200 out.txt)"
  elif [[ $(jq -s length err.txt 2>/dev/null) != 1 ]] ||
    ! jq -e --arg c "$code" '.code == $c and (.message | type == "string" and length > 0) and .exit_status == '"$want" err.txt >/dev/null; then
    bad "$name: stderr is not one JSON error with code $code: $(head -c 400 err.txt)"
  else
    echo "ok   $name: $(jq -c . err.txt | head -c 160)"
  fi
}
db=sqlite:$dir/o.db
cons=sqlite:$dir/c.db
"$OBX" init --db "$cons" >/dev/null
echo '{"order":"o-1"}' >p.json

one "init" -- "$OBX" init --db "$db" --json
one "route set" -- "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --json
one "route set with a delivery set" -- "$OBX" route set order.set.v1 --db "$db" --cluster local --topic orders --also eu/orders --json
one "route list" -- "$OBX" route list --db "$db" --json
one "enqueue" -- "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-1@1 --tenant tenant-7 --payload-file p.json --correlation-id c-1 --json
id=$(jq -r .event_id out.json)
one "inspect" -- "$OBX" inspect "$id" --db "$db" --json
one "report" -- "$OBX" report --db "$db" --json
one "status" -- "$OBX" status --db "$db" --consumer "proj=$cons" --json
one "trace" -- "$OBX" trace --correlation c-1 --db "$db" --json
one "audit (findings)" -- "$OBX" audit --db "$db" --consumer "proj=$cons" --set audit.pending_max_age_ms=1 --json
one "purge dry run" -- "$OBX" purge --dry-run --db "$db" --consumer "proj=$cons" --json
one "watermark list" -- "$OBX" watermark list --db "$db" --consumer "proj=$cons" --json
one "watermark force" -- "$OBX" watermark force proj --until 1000 --reason test --db "$db" --consumer "proj=$cons" --json
one "resolve (refused)" -- "$OBX" resolve "$id" --retry --who alice --reason INC-1 --db "$db" --json
one "migrate dry run" -- "$OBX" migrate --type order.created.v1 --route-gen 1 --dry-run --db "$db" --json
one "migrate with a new route" -- "$OBX" migrate --type order.created.v1 --cluster local --topic orders-v2 --db "$db" --json
: >empty.jsonl
one "shadow (a difference)" -- "$OBX" shadow --db "$db" --feed empty.jsonl --grace-ms -1 --json
one "takeover" -- "$OBX" takeover --db "$db" --to other --from obx --dry-run --json
printf 'topics:\n  - name: orders.v1\n    owner: shop\n    event_types: [order.created.v1]\n    subscribers: [proj]\n' >catalog.yaml
one "catalog check (findings)" -- "$OBX" catalog check --catalog catalog.yaml --db "$db" --json
one "consumer-test" -- "$OBX" consumer-test --builtin order-projection --json
one "consume" -- "$OBX" consume --consumer-db "sqlite:$dir/proj.db" --broker "log:$dir/b.db" --topic orders --until-idle 300 --json
one "poison list" -- "$OBX" poison list --consumer-db "$cons" --json
one "sim" -- "$OBX" sim --traces 10 --json
one "config" -- "$OBX" config --db "$db"
# a PARKED event to requeue: the broker rejects every send, the route parks after one
"$OBX" route set order.parked.v1 --db "$db" --cluster local --topic parked --max-attempts 1 >/dev/null
"$OBX" enqueue --db "$db" --type order.parked.v1 --aggregate order/o-9@1 --tenant tenant-7 --payload-file p.json --json >parked.json
pid=$(jq -r .event_id parked.json)
"$OBX" relay --db "$db" --broker "log:$dir/rb.db?reject=1" --set relay.poll_ms=10 --set relay.drain_ms=100 >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  [[ $(sqlite3 "$dir/o.db" "select state from obx_event where event_id = '$pid'") == PARKED ]] && break
  sleep 0.1
done
# a relay asked to stop (SIGTERM) drains for relay.drain_ms and exits: waited for 20 s at most,
# so that a relay that does not stop is a failure that names itself, not the test's timeout
kill "${pids[-1]}" 2>/dev/null
for _ in $(seq 200); do kill -0 "${pids[-1]}" 2>/dev/null || break; sleep 0.1; done
if kill -0 "${pids[-1]}" 2>/dev/null; then
  bad "relay still running 20 s after SIGTERM"
  kill -9 "${pids[-1]}" 2>/dev/null
fi
wait "${pids[-1]}" 2>/dev/null
one "requeue" -- "$OBX" requeue "$pid" --db "$db" --json
"$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-8@1 --tenant tenant-7 --payload-file p.json --delay 1h --json >delayed.json
one "cancel" -- "$OBX" cancel "$(jq -r .event_id delayed.json)" --who alice --reason paid --db "$db" --json
one "demo" -- "$OBX" demo --events 20 --lease-ms 200 --dir "$dir/demo" --json

# every command whose help offers --json is covered above
for c in $("$OBX" help | awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on {print $1}'); do
  "$OBX" "$c" --help | grep -q -- '^  --json' || continue
  [[ -n ${seen[$c]:-} ]] || bad "$c takes --json and has no case here"
done

# errors under --json: one object on stderr, code and message, the exit status
err "unknown option" 2 usage -- "$OBX" report --json --bogus
err "option without its value" 2 usage -- "$OBX" status --json --db
err "malformed URL" 2 OBX_EURL -- "$OBX" report --json --db foo.db
err "misspelt scheme" 2 OBX_EURL -- "$OBX" inspect "$id" --json --db sqlit:x
err "missing required option" 2 usage -- "$OBX" enqueue --json --db "$db" --type order.created.v1 --aggregate order/o-2@1
err "unreachable database" 3 OBX_ECONNLOST -- "$OBX" audit --json --db postgres://obx@127.0.0.1:1/x
err "nothing matches" 1 OBX_ENOTFOUND -- "$OBX" trace --json --correlation nobody --db "$db"
err "no route" 1 OBX_ENOROUTE -- "$OBX" enqueue --json --db "$db" --type x.y.v1 --aggregate order/o-2@1 --tenant tenant-7 --payload-file p.json
err "invalid UTF-8 in an argument" 2 usage -- "$OBX" enqueue --json --db "$db" --type order.created.v1 --aggregate $'order-\xff' --tenant tenant-7

# --watch --json into a pipe: one object per line, no terminal codes
timeout -s INT 3.5 "$OBX" status --db "$db" --watch 1 --json >watch.out
lines=$(wc -l <watch.out)
if ((lines < 2)); then
  bad "status --watch --json: $lines lines in 3.5 s"
elif grep -q $'\e' watch.out; then
  bad "status --watch --json wrote terminal codes"
elif ! jq -e '.total >= 2' watch.out >/dev/null || [[ $(jq -c .total watch.out | wc -l) != "$lines" ]]; then
  bad "status --watch --json: not one object per line: $(head -c 300 watch.out)"
else
  echo "ok   status --watch 1 --json | jq .total: $lines objects, one per line"
fi
timeout -s INT 2.5 "$OBX" status --db "$db" --watch 1 >watch.txt
grep -q $'\e' watch.txt && bad "status --watch into a pipe wrote terminal codes"

# log.format=json: every line the relay writes is a JSON record, its final error included
relay_json() { # relay_json NAME SECONDS -- relay arguments...: each stderr line a record
  local name=$1 secs=$2
  shift 3
  timeout -s INT "$secs" "$OBX" relay "$@" --set log.format=json --set relay.drain_ms=100 >relay.out 2>relay.err
  local rc=$? n
  n=$(wc -l <relay.err)
  if [[ -s relay.out ]]; then
    bad "$name: the relay wrote to stdout: $(head -c 200 relay.out)"
  elif ! jq -e 'has("ts") and has("level") and has("component") and has("msg")' relay.err >/dev/null 2>&1 ||
    [[ $(jq -c . relay.err 2>/dev/null | wc -l) != "$n" ]]; then
    bad "$name: a line is not a JSON record: $(grep -v '^{' relay.err | head -3)"
  else
    echo "ok   $name: $n JSON records (exit $rc)"
  fi
}
# waiting for an unreachable database (issue 48), then a relay that cannot run: a schema newer
# than this obx
relay_json "relay waiting for an unreachable database" 3 -- --db postgres://obx@127.0.0.1:1/x --broker "log:$dir/b.db"
jq -s -e 'any(.[]; .level == "warn" and (.msg | contains("unreachable")))' relay.err >/dev/null ||
  bad "no JSON record of the wait: $(head -3 relay.err)"
cp o.db newer.db
sqlite3 newer.db "UPDATE obx_meta SET value = '99' WHERE key = 'schema_version'"
relay_json "relay on a newer schema" 20 -- --db "sqlite:$dir/newer.db" --broker "log:$dir/b.db"
jq -s -e 'any(.[]; .level == "error" and (.msg | startswith("run: ")) and .code == "OBX_ESCHEMA" and .exit_status == 3)' relay.err >/dev/null ||
  bad "the final run: error is not a JSON record: $(tail -2 relay.err)"
relay_json "relay with a malformed setting" 20 -- --db "$db" --set relay.batch=0
jq -s -e 'any(.[]; .code == "OBX_ECONFIG" and .exit_status == 2)' relay.err >/dev/null || bad "configuration error: $(cat relay.err)"
if [[ $with_kafka == kafka ]]; then
  # librdkafka's own lines (connection refused) come through its log callback
  relay_json "relay with an unreachable Kafka" 3 -- --db "$db" --broker kafka://127.0.0.1:1
  jq -s -e 'any(.[]; .component == "kafka" and (.msg | contains("127.0.0.1:1")))' relay.err >/dev/null ||
    bad "no librdkafka record in the relay's log: $(head -5 relay.err)"
fi
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

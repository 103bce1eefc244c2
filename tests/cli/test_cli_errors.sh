#!/usr/bin/env bash
# test_cli_errors.sh OBX — errors that name the right thing (issue 50, item 9), as a script reads
# them (--json: the code):
#   - a database without obx's schema is OBX_ESCHEMA (exit 3), never OBX_ECONFIG: the outbox
#     of report, status, audit, a relay; a consumer's database of audit, poison, status;
#   - a consumer that cannot reach RabbitMQ does not call itself a publisher;
#   - `obx consume --topic nosuchtopic` says the topic does not exist (log broker here; Kafka:
#     test_broker_kafka's test_consume_missing_topic_warns; RabbitMQ refuses a missing queue
#     at once), as a JSON object under --json.
# (A PostgreSQL database that does not exist, OBX_ENODB: test_cli_pg.sh.)
set -u
OBX=$(realpath "${1:?usage: test_cli_errors.sh OBX}")
source "$(dirname "$0")/../support/prologue.sh" errors
cd "$dir"
# code NAME WANT_RC CODE NEEDLE -- command...: the JSON error's code (stderr's last object)
code() {
  local name=$1 want=$2 c=$3 needle=$4
  shift 5
  timeout 60 "$@" >out.txt 2>err.txt </dev/null
  local rc=$? got
  got=$(jq -rs '[.[] | select(.exit_status != null)] | last | .code' err.txt 2>/dev/null)
  if [[ $rc != "$want" || $got != "$c" ]] || ! grep -q -- "$needle" err.txt; then
    bad "$name: exit $rc (want $want), code $got (want $c): $(head -c 400 err.txt)"
  else
    echo "ok   $name: $c"
  fi
}
sqlite3 empty.db 'PRAGMA user_version = 0' # a SQLite database without obx's schema
"$OBX" init --db "sqlite:$dir/o.db" >/dev/null
code "report, no schema" 3 OBX_ESCHEMA "schema version 0" -- "$OBX" report --db "sqlite:$dir/empty.db" --json
code "status, no schema" 3 OBX_ESCHEMA "schema version 0" -- "$OBX" status --db "sqlite:$dir/empty.db" --json
code "audit, no schema" 3 OBX_ESCHEMA "schema version 0" -- "$OBX" audit --db "sqlite:$dir/empty.db" --json
code "audit, a consumer without schema" 3 OBX_ESCHEMA "critical consumer x" -- "$OBX" audit --db "sqlite:$dir/o.db" --consumer "x=sqlite:$dir/empty.db" --json
code "poison, an inbox without schema" 3 OBX_ESCHEMA "schema version 0" -- "$OBX" poison list --consumer-db "sqlite:$dir/empty.db" --json
cp o.db newer.db
sqlite3 newer.db "UPDATE obx_meta SET value = '99' WHERE key = 'schema_version'"
code "relay, a newer schema" 3 OBX_ESCHEMA "schema version 99" -- "$OBX" relay --db "sqlite:$dir/newer.db" --broker "log:$dir/b.db" --set log.format=json --set relay.drain_ms=100
# a relay waits for a schema not made yet (issue 48): it says so, without OBX_ECONFIG
timeout -s INT 3 "$OBX" relay --db "sqlite:$dir/empty.db" --broker "log:$dir/b.db" --set relay.drain_ms=100 >relay.out 2>relay.err
grep -q "no obx schema yet" relay.err && ! grep -q ECONFIG relay.err && echo "ok   relay waiting for a schema: no OBX_ECONFIG" ||
  bad "relay without schema: $(head -3 relay.err)"
"$OBX" status --db "sqlite:$dir/o.db" --consumer "x=sqlite:$dir/empty.db" --json >st.json
jq -e '.consumers[0].error | startswith("OBX_ESCHEMA")' st.json >/dev/null &&
  echo "ok   status: a consumer without schema is OBX_ESCHEMA" || bad "status consumer: $(jq -c .consumers st.json)"
grep -q ECONFIG st.json && bad "OBX_ECONFIG for a missing schema"

# a consumer that cannot reach RabbitMQ: the consumer's error, no publisher
out=$(timeout 30 "$OBX" consume --consumer-db "sqlite:$dir/proj.db" --broker "amqp://guest:guest@127.0.0.1:1/%2f" --topic q --until-idle 100 2>&1)
rc=$?
if [[ $rc == 3 && $out == *"obx consume:"*"cannot connect"* && $out != *publisher* ]]; then
  echo "ok   unreachable RabbitMQ, from a consumer: $out"
else
  bad "unreachable RabbitMQ: exit $rc: $out"
fi

# a topic that does not exist: said, in text and as JSON
out=$(timeout 30 "$OBX" consume --consumer-db "sqlite:$dir/proj.db" --broker "log:$dir/fresh.db" --topic nosuchtopic --until-idle 200 2>&1)
rc=$?
[[ $rc == 0 && $out == *"topic 'nosuchtopic' does not exist"* ]] && echo "ok   a missing topic is named" ||
  bad "missing topic: exit $rc: $out"
out=$(timeout 30 "$OBX" consume --consumer-db "sqlite:$dir/proj.db" --broker "log:$dir/fresh2.db" --topic nosuchtopic --until-idle 200 --json 2>&1 >/dev/null)
jq -e 'select(.level == "warn") | .message | contains("nosuchtopic")' <<<"$out" >/dev/null &&
  echo "ok   under --json the warning is a JSON object" || bad "--json warning: $out"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

#!/usr/bin/env bash
# test_max_payload.sh OBX [sqlite|postgres] — the relay's payload ceiling (issue 53, item 6):
# relay.max_payload (bytes; 0, the default: the outbox's payload limit, PostgreSQL's from
# obx_meta) is checked in the claim, before the payload is read; an event over it is PARKED with
# an audit row naming the ceiling and an ALARM record in the relay's log, and is never sent.
#   1. --set relay.max_payload=100000: a 3 MiB and a 200 KB event are parked, a small one of
#      another key is published; the broker holds no message of either parked one.
#   2. both requeued, the relay on its default: SQLite (1 MiB): the 200 KB event is published,
#      the 3 MiB one parked again; PostgreSQL with obx_meta's payload_limit lowered to 150000
#      after the enqueues: both parked again (the ceiling is the outbox's row, not a constant).
#   3. the figure: the relay's peak RSS while it refuses a 20 MiB payload (printed).
set -u
OBX=$(realpath "${1:?usage: test_max_payload.sh OBX [sqlite|postgres]}")
store=${2:-sqlite}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/obx-maxpl-XXXXXX)
pgdb=
cleanup() {
  [[ -n $pgdb ]] && pg_drop_db "$pgdb"
  rm -rf "$dir"
}
trap cleanup EXIT
cd "$dir"
fails=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
if [[ $store == postgres ]]; then
  source "$here/pgdb.sh"
  pgdb=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
  db=$pgdb
  meta() { psql "$db" -qc "DELETE FROM obx.obx_meta WHERE key = 'payload_limit'" \
    ${1:+-c "INSERT INTO obx.obx_meta VALUES ('payload_limit', '$1')"} >/dev/null; }
else
  db=sqlite:$dir/o.db
  meta() { :; }
fi
broker=log:$dir/broker.db
"$OBX" init --db "$db" >/dev/null || bad "init"
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null 2>&1 || bad "route set"
meta 33554432 # the producers' limit, raised for the big payloads (the owner's row)
blob() { python3 -c "import sys; print('{\"blob\":\"' + 'x' * int(sys.argv[1]) + '\"}')" "$1" >"$2"; }
blob 3145728 big.json
blob 204800 mid.json
blob 20971520 huge.json
enq() { # enq AGGREGATE FILE: prints the event ID
  "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/$1@1" --tenant tenant-7 \
    --payload-file "$2" --payload-limit 33554432
}
big=$(enq big big.json) || bad "enqueue big"
mid=$(enq mid mid.json) || bad "enqueue mid"
echo '{"order":1}' >small.json
small=$(enq small small.json) || bad "enqueue small"
state() { "$OBX" inspect "$1" --db "$db" --json | jq -r .status.state; }
relay() { # relay LOG [--set ...]: runs until the outbox is quiet (3 s)
  local log=$1
  shift
  timeout -s INT 3 "$OBX" relay --db "$db" --broker "$broker" --set relay.poll_ms=20 \
    --set relay.drain_ms=100 "$@" >"$log" 2>&1
}
on_broker() { sqlite3 "$dir/broker.db" "SELECT count(*) FROM obx_log_msg WHERE event_id = '$1'" 2>/dev/null || echo 0; }
# want NAME ID STATE
want() {
  local s
  s=$(state "$2")
  if [[ $s == "$3" ]]; then echo "ok   $1: $3"; else bad "$1: $s (want $3)"; fi
}

# ---- 1. an explicit ceiling ----
relay r1.log --set relay.max_payload=100000
want "3 MiB, ceiling 100000" "$big" PARKED
want "200 KB, ceiling 100000" "$mid" PARKED
want "small, ceiling 100000" "$small" PUBLISHED
for id in "$big" "$mid"; do
  [[ $(on_broker "$id") == 0 ]] || bad "$id was sent: $(on_broker "$id") message(s) on the broker"
  "$OBX" inspect "$id" --db "$db" | grep -q "over the relay's ceiling" ||
    bad "$id: no audit row names the ceiling: $("$OBX" inspect "$id" --db "$db" | tail -5)"
  grep "$id" r1.log | grep -q "ALARM payload of" || bad "$id: no ALARM in the relay's log: $(grep -c . r1.log) lines"
done
grep -q "ALARM payload of 3145740 bytes" r1.log && echo "ok   the ALARM names the size" ||
  bad "the ALARM does not name the size: $(grep ALARM r1.log | head -2)"

# ---- 2. the default: the outbox's payload limit ----
"$OBX" requeue "$big" --db "$db" >/dev/null || bad "requeue big"
"$OBX" requeue "$mid" --db "$db" >/dev/null || bad "requeue mid"
if [[ $store == postgres ]]; then
  meta 150000
  relay r2.log
  want "3 MiB, obx_meta's limit 150000" "$big" PARKED
  want "200 KB, obx_meta's limit 150000" "$mid" PARKED
else
  relay r2.log
  want "3 MiB, the default 1 MiB" "$big" PARKED
  want "200 KB, the default 1 MiB" "$mid" PUBLISHED
fi
[[ $(on_broker "$big") == 0 ]] || bad "$big was sent on the default ceiling"

# ---- 3. the relay's memory while it refuses a 20 MiB payload ----
meta 33554432
huge=$(enq huge huge.json) || bad "enqueue huge"
meta
/usr/bin/time -f %M -o rss.txt timeout -s INT 3 "$OBX" relay --db "$db" --broker "$broker" \
  --set relay.poll_ms=20 --set relay.drain_ms=100 >r3.log 2>&1
want "20 MiB, the default" "$huge" PARKED
echo "figure: the relay's peak RSS while refusing a 20 MiB payload ($store): $(tail -1 rss.txt) KiB"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

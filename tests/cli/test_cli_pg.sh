#!/usr/bin/env bash
# test_cli_pg.sh OBX — the command line on PostgreSQL as scripts meet it (issue 50), on a fresh
# database of OBX_TEST_PG_URL (tests/e2e/pgdb.sh; fails without a server):
#   - with log.format=json, the server's notices and warnings on the relay's connections
#     (libpq's notice receiver) are JSON records like every other line it writes.
set -u
OBX=$(realpath "${1:?usage: test_cli_pg.sh OBX}")
source "$(dirname "$0")/../e2e/pgdb.sh"
dir=$(mktemp -d /tmp/obx-clipg-XXXXXX)
db=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
cleanup() {
  pg_drop_db "$db"
  rm -rf "$dir"
}
trap cleanup EXIT
cd "$dir"
fails=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

# ---- libpq's notices in the relay's JSON log ----
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
# a trigger of the test's own: every claim of an event makes the server warn the relay's session
psql "$db" -q <<'SQL'
CREATE FUNCTION public.warn_claim() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN RAISE WARNING 'obx-test-notice: % is %', NEW.event_id, NEW.state; RETURN NEW; END$$;
CREATE TRIGGER warn_claim AFTER UPDATE ON obx.obx_event FOR EACH ROW EXECUTE FUNCTION public.warn_claim();
SQL
echo '{"order":1}' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-1@1 --tenant tenant-7 >/dev/null
timeout -s INT 3 "$OBX" relay --db "$db" --broker "log:$dir/b.db" --set log.format=json \
  --set relay.poll_ms=10 --set relay.drain_ms=100 >relay.out 2>relay.err
n=$(wc -l <relay.err)
if ! jq -e 'has("ts") and has("level") and has("component") and has("msg")' relay.err >/dev/null 2>&1 ||
  [[ $(jq -c . relay.err 2>/dev/null | wc -l) != "$n" ]]; then
  bad "a line of the relay's log is not a JSON record: $(grep -v '^{' relay.err | head -3)"
elif ! jq -s -e 'any(.[]; .component == "postgres" and .level == "warn" and (.msg | contains("obx-test-notice")))' relay.err >/dev/null; then
  bad "the server's warning is not a record of the relay's log: $(head -c 600 relay.err)"
else
  echo "ok   the server's warnings are JSON records ($n records)"
fi
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

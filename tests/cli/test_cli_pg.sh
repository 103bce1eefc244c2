#!/usr/bin/env bash
# test_cli_pg.sh OBX — the command line on PostgreSQL as scripts meet it (issue 50), on a fresh
# database of OBX_TEST_PG_URL (tests/e2e/pgdb.sh; fails without a server):
#   - with log.format=json, the server's notices and warnings on the relay's connections
#     (libpq's notice receiver) are JSON records like every other line it writes;
#   - a database that does not exist is OBX_ENODB (not a lost connection): "no such outbox"
#     for the commands that only read, exit 3 everywhere; one without obx's schema is
#     OBX_ESCHEMA.
set -u
OBX=$(realpath "${1:?usage: test_cli_pg.sh OBX}")
source "$(dirname "$0")/../support/prologue.sh" clipg
use_store postgres || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
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
# ---- a database that does not exist; one without obx's schema ----
missing=${db%/*}/obx_no_such_db_$$
out=$("$OBX" report --db "$missing" 2>&1)
rc=$?
[[ $rc == 3 && $out == "obx report: no such outbox: ${missing}" ]] && echo "ok   report: $out" || bad "report on a missing database: exit $rc: $out"
for c in "init" "audit" "status" "route list"; do
  # shellcheck disable=SC2086 # a subcommand is a word of its own
  out=$("$OBX" $c --db "$missing" --json 2>&1 >/dev/null)
  rc=$?
  if [[ $rc == 3 ]] && jq -e '.code == "OBX_ENODB" and (.message | contains("does not exist") or contains("no such outbox"))' <<<"$out" >/dev/null; then
    echo "ok   $c on a missing database: OBX_ENODB"
  else
    bad "$c on a missing database: exit $rc: $out"
  fi
done
bare=$(pg_fresh_db)
out=$("$OBX" report --db "$bare" --json 2>&1 >/dev/null)
rc=$?
[[ $rc == 3 ]] && jq -e '.code == "OBX_ESCHEMA"' <<<"$out" >/dev/null && echo "ok   a database without obx's schema: OBX_ESCHEMA" ||
  bad "no schema: exit $rc: $out"
out=$("$OBX" audit --db "$bare" --json 2>&1 >/dev/null)
jq -e '.code == "OBX_ESCHEMA"' <<<"$out" >/dev/null || bad "audit, no schema: $out"
pg_drop_db "$bare"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

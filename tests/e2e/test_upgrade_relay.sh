#!/usr/bin/env bash
# test_upgrade_relay.sh — `obx init` does not migrate a PostgreSQL outbox under a running relay
# (docs/operations.md, "Upgrading obx"). A real `obx relay` process runs on a fresh database;
# each of its connections holds the schema-in-use lock (pg_store.c, pg_schema_hold). The
# database's recorded schema version is then set one behind, as after installing a newer obx:
# `obx init` must exit 1 with OBX_EBUSY, name every server process that holds the lock, and
# change nothing. With the relay stopped, nothing holds it. Usage: test_upgrade_relay.sh OBX
# (a fresh database on OBX_TEST_PG_URL; tests/e2e/pgdb.sh).
set -euo pipefail
OBX=${1:?usage: test_upgrade_relay.sh OBX}
source "$(dirname "$0")/pgdb.sh"
dir=$(mktemp -d /tmp/obx-upgrade-relay-XXXXXX)
db=$(pg_fresh_db)
relay_pid=
cleanup() {
  [[ -z $relay_pid ]] || kill -9 "$relay_pid" 2>/dev/null || true
  pg_drop_db "$db"
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "test_upgrade_relay: $*" >&2
  sed 's/^/  relay: /' "$dir/relay.log" >&2 || true
  exit 1
}
q() { psql "$db" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
holders="SELECT coalesce(string_agg(pid::text, ' ' ORDER BY pid), '') FROM pg_locks WHERE
  locktype = 'advisory' AND classid = 5194329 AND objid = 1 AND granted AND
  database = (SELECT oid FROM pg_database WHERE datname = current_database())"

"$OBX" init --db "$db" >/dev/null
"$OBX" relay --db "$db" --broker "log:$dir/broker.db" --id r1 >"$dir/relay.log" 2>&1 &
relay_pid=$!
# the dispatchers and the reconciler each hold it once connected
pids=
for _ in $(seq 400); do
  pids=$(q "$holders")
  (($(wc -w <<<"$pids") >= 2)) && break
  sleep 0.05
done
(($(wc -w <<<"$pids") >= 2)) || fail "the relay's connections hold no schema lock ('$pids')"
cur=$(q "SELECT value FROM obx.obx_meta WHERE key = 'schema_version'")
q "UPDATE obx.obx_meta SET value = '$((cur - 1))' WHERE key = 'schema_version'"
pids=$(q "$holders")
rc=0
"$OBX" init --db "$db" >"$dir/init.out" 2>"$dir/init.err" || rc=$?
((rc == 1)) || fail "obx init under a relay exited $rc: $(cat "$dir/init.out" "$dir/init.err")"
grep -q "OBX_EBUSY" "$dir/init.err" || fail "no OBX_EBUSY: $(cat "$dir/init.err")"
grep -q "stop the relays" "$dir/init.err" || fail "no advice: $(cat "$dir/init.err")"
for p in $pids; do
  grep -qw "$p" "$dir/init.err" || fail "server pid $p not named: $(cat "$dir/init.err")"
done
[[ $(q "SELECT value FROM obx.obx_meta WHERE key = 'schema_version'") == $((cur - 1)) ]] ||
  fail "the refused init changed the schema version"
kill -TERM "$relay_pid"
wait "$relay_pid" || true
relay_pid=
for _ in $(seq 200); do
  [[ -z $(q "$holders") ]] && break
  sleep 0.05
done
[[ -z $(q "$holders") ]] || fail "a stopped relay still holds the schema: $(q "$holders")"
q "UPDATE obx.obx_meta SET value = '$cur' WHERE key = 'schema_version'"
"$OBX" init --db "$db" >/dev/null
echo "test_upgrade_relay: ok; obx init under the relay said:"
cat "$dir/init.err"

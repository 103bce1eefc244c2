#!/usr/bin/env bash
# test_upgrade_relay.sh — a PostgreSQL outbox's schema version and the relays that use it
# (docs/operations.md, "Upgrading obx"). A real `obx relay` process runs on a fresh database:
# each of its connections holds the schema-in-use lock (pg_store.c, pg_schema_hold), which is
# what keeps `obx init` of a newer obx from migrating under it (that refusal needs a database one
# version behind the binary; test_store_pg's test_init_refuses_under_relay makes one up); an
# init with nothing to migrate runs under it; a stopped relay holds nothing. A database whose
# recorded version is newer than this obx's, as after a newer obx migrated it, is refused by
# `obx relay` and `obx init` alike (exit 3: could not, OBX_ESCHEMA, naming both versions) and changed by
# neither. Usage: test_upgrade_relay.sh OBX (a fresh database on OBX_TEST_PG_URL;
# tests/e2e/pgdb.sh).
set -euo pipefail
OBX=${1:?usage: test_upgrade_relay.sh OBX}
source "$(dirname "$0")/../support/prologue.sh" upgrade-relay
use_store postgres
relay_pid=
on_exit '[[ -z $relay_pid ]] || kill -9 "$relay_pid" 2>/dev/null || true'
fail() {
  echo "test_upgrade_relay: $*" >&2
  sed 's/^/  relay: /' "$dir/relay.log" >&2 || true
  exit 1
}
q() { psql "$db" -qAtX -v ON_ERROR_STOP=1 -c "$1"; }
holders="SELECT coalesce(string_agg(pid::text, ' ' ORDER BY pid), '') FROM pg_locks WHERE
  locktype = 'advisory' AND classid = 5194329 AND objid = 1 AND granted AND
  database = (SELECT oid FROM pg_database WHERE datname = current_database())"
version="SELECT value FROM obx.obx_meta WHERE key = 'schema_version'"

"$OBX" init --db "$db" >/dev/null
cur=$(q "$version")
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
"$OBX" init --db "$db" >"$dir/init.out" 2>&1 ||
  fail "obx init with nothing to migrate, under a relay: $(cat "$dir/init.out")"
grep -q "schema version $cur is current" "$dir/init.out" || fail "init said: $(cat "$dir/init.out")"
kill -TERM "$relay_pid"
wait "$relay_pid" || true
relay_pid=
for _ in $(seq 200); do
  [[ -z $(q "$holders") ]] && break
  sleep 0.05
done
[[ -z $(q "$holders") ]] || fail "a stopped relay still holds the schema: $(q "$holders")"

# a newer obx's schema: this obx's relay and init refuse it and leave it as it is
newer=$((cur + 1))
q "UPDATE obx.obx_meta SET value = '$newer' WHERE key = 'schema_version'"
for cmd in relay init; do
  args=(--db "$db")
  said="schema version $newer is newer than this obx knows ($cur)"
  if [[ $cmd == relay ]]; then
    args+=(--broker "log:$dir/broker.db" --id r2)
    said="schema version $newer, this relay needs $cur"
  fi
  rc=0
  timeout 60 "$OBX" "$cmd" "${args[@]}" >"$dir/$cmd.out" 2>"$dir/$cmd.err" || rc=$?
  ((rc == 3)) || fail "obx $cmd on schema version $newer exited $rc: $(cat "$dir/$cmd.err")"
  grep -q "OBX_ESCHEMA" "$dir/$cmd.err" || fail "obx $cmd: no OBX_ESCHEMA: $(cat "$dir/$cmd.err")"
  grep -qF "$said" "$dir/$cmd.err" || fail "obx $cmd: $(cat "$dir/$cmd.err")"
  [[ $(q "$version") == "$newer" ]] || fail "obx $cmd changed the schema version"
done
for _ in $(seq 200); do
  [[ -z $(q "$holders") ]] && break
  sleep 0.05
done
[[ -z $(q "$holders") ]] || fail "a refused relay holds the schema: $(q "$holders")"
q "UPDATE obx.obx_meta SET value = '$cur' WHERE key = 'schema_version'"
"$OBX" init --db "$db" >/dev/null
echo "test_upgrade_relay: ok; on a newer schema obx relay and obx init said:"
grep -h "OBX_ESCHEMA" "$dir/relay.err" "$dir/init.err" | tail -2

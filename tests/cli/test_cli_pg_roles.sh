#!/usr/bin/env bash
# test_cli_pg_roles.sh OBX — the command line on PostgreSQL under roles that may do less (issue
# 50), on a fresh database of OBX_TEST_PG_URL (tests/e2e/pgdb.sh; fails without a server):
#   - a permission the server denies (SQLSTATE 42501) is "could not check": exit 3 and code
#     OBX_EDENIED, not a finding (exit 1), for each command family a monitoring check runs
#     (report, status, audit), with no grant at all (denied at open) and with only the schema
#     version readable (denied mid-command), in text and in --json (a JSON error on stderr);
#   - `obx migrate/resolve/takeover --dry-run` open a read-only session: they succeed under a
#     role that may only SELECT (USAGE on schema obx, SELECT on its tables) and change no row.
set -u
OBX=$(realpath "${1:?usage: test_cli_pg_roles.sh OBX}")
source "$(dirname "$0")/../e2e/pgdb.sh"
dir=$(mktemp -d /tmp/obx-clipgr-XXXXXX)
db=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
P=obxr$$
cleanup() {
  pg_drop_db "$db"
  for r in "${P}_none" "${P}_meta" "${P}_ro"; do
    psql "$OBX_TEST_PG_URL" -qc "DROP ROLE IF EXISTS $r" >/dev/null 2>&1
  done
  rm -rf "$dir"
}
trap cleanup EXIT
source "$(dirname "$0")/../support/expect.sh" # fails, bad, t NAME WANT NEEDLE -- CMD, as_reader
cd "$dir"
# as ROLE: the database's URL with another user
as() { python3 -c 'import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1]); h = p.netloc.split("@")[-1]
print(u.urlunsplit((p.scheme, sys.argv[2] + "@" + h, p.path, p.query, "")))' "$db" "$1"; }

three_orders "$db"
id=$(psql "$db" -Atc "SELECT event_id FROM obx.obx_event ORDER BY seq LIMIT 1")
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders-2 >/dev/null 2>&1 || bad "route set 2"
psql "$db" -q -v ON_ERROR_STOP=1 <<SQL || bad "roles"
CREATE ROLE ${P}_none LOGIN;
CREATE ROLE ${P}_meta LOGIN;
GRANT USAGE ON SCHEMA obx TO ${P}_meta;
GRANT SELECT ON obx.obx_meta TO ${P}_meta;
CREATE ROLE ${P}_ro LOGIN;
GRANT USAGE ON SCHEMA obx TO ${P}_ro;
GRANT SELECT ON ALL TABLES IN SCHEMA obx TO ${P}_ro;
SQL

# ---- permission denied: exit 3, OBX_EDENIED ----
for r in none meta; do
  u=$(as "${P}_$r")
  t "report as $r" 3 "OBX_EDENIED" -- "$OBX" report --db "$u"
  t "report --json as $r" 3 '"code":"OBX_EDENIED"' -- "$OBX" report --db "$u" --json
  t "status as $r" 3 "OBX_EDENIED" -- "$OBX" status --db "$u"
  t "status --json as $r" 3 '"code":"OBX_EDENIED"' -- "$OBX" status --db "$u" --json
  t "audit as $r" 3 "OBX_EDENIED" -- "$OBX" audit --db "$u"
  t "audit --json as $r" 3 '"code":"OBX_EDENIED"' -- "$OBX" audit --db "$u" --json
done
# the owner's view of the same database: all good (the roles, not the outbox, were the problem)
t "report as the owner" 0 "" -- "$OBX" report --db "$db"

# ---- dry runs under a role that may only SELECT: they succeed and change nothing ----
rows() {
  psql "$db" -Atc "SELECT (SELECT md5(string_agg(e::text, ',' ORDER BY seq)) FROM obx.obx_event e),
    (SELECT count(*) FROM obx.obx_route), (SELECT count(*) FROM obx.obx_audit),
    (SELECT count(*) FROM obx.obx_attempt)"
}
before=$(rows)
ro=$(as "${P}_ro")
t "migrate --dry-run (SELECT only)" 0 "dry run" -- "$OBX" migrate --db "$ro" \
  --type order.created.v1 --route-gen 2 --dry-run
t "migrate --cluster/--topic --dry-run (SELECT only)" 0 "dry run" -- "$OBX" migrate --db "$ro" \
  --type order.created.v1 --cluster local --topic orders-3 --dry-run
t "takeover --dry-run (SELECT only)" 0 "dry run" -- "$OBX" takeover --db "$ro" \
  --to other --type order.created.v1 --backlog --dry-run
t "resolve --held --dry-run (SELECT only)" 0 "dry run: nothing changed" -- "$OBX" resolve \
  --held --older-than 0s --retry --dry-run --db "$ro" --who ops --reason r
t "resolve EVENT --dry-run (SELECT only)" 1 "1 refused" -- "$OBX" resolve "$id" --retry \
  --dry-run --db "$ro" --who ops --reason r
after=$(rows)
[[ $before == "$after" ]] || bad "the dry runs changed rows: before $before, after $after"
# without --dry-run the same role is denied its write: exit 3, OBX_EDENIED
t "takeover (no dry run, SELECT only)" 3 "OBX_EDENIED" -- "$OBX" takeover --db "$ro" \
  --to other --type order.created.v1
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

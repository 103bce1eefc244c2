#!/usr/bin/env bash
# check_pg_schema.sh OBX — the rules every object of obx's PostgreSQL schema keeps (issue 53;
# docs/security.md), checked in the catalog of a database `obx init` just made (with the obx_pg
# extension when the server has it), on a fresh database of OBX_TEST_PG_URL:
#   - every function in the schema obx, trigger functions and the extension's included, pins
#     search_path = pg_catalog, pg_temp: a function resolves its operators and functions by the
#     caller's search_path otherwise, and a role with CREATE on any schema of that path (public,
#     for everyone, on PostgreSQL 13 and 14) could put its own `=` or `||` in front of
#     PostgreSQL's, inside a trigger that guards frozen data or a function another role trusts;
#   - every view in the schema obx is a security_barrier: a caller's own function in a WHERE
#     clause runs only on the rows the view lets through;
#   - no function of the schema calls one of its LANGUAGE sql functions: pinned to search_path,
#     such a function is never inlined and is parsed and planned again at every call (a ULID
#     helper of that kind cost obx._enqueue_sql() ~730,000 instructions per enqueue, 37 % of it;
#     PL/pgSQL keeps its plans for the session). A top-level call (obx._compact_stats(),
#     obx.inbox_redrives()) plans once per statement anyway.
# Prints each offender and fails when there is one.
set -u
OBX=$(realpath "${1:?usage: check_pg_schema.sh OBX}")
source "$(dirname "$0")/../e2e/pgdb.sh"
db=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
trap 'pg_drop_db "$db"' EXIT
"$OBX" init --db "$db" >/dev/null || { echo "FAIL: obx init"; exit 1; }
offenders=$(psql "$db" -XAtq <<'SQL'
SELECT 'function without SET search_path = pg_catalog, pg_temp: ' || p.oid::regprocedure
  FROM pg_proc p
 WHERE p.pronamespace = 'obx'::regnamespace
   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
UNION ALL
SELECT 'view without security_barrier: ' || c.oid::regclass
  FROM pg_class c
 WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind IN ('v', 'm')
   AND NOT coalesce('security_barrier=true' = ANY (c.reloptions), false)
UNION ALL
SELECT 'calls the LANGUAGE sql function ' || f.proname || ': ' || c.oid::regprocedure
  FROM pg_proc c, pg_proc f
 WHERE c.pronamespace = 'obx'::regnamespace AND f.pronamespace = 'obx'::regnamespace
   AND f.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql') AND c.oid <> f.oid
   AND c.prosrc ~ ('obx\.' || f.proname || '\s*\(')
ORDER BY 1;
SQL
) || { echo "FAIL: the catalog query"; exit 1; }
n=$(psql "$db" -XAtqc "SELECT count(*) FROM pg_proc WHERE pronamespace = 'obx'::regnamespace")
if [[ -n $offenders ]]; then
  echo "$offenders"
  echo "FAIL: $(grep -c . <<<"$offenders") object(s) of the schema obx break its rules"
  exit 1
fi
echo "ok: $n functions pin search_path and call no LANGUAGE sql function, every view is a security barrier"

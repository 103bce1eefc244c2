#!/usr/bin/env bash
# pgdb.sh — sourced by e2e tests: `pg_fresh_db` creates an empty database on the server named
# by OBX_TEST_PG_URL and prints its URL; `pg_drop_db URL` drops it. Fails loudly without a
# server (a suite whose server is missing must fail in CI, not skip).
pg_fresh_db() {
  : "${OBX_TEST_PG_URL:?OBX_TEST_PG_URL is not set: run scripts/test.sh or source scripts/services.sh}"
  local name="obx_e2e_$$_$RANDOM"
  psql "$OBX_TEST_PG_URL" -qc "CREATE DATABASE $name" >/dev/null || return 1
  python3 - "$OBX_TEST_PG_URL" "$name" <<'PY'
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
print(u.urlunsplit((p.scheme, p.netloc, "/" + sys.argv[2], p.query, "")))
PY
}
pg_drop_db() {
  local name=${1##*/}
  name=${name%%\?*}
  psql "$OBX_TEST_PG_URL" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null 2>&1 || true
}

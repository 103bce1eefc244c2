#!/usr/bin/env bash
# test_pg_attacks.sh OBX — an attacker holding each of obx's PostgreSQL roles (issue 53;
# docs/security.md, "Threat model"), on fresh databases of OBX_TEST_PG_URL (a superuser; fails
# without a server). `obx init --roles obxatk` makes the roles; login roles get them, and every
# role gets CREATE on the schema public, as everyone has on PostgreSQL 13 and 14. Each attack
# must be refused (the SQLSTATE named) or come to nothing (the check named):
#   squatter  (CREATE on the database) makes the schema obx before `obx init`: init refuses it;
#   producer  replaces a function of obx; reads another producer's events through its own
#             function in a WHERE clause over obx.producer_events; raises the payload limit in
#             its session or in obx_meta; takes another producer's idempotency key with another
#             event; reads or writes the outbox tables; calls obx._enqueue_c() directly; runs
#             obx.enqueue() under its own `=` for text and bytea in public;
#   relay     rewrites a frozen payload under its own `=` for bytea in public, first in its
#             search_path (the frozen-envelope triggers pin theirs); forges an envelope
#             generation; deletes envelopes; replaces a trigger function; changes routes or the
#             payload limit;
#   auditor   writes anything;
#   consumer  reads the outbox; grants itself a consumer ID; is stopped by another consumer's
#             stale grant (a dropped role); parks an event another instance applied.
# Prints one line per attack and fails when one is not refused.
set -u
OBX=$(realpath "${1:?usage: test_pg_attacks.sh OBX}")
source "$(dirname "$0")/../e2e/pgdb.sh"
P=obxatk
LOGINS="${P}_p1 ${P}_p2 ${P}_r ${P}_a ${P}_c ${P}_gone ${P}_squat"
db=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
db2=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
drop_roles() {
  local r
  for r in $LOGINS ${P}_producer ${P}_relay ${P}_auditor ${P}_consumer; do
    psql "$OBX_TEST_PG_URL" -qc "DROP ROLE IF EXISTS $r" >/dev/null 2>&1
  done
}
cleanup() {
  pg_drop_db "$db"
  pg_drop_db "$db2"
  drop_roles
}
trap cleanup EXIT
drop_roles
fails=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
as() { echo "${2/\/\/postgres@/\/\/$1@}"; } # the URL of role $1 in database URL $2
# run ROLE DB SQL: psql as ROLE, verbose errors (with their SQLSTATE), output and errors together
run() { psql "$(as "$1" "$2")" -XAtq -v VERBOSITY=verbose 2>&1 <<<"SET client_min_messages = warning; $3"; }
# refused ROLE SQLSTATE WHAT SQL: the statement fails with that SQLSTATE
refused() {
  local out
  out=$(run "$1" "$db" "$4")
  if grep -q "ERROR:  $2:" <<<"$out"; then echo "ok   $1: $3: refused ($2)"; else bad "$1: $3: not refused with $2: $(head -c 300 <<<"$out")"; fi
}
# gives ROLE WANT WHAT SQL: the statement's output is WANT
gives() {
  local out
  out=$(run "$1" "$db" "$4")
  if [[ $out == "$2" ]]; then echo "ok   $1: $3: $2"; else bad "$1: $3: expected '$2', got: $(head -c 300 <<<"$out")"; fi
}

# ---- the squatter: a role with CREATE on the database makes the schema obx first ----
psql "$OBX_TEST_PG_URL" -qc "CREATE ROLE ${P}_squat LOGIN" >/dev/null
psql "$db2" -qc "GRANT CREATE ON DATABASE ${db2##*/} TO ${P}_squat" >/dev/null
psql "$(as ${P}_squat "$db2")" -qc "CREATE SCHEMA obx" >/dev/null
if out=$("$OBX" init --db "$db2" 2>&1); then
  bad "squatter: obx init took a schema obx the squatter owns: $out"
elif ! grep -q "${P}_squat" <<<"$out"; then
  bad "squatter: obx init refused without naming the owner: $out"
else
  echo "ok   squatter: obx init refuses its schema, naming it"
fi

# ---- the outbox, the roles, the logins ----
"$OBX" init --db "$db" --roles $P >/dev/null || { echo "FAIL: obx init"; exit 1; }
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null || exit 1
psql "$db" -q >/dev/null <<SQL || { echo "FAIL: setup"; exit 1; }
CREATE ROLE ${P}_p1 LOGIN IN ROLE ${P}_producer;
CREATE ROLE ${P}_p2 LOGIN IN ROLE ${P}_producer;
CREATE ROLE ${P}_r LOGIN IN ROLE ${P}_relay;
CREATE ROLE ${P}_a LOGIN IN ROLE ${P}_auditor;
CREATE ROLE ${P}_c LOGIN IN ROLE ${P}_consumer;
CREATE ROLE ${P}_gone LOGIN IN ROLE ${P}_consumer;
GRANT CREATE ON SCHEMA public TO PUBLIC; -- PostgreSQL 13 and 14 by default
INSERT INTO obx.obx_consumer_grant VALUES ('${P}_gone', 'proj', '*'), ('${P}_c', 'proj', 'tenant-a');
SQL
ENQ="SELECT obx.enqueue('order.created.v1', 'order'"
secret=$(run ${P}_p2 "$db" "$ENQ, 'o-secret', 1, 'tenant-secret', '\\x7b7d', NULL, 'corr-secret', NULL, NULL, 'key-secret')")
[[ $secret == evt-* ]] || bad "producer 2 cannot enqueue: $secret"
own=$(run ${P}_p1 "$db" "$ENQ, 'o-1', 1, 'tenant-a', '\\x7b7d')")
[[ $own == evt-* ]] || bad "producer 1 cannot enqueue: $own"

# ---- producer ----
SIG="obx._enqueue_sql(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz, timestamptz)"
refused ${P}_p1 42501 "replace obx._enqueue_sql" \
  "CREATE OR REPLACE FUNCTION $SIG RETURNS text LANGUAGE sql AS \$\$ SELECT 'x' \$\$"
out=$(psql "$(as ${P}_p1 "$db")" -XAtq 2>&1 <<'SQL'
CREATE FUNCTION pg_temp.peek(text) RETURNS boolean LANGUAGE plpgsql COST 0.0001 AS
  $$ BEGIN RAISE WARNING 'peek %', $1; RETURN true; END $$;
SELECT count(*) FROM obx.producer_events
 WHERE pg_temp.peek(tenant || ' ' || aggregate_id || ' ' || coalesce(idempotency_key, '') || ' ' || correlation_id);
SQL
)
if grep -q secret <<<"$out"; then bad "producer: its function saw another producer's event: $out"
elif ! grep -q 'peek tenant-a' <<<"$out"; then bad "producer: the leak probe did not run: $out"
else echo "ok   ${P}_p1: a function over obx.producer_events sees only its own rows"; fi
refused ${P}_p1 OB003 "SET obx.payload_limit, then a 2 MB payload" \
  "SET obx.payload_limit = '200000000'; $ENQ, 'o-2', 1, 'tenant-a', convert_to(repeat('x', 2000000), 'UTF8'))"
refused ${P}_p1 42501 "raise the limit in obx_meta" "INSERT INTO obx.obx_meta VALUES ('payload_limit', '200000000')"
refused ${P}_p1 OB005 "another event under producer 2's idempotency key" \
  "$ENQ, 'o-mine', 1, 'tenant-secret', '\\x5b5d', NULL, NULL, NULL, NULL, 'key-secret')"
refused ${P}_p1 42501 "read obx_event" "SELECT count(*) FROM obx.obx_event"
refused ${P}_p1 42501 "read obx_envelope" "SELECT count(*) FROM obx.obx_envelope"
refused ${P}_p1 42501 "move an event" "UPDATE obx.obx_event SET state = 'PUBLISHED'"
refused ${P}_p1 42501 "call obx._enqueue_c() directly" \
  "SELECT obx._enqueue_c('order.created.v1', 'order', 'o', 1, 't', '\\x7b7d', NULL, NULL, NULL, NULL, NULL, NULL)"
gives ${P}_p1 "1" "obx.enqueue() under its own = for text and bytea, first in search_path" "$(cat <<SQL
CREATE FUNCTION public.atk_eq(bytea, bytea) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR public.= (LEFTARG = bytea, RIGHTARG = bytea, FUNCTION = public.atk_eq);
CREATE FUNCTION public.atk_teq(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.atk_teq);
SET search_path = public, pg_catalog;
DO \$\$ BEGIN PERFORM obx.enqueue('order.created.v1', 'order', 'o-3', 1, 'tenant-a', '\\x7b7d'); END \$\$;
SELECT count(*) FROM obx.producer_events WHERE aggregate_id OPERATOR(pg_catalog.=) 'o-3'
   AND payload_digest OPERATOR(pg_catalog.=) ('sha256:' || encode(sha256('\\x7b7d'::bytea), 'hex'));
SQL
)"

# ---- relay ----
refused ${P}_r OB001 "rewrite a frozen payload under its own = for bytea" "$(cat <<SQL
SET search_path = public, pg_catalog;
UPDATE obx.obx_envelope SET payload = '\\x666f72676564' WHERE event_id = '$own';
SQL
)"
refused ${P}_r OB001 "forge an envelope generation" "INSERT INTO obx.obx_envelope SELECT event_id, 2,
  aggregate_type, aggregate_id, aggregate_version, event_type, payload_schema, 'sha256:' || repeat('0', 64), tenant,
  occurred_at, created_txid, correlation_id, causation_id, traceparent, idempotency_key, envelope_digest,
  dest_cluster, dest_topic, dest_routing_key, dest_algorithm, dest_route_gen, dest_serializer, dest_durability,
  dest_acks, dest_digest, '\\x666f72676564', payload_len, created_at FROM obx.obx_envelope WHERE event_id = '$own'"
refused ${P}_r 42501 "delete envelopes" "DELETE FROM obx.obx_envelope"
refused ${P}_r 42501 "replace the trigger function obx._refuse" \
  "CREATE OR REPLACE FUNCTION obx._refuse() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN RETURN NEW; END \$\$"
refused ${P}_r 42501 "change a route" "INSERT INTO obx.obx_route (event_type, cluster, topic) VALUES ('x.v1', 'c', 't')"
refused ${P}_r 42501 "raise the payload limit" "INSERT INTO obx.obx_meta VALUES ('payload_limit', '200000000')"
gives ${P}_r "7b7d" "the payload after the attacks" \
  "SELECT encode(payload, 'hex') FROM obx.obx_envelope WHERE event_id = '$own'"

# ---- auditor ----
refused ${P}_a 42501 "move an event" "UPDATE obx.obx_event SET state = 'PUBLISHED'"
refused ${P}_a 42501 "write obx_meta" "INSERT INTO obx.obx_meta VALUES ('payload_limit', '1')"
refused ${P}_a 42501 "write a receipt" "DELETE FROM obx.obx_receipt"

# ---- consumer ----
psql "$OBX_TEST_PG_URL" -qc "DROP ROLE ${P}_gone" >/dev/null # its grant row stays
RECV="SELECT decision FROM obx.inbox_receive('proj', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 1,
  'sha256:' || encode(sha256('\\x7b7d'::bytea), 'hex'), 'orders', 0, 1, '\\x7b7d'::bytea, 'order.created.v1', 'tenant-a')"
refused ${P}_c 42501 "read obx_event" "SELECT count(*) FROM obx.obx_event"
refused ${P}_c 42501 "grant itself another consumer ID" "INSERT INTO obx.obx_consumer_grant VALUES ('${P}_c', 'other', '*')"
gives ${P}_c "process" "receive beside a dropped role's grant (stale instance: rolls back)" "BEGIN; $RECV; ROLLBACK;"
gives ${P}_c "process" "another instance receives and applies" \
  "BEGIN; $RECV; SELECT obx.inbox_applied('proj', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 'done'); COMMIT;"
gives ${P}_c "duplicate" "the stale instance parks the applied event as poison" \
  "SELECT decision FROM obx.inbox_failed('proj', 'evt-01HZX3K9QW8E7R6T5Y4V3J2A01', 'x', 5, true)"
gives ${P}_c "duplicate" "the redelivery" "BEGIN; $RECV; COMMIT;"

if ((fails)); then
  echo "FAIL: $fails attack(s) not refused"
  exit 1
fi
echo "ok: every attack refused"

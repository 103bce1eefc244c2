#!/usr/bin/env bash
# test_encrypt_sql.sh — the SQL inbox with sealed payloads (docs/security.md, "Payload
# encryption"; docs/inbox-sql.md): a consumer in another language opens the body itself
# (examples/crypt/obx_seal.py, written from the format, not from the C code) and passes the
# clear payload to obx.inbox_receive(); one it cannot open (tampered, or its ring holds another
# key under the ID) it passes as delivered, and the inbox parks it: the sealed bytes do not hash
# to the payload digest. Checked: the opened message is applied with the clear payload's digest
# in its receipt; the tampered one and the one under a wrong key are parked, never applied; the
# key is in no table of the consumer's database.
# Usage: test_encrypt_sql.sh OBX
set -u
OBX=$(realpath "${1:?usage: test_encrypt_sql.sh OBX}")
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../e2e/pgdb.sh"
db=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
trap 'pg_drop_db "$db"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
"$OBX" init --db "$db" >/dev/null || fail "obx init"
K1=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
KX=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

# the consumer: receives (event ID, sealed body) as the relay sent them, opens with its ring,
# and prints the SQL call it makes (the payload it passes: the clear one, or the body as is)
calls=$(PYTHONPATH="$here/../../examples/crypt" python3 - "$K1" "$KX" <<'PY'
import sys, obx_seal as o
k1, kx = bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2])
msgs = []
for i, eid in enumerate(["evt-01JD6X3M8Z4N5P6Q7R8S9T0V1W", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1X",
                         "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1Y"]):
    clear = b'{"order":"o-%d","card":"4111-%d"}' % (i, i)
    body = bytearray(o.seal(k1, "k1", eid, 1, clear))
    if i == 1:
        body[20] ^= 1  # tampered at the broker
    ring = {"k1": kx if i == 2 else k1}  # the third consumer holds another k1
    try:
        payload, how = o.open_body(ring["k1"], "k1", eid, 1, bytes(body)), "opened"
    except Exception:
        payload, how = bytes(body), "refused"
    print("%s|%s|%s|%s" % (eid, o.digest(clear), payload.hex(), how))
PY
) || fail "the Python consumer failed"
while IFS='|' read -r eid dg hex how; do
  got=$(psql "$db" -qAtX -c "BEGIN" -c "SELECT decision FROM obx.inbox_receive('sqlc', '$eid', 1, '$dg', 'orders', 0, 1, decode('$hex', 'hex'), 'order.created.v1', 't1', NULL, NULL, NULL)" -c "SELECT CASE WHEN (SELECT count(*) FROM obx.obx_inbox WHERE consumer_id = 'sqlc' AND event_id = '$eid' AND outcome = 'RECEIVED') = 1 THEN obx.inbox_applied('sqlc', '$eid', 'ok')::text END" -c "COMMIT")
  got=${got%%$'\n'*}
  echo "$eid $how -> $got"
  case $how in
    opened) [[ $got == process ]] || fail "$eid opened but not processed: $got" ;;
    refused) [[ $got == poisoned ]] || fail "$eid could not be opened but was not parked: $got" ;;
  esac
done <<<"$calls"
n=$(psql "$db" -qAtX -c "SELECT count(*) FROM obx.obx_inbox WHERE consumer_id = 'sqlc' AND outcome = 'APPLIED'")
[[ $n == 1 ]] || fail "$n applied, want 1"
dg0=$(sed -n 1p <<<"$calls" | cut -d'|' -f2)
[[ $(psql "$db" -qAtX -c "SELECT payload_digest FROM obx.obx_inbox WHERE consumer_id = 'sqlc'") == "$dg0" ]] ||
  fail "the receipt does not carry the clear payload's digest"
p=$(psql "$db" -qAtX -c "SELECT count(*) FROM obx.obx_poison WHERE consumer_id = 'sqlc' AND state = 'PARKED' AND last_error LIKE '%does not match its digest%'")
[[ $p == 2 ]] || fail "$p parked with the digest mismatch, want 2 (tampered, wrong key)"
echo "ok: opened by the consumer -> applied (clear digest in the receipt); tampered and wrong key -> parked"
dump=$(psql "$db" -qAtX -c "SELECT string_agg(t::text, ' ') FROM (SELECT row_to_json(x)::text AS t FROM obx.obx_inbox x UNION ALL SELECT row_to_json(y)::text FROM obx.obx_poison y) s")
grep -qi "$K1" <<<"$dump" && fail "the key is in the consumer's database"
echo "PASS"

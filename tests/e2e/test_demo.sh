#!/usr/bin/env bash
# test_demo.sh — `obx demo` end to end: exit 0, the JSON keys scripts rely on, the invariants.
# Usage: test_demo.sh OBX [sqlite|postgres] [log|kafka|amqp]
#   log    the local log broker with per-relay fault knobs (the default)
#   kafka  librdkafka's mock cluster inside the demo process
#   amqp   the RabbitMQ node of scripts/services.sh (OBX_TEST_AMQP_URL; fails without it)
set -euo pipefail
OBX=${1:?usage: test_demo.sh OBX [sqlite|postgres] [log|kafka|amqp]}
mode=${2:-sqlite}
broker=${3:-log}
args=()
case $broker in
  log) ;;
  kafka) args=(--broker kafka) ;;
  amqp) args=(--broker "${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set: run scripts/test.sh}") ;;
  *) echo "test_demo.sh: unknown broker '$broker'" >&2; exit 2 ;;
esac
dir=$(mktemp -d /tmp/obx-demo-test-XXXXXX)
db=sqlite:$dir/run/outbox.db
if [[ $mode == postgres ]]; then
  source "$(dirname "$0")/pgdb.sh"
  db=$(pg_fresh_db)
fi
cleanup() { [[ $db == postgres* ]] && pg_drop_db "$db"; rm -rf "$dir"; }
trap cleanup EXIT
out=$("$OBX" demo --events 3000 --dir "$dir/run" --db "$db" --json ${args[@]+"${args[@]}"})
echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
need = ["committed", "published", "duplicate_transport_receipts", "unknown_resolved",
        "unknown_p99_ms", "effects_applied", "duplicate_effects", "lost", "outbox_url",
        "broker_url"]
missing = [k for k in need if k not in r]
assert not missing, "missing keys: %s" % missing
assert r["committed"] == 3000, r
assert r["published"] == r["committed"], r
assert r["effects_applied"] == r["committed"], r
assert r["duplicate_effects"] == 0 and r["lost"] == 0, r
assert r["invariants_hold"] is True, r
print("ok: %d committed, %d published, %d duplicate receipts, %d UNKNOWN resolved (p99 %d ms), "
      "%d effects, 0 lost, 0 duplicate effects" % (r["committed"], r["published"],
      r["duplicate_transport_receipts"], r["unknown_resolved"], r["unknown_p99_ms"],
      r["effects_applied"]))
'
# the demo's outbox is kept and usable afterwards
"$OBX" report --db "$db" >/dev/null

#!/usr/bin/env bash
# test_chaos.sh BROKER MINUTES — the CI soak: scripts/chaos.sh with every fault kind on BROKER
# (amqp|kafka) for MINUTES, seed OBX_CHAOS_SEED (default 20261201, so that CI replays one
# schedule; set it to explore others). Passes when the soak passes (exit 0: nothing lost,
# misrouted, altered, applied twice or left UNKNOWN) and its JSON says that every fault kind
# fired; prints the JSON and the command that replays the run.
set -euo pipefail
broker=${1:?usage: test_chaos.sh amqp|kafka MINUTES}
minutes=${2:-2}
seed=${OBX_CHAOS_SEED:-20261201}
root=$(cd "$(dirname "$0")/../.." && pwd)
echo "replay: scripts/chaos.sh --minutes $minutes --broker $broker --seed $seed"
set +e
out=$("$root/scripts/chaos.sh" --minutes "$minutes" --broker "$broker" --seed "$seed" --json)
rc=$?
set -e
echo "$out"
echo "$out" | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])
need = ["minutes", "committed", "lost", "wrong_destination", "digest_mismatch",
        "duplicate_deliveries", "duplicate_effects", "unknown_total", "unknown_unresolved",
        "unknown_p99_s", "faults", "obx_report_ok"]
missing = [k for k in need if k not in r]
assert not missing, "JSON lacks %s" % missing
assert r["committed"] > 0, "nothing committed"
assert not r["faults_missing"], "fault kinds that never fired: %s" % r["faults_missing"]
print("chaos %s: %d committed, failed: %s" % (r["broker"], r["committed"], r["failed"] or "nothing"))
'
exit $rc

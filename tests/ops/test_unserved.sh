#!/usr/bin/env bash
# test_unserved.sh — clusters nobody serves (issue 48, item 6). Relays register the cluster they
# serve with a heartbeat (obx_relay_cluster); PENDING events of a cluster no live relay serves are
# shown by obx status (text and --json), /metrics (obx_pending_unserved_events{cluster}), the
# dashboard's /api/status and obx audit (pending_unserved past audit.pending_max_age_ms); obx
# route set warns when no relay has ever served the cluster it names. A relay that stops cleanly
# no longer serves its cluster; one killed still counts until its heartbeat runs out.
# Usage: test_unserved.sh OBX [sqlite|pg]   (pg: OBX_TEST_PG_URL names a server)
set -euo pipefail
OBX=${1:?usage: test_unserved.sh OBX [sqlite|pg]}
mode=${2:-sqlite}
source "$(dirname "$0")/../support/prologue.sh" unserved
use_store "$mode" || fail "no PostgreSQL database"
enqueue() { # TYPE N
  for i in $(seq 1 "$2"); do
    printf '{"n":%d}' "$i" | "$OBX" enqueue --db "$db" --type "$1" --aggregate "a/$1-$i@1" --tenant t1 >/dev/null
  done
}
unserved_of() { # CLUSTER -> pending count in obx status --json (0: not listed)
  "$OBX" status --db "$db" --json | js "sum(u['pending'] for u in d['unserved_clusters'] if u['cluster']=='$1')"
}

"$OBX" init --db "$db" >/dev/null
# route set: a cluster no relay has ever served is accepted, with a warning (text and JSON)
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >"$T/out" 2>"$T/err" ||
  bad "route set exit $?"
grep -q "generation 1" "$T/out" || bad "route set printed: $(cat "$T/out")"
grep -q "no relay has ever served cluster 'local'" "$T/err" || bad "no warning for local: $(cat "$T/err")"
"$OBX" route set payment.taken.v1 --db "$db" --cluster prod --topic payments --json >"$T/out" 2>"$T/err" ||
  bad "route set --json exit $?"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/out" || bad "route set --json stdout: $(cat "$T/out")"
python3 - "$T/err" <<'PY' || bad "route set --json warning: $(cat "$T/err")"
import json, sys
w = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(w) == 1 and "no relay has ever served cluster 'prod'" in w[0]["message"], w
PY

enqueue order.created.v1 2
enqueue payment.taken.v1 3
# no relay yet: both clusters are unserved
[[ $(unserved_of local) == 2 ]] || bad "status: local unserved $(unserved_of local), want 2"
[[ $(unserved_of prod) == 3 ]] || bad "status: prod unserved $(unserved_of prod), want 3"
"$OBX" status --db "$db" >"$T/status.txt" || true
grep -q "UNSERVED cluster prod: 3 PENDING events" "$T/status.txt" || bad "status text: $(cat "$T/status.txt")"

# a relay on the log broker serves cluster local
"$OBX" relay --db "$db" --broker "log:$T/broker.db" --http 127.0.0.1:0 --set relay.poll_ms=20 \
  >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
http=$(http_addr "$T/relay.log") || fail "no HTTP server"
pub=$(wait_published "$db" 2) ||
  bad "$pub of 2 order events published"
[[ $(unserved_of local) == 0 ]] || bad "status with a relay: local still unserved"
[[ $(unserved_of prod) == 3 ]] || bad "status with a relay: prod unserved $(unserved_of prod), want 3"
"$OBX" status --db "$db" >"$T/status.txt" || true
grep -q "UNSERVED cluster prod: 3 PENDING events" "$T/status.txt" || bad "status text: $(cat "$T/status.txt")"
grep -q "UNSERVED cluster local" "$T/status.txt" && bad "status text names local: $(cat "$T/status.txt")"
curl -s "http://$http/metrics" >"$T/metrics"
grep -qx 'obx_pending_unserved_events{cluster="prod"} 3' "$T/metrics" ||
  bad "metrics: $(grep unserved "$T/metrics")"
grep -q 'obx_pending_unserved_events{cluster="local"}' "$T/metrics" && bad "metrics name local"
grep -q '^obx_pending_unserved_oldest_age_seconds{cluster="prod"} ' "$T/metrics" ||
  bad "metrics: no oldest age for prod"
curl -s "http://$http/api/status" | js '[(u["cluster"], u["pending"]) for u in d["unserved_clusters"]]' >"$T/api" || true
[[ $(cat "$T/api") == "[('prod', 3)]" ]] || bad "/api/status unserved_clusters: $(cat "$T/api")"

# audit: past the age, pending_unserved names the events and the cluster; under it, nothing
sleep 1.1
"$OBX" audit --db "$db" --no-broker --set audit.pending_max_age_ms=1000 --json >"$T/audit.json" || true
python3 - "$T/audit.json" <<'PY' || bad "audit (age 1 s): $(cat "$T/audit.json")"
import json, sys
d = json.load(open(sys.argv[1]))
f = [f for f in d["findings"] if f["kind"] == "pending_unserved"]
assert len(f) == 1 and f[0]["count"] == 3 and len(f[0]["event_ids"]) == 3, f
assert "cluster prod" in f[0]["detail"], f[0]["detail"]
assert d["counts"]["pending_unserved"] == 3, d["counts"]
PY
"$OBX" audit --db "$db" --no-broker --set audit.pending_max_age_ms=3600000 --json >"$T/audit.json" || true
python3 - "$T/audit.json" <<'PY' || bad "audit (age 1 h): $(cat "$T/audit.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["counts"]["pending_unserved"] == 0, d["counts"]
assert [c["status"] for c in d["checks"] if c["check"] == "pending_unserved"] == ["ok"], d["checks"]
PY

# a cluster a relay has served: no warning
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null 2>"$T/err" ||
  bad "route set again exit $?"
[[ -s $T/err ]] && bad "route set to a served cluster warned: $(cat "$T/err")"

# a relay that stops cleanly no longer serves its cluster
kill -TERM $relay
wait $relay || bad "relay exit $?"
enqueue order.created.v1 1
[[ $(unserved_of local) == 1 ]] || bad "after a clean stop: local unserved $(unserved_of local), want 1"
[[ $(unserved_of prod) == 3 ]] || bad "after a clean stop: prod unserved $(unserved_of prod), want 3"
# a relay killed still counts as serving until three heartbeats are missed (relay.heartbeat_ms)
"$OBX" relay --db "$db" --broker "log:$T/broker.db" --set relay.poll_ms=20 --set relay.heartbeat_ms=1000 \
  >"$T/relay2.log" 2>&1 &
relay=$!
pids+=($relay)
pub=$(wait_published "$db" 3) ||
  bad "$pub of 3 order events published by the second relay"
kill -9 $relay
wait $relay 2>/dev/null || true
enqueue order.created.v1 1
[[ $(unserved_of local) == 0 ]] || bad "a relay killed a moment ago no longer serves local"
sleep 3.2
[[ $(unserved_of local) == 1 ]] || bad "3 heartbeats after a kill: local unserved $(unserved_of local), want 1"

[[ $fails == 0 ]] || { echo "$fails checks failed" >&2; exit 1; }
echo "ok"

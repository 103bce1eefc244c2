#!/usr/bin/env bash
# test_resolve.sh — every UNKNOWN ends, through the command line (docs/operations.md, "Held
# UNKNOWN events"): a route that holds UNKNOWNs for an operator, a broker whose ACKs are lost and
# whose lookups cannot tell, a relay that holds the events (visible in `obx status`), a
# consumer's evidence accepted by the operator (no resend) and by the relay's reconciler itself,
# an operator's same-target retry by selector, refusals that change nothing, and the default
# policy (retry) ending an UNKNOWN by itself; the relay's /metrics and POST /api/resolve.
# Usage: test_resolve.sh OBX
set -euo pipefail
OBX=${1:?usage: test_resolve.sh OBX}
source "$(dirname "$0")/../support/prologue.sh" resolve
relay_pid=
on_exit '[[ -n $relay_pid ]] && kill -9 "$relay_pid" 2>/dev/null'
db=sqlite:$dir/outbox.db
cdb=sqlite:$dir/consumer.db
broker=log:$dir/broker.db
enqueue() { # enqueue N -> prints the event ID
  printf '{"order":%d}' "$1" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$1@1" --tenant t1
}
# relay SECONDS QUERY [extra flags]: runs a relay for a while with short timings
relay() {
  local secs=$1 q=$2
  shift 2
  "$OBX" relay --db "$db" --broker "$broker?$q" --id r1 --set relay.lease_ms=300 \
    --set relay.sweep_ms=50 --set relay.reconcile_ms=50 --set relay.recheck_ms=100 \
    --set relay.poll_ms=20 --set relay.drain_ms=200 "$@" >>"$dir/relay.log" 2>&1 &
  relay_pid=$!
  sleep "$secs"
  kill -TERM "$relay_pid"
  wait "$relay_pid" || true
  relay_pid=
}
jq_() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

"$OBX" init --db "$db" >/dev/null
check "route with the hold policy" 0 'generation 1' -- \
  "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --on-unknown hold
check "an unknown policy is refused" 2 'on_unknown: .maybe. unknown' -- \
  "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --on-unknown maybe
e1=$(enqueue 1)
e2=$(enqueue 2)
e3=$(enqueue 3)
# ACKs lost, lookups down: every event is sent, none can be proven, all are held
relay 3 "lose_ack=1&lookup_down=1"
held=$("$OBX" status --db "$db" --json | jq_ 'd["unknown"]["held"]')
[[ $held == 3 ]] || fail "expected 3 held events, status says $held"
check "status shows the held events" 0 'HELD for an operator: 3 UNKNOWN events' -- \
  "$OBX" status --db "$db"
grep -q "$e1.*HELD for an operator" "$dir/out" || fail "status does not mark $e1 as held"
# the messages are on the broker: a consumer receives them (its receipts are evidence); the
# sample projection serves tenants tenant-7 and tenant-9 unless told otherwise
"$OBX" consume --consumer-db "$cdb" --broker "$broker" --topic orders --until-idle 1000 \
  --tenants t1 >/dev/null 2>&1
# refusals change nothing
check "resolve needs who" 2 '--who: required' -- "$OBX" resolve "$e1" --retry --db "$db" --reason x
check "resolve needs reason" 2 '--reason: required' -- "$OBX" resolve "$e1" --retry --db "$db" --who ops
check "resolve needs an action" 2 'say what to do' -- "$OBX" resolve "$e1" --db "$db" --who ops --reason x
check "evidence naming another payload is refused" 1 "not this event's message" -- \
  "$OBX" resolve "$e1" --accept --offset 0 --db "$db" --who ops --reason "seen with a reader" \
  --payload-digest sha256:0000000000000000000000000000000000000000000000000000000000000000
check "evidence naming another topic is refused" 1 'never changes the destination' -- \
  "$OBX" resolve "$e1" --accept --offset 0 --topic payments --db "$db" --who ops --reason r \
  --payload-digest "$("$OBX" inspect "$e1" --db "$db" --json | jq_ 'd["envelope"]["payload_digest"]')"
d1=$("$OBX" inspect "$e1" --db "$db" --json | jq_ 'd["envelope"]["payload_digest"]')
# evidence is read at the broker where the cluster can be asked (issue 46, item 3): an offset
# the broker never held is refused, and so is an acceptance without the broker to read it from
check "an offset the broker never held is refused" 1 'not at offset 999999' -- \
  "$OBX" resolve "$e1" --accept --offset 999999 --payload-digest "$d1" --broker "$broker" \
  --db "$db" --who mallory --reason "trust me"
check "acceptance without the broker is refused where it can be asked" 1 'give its broker' -- \
  "$OBX" resolve "$e1" --accept --offset 999999 --payload-digest "$d1" --db "$db" \
  --who mallory --reason "trust me"
# only a declared critical consumer's inbox is evidence
check "an undeclared consumer is refused" 2 'not a declared critical consumer' -- \
  "$OBX" resolve "$e1" --accept --from-consumer "order-projection=$cdb" --db "$db" --who ops \
  --reason r
[[ $("$OBX" status --db "$db" --json | jq_ 'd["unknown"]["held"]') == 3 ]] || fail "a refusal changed something"
cat >"$dir/relay.yaml" <<YAML
db: $db
broker: $broker
audit:
  critical_consumers: ["order-projection=$cdb"]
YAML
# the operator accepts the declared consumer's evidence for e1: published, no resend
check "accept from a consumer's inbox" 0 'published on the evidence' -- \
  "$OBX" resolve "$e1" --accept --from-consumer "order-projection=$cdb" --config "$dir/relay.yaml" \
  --who ops --reason "INC-42: the projection has it"
"$OBX" inspect "$e1" --db "$db" --json >"$dir/e1.json"
python3 - "$dir/e1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"]["state"] == "PUBLISHED", d["status"]
assert len(d["attempts"]) == 1, d["attempts"]            # no resend
prim = [r for r in d["receipts"] if r["kind"] == "PRIMARY"]
assert len(prim) == 1 and prim[0]["source"] == "consumer", d["receipts"]
assert any("INC-42" in a["reason"] and a["to"] == "PUBLISHED" for a in d["audit"]), d["audit"]
print("ok: e1 published on the consumer's evidence, one attempt, audited")
PY
# the relay's reconciler consults the critical consumer itself: e2 and e3 end without a resend
relay 3 "lose_ack=1&lookup_down=1" --set "audit.critical_consumers=order-projection=$cdb"
for e in "$e2" "$e3"; do
  "$OBX" inspect "$e" --db "$db" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"]["state"] == "PUBLISHED", d["status"]
assert len(d["attempts"]) == 1, d["attempts"]
assert [r["source"] for r in d["receipts"] if r["kind"] == "PRIMARY"] == ["consumer"], d["receipts"]
' || fail "$e was not published on the consumer's evidence"
done
echo "ok: the reconciler published e2 and e3 on the critical consumer's evidence"
check "an event whose outcome is known is refused" 1 'nothing to resolve' -- \
  "$OBX" resolve "$e2" --retry --db "$db" --who ops --reason r
# a new held event no consumer has seen: the operator retries by selector
e4=$(enqueue 4)
relay 2 "blackhole=1&lookup_down=1"
[[ $("$OBX" status --db "$db" --json | jq_ 'd["unknown"]["held"]') == 1 ]] || fail "e4 not held"
check "a selector needs a criterion" 2 'selector' -- \
  "$OBX" resolve --retry --db "$db" --who ops --reason r
check "dry run" 0 'dry run: nothing changed' -- \
  "$OBX" resolve --held --older-than 0s --retry --dry-run --db "$db" --who ops --reason r
check "retry the held events" 0 '1 resolved, 0 refused' -- \
  "$OBX" resolve --held --retry --db "$db" --who ops --reason "INC-43: consumers dedupe"
relay 2 ""
"$OBX" inspect "$e4" --db "$db" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"]["state"] == "PUBLISHED", d["status"]
att = d["attempts"]
assert len(att) == 2 and att[0]["partition"] == att[1]["partition"], att
assert att[0]["dest_digest"] == att[1]["dest_digest"], att
assert any(a["actor"] == "operator" and "INC-43" in a["reason"] for a in d["audit"]), d["audit"]
' || fail "e4 was not retried to its frozen destination"
echo "ok: the operator's retry went to the frozen destination and published e4"
# the default policy (retry) ends an UNKNOWN by itself, with nobody and no proof
check "route with the default policy" 0 'generation 2' -- \
  "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders
e5=$(enqueue 5)
relay 2 "blackhole=1&lookup_down=1"
relay 2 "lookup_down=1"
"$OBX" inspect "$e5" --db "$db" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"]["state"] == "PUBLISHED" and d["status"]["on_unknown"] == "retry", d["status"]
assert any("UNKNOWN policy is retry" in a["reason"] for a in d["audit"]), d["audit"]
# the first attempt could never be proven either way: it ended when the retry filled the slot
st = [a["state"] for a in d["attempts"]]
assert len(st) >= 2 and st.count("ACCEPTED") == 1 and set(st) == {"ACCEPTED", "SUPERSEDED"}, st
' || fail "e5 was not retried by the default policy, or an attempt was left open"
echo "ok: the default UNKNOWN policy retried e5 to the same target; the first attempt ended SUPERSEDED"
# the same from the relay's HTTP API and /metrics (behind the operator token)
check "route with the hold policy again" 0 'generation 3' -- \
  "$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders --on-unknown hold
e6=$(enqueue 6)
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s\n' "$token" >"$dir/token"
chmod 600 "$dir/token"
"$OBX" relay --db "$db" --broker "$broker?blackhole=1&lookup_down=1" --id web --http 127.0.0.1:0 \
  --set http.token_file="$dir/token" --set relay.lease_ms=300 --set relay.sweep_ms=50 \
  --set relay.reconcile_ms=50 --set relay.recheck_ms=100 --set relay.poll_ms=20 \
  --set relay.drain_ms=200 >"$dir/web.log" 2>&1 &
relay_pid=$!
port=$(http_addr "$dir/web.log") || fail "no HTTP port: $(cat "$dir/web.log")"
port=${port##*:}
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
for _ in $(seq 100); do [[ $(metric obx_unknown_held_events) == 1 ]] && break; sleep 0.1; done
[[ $(metric obx_unknown_held_events) == 1 ]] || fail "/metrics: obx_unknown_held_events is not 1"
[[ $(metric obx_unknown_held_alert_seconds) == 900 ]] || fail "/metrics: no alert threshold"
grep -q "UNKNOWN HELD" "$dir/web.log" || fail "the relay did not log the hold"
post() { curl -s -o "$dir/body" -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$@"; }
[[ $(post "http://127.0.0.1:$port/api/resolve" -d "{\"event_id\":\"$e6\",\"action\":\"retry\",\"reason\":\"x\"}") == 401 ]] ||
  fail "/api/resolve without the token: $(cat "$dir/body")"
[[ $(post -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/resolve" -d "{\"event_id\":\"$e6\",\"action\":\"retry\"}") == 400 ]] ||
  fail "/api/resolve without a reason: $(cat "$dir/body")"
grep -q 'reason' "$dir/body" || fail "the refusal does not name reason: $(cat "$dir/body")"
# a missing field is a 400, never a default (no offset was offset 0, and published e6)
d6=$("$OBX" inspect "$e6" --db "$db" --json | jq_ 'd["envelope"]["payload_digest"]')
[[ $(post -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/resolve" -d "{\"event_id\":\"$e6\",\"action\":\"accept\",\"payload_digest\":\"$d6\",\"who\":\"bob\",\"reason\":\"x\"}") == 400 ]] ||
  fail "/api/resolve accept without an offset: $(cat "$dir/body")"
grep -q 'offset: missing' "$dir/body" || fail "the refusal does not name offset: $(cat "$dir/body")"
[[ $(post -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/resolve" -d "{\"held\":true,\"action\":\"retry\",\"who\":\"bob\",\"reason\":\"INC-44\"}") == 200 ]] ||
  fail "/api/resolve: $(cat "$dir/body")"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["resolved"] == 1 and d["events"][0]["result"] == "retry", d' "$dir/body" ||
  fail "/api/resolve did not retry e6"
kill -TERM "$relay_pid"; wait "$relay_pid" || true; relay_pid=
relay 2 ""
"$OBX" inspect "$e6" --db "$db" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"]["state"] == "PUBLISHED", d["status"]
assert any(a["actor"] == "operator" and "INC-44" in a["reason"] and "bob" in a["who"] for a in d["audit"]), d["audit"]
' || fail "e6 was not resolved through the HTTP API"
echo "ok: /metrics counted the held event, POST /api/resolve (token, reason) retried it"
check "report: invariants hold, nothing held" 0 'invariants .*: hold' -- "$OBX" report --db "$db"
[[ $("$OBX" status --db "$db" --json | jq_ 'd["unknown"]["held"]') == 0 ]] || fail "events still held"
echo "ok: every UNKNOWN ended"

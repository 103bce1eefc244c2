#!/usr/bin/env bash
# test_otel.sh — OpenTelemetry spans of one event's life (docs/operations.md, "OpenTelemetry"),
# collected by a small OTLP/HTTP receiver (otlp_receiver.py): the producer span of
# `obx enqueue --otel-endpoint`, the first publish attempt lost in transit (log broker
# blackhole: UNKNOWN when its lease ends), the reconciler's decision (lookups cannot tell:
# a same-target retry), the retry's publish (ACK), and the consumer's apply. Checks: every span
# in the traceparent's trace with the traceparent's span as parent, the links (to the producer
# span; the reconciliation to the retry it sent), the obx and messaging attributes, the
# OTLP/JSON shape (hex IDs, unix-nano strings). An UNKNOWN resolved by the broker's lookup: a
# reconcile span "found" linked to the attempt it proved, and no second send. An UNKNOWN an
# operator resolves with `obx resolve --retry --otel-endpoint`: its reconcile span. Then, with no
# collector listening, the relay publishes everything anyway and /metrics counts the spans it
# dropped, each batch tried again 3 times first; a collector that answers 503 twice gets every
# span on the retries; and with a collector that never answers, a stop still ends promptly.
# Usage: test_otel.sh OBX
set -euo pipefail
OBX=${1:?usage: test_otel.sh OBX}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../support/prologue.sh" otel
db=sqlite:$dir/outbox.db
cdb=sqlite:$dir/consumer.db
broker=log:$dir/broker.db

python3 "$here/otlp_receiver.py" "$dir/spans.jsonl" "$dir/port" &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/port ]] && break; sleep 0.05; done
[[ -s $dir/port ]] || fail "the OTLP receiver did not start"
ep=http://127.0.0.1:$(cat "$dir/port")

# relay SECONDS QUERY [flags]: a relay with short timings for a while, then SIGTERM
relay() {
  local secs=$1 q=$2
  shift 2
  "$OBX" relay --db "$db" --broker "$broker?$q" --id r1 --set relay.lease_ms=300 \
    --set relay.sweep_ms=50 --set relay.reconcile_ms=50 --set relay.recheck_ms=100 \
    --set relay.poll_ms=20 --set relay.drain_ms=200 --set otel.export_interval_ms=100 \
    "$@" >>"$dir/relay.log" 2>&1 &
  local pid=$!
  sleep "$secs"
  kill -TERM "$pid"
  wait "$pid" || true
}
state() { "$OBX" inspect "$1" --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["state"])'; }

"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
TRACE=4bf92f3577b34da6a3ce929d0e0e4736
PARENT=00f067aa0ba902b7
eid=$(printf '{"order":1}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-1@1 --tenant t1 --correlation-id corr-1 \
  --traceparent "00-$TRACE-$PARENT-01" --otel-endpoint "$ep")
# a second event whose traceparent is all zeros (the right shape, but W3C's invalid IDs: a
# collector would refuse the request): a trace of its own, as for an event without one
eid2=$(printf '{"order":2}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-2@1 --tenant t1 --otel-endpoint "$ep" \
  --traceparent 00-00000000000000000000000000000000-0000000000000000-01)

# attempt 1 lost in transit: the lease ends, the sweeper makes it UNKNOWN (no reconciler here)
relay 1.5 "blackhole=1" --set relay.reconciler=false --set otel.endpoint="$ep"
[[ $(state "$eid") == DISPATCH_UNKNOWN ]] || fail "not UNKNOWN after the lost send: $(state "$eid")"
# the reconciler cannot tell (lookups down) and retries to the frozen target: published
relay 2 "lookup_down=1" --set otel.endpoint="$ep"
[[ $(state "$eid") == PUBLISHED ]] || fail "not PUBLISHED after the retry: $(state "$eid")"
"$OBX" consume --consumer-db "$cdb" --broker "$broker" --topic orders --tenants t1 --until-idle 800 \
  --set otel.endpoint="$ep" --set otel.export_interval_ms=100 >"$dir/consume.log" 2>&1 ||
  fail "consume: $(cat "$dir/consume.log")"
sleep 0.5

python3 - "$dir/spans.jsonl" "$eid" "$eid2" "$TRACE" "$PARENT" <<'PY' || fail "the spans"
import json, re, sys
path, eid, eid2, trace, parent = sys.argv[1:]
spans = []
for line in open(path):
    req = json.loads(line)
    for rs in req["resourceSpans"]:
        res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
        assert res["service.name"] == {"stringValue": "obx"}, res
        for ss in rs["scopeSpans"]:
            assert ss["scope"]["name"] == "obx", ss["scope"]
            spans += ss["spans"]
def attrs(s):
    out = {}
    for a in s["attributes"]:
        v = a["value"]
        out[a["key"]] = v.get("stringValue", v.get("intValue"))
    return out
def fail(msg, s=None):
    print("FAIL:", msg, json.dumps(s, indent=1) if s else "", file=sys.stderr)
    sys.exit(1)
mine = [s for s in spans if attrs(s).get("obx.event_id") == eid]
def pick(op, **want):
    got = [s for s in mine if attrs(s).get("messaging.operation.name") == op and
           all(attrs(s).get(k) == v for k, v in want.items())]
    if len(got) != 1:
        fail("%d %s spans with %s, want 1; the event's spans: %s" % (len(got), op, want,
             [(attrs(s).get("messaging.operation.name"), attrs(s).get("obx.outcome")) for s in mine]))
    return got[0]
create = pick("create")
send1 = pick("send", **{"obx.attempt": "1", "obx.outcome": "unknown"})
rec = pick("reconcile", **{"obx.outcome": "retry"})
send2 = pick("send", **{"obx.attempt": "2", "obx.outcome": "published"})
proc = pick("process", **{"obx.outcome": "applied"})
if len(mine) != 5:
    fail("%d spans for the event, want 5" % len(mine))
for s in mine:
    a = attrs(s)
    if s["traceId"] != trace: fail("span outside the traceparent's trace", s)
    if s.get("parentSpanId") != parent: fail("span whose parent is not the traceparent's", s)
    if not re.fullmatch(r"[0-9a-f]{16}", s["spanId"]): fail("span ID not 16 hex", s)
    if not re.fullmatch(r"[0-9]{19}", s["startTimeUnixNano"]): fail("start not unix nanos", s)
    if not int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]): fail("ends before start", s)
    for k, v in {"obx.event_id": eid, "messaging.message.id": eid, "obx.event_type":
                 "order.created.v1", "obx.tenant": "t1", "obx.destination": "orders",
                 "messaging.destination.name": "orders", "messaging.system": "obx_log"}.items():
        if a.get(k) != v: fail("%s is %r, want %r" % (k, a.get(k), v), s)
    if s["name"] != a["messaging.operation.name"] + " orders": fail("span name", s)
if len({s["spanId"] for s in mine}) != 5: fail("span IDs not distinct")
want = {"create": (create, "create", 4), "send1": (send1, "send", 4), "send2": (send2, "send", 4),
        "process": (proc, "process", 5), "reconcile": (rec, None, 1)}
for name, (s, typ, kind) in want.items():
    if attrs(s).get("messaging.operation.type") != typ: fail(name + ": operation type", s)
    if s["kind"] != kind: fail(name + ": span kind", s)
# links: sends and the process span to the producer span; the reconciliation to the retry
for s in (send1, send2, proc):
    if s.get("links") != [{"traceId": trace, "spanId": create["spanId"]}]: fail("link", s)
if rec.get("links") != [{"traceId": trace, "spanId": send2["spanId"]}]: fail("reconcile link", rec)
if attrs(rec).get("obx.attempt") != "1" or attrs(rec).get("obx.retry_attempt") != "2":
    fail("the reconciliation's attempts", rec)
if attrs(send2)["obx.attempt_id"] == attrs(send1)["obx.attempt_id"]: fail("one attempt ID")
if attrs(rec).get("obx.retry_attempt_id") != attrs(send2)["obx.attempt_id"]: fail("retry ID", rec)
if attrs(proc).get("obx.attempt_id") != attrs(send2)["obx.attempt_id"]: fail("process attempt", proc)
if send1["status"]["code"] != 2 or send2["status"]["code"] != 1 or proc["status"]["code"] != 1:
    fail("statuses: %s %s %s" % (send1["status"], send2["status"], proc["status"]))
if attrs(proc).get("obx.consumer") != "order-projection": fail("consumer", proc)
if attrs(create).get("obx.correlation_id") != "corr-1": fail("correlation", create)
# the event with the all-zero traceparent: its own trace, no parent, the same on every span
other = [s for s in spans if attrs(s).get("obx.event_id") == eid2]
if len(other) < 3 or len({s["traceId"] for s in other}) != 1 or other[0]["traceId"] in (trace, "0" * 32):
    fail("the event with the all-zero traceparent: %d spans, traces %s" % (len(other), {s["traceId"] for s in other}))
if any("parentSpanId" in s for s in other): fail("a root span with a parent")
print("ok: %d spans, the event's 5 in trace %s" % (len(spans), trace))
PY

# ---- an UNKNOWN that the broker's lookup resolves: a reconcile span "found", no second send ----
eid3=$(printf '{"order":3}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-3@1 --tenant t1 --traceparent "00-$TRACE-$PARENT-01")
relay 1.5 "drop_ack=1&ack_timeout_ms=100" --set otel.endpoint="$ep"
[[ $(state "$eid3") == PUBLISHED ]] || fail "not PUBLISHED after the lookup: $(state "$eid3")"
sleep 0.3
PYTHONPATH=$here python3 - "$dir/spans.jsonl" "$eid3" "$TRACE" "$PARENT" <<'PY' || fail "the lookup's spans"
import sys
from otlp_spans import attrs, load
path, eid, trace, parent = sys.argv[1:]
spans = load(path)
mine = [(attrs(s)["messaging.operation.name"], attrs(s).get("obx.outcome"), s) for s in spans
        if attrs(s).get("obx.event_id") == eid]
got = sorted((op, out) for op, out, _ in mine)
if got != [("reconcile", "found"), ("send", "unknown")]:
    sys.exit("FAIL: the lookup's spans: %s" % got)
send = [s for op, _, s in mine if op == "send"][0]
rec = [s for op, _, s in mine if op == "reconcile"][0]
if rec.get("links") != [{"traceId": trace, "spanId": send["spanId"]}]: sys.exit("FAIL: link %s" % rec)
if attrs(rec).get("obx.attempt") != "1" or attrs(rec).get("obx.attempt_id") != attrs(send)["obx.attempt_id"]:
    sys.exit("FAIL: the reconciled attempt: %s" % attrs(rec))
if rec["traceId"] != trace or rec.get("parentSpanId") != parent: sys.exit("FAIL: trace %s" % rec)
print("ok: an UNKNOWN found by lookup: send (unknown) and reconcile (found) linked to it")
PY

# ---- an UNKNOWN an operator resolves (obx resolve --retry): a reconcile span of the operator's ----
eid4=$(printf '{"order":4}' | "$OBX" enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-4@1 --tenant t1 --traceparent "00-$TRACE-$PARENT-01")
relay 1.5 "blackhole=1" --set relay.reconciler=false --set otel.endpoint="$ep"
[[ $(state "$eid4") == DISPATCH_UNKNOWN ]] || fail "not UNKNOWN after the lost send: $(state "$eid4")"
"$OBX" resolve "$eid4" --retry --who ops-anna --reason INC-7 --db "$db" --otel-endpoint "$ep" \
  >"$dir/resolve.log" 2>&1 || fail "obx resolve: $(cat "$dir/resolve.log")"
sleep 0.3
PYTHONPATH=$here python3 - "$dir/spans.jsonl" "$eid4" "$TRACE" "$PARENT" <<'PY' || fail "the resolution's span"
import sys
from otlp_spans import attrs, load
path, eid, trace, parent = sys.argv[1:]
spans = load(path)
mine = [s for s in spans if attrs(s).get("obx.event_id") == eid]
sends = [s for s in mine if attrs(s)["messaging.operation.name"] == "send"]
recs = [s for s in mine if attrs(s)["messaging.operation.name"] == "reconcile"]
if len(sends) != 1 or attrs(sends[0]).get("obx.outcome") != "unknown":
    sys.exit("FAIL: the lost send's span: %s" % [attrs(s) for s in sends])
if len(recs) != 1:
    sys.exit("FAIL: %d reconcile spans for the resolved event, want 1" % len(recs))
r, a = recs[0], attrs(recs[0])
if a.get("obx.outcome") != "operator_retry" or a.get("obx.resolved_by") != "ops-anna":
    sys.exit("FAIL: the resolution's attributes: %s" % a)
if a.get("obx.attempt_id") != attrs(sends[0])["obx.attempt_id"] or a.get("obx.attempt") != "1":
    sys.exit("FAIL: the attempt it resolved: %s" % a)
if r.get("links") != [{"traceId": trace, "spanId": sends[0]["spanId"]}]: sys.exit("FAIL: link %s" % r)
if r["traceId"] != trace or r.get("parentSpanId") != parent: sys.exit("FAIL: trace %s" % r)
if int(r["startTimeUnixNano"]) >= int(r["endTimeUnixNano"]): sys.exit("FAIL: no UNKNOWN episode %s" % r)
print("ok: obx resolve --retry: a reconcile span (operator_retry, by ops-anna) linked to the lost send")
PY
relay 1.5 "blackhole=0" --set otel.endpoint="$ep" # the operator's retry is sent
[[ $(state "$eid4") == PUBLISHED ]] || fail "not PUBLISHED after the operator's retry: $(state "$eid4")"

# ---- no collector: the relay publishes anyway and counts the spans it drops ----
{ kill -9 "${pids[0]}" && wait "${pids[0]}"; } 2>/dev/null || true
pids=()
N=20
for ((i = 10; i < 10 + N; i++)); do
  printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$i@1" --tenant t1 >/dev/null
done
"$OBX" relay --db "$db" --broker "$broker" --id r2 --http 127.0.0.1:0 --set relay.poll_ms=20 \
  --set otel.endpoint="$ep" --set otel.queue_max=4 --set otel.export_interval_ms=50 \
  --set otel.timeout_ms=500 >"$dir/r2.log" 2>&1 &
pids+=($!)
port=$(http_addr "$dir/r2.log") || fail "no HTTP port: $(cat "$dir/r2.log")"
port=${port##*:}
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
for _ in $(seq 100); do
  [[ $(metric obx_outbox_published_total) == $((N + 4)) ]] && break
  sleep 0.1
done
[[ $(metric obx_outbox_published_total) == $((N + 4)) ]] ||
  fail "the relay stopped publishing without a collector: $(metric obx_outbox_published_total)"
# each batch is tried 4 times, 1 s, 2 s and 4 s apart (no answer is retryable), before its
# spans are dropped
for _ in $(seq 300); do
  [[ $(metric obx_otel_spans_dropped_total) == "$N" ]] && break
  sleep 0.1
done
[[ $(metric obx_otel_spans_dropped_total) == "$N" ]] ||
  fail "obx_otel_spans_dropped_total is $(metric obx_otel_spans_dropped_total), want $N"
[[ $(metric obx_otel_spans_exported_total) == 0 ]] || fail "spans exported to nobody"
(($(metric obx_otel_export_failures_total) >= 1)) || fail "no failed export counted"
(($(metric obx_otel_export_retries_total) >= 3)) || fail "a batch was not tried again 3 times"
grep -q 'span export to .* failed' "$dir/r2.log" || fail "the failure is not logged"
echo "ok: $N events published with the collector down, $N spans dropped and counted"
kill -TERM "${pids[0]}"
wait "${pids[0]}" || true
pids=()

# ---- a collector that answers 503 twice (restarting): the batch is sent again, nothing lost ----
OTLP_FAIL_FIRST=2 python3 "$here/otlp_receiver.py" "$dir/spans503.jsonl" "$dir/port503" &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/port503 ]] && break; sleep 0.05; done
[[ -s $dir/port503 ]] || fail "the second OTLP receiver did not start"
for ((i = 70; i < 73; i++)); do
  printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$i@1" --tenant t1 >>"$dir/ids503"
done
"$OBX" relay --db "$db" --broker "$broker" --id r4 --http 127.0.0.1:0 --set relay.poll_ms=20 \
  --set otel.endpoint="http://127.0.0.1:$(cat "$dir/port503")" --set otel.export_interval_ms=50 \
  >"$dir/r4.log" 2>&1 &
pids+=($!)
port=$(http_addr "$dir/r4.log") || fail "no HTTP port: $(cat "$dir/r4.log")"
port=${port##*:}
for _ in $(seq 150); do
  (($(metric obx_otel_spans_exported_total) >= 3)) && break
  sleep 0.1
done
[[ $(wc -l <"$dir/spans503.jsonl.fails") == 2 ]] || fail "the receiver refused $(wc -l <"$dir/spans503.jsonl.fails") requests, want 2"
(($(metric obx_otel_spans_exported_total) >= 3)) ||
  fail "spans exported after two 503s: $(metric obx_otel_spans_exported_total), want 3 or more"
[[ $(metric obx_otel_spans_dropped_total) == 0 ]] || fail "spans dropped: $(metric obx_otel_spans_dropped_total)"
(($(metric obx_otel_export_retries_total) >= 2)) || fail "retries: $(metric obx_otel_export_retries_total)"
for id in $(cat "$dir/ids503"); do
  grep -q "$id" "$dir/spans503.jsonl" || fail "the send span of $id never reached the collector"
done
echo "ok: a collector that answered 503 twice got every span on the retries, none dropped"
kill -TERM "${pids[-1]}"
wait "${pids[-1]}" || true

# ---- a collector that takes the connection and never answers: a stop still ends promptly ----
python3 -c 'import socket,sys,time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(600)' "$dir/hang_port" &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/hang_port ]] && break; sleep 0.05; done
for ((i = 40; i < 40 + N; i++)); do
  printf '{"order":%d}' "$i" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/o-$i@1" --tenant t1 >/dev/null
done
"$OBX" relay --db "$db" --broker "$broker" --id r3 --set relay.poll_ms=20 \
  --set otel.endpoint="http://127.0.0.1:$(cat "$dir/hang_port")" --set otel.timeout_ms=1000 \
  --set otel.export_interval_ms=50 >"$dir/r3.log" 2>&1 &
r3=$!
pids+=($r3)
sleep 0.6 # the events are out, their spans' request hangs at the collector
kill -TERM "$r3"
t0=$(date +%s%N)
wait "$r3" || true
ms=$((($(date +%s%N) - t0) / 1000000))
((ms < 6000)) || fail "the relay took $ms ms to stop with a collector that never answers"
"$OBX" status --db "$db" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(d["states"]["PUBLISHED"] != d["total"] or d["total"] != int(sys.argv[1]))' $((2 * N + 7)) ||
  fail "not every event was published: $("$OBX" status --db "$db")"
echo "ok: with a collector that never answers the relay stopped in $ms ms"
echo "test_otel: all ok"

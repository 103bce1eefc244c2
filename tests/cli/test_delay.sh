#!/usr/bin/env bash
# test_delay.sh — delayed events through the command line and a real relay on the log broker
# (docs/operations.md, "Delayed events"): a bad --delay or --not-before is refused naming the
# option and the limit, with nothing written; on an idle relay no delayed event is sent before
# its time and each is published within a second after it; a later event of the same key waits
# behind a delayed one; `obx cancel` before the claim ends the event CANCELLED with an audit row
# (status, report and audit count it), after the claim it is refused; the exit codes of the CLI
# contract (1 refused, 2 usage, 3 could not check) and --json. The relay publishes to the log
# broker, RabbitMQ (OBX_TEST_AMQP_URL) or the Kafka mock cluster; on Kafka the topic's own copies
# are read back with kcat, and no delayed event's copy is older than its time.
# Usage: test_delay.sh OBX [sqlite|postgres] [log|amqp|kafka [CHAOS_KMOCK]]
set -euo pipefail
OBX=${1:?usage: test_delay.sh OBX [sqlite|postgres] [log|amqp|kafka [CHAOS_KMOCK]]}
store=${2:-sqlite}
mode=${3:-log}
source "$(dirname "$0")/../support/prologue.sh" delay
relay_pid=
on_exit '[[ -n $relay_pid ]] && kill -9 "$relay_pid" 2>/dev/null'
use_store "$store"
cluster=local topic=orders
case $mode in
  log) broker=log:$dir/broker.db ;;
  amqp)
    url=${OBX_TEST_AMQP_URL:?OBX_TEST_AMQP_URL is not set: run scripts/test.sh}
    cluster=obx-delay topic=obx-delay-$$
    broker="$url?cluster=$cluster&declare_exchange=$topic&declare_queue=obx-delay-q-$$"
    ;;
  kafka)
    source "$(dirname "$0")/../support/kmock.sh"
    kmock_start "${4:-$(dirname "$OBX")/bench/chaos_kmock}"
    cluster=kafka-delay broker="kafka://$boot?cluster=$cluster"
    ;;
  *) echo "mode: log, amqp or kafka" >&2; exit 2 ;;
esac
enqueue() { # enqueue AGGREGATE [flags...] -> the --json line
  local agg=$1
  shift
  printf '{"order":"%s"}' "$agg" | "$OBX" enqueue --db "$db" --type order.created.v1 \
    --aggregate "order/$agg@1" --tenant t1 --json "$@"
}
jget() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print($2)" "$1"; }
committed() { "$OBX" report --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["committed"])'; }

"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster "$cluster" --topic "$topic" >/dev/null

# bad input: refused naming the option and the limit, exit 2, nothing written
check "a delay over the maximum is refused" 2 '--delay: .400d. is over the maximum delay of 366 days' -- \
  enqueue o-0 --delay 400d
check "a malformed delay is refused" 2 '--delay: .3 weeks. is not a duration' -- enqueue o-0 --delay '3 weeks'
check "a negative delay is refused" 2 '--delay: .-5s. is not a duration' -- enqueue o-0 --delay=-5s
check "a time that is not ISO-8601 UTC is refused" 2 '--not-before: .2030-01-02 03:04. is not an ISO-8601 UTC time' -- \
  enqueue o-0 --not-before '2030-01-02 03:04'
check "a time over the maximum delay is refused" 2 '--not-before: .2099-01-01T00:00:00Z. is over the maximum delay' -- \
  enqueue o-0 --not-before 2099-01-01T00:00:00Z
check "--delay and --not-before together are refused" 2 'give one of them' -- \
  enqueue o-0 --delay 1s --not-before 2030-01-01T00:00:00Z
[[ $(committed) == 0 ]] || fail "a refused enqueue wrote an event: $(committed) committed"
echo "ok: nothing written by the refused enqueues"

# an idle relay first; then gone: 3 s, cancelled before its time; d1: 2 s, d2: 3 s (to
# --not-before, ISO-8601), later: no delay but behind d1 (same key), free: no delay, another key
"$OBX" relay --db "$db" --broker "$broker" --id r1 --set relay.poll_ms=20 --set relay.lease_ms=2000 \
  >>"$dir/relay.log" 2>&1 &
relay_pid=$!
sleep 1
jg=$(enqueue o-4 --delay 3s)
gone=$(jget "$jg" 'd["event_id"]')
check "cancel before the claim" 0 '"from":"PENDING","to":"CANCELLED","who":"alice","reason":"order paid"' -- \
  "$OBX" cancel "$gone" --db "$db" --who alice --reason 'order paid' --json
j1=$(enqueue o-1 --delay 2s)
nb2=$(python3 -c 'import datetime as d; print((d.datetime.now(d.timezone.utc) + d.timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z")')
j2=$(enqueue o-2 --not-before "$nb2")
jl=$(enqueue o-1)
jf=$(enqueue o-3)
d1=$(jget "$j1" 'd["event_id"]')
d2=$(jget "$j2" 'd["event_id"]')
later=$(jget "$jl" 'd["event_id"]')
free=$(jget "$jf" 'd["event_id"]')
sleep 5
kill -TERM "$relay_pid"
wait "$relay_pid" || true
relay_pid=
[[ $(jget "$jl" '"not_before_ms" in d') == False ]] || fail "an event without a delay has not_before_ms: $jl"
"$OBX" inspect "$d2" --db "$db" | grep -q "not_before_at *${nb2%Z}" || fail "inspect does not show the frozen not_before_at $nb2"
echo "ok: the envelope shows not_before_at"

# cancel: usage (2), refused (1), could not check (3), with --json
check "cancel needs --reason" 2 '--reason: required' -- "$OBX" cancel "$gone" --db "$db" --who alice
check "cancel needs --who" 2 '--who: required' -- "$OBX" cancel "$gone" --db "$db" --reason paid
plain=$(jget "$(enqueue o-5)" 'd["event_id"]')
check "cancel of an event without a delay is refused" 1 'PENDING.*has no delay' -- \
  "$OBX" cancel "$plain" --db "$db" --who alice --reason paid
check "cancel of an unknown event is refused" 1 'OBX_ENOTFOUND' -- \
  "$OBX" cancel evt-00000000000000000000000000 --db "$db" --who alice --reason paid
check "cancel where there is no outbox cannot check" 3 'cannot open|no such outbox' -- \
  "$OBX" cancel "$gone" --db "sqlite:$dir/missing/outbox.db" --who alice --reason paid
check "cancel twice is refused" 1 '"code":"OBX_EREFUSED".*CANCELLED' -- \
  "$OBX" cancel "$gone" --db "$db" --who alice --reason 'order paid' --json
"$OBX" inspect "$gone" --db "$db" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["status"]["state"] == "CANCELLED", d["status"]
rows = [a for a in d["audit"] if a["to"] == "CANCELLED"]
assert len(rows) == 1 and rows[0]["who"] == "alice" and "order paid" in rows[0]["reason"], d["audit"]
' || fail "the cancelled event has no CANCELLED state or audit row"
echo "ok: CANCELLED with one audit row naming who and why"

for e in "$d1" "$d2" "$later" "$free" "$gone"; do "$OBX" inspect "$e" --db "$db" --json > "$dir/$e.json"; done
python3 - "$dir" "$d1" "$d2" "$later" "$free" "$gone" <<'PY' || { cat "$dir/relay.log"; fail "delayed events"; }
import json, sys
d, d1, d2, later, free, gone = sys.argv[1:]
ev = {e: json.load(open(f"{d}/{e}.json")) for e in (d1, d2, later, free, gone)}
for e in (d1, d2):
    nb = ev[e]["envelope"]["not_before_at_ms"]
    st = ev[e]["status"]
    assert st["state"] == "PUBLISHED", (e, st)
    first = min(a["started_at_ms"] for a in ev[e]["attempts"])
    assert first >= nb, f"{e} sent {nb - first} ms before its time"
    late = st["published_at_ms"] - nb
    assert 0 <= late < 1000, f"{e} published {late} ms after its time (want < 1000)"
    print(f"ok: {e} sent {first - nb} ms and published {late} ms after its time")
assert ev[free]["status"]["state"] == "PUBLISHED"
assert ev[free]["status"]["published_at_ms"] < ev[d1]["envelope"]["not_before_at_ms"], "the free event waited"
l, h = ev[later]["status"], ev[d1]["status"]
assert l["state"] == "PUBLISHED" and l["published_at_ms"] >= h["published_at_ms"], (l, h)
assert min(a["started_at_ms"] for a in ev[later]["attempts"]) >= ev[d1]["envelope"]["not_before_at_ms"], \
    "the later event of the key did not wait for the delayed one"
print("ok: the later event of the key waited behind the delayed one; another key did not")
assert ev[gone]["status"]["state"] == "CANCELLED" and not ev[gone]["attempts"], ev[gone]
print("ok: the cancelled event was never sent")
PY
if [[ $mode == kafka ]]; then
  # the broker's copies: each message's timestamp (set when the relay handed it over) and its
  # obx-event-id, against the times the producer froze
  kcat -C -b "$boot" -t orders -o beginning -e -q -f '%T %h\n' >"$dir/copies" ||
    fail "kcat could not read the topic"
  python3 - "$dir" "$d1" "$d2" "$gone" <<'PY' || fail "the broker's copies of the delayed events"
import json, re, sys
d, d1, d2, gone = sys.argv[1:]
ts = {}
for line in open(f"{d}/copies"):
    m = re.search(r"obx-event-id=(evt-[0-9A-Z]+)", line)
    if m:
        ts.setdefault(m.group(1), []).append(int(line.split()[0]))
assert gone not in ts, "the cancelled event reached the topic"
for e in (d1, d2):
    nb = json.load(open(f"{d}/{e}.json"))["envelope"]["not_before_at_ms"]
    assert e in ts, f"{e} is not on the topic"
    assert min(ts[e]) >= nb, f"{e}: a copy stamped {nb - min(ts[e])} ms before its time"
    print(f"ok: {e}: the topic's copy is stamped {min(ts[e]) - nb} ms after its time")
PY
fi

check "cancel after the claim is refused" 1 'PUBLISHED.*cannot be cancelled' -- \
  "$OBX" cancel "$d1" --db "$db" --who alice --reason late
check "status counts CANCELLED" 0 'CANCELLED +1' -- "$OBX" status --db "$db"
"$OBX" report --db "$db" --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert r["states"]["CANCELLED"] == 1 and r["states"]["PENDING"] == 1, r["states"]
assert r["invariants"]["hold"] and r["invariants"]["cancelled_with_attempt"] == 0, r["invariants"]
' || fail "report: CANCELLED not counted or an invariant does not hold"
echo "ok: report counts CANCELLED and its invariants hold"
check "audit counts the cancelled event with no finding" 0 'no findings' -- "$OBX" audit --db "$db"
echo "all delayed-event checks passed ($store, $mode)"

#!/usr/bin/env bash
# test_logs.sh — structured logs and secrets. A password is planted in every place a secret
# can enter obx (store URL, broker URL, a critical consumer's URL, broker properties, the HTTP
# token) and every byte the relay and the CLI print is grepped for it. The relay's records
# about an event (published, UNKNOWN, resolved) carry its event ID, attempt ID and
# correlation ID, in JSON (one object per line) and in text.
# Usage: test_logs.sh OBX [sqlite|postgres]   (postgres: the success path on OBX_TEST_PG_URL
# with a password in the URL, which the test cluster's trust authentication accepts)
set -euo pipefail
OBX=${1:?usage: test_logs.sh OBX [sqlite|postgres]}
mode=${2:-sqlite}
source "$(dirname "$0")/../support/prologue.sh" logs
SECRET=PLANTED-$(od -An -tx1 -N6 /dev/urandom | tr -d ' \n')
db=sqlite:$dir/outbox.db
on_exit '[[ $db == postgres* ]] && pg_drop_db "$db"'
fail() { echo "FAIL: $*" >&2; exit 1; }
out=$dir/all-output.txt
: >"$out"
run() { "$@" >>"$out" 2>&1 || true; } # everything printed goes into one file, success or not

if [[ $mode == postgres ]]; then
  source "$(dirname "$0")/../e2e/pgdb.sh"
  plain=$(pg_fresh_db)
  db=$(python3 - "$plain" "$SECRET" <<'PY'
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
user = p.username or "postgres"
print(u.urlunsplit((p.scheme, "%s:%s@%s:%s" % (user, sys.argv[2], p.hostname, p.port), p.path, p.query, "")))
PY
)
fi

# ---- failures that quote URLs and properties ----
# A relay waits for a dependency it cannot reach (with back-off, logging each failure): each
# runs for 6 s, side by side, its output in a file of its own, then all into $out.
bg() { local f=$1; shift; (timeout 6 "$@" >"$f" 2>&1 || true) & }
# outboxes with a schema, so that the relays get as far as their brokers
for i in 2 3 4 5; do "$OBX" init --db "sqlite:$dir/x$i.db" >/dev/null; done
bg "$dir/r1.txt" "$OBX" relay --db "postgres://obx:$SECRET@127.0.0.1:1/x" --broker "log:$dir/b.db"
bg "$dir/r2.txt" "$OBX" relay --db "sqlite:$dir/x2.db" --broker "amqp://u:$SECRET@127.0.0.1:1/%2f"
bg "$dir/r3.txt" "$OBX" relay --db "sqlite:$dir/x3.db" --broker "amqps://u:$SECRET@127.0.0.1:1/%2f"
bg "$dir/r4.txt" "$OBX" relay --db "sqlite:$dir/x4.db" --broker kafka://127.0.0.1:1 \
  --broker-prop "sasl.password=$SECRET" --broker-prop "no.such.property=$SECRET"
bg "$dir/r5.txt" "$OBX" relay --db "sqlite:$dir/x5.db" --broker "amqp://u:p@127.0.0.1:1/%2f" \
  --broker-prop "password=$SECRET"
wait
for i in 2 3 4 5; do # each waited for its broker and said so, naming where (redacted)
  grep -q '127.0.0.1:1' "$dir/r$i.txt" || fail "relay $i did not say which broker it waits for: $(head -c 600 "$dir/r$i.txt")"
done
cat "$dir"/r[1-5].txt >>"$out"
run "$OBX" init --db "postgres://obx:$SECRET@127.0.0.1:1/x"
run "$OBX" status --db "postgres://obx:$SECRET@127.0.0.1:1/x"
grep -q 'obx:\*\*\*@127.0.0.1:1' "$out" || fail "the store URL is not shown redacted"

# ---- a relay that works, with a critical consumer whose URL carries the password ----
N=30
orders "$db" $N || fail "the outbox"
printf '%s-token-for-http\n' "$SECRET" >"$dir/token"
chmod 600 "$dir/token"
cons="proj=postgres://obx:$SECRET@127.0.0.1:1/consumer"
"$OBX" relay --db "$db" --broker "log:$dir/broker.db?drop_ack=0.3&ack_timeout_ms=100&seed=5" \
  --id logtest --http 127.0.0.1:0 --set log.format=json --set log.level=debug \
  --set relay.poll_ms=10 --set relay.reconcile_ms=50 --set relay.recheck_ms=50 \
  --set relay.drain_ms=300 --set http.token_file="$dir/token" \
  --set audit.critical_consumers="$cons" >"$dir/relay.json" 2>&1 &
pids+=($!)
relay=$!
port=$(http_addr "$dir/relay.json") || fail "relay did not start: $(cat "$dir/relay.json")"
port=${port##*:}
for _ in $(seq 200); do
  pub=$(curl -s "http://127.0.0.1:$port/api/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["states"]["PUBLISHED"])')
  [[ $pub == "$N" ]] && break
  sleep 0.05
done
[[ $pub == "$N" ]] || fail "published $pub of $N"
curl -s "http://127.0.0.1:$port/api/status" >>"$out"
curl -s "http://127.0.0.1:$port/metrics" >>"$out"
curl -s "http://127.0.0.1:$port/api/trace?q=corr-1" >>"$out"
curl -s -X POST -H "Authorization: Bearer wrong" "http://127.0.0.1:$port/api/requeue" -d '{}' >>"$out"
grep -q '"consumer_id":"proj","url":"postgres://obx:\*\*\*@127.0.0.1:1/consumer"' "$out" ||
  fail "the critical consumer's URL is not shown redacted in /api/status"
kill -TERM "$relay"
wait "$relay" || true
cat "$dir/relay.json" >>"$out"
run "$OBX" status --db "$db" --consumer "$cons"
run "$OBX" trace --db "$db" --correlation corr-2 --consumer "$cons"
run "$OBX" trace --db "$db" --correlation corr-2 --consumer "$cons" --json
run "$OBX" report --db "$db"
cat >"$dir/relay.yaml" <<YAML
db: $db
broker: log:$dir/broker.db
audit:
  critical_consumers: ["$cons"]
YAML
run "$OBX" status --config "$dir/relay.yaml"
if grep -n "$SECRET" "$out" | head -5; then fail "the planted secret was printed"; fi
echo "ok: the planted secret appears nowhere in $(wc -l <"$out") lines of output"

# ---- the JSON records about events carry event, attempt and correlation IDs ----
python3 - "$dir/relay.json" "$N" <<'PY'
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
n = int(sys.argv[2])
lines = sum(1 for l in open(sys.argv[1]) if l.strip())
assert len(recs) == lines, "%d of %d lines are JSON objects" % (len(recs), lines)
for r in recs:
    assert {"ts", "level", "component", "msg"} <= r.keys(), r
published = [r for r in recs if r["msg"].startswith("published")]
unknown = [r for r in recs if r["msg"].startswith("outcome UNKNOWN")]
resolved = [r for r in recs if r["msg"].startswith("UNKNOWN resolved")]
assert len(published) + len(resolved) == n, (len(published), len(resolved))
assert unknown and resolved, "the fault knobs produced no UNKNOWN outcome"
for r in published + unknown + resolved:
    assert re.fullmatch(r"evt-[0-9A-Z]{26}", r.get("event_id", "")), r
    assert re.fullmatch(r"att-[0-9A-Z]{26}", r.get("attempt_id", "")), r
    assert re.fullmatch(r"corr-\d+", r.get("correlation_id", "")), r
print("ok: %d JSON records; %d published, %d UNKNOWN, %d resolved, each with event, attempt and "
      "correlation IDs" % (len(recs), len(published), len(unknown), len(resolved)))
PY
# every UNKNOWN record names the attempt of that event, and the correlation ID is the event's
python3 - "$dir/relay.json" "$OBX" "$db" <<'PY'
import json, subprocess, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
r = next(r for r in recs if r["msg"].startswith("outcome UNKNOWN"))
t = json.loads(subprocess.check_output([sys.argv[2], "trace", r["event_id"], "--db", sys.argv[3], "--json"]))
ev = t["events"][0]
assert ev["envelope"]["correlation_id"] == r["correlation_id"], (ev["envelope"], r)
assert r["attempt_id"] in [a["attempt_id"] for a in ev["attempts"]], r
print("ok: the UNKNOWN record's attempt and correlation ID match the event's trace")
PY

# ---- text format: the same IDs, one line per record ----
"$OBX" init --db "sqlite:$dir/text.db" >/dev/null
"$OBX" route set order.created.v1 --db "sqlite:$dir/text.db" --cluster local --topic orders >/dev/null
printf '{"order":1}' | "$OBX" enqueue --db "sqlite:$dir/text.db" --type order.created.v1 \
  --aggregate order/o-1@1 --tenant t1 --correlation-id text-corr-1 >/dev/null
timeout 20 "$OBX" relay --db "sqlite:$dir/text.db" --broker "log:$dir/tb.db?drop_ack=1&ack_timeout_ms=50" \
  --set relay.poll_ms=10 --set relay.reconcile_ms=50 --set relay.drain_ms=200 >"$dir/relay.txt" 2>&1 &
pids+=($!)
trelay=$!
for _ in $(seq 100); do grep -q 'outcome UNKNOWN' "$dir/relay.txt" && break; sleep 0.05; done
kill -TERM "$trelay"
wait "$trelay" || true
grep 'outcome UNKNOWN' "$dir/relay.txt" | head -1 |
  grep -Eq ' event=evt-[0-9A-Z]{26} attempt=att-[0-9A-Z]{26} correlation=text-corr-1$' ||
  fail "text record: $(grep 'outcome UNKNOWN' "$dir/relay.txt" | head -1)"
echo "ok: text records carry event=, attempt= and correlation="

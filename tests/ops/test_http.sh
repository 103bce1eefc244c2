#!/usr/bin/env bash
# test_http.sh — the relay's HTTP server: /healthz, /readyz (and what makes it fail), /metrics
# (valid Prometheus text; outbox gauges; publish-latency and UNKNOWN-resolution histograms that
# count what happened; critical-consumer lag, outcomes and handler durations from its
# database), and the JSON API's guards (token, Host, methods, body size, start-up checks).
# Usage: test_http.sh OBX
set -euo pipefail
OBX=${1:?usage: test_http.sh OBX}
source "$(dirname "$0")/../support/prologue.sh" http
fail() { echo "FAIL: $*" >&2; echo "---- relay log" >&2; tail -40 "$dir"/relay*.log >&2 || true; exit 1; }
db=sqlite:$dir/outbox.db
cdb=sqlite:$dir/consumer.db
mkdir -p "$dir/b"
broker="log:$dir/b/broker.db"
"$OBX" init --db "$cdb" >/dev/null
N=40
orders "$db" $N || fail "the outbox"
token=tok-$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')
printf '%s\n' "$token" >"$dir/token"
chmod 600 "$dir/token"

start_relay() { # LOGNAME BROKER [ARGS...]; sets $port and $relay_pid
  local log=$dir/$1.log b=$2
  shift 2
  "$OBX" relay --db "$db" --broker "$b" --id web --http 127.0.0.1:0 --set relay.poll_ms=10 \
    --set relay.reconcile_ms=50 --set relay.recheck_ms=50 --set relay.drain_ms=300 "$@" >"$log" 2>&1 &
  relay_pid=$!
  pids+=("$relay_pid")
  port=$(http_addr "$log" 5 "$relay_pid") || fail "no HTTP port in $log: $(cat "$log")"
  port=${port##*:}
}
code() { curl -s -o "$dir/body" -w '%{http_code}' "$@"; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }
wait_metric() { # NAME PREDICATE(awk on $1) WHAT
  for _ in $(seq 200); do
    v=$(metric "$1")
    [[ -n $v ]] && awk -v x="$v" "BEGIN { exit !($2) }" && return 0
    sleep 0.05
  done
  fail "$3 (last $1 = ${v:-none})"
}

# lost ACKs (UNKNOWN, resolved by the reconciler's lookup) on a quarter of the sends
start_relay relay "$broker?drop_ack=0.25&ack_timeout_ms=100&seed=3" \
  --set http.token_file="$dir/token" --set audit.critical_consumers="proj=$cdb" \
  --set http.series_interval_ms=250 --set http.series_points=6
base=http://127.0.0.1:$port
[[ $(code "$base/healthz") == 200 && $(cat "$dir/body") == ok ]] || fail "/healthz"
# ready once every relay thread reached the database and the broker (a moment after start)
for _ in $(seq 100); do [[ $(code "$base/readyz") == 200 ]] && break; sleep 0.1; done
[[ $(code "$base/readyz") == 200 && $(cat "$dir/body") == ready ]] || fail "/readyz: $(cat "$dir/body")"
# the first scrape positions the consumer audit cursor (counting starts now)
[[ $(metric 'obx_consumer_up{consumer="proj"}') == 1 ]] || fail "consumer not up"
wait_metric 'obx_events{state="PUBLISHED"}' "x == $N" "all $N events published"
wait_metric obx_publish_latency_seconds_count "x == $N" "publish latency histogram counts every event"
wait_metric obx_unknown_resolution_seconds_count "x >= 1" "UNKNOWN resolutions observed"
[[ $(metric obx_up) == 1 ]] || fail "obx_up"
[[ $(metric obx_unknown_events) == 0 ]] || fail "obx_unknown_events after resolution"
[[ $(metric 'obx_consumer_lag_events{consumer="proj"}') == "$N" ]] || fail "lag before consuming"
lag_s=$(metric 'obx_consumer_lag_seconds{consumer="proj"}')
awk -v x="$lag_s" 'BEGIN { exit !(x > 0) }' || fail "lag seconds $lag_s"
# the charts' ring: bounded at http.series_points, sampled every http.series_interval_ms
sleep 2
[[ $(code "$base/api/series") == 200 ]] || fail "/api/series"
python3 - "$dir/body" "$N" <<'PY' || fail "/api/series: $(head -c 600 "$dir/body")"
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert d["interval_ms"] == 250 and d["capacity"] == 6, d
assert len(d["t"]) == 6, len(d["t"])  # more than 6 samples taken, 6 kept
for k in ("enqueued_per_s", "published_per_s", "backlog", "oldest_pending_age_s",
          "unknown_events", "oldest_unknown_age_s", "retries_per_s"):
    assert len(d[k]) == 6, k
steps = [round(b - a, 2) for a, b in zip(d["t"], d["t"][1:])]
assert all(0.1 <= s <= 1.0 for s in steps), steps
assert d["t"] == sorted(d["t"]), "oldest first"
assert d["backlog"][-1] == 0, d["backlog"]
c = d["consumers"][0]
assert c["consumer_id"] == "proj" and c["lag_events"][-1] == n and c["poison_parked"][-1] == 0, c
PY
[[ $(code "$base/vendor/uplot.js") == 200 ]] && grep -q 'uPlot' "$dir/body" || fail "/vendor/uplot.js"
curl -s "$base/metrics" >"$dir/m1.txt"

# the consumer applies everything: lag 0, outcomes and handler durations counted
"$OBX" consume --consumer-db "$cdb" --broker "$broker" --topic orders --consumer proj \
  --until-idle 400 --types order.created.v1 --tenants t1 2>/dev/null
wait_metric 'obx_consumer_lag_events{consumer="proj"}' "x == 0" "consumer lag back to 0"
[[ $(metric 'obx_consumer_messages_total{consumer="proj",outcome="APPLIED"}') == "$N" ]] ||
  fail "APPLIED count"
[[ $(metric 'obx_consumer_handler_duration_seconds_count{consumer="proj"}') == "$N" ]] ||
  fail "handler histogram count"
[[ $(metric 'obx_consumer_handler_duration_seconds_bucket{consumer="proj",le="+Inf"}') == "$N" ]] ||
  fail "handler +Inf bucket"
curl -s "$base/metrics" >"$dir/m2.txt"

# a poison message: the consumer parks it; the failed-message backlog shows it; the API
# marks it for re-drive (token required), as the dashboard's Re-drive button does
printf 'not json' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-poison@1 \
  --tenant t1 --correlation-id poison-1 >"$dir/poison.id"
wait_metric 'obx_events{state="PUBLISHED"}' "x == $N + 1" "the poison event published"
"$OBX" consume --consumer-db "$cdb" --broker "$broker" --topic orders --consumer proj \
  --until-idle 400 --types order.created.v1 --tenants t1 --max-failures 2 2>/dev/null
wait_metric 'obx_consumer_poison_messages{consumer="proj",state="PARKED"}' "x == 1" "poison backlog"
[[ $(metric 'obx_consumer_messages_total{consumer="proj",outcome="POISONED"}') == 1 ]] ||
  fail "POISONED count"
pid=$(cat "$dir/poison.id")
[[ $(code -X POST "$base/api/redrive" -d "{\"consumer\":\"proj\",\"event_id\":\"$pid\"}") == 401 ]] ||
  fail "re-drive without the token"
[[ $(code -X POST -H "Authorization: Bearer $token" "$base/api/redrive" \
  -d "{\"consumer\":\"nobody\",\"event_id\":\"$pid\"}") == 404 ]] || fail "re-drive of an unknown consumer"
[[ $(code -X POST -H "Authorization: Bearer $token" "$base/api/redrive" \
  -d "{\"consumer\":\"proj\",\"event_id\":\"$pid\"}") == 200 ]] || fail "re-drive: $(cat "$dir/body")"
[[ $(metric 'obx_consumer_poison_messages{consumer="proj",state="REDRIVE"}') == 1 ]] ||
  fail "REDRIVE not visible"
[[ $(code -X POST -H "Authorization: Bearer $token" "$base/api/redrive" \
  -d "{\"consumer\":\"proj\",\"event_id\":\"$pid\"}") == 409 ]] || fail "second re-drive not refused"
grep -q '"state": "REDRIVE"' <<<"$("$OBX" poison list --consumer-db "$cdb" --consumer proj)" ||
  fail "poison list after the re-drive"

# the exposition is well formed: every sample belongs to a family with HELP and TYPE, no
# series twice, histogram buckets cumulative and ending at +Inf == _count
python3 - "$dir/m1.txt" "$dir/m2.txt" <<'PY'
import re, sys
for path in sys.argv[1:]:
    help_, type_, seen, buckets, counts = set(), {}, set(), {}, {}
    for ln in open(path).read().splitlines():
        if ln.startswith("# HELP "):
            help_.add(ln.split()[2]); continue
        if ln.startswith("# TYPE "):
            _, _, name, t = ln.split(); type_[name] = t; continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+|\+Inf|NaN)', ln)
        assert m, "bad line: %r" % ln
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        fam = name if name in type_ else re.sub(r'_(bucket|sum|count)$', '', name)
        assert fam in type_ and fam in help_, "no HELP/TYPE for %s" % name
        assert (name, labels) not in seen, "series twice: %s%s" % (name, labels)
        seen.add((name, labels))
        if type_[fam] == "histogram" and name.endswith("_bucket"):
            rest = re.sub(r',?le="[^"]*"', '', labels).replace("{,", "{")
            buckets.setdefault((fam, "" if rest == "{}" else rest), []).append(value)
        elif type_[fam] == "histogram" and name.endswith("_count"):
            counts[(fam, labels)] = value
    assert buckets, "no histogram"
    for key, vals in buckets.items():
        assert vals == sorted(vals), "buckets not cumulative: %s %s" % (key, vals)
        assert vals[-1] == counts[key], "+Inf bucket %s != count %s for %s" % (vals[-1], counts[key], key)
    print("%s: %d series, %d histograms, well formed" % (path.rsplit("/", 1)[-1], len(seen), len(buckets)))
PY

# API guards
[[ $(code -X POST "$base/api/requeue" -d '{"event_id":"x"}') == 401 ]] || fail "no token: not 401"
[[ $(code -X POST -H "Authorization: Bearer wrong-$token" "$base/api/requeue" -d '{}') == 401 ]] ||
  fail "wrong token: not 401"
[[ $(code "$base/api/requeue") == 405 ]] || fail "GET on a mutating route"
[[ $(code -H 'Host: attacker.example' "$base/api/status") == 403 ]] || fail "foreign Host served"
[[ $(code -H "Host: localhost:$port" "$base/api/status") == 200 ]] || fail "localhost Host refused"
head -c 20000 /dev/zero | tr '\0' 'a' >"$dir/big"
[[ $(code -X POST -H "Authorization: Bearer $token" --data-binary @"$dir/big" "$base/api/requeue") == 400 ]] ||
  fail "oversized body"
ev=$("$OBX" status --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
[[ $ev == $((N + 1)) ]] || fail "status total $ev"
some=$("$OBX" trace --db "$db" --correlation corr-1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"][0]["event_id"])')
[[ $(code -X POST -H "Authorization: Bearer $token" "$base/api/requeue" -d "{\"event_id\":\"$some\"}") == 409 ]] ||
  fail "requeue of a PUBLISHED event: $(cat "$dir/body")"
grep -q 'only PARKED events' "$dir/body" || fail "409 body: $(cat "$dir/body")"
[[ $(code "$base/api/trace?q=$some") == 200 ]] || fail "trace"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); c=d["events"][0]["consumers"][0]; assert c["receipt"]["outcome"]=="APPLIED", c' "$dir/body" ||
  fail "trace lacks the consumer receipt"
grep -q "$token" "$dir"/relay.log && fail "the token reached the log"

# readiness: a schema that is not current, then a broker that cannot be opened. The sqlite3
# shell has no busy timeout of its own: beside the running relay, whose write transactions hold
# SQLite's single write lock, it failed "database is locked" at once under load (CI, db4539e).
sq() { sqlite3 -cmd '.timeout 10000' "$@"; }
schema=$(sq "$dir/outbox.db" "SELECT value FROM obx_meta WHERE key = 'schema_version'")
sq "$dir/outbox.db" "UPDATE obx_meta SET value = '99' WHERE key = 'schema_version'"
# /readyz answers from the relay's state and its probe's last look (once a second while asked):
# the change shows within a few seconds
readyz_until() {
  for _ in $(seq 50); do [[ $(code "$base/readyz") == "$1" ]] && return 0; sleep 0.1; done
  return 1
}
readyz_until 503 || fail "readyz with schema 99"
grep -q 'schema version 99' "$dir/body" || fail "readyz body: $(cat "$dir/body")"
[[ $(metric obx_up) == 1 ]] || fail "metrics need the database, not the schema"
sq "$dir/outbox.db" "UPDATE obx_meta SET value = '$schema' WHERE key = 'schema_version'"
readyz_until 200 || fail "readyz after restoring the schema"
mv "$dir/b" "$dir/b.away"
readyz_until 503 || fail "readyz with the broker gone"
mv "$dir/b.away" "$dir/b"
readyz_until 200 || fail "readyz with the broker back"
[[ $(code "$base/healthz") == 200 ]] || fail "healthz"
kill -TERM "$relay_pid"
wait "$relay_pid" || fail "relay exit status"
echo "ok: healthz, readyz (schema, broker), metrics, API guards"

# start-up checks: a short token, a missing token file, a malformed critical consumer
printf 'short\n' >"$dir/short"
"$OBX" relay --db "$db" --broker "$broker" --http 127.0.0.1:0 --set http.token_file="$dir/short" \
  >"$dir/relay-short.log" 2>&1 && fail "relay started with a 5-byte token"
grep -q 'at least 16' "$dir/relay-short.log" || fail "short token message: $(cat "$dir/relay-short.log")"
"$OBX" relay --db "$db" --broker "$broker" --http 127.0.0.1:0 --set http.token_file="$dir/none" \
  >"$dir/relay-none.log" 2>&1 && fail "relay started without its token file"
grep -q "$dir/none" "$dir/relay-none.log" || fail "missing token file message"
"$OBX" relay --db "$db" --broker "$broker" --set http.series_points=1 \
  >"$dir/relay-sp.log" 2>&1 && fail "relay started with a one-point series"
grep -q 'http.series_points' "$dir/relay-sp.log" || fail "series_points message: $(cat "$dir/relay-sp.log")"
"$OBX" relay --db "$db" --broker "$broker" --set audit.critical_consumers=no-url \
  >"$dir/relay-cc.log" 2>&1 && fail "relay started with a malformed critical consumer"
grep -q 'is not ID=URL' "$dir/relay-cc.log" || fail "critical consumer message: $(cat "$dir/relay-cc.log")"
# no token file: mutating requests are disabled, reads work
start_relay relay-ro "$broker"
[[ $(code -X POST -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/requeue" -d '{}') == 403 ]] ||
  fail "mutating request without a configured token"
[[ $(code "http://127.0.0.1:$port/api/status") == 200 ]] || fail "status without a token file"
kill -TERM "$relay_pid"
wait "$relay_pid" || true
echo "ok: start-up checks"

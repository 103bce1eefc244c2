#!/usr/bin/env bash
# test_cli_times.sh OBX — times (issue 50, item 6): wherever a person reads one it is ISO-8601
# UTC (the tables of inspect, status, trace, audit, purge and watermark list: no epoch
# milliseconds left in them); in JSON epoch milliseconds are only in keys ending in _ms (LEGACY
# below, the keys that carried them before, is empty now: they were renamed NAME_ms), except the
# offset of a consumer's "(forced)" watermark row. A new key carrying epoch ms without _ms fails
# here. The JSON read: every command's
# --json and the relay's /api/status, /api/trace and /api/series. (The dashboard's own times
# and charts: tests/e2e/test_dashboard.py.)
set -u
OBX=$(realpath "${1:?usage: test_cli_times.sh OBX}")
source "$(dirname "$0")/../support/prologue.sh" times # dir, pids, bad, fails, http_addr
cd "$dir"
LEGACY=""

timeout 300 "$OBX" demo --events 30 --lease-ms 300 --dir "$dir/d" >/dev/null 2>&1 || bad "the demo failed"
db=sqlite:$dir/d/outbox.db
cons=proj=sqlite:$dir/d/consumer.db
id=$(sqlite3 "$dir/d/outbox.db" "SELECT event_id FROM obx_event ORDER BY seq LIMIT 1")
corr=$(sqlite3 "$dir/d/outbox.db" "SELECT correlation_id FROM obx_envelope WHERE event_id = '$id'")
iso='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z'
epoch='(^|[^0-9])1[5-9][0-9]{11}([^0-9]|$)' # ms since the epoch, 2017..2033
# text NAME [any] -- command...: no epoch ms in it, and ISO times (unless "any": it may have
# no time to show)
text() {
  local name=$1 any=
  [[ $2 == any ]] && { any=1; shift; }
  shift 2
  local out
  out=$("$@" 2>&1)
  if grep -Eq "$epoch" <<<"$out"; then
    bad "$name prints epoch milliseconds: $(grep -E "$epoch" <<<"$out" | head -3)"
  elif [[ -z $any ]] && ! grep -Eq "$iso" <<<"$out"; then
    bad "$name prints no ISO-8601 UTC time: ${out:0:300}"
  else
    echo "ok   $name: $(grep -Ec "$iso" <<<"$out") lines with ISO-8601 UTC times"
  fi
}
text "inspect" -- "$OBX" inspect "$id" --db "$db"
text "status" -- "$OBX" status --db "$db" --consumer "$cons"
text "trace" -- "$OBX" trace "$id" --db "$db" --consumer "$cons"
text "audit" -- "$OBX" audit --db "$db" --consumer "$cons"
"$OBX" watermark force proj --until now --reason test --db "$db" --consumer "$cons" >/dev/null
text "watermark list" -- "$OBX" watermark list --db "$db" --consumer "$cons"
text "purge --dry-run" any -- "$OBX" purge --dry-run --db "$db" --consumer "$cons"

# JSON: epoch ms only in keys ending in _ms (or a legacy key)
{
  "$OBX" inspect "$id" --db "$db" --json
  "$OBX" status --db "$db" --consumer "$cons" --json
  "$OBX" trace "$id" --db "$db" --consumer "$cons" --json
  "$OBX" report --db "$db" --json
  "$OBX" audit --db "$db" --consumer "$cons" --json
  "$OBX" purge --dry-run --db "$db" --consumer "$cons" --json
  "$OBX" watermark list --db "$db" --consumer "$cons" --json
  "$OBX" route list --db "$db" --all --json
  "$OBX" poison list --consumer-db "sqlite:$dir/d/consumer.db" --json
  "$OBX" shadow --db "$db" --feed /dev/null --json
  "$OBX" migrate --db "$db" --type order.created.v1 --route-gen 1 --dry-run --json
} >cli.json 2>/dev/null
"$OBX" relay --db "$db" --broker "log:$dir/d/broker.db" --http 127.0.0.1:0 \
  --set audit.critical_consumers="$cons" --set http.series_interval_ms=100 \
  --set relay.drain_ms=100 >relay.log 2>&1 &
pids+=($!)
port=$(http_addr relay.log) || bad "the relay's HTTP server did not start: $(cat relay.log)"
port=${port##*:}
sleep 0.5
{
  curl -s "http://127.0.0.1:$port/api/status"
  curl -s "http://127.0.0.1:$port/api/trace?q=$corr"
  curl -s "http://127.0.0.1:$port/api/series"
} >api.json
python3 - "$LEGACY" cli.json api.json <<'PY' || fails=$((fails + 1))
import json, sys
legacy = set(sys.argv[1].split())
found, seen = {}, 0
def walk(o, key):
    global seen
    if isinstance(o, dict):
        for k, v in o.items():
            # a critical consumer's forced watermark, listed among its watermarks as topic
            # "(forced)" whose offset is the time it was forced to (legacy too)
            if k == "offset" and o.get("topic") == "(forced)":
                continue
            walk(v, k)
    elif isinstance(o, list):
        for v in o:
            walk(v, key)
    elif isinstance(o, (int, float)) and not isinstance(o, bool) and 1.5e12 <= o < 2.0e12:
        seen += 1
        if not key.endswith("_ms") and key not in legacy:
            found.setdefault(key, o)
for path in sys.argv[2:]:
    dec, text = json.JSONDecoder(), open(path).read()
    i = 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            break
        doc, i = dec.raw_decode(text, i)
        walk(doc, "")
if seen < 20:
    print("FAIL only %d epoch-ms values seen: the outputs are not what this test reads" % seen)
    sys.exit(1)
if found:
    print("FAIL keys carrying epoch ms without _ms (not legacy): %s" % found)
    sys.exit(1)
print("ok   %d epoch-ms values in JSON, each under a key ending in _ms or a legacy key" % seen)
PY
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

#!/usr/bin/env bash
# test_ops_files.sh — docs/ops/: the Prometheus alert rules and the Grafana dashboard.
# Usage: test_ops_files.sh OBX
#   - `promtool check rules` accepts alerts.yml and `promtool test rules` runs alerts.test.yml
#     (each alert fires on the series that should fire it, with its labels and text);
#   - the dashboard is valid JSON whose every panel has a Prometheus query, and every query is
#     valid PromQL (checked by promtool as a recording rule);
#   - every obx_ metric the two files name is exported by a running relay's /metrics (a relay
#     with a critical consumer, so that the consumer families are there too).
set -euo pipefail
OBX=${1:?usage: test_ops_files.sh OBX}
root=$(cd "$(dirname "$0")/../.." && pwd)
ops=$root/docs/ops
source "$(dirname "$0")/../support/prologue.sh" opsfiles # dir, pids, fail, http_addr
command -v promtool >/dev/null || fail "promtool not found (scripts/deps.sh test installs Debian's prometheus)"

promtool check rules "$ops/alerts.yml" >"$dir/check.out" 2>&1 || { cat "$dir/check.out"; fail "promtool check rules"; }
grep -q "SUCCESS: 13 rules found" "$dir/check.out" || fail "rules: $(cat "$dir/check.out")"
(cd "$ops" && promtool test rules alerts.test.yml) >"$dir/test.out" 2>&1 || { cat "$dir/test.out"; fail "promtool test rules"; }
echo "ok: promtool accepts alerts.yml (13 rules) and its unit tests pass"

# the dashboard's queries, as recording rules promtool can check
python3 - "$ops/grafana-dashboard.json" "$dir/panels.yml" "$dir/exprs.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exprs, ids = [], set()
for p in d["panels"]:
    assert p["id"] not in ids, "duplicate panel id %s" % p["id"]
    ids.add(p["id"])
    assert p["datasource"]["type"] == "prometheus", p["title"]
    assert p["targets"], "panel without a query: %s" % p["title"]
    for t in p["targets"]:
        exprs.append(t["expr"])
assert any(i["name"] == "DS_PROMETHEUS" for i in d["__inputs"])
with open(sys.argv[2], "w") as f:
    f.write("groups:\n  - name: panels\n    rules:\n")
    for i, e in enumerate(exprs):
        f.write("      - record: obx_dashboard:panel_%d\n        expr: %s\n" % (i, json.dumps(e)))
open(sys.argv[3], "w").write("\n".join(exprs) + "\n")
print("ok: grafana-dashboard.json: %d panels, %d queries" % (len(d["panels"]), len(exprs)))
PY
promtool check rules "$dir/panels.yml" >"$dir/panels.out" 2>&1 || { cat "$dir/panels.out"; fail "a dashboard query is not valid PromQL"; }
echo "ok: every dashboard query is valid PromQL"

# a running relay's families
db=sqlite:$dir/o.db cdb=sqlite:$dir/c.db
"$OBX" init --db "$db" >/dev/null
"$OBX" init --db "$cdb" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
printf '{"order":1}' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-1@1 --tenant t1 >/dev/null
"$OBX" relay --db "$db" --broker "log:$dir/b.db" --http 127.0.0.1:0 \
  --set audit.critical_consumers="proj=$cdb" >"$dir/relay.log" 2>&1 &
pids+=($!)
port=$(http_addr "$dir/relay.log" 10) || fail "relay did not listen: $(cat "$dir/relay.log")"
port=${port##*:}
curl -sf "http://127.0.0.1:$port/metrics" >"$dir/metrics.txt" || fail "scrape"
sed -n 's/^# TYPE \([a-z_0-9]*\) \([a-z]*\)$/\1 \2/p' "$dir/metrics.txt" | sort -u >"$dir/families"
{ grep -v '^ *#' "$ops/alerts.yml" | grep -o 'obx_[a-z0-9_]*' || true; grep -o 'obx_[a-z0-9_]*' "$dir/exprs.txt" || true; } |
  grep -v '^obx_dashboard' | sort -u >"$dir/named"
n=0
while read -r m; do
  base=$m
  for sfx in _bucket _sum _count; do
    [[ $m == *"$sfx" ]] && grep -q "^${m%"$sfx"} histogram$" "$dir/families" && base=${m%"$sfx"}
  done
  grep -q "^$base " "$dir/families" || fail "docs/ops names $m, which the relay does not export"
  n=$((n + 1))
done <"$dir/named"
[[ $n -ge 15 ]] || fail "only $n metric names found in docs/ops"
echo "ok: the $n obx_ metrics docs/ops names are all exported by a running relay"

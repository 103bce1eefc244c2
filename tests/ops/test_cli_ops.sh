#!/usr/bin/env bash
# test_cli_ops.sh — the operator commands: `obx consumer-test` (the built-in sample consumer, and
# handlers loaded from a library: a correct one passes, a broken one is caught scenario by
# scenario), `obx catalog check` (a consistent catalog passes; each kind of finding is planted
# once and reported; malformed files name the line; runtime subscriptions read from a consumer
# database), and `obx status` / `obx trace` exit codes and --watch.
# Usage: test_cli_ops.sh OBX KIT_HANDLERS_SO TESTS_OPS_DIR
set -euo pipefail
OBX=${1:?usage: test_cli_ops.sh OBX KIT_HANDLERS_SO DIR}
KIT=${2:?}
source "$(dirname "$0")/../support/prologue.sh" cli-ops

# ---- consumer-test ----
# the sample as shipped (and as the README shows it) declares its contracts and tenants
check "builtin with its defaults" 0 '0 scenario\(s\) mishandled' -- \
  "$OBX" consumer-test --builtin order-projection
grep -Eq 'declares contracts: yes; tenants: yes' "$dir/out" || fail "builtin declarations"
# without them it is caught, and the report says how to fix each mishandled scenario
check "builtin without declarations" 1 'older-contract +MISHANDLED' -- \
  "$OBX" consumer-test --builtin order-projection --types '*' --tenants '*'
grep -Eq 'foreign-tenant +MISHANDLED' "$dir/out" || fail "foreign tenant not reported"
grep -Eq 'lost-commit +ok' "$dir/out" || fail "builtin lost-commit"
grep -Eq 'fix: declare the contracts the consumer understands' "$dir/out" || fail "no contract fix"
grep -Eq 'fix: declare the tenants the consumer serves' "$dir/out" || fail "no tenant fix"
[[ $(grep -c 'fix:' "$dir/out") == 2 ]] || fail "a fix line for each mishandled scenario only"
check "correct handler (default symbol)" 0 '0 scenario\(s\) mishandled' -- \
  "$OBX" consumer-test --handler "$KIT"
check "broken handler" 1 '5 scenario\(s\) mishandled' -- \
  "$OBX" consumer-test --handler "$KIT:obx_kit_broken"
for s in lost-commit reordering older-contract foreign-tenant poison; do
  grep -Eq "^  $s +MISHANDLED" "$dir/out" || fail "broken handler: $s not reported"
done
grep -Eq '^  duplicate +ok' "$dir/out" || fail "broken handler: duplicates go through the inbox"
"$OBX" consumer-test --handler "$KIT:obx_kit_broken" --json >"$dir/kit.json" || true
python3 - "$dir/kit.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
bad = sorted(s["scenario"] for s in d["scenarios"] if not s["ok"])
assert d["mishandled"] == 5 and bad == sorted(["lost-commit", "reordering", "older-contract", "foreign-tenant", "poison"]), d
lost = next(s for s in d["scenarios"] if s["scenario"] == "lost-commit")
assert "outside the consumer's transaction" in lost["detail"], lost
assert all(s.get("fix") for s in d["scenarios"] if not s["ok"]), d
assert not any("fix" in s for s in d["scenarios"] if s["ok"]), d
assert "effect_key" in lost["fix"], lost
print("ok: --json names the five mishandled scenarios")
PY
check "in-process dedupe set" 1 'lost-commit +MISHANDLED' -- \
  "$OBX" consumer-test --handler "$KIT:obx_kit_inproc_dedupe"
check "unknown symbol" 2 "no consumer test spec 'nope'" -- \
  "$OBX" consumer-test --handler "$KIT:nope"
check "bare library name" 2 'is not a path' -- "$OBX" consumer-test --handler libkit.so
check "max failures 1" 2 'is not 2..1000' -- \
  "$OBX" consumer-test --builtin order-projection --max-failures 1
check "neither builtin nor handler" 2 'usage' -- "$OBX" consumer-test

# ---- catalog check ----
db=sqlite:$dir/outbox.db
"$OBX" init --db "$db" >/dev/null
routes() { # routes TYPE:TOPIC...: a route of each TYPE to TOPIC (cluster local) in $db
  local r
  for r in "$@"; do "$OBX" route set "${r%%:*}" --db "$db" --cluster local --topic "${r#*:}" >/dev/null; done
}
routes order.created.v2:orders.v2 payment.captured.v1:payments.v1
cat >"$dir/catalog.yaml" <<'YAML'
# a consistent catalog
topics:
  - name: orders.v2
    owner: orders-team
    event_types: [order.created.v2]
    subscribers: [order-projection, billing]
  - name: payments.v1
    owner: payments-team
    event_types: [payment.captured.v1]
    subscribers: [billing]
YAML
cat >"$dir/consumers.yaml" <<'YAML'
consumers:
  - id: order-projection
    topics: [orders.v2]
    event_types: [order.created.v2]
  - id: billing
    topics: [orders.v2, payments.v1]
YAML
check "consistent catalog" 0 '^0 finding' -- \
  "$OBX" catalog check --catalog "$dir/catalog.yaml" --db "$db" --consumers "$dir/consumers.yaml"
check "catalog alone (its subscribers)" 0 '^0 finding' -- \
  "$OBX" catalog check --catalog "$dir/catalog.yaml"

# every kind of finding, planted once
routes order.shiped.v2:orders.v2 refund.issued.v1:refunds.v1 invoice.sent.v1:billing.v1
cat >"$dir/bad.yaml" <<'YAML'
topics:
  - name: orders.v2
    owner: orders-team
    event_types: [order.created.v2, order.shipped.v2]
    subscribers: [order-projection, billing, ghost]
  - name: payments.v1
    owner: payments-team
    event_types: [payment.captured.v1, order.created.v2]
    subscribers: []
  - name: refunds.v1
    owner: payments-team
    event_types: [refund.issued.v1]
    subscribers: [billing]
  - name: audit-trail
    event_types: [audit.recorded.v1]
    subscribers: [auditor]
  - name: Orders.V2
    owner: someone
  - name: invoices.v1
    owner: billing-team
    event_types: [invoice.sent.v1]
    subscribers: [billing]
  - name: orders.v2
    owner: orders-team
YAML
cat >"$dir/bad-consumers.yaml" <<'YAML'
consumers:
  - id: order-projection
    topics: [orders.v2, shipments.v1]
    event_types: [order.created.v2, order.created.v3, payment.captured.v1, parcel.sent.v1]
  - id: billing
    topics: [order.v2, refunds.v1, invoices.v1]
  - id: auditor
    topics: [audit-trail, payments.v1]
  - id: mailer
    topics: [invoices.v1]
YAML
"$OBX" catalog check --catalog "$dir/bad.yaml" --db "$db" --consumers "$dir/bad-consumers.yaml" \
  --subscription reporting=orders.v1 --json >"$dir/bad.json" && fail "findings but exit 0"
python3 - "$dir/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
got = {}
for f in d["findings"]:
    got.setdefault(f["kind"], []).append((f["subject"], f.get("suggestion")))
want = {
    "topic-unversioned": ("audit-trail", None),
    "topic-without-owner": ("audit-trail", None),
    "duplicate-topic": ("orders.v2", None),
    "type-on-two-topics": ("order.created.v2", None),
    "spelling-drift": ("order.v2", "orders.v2"),            # billing's subscription
    "version-drift": ("orders.v1", "orders.v2"),             # reporting's subscription
    "route-topic-mismatch": ("invoice.sent.v1", "invoices.v1"),
    "type-without-route": ("order.shipped.v2", None),
    "subscription-undeclared-topic": ("shipments.v1", None),
    "consumer-type-undeclared": ("parcel.sent.v1", None),
    "type-not-subscribed": ("payment.captured.v1", None),
    "subscriber-not-in-catalog": ("mailer", None),
    "subscriber-not-subscribed": ("billing", None),
    "subscriber-unknown": ("ghost", None),
    "topic-without-consumer": ("Orders.V2", None),
}
missing = [k for k, v in want.items() if v not in got.get(k, [])]
# more drift: the route's misspelt type, the catalog's near-duplicate topic
for kind, subject, sug in (("spelling-drift", "order.shiped.v2", "order.shipped.v2"),
                          ("spelling-drift", "Orders.V2", "orders.v2"),
                          ("version-drift", "order.created.v3", "order.created.v2")):
    if (subject, sug) not in got.get(kind, []):
        missing.append("%s %s" % (kind, subject))
assert not missing, "missing %s in %s" % (missing, json.dumps(got, indent=1))
assert d["findings_count"] == len(d["findings"]) and not d["ok"]
assert all(f.get("line") for f in d["findings"] if f["kind"] in ("topic-unversioned", "duplicate-topic"))
print("ok: %d findings of %d kinds, each planted one reported" % (len(d["findings"]), len(got)))
PY
check "text report" 1 "did you mean 'orders.v2'" -- \
  "$OBX" catalog check --catalog "$dir/bad.yaml" --consumers "$dir/bad-consumers.yaml"

# malformed files name the line
printf 'topics:\n  - name: orders.v2\n    owner: x\n    subscriber: [a]\n' >"$dir/typo.yaml"
check "unknown key" 2 "typo.yaml \(line 4\): unknown key 'subscriber'" -- \
  "$OBX" catalog check --catalog "$dir/typo.yaml"
printf 'topics:\n  - name: "bad topic"\n' >"$dir/badname.yaml"
check "bad topic name" 2 'badname.yaml \(line 2\).*topic' -- \
  "$OBX" catalog check --catalog "$dir/badname.yaml"
printf 'topics: [\n' >"$dir/broken.yaml"
check "YAML syntax" 2 'broken.yaml \(line [0-9]+\): YAML' -- \
  "$OBX" catalog check --catalog "$dir/broken.yaml"
check "missing catalog" 2 '--catalog: required' -- "$OBX" catalog check
check "bad subscription" 2 'is not CONSUMER=TOPIC' -- \
  "$OBX" catalog check --catalog "$dir/catalog.yaml" --subscription nobody

# runtime subscriptions from a consumer database: what it really consumed
cdb=sqlite:$dir/consumer.db
printf '{"order":1}' | "$OBX" enqueue --db "$db" --type order.created.v2 --aggregate order/o-1@1 \
  --tenant t1 >/dev/null
timeout 20 "$OBX" relay --db "$db" --broker "log:$dir/broker.db" --set relay.poll_ms=10 \
  --set relay.drain_ms=100 >"$dir/relay.log" 2>&1 &
relay=$!
for _ in $(seq 100); do
  [[ $("$OBX" status --db "$db" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["states"]["PUBLISHED"])') == 1 ]] && break
  sleep 0.05
done
kill -TERM "$relay"
wait "$relay" || true
"$OBX" consume --consumer-db "$cdb" --broker "log:$dir/broker.db" --topic orders.v2 \
  --consumer order-projection --types order.created.v2 --tenants t1 --until-idle 300 2>/dev/null
check "runtime subscriptions (watermarks)" 1 'subscriber-unknown +billing' -- \
  "$OBX" catalog check --catalog "$dir/catalog.yaml" --consumer-db "order-projection=$cdb"
grep -Eq 'topic-without-consumer +payments.v1' "$dir/out" || fail "payments.v1 consumed by nobody at run time"
grep -q 'order-projection' "$dir/out" && fail "order-projection consumed its topic: no finding expected"

# ---- status and trace ----
check "status" 0 'PUBLISHED +1' -- "$OBX" status --db "$db"
check "trace by ID not found" 1 'not in this outbox' -- \
  "$OBX" trace evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3H --db "$db"
check "trace without an ID" 2 'usage' -- "$OBX" trace --db "$db"
check "trace unknown correlation" 1 "no event with correlation ID" -- \
  "$OBX" trace --correlation nope --db "$db"
id=$(sqlite3 -cmd '.timeout 10000' "$dir/outbox.db" 'SELECT event_id FROM obx_event LIMIT 1')
check "trace with the consumer" 0 'consumer +order-projection APPLIED' -- \
  "$OBX" trace "$id" --db "$db" --consumer "order-projection=$cdb"
grep -q 'producer    committed in txid' "$dir/out" || fail "trace starts at the producer's commit"
set +e
timeout -s INT --preserve-status 2.5 "$OBX" status --db "$db" --watch 1 >"$dir/watch" 2>&1
rc=$?
set -e
[[ $rc == 0 ]] || fail "status --watch ended with $rc"
[[ $(grep -c 'obx status' "$dir/watch") -ge 2 ]] || fail "status --watch did not refresh"
echo "ok: status --watch refreshes and stops on SIGINT"

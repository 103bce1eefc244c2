#!/usr/bin/env bash
# test_consume_unordered.sh — the unordered consumer (issue 51, item 1: `obx consume --unordered`)
# on a real pipeline: SQLite outbox, `obx relay`, then `obx consume --unordered --exec` on the
# local log broker, RabbitMQ or the Kafka mock cluster (bench/chaos_kmock: the third argument, or
# beside the obx binary).
# Usage: test_consume_unordered.sh OBX [log|amqp|kafka [CHAOS_KMOCK]]
#
# Four events: o-flaky, whose handler fails three times and then succeeds, o-next of the same
# key behind it, o-other of another key, and o-dead (another key) whose handler always fails.
# --retry-backoff BASE,10*BASE (BASE 2 s: the kill lands before the first retry on a loaded
# machine; 3 s on Kafka, whose new group member waits for its assignment) --max-failures 4. Checked from outside (the handler writes a timestamp per run):
#   - run 1 applies o-next and o-other while o-flaky's retry is pending (a failed message holds
#     neither its key nor its partition), and keeps a copy of o-flaky and o-dead in the inbox
#     (obx_inbox_retry); it is then killed (SIGKILL) between the failure and the retry;
#   - run 2 (--until-idle 300 --json, a new group on the log broker and Kafka: everything is
#     delivered again) does not stop while a retry it waits for is pending (it would stop 0.3 s
#     after its start otherwise), absorbs the broker's redeliveries of o-flaky and o-dead
#     (`delayed`; none on RabbitMQ, which redelivers nothing acknowledged), runs the retries from
#     the kept copies (`retried` 6) at their due times within the jitter, never early across the
#     restart, applies o-flaky once and parks o-dead after 4 failures. A redelivery that comes
#     once its retry is due (a slow restart: a Kafka group join under the sanitizers) runs that
#     retry itself: one `delayed` and one `retried` fewer, the same tries;
#   - every effect applied once; no copy left; the failure rows of applied events gone.
set -euo pipefail
OBX=${1:?usage: test_consume_unordered.sh OBX [log|amqp|kafka]}
mode=${2:-log}
T=$(mktemp -d /tmp/obx-unord-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [[ -s $T/consumer.pid ]] && kill -9 "$(cat "$T/consumer.pid")" 2>/dev/null || true
  rm -rf "$T"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/relay.log "$T"/consume*.log "$T"/consume*.json "$T"/runs; do
    [[ -f $f ]] && { echo "---- $f" >&2; tail -30 "$f" >&2; }
  done
  exit 1
}
q() { sqlite3 -cmd '.timeout 10000' "$T/c.db" "$1"; }

# shellcheck source=tests/support/retry_fx.sh
source "$(dirname "$0")/../support/retry_fx.sh"
retry_broker unord "${3:-}"
base=2
[[ $mode == kafka ]] && base=3
retry_publish o-flaky:o-flaky:1 o-flaky:o-next:2 o-other:o-other:1 o-dead:o-dead:1
retry_handler

run=0
consume() { # extra flags
  run=$((run + 1))
  # a group of its own per run on the log broker and Kafka: run 2 is handed every message again
  "$OBX" consume --consumer-db "sqlite:$T/c.db" --broker "$consume_broker" --topic "$source_" \
    --consumer unord-proj --types order.created.v1 --tenants t1 --max-failures 4 \
    --retry-backoff "${base}s,$((10 * base))s" --unordered --exec "$T/handler.sh" \
    --group "unord-g$run" "$@" >"$T/consume$run.json" 2>"$T/consume$run.log" &
  echo $! >"$T/consumer.pid"
}
runs_of() { grep -c " $1\$" "$T/runs" 2>/dev/null || true; }
applied() { [[ -s $T/effects ]] && grep -q " $1\$" "$T/effects"; }

consume
# run 1: o-next and o-other applied while o-flaky waits for its retry, both failures' copies kept
for _ in $(seq 400); do
  applied o-next && applied o-other &&
    [[ $(q "SELECT count(*) FROM obx_inbox_retry WHERE consumer_id = 'unord-proj'") == 2 ]] && break
  sleep 0.02
done
date +%s.%N >"$T/restart"
kill -9 "$(cat "$T/consumer.pid")"
wait "$(cat "$T/consumer.pid")" 2>/dev/null || true
applied o-next || fail "o-next was held back behind o-flaky's retry"
applied o-other || fail "o-other was held back"
[[ $(q "SELECT group_concat(event_id || ' ' || failures) FROM obx_inbox_failure WHERE consumer_id = 'unord-proj'") =~ ' 1,'.*' 1'$ ]] ||
  fail "failure rows: $(q 'SELECT event_id, failures FROM obx_inbox_failure')"
[[ $(runs_of o-flaky) == 1 ]] || fail "o-flaky ran $(runs_of o-flaky) times before the kill"
# the copy is the bytes as received, with their digest
q "SELECT payload_digest, hex(payload) FROM obx_inbox_retry" | python3 -c '
import sys, hashlib
for l in sys.stdin:
    d, h = l.strip().split("|")
    assert d == "sha256:" + hashlib.sha256(bytes.fromhex(h)).hexdigest(), l
' || fail "a kept copy's digest is not its bytes' SHA-256"

# run 2: stops by itself once idle, not while a retry is pending
t0=$(date +%s)
consume --until-idle 300 --json
rc=0
for _ in $(seq 900); do kill -0 "$(cat "$T/consumer.pid")" 2>/dev/null || break; sleep 0.1; done
kill -0 "$(cat "$T/consumer.pid")" 2>/dev/null && fail "run 2 (--until-idle 300) did not stop in 90 s"
wait "$(cat "$T/consumer.pid")" || rc=$?
[[ $rc == 0 ]] || fail "run 2 exited $rc"
echo "run 2 stopped by itself after $(($(date +%s) - t0)) s (--until-idle 300)"
applied o-flaky || fail "run 2 stopped before o-flaky's retries were done (--until-idle with a retry pending)"

# ---- the schedule, from the handler's timestamps ----
python3 - "$T/runs" "$T/effects" "$T/restart" "$mode" "$base" <<'PY' || fail "schedule"
import sys
runs = [l.split() for l in open(sys.argv[1])]
restart, mode, base = float(open(sys.argv[3]).read()), sys.argv[4], float(sys.argv[5])
t = {}
for ts, o in runs:
    t.setdefault(o, []).append(float(ts))
def spaced(o, n):
    ts = t.get(o, [])
    assert len(ts) == n, "%s ran %d times, want %d: %s" % (o, len(ts), n, ts)
    for i in range(1, n):
        gap, step = ts[i] - ts[i - 1], base * 2 ** (i - 1)
        # the try after the restart: may be late by the restart (never early)
        late = 1e9 if i == 1 else 1.2 * step + 0.5
        ok = 0.8 * step - 0.1 <= gap <= late
        print("%s try %d: %.3f s after the previous (back-off %.1f s +-20%%)%s"
              % (o, i + 1, gap, step, "" if ok else "  <-- outside"))
        assert ok, "%s: try %d came %.3f s after the previous, back-off %.1f s" % (o, i + 1, gap, step)
spaced("o-flaky", 4)
spaced("o-dead", 4)
for o in ("o-next", "o-other"):
    assert len(t.get(o, [])) == 1, "%s ran %s" % (o, t.get(o))
    # unordered: applied before o-flaky's retry succeeded (and before the restart)
    assert t[o][0] < t["o-flaky"][1] and t[o][0] < restart, "%s waited behind o-flaky" % o
eff = sorted(l.split()[1] for l in open(sys.argv[2]))
assert eff == ["o-flaky", "o-next", "o-other"], "effects %s" % eff
PY
[[ $(q "SELECT count(*) FROM obx_inbox WHERE consumer_id = 'unord-proj' AND outcome = 'APPLIED'") == 3 ]] ||
  fail "receipts: $(q 'SELECT event_id, outcome FROM obx_inbox')"
[[ $(q "SELECT state || ' ' || failures FROM obx_poison WHERE consumer_id = 'unord-proj'") == "PARKED 4" ]] ||
  fail "poison: $(q 'SELECT event_id, state, failures FROM obx_poison')"
[[ $(q "SELECT count(*) FROM obx_inbox_retry") == 0 ]] ||
  fail "copies left: $(q 'SELECT event_id FROM obx_inbox_retry')"
[[ $(q "SELECT count(*) FROM obx_inbox_failure WHERE consumer_id = 'unord-proj' AND event_id IN (SELECT event_id FROM obx_inbox)") == 0 ]] ||
  fail "an applied event kept its failure row"
[[ $(q "SELECT count(*) FROM obx_consume_audit WHERE consumer_id = 'unord-proj' AND outcome = 'RETRY_SCHEDULED'") == 6 ]] ||
  fail "RETRY_SCHEDULED rows: $(q "SELECT outcome, detail FROM obx_consume_audit WHERE outcome = 'RETRY_SCHEDULED'")"
# run 2's summary: the redeliveries absorbed (delayed), the retries from the copies (retried)
python3 - "$T/consume2.json" "$mode" <<'PY' || fail "run 2's summary"
import json, sys
k = json.load(open(sys.argv[1]))
print("run 2:", json.dumps(k, sort_keys=True))
if sys.argv[2] == "amqp":
    assert (k["delayed"], k["retried"]) == (0, 6), "delayed %s, retried %s: want 0, 6" % (k["delayed"], k["retried"])
else:
    # 2 redeliveries: each absorbed (delayed) while its retry waits, or running the due retry
    # in place of the copy (then neither delayed nor retried counts it)
    ran = 2 - k["delayed"]
    assert 0 <= ran <= 2, "delayed %s, want 0..2" % k["delayed"]
    assert k["retried"] == 6 - ran, "retried %s, want %s (3 of o-flaky, 3 of o-dead, %s run by a redelivery)" % (k["retried"], 6 - ran, ran)
assert (k["applied"], k["failed"], k["poisoned"]) == (1, 4, 1), k
PY
echo "ok: unordered consumer on $mode (o-next and o-other applied while o-flaky's retry waited; retries from the kept copies across a SIGKILL, spaced by the back-off; applied once; parked after 4; --until-idle waited for the retries)"

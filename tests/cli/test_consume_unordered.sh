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
# shellcheck source=tests/support/retry_fx.sh
source "$(dirname "$0")/../support/retry_fx.sh" unord
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
PYTHONPATH=$(dirname "$0")/../support python3 - "$T/runs" "$T/effects" "$T/restart" "$base" <<'PY' || fail "schedule"
import sys
from retry_schedule import runs, spaced
t = runs(sys.argv[1])
restart, base = float(open(sys.argv[3]).read()), float(sys.argv[4])
spaced(t, "o-flaky", 4, base, True)
spaced(t, "o-dead", 4, base, True)
for o in ("o-next", "o-other"):
    assert len(t.get(o, [])) == 1, "%s ran %s" % (o, t.get(o))
    # unordered: applied before o-flaky's retry succeeded (and before the restart)
    assert t[o][0] < t["o-flaky"][1] and t[o][0] < restart, "%s waited behind o-flaky" % o
eff = sorted(l.split()[1] for l in open(sys.argv[2]))
assert eff == ["o-flaky", "o-next", "o-other"], "effects %s" % eff
PY
retry_outcome unord-proj 3
[[ $(q "SELECT count(*) FROM obx_inbox_retry") == 0 ]] ||
  fail "copies left: $(q 'SELECT event_id FROM obx_inbox_retry')"
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

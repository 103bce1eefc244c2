#!/usr/bin/env bash
# test_consume_retry.sh — the consumer's retry back-off (issue 51, item 1) on a real pipeline:
# SQLite outbox, `obx relay`, then `obx consume --exec` on the local log broker, RabbitMQ or the
# Kafka mock cluster (bench/chaos_kmock: the third argument, or beside the obx binary).
# Usage: test_consume_retry.sh OBX [log|amqp|kafka [CHAOS_KMOCK]]
#
# Three events of one aggregate (one key: one partition, one queue): o-flaky, whose handler
# fails three times and then succeeds, o-next behind it, and, of another aggregate, o-dead whose
# handler always fails. The consumer runs with --retry-backoff 1s,10s --max-failures 4, and is
# killed (SIGKILL) and restarted right after o-flaky's first failure. Checked from outside (the
# handler writes a timestamp per run):
#   - o-flaky's tries are spaced by the back-off within its jitter: 1 s, 2 s, 4 s, each in
#     [0.8, 1.2] x the step (- 0.1 s, + 0.5 s: polling and process start); the first one across the
#     restart is never early (the schedule is the inbox's failure row, not the process's
#     memory), and may be late by the restart (a Kafka group join takes seconds);
#   - its effect is applied once, o-next after it (per-key order), never before;
#   - o-dead is parked after 4 failures (max-failures still parks), its failure row gone;
#   - the inbox's audit has a RETRY_SCHEDULED row per scheduled retry (3 + 3);
#   - no spinning: the restarted consumer is handed at most 30 deliveries in all;
#   - the restarted consumer runs with --until-idle (1 s; 5 s on Kafka, whose group join takes
#     seconds) and stops by itself, but only once o-flaky is applied and o-dead parked: a paused
#     partition or a failure row with its retry pending keeps it from being idle.
set -euo pipefail
OBX=${1:?usage: test_consume_retry.sh OBX [log|amqp|kafka]}
mode=${2:-log}
# shellcheck source=tests/support/retry_fx.sh
source "$(dirname "$0")/../support/retry_fx.sh" retry
retry_broker retry "${3:-}"
retry_publish o-flaky:o-flaky:1 o-flaky:o-next:2 o-dead:o-dead:1
retry_handler

run=0
group=
consume() { # extra flags
  run=$((run + 1))
  # Kafka: a group of its own per run, read from the start (nothing was committed): the killed
  # member would hold its partitions until the group's session timeout
  [[ $mode == kafka ]] && group="--group retry-g$run"
  "$OBX" consume --consumer-db "sqlite:$T/c.db" --broker "$consume_broker" --topic "$source_" \
    --consumer retry-proj --types order.created.v1 --tenants t1 --max-failures 4 \
    --retry-backoff 1s,10s --exec "$T/handler.sh" $group "$@" >"$T/consume$run.log" 2>&1 &
  echo $! >"$T/consumer.pid"
}
runs_of() { grep -c " $1\$" "$T/runs" 2>/dev/null || true; }

consume
for _ in $(seq 300); do [[ $(runs_of o-flaky) -ge 1 ]] && break; sleep 0.02; done
[[ $(runs_of o-flaky) -ge 1 ]] || fail "o-flaky never ran"
# the restart: the first retry's schedule is in the inbox, not in this process
# (killed once every try so far has its failure recorded; a try of o-dead that starts meanwhile
# and is killed in its handler does not count, and runs again at once: the check leaves it out)
for _ in $(seq 100); do
  [[ $(q "SELECT coalesce(sum(failures), 0) FROM obx_inbox_failure WHERE consumer_id = 'retry-proj'") == \
     "$(wc -l <"$T/runs")" ]] && break
  sleep 0.02
done
date +%s.%N >"$T/restart"
kill -9 "$(cat "$T/consumer.pid")"
wait "$(cat "$T/consumer.pid")" 2>/dev/null || true
idle=1000
[[ $mode == kafka ]] && idle=5000
consume --until-idle $idle
for _ in $(seq 600); do kill -0 "$(cat "$T/consumer.pid")" 2>/dev/null || break; sleep 0.1; done
kill -0 "$(cat "$T/consumer.pid")" 2>/dev/null && fail "the restarted consumer (--until-idle $idle) did not stop in 60 s"
wait "$(cat "$T/consumer.pid")" || fail "the restarted consumer exited $?"
[[ -s $T/effects ]] && grep -q ' o-next$' "$T/effects" && [[ $(runs_of o-dead) -ge 4 ]] ||
  fail "the restarted consumer (--until-idle $idle) stopped with a retry pending"

# ---- the schedule, from the handler's timestamps ----
PYTHONPATH=$(dirname "$0")/../support python3 - "$T/runs" "$T/effects" "$T/restart" <<'PY' || fail "schedule"
import sys
from retry_schedule import runs, spaced
t = runs(sys.argv[1])
restart = float(open(sys.argv[3]).read())
# a try whose handler was running when the consumer was killed did not count (no failure
# recorded): its message runs again at once after the restart; it is left out. Its handler may
# have started just before the restart's timestamp or between it and the kill (a few ms later);
# genuine tries are at least 0.8 s apart (back-off 1 s - 20 %), so a pair under 0.5 s apart
# around the restart is that one try and its rerun
for o, ts in [("o-dead", t.get("o-dead", []))]:
    for i in range(len(ts) - 1):
        if abs(ts[i] - restart) < 0.5 and ts[i + 1] - ts[i] < 0.5:
            print("%s: the try at %.3f was killed in its handler (restart at %.3f)" % (o, ts[i], restart))
            del ts[i]
            break
spaced(t, "o-flaky", 4, 1.0, True)
spaced(t, "o-dead", 4, 1.0, False)
assert len(t.get("o-next", [])) == 1, "o-next ran %s" % t.get("o-next")
assert t["o-next"][0] > t["o-flaky"][-1], "o-next ran before o-flaky was applied (order)"
eff = [l.split()[1] for l in open(sys.argv[2])]
assert sorted(eff) == ["o-flaky", "o-next"], "effects %s" % eff
PY
retry_outcome retry-proj 2
# without spinning: a delivery not due is handed out once, then its partition waits (the second
# run sees each of its 9 tries' deliveries plus a few fetched before a pause; a consumer that
# re-read the partition at every poll would count hundreds of DELAYED deliveries)
delivered=$(sed -n 's/^obx consume: delivered \([0-9]*\),.*/\1/p' "$T/consume$run.log")
[[ -n $delivered && $delivered -le 30 ]] || fail "the second run was handed $delivered deliveries (spinning?)"
echo "ok: retry back-off on $mode, $delivered deliveries handed to the restarted consumer (tries spaced 1 s, 2 s, 4 s across a restart; applied once, in order; parked after 4)"

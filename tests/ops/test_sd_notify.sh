#!/usr/bin/env bash
# test_sd_notify.sh — what `obx relay` and `obx consume` tell systemd (issue 48, item 2), read
# from a unix datagram socket the test binds itself as NOTIFY_SOCKET (no systemd involved):
#   - no READY=1 while the relay waits for its broker (a log broker in a folder that does not
#     exist yet), and STATUS= says why;
#   - READY=1 once it serves, with STATUS=serving...;
#   - WATCHDOG=1 from the main loop at least every WATCHDOG_USEC/2 (set as systemd would);
#   - STOPPING=1 on SIGTERM, with the drain message, and WATCHDOG=1 still while it drains (three
#     ACKs held back by the log broker, relay.drain_ms 1.5 s);
#   - obx consume: READY=1 once consuming, STOPPING=1 on SIGTERM.
# Usage: test_sd_notify.sh OBX
set -euo pipefail
OBX=${1:?usage: test_sd_notify.sh OBX}
source "$(dirname "$0")/../support/prologue.sh" notify
fail() {
  echo "FAIL: $*" >&2
  for f in "$T"/*.log "$T"/*.notify; do [[ -f $f ]] && { echo "---- $f" >&2; tail -20 "$f" >&2; }; done
  exit 1
}
# listen SOCK OUT — every datagram to SOCK appended to OUT as "<ms since start> <payload with
# newlines as |>"
listen() {
  python3 -u - "$1" "$2" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
t0 = time.monotonic()
with open(sys.argv[2], "a") as out:
    while True:
        data = s.recv(4096).decode("utf-8", "replace")
        out.write("%d %s\n" % ((time.monotonic() - t0) * 1000, data.replace("\n", "|")))
        out.flush()
PY
  pids+=($!)
  for _ in $(seq 100); do [[ -S $1 ]] && return 0; sleep 0.05; done
  fail "the notify socket was not bound"
}

db=sqlite:$T/o.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
listen "$T/relay.sock" "$T/relay.notify"
NOTIFY_SOCKET=$T/relay.sock WATCHDOG_USEC=400000 "$OBX" relay --db "$db" \
  --broker "log:$T/later/b.db?delay_ack=1&delay_ack_ms=60000" --set relay.drain_ms=1500 \
  --set connect.retry_initial_ms=100 --set connect.retry_max_ms=400 --set relay.poll_ms=20 \
  >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
sleep 2.5
kill -0 $relay 2>/dev/null || fail "the relay exited while waiting"
! grep -q "READY=1" "$T/relay.notify" || fail "READY=1 while the broker is not there"
grep -q "STATUS=not ready: broker unreachable" "$T/relay.notify" || fail "no STATUS= saying why"
mkdir "$T/later"
for _ in $(seq 100); do grep -q "READY=1" "$T/relay.notify" && break; sleep 0.05; done
grep -q "READY=1|STATUS=serving: " "$T/relay.notify" || fail "no READY=1 with STATUS=serving once it serves"
echo "ok: READY=1 only once the relay serves: $(grep -m1 READY=1 "$T/relay.notify")"
# the watchdog: WATCHDOG_USEC=400 ms, so a ping every 200 ms or less, from start
sleep 1
mapfile -t wd < <(awk '/WATCHDOG=1/ {print $1}' "$T/relay.notify")
((${#wd[@]} >= 10)) || fail "${#wd[@]} WATCHDOG=1 in $(tail -1 "$T/relay.notify" | cut -d' ' -f1) ms (want one per 200 ms)"
max_gap=0
for ((i = 1; i < ${#wd[@]}; i++)); do
  gap=$((wd[i] - wd[i - 1]))
  ((gap > max_gap)) && max_gap=$gap
done
((max_gap < 400)) || fail "a gap of $max_gap ms between WATCHDOG=1 (WatchdogSec 400 ms)"
echo "ok: ${#wd[@]} WATCHDOG=1, at most $max_gap ms apart (WATCHDOG_USEC 400 ms)"
for i in 1 2 3; do
  echo '{}' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate "order/o-$i@1" --tenant t1 >/dev/null
done
for _ in $(seq 100); do grep -q "serving: 0 published, 3 in flight" "$T/relay.notify" && break; sleep 0.1; done
grep -q "serving: 0 published, 3 in flight" "$T/relay.notify" || fail "STATUS= never said 3 in flight"
kill -TERM $relay
wait $relay || fail "the relay exited $? after SIGTERM"
grep -q "STOPPING=1|STATUS=draining 3 outstanding outcomes" "$T/relay.notify" ||
  fail "no STOPPING=1 with the drain message"
grep -q "draining 3 outstanding outcomes (up to 1500 ms); signal again to stop now" "$T/relay.log" ||
  fail "the relay did not say what it drains"
stop_at=$(awk '/STOPPING=1/ {print $1; exit}' "$T/relay.notify")
during=$(awk -v t="$stop_at" '/WATCHDOG=1/ && $1 > t' "$T/relay.notify" | wc -l)
((during >= 4)) || fail "$during WATCHDOG=1 during a 1.5 s drain (want one per 200 ms)"
echo "ok: STOPPING=1 on SIGTERM with the drain message; $during WATCHDOG=1 while it drained"

# ---- obx consume ----
listen "$T/consume.sock" "$T/consume.notify"
NOTIFY_SOCKET=$T/consume.sock "$OBX" consume --consumer-db "sqlite:$T/c.db" --broker "log:$T/later/b.db" \
  --topic orders --exec 'cat >/dev/null' >"$T/consume.log" 2>&1 &
consumer=$!
pids+=($consumer)
for _ in $(seq 100); do grep -q "READY=1" "$T/consume.notify" 2>/dev/null && break; sleep 0.05; done
grep -q "READY=1|STATUS=consuming: " "$T/consume.notify" || fail "obx consume sent no READY=1"
kill -TERM $consumer
wait $consumer || fail "obx consume exited $? after SIGTERM"
grep -q "STOPPING=1" "$T/consume.notify" || fail "obx consume sent no STOPPING=1"
echo "ok: obx consume: READY=1, STOPPING=1"
echo "PASS: test_sd_notify"

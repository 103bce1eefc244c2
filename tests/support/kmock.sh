#!/usr/bin/env bash
# kmock.sh — the Kafka mock cluster (bench/chaos_kmock) for a shell test, written once. Sourced;
#   kmock_start KMOCK   starts one broker with topic orders (2 partitions) in the background,
#                       its commands on fd 7 (a fifo in $T), its PID appended to pids (the
#                       test's exit trap kills it), and sets boot to its bootstrap list; fails
#                       (the test's `fail`) when it does not come up within 5 s
kmock_start() {
  local kmock=$1
  [[ -x $kmock ]] || { echo "FAIL: $kmock not built" >&2; exit 1; }
  mkfifo "$T/kin"
  exec 7<>"$T/kin"
  "$kmock" --brokers 1 --topic orders:2 <&7 >"$T/kout" 2>"$T/kmock.log" &
  pids+=($!)
  disown $! # killed at the end without a word from the shell
  for _ in $(seq 100); do grep -q '^bootstraps ' "$T/kout" 2>/dev/null && break; sleep 0.05; done
  boot=$(sed -n 's/^bootstraps //p' "$T/kout")
  [[ -n $boot ]] || fail "the Kafka mock did not start"
}

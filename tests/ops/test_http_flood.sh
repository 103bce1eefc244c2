#!/usr/bin/env bash
# test_http_flood.sh — the relay's HTTP listener stays up (issue 48, item 5):
#   1. 2,000 idle TCP connections that send nothing (from 127.0.0.2..127.0.0.9, 250 each, under
#      the per-address limit), all held open by the server: /healthz answers 200 within a
#      second, /readyz and /metrics answer (libmicrohttpd with select() failed past ~1,020:
#      "New connection socket descriptor (1024) is not less than FD_SETSIZE");
#   2. 400 from one address: the server keeps at most http.max_connections_per_ip (256) of them,
#      and /healthz from another address still answers within a second;
#   3. (pg) a /metrics request stuck behind the store (the outbox's tables locked by another
#      session) does not hold up /healthz or /readyz;
#   4. a token file that group or others may read: the write actions are refused with the
#      reason (403), /api/status says why, the relay keeps serving.
# RLIMIT_NOFILE is raised for the test and the relay.
# Usage: test_http_flood.sh OBX [sqlite|pg]
set -euo pipefail
OBX=${1:?usage: test_http_flood.sh OBX [sqlite|pg]}
mode=${2:-sqlite}
source "$(dirname "$0")/../support/prologue.sh" flood
ulimit -n 16384 || fail "cannot raise RLIMIT_NOFILE"
# timed URL — prints "<http code> <ms>"
timed() {
  local t0 code
  t0=$(now_ms)
  code=$(curl -s -m 10 -o "$T/body" -w '%{http_code}' "$1") || code=000
  echo "$code $(($(now_ms) - t0))"
}
# idle N FIRST_ADDR ADDRS — N connections that send nothing, spread over ADDRS source
# addresses from 127.0.0.FIRST_ADDR; "ready" in $T/idle.ready once all are connected
idle() {
  python3 -u - "$port" "$1" "$2" "$3" "$T/idle.ready" <<'PY' &
import socket, sys, time
port, n, first, addrs, ready = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
socks = []
for i in range(n):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (first + i % addrs), 0))
    s.connect(("127.0.0.1", port))
    socks.append(s)
open(ready, "w").write("%d\n" % len(socks))
time.sleep(600)
PY
  idle_pid=$!
  pids+=($idle_pid)
  for _ in $(seq 600); do [[ -s $T/idle.ready ]] && return 0; sleep 0.05; done
  fail "the idle connections were not made"
}
# server_conns FROM — connections the server holds from source address FROM (ss, server side)
server_conns() {
  ss -Htn state established "( sport = :$port )" | awk -v a="$1" '$4 ~ "^"a":" {n++} END {print n+0}'
}

use_store "$mode" || fail "no PostgreSQL database"
"$OBX" init --db "$db" >/dev/null
printf 'tok-%s\n' "$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')" >"$T/token"
chmod 644 "$T/token" # readable by group and others: refused
"$OBX" relay --db "$db" --broker "log:$T/b.db" --http 127.0.0.1:0 --set http.token_file="$T/token" \
  >"$T/relay.log" 2>&1 &
relay=$!
pids+=($relay)
port=$(http_addr "$T/relay.log") || fail "no HTTP server"
port=${port##*:}
base=http://127.0.0.1:$port
for _ in $(seq 100); do [[ $(timed "$base/readyz" | cut -d' ' -f1) == 200 ]] && break; sleep 0.1; done

# ---- 4. the loose token file ----
code=$(curl -s -o "$T/body" -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat "$T/token")" \
  "$base/api/requeue" -d '{"event_id":"x"}')
[[ $code == 403 ]] || fail "a write action with a group-readable token file answered $code (want 403)"
grep -q "readable by group or others: write actions are off" "$T/body" || fail "403 without the reason: $(cat "$T/body")"
curl -s "$base/api/status" >"$T/status.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["relay"]["token_configured"] is False, d["relay"]; assert "readable by group or others" in d["write_actions"], d["write_actions"]' "$T/status.json" ||
  fail "/api/status does not say the write actions are off and why"
grep -q "readable by group or others: write actions are off" "$T/relay.log" || fail "no log line about the token file"
echo "ok: a group-readable token file: write actions refused (403) with the reason, /api/status says why"

# ---- 1. 2,000 idle connections ----
idle 2000 2 8
sleep 0.5
held=$(($(server_conns 127.0.0.2) + $(server_conns 127.0.0.3) + $(server_conns 127.0.0.4) + $(server_conns 127.0.0.5) +
  $(server_conns 127.0.0.6) + $(server_conns 127.0.0.7) + $(server_conns 127.0.0.8) + $(server_conns 127.0.0.9)))
((held >= 2000)) || fail "the server holds $held of the 2,000 idle connections"
read -r code ms < <(timed "$base/healthz")
[[ $code == 200 ]] || fail "/healthz answered $code with 2,000 idle connections open"
((ms <= 1000)) || fail "/healthz took $ms ms with 2,000 idle connections open (within 1 s)"
read -r rcode rms < <(timed "$base/readyz")
[[ $rcode == 200 ]] || fail "/readyz answered $rcode with 2,000 idle connections open: $(cat "$T/body")"
read -r mcode mms < <(timed "$base/metrics")
[[ $mcode == 200 ]] || fail "/metrics answered $mcode with 2,000 idle connections open"
kill -0 $relay || fail "the relay died"
echo "ok: 2,000 idle connections held; /healthz 200 in $ms ms, /readyz 200 in $rms ms, /metrics 200 in $mms ms"
kill -9 "$idle_pid"
rm -f "$T/idle.ready"
sleep 0.5

# ---- 2. the per-address limit ----
idle 400 10 1
sleep 0.5
from10=$(server_conns 127.0.0.10)
((from10 <= 256)) || fail "the server holds $from10 connections from one address (limit 256)"
read -r code ms < <(timed "$base/healthz")
[[ $code == 200 ]] && ((ms <= 1000)) || fail "/healthz: $code in $ms ms while one address floods"
echo "ok: 400 from one address: the server holds $from10 (http.max_connections_per_ip 256); /healthz 200 in $ms ms"
kill -9 "$idle_pid"

# ---- 3. /metrics stuck behind the store does not hold up the probes ----
if [[ $mode == pg ]]; then
  psql "$db" -qc "BEGIN; LOCK TABLE obx.obx_event, obx.obx_counter IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT" \
    >/dev/null 2>&1 &
  locker=$!
  pids+=($locker)
  sleep 0.5
  t0=$(now_ms)
  curl -s -m 20 -o /dev/null "$base/metrics" &
  slow=$!
  sleep 0.3
  read -r code ms < <(timed "$base/healthz")
  read -r rcode rms < <(timed "$base/readyz")
  [[ $code == 200 ]] && ((ms <= 1000)) || fail "/healthz: $code in $ms ms behind a /metrics that waits for the store"
  ((rms <= 1000)) || fail "/readyz: $rcode in $rms ms behind a /metrics that waits for the store"
  kill -0 $slow 2>/dev/null || fail "/metrics did not wait for the locked tables: nothing measured"
  wait $slow || true
  slow_ms=$(($(now_ms) - t0))
  wait $locker || true
  echo "ok: /healthz in $ms ms and /readyz in $rms ms while /metrics waited $slow_ms ms for the store"
fi
kill -TERM $relay
wait $relay || fail "relay exit $?"
echo "PASS: test_http_flood"

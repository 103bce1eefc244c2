#!/usr/bin/env bash
# test_http_host.sh — issue 46, item 5: the relay's HTTP server on a loopback address serves
# only Host names that are loopback literals (an IPv4 address in 127.0.0.0/8 written as one,
# [::1], localhost), with an optional port, or a name listed in http.allowed_hosts, each compared
# whole: a DNS name that merely begins with "127." or "localhost" (a rebinding page's) gets 403
# from /api/status and /api/trace. Usage: test_http_host.sh OBX
set -euo pipefail
OBX=${1:?usage: test_http_host.sh OBX}
dir=$(mktemp -d /tmp/obx-httphost-XXXXXX)
relay_pid=
stop_relay() { [[ -z $relay_pid ]] || { kill -9 "$relay_pid"; wait "$relay_pid"; } 2>/dev/null || true; }
cleanup() {
  stop_relay
  rm -rf "$dir"
}
trap cleanup EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
db=sqlite:$dir/outbox.db
"$OBX" init --db "$db" >/dev/null
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
evt=$(printf '{"order":1}' | "$OBX" enqueue --db "$db" --type order.created.v1 --aggregate order/o-1@1 --tenant t1)
start_relay() { # start_relay [ARGS...]: sets $port and $relay_pid (empty port: it did not start)
  stop_relay
  "$OBX" relay --db "$db" --broker "log:$dir/broker.db" --id web --http 127.0.0.1:0 "$@" \
    >"$dir/relay.log" 2>&1 &
  relay_pid=$!
  port=
  for _ in $(seq 100); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$dir/relay.log" | grep -o '[0-9]*$' || true)
    [[ -n $port ]] && break
    kill -0 "$relay_pid" 2>/dev/null || break
    sleep 0.05
  done
  [[ -n $port ]] || sed 's/^/    /' "$dir/relay.log"
}
code() { # code HOST PATH
  curl -s -o /dev/null -w '%{http_code}' -H "Host: $1" "http://127.0.0.1:$port$2"
}
want() { # want CODE PATH HOST...
  local w=$1 path=$2 c
  shift 2
  for h in "$@"; do
    c=$(code "$h" "$path")
    [[ $c == "$w" ]] && ok "$path Host $h: $c" || bad "$path Host $h: $c, want $w"
  done
}
hostile=(127.evil.example 127.0.0.1.evil.example 127.0.0.1.nip.io localhost.evil.example
  "[::1].evil.example" "[::2]" 128.0.0.1 1270.0.0.1 "127.0.0.1:80x" "127.0.0.1:" "127.0.0.1:80:80"
  evil.example obx.internal.evil.example other.internal)

# no names configured: the loopback literals only
start_relay
for path in /api/status "/api/trace?q=$evt"; do
  want 200 "$path" 127.0.0.1 "127.0.0.1:$port" 127.9.8.7 localhost "localhost:$port" LocalHost \
    "[::1]" "[::1]:$port"
  want 403 "$path" "${hostile[@]}" obx.internal
done
# names the operator configured: served too, compared whole
start_relay --set http.allowed_hosts=obx.internal,dash.example.org
if [[ -z $port ]]; then
  bad "http.allowed_hosts: the relay did not start"
else
  for path in /api/status "/api/trace?q=$evt"; do
    want 200 "$path" obx.internal "OBX.Internal:$port" dash.example.org 127.0.0.1
    want 403 "$path" "${hostile[@]}"
  done
fi
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

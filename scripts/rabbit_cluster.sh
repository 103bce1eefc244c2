#!/usr/bin/env bash
# scripts/rabbit_cluster.sh — a RabbitMQ cluster of three nodes on this machine, for the tests
# of a broker that loses a node (tests/e2e/test_rabbit_cluster.sh; docs/amqp.md, "A RabbitMQ
# cluster"). Source it, then:
#   rc_start DIR        three nodes obxc1..3@localhost with their own data, logs and ports from
#                       OBX_RC_PORT (default OBX_SVC_AMQP_PORT + 30): node i (1..3) listens for
#                       AMQP on base + 10 (i - 1) and for Erlang distribution on that + 1; one
#                       epmd for the three on base + 30. Nodes 2 and 3 join node 1. Exports
#                       OBX_RC_DIR, OBX_RC_PORT and OBX_RC_URL (amqp://guest:guest@ the three
#                       hosts, comma-separated, /%2f)
#   rc_kill N           node N's Erlang VM killed (SIGKILL: a crash)
#   rc_start_node N     node N started again on its data, waiting until it runs
#   rc_running N        how many nodes node N sees running
#   rc_stop             every node stopped, epmd too, DIR removed
# Node i's distribution connections to the others leave from 127.0.0.1i (11, 12, 13), so that
# iptables can cut one node from the others alone (the chaos soak's rabbit_partition: rules on
# the other nodes' distribution ports from its address, and on its own from theirs).
# OBX_RC_NET_TICKTIME: Erlang's net_ticktime in seconds (default 60), how long a cut
# connection between nodes goes unnoticed.
# By hand: scripts/rabbit_cluster.sh start DIR | kill DIR N | restart DIR N | running DIR N |
# stop DIR
RC_BIN=/usr/lib/rabbitmq/bin

rc_env() { # N: the environment of node N
  local n=$1 d=$OBX_RC_DIR/n$1
  export HOME=$OBX_RC_DIR/home # one HOME: one Erlang cookie for the three
  export RABBITMQ_NODENAME=obxc$n@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$((OBX_RC_PORT + 10 * (n - 1))) RABBITMQ_DIST_PORT=$((OBX_RC_PORT + 10 * (n - 1) + 1))
  export ERL_EPMD_PORT=$((OBX_RC_PORT + 30))
  export RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_PID_FILE=$d/rabbit.pid
  export RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins RABBITMQ_CONFIG_FILE=$d/rabbitmq
  local tick="-kernel net_ticktime ${OBX_RC_NET_TICKTIME:-60}"
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_connect_options [{ip,{127,0,0,1$n}}] $tick"
  export RABBITMQ_CTL_ERL_ARGS=$tick
}

rc_start_node() {
  local n=$1
  (
    rc_env "$n"
    local d=$OBX_RC_DIR/n$n
    mkdir -p "$HOME" "$d/mnesia" "$d/log"
    echo '[].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
    printf 'loopback_users = none\ncluster_partition_handling = pause_minority\n' >"$d/rabbitmq.conf"
    "$RC_BIN/rabbitmq-server" -detached >"$d/start.log" 2>&1 || { cat "$d/start.log" >&2; exit 1; }
    timeout 120 "$RC_BIN/rabbitmqctl" wait --timeout 100 "$RABBITMQ_PID_FILE" >"$d/wait.log" 2>&1 ||
      { cat "$d/wait.log" >&2; tail -n 30 "$d"/log/*.log >&2; exit 1; }
  )
}

rc_ctl() { # N ARGS...: rabbitmqctl against node N
  local n=$1
  shift
  (rc_env "$n" && timeout 120 "$RC_BIN/rabbitmqctl" "$@")
}

rc_start() {
  export OBX_RC_DIR=${1:?rc_start DIR}
  export OBX_RC_PORT=${OBX_RC_PORT:-$((${OBX_SVC_AMQP_PORT:-26720} + 30))}
  mkdir -p "$OBX_RC_DIR/home"
  local n pids=() bad=0
  # the three boots at once (each waits for its own), then 2 and 3 join 1
  for n in 1 2 3; do
    rc_start_node $n &
    pids+=($!)
  done
  for n in "${pids[@]}"; do wait "$n" || bad=1; done
  ((bad == 0)) || return 1
  for n in 2 3; do
    rc_ctl $n stop_app >/dev/null && rc_ctl $n join_cluster obxc1@localhost >/dev/null &&
      rc_ctl $n start_app >/dev/null || { echo "rabbit_cluster: node $n did not join" >&2; return 1; }
  done
  local running
  running=$(rc_ctl 1 cluster_status --formatter json 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))') || true
  [[ $running == 3 ]] || { echo "rabbit_cluster: $running nodes running, not 3" >&2; return 1; }
  export OBX_RC_URL="amqp://guest:guest@127.0.0.1:$OBX_RC_PORT,127.0.0.1:$((OBX_RC_PORT + 10)),127.0.0.1:$((OBX_RC_PORT + 20))/%2f"
  echo "rabbit_cluster: nodes on 127.0.0.1:$OBX_RC_PORT, $((OBX_RC_PORT + 10)), $((OBX_RC_PORT + 20))"
}

rc_kill() {
  local pid
  pid=$(cat "$OBX_RC_DIR/n$1/rabbit.pid" 2>/dev/null) || return 1
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
}

rc_stop() {
  [[ -n ${OBX_RC_DIR:-} && -d $OBX_RC_DIR ]] || return 0
  local n pid
  for n in 1 2 3; do
    pid=$(cat "$OBX_RC_DIR/n$n/rabbit.pid" 2>/dev/null) && kill -9 "$pid" 2>/dev/null
    # gone before epmd is told to stop: it refuses while a node is still registered
    [[ -n $pid ]] && for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  sleep 0.5
  (rc_env 1 && epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1) || true
  rm -rf "$OBX_RC_DIR"
}

# rc_running N: how many nodes node N sees running (0 when it does not answer).
rc_running() {
  rc_ctl "$1" cluster_status --formatter json 2>/dev/null |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))' 2>/dev/null || echo 0
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  cmd=${1:?usage: rabbit_cluster.sh start|kill|restart|running|stop DIR [N]} OBX_RC_DIR=${2:?DIR}
  export OBX_RC_DIR
  [[ $cmd != start && -f $OBX_RC_DIR/port ]] && OBX_RC_PORT=$(cat "$OBX_RC_DIR/port") && export OBX_RC_PORT
  case $cmd in
  start) rc_start "$OBX_RC_DIR" && echo "$OBX_RC_PORT" >"$OBX_RC_DIR/port" && echo "URL: $OBX_RC_URL" ;;
  kill) rc_kill "${3:?N}" ;;
  restart) rc_start_node "${3:?N}" ;;
  running) rc_running "${3:?N}" ;;
  stop) rc_stop ;;
  *) echo "usage: rabbit_cluster.sh start|kill|restart|running|stop DIR [N]" >&2; exit 2 ;;
  esac
fi

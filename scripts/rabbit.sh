#!/usr/bin/env bash
# scripts/rabbit.sh stop|start|kill|wait — stops or starts the private RabbitMQ node of a test run
# (the one scripts/services.sh started), for tests that take the broker down in the middle of
# their work. Uses the environment services.sh exported: OBX_TEST_SERVICES_DIR and
# OBX_SVC_AMQP_PORT. `stop` is a clean shutdown (rabbitmqctl shutdown); `kill` is SIGKILL of
# the Erlang VM (a crash); `start` starts the node on the same data and waits until it is up;
# `wait` waits again for a node whose start timed out while it was still booting.
set -euo pipefail
: "${OBX_TEST_SERVICES_DIR:?not set: start the services with scripts/services.sh}"
: "${OBX_SVC_AMQP_PORT:?not set: start the services with scripts/services.sh}"
# shellcheck source=scripts/services.sh
source "$(dirname "$0")/services.sh"
case ${1:-} in
stop) amqp_node_stop ;;
kill)
  amqp_env
  pid=$(cat "$RABBITMQ_PID_FILE")
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  ;;
start) amqp_node_start ;;
wait) # a node that is still booting (a start whose wait timed out on a loaded machine)
  amqp_env
  HOME=$HOME_RABBIT timeout 90 /usr/lib/rabbitmq/bin/rabbitmqctl wait --timeout 60 "$RABBITMQ_PID_FILE" >/dev/null
  ;;
*)
  echo "usage: $0 stop|start|kill|wait" >&2
  exit 2
  ;;
esac

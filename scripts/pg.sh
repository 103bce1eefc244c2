#!/usr/bin/env bash
# scripts/pg.sh stop|crash|start — stops or starts the private PostgreSQL cluster of a test run
# (the one scripts/services.sh started), for tests that take the database down in the middle of
# their work (the chaos soak, scripts/chaos.sh). Uses the environment services.sh exported:
# OBX_TEST_SERVICES_DIR and OBX_SVC_PG_PORT. `stop` is `pg_ctl stop -m fast`; `crash` is
# `-m immediate` (every backend killed, no checkpoint: crash recovery at the next start);
# `start` starts the cluster on the same data and waits until it accepts connections.
set -euo pipefail
: "${OBX_TEST_SERVICES_DIR:?not set: start the services with scripts/services.sh}"
: "${OBX_SVC_PG_PORT:?not set: start the services with scripts/services.sh}"
# shellcheck source=scripts/services.sh
source "$(dirname "$0")/services.sh"
case ${1:-} in
stop) pg_node_stop fast ;;
crash) pg_node_stop immediate ;;
start) pg_node_start || { tail -20 "$OBX_TEST_SERVICES_DIR/pg/server.log" >&2; exit 1; } ;;
*)
  echo "usage: $0 stop|crash|start" >&2
  exit 2
  ;;
esac

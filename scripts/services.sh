#!/usr/bin/env bash
# Test services for obx, started privately per test run (sourced by scripts/test.sh; also
# usable by hand: `source scripts/services.sh; services_start`).
#   PostgreSQL 15: initdb in a temp folder owned by the postgres user, own port and socket.
#   RabbitMQ: a detached node with its own HOME, node name, ports and data folders.
# Exports OBX_TEST_PG_URL and OBX_TEST_AMQP_URL (and OBX_TEST_SERVICES_DIR). A suite whose
# server is missing fails loudly in CI instead of skipping.

OBX_SVC_PG_PORT=${OBX_SVC_PG_PORT:-55432}
OBX_SVC_AMQP_PORT=${OBX_SVC_AMQP_PORT:-56720}
PG_BIN=/usr/lib/postgresql/15/bin

pg_start() {
  local dir=$OBX_TEST_SERVICES_DIR/pg
  mkdir -p "$dir/data" "$dir/sock"
  chown -R postgres:postgres "$dir"
  chmod 700 "$dir/data"
  su postgres -s /bin/sh -c "$PG_BIN/initdb -D '$dir/data' -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >'$dir/initdb.log' 2>&1" ||
    { cat "$dir/initdb.log"; return 1; }
  su postgres -s /bin/sh -c "$PG_BIN/pg_ctl -D '$dir/data' -l '$dir/server.log' -o '-p $OBX_SVC_PG_PORT -k $dir/sock -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off -c synchronous_commit=on' -w start >/dev/null" ||
    { cat "$dir/server.log"; return 1; }
  export OBX_TEST_PG_URL="postgres://postgres@127.0.0.1:$OBX_SVC_PG_PORT/postgres"
  echo "services: PostgreSQL on 127.0.0.1:$OBX_SVC_PG_PORT"
}

pg_stop() {
  local dir=$OBX_TEST_SERVICES_DIR/pg
  [[ -d $dir/data ]] && su postgres -s /bin/sh -c "$PG_BIN/pg_ctl -D '$dir/data' -m fast -w stop >/dev/null 2>&1" || true
}

amqp_env() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  export HOME_RABBIT=$dir/home
  export RABBITMQ_NODENAME=obxtest@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$OBX_SVC_AMQP_PORT
  export RABBITMQ_DIST_PORT=$((OBX_SVC_AMQP_PORT + 1))
  export ERL_EPMD_PORT=$((OBX_SVC_AMQP_PORT + 2))
  export RABBITMQ_MNESIA_BASE=$dir/mnesia
  export RABBITMQ_LOG_BASE=$dir/log
  export RABBITMQ_PID_FILE=$dir/rabbit.pid
  export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
  export RABBITMQ_CONFIG_FILE=$dir/rabbitmq
}

amqp_start() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
  amqp_env
  echo '[rabbitmq_stream].' > "$RABBITMQ_ENABLED_PLUGINS_FILE"
  cat > "$dir/rabbitmq.conf" <<CONF
loopback_users = none
stream.listeners.tcp.1 = 127.0.0.1:$((OBX_SVC_AMQP_PORT + 3))
CONF
  HOME=$HOME_RABBIT /usr/lib/rabbitmq/bin/rabbitmq-server -detached >"$dir/start.log" 2>&1 || { cat "$dir/start.log"; return 1; }
  HOME=$HOME_RABBIT timeout 90 /usr/lib/rabbitmq/bin/rabbitmqctl wait --timeout 60 "$RABBITMQ_PID_FILE" >"$dir/wait.log" 2>&1 ||
    { cat "$dir/wait.log"; tail -50 "$dir"/log/*.log; return 1; }
  export OBX_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:$OBX_SVC_AMQP_PORT/%2f"
  export OBX_TEST_RABBIT_DIR=$dir
  echo "services: RabbitMQ on 127.0.0.1:$OBX_SVC_AMQP_PORT"
}

amqp_stop() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  [[ -d $dir ]] || return 0
  amqp_env
  HOME=$HOME_RABBIT timeout 30 /usr/lib/rabbitmq/bin/rabbitmqctl shutdown >/dev/null 2>&1 || true
  epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
}

services_start() {
  OBX_TEST_SERVICES_DIR=$(mktemp -d /tmp/obx-services-XXXXXX)
  chmod 755 "$OBX_TEST_SERVICES_DIR"
  export OBX_TEST_SERVICES_DIR
  pg_start
  amqp_start
}

services_stop() {
  [[ -n ${OBX_TEST_SERVICES_DIR:-} ]] || return 0
  amqp_stop
  pg_stop
  rm -rf "$OBX_TEST_SERVICES_DIR"
}

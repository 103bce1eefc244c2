#!/usr/bin/env bash
# Test services for obx, started privately per test run (sourced by scripts/test.sh; also
# usable by hand: `source scripts/services.sh; services_start`).
#   PostgreSQL 15: initdb in a temp folder owned by the postgres user, own port and socket.
#   RabbitMQ: a detached node with its own HOME, node name, ports and data folders.
# Exports OBX_TEST_PG_URL and OBX_TEST_AMQP_URL (and OBX_TEST_SERVICES_DIR); for PostgreSQL
# also OBX_TEST_PG_CACERT (TLS is offered with a throwaway CA) and OBX_TEST_WRONG_CACERT (an
# unrelated CA); for RabbitMQ also OBX_TEST_AMQPS_URL + OBX_TEST_AMQP_CACERT (TLS listener),
# OBX_TEST_AMQP_WRONG_CACERT and OBX_SVC_AMQP_PORT, which scripts/rabbit.sh uses to stop and
# start the node. A suite whose server is missing fails
# loudly in CI instead of skipping.

# The default ports sit below Linux's ephemeral range (ip_local_port_range, 32768-60999): a
# listening port inside it can be taken, while its server is down or not yet up, by any outgoing
# connection on the machine as its local port. CI lost a RabbitMQ start to that (eaddrinuse on
# 56780, the chaos soak's node, while the ASan tests beside it opened connections by the
# thousand). A start still moves past a block some other program holds (svc_pick_ports).
OBX_SVC_PG_PORT=${OBX_SVC_PG_PORT:-25432}
OBX_SVC_AMQP_PORT=${OBX_SVC_AMQP_PORT:-26720}
# OBX_PG_BIN: another installation of the same server (a developer's private copy with its own
# extension directory); the default is Debian's
PG_BIN=${OBX_PG_BIN:-/usr/lib/postgresql/15/bin}
# OBX_SVC_PG_FSYNC: on for PostgreSQL's durable defaults (bench/run.sh's default: what a payment
# system runs); the test suite keeps off, which changes no outcome and saves minutes of flushes
OBX_SVC_PG_FSYNC=${OBX_SVC_PG_FSYNC:-off}

# True when a TCP socket (any state, IPv4 or IPv6) has local port $1.
svc_port_used() {
  local hex
  printf -v hex ':%04X' "$1"
  awk -v p="$hex" 'substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Makes the variable named $1 the first base (itself, then +100, +200, ...) whose $2 ports from
# the base are all unused, and exports it. The spans cover every port a start derives from the
# base (PostgreSQL: the chaos soak's proxies at +1..3; RabbitMQ: +1..4 and the proxies +10..12).
svc_pick_ports() {
  local var=$1 span=$2 i p q busy
  for ((i = 0; i < 20; i++)); do
    p=${!var} busy=""
    for ((q = p; q < p + span; q++)); do svc_port_used "$q" && { busy=$q; break; }; done
    [[ -z $busy ]] && { export "${var?}"; return 0; }
    echo "services: port $busy (of $var=$p..$((p + span - 1))) is in use; trying $((p + 100))" >&2
    printf -v "$var" '%d' $((p + 100))
  done
  echo "services: no free block of $span ports for $var; set it to a free port" >&2
  return 1
}

pg_start() {
  local dir=$OBX_TEST_SERVICES_DIR/pg
  mkdir -p "$dir/data" "$dir/sock"
  # TLS with a throwaway CA (sslmode=verify-full tests) plus an unrelated CA (must be refused);
  # plain connections keep working: TLS is offered, not required, except where pg_hba says so
  tls_files "$dir/tls" || { echo "services: cannot make PostgreSQL TLS certificates"; return 1; }
  chown -R postgres:postgres "$dir"
  chmod 700 "$dir/data"
  chmod 600 "$dir/tls/server.key"
  svc_pick_ports OBX_SVC_PG_PORT 4 || return 1
  su postgres -s /bin/sh -c "$PG_BIN/initdb -D '$dir/data' -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >'$dir/initdb.log' 2>&1" ||
    { cat "$dir/initdb.log"; return 1; }
  # the role obx_secret_user must give its password (secrets-from-file/env tests); the role
  # obx_tls_user must also come over TLS; everyone else is trusted as before
  { printf 'hostnossl all obx_tls_user 127.0.0.1/32 reject\n'
    printf 'hostssl all obx_tls_user 127.0.0.1/32 scram-sha-256\n'
    printf 'host all obx_secret_user 127.0.0.1/32 scram-sha-256\n'
    cat "$dir/data/pg_hba.conf"; } >"$dir/pg_hba.new" && mv "$dir/pg_hba.new" "$dir/data/pg_hba.conf" &&
    chown postgres:postgres "$dir/data/pg_hba.conf"
  pg_node_start || { cat "$dir/server.log"; return 1; }
  export OBX_TEST_PG_URL="postgres://postgres@127.0.0.1:$OBX_SVC_PG_PORT/postgres"
  export OBX_TEST_PG_CACERT=$dir/tls/ca.pem
  export OBX_TEST_WRONG_CACERT=$dir/tls/other-ca.pem
  echo "services: PostgreSQL on 127.0.0.1:$OBX_SVC_PG_PORT (TLS offered)"
}

# Starts the cluster initialized by pg_start (first start, or a restart on the same data after
# pg_node_stop). pg_node_start/pg_node_stop are what scripts/pg.sh runs for the chaos soak.
pg_node_start() {
  local dir=$OBX_TEST_SERVICES_DIR/pg
  su postgres -s /bin/sh -c "$PG_BIN/pg_ctl -D '$dir/data' -l '$dir/server.log' -o '-p $OBX_SVC_PG_PORT -k $dir/sock -c listen_addresses=127.0.0.1 -c max_connections=200 -c max_prepared_transactions=20 -c fsync=$OBX_SVC_PG_FSYNC -c synchronous_commit=on -c ssl=on -c ssl_cert_file=$dir/tls/server.pem -c ssl_key_file=$dir/tls/server.key' -w start >/dev/null"
}

# Stops the cluster: MODE fast (default: clean) or immediate (a crash: backends killed, no
# checkpoint, crash recovery at the next start).
pg_node_stop() {
  local dir=$OBX_TEST_SERVICES_DIR/pg
  su postgres -s /bin/sh -c "$PG_BIN/pg_ctl -D '$dir/data' -m ${1:-fast} -w stop >/dev/null 2>&1"
}

pg_stop() {
  local dir=$OBX_TEST_SERVICES_DIR/pg
  [[ -d $dir/data ]] && pg_node_stop fast || true
}

amqp_env() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  export OBX_SVC_AMQP_PORT
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

# A private CA with a server certificate for localhost / 127.0.0.1, and a second, unrelated CA
# (other-ca.pem) that a client must refuse the server with. Made once per directory.
tls_files() {
  local t=$1
  [[ -s $t/server.pem && -s $t/other-ca.pem ]] && return 0
  mkdir -p "$t"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=obx-test-ca -keyout "$t/ca.key" -out "$t/ca.pem" >/dev/null 2>&1 &&
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj /CN=obx-test-other-ca -keyout "$t/other-ca.key" -out "$t/other-ca.pem" >/dev/null 2>&1 &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
      -keyout "$t/server.key" -out "$t/server.csr" >/dev/null 2>&1 &&
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$t/ext.cnf" &&
    openssl x509 -req -in "$t/server.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" -CAcreateserial \
      -days 2 -extfile "$t/ext.cnf" -out "$t/server.pem" >/dev/null 2>&1 &&
    chmod 644 "$t"/*.pem "$t"/*.key
}

# The RabbitMQ TLS listener's files (at AMQP port + 4).
amqp_tls_files() { tls_files "$1"; }

# Starts the node (first start or restart with the same data). amqp_node_start/amqp_node_stop
# are what scripts/rabbit.sh runs for tests that stop and start the broker mid-run.
amqp_node_start() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
  amqp_env
  amqp_tls_files "$dir/tls" || { echo "services: cannot make TLS test certificates"; return 1; }
  echo '[rabbitmq_stream].' > "$RABBITMQ_ENABLED_PLUGINS_FILE"
  cat > "$dir/rabbitmq.conf" <<CONF
loopback_users = none
stream.listeners.tcp.1 = 127.0.0.1:$((OBX_SVC_AMQP_PORT + 3))
listeners.ssl.1 = 127.0.0.1:$((OBX_SVC_AMQP_PORT + 4))
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
CONF
  HOME=$HOME_RABBIT /usr/lib/rabbitmq/bin/rabbitmq-server -detached >"$dir/start.log" 2>&1 || { cat "$dir/start.log"; return 1; }
  HOME=$HOME_RABBIT timeout 90 /usr/lib/rabbitmq/bin/rabbitmqctl wait --timeout 60 "$RABBITMQ_PID_FILE" >"$dir/wait.log" 2>&1 ||
    { cat "$dir/wait.log"; tail -n 50 "$dir"/log/*.log; return 1; }
}

amqp_node_stop() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  [[ -d $dir ]] || return 0
  amqp_env
  HOME=$HOME_RABBIT timeout 30 /usr/lib/rabbitmq/bin/rabbitmqctl shutdown >/dev/null 2>&1 || true
  # A shutdown that failed or timed out (a loaded machine; a node restarted by the chaos soak
  # while an earlier start was still booting) must not leave a node behind: it keeps the ports,
  # and the next node on them never starts. Every node of this instance runs with its files
  # under $dir, so its Erlang VM is found by that path.
  local i
  for ((i = 0; i < 50; i++)); do
    pgrep -f "beam.smp.*$dir/" >/dev/null || return 0
    ((i == 20)) && pkill -9 -f "beam.smp.*$dir/"
    sleep 0.2
  done
  echo "services: a RabbitMQ node under $dir would not exit" >&2
}

amqp_start() {
  svc_pick_ports OBX_SVC_AMQP_PORT 13 || return 1
  amqp_node_start || return 1
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  export OBX_TEST_AMQP_URL="amqp://guest:guest@127.0.0.1:$OBX_SVC_AMQP_PORT/%2f"
  export OBX_TEST_AMQPS_URL="amqps://guest:guest@localhost:$((OBX_SVC_AMQP_PORT + 4))/%2f"
  export OBX_TEST_AMQP_CACERT=$dir/tls/ca.pem
  export OBX_TEST_AMQP_WRONG_CACERT=$dir/tls/other-ca.pem
  export OBX_TEST_RABBIT_DIR=$dir
  echo "services: RabbitMQ on 127.0.0.1:$OBX_SVC_AMQP_PORT (TLS on $((OBX_SVC_AMQP_PORT + 4)))"
}

amqp_stop() {
  local dir=$OBX_TEST_SERVICES_DIR/rabbit
  [[ -d $dir ]] || return 0
  amqp_node_stop
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

# bench/instr_lib.sh — sourced by bench/producer_instr.sh and bench/relay_instr.sh: a private
# PostgreSQL 15 set up once and started under callgrind from a copy of it, and the instruction
# count of one backend. Needs root (the server runs as postgres) and valgrind.
#
#   instr_build TARGET NAME      builds TARGET in $build (OBX_BENCH_BUILD, default build-bench),
#                                installs obx_pg there, sets $exe; NAME is the caller's, for errors
#   instr_setup PORT SETUP...    a new cluster on PORT (autovacuum off), database `bench`, then
#                                SETUP... run with its URL, OBX_INSTR_SQL (a SQL file, if set)
#                                run in it, a checkpoint; kept as the pristine copy. Sets $dir,
#                                $url; the cluster is stopped and removed at exit.
#   instr_start                  the server under callgrind from a fresh copy of the pristine one
#   instr_stop                   stops it (the backends' profiles are written as they exit)
#   instr PID                    the instructions of backend PID (waits for its profile)
#   instr_keep PID DEST          copies backend PID's profile to DEST (for bench/instr_diff.py)
command -v valgrind >/dev/null || { echo "bench: needs valgrind" >&2; exit 1; }
build=${OBX_BENCH_BUILD:-build-bench}
bin=${OBX_PG_BIN:-/usr/lib/postgresql/15/bin} # a private copy where OBX_PG_BIN names one (scripts/services.sh)

instr_build() {
  [[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j2 --target "$1" >/dev/null
  # the obx_pg extension where the private server finds it (scripts/pg_ext.sh; else the PL/pgSQL body)
  scripts/pg_ext.sh "$build" >&2 || true
  exe=$(find "$PWD/$build" -name "$1" -type f -perm -u+x | head -1)
  [[ -x $exe ]] || { echo "$2: $1 was not built" >&2; exit 1; }
}

as_pg() { su postgres -s /bin/sh -c "$*"; }
instr_stop() { as_pg "$bin/pg_ctl -D '$dir/data' -m fast -w stop" >/dev/null 2>&1 || true; }

instr_setup() {
  local port=$1
  shift
  dir=$(mktemp -d /tmp/obx-instr.XXXXXX)
  url="postgres://postgres@127.0.0.1:$port/bench"
  trap 'instr_stop; rm -rf "$dir"' EXIT
  chown postgres "$dir"
  as_pg "$bin/initdb -D '$dir/data' -A trust -U postgres -E UTF8 --locale=C.UTF-8" >/dev/null
  cat >>"$dir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
autovacuum = off
shared_buffers = 256MB
max_wal_size = 4GB
CONF
  as_pg "$bin/pg_ctl -D '$dir/data' -l '$dir/setup.log' -w start" >/dev/null
  psql "postgres://postgres@127.0.0.1:$port/postgres" -qc "CREATE DATABASE bench"
  "$@" "$url"
  [[ -z ${OBX_INSTR_SQL:-} ]] || psql "$url" -qX -v ON_ERROR_STOP=1 -f "$OBX_INSTR_SQL"
  psql "$url" -qc CHECKPOINT
  instr_stop
  cp -a "$dir/data" "$dir/pristine"
}

instr_start() {
  rm -rf "$dir/data" "$dir/out"
  cp -a "$dir/pristine" "$dir/data"
  mkdir "$dir/out"
  chown postgres "$dir/out"
  as_pg "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file='$dir/out/cg.%p' $bin/postgres -D '$dir/data'" >"$dir/valgrind.log" 2>&1 &
  for _ in $(seq 180); do psql "$url" -qAtc "SELECT 1" >/dev/null 2>&1 && break; sleep 1; done
}

instr() {
  local f=$dir/out/cg.$1
  for _ in $(seq 120); do
    [[ -s $f ]] && grep -q '^totals:\|^summary:' "$f" && break
    sleep 1
  done
  grep -h '^totals:\|^summary:' "$f" | head -1 | awk '{print $2}'
}

instr_keep() {
  mkdir -p "$(dirname "$2")"
  cp "$dir/out/cg.$1" "$2"
}

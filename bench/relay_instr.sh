#!/usr/bin/env bash
# bench/relay_instr.sh [--json]: the PostgreSQL server's instructions per relayed event on the
# relay's connection: claim, attempts, acceptance (bench_relay_instr: the engine's dispatcher
# with the log broker), for claims of 1, 2 and 8 events (OBX_INSTR_BATCHES; at 1,000 ev/s the
# relay's claims hold 2 at the median: docs/performance.md, section 2). Instructions, not time,
# as bench/producer_instr.sh: a private PostgreSQL 15 (port OBX_INSTR_PG_PORT, default 25498;
# autovacuum off) set up once, then started under `valgrind --tool=callgrind` once per batch
# size from the same copy; per event = (the relay backend's instructions for 80 events - those
# for 20) / 60, which leaves out the connection's start and its first plans. The producer's
# connection is not counted. OBX_INSTR_SQL=FILE runs a SQL file after the set-up (a schema
# experiment); OBX_INSTR_KEEP=DIR keeps the profiles (DIR/b<B>/20.cg, 80.cg) for
# bench/instr_diff.py. Needs root (the server runs as postgres) and valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
json=0
[[ ${1:-} == --json ]] && json=1
[[ $# -le $json ]] || { echo "usage: bench/relay_instr.sh [--json]" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "bench/relay_instr.sh: needs valgrind" >&2; exit 1; }
build=${OBX_BENCH_BUILD:-build-bench}
[[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2 --target bench_relay_instr >/dev/null
scripts/pg_ext.sh "$build" >&2 || true
exe=$(find "$PWD/$build" -name bench_relay_instr -type f -perm -u+x | head -1)
[[ -x $exe ]] || { echo "bench/relay_instr.sh: bench_relay_instr was not built" >&2; exit 1; }

bin=/usr/lib/postgresql/15/bin
port=${OBX_INSTR_PG_PORT:-25498}
dir=$(mktemp -d /tmp/obx-rinstr.XXXXXX)
url="postgres://postgres@127.0.0.1:$port/bench"
as_pg() { su postgres -s /bin/sh -c "$*"; }
stop() { as_pg "$bin/pg_ctl -D '$dir/data' -m fast -w stop" >/dev/null 2>&1 || true; }
trap 'stop; rm -rf "$dir"' EXIT
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
"$exe" "$url" setup
[[ -z ${OBX_INSTR_SQL:-} ]] || psql "$url" -qX -v ON_ERROR_STOP=1 -f "$OBX_INSTR_SQL"
psql "$url" -qc CHECKPOINT
stop
cp -a "$dir/data" "$dir/pristine"

instr() {
  local f=$dir/out/cg.$1
  for _ in $(seq 120); do
    [[ -s $f ]] && grep -q '^totals:\|^summary:' "$f" && break
    sleep 1
  done
  grep -h '^totals:\|^summary:' "$f" | head -1 | awk '{print $2}'
}

batches=${OBX_INSTR_BATCHES:-1 2 8}
declare -A per
for b in $batches; do
  rm -rf "$dir/data" "$dir/out" "$dir/broker"
  cp -a "$dir/pristine" "$dir/data"
  mkdir "$dir/out" "$dir/broker"
  chown postgres "$dir/out"
  as_pg "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file='$dir/out/cg.%p' $bin/postgres -D '$dir/data'" >"$dir/valgrind.log" 2>&1 &
  for _ in $(seq 180); do psql "$url" -qAtc "SELECT 1" >/dev/null 2>&1 && break; sleep 1; done
  p20=$("$exe" "$url" 20 "$b" "$dir/broker" | head -1)
  p80=$("$exe" "$url" 80 "$b" "$dir/broker" | head -1)
  i20=$(instr "$p20")
  i80=$(instr "$p80")
  if [[ -n ${OBX_INSTR_KEEP:-} ]]; then
    mkdir -p "$OBX_INSTR_KEEP/b$b"
    cp "$dir/out/cg.$p20" "$OBX_INSTR_KEEP/b$b/20.cg"
    cp "$dir/out/cg.$p80" "$OBX_INSTR_KEEP/b$b/80.cg"
  fi
  per[$b]=$(((i80 - i20) / 60))
  stop
  wait || true
done
printf '| claims of | server instructions per relayed event |\n|---:|---:|\n'
for b in $batches; do printf '| %s | %d |\n' "$b" "${per[$b]}"; done
if ((json)); then
  printf '{"relay_instructions_per_event": {'
  sep=
  for b in $batches; do printf '%s"%s": %d' "$sep" "$b" "${per[$b]}"; sep=', '; done
  printf '}}\n'
fi

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
source bench/instr_lib.sh
instr_build bench_relay_instr bench/relay_instr.sh
setup_db() { "$exe" "$1" setup; }
instr_setup "${OBX_INSTR_PG_PORT:-25498}" setup_db

batches=${OBX_INSTR_BATCHES:-1 2 8}
declare -A per
for b in $batches; do
  instr_start
  rm -rf "$dir/broker"
  mkdir "$dir/broker"
  p20=$("$exe" "$url" 20 "$b" "$dir/broker" | head -1)
  p80=$("$exe" "$url" 80 "$b" "$dir/broker" | head -1)
  i20=$(instr "$p20")
  i80=$(instr "$p80")
  if [[ -n ${OBX_INSTR_KEEP:-} ]]; then
    instr_keep "$p20" "$OBX_INSTR_KEEP/b$b/20.cg"
    instr_keep "$p80" "$OBX_INSTR_KEEP/b$b/80.cg"
  fi
  per[$b]=$(((i80 - i20) / 60))
  instr_stop
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

#!/usr/bin/env bash
# bench/producer_instr.sh [--json]: the PostgreSQL server's instructions per business
# transaction (bench_producer's: debit a customer, insert the order) alone, with a plain outbox
# row, with obx.enqueue() (its body in the obx_pg extension where scripts/pg_ext.sh installed it,
# and its PL/pgSQL body: plsql) and with obx_enqueue() on the wrapped connection (docs/performance.md,
# section 3). Instructions, not time: they do not depend on the load on the machine, and repeat
# to 0.2 %. A private PostgreSQL 15 (port OBX_INSTR_PG_PORT, default 25499; autovacuum off) is
# set up as bench_producer sets up its database, then started under
# `valgrind --tool=callgrind` once per variant from the same copy; per transaction =
# (the backend's instructions for 80 transactions - those for 20) / 60, which leaves out the
# connection's start and its first plans. Needs root (the server runs as postgres) and valgrind;
# takes about two minutes. OBX_INSTR_VARIANTS (e.g. "plain c") runs only those variants, for a
# quick A/B of one path; the table and JSON then need all five (default). OBX_INSTR_KEEP=DIR
# keeps each variant's two backend profiles (DIR/<variant>/20.cg and 80.cg) for
# bench/instr_diff.py, which says where one variant's instructions go beside another's.
# OBX_INSTR_SQL=FILE runs that SQL file in the database after the set-up (an experiment on the
# schema, e.g. an index or constraint dropped, measured without a new schema version).
set -euo pipefail
cd "$(dirname "$0")/.."
json=0
[[ ${1:-} == --json ]] && json=1
[[ $# -le $json ]] || { echo "usage: bench/producer_instr.sh [--json]" >&2; exit 2; }
source bench/instr_lib.sh
instr_build bench_producer_instr bench/producer_instr.sh
setup_db() { "$exe" "$1" setup; }
instr_setup "${OBX_INSTR_PG_PORT:-25499}" setup_db

variants=${OBX_INSTR_VARIANTS:-business plain sql plsql c}
declare -A per
for v in $variants; do
  instr_start
  p20=$("$exe" "$url" "$v" 20)
  p80=$("$exe" "$url" "$v" 80)
  i20=$(instr "$p20")
  i80=$(instr "$p80")
  if [[ -n ${OBX_INSTR_KEEP:-} ]]; then
    instr_keep "$p20" "$OBX_INSTR_KEEP/$v/20.cg"
    instr_keep "$p80" "$OBX_INSTR_KEEP/$v/80.cg"
  fi
  per[$v]=$(((i80 - i20) / 60))
  instr_stop
  wait || true
done
if [[ $variants != "business plain sql plsql c" ]]; then
  for v in $variants; do printf '%s %d\n' "$v" "${per[$v]}"; done
  exit 0
fi
plain=${per[plain]}
printf '| server instructions per business transaction | count | vs + plain row |\n|---|---:|---:|\n'
for v in business plain sql plsql c; do
  case $v in business) n="business transaction alone" ;; plain) n="+ plain outbox row" ;;
    sql) n="+ obx.enqueue()" ;; plsql) n="+ obx.enqueue(), PL/pgSQL body (no obx_pg)" ;;
    c) n="+ obx_enqueue() (C)" ;; esac
  printf '| %s | %d | %s |\n' "$n" "${per[$v]}" "$(awk -v a="${per[$v]}" -v b="$plain" 'BEGIN { printf "%.2f", a / b }')"
done
if ((json)); then
  awk -v b="${per[business]}" -v p="$plain" -v s="${per[sql]}" -v q="${per[plsql]}" -v c="${per[c]}" 'BEGIN {
    printf "{\"instructions_per_txn\": {\"business\": %d, \"plain\": %d, \"obx_sql\": %d, \"obx_plsql\": %d, ", b, p, s, q
    printf "\"obx_c\": %d}, \"obx_sql_instr_ratio\": %.3f, \"obx_c_instr_ratio\": %.3f}\n", c, p / s, p / c }'
fi

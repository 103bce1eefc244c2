#!/usr/bin/env bash
# bench/run.sh SCENARIO [ARGS...] — one performance scenario of issue 10 (docs/performance.md):
# builds the bench programs, starts a private PostgreSQL (track_commit_timestamp on) and RabbitMQ
# node unless OBX_TEST_PG_URL is already set (then it uses those servers), runs the scenario's
# program, which prints one table with obx beside the limit measured in the same run, and stops
# what it started.
#
#   throughput  relay throughput from a backlog: PG+Kafka, PG+RabbitMQ, SQLite+log (bench_throughput)
#   latency     commit -> PUBLISHED p50/p99/max at steady rates, PG+Kafka    (bench_latency)
#   producer    obx.enqueue vs a plain outbox row in a pgbench business txn  (bench_producer)
#   backlog     throughput with 10k vs 5M PUBLISHED/RETAINED rows, and during a purge (bench_backlog)
#   delayed     due events' rate and claim time with vs without 1M delayed events (bench_delayed)
#   scale       1/2/4 relays on one PostgreSQL, and obx sim traces/s         (bench_scale)
#   resources   relay RSS with a 1M backlog, CPU per 10,000 events           (bench_resources)
#   amqp        obx's RabbitMQ backend vs a plain rabbitmq-c confirm loop    (bench_amqp)
#
# PostgreSQL runs with its durable defaults (fsync=on, synchronous_commit=on,
# full_page_writes=on), as production does; `--fsync-off` (first argument after SCENARIO) starts
# it with fsync=off, as the test suite's. Every program prints the settings it measured on.
# ARGS go to the program (each has --help-like usage on a bad flag; sizes are flags, the issue's
# sizes are the defaults). Ports: OBX_SVC_PG_PORT, OBX_SVC_AMQP_PORT (scripts/services.sh).
# Build folder: OBX_BENCH_BUILD (default build-bench, RelWithDebInfo).
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=${1:-}
[[ -n $scenario ]] || { sed -n '2,19p' "$0"; exit 2; }
shift
export OBX_SVC_PG_FSYNC=on
if [[ ${1:-} == --fsync-off ]]; then OBX_SVC_PG_FSYNC=off; shift; fi
case $scenario in
  throughput|latency|producer|backlog|delayed|scale|resources) prog=bench_$scenario ;;
  amqp) prog=bench_amqp ;;
  *) echo "bench/run.sh: unknown scenario '$scenario'" >&2; exit 2 ;;
esac
build=${OBX_BENCH_BUILD:-build-bench}
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j2 --target obx "$prog" >/dev/null
# the obx_pg extension (obx.enqueue() in C) where the server finds it; without it (not root, no
# server headers) obx.enqueue() runs its PL/pgSQL body, and bench_producer says which it measured
scripts/pg_ext.sh "$build" >&2 || true
exe=$(find "$build" -name "$prog" -type f -perm -u+x | head -1)
[[ -x $exe ]] || { echo "bench/run.sh: $prog was not built" >&2; exit 1; }

started=0
if [[ -z ${OBX_TEST_PG_URL:-} && $scenario != amqp || -z ${OBX_TEST_AMQP_URL:-} && $scenario =~ ^(throughput|amqp)$ ]]; then
  # shellcheck source=scripts/services.sh
  source scripts/services.sh
  services_start >&2
  started=1
  trap services_stop EXIT
fi
if [[ $scenario == latency ]]; then
  # exact commit times for the latency figure (bench_latency.c)
  if [[ $(psql "$OBX_TEST_PG_URL" -Atc 'SHOW track_commit_timestamp') != on ]]; then
    ((started)) || { echo "bench/run.sh: the server has track_commit_timestamp off; run without OBX_TEST_PG_URL" >&2; exit 1; }
    psql "$OBX_TEST_PG_URL" -qc 'ALTER SYSTEM SET track_commit_timestamp = on'
    su postgres -s /bin/sh -c "/usr/lib/postgresql/15/bin/pg_ctl -D '$OBX_TEST_SERVICES_DIR/pg/data' -l '$OBX_TEST_SERVICES_DIR/pg/server.log' -m fast -w restart >/dev/null"
  fi
fi
if [[ $scenario != amqp ]]; then
  # the durability settings this run measured on, above its table
  echo "PostgreSQL: $(psql "$OBX_TEST_PG_URL" -Atc "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')")"
fi
if [[ $scenario == amqp ]]; then
  "$exe" "$OBX_TEST_AMQP_URL" "$@"
else
  "$exe" "$@"
fi

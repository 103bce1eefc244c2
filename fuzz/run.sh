#!/usr/bin/env bash
# fuzz/run.sh — replays each fuzz target's seed corpus, then fuzzes it for a while.
#
#   fuzz/run.sh [--build DIR] [--time SECONDS] [TARGET...]
#
# DIR is a build configured with CC=clang -DOBX_FUZZ=ON (default build-fuzz; built here when
# missing). SECONDS is per target (default 300; 0 = replay only). TARGETs default to all:
# headers url config enqueue inbox. New inputs the fuzzer finds go to fuzz/out/TARGET/corpus
# (not committed: copy the interesting ones to fuzz/corpus/TARGET/ by hand); a crash, leak or
# violated property leaves its input in fuzz/out/TARGET/ and makes the script exit 1.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz
secs=300
targets=()
while (($#)); do
  case $1 in
  --build) build=$2; shift 2 ;;
  --time) secs=$2; shift 2 ;;
  -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
  *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(headers url config enqueue inbox)
if [[ ! -x $build/fuzz/fuzz_headers ]]; then
  CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOBX_FUZZ=ON \
    -DBUILD_TESTING=OFF -DOBX_WITH_KAFKA=OFF -DOBX_WITH_AMQP=OFF >/dev/null
fi
cmake --build "$build" -j"$(nproc)" >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  bin=$build/fuzz/fuzz_$t
  seeds=fuzz/corpus/$t
  out=fuzz/out/$t
  mkdir -p "$out/corpus"
  log=$out/last.log
  # 1. every seed once, under ASan+UBSan (the regression part)
  if ! "$bin" -runs=0 "$seeds" >"$log" 2>&1; then
    echo "fuzz $t: seed replay FAILED (see $log)"; tail -30 "$log"; status=1; continue
  fi
  nseeds=$(find "$seeds" -type f | wc -l)
  if ((secs == 0)); then echo "fuzz $t: $nseeds seeds replayed"; continue; fi
  # 2. fuzzing, bounded in time; the working corpus first so that new inputs land there
  if ! "$bin" -max_total_time="$secs" -dict="fuzz/dict/$t.dict" -print_final_stats=1 \
    -artifact_prefix="$out/" "$out/corpus" "$seeds" >"$log" 2>&1; then
    echo "fuzz $t: FAILED (input kept in $out/)"; grep -a -E "violated|ERROR|SUMMARY" "$log" | head -5
    status=1; continue
  fi
  execs=$(grep -a -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rate=$(grep -a -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  corpus=$(find "$out/corpus" -type f | wc -l)
  echo "fuzz $t: $nseeds seeds replayed; ${secs}s: $execs execs ($rate/s), working corpus $corpus inputs"
done
exit $status

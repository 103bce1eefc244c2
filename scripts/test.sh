#!/usr/bin/env bash
# README command 2: install what is missing, build twice (release and ASan+UBSan) plus the fuzz
# targets (clang, libFuzzer with ASan+UBSan), replay every fuzz seed and fuzz each target for a
# short bounded time, start the test services (private PostgreSQL cluster, RabbitMQ node; Kafka
# is librdkafka's in-process mock cluster), run every test in both builds (among them the demo
# with only the build packages, and each OBX_WITH_*=OFF variant), run the style checks, then
# build, install, run and purge the Debian package, stop the services. Exit status is non-zero
# when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/deps.sh test
# examples/node's dependencies (pg, amqplib) from the npm registry, as package-lock.json pins them
(cd examples/node && npm ci --no-audit --no-fund --loglevel=error)
scripts/build.sh build
# the obx_pg extension (obx.enqueue() in C) into the PostgreSQL server's own directories, where
# the test clusters' `obx init` finds it (test_store_pg fails without it)
scripts/pg_ext.sh build
scripts/build.sh build-asan -DOBX_SANITIZE=ON -DOBX_MUTATIONS=ON
CC=clang scripts/build.sh build-fuzz -DOBX_FUZZ=ON -DBUILD_TESTING=OFF -DOBX_WITH_KAFKA=OFF \
  -DOBX_WITH_AMQP=OFF
status=0
echo "== fuzz: every seed replayed, then 12 s per target (fuzz/run.sh for longer runs)"
fuzz/run.sh --build build-fuzz --time "${OBX_FUZZ_SECONDS:-12}" || status=1

# Builds of their own, one at a time (each compiles with -j2) and before the timing-sensitive
# suites rather than beside them: the demo with only the build packages (label deps) and each
# OBX_WITH_*=OFF variant, library and CLI only (label variant).
echo "== builds: scripts/demo.sh with only the build packages, the OBX_WITH_*=OFF variants"
(cd build && ctest --output-on-failure -L 'deps|variant' --timeout 900) || status=1

# shellcheck source=scripts/services.sh
source scripts/services.sh
# the trap first: a service that fails to start must not leave the others running
trap services_stop EXIT
services_start

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== tests (release build)"
(cd build && ctest --output-on-failure -j2 --timeout 900 -LE 'chaos|deb|deps|variant') || status=1
# The chaos soaks (label chaos, release build) spend most of their time waiting on the fault
# schedule, on servers of their own (ports OBX_SVC_*_PORT + 60) and on drain deadlines: they run
# beside the ASan suite instead of holding a ctest slot mostly idle (that kept CI near 45
# minutes). Their output is printed after the ASan suite's.
echo "== the chaos soaks (release build), beside the ASan + UBSan tests; their output follows"
(cd build && ctest --output-on-failure -L chaos --timeout 1200 >chaos-ctest.log 2>&1) &
chaos_pid=$!
echo "== tests (ASan + UBSan build)"
(cd build-asan && ctest --output-on-failure -j2 --timeout 1800 -LE nosan) || status=1
echo "== the chaos soaks: waiting for them"
wait "$chaos_pid" || status=1
cat build/chaos-ctest.log
echo "== style: clang-format and cppcheck"
cmake --build build --target check || status=1
# last: it installs the package (and its user) on this machine, and purges it again
echo "== the Debian package: build, dpkg -i, the relay as its unit runs it, dpkg --purge"
(cd build && ctest --output-on-failure -L deb --timeout 900) || status=1
if ((status)); then echo "TESTS FAILED"; else echo "ALL TESTS PASSED"; fi
exit $status

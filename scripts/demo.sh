#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job on the embedded
# default (SQLite outbox + local log broker, no servers): `obx demo`.
# Arguments are passed to `obx demo` (e.g. --events 2000 --json).
# Needs only the packages of `scripts/deps.sh build`: the build leaves out the tests and the
# benchmarks (BUILD_TESTING=OFF), whose packages are test-only (tests/pkg/test_demo_deps.sh
# runs this script with every other package's files hidden). OBX_BUILD_DIR: the build folder
# (default build/).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${OBX_BUILD_DIR:-build}
scripts/deps.sh build
scripts/build.sh "$dir" -DBUILD_TESTING=OFF
exec "$dir/obx" demo "$@"

#!/usr/bin/env bash
# Configures and builds obx into DIR (default build/). Extra arguments go to cmake; the tests are
# built unless they say -DBUILD_TESTING=OFF (later -D options win).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"

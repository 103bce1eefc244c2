#!/usr/bin/env bash
# bench/sim_gate.sh — the full release gate: one million fault-injected traces (docs/design.md,
# "The release gate"), printed as the gate table with traces/s.
# Usage: bench/sim_gate.sh [TRACES] [JOBS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/obx ]] || scripts/build.sh build
exec build/obx sim --traces "${1:-1000000}" --jobs "${2:-2}" --seed "${3:-20261129}"

#!/usr/bin/env bash
# scripts/pg_ext.sh BUILD_DIR — builds the obx_pg extension (obx.enqueue() in C,
# src/store/postgres/ext; docs/postgres.md, "The obx_pg extension") in an obx build folder and
# installs it, with its test build obx_pg_counters (test_pg_hardening), into the PostgreSQL
# server's own directories (pg_config --pkglibdir and --sharedir/extension; root), where
# `obx init` finds it and creates it. Exits non-zero, saying
# why, when the folder has no obx_pg target (the server's headers, postgresql-server-dev-15, were
# missing when it was configured) or this is not root.
set -euo pipefail
build=${1:?usage: scripts/pg_ext.sh BUILD_DIR}
build=$(realpath -m "$build")
cd "$(dirname "$0")/.."
# configured again: the folder may predate the headers
cmake -S . -B "$build" >/dev/null
targets=$(cmake --build "$build" --target help)
if ! grep -qw obx_pg <<<"$targets"; then
  echo "pg_ext: $build has no obx_pg extension (PostgreSQL server headers: postgresql-server-dev-15)" >&2
  exit 1
fi
cmake --build "$build" -j2 --target obx_pg obx_pg_counters >/dev/null
if [[ $(id -u) -ne 0 ]]; then
  echo "pg_ext: installing into the server's directories needs root" >&2
  exit 1
fi
cmake --install "$build" --component obx_pg >/dev/null
echo "pg_ext: obx_pg installed from $build"

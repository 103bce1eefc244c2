#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job on the embedded
# default (SQLite outbox + local log broker, no servers): `obx demo`.
# Arguments are passed to `obx demo` (e.g. --events 2000 --json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
scripts/build.sh build
exec build/obx demo "$@"

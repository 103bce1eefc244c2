#!/usr/bin/env bash
# bench/upgrade.sh [ARGS...]: bench/run.sh upgrade (docs/performance.md)
exec "$(dirname "$0")/run.sh" upgrade "$@"

#!/usr/bin/env bash
# bench/scale.sh [ARGS...]: bench/run.sh scale (docs/performance.md)
exec "$(dirname "$0")/run.sh" scale "$@"

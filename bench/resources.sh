#!/usr/bin/env bash
# bench/resources.sh [ARGS...]: bench/run.sh resources (docs/performance.md)
exec "$(dirname "$0")/run.sh" resources "$@"

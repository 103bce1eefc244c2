#!/usr/bin/env bash
# bench/throughput.sh [ARGS...]: bench/run.sh throughput (docs/performance.md)
exec "$(dirname "$0")/run.sh" throughput "$@"

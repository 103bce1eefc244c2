#!/usr/bin/env bash
# bench/latency.sh [ARGS...]: bench/run.sh latency (docs/performance.md)
exec "$(dirname "$0")/run.sh" latency "$@"

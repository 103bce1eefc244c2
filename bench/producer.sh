#!/usr/bin/env bash
# bench/producer.sh [ARGS...]: bench/run.sh producer (docs/performance.md)
exec "$(dirname "$0")/run.sh" producer "$@"

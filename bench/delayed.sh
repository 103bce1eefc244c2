#!/usr/bin/env bash
# bench/delayed.sh [ARGS...]: bench/run.sh delayed (docs/performance.md)
exec "$(dirname "$0")/run.sh" delayed "$@"

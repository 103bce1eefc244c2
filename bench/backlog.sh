#!/usr/bin/env bash
# bench/backlog.sh [ARGS...]: bench/run.sh backlog (docs/performance.md)
exec "$(dirname "$0")/run.sh" backlog "$@"

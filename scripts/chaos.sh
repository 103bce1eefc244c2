#!/usr/bin/env bash
# scripts/chaos.sh --minutes M [--json] [--broker amqp|kafka] [--seed S] [...] — the chaos soak
# (docs/reliability.md). Its files live under bench/chaos/: this runs bench/chaos/soak.sh, whose
# header lists the options (scripts/chaos.sh --help).
exec "$(dirname "$0")/../bench/chaos/soak.sh" "$@"

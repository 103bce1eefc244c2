#!/usr/bin/env bash
# bench/chaos/soak.sh (run as scripts/chaos.sh) --minutes M [--json] [--broker amqp|kafka]
# [--seed S] [...] — the chaos soak (docs/reliability.md): a private PostgreSQL cluster and
# RabbitMQ node (scripts/services.sh) on ports of their own, the Kafka mock cluster
# (bench/chaos/chaos_kmock.c) for --broker kafka, producers in C and SQL, three `obx relay`, two
# `obx consume`, faults on a seeded schedule, and a verifier that reads no obx table through obx
# (bench/chaos/chaos.py, chaos_verify.py). Exit 1 when the verifier finds a lost, misrouted,
# altered, phantom or twice-applied event, or an UNKNOWN left unresolved; 2 on a usage error.
#
# Other options go to bench/chaos/chaos.py: --self-test (plant one fault of each kind after a
# quiet run: the verifier must find each), --schedule-only, --faults K1,K2, --no-faults,
# --drain S, --relays N, --rate R, --relay-set KEY=VALUE, --dir DIR (kept), --keep.
#
# Environment: OBX_BUILD (default build/, built if missing), OBX_CHAOS_PG_PORT and
# OBX_CHAOS_AMQP_PORT (default OBX_SVC_PG_PORT/OBX_SVC_AMQP_PORT + 60, i.e. 25492 and 26780: the
# soak kills its servers, so they are never the ones scripts/test.sh started for other tests).
# Relays reach PostgreSQL through proxies on PG port + 1..3 and RabbitMQ on AMQP port + 10..12.
# iptables rules are tagged with the soak's ports and removed on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
keep=0 dir="" args=() schedule_only=0 broker=amqp seeded=0
for ((i = 1; i <= $#; i++)); do
  a=${!i}
  case $a in
  --keep) keep=1 ;;
  --dir) i=$((i + 1)); dir=${!i} ;;
  --schedule-only) schedule_only=1; args+=("$a") ;;
  --broker) i=$((i + 1)); broker=${!i}; args+=(--broker "$broker") ;;
  --broker=*) broker=${a#--broker=}; args+=("$a") ;;
  --seed | --seed=*) seeded=1; args+=("$a") ;;
  -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) args+=("$a") ;;
  esac
done
build=${OBX_BUILD:-$root/build}
((seeded)) || args+=(--seed $((RANDOM * 32768 + RANDOM))) # one seed for the check and the run
# the arguments are checked (and --schedule-only answered) before any server starts
d=$(mktemp -d /tmp/obx-chaos-args-XXXXXX)
rc=0
/usr/bin/python3 bench/chaos/chaos.py --dir "$d" --schedule-only "${args[@]}" >"$d/schedule" || rc=$?
((schedule_only && !rc)) && cat "$d/schedule"
rm -rf "$d"
((schedule_only || rc)) && exit $rc
scripts/deps.sh test >&2
[[ -x $build/obx && -x $build/bench/chaos_producer ]] || scripts/build.sh "$build" >&2

export OBX_SVC_PG_PORT=${OBX_CHAOS_PG_PORT:-$((${OBX_SVC_PG_PORT:-25432} + 60))}
export OBX_SVC_AMQP_PORT=${OBX_CHAOS_AMQP_PORT:-$((${OBX_SVC_AMQP_PORT:-26720} + 60))}
export CHAOS_IPT_TAG=obx-chaos-$OBX_SVC_PG_PORT
export OBX_BIN=$build/obx CHAOS_BUILD=$build
[[ -n $dir ]] && { mkdir -p "$dir"; keep=1; } || dir=$(mktemp -d /tmp/obx-chaos-XXXXXX)
chmod 755 "$dir"

# Removes this soak's iptables rules (and only those: they carry its tag).
ipt_flush() {
  command -v iptables >/dev/null || return 0
  local rules
  rules=$(iptables -w 5 -S INPUT 2>/dev/null | grep -- "--comment $CHAOS_IPT_TAG\( \|$\)") || return 0
  while read -r _ rule; do
    # shellcheck disable=SC2086 # the rule's words, as iptables -S printed them
    iptables -w 5 -D $rule || true
  done <<<"$rules"
}
# shellcheck source=scripts/services.sh
source scripts/services.sh
status=1
cleanup() {
  ipt_flush
  services_stop >/dev/null 2>&1 || true
  if ((status == 0 && !keep)); then rm -rf "$dir"; else echo "chaos: work folder kept: $dir" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ipt_flush
# the services of scripts/services.sh, RabbitMQ only when it is the broker under test
OBX_TEST_SERVICES_DIR=$(mktemp -d /tmp/obx-services-XXXXXX)
chmod 755 "$OBX_TEST_SERVICES_DIR"
export OBX_TEST_SERVICES_DIR
pg_start >&2
[[ $broker != amqp ]] || amqp_start >&2
set +e
/usr/bin/python3 bench/chaos/chaos.py --dir "$dir" "${args[@]}"
status=$?
set -e
exit $status

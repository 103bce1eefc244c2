#!/usr/bin/env bash
# bench/chaos/soak.sh (run as scripts/chaos.sh) --minutes M [--json] [--broker amqp|kafka]
# [--seed S] [...] — the chaos soak (docs/reliability.md): a private PostgreSQL primary with a
# synchronous streaming standby (scripts/pg_failover.sh) and, for --broker amqp, a RabbitMQ
# cluster of three nodes (scripts/rabbit_cluster.sh) on ports of their own, the Kafka mock
# cluster (bench/chaos/chaos_kmock.c) for --broker kafka, producers in C and SQL, three `obx
# relay`, two `obx consume`, faults on a seeded schedule, and a verifier that reads no obx table
# through obx (bench/chaos/chaos.py, chaos_verify.py). Exit 1 when the verifier finds a lost,
# misrouted, altered, phantom or twice-applied event, or an UNKNOWN left unresolved, or when the
# supervisor had to restart a relay or a consumer; 2 on a usage error.
#
# Other options go to bench/chaos/chaos.py: --self-test (plant one fault of each kind after a
# quiet run: the verifier must find each), --schedule-only, --faults K1,K2, --no-faults,
# --drain S, --relays N, --rate R, --relay-set KEY=VALUE, --dir DIR (kept), --keep.
#
# Environment: OBX_BUILD (default build/, built if missing), OBX_CHAOS_PG_PORT and
# OBX_CHAOS_AMQP_PORT (default OBX_SVC_PG_PORT/OBX_SVC_AMQP_PORT + 60, i.e. 25492 and 26780: the
# soak kills its servers, so they are never the ones scripts/test.sh started for other tests).
# PostgreSQL's two nodes listen on PG port + 20 and + 21 (or the next free ports); relay i
# (0..4) reaches them through proxies on PG port + 1 + i and + 6 + i. RabbitMQ's nodes listen
# on AMQP port + 50, + 60, + 70 (Erlang distribution + 1 each, epmd + 80); relay i reaches node
# k (0..2) through a proxy on AMQP port + 1 + 5k + i. iptables rules are tagged with the soak's
# ports and removed on exit, also on failure. A failed soak keeps its folder, with the servers'
# logs in servers/.
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
# shellcheck source=scripts/pg_failover.sh
source scripts/pg_failover.sh
# shellcheck source=scripts/rabbit_cluster.sh
source scripts/rabbit_cluster.sh
status=1
servers=$(mktemp -d /tmp/obx-chaos-servers-XXXXXX)
chmod 755 "$servers"
cleanup() {
  ipt_flush
  if ((status != 0)); then # the servers' logs stay with the work folder
    mkdir -p "$dir/servers"
    cp "$servers"/pg/*.log "$dir/servers/" 2>/dev/null || true
    for n in 1 2 3; do
      [[ -d $servers/rabbit/n$n/log ]] && cp -r "$servers/rabbit/n$n/log" "$dir/servers/rabbit-n$n"
    done
  fi
  pgfo_stop >/dev/null 2>&1 || true
  rc_stop >/dev/null 2>&1 || true
  rm -rf "$servers"
  if ((status == 0 && !keep)); then rm -rf "$dir"; else echo "chaos: work folder kept: $dir" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ipt_flush
# PostgreSQL as a primary and a synchronous standby (the relays' multi-host URLs follow a
# failover), RabbitMQ as a cluster of three with quorum queues when it is the broker under test
export OBX_FO_PORT=$((OBX_SVC_PG_PORT + 20)) OBX_FO_PG_OPTS="-c max_connections=200"
pgfo_start "$servers/pg" >&2
if [[ $broker == amqp ]]; then
  # a cut between nodes noticed in 10 s (Erlang's default 60): a partition fault of 20 s and
  # more is then a partition RabbitMQ acts on (pause_minority), not a stall
  export OBX_RC_PORT=$((OBX_SVC_AMQP_PORT + 50)) OBX_RC_NET_TICKTIME=10
  rc_start "$servers/rabbit" >&2
fi
set +e
/usr/bin/python3 bench/chaos/chaos.py --dir "$dir" "${args[@]}"
status=$?
set -e
exit $status

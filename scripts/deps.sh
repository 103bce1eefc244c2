#!/usr/bin/env bash
# Installs the Debian packages obx needs that are missing (root, Debian 12).
#   scripts/deps.sh build   — compilers and libraries (the demo)
#   scripts/deps.sh test    — plus test tools and servers (PostgreSQL, RabbitMQ, kcat, spin, the
#                             chaos soak's psycopg2, pika and iptables, ...)
#   scripts/deps.sh list build|test — print one set's own packages, one per line, install nothing
#                             (tests/pkg/test_demo_deps.sh hides everything outside the build set)
# Service auto-start is suppressed during the install (policy-rc.d): obx's tests start private
# server instances on their own ports and must not find system ones holding them.
set -euo pipefail
set_name=${1:-build}

build_pkgs=(build-essential cmake pkg-config libsqlite3-dev libssl-dev libjansson-dev libyaml-dev
            libmicrohttpd-dev libpq-dev librdkafka-dev librabbitmq-dev libsystemd-dev sqlite3
            libcurl4-openssl-dev)
test_pkgs=(libcmocka-dev faketime postgresql-15 postgresql-client-15 postgresql-server-dev-15 rabbitmq-server kcat amqp-tools spin
           clang libclang-rt-14-dev clang-format cppcheck socat iproute2 procps openssl
           python3 curl chromium python3-psycopg2 python3-pika iptables systemd groff-base
           prometheus zsh fish)

if [[ $set_name == list ]]; then
  case ${2:-} in
  build) printf '%s\n' "${build_pkgs[@]}" ;;
  test) printf '%s\n' "${test_pkgs[@]}" ;;
  *) echo "usage: $0 list build|test" >&2; exit 2 ;;
  esac
  exit 0
fi

pkgs=("${build_pkgs[@]}")
[[ $set_name == test ]] && pkgs+=("${test_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done
# Node.js and npm for examples/node (npm ci) and the dashboard's vendored uPlot
# (scripts/vendor-uplot.sh): Debian's, unless a node with its npm is there already (a NodeSource
# nodejs package carries npm and conflicts with Debian's npm package)
if [[ $set_name == test ]] && ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
if ((${#missing[@]} == 0)); then
  echo "deps: all ${#pkgs[@]} packages present"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "deps: missing packages (${missing[*]}) and not root: install them or run as root" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}"
created_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
cleanup() { ((created_policy)) && rm -f /usr/sbin/policy-rc.d; return 0; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/obx-apt.log 2>&1 || {
  tail -30 /tmp/obx-apt.log >&2
  exit 1
}
# a system RabbitMQ/PostgreSQL started despite the policy would hold default ports: stop them
if command -v service >/dev/null; then
  service rabbitmq-server stop >/dev/null 2>&1 || true
fi
echo "deps: done"

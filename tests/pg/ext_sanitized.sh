#!/usr/bin/env bash
# ext_sanitized.sh OBX SAN_MODULE SAN_COUNTERS EXT_DIR VERSION [SECONDS] — the obx_pg
# extension's C code under UBSan inside a running PostgreSQL (issue 53). The sanitized modules
# must not replace the ones the suite's cluster loads: this copies the server's files (Debian's,
# or OBX_PG_BIN's) into a temporary folder, puts the sanitized builds of obx_pg (SAN_MODULE, as
# obx_pg-VERSION.so) and of its counters test build (SAN_COUNTERS) and the extension's scripts
# (EXT_DIR) in it, and starts a cluster of its own, every report fatal (CMakeLists.txt says why
# not AddressSanitizer). Then:
#   1. the self-test entry point of the sanitized build overflows a signed integer: the run
#      fails unless the sanitizer reports it (a wiring that could not report would pass anything);
#   2. tests/pg/fuzz_enqueue.sh for SECONDS (default 10) against that cluster: both bodies of
#      obx.enqueue() and the counters past 2^31, with every argument drawn at random;
#   3. the wake-up paths (obx._wait_for_work, the C body's latch wake-up, obx._wake_c, a
#      prepared transaction);
# and fails on any sanitizer report or backend killed by a signal after step 1.
set -u
OBX=$(realpath "${1:?usage: ext_sanitized.sh OBX SAN_MODULE SAN_COUNTERS EXT_DIR VERSION [SECONDS]}")
san=$(realpath "$2") counters=$(realpath "$3") extdir=$(realpath "$4") ver=$5 secs=${6:-10}
here=$(cd "$(dirname "$0")" && pwd)
sys_bin=${OBX_PG_BIN:-/usr/lib/postgresql/15/bin}
root=$(mktemp -d /tmp/obx-pgsan.XXXXXX)
chmod 755 "$root"
pgroot=$root/usr/lib/postgresql/15
pg() { su postgres -s /bin/sh -c "$*"; }
cleanup() {
  [[ -d $root/data ]] && pg "$pgroot/bin/pg_ctl -D '$root/data' -m immediate -w stop" >/dev/null 2>&1
  rm -rf "$root"
}
trap cleanup EXIT
trap 'exit 1' INT TERM # ctest's timeout: the EXIT trap still stops the server

# a private copy of the server: its binaries find their lib and share folders relative to
# themselves, so the same layout under another root is a server of its own
mkdir -p "$root/usr/lib/postgresql" "$root/usr/share/postgresql"
cp -a "$(dirname "$sys_bin")" "$root/usr/lib/postgresql/" || exit 1
cp -a "$("$sys_bin/pg_config" --sharedir)" "$root/usr/share/postgresql/" || exit 1
cp "$san" "$pgroot/lib/obx_pg-$ver.so" && cp "$counters" "$pgroot/lib/obx_pg_counters.so" &&
  cp "$extdir"/obx_pg* "$root/usr/share/postgresql/15/extension/" || exit 1
[[ $("$pgroot/bin/pg_config" --pkglibdir) == "$pgroot/lib" ]] ||
  { echo "FAIL: the server's copy does not find its own folders"; exit 1; }

mkdir -p "$root/pg" "$root/sock" "$root/data"
chown -R postgres:postgres "$root/pg" "$root/sock" "$root/data"
pg "$pgroot/bin/initdb -D '$root/data' -A trust -U postgres" >/dev/null || { echo "FAIL: initdb"; exit 1; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# a report goes to the server's log, with its stack; the module's -fno-sanitize-recover makes
# each report end its backend
export UBSAN_OPTIONS="print_stacktrace=1"
pg "UBSAN_OPTIONS=$UBSAN_OPTIONS $pgroot/bin/pg_ctl -D '$root/data' -l '$root/pg/server.log' \
  -o '-p $port -k $root/sock -c listen_addresses=127.0.0.1 -c fsync=off -c max_prepared_transactions=5' \
  -w start" >/dev/null || { cat "$root/pg/server.log"; echo "FAIL: the server's copy did not start"; exit 1; }
export OBX_TEST_PG_URL="postgres://postgres@127.0.0.1:$port/postgres" OBX_TEST_SERVICES_DIR=$root
source "$here/../e2e/pgdb.sh"
reports() { grep -c 'runtime error:' "$root/pg/server.log"; }
killed() { grep -c 'terminated by signal' "$root/pg/server.log"; }

# 1. the wiring reports
psql "$OBX_TEST_PG_URL" -XAtqc "CREATE FUNCTION pg_temp.selftest() RETURNS int LANGUAGE c AS
  '\$libdir/obx_pg-$ver', 'obx_pg_san_selftest'; SELECT pg_temp.selftest()" >"$root/selftest.out" 2>&1
for _ in $(seq 50); do (($(reports) > 0)) && break; sleep 0.2; done
(($(reports) > 0)) || { cat "$root/selftest.out" "$root/pg/server.log"; echo "FAIL: the self-test's overflow was not reported: the sanitizer is not wired"; exit 1; }
grep -q 'runtime error: signed integer overflow' "$root/pg/server.log" || { echo "FAIL: the self-test's report is not the overflow"; exit 1; }
echo "ok: the sanitized module reports from inside the server (self-test)"
for _ in $(seq 100); do psql "$OBX_TEST_PG_URL" -XAtqc 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.2; done
reported=$(reports) crashed=$(killed)

# 2. the fuzz run
"$here/fuzz_enqueue.sh" "$OBX" "$secs" || { grep -A20 'runtime error:' "$root/pg/server.log" | tail -40; echo "FAIL: the fuzz run"; exit 1; }

# 3. the wake-up paths
db=$(pg_fresh_db) || { echo "FAIL: no database"; exit 1; }
"$OBX" init --db "$db" | grep -q 'runs in C' || { echo "FAIL: obx init did not use the sanitized obx_pg"; exit 1; }
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null 2>&1 || exit 1
psql "$db" -XAtq -c "SELECT pg_advisory_lock(5194330, hashtext('local'))" -c "LISTEN obx_work" \
  -c "SELECT pg_backend_pid(), obx._wait_for_work(1000)" -c "SELECT obx._wait_for_work(1000)" >"$root/waiter.out" 2>&1 &
waiter=$!
sleep 0.4
gid="obx_san_$$"
psql "$db" -XAtq -v ON_ERROR_STOP=1 >/dev/null <<SQL || { echo "FAIL: the producers' wake-up paths"; exit 1; }
SELECT obx.enqueue('order.created.v1', 'order', 'o-1', 1, 'tenant-7', '\x7b7d');
SELECT obx._enqueue_sql('order.created.v1', 'order', 'o-2', 1, 'tenant-7', '\x7b7d');
BEGIN;
SELECT obx._wake_c('local');
SELECT obx.enqueue('order.created.v1', 'order', 'o-3', 1, 'tenant-7', '\x7b7d');
PREPARE TRANSACTION '$gid';
COMMIT PREPARED '$gid';
SQL
wait $waiter
grep -q '|t$' "$root/waiter.out" || { cat "$root/waiter.out"; echo "FAIL: the waiting session was not woken"; exit 1; }
pid=$(grep '^[0-9]*|t$' "$root/waiter.out" | head -1 | cut -d'|' -f1)
pg_drop_db "$db"

n=$(($(reports) - reported)) k=$(($(killed) - crashed))
if ((n > 0 || k > 0)); then
  grep -A30 'runtime error:' "$root/pg/server.log" | tail -n +$((reported * 31 + 1)) | head -80
  echo "FAIL: $n sanitizer report(s), $k backend(s) killed by a signal"
  exit 1
fi
echo "ok: obx_pg under UBSan: the fuzz run and the wake-up paths (backend $pid woken), no report"

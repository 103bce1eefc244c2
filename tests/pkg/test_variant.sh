#!/usr/bin/env bash
# test_variant.sh SOURCE_DIR WORK_DIR BACKEND — obx builds without one optional backend
# (BACKEND: POSTGRES, KAFKA or AMQP; CMake option OBX_WITH_<BACKEND>=OFF) or without systemd's
# notifications (SYSTEMD): the library and the CLI only (no tests: -DBUILD_TESTING=OFF), with
# -j2. The result must not link the backend's client library, must say so for its URLs, and
# must still run the simulator on SQLite.
set -euo pipefail
src=$1 work=$2 backend=$3
case $backend in
POSTGRES) lib=libpq url_opt=(init --db postgres://obx@127.0.0.1:1/obx) ;;
KAFKA) lib=librdkafka url_opt=(relay --db "sqlite:$work/o.db" --broker kafka://127.0.0.1:1) ;;
AMQP) lib=librabbitmq url_opt=(relay --db "sqlite:$work/o.db" --broker amqp://g:g@127.0.0.1:1/x) ;;
SYSTEMD) lib=libsystemd url_opt=() ;; # no URL: obx relay and obx consume just tell no one
*) echo "FAIL: unknown backend '$backend'"; exit 2 ;;
esac
rm -rf "$work"
mkdir -p "$work"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF \
  "-DOBX_WITH_$backend=OFF" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; echo "FAIL: configure with OBX_WITH_$backend=OFF"; exit 1; }
cmake --build "$work/build" -j2 --target obx obx_shared >"$work/build.log" 2>&1 ||
  { grep -E "error|Error" "$work/build.log" | head -30; echo "FAIL: build with OBX_WITH_$backend=OFF"; exit 1; }
obx=$work/build/obx
if grep -q "$lib" <<<"$(ldd "$work/build/libobx.so" "$obx")"; then
  echo "FAIL: OBX_WITH_$backend=OFF still links $lib"; exit 1
fi
"$obx" init --db "sqlite:$work/o.db" >/dev/null
if ((${#url_opt[@]})); then
  if "$obx" "${url_opt[@]}" >"$work/url.log" 2>&1; then
    echo "FAIL: '${url_opt[*]}' succeeded without the backend"; exit 1
  fi
  grep -q "OBX_EUNSUPPORTED" "$work/url.log" ||
    { cat "$work/url.log"; echo "FAIL: the backend's URL is not refused as unsupported"; exit 1; }
fi
"$obx" sim --traces 200 --seed 7 >"$work/sim.log" 2>&1 ||
  { tail -20 "$work/sim.log"; echo "FAIL: obx sim without $backend"; exit 1; }
echo "PASS: OBX_WITH_$backend=OFF builds (library and CLI), links no $lib, refuses its URLs"
rm -rf "$work"

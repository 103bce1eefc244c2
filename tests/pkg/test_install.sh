#!/usr/bin/env bash
# test_install.sh SOURCE_DIR BUILD_DIR WORK_DIR — what `cmake --install` gives a program that
# links libobx, checked from outside obx's tree (staged with DESTDIR under WORK_DIR):
#   - obx.h with the generated obx_version.h, whose version is CMake's project(VERSION); not
#     obx_test.h (test and simulation support, not stable API), and obx.h declares none of it;
#   - find_package(obx) from the install prefix: tests/pkg/consumer builds against obx::obx,
#     runs (commits an event), and its header and library versions agree;
#   - pkg-config: the same program linked with libobx.a and what obx.pc declares for a static
#     link (Requires.private, Libs.private) needs no libobx.so and runs.
set -euo pipefail
src=$(cd "$1" && pwd) build=$(cd "$2" && pwd) work=$3
rm -rf "$work"
mkdir -p "$work"
version=$(sed -n 's/^project(obx VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[[ -n $version ]] || { echo "FAIL: no project(obx VERSION ...) in CMakeLists.txt"; exit 1; }
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
DESTDIR=$work/root cmake --install "$build" >"$work/install.log"
root=$work/root$prefix
inc=$root/include
[[ -f $inc/obx.h && -f $inc/obx_version.h ]] || { echo "FAIL: obx.h / obx_version.h not installed"; exit 1; }
[[ ! -e $inc/obx_test.h ]] || { echo "FAIL: obx_test.h (not stable API) is installed"; exit 1; }
if grep -Eq 'obx_(sim|kafka_mock)_' "$inc/obx.h"; then
  echo "FAIL: the installed obx.h declares test support (obx_sim_*, obx_kafka_mock_*)"; exit 1
fi
grep -q "#define OBX_VERSION_STRING \"$version\"" "$inc/obx_version.h" ||
  { echo "FAIL: obx_version.h does not carry project(VERSION) $version"; exit 1; }

echo "== find_package(obx) from $root"
cmake -S "$src/tests/pkg/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$root" \
  >"$work/consumer-configure.log" 2>&1 || { cat "$work/consumer-configure.log"; echo "FAIL: find_package(obx)"; exit 1; }
cmake --build "$work/consumer" >"$work/consumer-build.log" 2>&1 ||
  { cat "$work/consumer-build.log"; echo "FAIL: building against obx::obx"; exit 1; }
grep -q "$root/lib.*/libobx.so" <<<"$(ldd "$work/consumer/obx_consumer")" ||
  { ldd "$work/consumer/obx_consumer"; echo "FAIL: the consumer does not use the installed libobx.so"; exit 1; }
out=$("$work/consumer/obx_consumer" "$work/shared.db")
[[ $out =~ ^$version\ $version\ evt-[0-9A-Z]{26}\ PENDING$ ]] || { echo "FAIL: consumer said '$out'"; exit 1; }

echo "== pkg-config --static obx"
pc=$(dirname "$(find "$root" -name obx.pc | head -1)")
export PKG_CONFIG_PATH=$pc
pkg-config --exists --print-errors obx
grep -q '^Libs.private: .*-lm' "$pc/obx.pc" || { echo "FAIL: obx.pc has no Libs.private"; exit 1; }
cflags=$(pkg-config --define-prefix --cflags obx)
libdir=$(pkg-config --define-prefix --variable=libdir obx)
# libobx.a with what obx.pc declares for it: the Requires.private modules (their shared
# libraries: Debian ships no static closure of libpq or gnutls) and Libs.private
requires=$(pkg-config --print-requires-private obx | awk '{print $1}')
private=$(sed -n 's/^Libs.private: //p' "$pc/obx.pc")
# shellcheck disable=SC2086,SC2046 # word lists from pkg-config
cc -o "$work/static" "$src/tests/pkg/consumer/main.c" $cflags "$libdir/libobx.a" \
  $(pkg-config --libs $requires) $private ||
  { echo "FAIL: static link with obx.pc's Requires.private ($requires) and Libs.private ($private)"; exit 1; }
if grep -q libobx <<<"$(ldd "$work/static")"; then echo "FAIL: the static program loads libobx.so"; exit 1; fi
out=$("$work/static" "$work/static.db")
[[ $out =~ ^$version\ $version\ evt-[0-9A-Z]{26}\ PENDING$ ]] || { echo "FAIL: static program said '$out'"; exit 1; }
echo "PASS: installed header, find_package(obx) and pkg-config --static work from $prefix"
rm -rf "$work"

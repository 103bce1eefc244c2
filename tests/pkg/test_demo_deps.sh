#!/usr/bin/env bash
# test_demo_deps.sh SOURCE_DIR WORK_DIR — README command 1 (scripts/demo.sh) on what a fresh
# Debian 12 machine has after `scripts/deps.sh build`, and nothing more.
#
# In a private mount namespace, an overlay on /usr hides the files of every installed package
# outside the build set (tests/pkg/hide_packages.py: the build packages, Essential and required
# packages and their Depends; cmocka, clang, PostgreSQL, python3, ... are gone). There
# scripts/demo.sh configures, builds (into WORK_DIR/build) and runs a short demo; it must pass.
# The rest of the machine keeps seeing every file, and the namespace ends with the test.
#
# The check can fail: in the same namespace a CMake project that looks up cmocka must fail to
# configure, and the one asking for the build set's sqlite3 must succeed. Needs root, unshare(1)
# and overlayfs (CI runs as root on Debian 12).
set -euo pipefail
src=$(cd "$1" && pwd)
work=$2
[[ $(id -u) -eq 0 ]] || { echo "FAIL: needs root (mount namespace, overlay)"; exit 1; }
rm -rf "$work"
mkdir -p "$work/upper" "$work/ovl-work" "$work/probe-missing" "$work/probe-present"

# shellcheck disable=SC2046 # one package name per word
python3 "$src/tests/pkg/hide_packages.py" "$work/upper" $("$src/scripts/deps.sh" list build)
for f in include/cmocka.h lib/x86_64-linux-gnu/libcmocka.so; do
  [[ -c $work/upper/$f ]] || { echo "FAIL: /usr/$f is not hidden (libcmocka-dev installed?)"; exit 1; }
done

cat >"$work/probe-missing/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(probe LANGUAGES C)
find_library(CMOCKA_LIB cmocka REQUIRED)
EOF
cat >"$work/probe-present/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(probe LANGUAGES C)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SQLITE3 REQUIRED sqlite3)
EOF

# Everything below runs inside the namespace; its exit status is the test's.
export SRC=$src WORK=$work
unshare --mount --propagation private bash -euo pipefail -c '
mount -t overlay obx-fresh -o "lowerdir=/usr,upperdir=$WORK/upper,workdir=$WORK/ovl-work" /usr
[[ ! -e /usr/include/cmocka.h && ! -e /usr/bin/python3 && -x /usr/bin/cc ]] ||
  { echo "FAIL: the overlay does not hide what it should"; exit 1; }
echo "== probe: a lookup of a test-only package fails here"
if cmake -S "$WORK/probe-missing" -B "$WORK/probe-missing/b" >"$WORK/probe-missing.log" 2>&1; then
  echo "FAIL: find_library(cmocka) succeeded with cmocka hidden: this check cannot fail"; exit 1
fi
cmake -S "$WORK/probe-present" -B "$WORK/probe-present/b" >"$WORK/probe-present.log" 2>&1 ||
  { cat "$WORK/probe-present.log"; echo "FAIL: a build package (sqlite3) is not found"; exit 1; }
echo "== scripts/demo.sh with only the build packages"
OBX_BUILD_DIR="$WORK/build" "$SRC/scripts/demo.sh" --events 300 --dir "$WORK/demo" >"$WORK/demo.log" 2>&1 ||
  { tail -40 "$WORK/demo.log"; echo "FAIL: scripts/demo.sh failed with only the build packages"; exit 1; }
grep -E "invariants +HOLD" "$WORK/demo.log" ||
  { tail -40 "$WORK/demo.log"; echo "FAIL: the demo did not report its invariants"; exit 1; }
'
# outside the namespace nothing changed
[[ -e /usr/include/cmocka.h ]] || { echo "FAIL: cmocka.h vanished outside the namespace"; exit 1; }
echo "PASS: scripts/demo.sh builds and runs with only the packages of scripts/deps.sh build"
rm -rf "$work"

#!/usr/bin/env bash
# Builds the Debian package obx_VERSION_ARCH.deb into DIR (default build-deb/): a release build
# of the library and the CLI for /usr (no tests), then `cpack -G DEB`. Needs only the packages
# of `scripts/deps.sh build` (dpkg-shlibdeps comes with build-essential). Prints the .deb's path.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-deb}
scripts/deps.sh build >&2
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF \
  -DCMAKE_INSTALL_PREFIX=/usr >/dev/null
cmake --build "$dir" -j"$(nproc)" >&2
(cd "$dir" && cpack -G DEB >cpack.log 2>&1) || { cat "$dir/cpack.log" >&2; exit 1; }
ls "$dir"/obx_*.deb

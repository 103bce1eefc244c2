#!/usr/bin/env bash
# test_vendor.sh — the vendored uPlot the relay embeds is exactly the pinned release: each file's
# SHA-256 equals the one scripts/vendor-uplot.sh pins, and VERSION names that release. Offline
# (the build never fetches it; `scripts/vendor-uplot.sh --check` compares with the registry).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
script=$root/scripts/vendor-uplot.sh
dir=$root/src/drivers/dashboard/vendor
version=$(sed -n 's/^VERSION=//p' "$script")
[[ $(cat "$dir/VERSION") == "$version" ]] || { echo "FAIL: vendor/VERSION is not $version"; exit 1; }
for f in uPlot.iife.min.js uPlot.min.css LICENSE; do
  want=$(sed -n "s/^  \[$f\]=\([0-9a-f]\{64\}\)$/\1/p" "$script")
  got=$(sha256sum "$dir/$f" | cut -d' ' -f1)
  [[ -n $want && $got == "$want" ]] || { echo "FAIL: $f sha256 $got, pinned '$want'"; exit 1; }
done
grep -q "uPlot (v$version)" <<<"$(head -c 80 "$dir/uPlot.iife.min.js")" || { echo "FAIL: uPlot.iife.min.js is not v$version"; exit 1; }
echo "ok: vendored uPlot $version matches its pinned sums"

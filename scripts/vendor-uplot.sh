#!/usr/bin/env bash
# Vendors uPlot (the dashboard's charting library) from the npm registry into
# src/drivers/dashboard/vendor/, which CMake embeds into the relay like the dashboard's own files:
# building obx never needs the network, only re-vendoring does. The version and the SHA-256 of
# each vendored file are pinned below; the script fails when the registry's package does not
# match them. To upgrade: change VERSION, run with --update (it prints the new sums), review the
# diff, put the sums here.
#   scripts/vendor-uplot.sh            fetch, verify, copy (what is committed must not change)
#   scripts/vendor-uplot.sh --check    fetch, verify, compare with the committed files
#   scripts/vendor-uplot.sh --update   fetch, copy, print the new sums (no verification)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=1.6.32
declare -A SHA256=(
  [uPlot.iife.min.js]=19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f
  [uPlot.min.css]=df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04
  [LICENSE]=8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd
)
mode=${1:-}
dest=src/drivers/dashboard/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "uplot@$VERSION" --silent >/dev/null)
tar -xzf "$tmp/uplot-$VERSION.tgz" -C "$tmp"
declare -A src=([uPlot.iife.min.js]=package/dist/uPlot.iife.min.js
                [uPlot.min.css]=package/dist/uPlot.min.css [LICENSE]=package/LICENSE)
status=0
for f in uPlot.iife.min.js uPlot.min.css LICENSE; do
  got=$(sha256sum "$tmp/${src[$f]}" | cut -d' ' -f1)
  if [[ $mode == --update ]]; then
    echo "  [$f]=$got"
    cp "$tmp/${src[$f]}" "$dest/$f"
    continue
  fi
  if [[ $got != "${SHA256[$f]}" ]]; then
    echo "vendor-uplot: $f of uplot@$VERSION has sha256 $got, pinned ${SHA256[$f]}" >&2
    status=1
    continue
  fi
  if [[ $mode == --check ]]; then
    cmp -s "$tmp/${src[$f]}" "$dest/$f" || { echo "vendor-uplot: $dest/$f differs from uplot@$VERSION" >&2; status=1; }
  else
    cp "$tmp/${src[$f]}" "$dest/$f"
  fi
done
[[ $mode == --update ]] || echo "$VERSION" >"$dest/VERSION"
((status == 0)) && echo "vendor-uplot: uplot@$VERSION ${mode:-copied} ok"
exit $status

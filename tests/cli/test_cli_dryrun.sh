#!/usr/bin/env bash
# test_cli_dryrun.sh OBX — a dry run cannot write (issue 50, item 3): `obx migrate`, `obx resolve`
# and `obx takeover` with --dry-run open the outbox read-only, so that even a bug in the dry path
# could not change it. Run on an outbox the user cannot write (a 0444 file in a 0555 folder, as
# a user other than its owner: nobody, when the test runs as root), each dry run exits 0 with its
# report, and afterwards the folder holds the same files with the same bytes. (Before the fix the
# commands opened the outbox for writing: "attempt to write a readonly database", exit 3.)
set -u
OBX=$(realpath "${1:?usage: test_cli_dryrun.sh OBX}")
dir=$(mktemp -d /tmp/obx-dry-XXXXXX)
chmod 755 "$dir"
cleanup() {
  chmod -R u+w "$dir" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
source "$(dirname "$0")/../support/expect.sh" # fails, bad, t NAME WANT NEEDLE -- CMD, as_reader
cd "$dir"

mkdir ro
db=sqlite:$dir/ro/o.db
three_orders "$db"
id=$(sqlite3 "$dir/ro/o.db" "SELECT event_id FROM obx_event ORDER BY seq LIMIT 1")
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders-2 >/dev/null 2>&1 || bad "route set 2"
chmod 0444 ro/*
chmod 0555 ro
before=$(cd ro && ls -a && sha256sum ./*)

t "migrate --route-gen --dry-run" 0 "dry run" -- "${as_reader[@]}" "$OBX" migrate --db "$db" \
  --type order.created.v1 --route-gen 2 --dry-run
t "migrate --cluster/--topic --dry-run" 0 "dry run" -- "${as_reader[@]}" "$OBX" migrate --db "$db" \
  --type order.created.v1 --cluster local --topic orders-3 --dry-run
t "migrate --dry-run --json" 0 '"dry_run": true' -- "${as_reader[@]}" "$OBX" migrate "$id" --db "$db" \
  --route-gen 2 --dry-run --json
t "takeover --from --dry-run" 0 "dry run" -- "${as_reader[@]}" "$OBX" takeover --db "$db" \
  --to other --from obx --dry-run
t "takeover --type --dry-run" 0 "dry run" -- "${as_reader[@]}" "$OBX" takeover --db "$db" \
  --to other --type order.created.v1 --backlog --dry-run
t "resolve --held --dry-run" 0 "dry run: nothing changed" -- "${as_reader[@]}" "$OBX" resolve \
  --held --older-than 0s --retry --dry-run --db "$db" --who ops --reason r
# a dry run that refuses its one event still only reads: exit 1 (a finding), not 3
t "resolve EVENT --dry-run" 1 "1 refused" -- "${as_reader[@]}" "$OBX" resolve "$id" --retry \
  --dry-run --db "$db" --who ops --reason r
after=$(cd ro && ls -a && sha256sum ./*)
[[ $before == "$after" ]] || bad "the dry runs changed the folder: before: $before after: $after"
# the same commands without --dry-run may write: refused here, exit 3, nothing changed
t "takeover (no dry run) on a read-only file" 3 "" -- "${as_reader[@]}" "$OBX" takeover --db "$db" \
  --to other --from obx
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

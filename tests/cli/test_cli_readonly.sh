#!/usr/bin/env bash
# test_cli_readonly.sh OBX — commands that only read open the outbox read-only (issue 50, item 3):
#   - on a database that does not exist they create nothing and say "no such outbox: PATH",
#     exit 3 (report, status, inspect, route list, audit, trace, watermark list, purge --dry-run,
#     shadow, catalog check, poison list; a status or trace naming a missing consumer database
#     creates none either);
#   - they read an outbox the user cannot write (a 0444 file in a 0555 folder, as a user other
#     than its owner: nobody, when the test runs as root), a WAL database without its -wal and
#     -shm files (SQLite cannot create them there: read immutable) and one whose -wal file holds
#     committed transactions a reader still keeps from the main file (read through the -shm file);
#     they create no file in that folder.
set -u
OBX=$(realpath "${1:?usage: test_cli_readonly.sh OBX}")
dir=$(mktemp -d /tmp/obx-ro-XXXXXX)
chmod 755 "$dir"
holder=
cleanup() {
  [[ -n $holder ]] && kill "$holder" 2>/dev/null
  chmod -R u+w "$dir" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
source "$(dirname "$0")/../support/expect.sh" # fails, bad, t NAME WANT NEEDLE -- CMD, as_reader
cd "$dir"
reading() { # reading LABEL DB CONSUMER_DB: every read-only command, as the reader, in its folder
  local label=$1 rdb=$2 rcons=$3 want_inspect=$4
  local m="sqlite:$rdb" c="proj=sqlite:$rcons"
  t "$label: report" 0 "committed" -- "${as_reader[@]}" "$OBX" report --db "$m"
  t "$label: status" 0 "events" -- "${as_reader[@]}" "$OBX" status --db "$m" --consumer "$c"
  t "$label: inspect" 0 "$want_inspect" -- "${as_reader[@]}" "$OBX" inspect "$id" --db "$m"
  t "$label: route list" 0 "order.created.v1" -- "${as_reader[@]}" "$OBX" route list --db "$m"
  t "$label: audit" 1 "pending_overdue" -- "${as_reader[@]}" "$OBX" audit --db "$m" --consumer "$c" --set audit.pending_max_age_ms=1
  t "$label: trace" 0 "producer    committed" -- "${as_reader[@]}" "$OBX" trace "$id" --db "$m" --consumer "$c"
  t "$label: watermark list" 0 "CONSUMER" -- "${as_reader[@]}" "$OBX" watermark list --db "$m" --consumer "$c"
  t "$label: purge --dry-run" 0 "dry run" -- "${as_reader[@]}" "$OBX" purge --dry-run --db "$m" --consumer "$c"
  t "$label: shadow" 0 "shadow" -- "${as_reader[@]}" "$OBX" shadow --db "$m" --feed /dev/null --grace-ms 3600000
  t "$label: catalog check" 1 "finding" -- "${as_reader[@]}" "$OBX" catalog check --catalog "$dir/catalog.yaml" --db "$m"
  t "$label: poison list" 0 "[]" -- "${as_reader[@]}" "$OBX" poison list --consumer-db "sqlite:$rcons"
}
printf 'topics:\n  - name: orders.v1\n    owner: shop\n    event_types: [order.created.v1]\n    subscribers: [proj]\n' >catalog.yaml

# ---- a database that does not exist: nothing created, "no such outbox", exit 3 ----
mkdir empty
m=sqlite:$dir/empty/missing.db
t "report" 3 "no such outbox: $dir/empty/missing.db" -- "$OBX" report --db "$m"
t "report --json" 3 '"code":"OBX_ENODB"' -- "$OBX" report --db "$m" --json
t "status" 3 "no such outbox" -- "$OBX" status --db "$m"
t "inspect" 3 "no such outbox" -- "$OBX" inspect evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G --db "$m"
t "route list" 3 "no such outbox" -- "$OBX" route list --db "$m"
t "audit" 3 "no such database file" -- "$OBX" audit --db "$m"
t "trace" 3 "no such outbox" -- "$OBX" trace evt-01J9ZQ4X5Y6Z7A8B9C0D1E2F3G --db "$m"
t "watermark list" 3 "OBX_ENODB" -- "$OBX" watermark list --db "$m" --consumer "proj=$m"
t "purge --dry-run" 3 "OBX_ENODB" -- "$OBX" purge --dry-run --db "$m" --consumer "proj=$m"
t "shadow" 3 "no such outbox" -- "$OBX" shadow --db "$m" --feed /dev/null
t "catalog check" 3 "no such outbox" -- "$OBX" catalog check --catalog catalog.yaml --db "$m"
t "poison list" 3 "no such consumer database" -- "$OBX" poison list --consumer-db "$m"
# a critical consumer's database that does not exist: unreachable, not created
"$OBX" init --db "sqlite:$dir/o.db" >/dev/null
"$OBX" route set order.created.v1 --db "sqlite:$dir/o.db" --cluster local --topic orders >/dev/null
id=$(echo '{"order":1}' | "$OBX" enqueue --db "sqlite:$dir/o.db" --type order.created.v1 --aggregate order/o-1@1 --tenant tenant-7)
t "audit, a missing log broker" 3 "no such file" -- "$OBX" audit --db "sqlite:$dir/o.db" --broker "log:$dir/empty/broker.db"
t "status, a missing consumer" 0 "UNREACHABLE: OBX_ENODB" -- "$OBX" status --db "sqlite:$dir/o.db" --consumer "proj=$m"
t "trace, a missing consumer" 0 "unreachable" -- "$OBX" trace "$id" --db "sqlite:$dir/o.db" --consumer "proj=$m"
left=$(ls -A empty)
[[ -z $left ]] && echo "ok   nothing created for a missing database" || bad "files created: $left"

# ---- an outbox the reader cannot write: a 0444 file in a 0555 folder ----
mkdir ro
"$OBX" init --db "sqlite:$dir/ro/c.db" >/dev/null
cp o.db ro/o.db
[[ $(sqlite3 ro/o.db 'PRAGMA journal_mode') == wal ]] || bad "the outbox is not a WAL database"
chmod 444 ro/*.db
chmod 555 ro
before=$(ls -A ro | tr '\n' ' ')
reading "read-only WAL database, no -wal file" "$dir/ro/o.db" "$dir/ro/c.db" PENDING
after=$(ls -A ro | tr '\n' ' ')
[[ $after == "$before" ]] && echo "ok   no file created in the read-only folder" || bad "files now: $after (were: $before)"

# ---- the same with transactions still in the -wal file (a reader keeps them from the main file) ----
chmod 755 ro
chmod 644 ro/*.db
python3 - "$dir/ro/o.db" <<'PY' &
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN")
c.execute("SELECT count(*) FROM obx_event").fetchall()  # a snapshot: no checkpoint past it
open(sys.argv[1] + ".held", "w").close()
time.sleep(60)
PY
holder=$!
for _ in $(seq 100); do [[ -e ro/o.db.held ]] && break; sleep 0.1; done
rm -f ro/o.db.held
id=$(echo '{"order":2}' | "$OBX" enqueue --db "sqlite:$dir/ro/o.db" --type order.created.v1 --aggregate order/o-2@1 --tenant tenant-7)
[[ -s ro/o.db-wal ]] || bad "the -wal file is empty: the test holds nothing back"
chmod 444 ro/*
chmod 555 ro
before=$(ls -A ro | tr '\n' ' ')
reading "read-only WAL database with its -wal and -shm files" "$dir/ro/o.db" "$dir/ro/c.db" PENDING
t "the event committed only in the -wal file is read" 0 "events: 2 committed" -- "${as_reader[@]}" "$OBX" report --db "sqlite:$dir/ro/o.db"
after=$(ls -A ro | tr '\n' ' ')
[[ $after == "$before" ]] && echo "ok   no file created in the read-only folder" || bad "files now: $after (were: $before)"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

#!/usr/bin/env bash
# test_demo_dir.sh OBX — a second `obx demo --dir D` (issue 50, item 5): refused at once (exit
# status 2, a usage error: the command line must name another folder or say --force), naming
# the earlier demo's files, changing none of them and starting nothing; --force starts afresh
# (the outbox holds this run's events only); an outbox named by --db that holds events is
# refused at once too.
set -u
OBX=$(realpath "${1:?usage: test_demo_dir.sh OBX}")
source "$(dirname "$0")/../support/prologue.sh" demodir
fails=0
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
n=200
demo() { timeout 300 "$OBX" demo --events "$n" --lease-ms 300 "$@"; }
demo --dir "$dir/d" >/dev/null 2>&1 || bad "the first demo failed (exit $?)"
before=$(cd "$dir/d" && sha256sum outbox.db broker.db consumer.db relay-a.log)
start=$(date +%s%N)
out=$(demo --dir "$dir/d" 2>&1)
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
if [[ $rc != 2 || $out != *"$dir/d holds an earlier demo (outbox.db, broker.db, consumer.db"*"--force"* ]]; then
  bad "second demo in the same folder: exit $rc: ${out:0:400}"
elif ((ms > 3000)); then
  bad "the refusal took $ms ms (at once, before anything runs)"
elif (($(wc -l <<<"$out") > 3)); then
  bad "the refusal printed $(wc -l <<<"$out") lines: $out"
else
  echo "ok   a second demo in $dir/d is refused in $ms ms: $out"
fi
after=$(cd "$dir/d" && sha256sum outbox.db broker.db consumer.db relay-a.log)
[[ $after == "$before" ]] && echo "ok   the earlier demo's files are unchanged" || bad "the refusal changed the earlier demo's files"
out=$(demo --dir "$dir/d" --json 2>&1)
rc=$?
[[ $rc == 2 ]] && jq -e '.code == "usage" and .exit_status == 2' <<<"$out" >/dev/null &&
  echo "ok   with --json the refusal is a JSON error" || bad "--json refusal: exit $rc: $out"
# an outbox that holds events, named by --db in a fresh folder
out=$(demo --dir "$dir/e" --db "sqlite:$dir/d/outbox.db" 2>&1)
rc=$?
[[ $rc == 2 && $out == *"already holds $n events"* ]] && echo "ok   --db holding events is refused" ||
  bad "--db holding events: exit $rc: ${out:0:300}"
[[ ! -e $dir/e/broker.db ]] || bad "the refused run started a broker in $dir/e"
# --force: afresh, this run's events only
demo --dir "$dir/d" --force --json >"$dir/run.json" 2>/dev/null
rc=$?
committed=$(jq .committed "$dir/run.json" 2>/dev/null)
events=$(sqlite3 "$dir/d/outbox.db" 'SELECT count(*) FROM obx_event')
if [[ $rc == 0 && $committed == "$n" && $events == "$n" ]] && jq -e '.invariants_hold and .lost == 0' "$dir/run.json" >/dev/null; then
  echo "ok   --force starts afresh: $events events, the invariants hold"
else
  bad "--force: exit $rc, committed $committed, $events events in the outbox: $(head -c 300 "$dir/run.json")"
fi
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

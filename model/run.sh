#!/usr/bin/env bash
# model/run.sh -- verifies the protocol model model/obx.pml with spin (issue 12, docs/model.md).
#
#   1. the model, exhaustively:
#        safety    every assertion (P1-P11, the model bound), invalid end states
#        cycles    non-progress-cycle search with no progress labels: the model has no cycle,
#                  so every run is finite and P11 (checked where runs end) is liveness
#        ltl       <>[] ALL_DONE under weak fairness (pan -a -f)
#   2. every guard switch: spin must find a counterexample, violating the expected property;
#   3. the documented findings and overlaps: each spec variant behaves as docs/model.md says;
#   4. coverage: each witness behaviour (-DCOVER=n) is reachable, so no check is vacuous.
#
# Exit status 0 only if all of that holds.  Environment: OBX_MODEL_JOBS (parallel spin runs,
# default: number of CPUs), OBX_MODEL_TIMEOUT (seconds per spin run, default 300),
# OBX_MODEL_KEEP=1 keeps the work directory (trails) for inspection.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model=$here/obx.pml
jobs=${OBX_MODEL_JOBS:-$(nproc 2>/dev/null || echo 2)}
tmo=${OBX_MODEL_TIMEOUT:-300}

for tool in spin gcc timeout; do
  command -v "$tool" >/dev/null || { echo "model: '$tool' not found (scripts/deps.sh test installs spin)" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/obx-model.XXXXXX")
cleanup() {
  if [[ ${OBX_MODEL_KEEP:-0} == 1 ]]; then echo "model: work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# check NAME SPIN_DEFINES MODE EXPECT
#   MODE: safety | cycles | ltl.  EXPECT: pass | cycle | a property tag such as P5_valid_ack_kept
#   | cover:N.  Writes NAME/result: "ok <details>" or "FAIL <details>".
check() {
  local name=$1 defs=$2 mode=$3 expect=$4
  local d=$work/$name
  mkdir -p "$d"
  cd "$d"
  cp "$model" obx.pml
  local -a sd=()
  local x
  for x in $defs; do sd+=("-D$x"); done
  if ! spin -a "${sd[@]}" obx.pml >spin.out 2>&1; then
    echo "FAIL spin -a failed: $(head -3 spin.out | tr '\n' ' ')" >result
    return 0
  fi
  local -a cf=(-w -DMEMLIM=4096) pf=(-m20000 -w24)
  local opt=-O0
  case $mode in
    safety) cf+=(-DNOCLAIM -DSAFETY) ;;
    cycles) cf+=(-DNOCLAIM -DNP); pf+=(-l) ;;
    ltl) cf+=(-DNFAIR=3); pf+=(-a -f -N live) ;;
  esac
  if [[ $expect == pass ]]; then
    if [[ $mode == ltl ]]; then opt=-O2; else opt=-O1; fi
  fi
  if ! gcc "$opt" "${cf[@]}" -o pan pan.c >cc.out 2>&1; then
    echo "FAIL gcc failed: $(head -3 cc.out | tr '\n' ' ')" >result
    return 0
  fi
  local t0=$SECONDS rc=0
  timeout "$tmo" ./pan "${pf[@]}" >out.txt 2>&1 || rc=$?
  local secs=$((SECONDS - t0))
  local errors
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' out.txt | tail -1)
  if [[ $rc -eq 124 || -z $errors ]]; then
    echo "FAIL no verdict (timeout ${tmo}s or pan error rc=$rc): $(tail -2 out.txt | tr '\n' ' ')" >result
    return 0
  fi
  if [[ $expect == pass ]] &&
     grep -q -e 'search depth too small' -e 'Search not completed' -e 'reached -DMEMLIM' out.txt; then
    echo "FAIL search incomplete: $(grep -e 'depth too small' -e 'not completed' -e MEMLIM out.txt | head -1)" >result
    return 0
  fi
  local what
  what=$(grep -m1 -E '^pan:[0-9]+: (assertion violated|non-progress cycle|acceptance cycle|invalid end state)' out.txt |
         grep -oE 'P[0-9]+_[a-z_]+|BOUND_ok|\([0-9]+!=[0-9]+\)|non-progress cycle|acceptance cycle|invalid end state' | tail -1 || true)
  case $expect in
    pass)
      if [[ $errors == 0 ]]; then echo "ok no counterexample (${secs}s)" >result
      else echo "FAIL expected no counterexample, got: ${what:-?} (errors $errors)" >result; fi ;;
    cycle)
      if [[ $errors != 0 && $what == *cycle* ]]; then echo "ok $what (${secs}s)" >result
      else echo "FAIL expected a cycle, got: ${what:-none} (errors $errors)" >result; fi ;;
    cover:*)
      local n=${expect#cover:}
      if [[ $errors != 0 && $what == "($n!=$n)" ]]; then echo "ok reachable (${secs}s)" >result
      else echo "FAIL witness not reached, got: ${what:-none} (errors $errors)" >result; fi ;;
    *)
      if [[ $errors != 0 && $what == "$expect" ]]; then echo "ok $what (${secs}s)" >result
      else echo "FAIL expected $expect, got: ${what:-none} (errors $errors)" >result; fi ;;
  esac
}

figures() { # NAME: the search figures of a finished run
  local o=$work/$1/out.txt
  local sv depth stored trans mem
  sv=$(sed -n 's/^State-vector \([0-9]*\) byte.*/\1/p' "$o" | tail -1)
  depth=$(sed -n 's/.*depth reached \([0-9]*\),.*/\1/p' "$o" | tail -1)
  stored=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$o" | tail -1)
  trans=$(sed -n 's/^ *\([0-9.e+]*\) transitions.*/\1/p' "$o" | tail -1)
  mem=$(sed -n 's/^ *\([0-9.]*\).total actual memory usage.*/\1/p' "$o" | tail -1)
  printf '  %-8s state-vector %s byte, states stored %s, transitions %s, depth reached %s, memory %s MB, %s\n' \
    "$1" "$sv" "$stored" "$trans" "$depth" "$mem" "$(cut -d' ' -f2- "$work/$1/result")"
}

# name | defines (comma-separated) | mode | expected
# (the LTL search runs once per choice of the faulted event, init's first branch: together the
# two runs cover the state space; longest first)
main_checks=(
  "ltl-e0|VICTIM=0|ltl|pass"
  "ltl-e2|VICTIM=2|ltl|pass"
  "safety||safety|pass"
  "cycles||cycles|pass"
)
guards=(
  "NO_FENCE|NO_FENCE|safety|P2_fenced"
  "NO_LEASE_CHECK|NO_LEASE_CHECK|safety|P2_fenced"
  "NO_CLAIM_LEASE|NO_CLAIM_LEASE|cycles|cycle"
  "NO_FROZEN_DEST|NO_FROZEN_DEST|safety|P3_frozen_dest"
  "NO_DIGEST_CHECK|NO_DIGEST_CHECK|safety|P7_primary_matches"
  "NO_ATTEMPT_CHECK|NO_ATTEMPT_CHECK|safety|P8_final_is_final"
  "NO_DEST_VERIFY|NO_DEST_VERIFY|safety|P7_primary_matches"
  "NO_SLOT_CHECK|NO_SLOT_CHECK|safety|P5_valid_ack_kept"
  "NO_QUIET_CHECK|NO_QUIET_CHECK|safety|P5_valid_ack_kept"
  "NO_MIGRATION_PROOF|NO_MIGRATION_PROOF|safety|P4_migration_proof"
  "NO_UNKNOWN_BLOCK|NO_UNKNOWN_BLOCK|safety|P5_valid_ack_kept"
  "NO_INBOX_DEDUPE|NO_INBOX_DEDUPE|safety|P6_effect_once"
  "NO_ATOMIC_INBOX|NO_ATOMIC_INBOX|safety|P6_effect_once"
  "ACK_BEFORE_COMMIT|ACK_BEFORE_COMMIT|safety|P11_all_done"
  "NO_CONSUMER_DIGEST|NO_CONSUMER_DIGEST|safety|P9_consumer_payload"
  "NO_WATERMARK_CHECK|NO_WATERMARK_CHECK|safety|P10_purge_watermark"
  "NO_SLOT+STATE|NO_SLOT_CHECK,NO_STATE_CHECK|safety|P1_one_primary"
)
variants=(
  "NO_STATE_CHECK|NO_STATE_CHECK|safety|pass"
  "NO_UNKNOWN_BLOCK+STATE|NO_UNKNOWN_BLOCK,NO_STATE_CHECK|safety|pass"
  "LITERAL_STEP3|LITERAL_STEP3|safety|P5_valid_ack_kept"
  "LOOKUP_ALL_RECORDS|LOOKUP_ALL_RECORDS|cycles|cycle"
  "PARTITION_LOOKUP|PARTITION_LOOKUP|safety|P4_migration_proof"
  "UNKNOWN_ALL_DESTS|UNKNOWN_ALL_DESTS|safety|P11_all_done"
)
# the liveness counterexamples again, found by the LTL claim under weak fairness alone
ltl_bites=(
  "LTL:ACK_BEFORE_COMMIT|ACK_BEFORE_COMMIT,NO_TERMINAL_CHECK|ltl|cycle"
  "LTL:NO_CLAIM_LEASE|NO_CLAIM_LEASE,NO_TERMINAL_CHECK|ltl|cycle"
  "LTL:UNKNOWN_ALL_DESTS|UNKNOWN_ALL_DESTS,NO_TERMINAL_CHECK|ltl|cycle"
)
witnesses=()
for n in $(seq 1 15); do witnesses+=("COVER=$n|COVER=$n|safety|cover:$n"); done

run_list() { # runs "name|defs|mode|expect" lines, $jobs at a time
  local line
  for line in "$@"; do
    IFS='|' read -r name defs mode expect <<<"$line"
    printf '%s\0%s\0%s\0%s\0' "$name" "${defs//,/ }" "$mode" "$expect"
  done | xargs -0 -n4 -P "$jobs" bash -c "$(declare -f check); work='$work' model='$model' tmo='$tmo'; check \"\$@\"" _
}

report() { # TITLE LINES...: prints results, returns the number of failures
  local title=$1 fails=0 line name res
  shift
  echo "$title"
  for line in "$@"; do
    IFS='|' read -r name _ <<<"$line"
    res=$(cat "$work/$name/result" 2>/dev/null || echo "FAIL no result")
    printf '  %-24s %s\n' "$name" "$res"
    [[ $res == ok* ]] || fails=$((fails + 1))
  done
  return "$fails"
}

start=$SECONDS
echo "model: $(spin -V | head -1); $model; $jobs parallel runs"
run_list "${main_checks[@]}" "${guards[@]}" "${ltl_bites[@]}" "${variants[@]}" "${witnesses[@]}"

failed=0
echo "== the model (exhaustive; no compression, no bitstate)"
for c in safety cycles ltl-e0 ltl-e2; do
  r=$(cat "$work/$c/result")
  [[ $r == ok* ]] || { failed=1; echo "  $c: $r"; sed -n '1,40p' "$work/$c/out.txt" | sed 's/^/    /'; }
  figures "$c"
done
report "== guards removed in turn (each must give a counterexample of the named property)" "${guards[@]}" || failed=1
report "== liveness counterexamples found by the LTL claim (weak fairness)" "${ltl_bites[@]}" || failed=1
report "== findings and overlaps (docs/model.md)" "${variants[@]}" || failed=1
report "== coverage witnesses (each behaviour must be reachable)" "${witnesses[@]}" || failed=1
echo "model: total $((SECONDS - start))s"
if ((failed)); then
  echo "MODEL CHECK FAILED"
  exit 1
fi
echo "MODEL CHECK PASSED"

#!/usr/bin/env bash
# test_cli_help.sh OBX GETOPT_DUMP_LIB SOURCE_DIR — every command's help, checked against the
# code (issue 18):
#   - `obx help` lists the commands; each answers `--help`, `-h` and `obx help COMMAND` with the
#     same text, exit 0: a synopsis starting "usage: obx COMMAND", options, examples that run
#     that command;
#   - the options each command's getopt accepts are read from the running binary (getopt_dump.c
#     is preloaded: the command's first getopt call writes its option table and exits) for the
#     command and each subcommand its synopsis names; the help lists exactly those, each with an
#     argument iff getopt wants one, and every option with an argument states its default (or
#     that it is required);
#   - docs/obx.1 is `obx help --man` (not stale), groff finds nothing to warn about, and it holds
#     every command and option.
set -euo pipefail
obx=$(realpath "$1") dumplib=$(realpath "$2") src=$3
work=$(mktemp -d /tmp/obx-help-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/run"
fail() {
  echo "FAIL: $*"
  exit 1
}

"$obx" help >"$work/help" || fail "obx help: exit status $?"
mapfile -t cmds < <(awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on {print $1}' "$work/help")
((${#cmds[@]} >= 20)) || fail "obx help lists ${#cmds[@]} commands"
rc=0
"$obx" no-such-command >/dev/null 2>&1 || rc=$?
((rc == 2)) || fail "an unknown command exits $rc, not 2"

# name ARG-or-"-" has_default(0/1) short-letter-or-"-", one line per documented option
documented() {
  awk '
    /^options:/ {on = 1; next}
    on && /^$/ {on = 0}
    function flush() { if (name != "") print name, arg, dflt, short; name = "" }
    on && /^  -/ {
      flush()
      line = $0; short = "-"
      if (match(line, /^  -[A-Za-z], /)) { short = substr(line, 4, 1); line = "  " substr(line, 7) }
      split(substr(line, 3), w, " ")
      name = substr(w[1], 3); arg = "-"
      if (w[2] != "" && substr(line, 3 + length(w[1]), 1) == " " && substr(line, 4 + length(w[1]), 1) != " ")
        arg = w[2]
      dflt = ($0 ~ /\(default: |\(required/) ? 1 : 0
      if (name == "help") name = ""  # -h, --help: main.c answers it for every command
      next
    }
    on && name != "" { if ($0 ~ /\(default: |\(required/) dflt = 1 }
    END { flush() }' "$1"
}

total=0
for c in "${cmds[@]}"; do
  h=$work/$c.help
  "$obx" "$c" --help >"$h" || fail "obx $c --help: exit status $?"
  "$obx" "$c" -h | cmp -s - "$h" || fail "obx $c -h differs from --help"
  "$obx" help "$c" | cmp -s - "$h" || fail "obx help $c differs from obx $c --help"
  grep -Eq "^usage: obx $c( |$)" <<<"$(head -1 "$h")" || fail "obx $c --help does not start with its usage"
  grep -Eq "^  (.*\| )?obx $c( |$)" <<<"$(awk '/^examples:/ {on = 1; next} on' "$h")" ||
    [[ $c == completion ]] || fail "obx $c --help has no example running obx $c"

  # the code's view: getopt tables of the command and of each subcommand in its synopsis
  mapfile -t subs < <(awk -v c="$c" '/^(usage:| +) obx / {for (i = 1; i <= NF; i++) if ($i == "obx" && $(i + 1) == c) { s = $(i + 2); if (s ~ /^[a-z][a-z-]*$/) print s }}' "$h" | sort -u)
  rm -f "$work/dump"
  for sub in "" "${subs[@]}"; do
    # the preload is set only for obx itself (timeout parses its options with getopt too)
    # shellcheck disable=SC2086 # no subcommand: no word
    (cd "$work/run" && OBX_GETOPT_DUMP="$work/dump" \
      ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
      timeout 20 bash -c 'export LD_PRELOAD=$0; exec "$@"' "$dumplib" "$obx" "$c" $sub \
      </dev/null >/dev/null 2>&1) || true
  done
  documented "$h" >"$work/$c.doc"
  if [[ ! -s $work/dump ]]; then
    # a command that never reaches getopt must document no option
    [[ ! -s $work/$c.doc ]] || fail "obx $c documents options but its getopt was never reached"
    continue
  fi
  # one awk per command compares the two views (a process per option is slow on a loaded CI)
  verdict=$(awk -v c="$c" '
    FILENAME == ARGV[1] && $1 == "long" { code[$2] = $3 }
    FILENAME == ARGV[1] && $1 == "short" { shortopts = shortopts $2 }
    FILENAME == ARGV[2] { arg[$1] = $2; dflt[$1] = $3; if ($4 != "-") short[$4] = $1 }
    END {
      n = 0
      for (o in code) {
        n++
        if (!(o in arg)) { print "FAIL: obx " c ": getopt accepts --" o ", obx " c " --help does not list it"; exit }
        if (code[o] == 0 && arg[o] != "-") { print "FAIL: obx " c " --" o " takes no argument, the help shows " arg[o]; exit }
        if (code[o] == 1 && arg[o] == "-") { print "FAIL: obx " c " --" o " takes an argument, the help shows none"; exit }
        if (code[o] == 1 && !dflt[o]) { print "FAIL: obx " c " --help: --" o " states no default"; exit }
        if (code[o] > 1) { print "FAIL: obx " c " --" o ": optional argument: document it first"; exit }
      }
      for (o in arg) if (!(o in code)) { print "FAIL: obx " c " --help lists --" o ", which its getopt does not accept"; exit }
      for (s in short) if (index(shortopts, s) == 0) { print "FAIL: obx " c " --help lists -" s ", getopt does not accept it"; exit }
      m = split(shortopts, letters, "")
      for (i = 1; i <= m; i++) if (letters[i] ~ /[A-Za-z]/ && !(letters[i] in short)) { print "FAIL: obx " c ": getopt accepts -" letters[i] ", the help does not list it"; exit }
      print n
    }' "$work/dump" "$work/$c.doc")
  [[ $verdict != FAIL* ]] || { echo "$verdict"; exit 1; }
  total=$((total + verdict))
  # for the man page check below
  cat "$work/$c.doc" >>"$work/all.doc"
done
((total >= 100)) || fail "only $total options checked: the getopt probe is not working"
echo "help: ${#cmds[@]} commands, $total options checked against their getopt tables"

# the man page is generated from the same table and committed as docs/obx.1
"$obx" help --man >"$work/obx.1"
cmp -s "$work/obx.1" "$src/docs/obx.1" ||
  fail "docs/obx.1 is stale: run \`cmake --build build --target man\` (diff: $(diff "$src/docs/obx.1" "$work/obx.1" | head -5))"
warn=$(groff -man -ww -z "$src/docs/obx.1" 2>&1) || fail "groff: $warn"
[[ -z $warn ]] || fail "groff warns about docs/obx.1: $warn"
missing=$(for c in "${cmds[@]}"; do echo "SS $c"; done | awk '
  FILENAME == ARGV[1] { want["section " $2]; next }
  FILENAME == ARGV[2] { o = $1; gsub(/-/, "\\-", o); want["option \\-\\-" o "\\fR"]; next }
  { for (w in want) { split(w, p, " "); if ((p[1] == "section" && $0 == ".SS \"obx " p[2] "\"") || (p[1] == "option" && index($0, p[2]))) delete want[w] } }
  END { for (w in want) print w }' - "$work/all.doc" "$src/docs/obx.1")
[[ -z $missing ]] || fail "docs/obx.1 lacks: $missing"
echo "PASS: every command's help matches its getopt table; docs/obx.1 is current"

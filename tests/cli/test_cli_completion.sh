#!/usr/bin/env bash
# test_cli_completion.sh OBX COMPLETION_FILE — the bash completion (issue 18): the file the
# build installs is `obx completion bash`; sourced into bash it completes commands,
# subcommands, options (every option of every command's help) and file arguments, and offers
# nothing for an option's non-file argument.
set -euo pipefail
obx=$(realpath "$1") file=$2
work=$(mktemp -d /tmp/obx-completion-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}
"$obx" completion bash | cmp -s - "$file" || fail "$file is not \`obx completion bash\`"
# shellcheck source=/dev/null
source "$file"
grep -q -- "-F _obx obx" <<<"$(complete -p obx)" || fail "sourcing $file registers no completion for obx"

# what bash offers for the command line "$@" (the last word is the one being completed)
comp() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  _obx
  printf '%s\n' "${COMPREPLY[@]}" | sort
}
expect() {
  local want=$1
  shift
  local got
  got=$(comp "$@" | tr '\n' ' ')
  [[ $got == "$want " || ($want == "" && $got == " ") ]] || fail "'$*<TAB>' offers '$got', expected '$want'"
}

expect "relay" obx rel
expect "relay report requeue resolve" obx re
expect "--broker --broker-prop" obx relay --bro
expect "set" obx route s
expect "--max-attempts" obx route set --max
expect "watermark" obx help wat
expect "" obx relay --db ""
cd "$work"
touch relay.yaml relay.env
expect "relay.env relay.yaml" obx relay --config rel
expect "relay.env relay.yaml" obx enqueue --payload-file rel

# every option a command's help lists is offered after "--"
n=0
for c in $("$obx" help | awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on {print $1}'); do
  offered=" $(comp obx "$c" -- | tr '\n' ' ')"
  for o in $("$obx" "$c" --help | awk '/^options:/ {on = 1; next} on && /^$/ {exit} on' | sed -n 's/^  \(-[A-Za-z], \)\{0,1\}\(--[a-z][a-z-]*\).*/\2/p'); do
    [[ $offered == *" $o "* ]] || fail "'obx $c --<TAB>' does not offer $o"
    n=$((n + 1))
  done
done
((n >= 100)) || fail "only $n options seen"
echo "PASS: bash completion of commands, subcommands, $n options and file arguments"

#!/usr/bin/env bash
# test_cli_completion.sh OBX BASH_FILE ZSH_FILE FISH_FILE — the shell completions (issue 18;
# zsh and fish: issue 50), all generated from the command table: each file the build installs
# is `obx completion bash|zsh|fish`; loaded into its shell (zsh's completion system driven on a
# pseudo-terminal by zsh_complete.zsh, fish's `complete -C`) it completes commands,
# subcommands, options (every option of every command's help) and file arguments, and offers
# nothing for an option's non-file argument. zsh and fish are in the test packages
# (scripts/deps.sh test): without them this test fails.
set -euo pipefail
obx=$(realpath "$1") file=$2 zsh_file=$(realpath "$3") fish_file=$(realpath "$4")
here=$(cd "$(dirname "$0")" && pwd)
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
commands() { "$obx" help | awk '/^commands:/ {on = 1; next} on && /^$/ {exit} on {print $1}'; }
# offers_all WHO C OFFERED: fails unless OFFERED (" a b ... ") holds every option C's help lists;
# n counts the options checked
offers_all() {
  local o
  for o in $("$obx" "$2" --help | awk '/^options:/ {on = 1; next} on && /^$/ {exit} on' | sed -n 's/^  \(-[A-Za-z], \)\{0,1\}\(--[a-z][a-z-]*\).*/\2/p'); do
    [[ $3 == *" $o "* ]] || fail "$1'obx $2 --<TAB>' does not offer $o"
    n=$((n + 1))
  done
}
n=0
for c in $(commands); do offers_all "" "$c" " $(comp obx "$c" -- | tr '\n' ' ')"; done
((n >= 100)) || fail "only $n options seen"
echo "ok: bash completion of commands, subcommands, $n options and file arguments"

# ---- zsh and fish: the same table, run in the shells themselves ----
command -v zsh >/dev/null || fail "no zsh (scripts/deps.sh test installs it)"
command -v fish >/dev/null || fail "no fish (scripts/deps.sh test installs it)"
"$obx" completion zsh | cmp -s - "$zsh_file" || fail "$zsh_file is not \`obx completion zsh\`"
"$obx" completion fish | cmp -s - "$fish_file" || fail "$fish_file is not \`obx completion fish\`"
[[ $(head -1 "$zsh_file") == "#compdef obx" ]] || fail "$zsh_file does not start with #compdef obx"
zsh -n "$zsh_file" || fail "zsh -n: $zsh_file"
fish -n "$fish_file" || fail "fish -n: $fish_file"
zcomp() { timeout 30 zsh "$here/zsh_complete.zsh" "$zsh_file" "$*" | sort | tr '\n' ' '; }
fcomp() { fish -c "source $(printf %q "$fish_file"); complete -C $(printf %q "$*")" | cut -f1 | sort | tr '\n' ' '; }
for shell in zsh fish; do
  cf=zcomp
  [[ $shell == fish ]] && cf=fcomp
  expect_in() { # expect_in WANT LINE: the candidates for LINE are exactly WANT
    local want=$1 got
    got=$($cf "$2")
    [[ $got == "$want " || ($want == "" && -z ${got// /}) ]] || fail "$shell: '$2<TAB>' offers '$got', expected '$want'"
  }
  expect_in "relay report requeue resolve" "obx re"
  expect_in "--broker --broker-prop" "obx relay --bro"
  expect_in "set" "obx route s"
  expect_in "--max-attempts" "obx route set --max"
  expect_in "watermark" "obx help wat"
  expect_in "bash fish zsh" "obx completion "
  expect_in "relay.env relay.yaml" "obx relay --config rel"
  expect_in "relay.env relay.yaml" "obx enqueue --payload-file rel"
  expect_in "" "obx relay --db rel"
  # every option a command's help lists is offered after "--" (zsh: a sample of commands; each
  # completion starts a shell on a pseudo-terminal)
  n=0
  for c in $(commands); do
    [[ $shell == zsh && ! $c =~ ^(relay|route|resolve|audit|migrate|consume|status)$ ]] && continue
    offers_all "$shell: " "$c" " $($cf "obx $c --")"
  done
  ((n >= 60)) || fail "$shell: only $n options seen"
  echo "ok: $shell completion of commands, subcommands, $n options and file arguments"
done
echo "PASS: bash, zsh and fish completion from the command table"

#!/usr/bin/env zsh
# zsh_complete.zsh COMPLETION_FILE 'obx rel' — what zsh's completion system offers for a command
# line, one candidate a line: an interactive zsh on a pseudo-terminal (zsh/zpty) with compinit
# and the completion file sourced; TAB runs complete-word, and a compadd wrapper prints every
# candidate that matches the word being completed (builtin compadd -O) instead of adding it.
# Used by test_cli_completion.sh to run `obx completion zsh` for real.
zmodload zsh/zpty || { print -u2 "zsh_complete: no zsh/zpty"; exit 2 }
file=$1 line=$2
setup=$(mktemp /tmp/obx-zsh-XXXXXX)
trap 'rm -f $setup' EXIT
cat >$setup <<EOF
PROMPT=
unsetopt zle_bracketed_paste 2>/dev/null
autoload -U compinit && compinit -u -D
source ${(q)file}
bindkey '^I' complete-word
bindkey '^M' undefined-key
zstyle ':completion:*' insert-tab false
zstyle ':completion:*' list-grouped false
obx_mark() { print -r -- \$'\\\\n'OBX-MARK }
compprefuncs=(obx_mark)
comppostfuncs=(obx_mark)
compadd() {
    # helpers that collect matches for themselves (-O, -A, -D) are left alone
    if [[ " \${(j: :)@} " == *' '-[OAD]' '* ]]; then builtin compadd "\$@"; return; fi
    local -a hits
    builtin compadd -O hits "\$@"
    (( \$#hits )) && print -rl -- "OBX-HIT:"\${^hits}
    builtin compadd "\$@"
}
print OBX-READY
EOF
zpty z zsh -f -i
zpty -w z "source ${(q)setup}"
local out
for i in {1..200}; do
    zpty -r -t z out 2>/dev/null && [[ $out == *OBX-READY* ]] && break
    sleep 0.02
done
zpty -w -n z "$line"$'\t'
marks=0
for i in {1..500}; do
    if zpty -r -t z out 2>/dev/null; then
        [[ $out == *OBX-MARK* ]] && (( ++marks >= 2 )) && break
        [[ $out == *OBX-HIT:* ]] && print -r -- "${${out##*OBX-HIT:}%%$'\r'*}"
    else
        sleep 0.02
    fi
done
zpty -d z
(( marks >= 2 )) || { print -u2 "zsh_complete: no completion ran for '$line'"; exit 3 }

#!/usr/bin/env bash
# test_cli_config_ref.sh OBX — the configuration reference (issue 50, item 8) comes from the
# parser's own table: every key `obx config` dumps is in the man page's CONFIGURATION section and
# in `obx help config` (which is `obx config --help`), each with its default and its range; the
# defaults stated are the ones a relay runs with; every integer key accepts its stated bounds
# and refuses one past each; a key with a fixed set of values refuses another; SEE ALSO names
# the installed documentation (what the build installs into share/doc/obx).
set -u
OBX=$(realpath "${1:?usage: test_cli_config_ref.sh OBX}")
source "$(dirname "$0")/../support/prologue.sh" cfgref
cd "$dir"
"$OBX" config >dump.json
"$OBX" help --man >obx.1
"$OBX" help config >help.txt
"$OBX" config --help | cmp -s - help.txt || bad "obx help config differs from obx config --help"
grep -q '^configuration keys' help.txt || bad "obx help config has no configuration keys"
# the man page's CONFIGURATION section: one .TP entry per key, "\fBkey\fR (summary)"
awk '/^\.SH CONFIGURATION/ {on = 1; next} /^\.SH/ {on = 0} on && prev == ".TP" {print} {prev = $0}' obx.1 |
  sed 's/\\-/-/g; s/\\fB//; s/\\fR//' >man.keys
python3 - dump.json man.keys help.txt <<'PY' || fails=$((fails + 1))
import json, re, sys
dump = json.load(open(sys.argv[1]))
man = {}
for line in open(sys.argv[2]):
    m = re.match(r"(\S+) \((.*)\)$", line.strip())
    assert m, "man page entry: %r" % line
    man[m.group(1)] = m.group(2)
help_txt = open(sys.argv[3]).read().split("configuration keys", 1)[1]
help_keys = re.findall(r"^  ([a-z_.]+)(?: +(\S.*))?$", help_txt, re.M)
help_keys = {k: v for k, v in help_keys}
problems = []
for key, value in dump.items():
    if key not in man:
        problems.append("man page: no %s" % key)
        continue
    if key not in help_keys:
        problems.append("obx help config: no %s" % key)
    summary = man[key]
    kind = summary.split()[0].rstrip(",")
    want_kind = {bool: "boolean", int: "integer", str: "string", list: None}[type(value)]
    if want_kind and kind != want_kind:
        problems.append("%s: man says %s, the dump holds a %s" % (key, kind, want_kind))
    m = re.search(r"default (\S+)$", summary)
    if isinstance(value, bool):
        default = "true" if value else "false"
    elif isinstance(value, (int, str)):
        default = str(value)
    else:
        default = None
    if default and (not m or m.group(1) != default):
        problems.append("%s: the man page's default %r, a relay runs with %r" % (key, m and m.group(1), default))
    if default == "" and m:
        problems.append("%s: the man page states a default %r, the relay has none" % (key, m.group(1)))
    if isinstance(value, int) and not isinstance(value, bool) and not re.search(r"integer -?\d+\.\.\d+", summary):
        problems.append("%s: no range in the man page: %s" % (key, summary))
for key in man:
    if key not in dump:
        problems.append("the man page documents %s, which the configuration does not have" % key)
if len(man) < 40:
    problems.append("only %d keys in the man page" % len(man))
if problems:
    print("FAIL " + "\nFAIL ".join(problems))
    sys.exit(1)
print("ok   %d keys in the man page and obx help config, each with the default a relay runs with" % len(man))
PY
# every integer key: its stated bounds accepted, one past each refused, naming the key
n=0
while read -r key lo hi; do
  for v in "$lo" "$hi"; do
    "$OBX" config --set "$key=$v" >/dev/null 2>&1 || bad "$key=$v (a stated bound) refused"
  done
  for v in $((lo - 1)) $((hi + 1)); do
    out=$("$OBX" config --set "$key=$v" 2>&1)
    [[ $? == 2 && $out == *"$key: $v is outside $lo..$hi"* ]] || bad "$key=$v (past a bound): $out"
  done
  n=$((n + 1))
done < <(sed -n 's/^\([a-z_.]*\) (integer \(-\{0,1\}[0-9]*\)\.\.\([0-9]*\).*/\1 \2 \3/p' man.keys)
((n >= 25)) && echo "ok   $n integer keys: bounds as stated" || bad "only $n integer keys checked"
for key in log.format log.level; do
  values=$(sed -n "s/^$key (string \\([a-z|]*\\).*/\\1/p" man.keys)
  [[ -n $values ]] || bad "$key: no values in the man page"
  for v in ${values//|/ }; do "$OBX" config --set "$key=$v" >/dev/null || bad "$key=$v refused"; done
  out=$("$OBX" config --set "$key=loud" 2>&1)
  [[ $? == 2 && $out == *"$key: 'loud' is not one of $values"* ]] || bad "$key=loud: $out"
done
# SEE ALSO: the installed documentation, each file named installed by the build
see=$(awk '/^\.SH "?SEE ALSO/ {on = 1; next} /^\.SH/ {on = 0} on' obx.1 | sed 's/\\-/-/g')
[[ $see == *"/usr/share/doc/obx"* ]] || bad "SEE ALSO does not point to /usr/share/doc/obx: $see"
[[ $see != *"docs/"* ]] || bad "SEE ALSO names the source tree: $see"
# the build folder is where obx was built (an installed obx has no build folder to install from)
cmake --install "$(dirname "$OBX")" --prefix "$dir/inst" >/dev/null 2>&1 || bad "cmake --install failed"
for f in $(grep -o '[A-Za-z-]*\.md' <<<"$see"); do
  [[ -f $dir/inst/share/doc/obx/$f ]] || bad "SEE ALSO names $f, the install has no share/doc/obx/$f"
done
[[ -f $dir/inst/share/doc/obx/README.md ]] && echo "ok   SEE ALSO's files are installed in share/doc/obx"
if ((fails)); then echo "$fails failed"; exit 1; fi
echo "all passed"

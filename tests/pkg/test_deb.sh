#!/usr/bin/env bash
# test_deb.sh SOURCE_DIR WORK_DIR — the Debian package as an operator meets it (issue 18):
#   1. scripts/package.sh builds obx_VERSION_ARCH.deb; dpkg -i installs it;
#   2. /usr/bin/obx --version, the man page, the bash completion, pkg-config and
#      find_package(obx) against /usr (a program built and run), the conffile, the obx system
#      user and the secret files with their modes;
#   3. systemd-analyze verify accepts obx-relay.service, which has its hardening options;
#   4. the relay runs as the unit would run it (systemd is not PID 1 here): the unit's User,
#      Group, EnvironmentFile, UMask, WorkingDirectory and ExecStart line, started with setpriv;
#      /readyz answers 200, an event enqueued by the obx user is PUBLISHED, the token of
#      http.token_file is needed for a mutating request, SIGTERM stops it with status 0;
#   5. dpkg --purge removes every file of the package, /etc/obx, the user and the group, and
#      keeps /var/lib/obx because an outbox is in it (saying so); the test then removes it.
# It changes the machine (a package, a user), so CI runs it last (scripts/test.sh) and it
# refuses to start where obx is already installed or its user, folders or port exist. Whatever
# happens, the trap stops the relay and purges the package.
set -euo pipefail
src=$(cd "$1" && pwd) work=$2
port=8480 # http.listen of packaging/relay.yaml
fail() {
  echo "FAIL: $*"
  exit 1
}
[[ $(id -u) -eq 0 ]] || fail "needs root (dpkg -i)"
if grep -q installed <<<"$(dpkg-query -W -f='${Status}' obx 2>/dev/null)"; then fail "package obx already installed"; fi
getent passwd obx >/dev/null && fail "a user obx exists already"
[[ ! -e /etc/obx && ! -e /var/lib/obx ]] || fail "/etc/obx or /var/lib/obx exists already"
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "port $port is taken"; fi
version=$(sed -n 's/^project(obx VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
rm -rf "$work"
mkdir -p "$work"

relay=
installed=0
cleanup() {
  [[ -n $relay ]] && kill -KILL "$relay" 2>/dev/null
  if ((installed)); then
    dpkg --purge obx >/dev/null 2>&1 || true
    rm -rf /var/lib/obx
  fi
  return 0
}
trap cleanup EXIT

echo "== build the package (scripts/package.sh)"
deb=$("$src/scripts/package.sh" "$work/build" 2>"$work/package.log" | tail -1) ||
  { tail -30 "$work/package.log"; fail "scripts/package.sh"; }
[[ -f $deb ]] || fail "no .deb: '$deb'"
grep -q libsqlite3 <<<"$(dpkg-deb -f "$deb" Depends)" || fail "the package does not depend on libsqlite3"
grep -q libcurl4 <<<"$(dpkg-deb -f "$deb" Depends)" || fail "the package does not depend on libcurl4 (OpenTelemetry)"

echo "== dpkg -i $(basename "$deb")"
installed=1
dpkg -i "$deb" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "dpkg -i"; }
[[ $(/usr/bin/obx --version) == "obx $version" ]] || fail "/usr/bin/obx --version: $(/usr/bin/obx --version)"
grep -q -- "--http ADDR:PORT" <<<"$(/usr/bin/obx relay --help)" || fail "installed obx relay --help"
[[ -f /usr/share/man/man1/obx.1 ]] || fail "no man page"
[[ -f /usr/share/bash-completion/completions/obx ]] || fail "no bash completion"
[[ -f /usr/share/zsh/vendor-completions/_obx ]] || fail "no zsh completion"
# the man page's SEE ALSO points to the installed documentation: every file it names is there
for f in $(obx help --man | awk '/^\.SH "?SEE ALSO/ {on = 1; next} /^\.SH/ {on = 0} on' | sed 's/\\-/-/g' | grep -o '[A-Za-z-]*\.md'); do
  [[ -f /usr/share/doc/obx/$f ]] || fail "the man page names $f; /usr/share/doc/obx has no such file"
done
[[ -f /usr/share/doc/obx/README.md && -f /usr/share/doc/obx/design.md ]] || fail "no documentation in /usr/share/doc/obx"
[[ -f /usr/share/fish/vendor_completions.d/obx.fish ]] || fail "no fish completion"
[[ $(pkg-config --modversion obx) == "$version" ]] || fail "pkg-config --modversion obx"
[[ $(dpkg-query -W -f='${Conffiles}' obx) == *"/etc/obx/relay.yaml"* ]] || fail "relay.yaml is not a conffile"
cmake -S "$src/tests/pkg/consumer" -B "$work/consumer" >"$work/consumer.log" 2>&1 &&
  cmake --build "$work/consumer" >>"$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; fail "find_package(obx) from /usr"; }
[[ $("$work/consumer/obx_consumer" "$work/consumer.db") == "$version $version evt-"*" PENDING" ]] ||
  fail "a program linked with the installed libobx"
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd obx)
((uid < 1000)) && [[ $home == /var/lib/obx && $shell == /usr/sbin/nologin ]] ||
  fail "user obx: uid $uid, home $home, shell $shell"
[[ $(stat -c '%U:%G %a' /etc/obx/http-token) == "obx:obx 600" ]] || fail "http-token: $(stat -c '%U:%G %a' /etc/obx/http-token)"
[[ $(stat -c '%U %a' /etc/obx/relay.env) == "root 600" ]] || fail "relay.env: $(stat -c '%U %a' /etc/obx/relay.env)"
[[ $(stat -c '%U:%G %a' /var/lib/obx) == "obx:obx 770" ]] || fail "/var/lib/obx: $(stat -c '%U:%G %a' /var/lib/obx)"

echo "== systemd-analyze verify obx-relay.service"
unit=$(dpkg-query -L obx | grep '/systemd/system/obx-relay.service$')
out=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $out"
! grep -q obx-relay <<<"$out" || fail "systemd-analyze verify warns: $out"
for want in User=obx Group=obx "ExecStart=/usr/bin/obx relay --config /etc/obx/relay.yaml" \
  EnvironmentFile=-/etc/obx/relay.env Restart=on-failure StateDirectory=obx NoNewPrivileges=yes \
  Type=notify NotifyAccess=main WatchdogSec=30s TimeoutStartSec=infinity KillMode=mixed \
  TimeoutStopSec=30 RestartPreventExitStatus=2 \
  ProtectSystem=strict ProtectHome=yes PrivateTmp=yes PrivateDevices=yes CapabilityBoundingSet=; do
  grep -qx -- "$want" "$unit" || fail "the unit lacks $want"
done

echo "== the relay as the unit runs it"
key() { sed -n "s/^$1=//p" "$unit" | tail -1; }
user=$(key User) group=$(key Group) exec_start=$(key ExecStart) umask_=$(key UMask) wd=$(key WorkingDirectory)
envfile=$(key EnvironmentFile)
envfile=${envfile#-}
# the environment systemd would give it: its own few variables and the EnvironmentFile's
mapfile -t env_vars < <(grep -Ev '^[[:space:]]*(#|$)' "$envfile" || true)
env_vars+=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "HOME=$wd" "USER=$user" LANG=C.UTF-8)
as_obx() { runuser -u "$user" -- "$@"; }
db=$(/usr/bin/obx config --config /etc/obx/relay.yaml | sed -n 's/^  "db": "\(.*\)",$/\1/p')
[[ $db == sqlite:/var/lib/obx/* ]] || fail "the example configuration's outbox is '$db'"
as_obx /usr/bin/obx init --db "$db" >/dev/null # README: the operator creates the schema
as_obx /usr/bin/obx route set order.created.v1 --db "$db" --cluster local --topic orders >/dev/null
# shellcheck disable=SC2086 # ExecStart is a command line
setpriv --reuid="$user" --regid="$group" --init-groups --no-new-privs --inh-caps=-all \
  --bounding-set=-all env -i "${env_vars[@]}" bash -c "umask $umask_ && cd $wd && exec $exec_start" \
  >"$work/relay.log" 2>&1 &
relay=$!
base=http://127.0.0.1:$port
ready=0
for _ in $(seq 100); do
  [[ $(curl -s -o /dev/null -w '%{http_code}' "$base/readyz") == 200 ]] && { ready=1; break; }
  kill -0 "$relay" 2>/dev/null || break
  sleep 0.2
done
((ready)) || { cat "$work/relay.log"; fail "/readyz never answered 200"; }
[[ $(ps -o user= -p "$relay") == "$user" ]] || fail "the relay runs as $(ps -o user= -p "$relay")"
id=$(echo '{"order":"o-1"}' | as_obx /usr/bin/obx enqueue --db "$db" --type order.created.v1 \
  --aggregate order/o-1@1 --tenant t1 --json | sed -n 's/.*"event_id": *"\([^"]*\)".*/\1/p')
[[ -n $id ]] || fail "enqueue gave no event ID"
published=0
for _ in $(seq 100); do
  grep -q PUBLISHED <<<"$(as_obx /usr/bin/obx inspect "$id" --db "$db")" && { published=1; break; }
  sleep 0.2
done
((published)) || { cat "$work/relay.log"; fail "the relay did not publish $id"; }
# http.token_file: read by the relay as the obx user; without the token a mutation is refused
body='{"event_id":"'$id'"}'
[[ $(curl -s -o /dev/null -w '%{http_code}' -X POST -d "$body" "$base/api/requeue") == 401 ]] ||
  fail "a requeue without the token was not refused"
code=$(curl -s -o "$work/requeue" -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat /etc/obx/http-token)" \
  -H 'Content-Type: application/json' -d "$body" "$base/api/requeue")
[[ $code != 401 && $code != 403 ]] || fail "the token of /etc/obx/http-token was refused ($code)"
[[ $(stat -c '%U:%G' /var/lib/obx/outbox.db) == obx:obx ]] || fail "outbox.db owner: $(stat -c '%U:%G' /var/lib/obx/outbox.db)"
kill -TERM "$relay"
rc=0
wait "$relay" || rc=$?
relay=
((rc == 0)) || { cat "$work/relay.log"; fail "the relay exited $rc on SIGTERM"; }

echo "== dpkg --purge obx"
dpkg-query -L obx | while read -r f; do [[ -d $f ]] || echo "$f"; done >"$work/files"
dpkg --purge obx >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg --purge"; }
installed=0
if grep -q installed <<<"$(dpkg-query -W -f='${Status}' obx 2>/dev/null)"; then fail "still installed"; fi
while read -r f; do [[ ! -e $f && ! -L $f ]] || fail "$f is left after purge"; done <"$work/files"
[[ ! -e /etc/obx ]] || fail "/etc/obx is left: $(ls -A /etc/obx)"
getent passwd obx >/dev/null && fail "user obx is left"
getent group obx >/dev/null && fail "group obx is left"
[[ -f /var/lib/obx/outbox.db ]] && grep -q "kept /var/lib/obx" "$work/purge.log" ||
  fail "purge did not keep the outbox in /var/lib/obx and say so: $(cat "$work/purge.log")"
rm -rf /var/lib/obx
echo "PASS: the package installs, runs the relay as its unit would, and purges cleanly"
rm -rf "$work"

#!/usr/bin/env python3
"""hide_packages.py UPPER PKG... — whiteouts that make /usr look like a machine with only PKG...

Writes, under UPPER (the upper layer of an overlay mounted on /usr), a whiteout (a 0/0 character
device) for every file of every installed package that a fresh Debian 12 machine with only the
given packages installed would not have: the kept set is PKG... plus Essential and
Priority: required packages, closed under Depends and Pre-Depends (alternatives and virtual
packages resolved to what is installed; Recommends are not followed, as scripts/deps.sh installs
with --no-install-recommends). Files outside /usr (merged /bin, /lib, /sbin count as /usr) and
paths a kept package also owns (shared directories, diversions) stay visible.

Prints one summary line and, on stderr, a sample of what it hid. Exit status 1 when a named
package is not installed (the check would prove nothing about it).
"""
import os
import re
import stat
import sys

STATUS = "/var/lib/dpkg/status"
INFO = "/var/lib/dpkg/info"


def read_status():
    """Installed packages: name -> fields (Package, Depends, Pre-Depends, Provides, ...)."""
    pkgs = {}
    with open(STATUS, encoding="utf-8", errors="replace") as f:
        for block in f.read().split("\n\n"):
            fields, key = {}, None
            for line in block.split("\n"):
                if line.startswith((" ", "\t")) and key:
                    fields[key] += "\n" + line
                elif ":" in line:
                    key, _, value = line.partition(":")
                    fields[key] = value.strip()
            if fields.get("Status", "").endswith(" installed") and "Package" in fields:
                pkgs[fields["Package"]] = fields
    return pkgs


def alternatives(field):
    """'a (>= 1) | b, c:any' -> [['a', 'b'], ['c']] (names only)."""
    groups = []
    for group in field.split(","):
        names = [re.split(r"[\s(:\[]", alt.strip(), maxsplit=1)[0] for alt in group.split("|")]
        names = [n for n in names if n]
        if names:
            groups.append(names)
    return groups


def closure(pkgs, roots):
    providers = {}
    for name, f in pkgs.items():
        for group in alternatives(f.get("Provides", "")):
            for virtual in group:
                providers.setdefault(virtual, []).append(name)
    keep, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in keep or name not in pkgs:
            continue
        keep.add(name)
        f = pkgs[name]
        for field in ("Depends", "Pre-Depends"):
            for group in alternatives(f.get(field, "")):
                # every installed alternative counts: which one the fresh machine would get is
                # apt's choice, and hiding the one it picks would fail a build that is fine
                for alt in group:
                    todo.extend([alt] if alt in pkgs else providers.get(alt, []))
    return keep


def files_of(name, pkgs):
    arch = pkgs[name].get("Architecture", "")
    for candidate in (f"{name}:{arch}.list", f"{name}.list"):
        path = os.path.join(INFO, candidate)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                return [line.rstrip("\n") for line in f if line.strip()]
    return []


def under_usr(path):
    for merged in ("/bin/", "/sbin/", "/lib/", "/lib64/", "/lib32/", "/libx32/"):
        if path.startswith(merged):
            return "/usr" + path
    return path if path.startswith("/usr/") else None


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    upper, named = sys.argv[1], sys.argv[2:]
    pkgs = read_status()
    missing = [n for n in named if n not in pkgs]
    if missing:
        print(f"hide_packages: not installed: {' '.join(missing)}", file=sys.stderr)
        return 1
    roots = list(named) + [n for n, f in pkgs.items()
                           if f.get("Essential") == "yes" or f.get("Priority") == "required"]
    keep = closure(pkgs, roots)
    kept_paths = set()
    for name in keep:
        for p in files_of(name, pkgs):
            u = under_usr(p)
            if u:
                kept_paths.add(u)
    hidden, hidden_pkgs = 0, []
    for name in sorted(set(pkgs) - keep):
        n = 0
        for p in files_of(name, pkgs):
            u = under_usr(p)
            if not u or u in kept_paths:
                continue
            if not os.path.lexists(u) or (os.path.isdir(u) and not os.path.islink(u)):
                continue  # directories stay; their files are hidden one by one
            # whiteout the path as the overlay sees it: through symlinked parent folders, so that
            # the upper layer never replaces a symlink with a folder of its own
            parent = os.path.realpath(os.path.dirname(u))
            if not parent.startswith("/usr/"):
                continue
            real = os.path.join(parent, os.path.basename(u))
            if real in kept_paths:
                continue
            target = os.path.join(upper, real[len("/usr/"):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.mknod(target, stat.S_IFCHR | 0o000, os.makedev(0, 0))
                n += 1
        if n:
            hidden += n
            hidden_pkgs.append(name)
    print(f"hide_packages: kept {len(keep)} packages; hid {hidden} files of "
          f"{len(hidden_pkgs)} packages")
    shown = " ".join(hidden_pkgs[:40]) + (" ..." if len(hidden_pkgs) > 40 else "")
    print(f"hide_packages: hidden packages include: {shown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

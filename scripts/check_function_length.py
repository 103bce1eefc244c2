#!/usr/bin/env python3
"""Fails when a C function in src/ is longer than the limit (issue 20, item 9).

Usage: check_function_length.py [--max N] [--allow FILE:FUNC ...] [ROOT]

ROOT defaults to the folder above this script; every ROOT/src/**/*.c is scanned. A function's
length counts the lines from the first line of its declaration (return type and name, at column
0) through its closing `}` at column 0, both included. That relies on the code being
clang-formatted (`check` also runs clang-format), so no C parser is needed: a top-level
declaration ends with a line ending in `{`, contains `(` and no `=` (that would be an
initializer), and its body ends at the next line that is exactly `}`.

Prints `file:line name length` for each function over the limit and exits 1; exits 0 otherwise.
--allow FILE:FUNC (FILE relative to ROOT, e.g. src/engine/inbox.c:process) exempts one
function while someone splits it; an --allow entry that matches no function over the limit is
an error too, so the list cannot outlive the functions it names.
"""
import argparse
import os
import re
import sys

NAME_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\($")
NOT_FUNCTION = ("struct", "union", "enum", "typedef")


def functions(path):
    """Yields (start line, name, length) for each function definition in the file at path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    i = 0
    decl_start = None
    in_comment = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if in_comment:
            if "*/" in line:
                in_comment = False
            i += 1
            continue
        if stripped.startswith("/*") and "*/" not in stripped:
            in_comment = True
            decl_start = None
            i += 1
            continue
        if (not stripped or stripped.startswith("#") or stripped.startswith("//")
                or stripped.startswith("/*")):
            decl_start = None
            i += 1
            continue
        if decl_start is None and not line[0].isspace():
            decl_start = i
        if decl_start is not None and (line.endswith(";") or line.endswith("}")):
            decl_start = None  # a prototype, a global or a one-line function
            i += 1
            continue
        if decl_start is not None and line.rstrip().endswith("{"):
            decl = " ".join(x.strip() for x in lines[decl_start:i + 1])
            head = decl.split("(", 1)[0]
            first = decl.split()[0] if decl.split() else ""
            if "(" in decl and "=" not in head and first not in NOT_FUNCTION:
                m = NAME_RE.search(head + "(")
                end = i + 1
                while end < len(lines) and lines[end] != "}":
                    end += 1
                if m and end < len(lines):
                    yield decl_start + 1, m.group(1), end - decl_start + 1
                    i = end + 1
                    decl_start = None
                    continue
            # a struct, enum or initializer body: skip to its closing line at column 0
            end = i + 1
            while end < len(lines) and not lines[end].startswith("}"):
                end += 1
            i = end + 1
            decl_start = None
            continue
        i += 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=120, help="longest function allowed (lines)")
    ap.add_argument("--allow", action="append", default=[], metavar="FILE:FUNC",
                    help="exempt one function (repeatable)")
    ap.add_argument("root", nargs="?", default=os.path.dirname(here))
    args = ap.parse_args()
    if args.max < 1:
        ap.error("--max must be at least 1")
    allow = set()
    for a in args.allow:
        if ":" not in a:
            ap.error("--allow takes FILE:FUNC, got %r" % a)
        allow.add(a)
    src = os.path.join(args.root, "src")
    if not os.path.isdir(src):
        ap.error("no src/ folder under %s" % args.root)
    failed = False
    used = set()
    count = 0
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(".c"):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, args.root)
            for line, name, length in functions(path):
                count += 1
                if length <= args.max:
                    continue
                key = "%s:%s" % (rel, name)
                if key in allow:
                    used.add(key)
                    continue
                print("%s:%d %s %d" % (rel, line, name, length))
                failed = True
    for stale in sorted(allow - used):
        print("%s: allowed but not over %d lines (remove it from --allow)" % (stale, args.max))
        failed = True
    if count == 0:
        print("check_function_length: no functions found under %s" % src)
        failed = True
    if failed:
        print("check_function_length: functions over %d lines (split them along their phases)"
              % args.max, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

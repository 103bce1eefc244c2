#!/usr/bin/env python3
"""bench/instr_diff.py DIR A B [--self] [--top N]: where variant A's server instructions per
business transaction go beside variant B's, from the backend profiles bench/producer_instr.sh
keeps with OBX_INSTR_KEEP=DIR (DIR/<variant>/20.cg and 80.cg: callgrind files of a backend
that ran 20 and 80 transactions). Per function: (80 - 20) / 60 instructions per transaction,
inclusive of what it calls (--self: its own only), for A, for B and A - B, the largest
differences first (docs/performance.md, "Not done"). Needs callgrind_annotate (valgrind)."""
import argparse
import collections
import re
import subprocess
import sys


def load(path, inclusive):
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=" + ("yes" if inclusive else "no"),
         "--threshold=100", path], capture_output=True, text=True, check=True).stdout
    costs = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
        if m and ":" in m.group(2):
            fn = m.group(2).split(":", 1)[1].split(" [")[0].strip()
            costs[fn] += int(m.group(1).replace(",", ""))
    return costs


def per_txn(d, variant, inclusive):
    c20 = load(f"{d}/{variant}/20.cg", inclusive)
    c80 = load(f"{d}/{variant}/80.cg", inclusive)
    return {k: (c80[k] - c20[k]) / 60 for k in set(c20) | set(c80)}


def main():
    ap = argparse.ArgumentParser(usage=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--self", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    o = ap.parse_args()
    a = per_txn(o.dir, o.a, not o.self)
    b = per_txn(o.dir, o.b, not o.self)
    diff = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    print(f"{'A - B':>10} {o.a:>10} {o.b:>10}  function")
    for k, v in sorted(diff.items(), key=lambda x: -x[1])[:o.top]:
        print(f"{v:10.0f} {a.get(k, 0):10.0f} {b.get(k, 0):10.0f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

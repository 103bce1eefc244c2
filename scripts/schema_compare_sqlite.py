#!/usr/bin/env python3
"""scripts/schema_compare_sqlite.py A.db B.db — whether two SQLite databases hold the same obx
schema (a dev tool, the SQLite side of schema_compare_pg.sh): sqlite_master with each
statement's text normalized (comments dropped, whitespace collapsed: ALTER TABLE ADD COLUMN
appends to the stored CREATE text, a baseline states the column in place), every table's
PRAGMA table_xinfo, index_list, index_xinfo and foreign_key_list, and obx_meta. Prints the
unified diff, or "identical"."""
import re, sqlite3, sys, difflib

def norm(sql):
    if sql is None:
        return None
    sql = re.sub(r'--[^\n]*', ' ', sql)          # comments (no '--' inside obx's literals)
    sql = re.sub(r'\s+', ' ', sql).strip()
    sql = re.sub(r'\s*([(),;])\s*', r'\1', sql)   # spaces around punctuation
    return sql

def describe(path):
    db = sqlite3.connect(path)
    out = []
    rows = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                      "ORDER BY type, name").fetchall()
    for t, n, tbl, sql in rows:
        out.append('master|%s|%s|%s|%s' % (t, n, tbl, norm(sql)))
    for (tbl,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        for r in db.execute('PRAGMA table_xinfo(%s)' % tbl):
            out.append('col|%s|%s' % (tbl, '|'.join(map(str, r))))
        for r in db.execute('PRAGMA index_list(%s)' % tbl):
            out.append('idx|%s|%s' % (tbl, '|'.join(map(str, r[1:]))))
            for c in db.execute('PRAGMA index_xinfo(%s)' % r[1]):
                out.append('idxcol|%s|%s' % (r[1], '|'.join(map(str, c))))
        for r in db.execute('PRAGMA foreign_key_list(%s)' % tbl):
            out.append('fk|%s|%s' % (tbl, '|'.join(map(str, r))))
    out.append('meta|' + repr(db.execute("SELECT key, value FROM obx_meta ORDER BY key").fetchall()))
    return out

a, b = describe(sys.argv[1]), describe(sys.argv[2])
d = list(difflib.unified_diff(a, b, sys.argv[1], sys.argv[2], lineterm='', n=0))
print('\n'.join(d) if d else 'identical (%d lines)' % len(a))

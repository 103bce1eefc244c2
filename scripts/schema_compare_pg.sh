#!/usr/bin/env bash
# scripts/schema_compare_pg.sh URL_BASE DB_A DB_B OUTDIR — whether two PostgreSQL databases hold
# the same obx schema (a dev tool: e.g. one made by `obx init` of a new version against one
# upgraded to it from the last release, or one made by a rewritten baseline against the old).
# URL_BASE is a server URL without its database (postgres://user@host:port). Prints, for each
# phase, the diff or "identical", and leaves the normalized files in OUTDIR:
#   1. pg_dump --schema-only --no-owner -n obx (the \restrict lines dropped);
#   2. the catalog: every function's attributes, definition and effective ACL (a default ACL
#      expanded, grants sorted), every relation's options, RLS flags and ACL, the columns
#      (identity, generated, compression, dropped), constraints (validated or not), triggers,
#      policies, types, the schema's ACL, the obx_pg extension and its members, obx_meta;
#   3. both again after SELECT obx.create_roles('cmp') in each (the roles are the server's; the
#      grants and policies are each database's).
# It changes the databases (the roles' grants); use copies. OBX_PG_BIN: the server's binaries.
set -euo pipefail
base=$1 a=$2 b=$3 out=$4
PGBIN=${OBX_PG_BIN:-/usr/lib/postgresql/15/bin}
mkdir -p "$out"
catalog() {
  psql "$base/$1" -XAtq -v ON_ERROR_STOP=1 <<'SQL'
\pset footer off
SELECT 'fn', p.oid::regprocedure, p.prokind, p.prosecdef, p.provolatile, p.proparallel,
       p.proisstrict, p.proleakproof, p.procost, p.prorows, p.proconfig, p.probin, l.lanname,
       (SELECT array_agg(s ORDER BY s) FROM (SELECT x.grantee::regrole::text || ':' || x.privilege_type || CASE WHEN x.is_grantable THEN '*' ELSE '' END FROM aclexplode(coalesce(p.proacl,
            acldefault('f', p.proowner))) x) t(s)),
       md5(pg_get_functiondef(p.oid))
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'obx'::regnamespace ORDER BY p.oid::regprocedure::text;
SELECT 'fndef', p.oid::regprocedure, pg_get_functiondef(p.oid)
  FROM pg_proc p WHERE p.pronamespace = 'obx'::regnamespace ORDER BY p.oid::regprocedure::text;
SELECT 'rel', c.relname, c.relkind, c.reloptions, c.relrowsecurity, c.relforcerowsecurity,
       (SELECT array_agg(s ORDER BY s) FROM (SELECT x.grantee::regrole::text || ':' || x.privilege_type || CASE WHEN x.is_grantable THEN '*' ELSE '' END FROM aclexplode(coalesce(c.relacl,
            acldefault(CASE WHEN c.relkind = 'S' THEN 's'::"char" ELSE 'r'::"char" END, c.relowner))) x) t(s))
  FROM pg_class c WHERE c.relnamespace = 'obx'::regnamespace ORDER BY 2;
SELECT 'col', c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       a.attidentity, a.attgenerated, a.attcompression, a.attisdropped,
       pg_get_expr(d.adbin, d.adrelid),
       (SELECT array_agg(s ORDER BY s) FROM (SELECT x.grantee::regrole::text || ':' || x.privilege_type || CASE WHEN x.is_grantable THEN '*' ELSE '' END FROM aclexplode(a.attacl) x) t(s))
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'obx'::regnamespace AND a.attnum > 0 AND c.relkind IN ('r', 'v', 'c')
 ORDER BY 2, 3;
SELECT 'con', conrelid::regclass, conname, contype, convalidated, condeferrable, condeferred,
       pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'obx'::regnamespace ORDER BY conrelid::regclass::text, conname;
SELECT 'trg', tgrelid::regclass, tgname, tgenabled, pg_get_triggerdef(oid)
  FROM pg_trigger WHERE tgrelid IN (SELECT oid FROM pg_class
                                    WHERE relnamespace = 'obx'::regnamespace)
   AND NOT tgisinternal ORDER BY tgrelid::regclass::text, tgname;
SELECT 'pol', polrelid::regclass, polname, polcmd, polpermissive,
       (SELECT array_agg(r::regrole::text ORDER BY r::regrole::text) FROM unnest(polroles) r),
       pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid)
  FROM pg_policy ORDER BY polrelid::regclass::text, polname;
SELECT 'type', t.typname, t.typtype,
       (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e
         WHERE e.enumtypid = t.oid)
  FROM pg_type t WHERE t.typnamespace = 'obx'::regnamespace ORDER BY 2;
SELECT 'nsp', n.nspname, (SELECT array_agg(s ORDER BY s) FROM (SELECT x.grantee::regrole::text || ':' || x.privilege_type || CASE WHEN x.is_grantable THEN '*' ELSE '' END FROM aclexplode(
       coalesce(n.nspacl, acldefault('n', n.nspowner))) x) t(s))
  FROM pg_namespace n WHERE n.nspname = 'obx';
SELECT 'ext', e.extname, e.extversion, e.extrelocatable, e.extnamespace::regnamespace
  FROM pg_extension e WHERE e.extname = 'obx_pg';
SELECT 'extobj', pg_describe_object(d.classid, d.objid, d.objsubid)
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = 'obx_pg'
 ORDER BY 2;
SELECT 'meta', key, value FROM obx.obx_meta ORDER BY key;
SQL
}
dump() { "$PGBIN/pg_dump" --schema-only --no-owner -n obx "$base/$1" | grep -v '^\\\(un\)\?restrict '; }
for phase in init roles; do
  if [[ $phase == roles ]]; then
    for db in "$a" "$b"; do psql "$base/$db" -XAtq -v ON_ERROR_STOP=1 -c "SELECT obx.create_roles('cmp')" >/dev/null; done
  fi
  for side in a b; do
    db=${!side}
    dump "$db" > "$out/$phase.$side.dump"
    catalog "$db" > "$out/$phase.$side.catalog"
  done
  echo "== $phase: pg_dump --schema-only --no-owner -n obx ($a vs $b)"
  diff "$out/$phase.a.dump" "$out/$phase.b.dump" && echo "identical" || true
  echo "== $phase: catalog ($a vs $b)"
  diff "$out/$phase.a.catalog" "$out/$phase.b.catalog" && echo "identical" || true
done

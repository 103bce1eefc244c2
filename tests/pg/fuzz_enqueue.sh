#!/usr/bin/env bash
# fuzz_enqueue.sh OBX [SECONDS] — obx.enqueue()'s two bodies under random arguments inside the
# server (issue 53): for SECONDS (default 10, or OBX_PG_FUZZ_SECONDS), on a fresh database of
# OBX_TEST_PG_URL with the obx_pg extension, a PL/pgSQL loop draws each argument from valid
# values, edge values (NULL, '', -1, 2^63-1, +-infinity, multibyte and control characters,
# placeholders, payloads of 0 bytes to 64 KiB) and random text, and calls the PL/pgSQL body
# obx._enqueue_sql(), the C body obx._enqueue_c() and the C body's test build whose counters
# start near 2^31 (obx_pg_counters), each in a subtransaction. Every call must answer as the
# PL/pgSQL body does (both accept, or both refuse with the same SQLSTATE and message); the
# session must survive (a crash of a backend ends every session) and the server log must show
# no backend killed by a signal. Prints the number of calls and outcomes; fails on any mismatch.
set -u
OBX=$(realpath "${1:?usage: fuzz_enqueue.sh OBX [SECONDS]}")
secs=${2:-${OBX_PG_FUZZ_SECONDS:-10}}
source "$(dirname "$0")/../e2e/pgdb.sh"
db=$(pg_fresh_db) || { echo "FAIL: no PostgreSQL (OBX_TEST_PG_URL)"; exit 1; }
trap 'pg_drop_db "$db"' EXIT
log=${OBX_TEST_SERVICES_DIR:+$OBX_TEST_SERVICES_DIR/pg/server.log}
crashes() { if [[ -n $log && -r $log ]]; then grep -c 'terminated by signal' "$log"; else echo 0; fi; }
before=$(crashes)
"$OBX" init --db "$db" | grep -q 'runs in C' || { echo "FAIL: obx init did not create the obx_pg extension"; exit 1; }
"$OBX" route set order.created.v1 --db "$db" --cluster local --topic orders \
  --routing-key '{tenant}.{aggregate_type}.{aggregate_id}' >/dev/null || exit 1
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18; do
  "$OBX" route set "t$i.v1" --db "$db" --cluster local --topic "t$i" >/dev/null || exit 1
done
out=$(psql "$db" -XAtq -v ON_ERROR_STOP=1 -v secs="$secs" 2>&1 <<'SQL'
SET client_min_messages = warning;
SET obx_fuzz.secs = :'secs';
CREATE FUNCTION obx._enqueue_c_counters(text, text, text, bigint, text, bytea, text, text, text,
    text, text, timestamptz) RETURNS text LANGUAGE c VOLATILE
    AS '$libdir/obx_pg_counters', 'obx_pg_enqueue';
CREATE FUNCTION pg_temp.pick(VARIADIC v text[]) RETURNS text LANGUAGE sql AS
    $$ SELECT v[1 + floor(random() * cardinality(v))::int] $$;
-- random text of up to n characters from an alphabet with multibyte, control and placeholder
-- characters; NULL one time in ten
CREATE FUNCTION pg_temp.rtext(n int) RETURNS text LANGUAGE sql AS $$
    SELECT CASE WHEN random() < 0.1 THEN NULL ELSE coalesce(string_agg(substr(
        'abcxyzABC019._-{}/ é€😀' || chr(1) || chr(127) || chr(9),
        1 + floor(random() * 28)::int, 1), ''), '') END
      FROM generate_series(1, floor(random() * (n + 1))::int) $$;
CREATE FUNCTION pg_temp.outcome(fn text, a text[], v bigint, p bytea, occ timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    id text;
BEGIN
    EXECUTE format('SELECT obx.%I($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)', fn) INTO id
      USING a[1], a[2], a[3], v, a[4], p, a[5], a[6], a[7], a[8], a[9], occ;
    RETURN CASE WHEN id ~ '^evt-[0-7][0-9A-HJKMNP-TV-Z]{25}$' THEN 'ok' ELSE 'bad id: ' || coalesce(id, 'NULL') END;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END $$;
DO $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => current_setting('obx_fuzz.secs')::float);
    a text[];
    v bigint;
    p bytea;
    occ timestamptz;
    want text;
    got text;
    fn text;
    n int := 0;
    ok int := 0;
    diffs int := 0;
    w float; -- the chance of each field's wild value: none for half the argument sets
BEGIN
    WHILE clock_timestamp() < deadline LOOP
        w := CASE WHEN random() < 0.5 THEN 0 ELSE 0.3 END;
        a := ARRAY[
            CASE WHEN random() >= w THEN pg_temp.pick('order.created.v1', 't' || (1 + floor(random() * 18)::int) || '.v1')
                 ELSE pg_temp.pick('no.route.v1', 'Order.v1', 'order.created', '', NULL, pg_temp.rtext(20) || '.v1') END,
            CASE WHEN random() >= w THEN 'order' ELSE pg_temp.rtext(140) END,
            CASE WHEN random() >= w THEN pg_temp.pick('o-' || floor(random() * 1000), 'ö/€😀 x{tenant}')
                 ELSE pg_temp.rtext(300) END,
            CASE WHEN random() >= w THEN pg_temp.pick('t1', 'tenant-b', 'a.b_c-d') ELSE pg_temp.rtext(140) END,
            CASE WHEN random() >= w THEN pg_temp.pick(NULL, 'sha256:' || repeat('ab', 32))
                 ELSE pg_temp.pick('sha256:' || repeat('AB', 32), 'md5:x', pg_temp.rtext(80)) END,
            CASE WHEN random() >= w THEN pg_temp.pick(NULL, 'corr-1') ELSE pg_temp.rtext(300) END,
            CASE WHEN random() >= w THEN pg_temp.pick(NULL, 'cause-é') ELSE pg_temp.rtext(300) END,
            CASE WHEN random() >= w THEN pg_temp.pick(NULL, '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')
                 ELSE pg_temp.pick('00-00000000000000000000000000000000-00f067aa0ba902b7-01', pg_temp.rtext(60)) END,
            CASE WHEN random() >= w * 0.3 THEN NULL ELSE pg_temp.rtext(300) END];
        v := CASE WHEN random() >= w THEN floor(random() * 1e6)::bigint
                  ELSE (ARRAY[NULL, -1, 0, 9223372036854775807])[1 + floor(random() * 4)::int] END;
        p := CASE WHEN random() >= w THEN convert_to(CASE WHEN random() < 0.1
                  THEN repeat('x', floor(random() * 65536)::int) ELSE '{"n":' || floor(random() * 1e9) || '}' END, 'UTF8')
                  ELSE (ARRAY[NULL, ''::bytea, '\x00'::bytea])[1 + floor(random() * 3)::int] END;
        occ := CASE WHEN random() >= w THEN (ARRAY[NULL, now() - random() * interval '50 years'])[1 + floor(random() * 2)::int]
                    ELSE (ARRAY['infinity', '-infinity', '1969-12-31 23:59:59.999+00',
                                '10889-08-02 05:31:50.656+00', '10889-08-02 05:31:50.655+00']::timestamptz[])[1 + floor(random() * 5)::int] END;
        want := pg_temp.outcome('_enqueue_sql', a, v, p, occ);
        FOREACH fn IN ARRAY ARRAY['_enqueue_c', '_enqueue_c_counters'] LOOP
            got := pg_temp.outcome(fn, a, v, p, occ);
            IF got IS DISTINCT FROM want THEN
                diffs := diffs + 1;
                IF diffs <= 5 THEN
                    RAISE WARNING 'mismatch: % answered "%", obx._enqueue_sql "%" for %, %, %, %',
                        fn, left(got, 200), left(want, 200), a, v, octet_length(p), occ;
                END IF;
            END IF;
        END LOOP;
        n := n + 1;
        ok := ok + (want = 'ok')::int;
    END LOOP;
    RAISE WARNING 'calls: % argument sets, % accepted, % refused, % mismatches', n, ok, n - ok, diffs;
    IF diffs > 0 OR n = 0 THEN
        RAISE EXCEPTION 'fuzz_enqueue: % mismatches in % argument sets', diffs, n;
    END IF;
END $$;
SELECT 'alive';
SQL
)
rc=$?
echo "$out" | sed 's/^psql:[^ ]* //' | head -20
after=$(crashes)
if ((rc != 0)) || ! grep -q '^alive$' <<<"$out"; then
  echo "FAIL: the fuzz session failed or did not survive"
  exit 1
fi
if ((after != before)); then
  echo "FAIL: the server log shows $((after - before)) backend(s) killed by a signal"
  exit 1
fi
echo "ok: obx.enqueue()'s bodies agree on every argument set for ${secs}s, no crash"

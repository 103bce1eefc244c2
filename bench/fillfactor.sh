#!/usr/bin/env bash
# bench/fillfactor.sh URL FILLFACTOR [CYCLES] [EVENTS]: what obx_event's fillfactor costs on disk
# in the long run, and what it saves in WAL (schema.sql's fillfactor 50; docs/performance.md section 1,
# "Schema version 8"; docs/postgres.md, "Storage").
#
# On database URL (after `obx init`), a scratch copy of obx.obx_event (`ev`: same columns,
# indexes and identity; autovacuum off) at the given fillfactor goes through CYCLES cycles of:
# EVENTS PENDING rows inserted, relayed in batches of 256 the way the relay writes them (claim
# -> SENDING, then -> PUBLISHED, each committed), then VACUUM. After each cycle it prints the
# heap per event held and the WAL per event of the cycle (inserts and both updates, heap and
# indexes). bench_throughput's WAL detail shows the heap only right after a drain, before any
# VACUUM lets later rows reuse the dead space; this shows where it settles. Drops `ev` at the end.
set -euo pipefail
url=${1:?usage: bench/fillfactor.sh URL FILLFACTOR [CYCLES] [EVENTS]}
ff=${2:?usage: bench/fillfactor.sh URL FILLFACTOR [CYCLES] [EVENTS]}
cycles=${3:-20}
n=${4:-20000}
q() { psql -X -q -v ON_ERROR_STOP=1 "$url" "$@"; }
q <<'SQL'
SET client_min_messages = warning;
DROP TABLE IF EXISTS ev;
DROP PROCEDURE IF EXISTS ev_cycle;
CREATE TABLE ev (LIKE obx.obx_event INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING INDEXES)
    WITH (autovacuum_enabled = off);
CREATE PROCEDURE ev_cycle(base int, n int) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO ev (event_id, tenant, idempotency_key, event_type, correlation_id, order_key,
    envelope_gen, state, claim_gen, owner, lease_until, attempt_gen, attempt_id, pinned_partition,
    rejections, available_at, next_check_at, unknown_since, primary_attempt_id, published_at,
    committed_at, updated_at, max_attempts, blind_retry, unordered, alias, dest_cluster)
  SELECT 'evt-' || lpad(i::text, 26, '0'), 'tenant-7', NULL, 'order.created.v1', '',
    'local' || chr(31) || 'orders' || chr(31) || 'tenant-7.order.' || i, 1, 'PENDING', 0, '', 0,
    0, '', -1, 0, 1796192628813, 0, 0, '', 0, 1796192628813, 1796192628813, 8, true, false, 'obx',
    'local' FROM generate_series(base, base + n - 1) i;
  COMMIT;
  FOR b IN 0..(n / 256) LOOP
    UPDATE ev SET state = 'SENDING', claim_gen = 1, owner = 'vm:3862/d1',
      lease_until = 1796192659119, attempt_gen = 1, attempt_id = 'att-' || substr(event_id, 5),
      pinned_partition = 2, updated_at = 1796192629119
      WHERE seq IN (SELECT seq FROM ev WHERE state = 'PENDING' ORDER BY seq LIMIT 256);
    COMMIT;
    UPDATE ev SET state = 'PUBLISHED', owner = '', lease_until = 0,
      primary_attempt_id = attempt_id, published_at = 1796192629165, updated_at = 1796192629165
      WHERE state = 'SENDING';
    COMMIT;
  END LOOP;
END $$;
SQL
q -c "ALTER TABLE ev SET (fillfactor = $ff)"
for c in $(seq 1 "$cycles"); do
  w0=$(q -Atc "SELECT pg_current_wal_lsn()")
  q -c "CALL ev_cycle($(((c - 1) * n + 1)), $n)"
  w1=$(q -Atc "SELECT pg_current_wal_lsn()")
  q -c "VACUUM ev"
  echo "fillfactor $ff, cycle $c: $(q -Atc "SELECT round(pg_relation_size('ev')::numeric / count(*)) || ' heap B/event held, ' || round(pg_wal_lsn_diff('$w1', '$w0') / $n) || ' WAL B/event' FROM ev")"
done
q -c "DROP TABLE ev" -c "DROP PROCEDURE ev_cycle"

-- obx outbox schema, version 3 (PostgreSQL): an attempt's outcome is written in place.
-- Applied after version 2 by pg_store.c's migrate, in the same transaction, under the init
-- advisory lock. No table's meaning changes; docs/performance.md ("Third pass") has the figures.
--
-- Every send inserts an obx_attempt row (SENDING) and, when its outcome arrives, updates it
-- (ACCEPTED, DUPLICATE, REJECTED, ...). Under version 2 that update could never be HOT
-- (heap-only: no new index entries), because the partial index obx_attempt_unknown named
-- `state` in its predicate, so every outcome inserted a new entry into each of the table's
-- three indexes and wrote the whole row into a new page: 12.3 us of server time per event, a
-- tenth of the relay's cost (pg_stat_statements, bench_throughput pg-kafka). Now:
--   * the open-UNKNOWN attempts are indexed through a stored generated column, unknown_open,
--     whose value changes only when an attempt enters or leaves UNKNOWN. PostgreSQL decides
--     HOT by comparing the indexed and predicate columns' old and new values, so the common
--     SENDING -> ACCEPTED update changes none of them;
--   * a HOT update must find room on the row's own page: fillfactor 60 leaves it (an attempt
--     is inserted once and updated once, soon after).
-- Cost of the migration: adding a stored column rewrites obx_attempt under an ACCESS EXCLUSIVE
-- lock, the relays wait: 1.6 s for a million attempts (348 MB with indexes) on the 2-core
-- test machine.
-- Queries that looked for state = 'UNKNOWN' through the old index now say unknown_open: the
-- planner cannot infer one predicate from the other.

ALTER TABLE obx.obx_attempt
    ADD COLUMN unknown_open BOOLEAN GENERATED ALWAYS AS (state = 'UNKNOWN') STORED;
CREATE INDEX obx_attempt_unknown_open ON obx.obx_attempt (attempt_id) WHERE unknown_open;
DROP INDEX obx.obx_attempt_unknown;
ALTER TABLE obx.obx_attempt SET (fillfactor = 60);

-- As version 1's, with the attempts_unknown count through obx_attempt_unknown_open.
CREATE OR REPLACE FUNCTION obx._stats() RETURNS TABLE (k text, v bigint) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('transaction_read_only') = 'off'
       AND (SELECT count(*) FROM (SELECT 1 FROM obx.obx_stat_delta LIMIT 1024) x) >= 1024 THEN
        PERFORM obx._compact_stats();
    END IF;
    RETURN QUERY
        SELECT d.key, sum(d.n)::bigint FROM obx.obx_stat_delta d GROUP BY d.key
        UNION ALL
        SELECT 'oldest_pending', coalesce(min(e.committed_at), 0) FROM obx.obx_event e
         WHERE e.state IN ('PENDING', 'CLAIMED')
        UNION ALL
        SELECT 'oldest_unknown', coalesce(min(e.unknown_since), 0) FROM obx.obx_event e
         WHERE e.state IN ('DISPATCH_UNKNOWN', 'RECONCILING', 'RETRY_CLAIMED') AND e.unknown_since > 0
        UNION ALL
        SELECT 'attempts_unknown', count(*) FROM obx.obx_attempt a JOIN obx.obx_event e
            ON e.event_id = a.event_id
         WHERE a.unknown_open AND e.primary_attempt_id = '';
END $$;

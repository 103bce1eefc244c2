-- obx outbox schema, version 11 (PostgreSQL): a route generation cannot change, and the
-- statistics deltas lose their identity column (issue 19, docs/performance.md section 3,
-- "Schema version 11"). Applied after version 10 by pg_store.c's migrate, in the same
-- transaction, under the init advisory lock. Both are catalogue changes: the upgrade's time
-- does not depend on the outbox's size.
--
--   * obx_route rows are frozen. `obx route set` has always added a generation and never
--     edited one, and events freeze the generation they were enqueued under, but until now
--     the table's owner could edit a generation in place. Then a generation's number no
--     longer said which policy an event got, and the C producer's one-round-trip write
--     (pg_store.c's Q_ENQ_WRITE) had to compare every field of the route row with the copy
--     it cached: 34,000 server instructions per enqueue, in a CTE over the route row. With the
--     row frozen, the generation number stands for all of it and the write compares only that.
--   * obx_stat_delta without `id`. Every statement that inserts or moves events writes a delta
--     row; the identity column cost each of them a sequence step and a primary-key entry
--     (16,000 instructions per C enqueue) for one reader, obx._compact_stats(), which only
--     needs some rows to fold, not the oldest: it now takes them by ctid. Exactness does not
--     change (a delta commits or rolls back with what it counts; the fold deletes and inserts
--     the same sums in one statement).

CREATE TRIGGER obx_route_frozen BEFORE UPDATE OR DELETE ON obx.obx_route
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a route generation cannot change (obx route set adds a new one)');
CREATE TRIGGER obx_route_no_truncate BEFORE TRUNCATE ON obx.obx_route
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: a route generation cannot change (obx route set adds a new one)');

-- Folds up to 10,000 delta rows into one per key. SKIP LOCKED: two folds take disjoint rows and
-- neither waits for, nor blocks, a writer. The rows stay locked by this statement, so their
-- ctids hold until the DELETE.
CREATE OR REPLACE FUNCTION obx._compact_stats() RETURNS void LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    WITH d AS (
        DELETE FROM obx.obx_stat_delta WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM obx.obx_stat_delta LIMIT 10000 FOR UPDATE SKIP LOCKED))
        RETURNING key, n)
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT key, sum(n) FROM d GROUP BY key HAVING sum(n) <> 0;
$$;
ALTER TABLE obx.obx_stat_delta DROP COLUMN id;

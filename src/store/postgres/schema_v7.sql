-- obx outbox schema, version 7 (PostgreSQL): the relay's audit rows batched, and its statistics
-- without triggers (issue 19, docs/performance.md section 1, "Schema version 7"). Applied after
-- version 6 by pg_store.c's migrate, in the same transaction, under the init advisory lock.
-- Nothing already written is rewritten: the upgrade adds a table, a view and grants, replaces
-- obx.create_roles() and drops two triggers, so its duration does not depend on the number of
-- events (bench/upgrade.sh: 73 ms on a million).
--
--   * Audit batches. Per relayed event the relay wrote three obx_audit rows (claimed, attempt
--     registered, published), each a heap tuple and two btree entries: 1,160 of the 4,200 WAL
--     bytes per event. Now every audit write of the obx library (pg_store.c's Q_INS_AUDIT: the
--     relay, the reconciler, sweeps, migrations, operators) is one obx_audit_batch row: the
--     same eleven fields as arrays, one element per transition, in the order written, and the
--     range of the events' seq (passed by the writer, which has the rows; looked up when not).
--     The producer's first row of each event (NONE -> PENDING, from obx.enqueue() and the C
--     enqueue) stays an obx_audit row: obx.producer_events reads it.
--     Per-event, per-transition traceability stays: pg_store.c's Q_LOAD_AUDIT finds an event's
--     batches through the GiST index on the seq range (the event's seq is in the range of every
--     batch that names it) and keeps only the event's elements. A batch's elements are written
--     together, so they share one audit_id, drawn from obx_audit's own sequence: obx_audit
--     rows and batches are in one order (audit_id, then the element's position).
--     obx.obx_audit_all shows both as one row per transition, for SQL by hand.
--   * Statistics without triggers on the relay's path. Version 1's statement triggers on
--     obx_event updates and obx_receipt inserts (PL/pgSQL over transition tables, which copy
--     every changed row) are dropped; the only statements that change an event's state or
--     insert receipts (pg_store.c's Q_UPD_EVENTS and Q_INS_RCPT) append the net delta per key
--     themselves (a data-modifying CTE) and compact now and then, as the triggers did; so the
--     roles that move events may insert into obx_stat_delta and run obx._compact_stats(). The
--     counts stay exact: the delta commits or rolls back with the rows it counts (test_store_pg's
--     check_stats_exact compares them with count(*) after the relay's moves). Anyone changing
--     obx_event.state or inserting receipts by hand must add the delta too (docs/postgres.md).
--     Receipt deletes and truncates keep their triggers: nobody does them on a running system.

DROP TRIGGER obx_event_updated ON obx.obx_event;
DROP FUNCTION obx._event_updated();
DROP TRIGGER obx_receipt_inserted ON obx.obx_receipt;
DROP FUNCTION obx._receipt_inserted();

-- One row per audit write of the obx library: element i of every array is one transition
-- (obx_audit's columns), in the order written. seqs covers the seq of every event named.
CREATE TABLE obx.obx_audit_batch (
    audit_id     BIGINT NOT NULL DEFAULT nextval('obx.obx_audit_audit_id_seq') PRIMARY KEY,
    seqs         INT8RANGE NOT NULL,
    at           BIGINT[] NOT NULL,
    actor        TEXT[] NOT NULL,
    who          TEXT[] NOT NULL,
    event_id     TEXT[] NOT NULL,
    envelope_gen INTEGER[] NOT NULL,
    from_state   TEXT[] NOT NULL,
    to_state     TEXT[] NOT NULL,
    claim_gen    BIGINT[] NOT NULL,
    attempt_id   TEXT[] NOT NULL,
    attempt_gen  INTEGER[] NOT NULL,
    reason       TEXT[] NOT NULL,
    CHECK (cardinality(at) > 0 AND cardinality(actor) = cardinality(at)
       AND cardinality(who) = cardinality(at) AND cardinality(event_id) = cardinality(at)
       AND cardinality(envelope_gen) = cardinality(at)
       AND cardinality(from_state) = cardinality(at) AND cardinality(to_state) = cardinality(at)
       AND cardinality(claim_gen) = cardinality(at) AND cardinality(attempt_id) = cardinality(at)
       AND cardinality(attempt_gen) = cardinality(at) AND cardinality(reason) = cardinality(at))
);
CREATE INDEX obx_audit_batch_seqs ON obx.obx_audit_batch USING gist (seqs);
-- A batch's arrays (7 KB for 100 transitions) are compressed out of line; lz4 costs about half
-- of the default pglz's CPU (measured, docs/performance.md). A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE obx.obx_audit_batch ALTER at SET COMPRESSION lz4, ALTER actor SET COMPRESSION lz4,
        ALTER who SET COMPRESSION lz4, ALTER event_id SET COMPRESSION lz4,
        ALTER envelope_gen SET COMPRESSION lz4, ALTER from_state SET COMPRESSION lz4,
        ALTER to_state SET COMPRESSION lz4, ALTER claim_gen SET COMPRESSION lz4,
        ALTER attempt_id SET COMPRESSION lz4, ALTER attempt_gen SET COMPRESSION lz4,
        ALTER reason SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END $$;
CREATE TRIGGER obx_audit_batch_frozen BEFORE UPDATE OR DELETE ON obx.obx_audit_batch
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: audit rows are evidence and cannot change');
CREATE TRIGGER obx_audit_batch_no_truncate BEFORE TRUNCATE ON obx.obx_audit_batch
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: audit rows are evidence and cannot change');

-- Every audit row, one per transition, in the order written.
CREATE VIEW obx.obx_audit_all AS
    SELECT audit_id, 1::bigint AS ord, at, actor, who, event_id, envelope_gen, from_state,
           to_state, claim_gen, attempt_id, attempt_gen, reason
      FROM obx.obx_audit
    UNION ALL
    SELECT b.audit_id, u.ord, u.at, u.actor, u.who, u.event_id, u.envelope_gen, u.from_state,
           u.to_state, u.claim_gen, u.attempt_id, u.attempt_gen, u.reason
      FROM obx.obx_audit_batch b
     CROSS JOIN LATERAL unnest(b.at, b.actor, b.who, b.event_id, b.envelope_gen, b.from_state,
                               b.to_state, b.claim_gen, b.attempt_id, b.attempt_gen, b.reason)
           WITH ORDINALITY AS u(at, actor, who, event_id, envelope_gen, from_state, to_state,
                                claim_gen, attempt_id, attempt_gen, reason, ord);

-- obx.create_roles(): as in version 4 (renamed obx._create_roles_v4, which it calls), plus
-- the relay's audit batches and statistics, and reading them.
ALTER FUNCTION obx.create_roles(text) RENAME TO _create_roles_v4;
CREATE FUNCTION obx.create_roles(prefix text) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $$
DECLARE
    r text := prefix || '_relay';
    a text := prefix || '_auditor';
BEGIN
    PERFORM obx._create_roles_v4(prefix);
    EXECUTE format('GRANT SELECT, INSERT ON obx.obx_audit_batch TO %I', r);
    EXECUTE format('GRANT SELECT ON obx.obx_audit_all TO %I, %I', r, a);
    EXECUTE format('GRANT USAGE ON SEQUENCE obx.obx_audit_audit_id_seq TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_stat_delta TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION obx._compact_stats() TO %I', r);
    EXECUTE format('GRANT SELECT ON obx.obx_audit_batch TO %I', a);
END $$;
REVOKE ALL ON FUNCTION obx.create_roles(text) FROM PUBLIC;

-- Roles created under earlier versions: whoever may write audit rows writes batches and the
-- statistics delta of its moves; whoever reads audit rows reads batches.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee::regrole::text AS r, a.privilege_type AS p
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'obx.obx_audit'::regclass AND a.privilege_type IN ('INSERT', 'SELECT')
                AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        IF g.p = 'INSERT' THEN
            EXECUTE format('GRANT INSERT ON obx.obx_audit_batch TO %s', g.r);
            EXECUTE format('GRANT USAGE ON SEQUENCE obx.obx_audit_audit_id_seq TO %s', g.r);
            EXECUTE format('GRANT INSERT ON obx.obx_stat_delta TO %s', g.r);
            EXECUTE format('GRANT EXECUTE ON FUNCTION obx._compact_stats() TO %s', g.r);
        ELSE
            EXECUTE format('GRANT SELECT ON obx.obx_audit_batch, obx.obx_audit_all TO %s', g.r);
        END IF;
    END LOOP;
END $$;

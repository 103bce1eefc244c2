-- obx outbox schema, version 15 (PostgreSQL): the relay's checks prepared for less per statement
-- (issue 19, docs/performance.md section 1, "Schema version 15"). Applied after version 14 by
-- pg_store.c's migrate, in the same transaction, under the init advisory lock; catalogue only.
--
-- PostgreSQL prepares a table's CHECK constraints again for every statement that writes it: it
-- parses the stored expression from its text and simplifies it. A relay's batch writes each of
-- these tables once or twice, whatever its size, so at the small batches of a relay that keeps
-- up (2 events at the median at 1,000 ev/s) this preparation was a sixth of the server's
-- instructions per relayed event (bench/relay_instr.sh: 742,000 of 4,620,000 for a batch of
-- one). Every check stays, for every writer, the owner included; only how it is stated changes:
--
--   * obx_audit_batch: its eleven cardinality comparisons (a stored expression of 7,200 bytes,
--     half a million instructions to prepare for each insert) are made by a row trigger
--     instead, whose PL/pgSQL function is compiled once per session. The same rule and the same
--     SQLSTATE (23514, naming obx_audit_batch_check).
--   * The states of obx_attempt and the kinds and sources of obx_receipt: as version 9 did for
--     the event's state, the same values as an enum each and the check a cast to it (a few
--     nodes to prepare; a value outside the list is refused with SQLSTATE 22P02, `invalid
--     input value for enum obx.attempt_state: "..."`, where it was 23514). The columns stay text.
--     NOT VALID: every existing row passed the check this one replaces, and validating would
--     read the whole table; PostgreSQL enforces a NOT VALID check on every row written from now
--     on.
--   * obx_envelope's `envelope_gen >= 1`: folded into the obx_envelope_generation trigger,
--     whose condition becomes `envelope_gen <> 1` (a producer's envelope, generation 1, still
--     fires nothing). One condition prepared per producer statement instead of two.
--   * The identity checks of obx_event and obx_attempt (version 8's AFTER UPDATE triggers) are
--     column triggers now: PostgreSQL considers a trigger declared `UPDATE OF` some columns only
--     for a statement whose SET list names one of them, and otherwise neither prepares its
--     condition (4,200 and 3,000 bytes stored) nor evaluates it. The relay's updates set none
--     of the identity columns, so only the event's destination rule is prepared for them,
--     split off as obx_event_destination_frozen (a third of the condition). A statement that
--     sets an identity column, to any value, meets the same condition and the same refusal
--     (OB001) as before. What a column trigger cannot see is a column changed by another BEFORE
--     UPDATE trigger that is not in the SET list: obx has no such trigger on these tables.

CREATE FUNCTION obx._audit_batch_aligned() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n int := cardinality(NEW.at);
BEGIN
    IF NOT coalesce(n > 0 AND cardinality(NEW.actor) = n AND cardinality(NEW.who) = n
                    AND cardinality(NEW.event_id) = n AND cardinality(NEW.envelope_gen) = n
                    AND cardinality(NEW.from_state) = n AND cardinality(NEW.to_state) = n
                    AND cardinality(NEW.claim_gen) = n AND cardinality(NEW.attempt_id) = n
                    AND cardinality(NEW.attempt_gen) = n AND cardinality(NEW.reason) = n, true) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', SCHEMA = 'obx',
            TABLE = 'obx_audit_batch', CONSTRAINT = 'obx_audit_batch_check',
            MESSAGE = format('obx_audit_batch: every array must hold one element per transition, '
                             'at least one (at: %s, actor: %s, who: %s, event_id: %s, '
                             'envelope_gen: %s, from_state: %s, to_state: %s, claim_gen: %s, '
                             'attempt_id: %s, attempt_gen: %s, reason: %s)',
                             n, cardinality(NEW.actor), cardinality(NEW.who),
                             cardinality(NEW.event_id), cardinality(NEW.envelope_gen),
                             cardinality(NEW.from_state), cardinality(NEW.to_state),
                             cardinality(NEW.claim_gen), cardinality(NEW.attempt_id),
                             cardinality(NEW.attempt_gen), cardinality(NEW.reason));
    END IF;
    RETURN NEW;
END $$;
-- a trigger's function runs without an EXECUTE check for whoever fires it (the relay roles)
REVOKE ALL ON FUNCTION obx._audit_batch_aligned() FROM PUBLIC;
ALTER TABLE obx.obx_audit_batch DROP CONSTRAINT obx_audit_batch_check;
CREATE TRIGGER obx_audit_batch_aligned BEFORE INSERT ON obx.obx_audit_batch
    FOR EACH ROW EXECUTE FUNCTION obx._audit_batch_aligned();

CREATE TYPE obx.attempt_state AS ENUM ('SENDING', 'UNKNOWN', 'ACCEPTED', 'DUPLICATE', 'REJECTED',
    'NOT_FOUND', 'QUARANTINED');
ALTER TABLE obx.obx_attempt DROP CONSTRAINT obx_attempt_state_check,
    ADD CONSTRAINT obx_attempt_state_check CHECK (state::obx.attempt_state IS NOT NULL) NOT VALID;
CREATE TYPE obx.receipt_kind AS ENUM ('PRIMARY', 'DUPLICATE', 'QUARANTINED', 'MIGRATION');
CREATE TYPE obx.receipt_source AS ENUM ('broker', 'lookup', 'consumer', 'operator');
ALTER TABLE obx.obx_receipt DROP CONSTRAINT obx_receipt_kind_check,
    ADD CONSTRAINT obx_receipt_kind_check CHECK (kind::obx.receipt_kind IS NOT NULL) NOT VALID,
    DROP CONSTRAINT obx_receipt_source,
    ADD CONSTRAINT obx_receipt_source CHECK (source::obx.receipt_source IS NOT NULL) NOT VALID;

-- Version 1's function, with the generation's lower bound first (it was the CHECK's).
CREATE OR REPLACE FUNCTION obx._envelope_generation() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    g1 obx.obx_envelope;
BEGIN
    IF NEW.envelope_gen < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', SCHEMA = 'obx',
            TABLE = 'obx_envelope', CONSTRAINT = 'obx_envelope_envelope_gen_check',
            MESSAGE = format('obx_envelope: envelope_gen %s is below 1', NEW.envelope_gen);
    END IF;
    SELECT * INTO g1 FROM obx.obx_envelope e
     WHERE e.event_id = NEW.event_id AND e.envelope_gen = 1;
    IF NOT FOUND OR (g1.aggregate_type, g1.aggregate_id, g1.aggregate_version, g1.event_type,
                     g1.payload_schema, g1.payload_digest, g1.tenant, g1.occurred_at,
                     g1.correlation_id, g1.causation_id, g1.traceparent, g1.idempotency_key,
                     g1.payload_len)
        IS DISTINCT FROM (NEW.aggregate_type, NEW.aggregate_id, NEW.aggregate_version,
                          NEW.event_type, NEW.payload_schema, NEW.payload_digest, NEW.tenant,
                          NEW.occurred_at, NEW.correlation_id, NEW.causation_id, NEW.traceparent,
                          NEW.idempotency_key, NEW.payload_len)
       OR (g1.payload IS NOT NULL AND NEW.payload IS DISTINCT FROM g1.payload) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE =
            'obx: a new envelope generation keeps the envelope of generation 1 (only the destination may change)';
    END IF;
    RETURN NEW;
END $$;
ALTER TABLE obx.obx_envelope DROP CONSTRAINT obx_envelope_envelope_gen_check;
DROP TRIGGER obx_envelope_generation ON obx.obx_envelope;
CREATE TRIGGER obx_envelope_generation BEFORE INSERT ON obx.obx_envelope
    FOR EACH ROW WHEN (NEW.envelope_gen <> 1) EXECUTE FUNCTION obx._envelope_generation();

DROP TRIGGER obx_event_frozen ON obx.obx_event;
CREATE TRIGGER obx_event_frozen AFTER UPDATE OF event_id, seq, tenant, idempotency_key,
    event_type, correlation_id, committed_at ON obx.obx_event FOR EACH ROW
    WHEN (NEW.event_id IS DISTINCT FROM OLD.event_id OR NEW.seq IS DISTINCT FROM OLD.seq
       OR NEW.tenant IS DISTINCT FROM OLD.tenant
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR NEW.event_type IS DISTINCT FROM OLD.event_type
       OR NEW.correlation_id IS DISTINCT FROM OLD.correlation_id
       OR NEW.committed_at IS DISTINCT FROM OLD.committed_at)
    EXECUTE FUNCTION obx._refuse('obx: an event''s identity and frozen destination cannot change');
CREATE TRIGGER obx_event_destination_frozen AFTER UPDATE OF envelope_gen, order_key, dest_cluster
    ON obx.obx_event FOR EACH ROW
    WHEN (NEW.envelope_gen < OLD.envelope_gen
       OR (NEW.envelope_gen = OLD.envelope_gen AND (NEW.order_key IS DISTINCT FROM OLD.order_key
           OR NEW.dest_cluster IS DISTINCT FROM OLD.dest_cluster)))
    EXECUTE FUNCTION obx._refuse('obx: an event''s identity and frozen destination cannot change');
DROP TRIGGER obx_attempt_frozen ON obx.obx_attempt;
CREATE TRIGGER obx_attempt_frozen AFTER UPDATE OF attempt_id, event_id, envelope_gen, attempt_gen,
    claim_gen, owner, dest_digest, started_at ON obx.obx_attempt FOR EACH ROW
    WHEN (NEW.attempt_id IS DISTINCT FROM OLD.attempt_id OR NEW.event_id IS DISTINCT FROM OLD.event_id
       OR NEW.envelope_gen IS DISTINCT FROM OLD.envelope_gen
       OR NEW.attempt_gen IS DISTINCT FROM OLD.attempt_gen
       OR NEW.claim_gen IS DISTINCT FROM OLD.claim_gen OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.dest_digest IS DISTINCT FROM OLD.dest_digest
       OR NEW.started_at IS DISTINCT FROM OLD.started_at)
    EXECUTE FUNCTION obx._refuse('obx: an attempt''s identity and destination cannot change');

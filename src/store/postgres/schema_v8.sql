-- obx outbox schema, version 8 (PostgreSQL): fewer WAL bytes per relayed event (issue 19,
-- docs/performance.md section 1, "Schema version 8"). Applied after version 7 by pg_store.c's
-- migrate, in the same transaction, under the init advisory lock. No row is rewritten: two
-- storage parameters and two triggers change and one index replaces two; building that index
-- is the only step whose time grows with the outbox (bench/upgrade.sh).
--
--   * obx_event's updates stay on their page. An event row changes twice on its way to the
--     broker (claimed, published) and cannot be a HOT update (its state is in the partial
--     indexes' predicates). With fillfactor 100 the new version went to another page: a lock
--     record for the old one, and the whole new row (about 330 bytes) in WAL. With room on the
--     page, PostgreSQL logs only the bytes between the row's unchanged prefix and suffix (the
--     identity columns before state, the frozen destination after updated_at), and no lock
--     record: 669 -> 465 bytes of update and 200 -> 118 of lock records per relayed event
--     (docs/performance.md). Room is left on pages written from now on. Disk: right after a
--     drain the table is smaller (651 against 842 bytes per event, because the old versions
--     are pruned in place instead of leaving dead space behind); once VACUUM has made that
--     dead space reusable, new rows at fillfactor 100 fill it and pages at 50 stay about half
--     full: a long-lived table's heap settles at 1.8 times the size (679 against 371 bytes
--     per event, bench/fillfactor.sh; about 12 % of a whole outbox). An operator who would
--     rather pay WAL than disk sets it back (docs/postgres.md).
--     obx_attempt (fillfactor 60 since version 3) goes to 50: its outcome update is HOT in
--     all cases instead of about nine in ten.
--   * The identity checks of obx_event and obx_attempt run after the row is written. A BEFORE
--     UPDATE row trigger makes PostgreSQL lock the row first (a WAL record per attempt update:
--     the acceptance holds its event's lock, not its attempt's); an AFTER trigger reads the
--     old row without a lock. The conditions and messages are version 1's, and a refused
--     change still fails its statement and leaves the row as it was.
--   * One index on obx_receipt's event ID where there were two. Every primary receipt entered
--     both obx_receipt_primary (event_id, envelope_gen; unique where kind = 'PRIMARY') and
--     obx_receipt_event (event_id; every receipt). The new obx_receipt_primary covers every
--     receipt and keeps the rule: its third key is true for a primary receipt and NULL for
--     the others, and NULLs never conflict, so there is still at most one primary receipt per
--     event and generation (a second one fails with the same unique violation, under the same
--     name), and a lookup by event ID uses its first column. Building it reads every receipt:
--     the one step of this upgrade that grows with the outbox (bench/upgrade.sh).

ALTER TABLE obx.obx_event SET (fillfactor = 50);
ALTER TABLE obx.obx_attempt SET (fillfactor = 50);

DROP INDEX obx.obx_receipt_primary;
DROP INDEX obx.obx_receipt_event;
CREATE UNIQUE INDEX obx_receipt_primary ON obx.obx_receipt
    (event_id, envelope_gen, (CASE WHEN kind = 'PRIMARY' THEN true END));

DROP TRIGGER obx_event_frozen ON obx.obx_event;
CREATE TRIGGER obx_event_frozen AFTER UPDATE ON obx.obx_event FOR EACH ROW
    WHEN (NEW.event_id IS DISTINCT FROM OLD.event_id OR NEW.seq IS DISTINCT FROM OLD.seq
       OR NEW.tenant IS DISTINCT FROM OLD.tenant
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR NEW.event_type IS DISTINCT FROM OLD.event_type
       OR NEW.correlation_id IS DISTINCT FROM OLD.correlation_id
       OR NEW.committed_at IS DISTINCT FROM OLD.committed_at
       OR NEW.envelope_gen < OLD.envelope_gen
       OR (NEW.envelope_gen = OLD.envelope_gen AND (NEW.order_key IS DISTINCT FROM OLD.order_key
           OR NEW.dest_cluster IS DISTINCT FROM OLD.dest_cluster)))
    EXECUTE FUNCTION obx._refuse('obx: an event''s identity and frozen destination cannot change');

DROP TRIGGER obx_attempt_frozen ON obx.obx_attempt;
CREATE TRIGGER obx_attempt_frozen AFTER UPDATE ON obx.obx_attempt FOR EACH ROW
    WHEN (NEW.attempt_id IS DISTINCT FROM OLD.attempt_id OR NEW.event_id IS DISTINCT FROM OLD.event_id
       OR NEW.envelope_gen IS DISTINCT FROM OLD.envelope_gen
       OR NEW.attempt_gen IS DISTINCT FROM OLD.attempt_gen
       OR NEW.claim_gen IS DISTINCT FROM OLD.claim_gen OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.dest_digest IS DISTINCT FROM OLD.dest_digest
       OR NEW.started_at IS DISTINCT FROM OLD.started_at)
    EXECUTE FUNCTION obx._refuse('obx: an attempt''s identity and destination cannot change');

-- obx outbox schema for PostgreSQL 13+: the baseline, schema version 1.
--
-- `obx init` (obx_store_init(); pg_store.c, pg_migrate) runs this file on a database without
-- obx's schema, in one transaction under an advisory lock, and records version 1 in obx.obx_meta.
-- Until obx's first release a schema change edits this file; after it, each change is an upgrade
-- script from the released version (src/store/shared.c runs them in turn).
--
-- Mirrors src/store/sqlite/schema.sql table by table and column by column (same names, so a
-- diagnostic query written for one backend runs on the other with `SET search_path = obx`).
-- What only PostgreSQL has (SQL functions for producers and consumers in any language, statistics
-- as deltas, audit batches, TRUNCATE guards) is explained where it is defined, in the order of the
-- section headings below.
--
-- PostgreSQL prepares a table's CHECK constraints and trigger conditions, and builds every
-- expression of a statement, each time a statement runs; a producer's statement writes one row
-- and a relay's batch is small when it keeps up, so nothing spreads that cost. Hence the forms
-- below: checks as casts to enums, identity checks as column triggers, digests written out
-- (docs/performance.md has the measurements).
--
-- Error codes raised here (mapped by pg_conn.c's obx__pg_map_error):
--   OB001 frozen data (OBX_EIMMUTABLE)        OB002 invalid input (OBX_EINVAL)
--   OB003 over a limit (OBX_ETOOBIG)          OB004 no route, inbox misuse (OBX_ENOROUTE)
--   OB005 a compare-and-set lost (OBX_ECONFLICT)   OB006 a row to update is missing (OBX_ENOTFOUND)
-- Every SECURITY DEFINER function pins search_path and names every object with its schema.

-- The schema is init's own, a superuser's, or a role's that init's role belongs to: its owner
-- may replace any function in it, obx.enqueue()'s body included. pg_store.c (schema_owned)
-- refuses another before init; this refuses one made in between, and anyone running this file
-- by hand in a schema another role owns.
CREATE SCHEMA IF NOT EXISTS obx AUTHORIZATION CURRENT_USER;
DO $$
DECLARE
    owner name := (SELECT o.rolname FROM pg_namespace n JOIN pg_roles o ON o.oid = n.nspowner
                    WHERE n.nspname = 'obx' AND NOT o.rolsuper AND o.rolname <> current_user
                      AND (NOT pg_has_role(current_user, o.oid, 'MEMBER')
                           OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)));
BEGIN
    IF owner IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE =
            format('the schema obx is owned by role %s, not by %s: obx uses only a schema it made',
                   owner, current_user);
    END IF;
END $$;
REVOKE ALL ON SCHEMA obx FROM PUBLIC;

-- schema_version (obx reads it whenever it opens a store), enqueue_impl (pg_store.c's
-- enqueue_impl: which body obx.enqueue() runs) and, when the owner sets one, payload_limit
-- (bytes; obx.enqueue() refuses a larger payload; 1048576 without the row)
CREATE TABLE obx.obx_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Raises OB001 with the trigger's first argument as the message: the frozen-data triggers.
CREATE FUNCTION obx._refuse() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE = TG_ARGV[0];
END $$;

-- ---- routes ------------------------------------------------------------------------------------

-- Route policy: every `obx route set` appends a generation; the highest one per event type is
-- current. Events freeze the generation they were enqueued under, so a generation never changes
-- (not even by the table's owner): its number stands for all of its fields, which lets the C
-- producer compare a cached route by number alone (pg_sql.c, Q_ENQ_WRITE).
CREATE TABLE obx.obx_route (
    gen           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type    TEXT NOT NULL,
    cluster       TEXT NOT NULL,
    topic         TEXT NOT NULL,
    routing_key   TEXT NOT NULL,
    algorithm     TEXT NOT NULL,
    serializer    TEXT NOT NULL,
    durability    TEXT NOT NULL,
    required_acks TEXT NOT NULL,
    max_attempts  INTEGER NOT NULL CHECK (max_attempts > 0),
    blind_retry   BOOLEAN NOT NULL,
    unordered     BOOLEAN NOT NULL,
    alias         TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    -- '' or the key ID the relay seals this generation's payloads with (docs/security.md)
    encrypt_key   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX obx_route_type ON obx.obx_route (event_type, gen);
CREATE TRIGGER obx_route_frozen BEFORE UPDATE OR DELETE ON obx.obx_route
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a route generation cannot change (obx route set adds a new one)');
CREATE TRIGGER obx_route_no_truncate BEFORE TRUNCATE ON obx.obx_route
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: a route generation cannot change (obx route set adds a new one)');

-- A route generation's further destinations, when it declares a delivery set (docs/migration.md;
-- target 1 is the obx_route row itself): the completion rule and up to 7 more targets.
CREATE TABLE obx.obx_route_set (
    route_gen  BIGINT PRIMARY KEY,
    completion TEXT NOT NULL CHECK (completion IN ('all', 'any')),
    targets    INTEGER NOT NULL CHECK (targets BETWEEN 2 AND 8)
);

CREATE TABLE obx.obx_route_target (
    route_gen     BIGINT NOT NULL,
    target_no     INTEGER NOT NULL CHECK (target_no BETWEEN 2 AND 8),
    cluster       TEXT NOT NULL,
    topic         TEXT NOT NULL,
    routing_key   TEXT NOT NULL,
    algorithm     TEXT NOT NULL,
    serializer    TEXT NOT NULL,
    durability    TEXT NOT NULL,
    required_acks TEXT NOT NULL,
    PRIMARY KEY (route_gen, target_no)
);
CREATE TRIGGER obx_route_set_frozen BEFORE UPDATE OR DELETE ON obx.obx_route_set
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a route generation''s delivery set cannot change (set a new generation)');
CREATE TRIGGER obx_route_target_frozen BEFORE UPDATE OR DELETE ON obx.obx_route_target
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a route generation''s delivery set cannot change (set a new generation)');

-- ---- envelopes ---------------------------------------------------------------------------------

-- One row per (event, envelope generation): outboxEnvelope.v1 + destination.v1, frozen.
-- created_by: who enqueued (obx.enqueue(): the session user; the C path: "producer"), on
-- generation 1 of an event whose producer wrote no obx_audit row: read back as the event's first
-- audit row (NONE -> PENDING; pg_sql.c's Q_LOAD_AUDIT, obx.obx_audit_all, obx.producer_events),
-- one row fewer per event. NULL where a writer recorded its own audit row, and on later generations.
CREATE TABLE obx.obx_envelope (
    event_id          TEXT NOT NULL,
    envelope_gen      INTEGER NOT NULL,
    aggregate_type    TEXT NOT NULL,
    aggregate_id      TEXT NOT NULL,
    aggregate_version BIGINT NOT NULL,
    event_type        TEXT NOT NULL,
    payload_schema    TEXT NOT NULL,
    payload_digest    TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    occurred_at       BIGINT NOT NULL,
    created_txid      TEXT NOT NULL,
    correlation_id    TEXT NOT NULL,
    causation_id      TEXT NOT NULL,
    traceparent       TEXT NOT NULL,
    idempotency_key   TEXT NOT NULL,
    envelope_digest   TEXT NOT NULL,
    dest_cluster      TEXT NOT NULL,
    dest_topic        TEXT NOT NULL,
    dest_routing_key  TEXT NOT NULL,
    dest_algorithm    TEXT NOT NULL,
    dest_route_gen    BIGINT NOT NULL,
    dest_serializer   TEXT NOT NULL,
    dest_durability   TEXT NOT NULL,
    dest_acks         TEXT NOT NULL,
    dest_digest       TEXT NOT NULL,
    payload           BYTEA,           -- NULL only after purge (tombstone keeps the digests)
    payload_len       BIGINT NOT NULL,
    created_at        BIGINT NOT NULL,
    created_by        TEXT,
    not_before        BIGINT NOT NULL DEFAULT 0, -- a delayed event's time (ms); 0 = none
    PRIMARY KEY (event_id, envelope_gen)
);

-- Every column but the payload is frozen; the payload may only become NULL (purge). Comparing
-- the whole row with the payload blanked out keeps this true for columns added later.
CREATE FUNCTION obx._envelope_frozen() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o obx.obx_envelope;
    n obx.obx_envelope;
BEGIN
    o := OLD;
    n := NEW;
    o.payload := NULL;
    n.payload := NULL;
    IF o IS DISTINCT FROM n OR (NEW.payload IS NOT NULL AND NEW.payload IS DISTINCT FROM OLD.payload) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE =
            'obx: the frozen envelope and destination cannot change (only a purge may drop the payload)';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER obx_envelope_frozen BEFORE UPDATE ON obx.obx_envelope
    FOR EACH ROW EXECUTE FUNCTION obx._envelope_frozen();
-- A further envelope generation (destination migration, docs/migration.md) changes where an event
-- goes, never what it is: every envelope field of generation 1 is kept, the payload included.
-- Without this, a role allowed to insert generations (the relay) could re-point an event at a
-- forged payload: a rewrite in all but name. It also checks the generation's lower bound, which
-- a CHECK constraint would make every producer's insert prepare; a producer's envelope
-- (generation 1) fires nothing.
CREATE FUNCTION obx._envelope_generation() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
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
                     g1.payload_len, g1.not_before)
        IS DISTINCT FROM (NEW.aggregate_type, NEW.aggregate_id, NEW.aggregate_version,
                          NEW.event_type, NEW.payload_schema, NEW.payload_digest, NEW.tenant,
                          NEW.occurred_at, NEW.correlation_id, NEW.causation_id, NEW.traceparent,
                          NEW.idempotency_key, NEW.payload_len, NEW.not_before)
       OR (g1.payload IS NOT NULL AND NEW.payload IS DISTINCT FROM g1.payload) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE =
            'obx: a new envelope generation keeps the envelope of generation 1 (only the destination may change)';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER obx_envelope_generation BEFORE INSERT ON obx.obx_envelope
    FOR EACH ROW WHEN (NEW.envelope_gen <> 1) EXECUTE FUNCTION obx._envelope_generation();
CREATE TRIGGER obx_envelope_no_delete BEFORE DELETE ON obx.obx_envelope
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: envelopes are never deleted (purge keeps a tombstone)');
CREATE TRIGGER obx_envelope_no_truncate BEFORE TRUNCATE ON obx.obx_envelope
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: envelopes are never deleted (purge keeps a tombstone)');

-- ---- events ------------------------------------------------------------------------------------

-- An event's state, checked as a cast to this enum: the column stays text (nothing that reads or
-- writes it changes), and the check is a few nodes to prepare, where `state IN (ten strings)`
-- was parsed again for every writing statement (75,000 of the 850,000 instructions of a C
-- enqueue). A state outside the list is refused by everyone, the owner included (SQLSTATE 22P02,
-- `invalid input value for enum obx.event_state`).
CREATE TYPE obx.event_state AS ENUM ('PENDING', 'CLAIMED', 'SENDING', 'PUBLISHED', 'RETAINED',
    'PURGED', 'DISPATCH_UNKNOWN', 'RECONCILING', 'RETRY_CLAIMED', 'PARKED', 'CANCELLED');

-- Protocol state of each event (current envelope generation).
-- seq is the per-key order: obx takes an advisory lock on the order key's bucket before drawing
-- it, so that per order key seq order is commit order (see pg_sql.c, Q_INS_EVENT).
-- held_at: when the reconciler (or an operator) held an UNKNOWN event for an operator (its
-- route's UNKNOWN policy, blind_retry false, is "hold" and nothing could prove the outcome past
-- the attempts' quiet time, or the broker holds a copy obx cannot accept); 0 = not held.
CREATE TABLE obx.obx_event (
    seq                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           TEXT NOT NULL UNIQUE,
    tenant             TEXT NOT NULL,
    idempotency_key    TEXT,
    event_type         TEXT NOT NULL,
    correlation_id     TEXT NOT NULL,
    order_key          TEXT NOT NULL,   -- cluster \x1f topic \x1f routing key
    envelope_gen       INTEGER NOT NULL,
    committed_at       BIGINT NOT NULL,
    max_attempts       INTEGER NOT NULL,
    blind_retry        BOOLEAN NOT NULL,
    unordered          BOOLEAN NOT NULL,
    alias              TEXT NOT NULL,
    dest_cluster       TEXT NOT NULL,
    rejections         INTEGER NOT NULL,
    available_at       BIGINT NOT NULL,
    next_check_at      BIGINT NOT NULL,
    unknown_since      BIGINT NOT NULL,
    held_at            BIGINT NOT NULL DEFAULT 0,
    -- the columns a relayed event's two updates change, last and in order (fillfactor, below)
    claim_gen          BIGINT NOT NULL,
    attempt_gen        INTEGER NOT NULL,
    pinned_partition   INTEGER NOT NULL,
    attempt_id         TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state::obx.event_state IS NOT NULL),
    owner              TEXT NOT NULL,
    lease_until        BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    primary_attempt_id TEXT NOT NULL,
    published_at       BIGINT NOT NULL
);
-- Partial indexes: the published bulk (millions of rows) is in none of the claim/sweep indexes.
-- The predicates are written exactly as the queries in pg_sql.c write them, so the planner
-- can match them.
CREATE UNIQUE INDEX obx_event_idem ON obx.obx_event (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The claim's walk (Q_CLAIM): due rows in (available_at, seq) order, so that it stops at the first
-- not-yet-due row and a delayed backlog (not_before far ahead) is never read (issue 51).
CREATE INDEX obx_event_claimable ON obx.obx_event (available_at, seq)
    WHERE state IN ('PENDING', 'CLAIMED');
CREATE INDEX obx_event_unpublished ON obx.obx_event (order_key, seq)
    WHERE state IN ('PENDING','CLAIMED','SENDING','DISPATCH_UNKNOWN','RECONCILING','RETRY_CLAIMED','PARKED');
CREATE INDEX obx_event_inflight ON obx.obx_event (state, lease_until)
    WHERE state IN ('SENDING', 'DISPATCH_UNKNOWN', 'RECONCILING', 'RETRY_CLAIMED');
-- Sweeps of the published bucket (OBX__SEL_PUBLISHED_BEFORE). Partial, unlike SQLite's: the
-- transient states (PENDING -> CLAIMED -> SENDING) never write to it, and a claim cannot pick it.
CREATE INDEX obx_event_state_pub ON obx.obx_event (state, published_at)
    WHERE state IN ('PUBLISHED', 'RETAINED', 'PURGED');
CREATE INDEX obx_event_corr ON obx.obx_event (correlation_id) WHERE correlation_id <> '';
-- Held events are counted, aged and listed (obx status, /metrics, the dashboard) through this.
CREATE INDEX obx_event_held ON obx.obx_event (held_at, seq) WHERE held_at > 0;
-- A queue table: most rows change state a few times soon after insert. Fresh statistics keep the
-- claim on the ordered obx_event_claimable scan (on a never-analyzed table the planner can prefer
-- a bitmap scan and a sort of every claimable row), and frequent vacuums keep it small.
ALTER TABLE obx.obx_event SET (autovacuum_vacuum_scale_factor = 0.02,
                               autovacuum_analyze_scale_factor = 0.02);

-- An event row changes twice on its way to the broker (claimed, published) and cannot be a HOT
-- update (its state is in the partial indexes' predicates). With room on its page, PostgreSQL
-- logs only the bytes between the row's unchanged prefix and suffix and no lock record (669 ->
-- 465 bytes of update and 200 -> 118 of lock records per relayed event). So the columns the two
-- updates change come last, the claim's (claim_gen .. attempt_id) before those both change
-- (state .. updated_at) before the acceptance's (primary_attempt_id, published_at): each update
-- logs only its own span (465 -> 336 bytes per relayed event). The price is disk: a
-- long-lived table's heap settles at 1.8 times the size (bench/fillfactor.sh); an operator who
-- would rather pay WAL than disk sets it back (docs/postgres.md).
ALTER TABLE obx.obx_event SET (fillfactor = 50);

-- An event's identity and frozen destination. AFTER triggers read the old row without locking it
-- (a BEFORE row trigger makes PostgreSQL lock the row first: one WAL record more per update), and
-- `UPDATE OF` columns: PostgreSQL considers such a trigger only for a statement whose SET list
-- names one of them, so the relay's updates, which set none of the identity columns, prepare
-- only the destination rule. A statement that sets an identity column, to any value, meets the
-- condition. (A column trigger cannot see a column changed by another BEFORE UPDATE trigger that
-- is not in the SET list: obx has no such trigger on this table.)
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
CREATE TRIGGER obx_event_no_delete BEFORE DELETE ON obx.obx_event
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: events are never deleted (purge keeps a tombstone)');
CREATE TRIGGER obx_event_no_truncate BEFORE TRUNCATE ON obx.obx_event
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: events are never deleted (purge keeps a tombstone)');

-- ---- delivery sets (docs/migration.md) ---------------------------------------------------------

-- A delivery set is a contract chosen at enqueue time: several destinations, each frozen with its
-- own digest, attempts and publish slot (an ordinary obx_event row; target 1 is the event's own,
-- a further target's row has its own slot ID and carries the event's ID on the wire), and a
-- completion rule ('all' or 'any'). A target added later (a migration) appends a row to
-- obx_delivery_target; nothing is ever rewritten.
CREATE TABLE obx.obx_delivery_set (
    event_id   TEXT PRIMARY KEY,
    completion TEXT NOT NULL CHECK (completion IN ('all', 'any')),
    route_gen  BIGINT NOT NULL,     -- the declaring route generation; 0 = formed by a migration
    created_at BIGINT NOT NULL
);

CREATE TABLE obx.obx_delivery_target (
    slot_id    TEXT PRIMARY KEY,    -- the obx_event row of this target (target 1: event_id)
    event_id   TEXT NOT NULL,       -- the logical event: what brokers and consumers see
    target_no  INTEGER NOT NULL CHECK (target_no BETWEEN 1 AND 8),
    origin     TEXT NOT NULL CHECK (origin IN ('enqueue', 'migration')),
    created_at BIGINT NOT NULL,
    UNIQUE (event_id, target_no)
);
CREATE TRIGGER obx_delivery_set_frozen BEFORE UPDATE OR DELETE ON obx.obx_delivery_set
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract (add a target with obx migrate)');
CREATE TRIGGER obx_delivery_target_frozen BEFORE UPDATE OR DELETE ON obx.obx_delivery_target
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract (add a target with obx migrate)');
CREATE TRIGGER obx_delivery_set_no_truncate BEFORE TRUNCATE ON obx.obx_delivery_set
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract');
CREATE TRIGGER obx_delivery_target_no_truncate BEFORE TRUNCATE ON obx.obx_delivery_target
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract');

-- ---- attempts ----------------------------------------------------------------------------------

-- An attempt's state, checked as a cast (as obx.event_state).
CREATE TYPE obx.attempt_state AS ENUM ('SENDING', 'UNKNOWN', 'ACCEPTED', 'DUPLICATE', 'REJECTED',
    'NOT_FOUND', 'QUARANTINED', 'SUPERSEDED');

-- Every send: registered before it goes out (CLAIMED/RETRY_CLAIMED -> SENDING), and updated in
-- place when its outcome arrives. That update is HOT (heap-only, no new index entries) because
-- no index names a column it changes: the open UNKNOWN attempts are indexed through the stored
-- column unknown_open, whose value changes only when an attempt enters or leaves UNKNOWN
-- (PostgreSQL decides HOT by the indexed and predicate columns' old and new values, and `state`
-- in a predicate would make every outcome a new index entry in each index), and fillfactor 50
-- leaves the row room on its own page. Queries for the open UNKNOWN attempts say unknown_open:
-- the planner cannot infer one predicate from the other.
CREATE TABLE obx.obx_attempt (
    attempt_id    TEXT PRIMARY KEY,
    event_id      TEXT NOT NULL,
    envelope_gen  INTEGER NOT NULL,
    attempt_gen   INTEGER NOT NULL,
    claim_gen     BIGINT NOT NULL,
    owner         TEXT NOT NULL,
    dest_digest   TEXT NOT NULL,
    partition     INTEGER NOT NULL,
    started_at    BIGINT NOT NULL,
    unknown_at    BIGINT NOT NULL,
    offset_before BIGINT NOT NULL,
    quiet_until   BIGINT NOT NULL,
    -- what an accepted attempt's update changes, side by side, as obx_event's
    state         TEXT NOT NULL CHECK (state::obx.attempt_state IS NOT NULL),
    ended_at      BIGINT NOT NULL,
    detail        TEXT NOT NULL,
    unknown_open  BOOLEAN GENERATED ALWAYS AS (state = 'UNKNOWN') STORED
);
ALTER TABLE obx.obx_attempt SET (fillfactor = 50);
CREATE INDEX obx_attempt_event ON obx.obx_attempt (event_id, attempt_gen);
CREATE INDEX obx_attempt_unknown_open ON obx.obx_attempt (attempt_id) WHERE unknown_open;

-- An attempt's identity and destination (AFTER, `UPDATE OF`: as the event's).
CREATE TRIGGER obx_attempt_frozen AFTER UPDATE OF attempt_id, event_id, envelope_gen, attempt_gen,
    claim_gen, owner, dest_digest, started_at ON obx.obx_attempt FOR EACH ROW
    WHEN (NEW.attempt_id IS DISTINCT FROM OLD.attempt_id OR NEW.event_id IS DISTINCT FROM OLD.event_id
       OR NEW.envelope_gen IS DISTINCT FROM OLD.envelope_gen
       OR NEW.attempt_gen IS DISTINCT FROM OLD.attempt_gen
       OR NEW.claim_gen IS DISTINCT FROM OLD.claim_gen OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.dest_digest IS DISTINCT FROM OLD.dest_digest
       OR NEW.started_at IS DISTINCT FROM OLD.started_at)
    EXECUTE FUNCTION obx._refuse('obx: an attempt''s identity and destination cannot change');

-- ---- receipts ----------------------------------------------------------------------------------

-- A receipt's kind (what it did to the publish slot) and source (what proved it), checked as
-- casts (as obx.event_state).
CREATE TYPE obx.receipt_kind AS ENUM ('PRIMARY', 'DUPLICATE', 'QUARANTINED', 'MIGRATION');
CREATE TYPE obx.receipt_source AS ENUM ('broker', 'lookup', 'consumer', 'operator', 'asserted');

-- Receipts: the primary one fills the publish slot (at most one per event and generation);
-- further valid ACKs are duplicate transport receipts; contradicting ones are quarantined;
-- migrations leave a migration receipt. source: 'broker' = the broker's own confirm, 'lookup' =
-- a reconciler's lookup found the message, 'consumer' = a critical consumer's inbox row
-- (evidence), 'operator' = an operator's audited `obx resolve --accept` verified at the broker,
-- 'asserted' = an operator's acceptance on a cluster that cannot be asked (not verified).
CREATE TABLE obx.obx_receipt (
    receipt_id     BIGINT GENERATED ALWAYS AS IDENTITY,   -- the order written; no index (below)
    event_id       TEXT NOT NULL,
    envelope_gen   INTEGER NOT NULL,
    attempt_id     TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind::obx.receipt_kind IS NOT NULL),
    cluster        TEXT NOT NULL,
    topic          TEXT NOT NULL,
    partition      INTEGER NOT NULL,
    "offset"       BIGINT NOT NULL,
    broker_ts      BIGINT NOT NULL,
    payload_digest TEXT NOT NULL,
    dest_digest    TEXT NOT NULL,
    reason         TEXT NOT NULL,
    detail         TEXT,
    created_at     BIGINT NOT NULL,
    source         TEXT NOT NULL DEFAULT 'broker'
        CONSTRAINT obx_receipt_source CHECK (source::obx.receipt_source IS NOT NULL)
);
-- One index by event ID for every receipt, which also keeps the rule: its third key is true for
-- a primary receipt and NULL for the others, and NULLs never conflict, so there is at most one
-- primary receipt per event and generation (a second one is a unique violation of
-- obx_receipt_primary), and a lookup by event ID uses its first column.
CREATE UNIQUE INDEX obx_receipt_primary ON obx.obx_receipt
    (event_id, envelope_gen, (CASE WHEN kind = 'PRIMARY' THEN true END));
-- No index on receipt_id, which only orders rows read by another index (an event's receipts by
-- obx_receipt_primary, the rare kinds by obx_receipt_kind): its entry was 64 bytes of WAL per
-- relayed event (docs/postgres.md, "Storage"). Receipts are never updated, and obx deletes none.
-- The rare receipts obx audit and the stats look for: quarantined, migration, and the primary
-- receipts an operator asserted
CREATE INDEX obx_receipt_kind ON obx.obx_receipt (kind)
    WHERE kind IN ('QUARANTINED', 'MIGRATION') OR source = 'asserted';

CREATE TRIGGER obx_receipt_frozen BEFORE UPDATE ON obx.obx_receipt
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: receipts are evidence and cannot change');

-- ---- audit -------------------------------------------------------------------------------------

-- Who moved what, when, and why: one row per state change (and per refused stale action). The
-- obx library writes its rows as batches (obx_audit_batch, below) and a producer's first row of
-- an event into the envelope (created_by); here go the rows of events that do not exist
-- (pg_sql.c, Q_INS_AUDIT_FIND) and rows written by hand. obx.obx_audit_all shows them all.
CREATE TABLE obx.obx_audit (
    audit_id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           BIGINT NOT NULL,
    actor        TEXT NOT NULL,
    who          TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    envelope_gen INTEGER NOT NULL,
    from_state   TEXT NOT NULL,
    to_state     TEXT NOT NULL,
    claim_gen    BIGINT NOT NULL,
    attempt_id   TEXT NOT NULL,
    attempt_gen  INTEGER NOT NULL,
    reason       TEXT NOT NULL
);
CREATE INDEX obx_audit_event ON obx.obx_audit (event_id);

-- One row per audit write of the obx library (pg_sql.c's Q_INS_AUDIT): the eleven fields as arrays,
-- element i one transition, filed under the range of the events' seq; one row where there were
-- three per relayed event. Q_LOAD_AUDIT finds an event's batches through the GiST index on the
-- range and keeps its elements. A batch's elements share one audit_id from obx_audit's sequence,
-- so obx_audit rows and batches are in one order (audit_id, then the element's position).
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
    reason       TEXT[] NOT NULL
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
-- Every array holds one element per transition, at least one. A row trigger rather than a CHECK
-- constraint: the constraint's eleven comparisons (7,200 bytes stored) were prepared again for
-- every insert, half a million instructions; the function is compiled once per session. The
-- same rule and the same SQLSTATE (23514, naming obx_audit_batch_check).
CREATE FUNCTION obx._audit_batch_aligned() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
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
CREATE TRIGGER obx_audit_batch_aligned BEFORE INSERT ON obx.obx_audit_batch
    FOR EACH ROW EXECUTE FUNCTION obx._audit_batch_aligned();

-- Every audit row, one per transition, in the order written: obx_audit's rows, the batches'
-- elements, and the first row of each event recorded in its envelope (created_by; its audit_id
-- is NULL: it was written with the envelope, before any other row of the event). A security
-- barrier, as every view here (obx.producer_events says why).
CREATE VIEW obx.obx_audit_all WITH (security_barrier) AS
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
                                claim_gen, attempt_id, attempt_gen, reason, ord)
    UNION ALL
    SELECT NULL::bigint, 1::bigint, v.created_at, 'producer', v.created_by, v.event_id, 1,
           'NONE', 'PENDING', 0::bigint, '', 0,
           'enqueued under route generation ' || v.dest_route_gen
      FROM obx.obx_envelope v
     WHERE v.created_by IS NOT NULL AND v.envelope_gen = 1;

-- ---- counters, the cluster registry ------------------------------------------------------------

CREATE TABLE obx.obx_counter (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

-- Each relay registers the cluster it serves, the broker backend behind it and the frozen
-- destination contracts that backend honours, so that `obx route set` can refuse a contract the
-- cluster cannot honour (docs/design.md, "Destination contract").
CREATE TABLE obx.obx_cluster (
    cluster       TEXT PRIMARY KEY,
    backend       TEXT NOT NULL,   -- kafka, amqp, log, sim
    lookup        TEXT NOT NULL CHECK (lookup IN ('authoritative', 'best_effort', 'none')),
    durability    TEXT NOT NULL,   -- comma-separated values this backend honours
    required_acks TEXT NOT NULL,
    serializer    TEXT NOT NULL,   -- '*' = any (carried as the content-type)
    relay         TEXT NOT NULL,   -- the relay that registered it last
    seen_at       BIGINT NOT NULL
);

-- The dashboard's charts (src/drivers/series.c): one sample per slot (a multiple of the sampling
-- interval, ms since the epoch), written by the relay that sampled first, the window's older rows deleted as it goes; read
-- back by a relay that starts, so the charts survive a restart. A few hundred rows at most.
CREATE TABLE obx.obx_series (
    slot   BIGINT PRIMARY KEY,
    at     BIGINT NOT NULL,
    sample TEXT NOT NULL     -- JSON, as series.c encodes it
);

-- Which relay serves which cluster, kept fresh by the relay's heartbeat: a cluster with no row
-- whose live_until is still ahead is served by no live relay, and its PENDING events wait for
-- ever unless someone starts one (`obx status`, /metrics, `obx audit`; docs/operations.md,
-- "Clusters nobody serves"). A relay that stops cleanly ends its rows' live_until at once.
CREATE TABLE obx.obx_relay_cluster (
    relay      TEXT NOT NULL,
    cluster    TEXT NOT NULL,
    seen_at    BIGINT NOT NULL,
    live_until BIGINT NOT NULL,
    PRIMARY KEY (relay, cluster)
);

-- ---- statistics without counting the published bulk -------------------------------------------
-- `SELECT state, count(*)` over millions of PUBLISHED rows takes seconds. Instead every statement
-- that inserts events, changes an event's state or inserts receipts appends one (key, delta) row
-- per key it changed, in the same statement (a data-modifying CTE; 'state:<STATE>',
-- 'receipt:<KIND>'); obx._stats() sums them, exact because a delta commits or rolls back with its
-- rows. Anyone changing obx_event.state or inserting receipts by hand must add the delta too
-- (docs/postgres.md). Insert-only for writers (no lock contention); obx._compact_stats() folds
-- rows into one per key, by ctid.
CREATE TABLE obx.obx_stat_delta (
    key TEXT NOT NULL,
    n   BIGINT NOT NULL
);

-- Folds up to 10,000 delta rows into one per key. SKIP LOCKED: two folds take disjoint rows and
-- neither waits for, nor blocks, a writer. The rows stay locked by this statement, so their
-- ctids hold until the DELETE. The relays run it now and then (pg_sql.c).
CREATE FUNCTION obx._compact_stats() RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    WITH d AS (
        DELETE FROM obx.obx_stat_delta WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM obx.obx_stat_delta LIMIT 10000 FOR UPDATE SKIP LOCKED))
        RETURNING key, n)
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT d.key, sum(d.n) FROM d GROUP BY d.key HAVING sum(d.n) <> 0;
END $$;

CREATE FUNCTION obx._receipt_deleted() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT 'receipt:' || kind, -count(*) FROM obx_old GROUP BY kind;
    RETURN NULL;
END $$;
CREATE TRIGGER obx_receipt_deleted AFTER DELETE ON obx.obx_receipt
    REFERENCING OLD TABLE AS obx_old FOR EACH STATEMENT EXECUTE FUNCTION obx._receipt_deleted();

CREATE FUNCTION obx._receipt_truncated() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM obx.obx_stat_delta WHERE key LIKE 'receipt:%';
    RETURN NULL;
END $$;
CREATE TRIGGER obx_receipt_truncated AFTER TRUNCATE ON obx.obx_receipt
    FOR EACH STATEMENT EXECUTE FUNCTION obx._receipt_truncated();

-- The outbox statistics (obx__store_stats) in one round trip: keys 'state:<STATE>',
-- 'receipt:<KIND>' (and 'receipt:ASSERTED': primary receipts an operator asserted), 'oldest_pending', 'oldest_unknown', 'attempts_unknown', 'held' (events held
-- for an operator) and 'oldest_held'. Compacts first when the delta table has grown (not in a
-- read-only transaction, e.g. on a standby).
CREATE FUNCTION obx._stats() RETURNS TABLE (k text, v bigint) LANGUAGE plpgsql
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
         WHERE e.state IN ('PENDING', 'CLAIMED') -- not a delayed event waiting (shared.h)
           AND NOT (e.state = 'PENDING' AND e.attempt_gen = 0 AND e.available_at > e.committed_at)
        UNION ALL
        SELECT 'oldest_unknown', coalesce(min(e.unknown_since), 0) FROM obx.obx_event e
         WHERE e.state IN ('DISPATCH_UNKNOWN', 'RECONCILING', 'RETRY_CLAIMED') AND e.unknown_since > 0
        UNION ALL
        SELECT 'attempts_unknown', count(*) FROM obx.obx_attempt a JOIN obx.obx_event e
            ON e.event_id = a.event_id
         WHERE a.unknown_open AND e.primary_attempt_id = ''
        UNION ALL
        SELECT 'held', count(*) FROM obx.obx_event e WHERE e.held_at > 0
        UNION ALL
        SELECT 'oldest_held', coalesce(min(e.held_at), 0) FROM obx.obx_event e WHERE e.held_at > 0
        UNION ALL
        SELECT 'receipt:ASSERTED', count(*) FROM obx.obx_receipt r
         WHERE r.source = 'asserted' AND r.kind = 'PRIMARY';
END $$;

-- ---- the relay's batch statements --------------------------------------------------------------

-- The parameters of a relay's batch statements (pg_write.c, build_update_events,
-- build_insert_attempts, build_update_attempts, build_insert_receipts): one array of one of these
-- row types each, column for column, sent in PostgreSQL's binary format (the client reads their
-- type IDs once per connection: rec_oids). One array parameter per column, read with unnest($1,
-- $2, ...), made the server set up a function per array on every execution (about 9,000
-- instructions each, 15 to 21 arrays per statement). Not stored anywhere.
CREATE TYPE obx._event_update AS (
    event_id text, envelope_gen int, state text, claim_gen bigint, owner text,
    lease_until bigint, attempt_gen int, attempt_id text, pinned_partition int, rejections int,
    available_at bigint, next_check_at bigint, unknown_since bigint, primary_attempt_id text,
    published_at bigint, updated_at bigint, order_key text, dest_cluster text,
    expect_state text, expect_claim_gen bigint, held_at bigint);
CREATE TYPE obx._attempt_insert AS (
    attempt_id text, event_id text, envelope_gen int, attempt_gen int, claim_gen bigint,
    owner text, dest_digest text, partition int, state text, started_at bigint,
    unknown_at bigint, ended_at bigint, offset_before bigint, quiet_until bigint, detail text);
CREATE TYPE obx._attempt_update AS (
    attempt_id text, partition int, state text, unknown_at bigint, ended_at bigint,
    offset_before bigint, quiet_until bigint, detail text);
CREATE TYPE obx._receipt_insert AS (
    event_id text, envelope_gen int, attempt_id text, kind text, cluster text, topic text,
    partition int, off bigint, broker_ts bigint, payload_digest text, dest_digest text,
    reason text, detail text, created_at bigint, source text);

-- The write set's own check: a relay transaction sends its write set and COMMIT in one round trip,
-- so the write set's statements call this for a part that did not apply whole (pg_sql.c,
-- WS_CHECK), failing the transaction. Always raises: OB006 when rows were missing, else OB005 (a
-- compare-and-set lost); what and ids name the rows.
CREATE FUNCTION obx._ws_fail(what text, ids text, missing boolean)
RETURNS bigint LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    RAISE EXCEPTION USING ERRCODE = CASE WHEN missing THEN 'OB006' ELSE 'OB005' END,
        MESSAGE = format('obx: %s %s %s', what, ids,
                         CASE WHEN missing THEN 'not found'
                              ELSE 'changed under a locked transaction' END);
END
$f$;

-- ---- canonical encodings and digests (src/core/canon.c; tests/data/digest_vectors.json) -------
-- Each field: u32 big-endian byte length || UTF-8 bytes; integers as decimal ASCII; an absent
-- optional field (NULL) is the empty string.
-- Each function pins search_path, as every function here, so PostgreSQL does not inline it into
-- its caller (a call is a function call); hence no helper per field: each encoding is one
-- expression over its fields, and each digest one call of its encoding. PL/pgSQL, as every
-- function another function of this schema calls: a pinned LANGUAGE sql function is parsed and
-- planned again at every call, where PL/pgSQL keeps its plans for the session
-- (tests/pg/check_pg_schema.sh). Not SECURITY DEFINER:
-- a caller runs them with its own rights (obx._enqueue_targets() for a delivery set's targets;
-- obx._enqueue_sql() writes the encodings out instead, see there).
CREATE FUNCTION obx.dest_canonical(cluster text, topic text, routing_key text, algorithm text,
                                   route_policy_gen bigint, serializer text, durability text,
                                   required_acks text)
RETURNS bytea LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT string_agg(int4send(octet_length(convert_to(coalesce(f, ''), 'UTF8')))
                              || convert_to(coalesce(f, ''), 'UTF8'), ''::bytea ORDER BY i)
              FROM unnest(ARRAY['obx.destination.v1', $1, $2, $3, $4, $5::text, $6, $7, $8])
                   WITH ORDINALITY AS u(f, i));
END $$;

CREATE FUNCTION obx.dest_digest(cluster text, topic text, routing_key text, algorithm text,
                                route_policy_gen bigint, serializer text, durability text,
                                required_acks text)
RETURNS text LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN 'sha256:' || encode(sha256(obx.dest_canonical($1, $2, $3, $4, $5, $6, $7, $8)), 'hex');
END $$;

CREATE FUNCTION obx.envelope_canonical(event_id text, envelope_gen integer, aggregate_type text,
                                       aggregate_id text, aggregate_version bigint,
                                       event_type text, payload_schema text,
                                       payload_digest text, tenant text, occurred_at bigint,
                                       created_txid text, correlation_id text,
                                       causation_id text, traceparent text,
                                       idempotency_key text)
RETURNS bytea LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT string_agg(int4send(octet_length(convert_to(coalesce(f, ''), 'UTF8')))
                              || convert_to(coalesce(f, ''), 'UTF8'), ''::bytea ORDER BY i)
              FROM unnest(ARRAY['obx.outboxEnvelope.v1', $1, $2::text, $3, $4, $5::text, $6, $7,
                                $8, $9, $10::text, $11, $12, $13, $14, $15])
                   WITH ORDINALITY AS u(f, i));
END $$;

CREATE FUNCTION obx.envelope_digest(event_id text, envelope_gen integer, aggregate_type text,
                                    aggregate_id text, aggregate_version bigint, event_type text,
                                    payload_schema text, payload_digest text, tenant text,
                                    occurred_at bigint, created_txid text, correlation_id text,
                                    causation_id text, traceparent text, idempotency_key text)
RETURNS text LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN 'sha256:' || encode(sha256(obx.envelope_canonical($1, $2, $3, $4, $5, $6, $7, $8, $9,
                                                             $10, $11, $12, $13, $14, $15)), 'hex');
END $$;

-- ---- obx.enqueue(): the producer path in SQL ---------------------------------------------------

-- The documented input set (src/core/validate.c), with the same messages as obx__check_field.
-- cs: 'name' [A-Za-z0-9._-], 'event_type' [a-z0-9._-] ending in .v<N>, 'text' UTF-8 without
-- control characters (a text value in a UTF8 database is valid UTF-8 already).
CREATE FUNCTION obx._check(name text, v text, min_len integer, max_len integer, cs text)
RETURNS void LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    ok integer;
    allowed text;
    descr text;
BEGIN
    IF v IS NULL THEN
        IF min_len = 0 THEN
            RETURN;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('%s: missing (required, %s..%s bytes)', name, min_len, max_len);
    END IF;
    n := octet_length(v);
    IF n < min_len THEN
        IF n = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = format('%s: empty (required, %s..%s bytes)', name, min_len, max_len);
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('%s: %s bytes, at least %s required', name, n, min_len);
    END IF;
    IF n > max_len THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003',
            MESSAGE = format('%s: %s bytes, over the limit of %s', name, n, max_len);
    END IF;
    CASE cs
        WHEN 'name' THEN allowed := '[A-Za-z0-9._-]'; descr := '[A-Za-z0-9._-]';
        WHEN 'event_type' THEN allowed := '[a-z0-9._-]'; descr := '[a-z0-9._-] ending in .v<N>';
        ELSE allowed := '[^\x01-\x1f\x7f]'; descr := 'UTF-8 text without control characters';
    END CASE;
    -- length of the longest valid prefix, in characters; the first byte after it is reported
    ok := length(substring(v COLLATE "C" FROM '^' || allowed || '*'));
    IF ok < length(v) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('%s: byte 0x%s at offset %s is outside the allowed set %s', name,
                             lpad(to_hex(get_byte(convert_to(substr(v, ok + 1, 1), 'UTF8'), 0)), 2, '0'),
                             octet_length(left(v, ok)), descr);
    END IF;
    IF cs = 'event_type' AND v !~ '\.v[0-9]+$' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('%s: ''%s'' is not versioned (must end in .v<N>, e.g. order.created.v2)', name, v);
    END IF;
END $$;

-- The event ID for millisecond ms: "evt-" + a ULID, ten Crockford base-32 digits of time and 16
-- upper-case hexadecimal digits of randomness (bytes 9..16 of a random UUID, 62 bits), still a
-- ULID for src/core/ulid.c; obx_event's unique index on event_id refuses a collision. PL/pgSQL
-- evaluates the expression without a plan of its own. Not a LANGUAGE sql function: pinned to
-- search_path (as every function here), one is never inlined and is parsed and planned again
-- at every call, about 730,000 instructions per enqueue of obx._enqueue_sql()
-- (docs/performance.md, section 3; tests/pg/check_pg_schema.sh keeps the enqueue's body free of
-- them). obx._enqueue_sql() and the further targets of a delivery set draw their IDs here.
CREATE FUNCTION obx._event_id(ms bigint) RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r bytea := uuid_send(gen_random_uuid());
BEGIN
    IF ms < 0 OR ms >= (1::bigint << 48) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002', MESSAGE = format('ULID time %s out of range', ms);
    END IF;
    RETURN 'evt-'
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 45) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 40) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 35) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 30) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 25) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 20) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 15) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 10) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((ms >> 5) & 31)::int + 1, 1)
           || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', (ms & 31)::int + 1, 1)
           || upper(encode(substr(r, 9, 8), 'hex'));
END $$;

-- Routing-key template expansion (obx__routing_key_expand), as obx.enqueue() does it: only the
-- four placeholders, the aggregate ID (free text) substituted last so that it is never expanded.
CREATE FUNCTION obx._routing_key(tpl text, tenant text, aggregate_type text, aggregate_id text,
                                 event_type text)
RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rk text;
BEGIN
    IF strpos(replace(replace(replace(replace(tpl, '{tenant}', ''), '{aggregate_type}', ''),
                               '{aggregate_id}', ''), '{event_type}', ''), '{') > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('routing_key: unknown placeholder in template ''%s'' (known: {tenant} {aggregate_type} {aggregate_id} {event_type})', tpl);
    END IF;
    rk := replace(replace(replace(replace(tpl, '{tenant}', tenant), '{aggregate_type}', aggregate_type),
                          '{event_type}', event_type), '{aggregate_id}', aggregate_id);
    IF octet_length(rk) > 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003', MESSAGE = 'routing_key: expands to more than 255 bytes';
    END IF;
    RETURN rk;
END $$;

-- The further targets of event `id`, when the route generation it froze declares a delivery
-- set and the event has none yet (a retried command that got its first event back has its set
-- already). Same rows as the C path (src/engine/enqueue.c): per target a slot (event row with
-- its own ID and no idempotency key, envelope copy under that ID with the logical envelope's
-- digest and the target's frozen destination), the set and target rows, one audit row per slot,
-- and the statistics delta of the slots.
CREATE FUNCTION obx._enqueue_targets(id text) RETURNS void LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ev obx.obx_event;
    env obx.obx_envelope;
    rs obx.obx_route_set;
    t obx.obx_route_target;
    now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    mid text;
    rk text;
    ddigest text;
    okey text;
BEGIN
    SELECT * INTO env FROM obx.obx_envelope v WHERE v.event_id = id AND v.envelope_gen = 1;
    SELECT * INTO rs FROM obx.obx_route_set s WHERE s.route_gen = env.dest_route_gen;
    IF NOT FOUND OR EXISTS (SELECT 1 FROM obx.obx_delivery_set d WHERE d.event_id = id) THEN
        RETURN;
    END IF;
    SELECT * INTO ev FROM obx.obx_event e WHERE e.event_id = id;
    INSERT INTO obx.obx_delivery_set (event_id, completion, route_gen, created_at)
    VALUES (id, rs.completion, rs.route_gen, now_ms);
    INSERT INTO obx.obx_delivery_target (slot_id, event_id, target_no, origin, created_at)
    VALUES (id, id, 1, 'enqueue', now_ms);
    FOR t IN SELECT * FROM obx.obx_route_target x WHERE x.route_gen = rs.route_gen
             ORDER BY x.target_no LOOP
        rk := obx._routing_key(t.routing_key, env.tenant, env.aggregate_type, env.aggregate_id,
                               env.event_type);
        ddigest := obx.dest_digest(t.cluster, t.topic, rk, t.algorithm, rs.route_gen,
                                   t.serializer, t.durability, t.required_acks);
        okey := t.cluster || chr(31) || t.topic || chr(31) || rk;
        mid := obx._event_id(now_ms);
        -- per order key, seq order is commit order (pg_sql.c, Q_INS_EVENT)
        PERFORM CASE WHEN coalesce(nullif(current_setting('obx.order_locks', true), ''), '0')::int < 64
                     THEN pg_advisory_xact_lock_shared(5194328, hashtext(okey) & 1023)::text
                          || pg_advisory_xact_lock(hashtextextended(okey, 5194328))::text
                          || set_config('obx.order_locks', (coalesce(nullif(current_setting(
                                 'obx.order_locks', true), ''), '0')::int + 1)::text, true)
                     ELSE pg_advisory_xact_lock(5194328, hashtext(okey) & 1023)::text END;
        INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, correlation_id,
            order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen,
            attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since,
            primary_attempt_id, published_at, committed_at, updated_at, max_attempts,
            blind_retry, unordered, alias, dest_cluster)
        VALUES (mid, ev.tenant, NULL, ev.event_type, ev.correlation_id, okey, 1, 'PENDING', 0,
            '', 0, 0, '', -1, 0, ev.available_at, 0, 0, '', 0, now_ms, now_ms, ev.max_attempts,
            ev.blind_retry, ev.unordered, ev.alias, t.cluster);
        INSERT INTO obx.obx_stat_delta (key, n) VALUES ('state:PENDING', 1);
        INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id,
            aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at,
            created_txid, correlation_id, causation_id, traceparent, idempotency_key,
            envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm,
            dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload,
            payload_len, created_at, not_before)
        VALUES (mid, 1, env.aggregate_type, env.aggregate_id, env.aggregate_version,
            env.event_type, env.payload_schema, env.payload_digest, env.tenant, env.occurred_at,
            env.created_txid, env.correlation_id, env.causation_id, env.traceparent,
            env.idempotency_key, env.envelope_digest, t.cluster, t.topic, rk, t.algorithm,
            rs.route_gen, t.serializer, t.durability, t.required_acks, ddigest, env.payload,
            env.payload_len, now_ms, env.not_before);
        INSERT INTO obx.obx_delivery_target (slot_id, event_id, target_no, origin, created_at)
        VALUES (mid, id, t.target_no, 'enqueue', now_ms);
        INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, from_state, to_state,
            claim_gen, attempt_id, attempt_gen, reason)
        VALUES (now_ms, 'producer', session_user::text, mid, 1, 'NONE', 'PENDING', 0, '', 0,
            format('target %s of delivery set %s, enqueued under route generation %s',
                   t.target_no, id, rs.route_gen));
    END LOOP;
END $$;

-- An idempotency key names one business command's event within its tenant (the key is unique
-- per tenant): a retry with the same event type, aggregate and payload gets the first event's ID
-- (returned here); anything else under a taken key is another event, refused with OB005 (as
-- src/engine/enqueue.c, idem_same), never answered with the first event's ID (docs/postgres.md,
-- "Idempotency keys").
CREATE FUNCTION obx._idem_same(existing text, key text, tenant text, event_type text,
                               aggregate_type text, aggregate_id text, aggregate_version bigint,
                               payload bytea)
RETURNS text LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v obx.obx_envelope;
    diff text;
BEGIN
    SELECT * INTO v FROM obx.obx_envelope e WHERE e.event_id = existing AND e.envelope_gen = 1;
    diff := CASE WHEN v.event_type IS DISTINCT FROM event_type THEN 'event_type'
                 WHEN (v.aggregate_type, v.aggregate_id, v.aggregate_version)
                      IS DISTINCT FROM (aggregate_type, aggregate_id, aggregate_version)
                      THEN 'aggregate'
                 WHEN v.payload_digest IS DISTINCT FROM 'sha256:' || encode(sha256(payload), 'hex')
                      THEN 'payload' END;
    IF diff IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'OB005', MESSAGE = format(
            'idempotency_key: %L of tenant %L is taken by event %s with another %s',
            key, tenant, existing, diff);
    END IF;
    RETURN existing;
END $$;

-- obx.enqueue()'s PL/pgSQL body. Validates like obx_enqueue() (same limits, character sets and
-- messages), honours the idempotency key, resolves the current route, freezes the destination,
-- and inserts the envelope (created_by), the PENDING event, its delivery-set targets and its
-- statistics delta inside the caller's transaction; returns the event ID. The payload limit is
-- obx.obx_meta's 'payload_limit' (a row only the schema's owner may write), 1 MiB without it.
-- The digests are the canonical encodings above written out once per field (no field is NULL
-- here, databases are UTF8): test_sql_enqueue_matches_c recomputes them in C. A waiting relay is
-- woken through obx._wake() (docs/postgres.md, "NOTIFY"). SECURITY INVOKER without a search_path:
-- it runs only inside obx.enqueue()'s SECURITY DEFINER and search_path.
CREATE FUNCTION obx._enqueue_sql(event_type text, aggregate_type text, aggregate_id text,
                            aggregate_version bigint, tenant text, payload bytea,
                            payload_schema text DEFAULT NULL, correlation_id text DEFAULT NULL,
                            causation_id text DEFAULT NULL, traceparent text DEFAULT NULL,
                            idempotency_key text DEFAULT NULL,
                            occurred_at timestamptz DEFAULT NULL,
                            not_before timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    p_type text := event_type;
    p_atype text := aggregate_type;
    p_aid text := aggregate_id;
    p_aver bigint := aggregate_version;
    p_tenant text := tenant;
    p_payload bytea := payload;
    p_schema text := payload_schema;
    p_corr text := coalesce(correlation_id, '');
    p_cause text := coalesce(causation_id, '');
    p_trace text := coalesce(traceparent, '');
    p_key text := coalesce(idempotency_key, '');
    p_occurred timestamptz := occurred_at;
    p_nb timestamptz := not_before;
    nb_ms bigint := 0; -- a delayed event's time (obx_event.not_before_ms): 0 = no delay
    limit_bytes bigint := coalesce((SELECT m.value FROM obx.obx_meta m WHERE m.key = 'payload_limit')::bigint, 1048576);
    now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    occ_ms bigint;
    rt record;
    existing text;
    notified text;
    id text;
    tpl text;
    rk text;
    okey text;
BEGIN
    -- the common case, every field valid, in one expression; otherwise obx._check() finds the
    -- first bad field and says what is wrong with it. Lengths by octet_length(), character
    -- sets by unbounded classes: a bounded repetition ({1,128}) cost 15 times as much.
    IF NOT coalesce(octet_length(p_type) BETWEEN 1 AND 128 AND octet_length(p_atype) BETWEEN 1 AND 128
           AND octet_length(p_tenant) BETWEEN 1 AND 128
           AND p_type COLLATE "C" ~ '^[a-z0-9._-]+\.v[0-9]+$'
           AND (p_atype || p_tenant) COLLATE "C" ~ '^[A-Za-z0-9._-]+$'
           AND octet_length(p_aid) BETWEEN 1 AND 255 AND octet_length(p_corr) <= 255
           AND octet_length(p_cause) <= 255 AND octet_length(p_key) <= 255
           AND (p_aid || p_corr || p_cause || p_key) COLLATE "C" !~ '[\x01-\x1f\x7f]', false) THEN
        PERFORM obx._check('event_type', p_type, 1, 128, 'event_type');
        PERFORM obx._check('aggregate_type', p_atype, 1, 128, 'name');
        PERFORM obx._check('aggregate_id', p_aid, 1, 255, 'text');
        PERFORM obx._check('tenant', p_tenant, 1, 128, 'name');
        PERFORM obx._check('correlation_id', p_corr, 0, 255, 'text');
        PERFORM obx._check('causation_id', p_cause, 0, 255, 'text');
        PERFORM obx._check('idempotency_key', p_key, 0, 255, 'text');
    END IF;
    IF p_aver IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002', MESSAGE = 'aggregate_version: missing (required, >= 0)';
    END IF;
    IF p_aver < 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('aggregate_version: %s is negative (must be >= 0)', p_aver);
    END IF;
    occ_ms := CASE WHEN p_occurred IS NULL THEN now_ms
                   ELSE floor(extract(epoch FROM p_occurred) * 1000)::bigint END;
    IF occ_ms < 0 OR occ_ms >= (1::bigint << 48) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('occurred_at: %s ms outside 0..2^48', occ_ms);
    END IF;
    IF p_nb IS NOT NULL THEN
        nb_ms := floor(extract(epoch FROM p_nb) * 1000)::bigint;
        IF nb_ms < 0 OR nb_ms >= (1::bigint << 48) THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = format('not_before_ms: %s outside 0..2^48', nb_ms);
        END IF;
        IF nb_ms - now_ms > 31622400000 THEN -- OBX_DELAY_MAX_MS
            RAISE EXCEPTION USING ERRCODE = 'OB003',
                MESSAGE = format('not_before_ms: %s ms after now, over the maximum delay of 31622400000 ms (366 days)', nb_ms - now_ms);
        END IF;
    END IF;
    IF p_schema IS NOT NULL AND NOT (octet_length(p_schema) = 71
                                     AND p_schema COLLATE "C" ~ '^sha256:[0-9a-f]+$') THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = 'payload_schema: must be "sha256:" + 64 lowercase hex';
    END IF;
    IF p_trace <> '' AND NOT (octet_length(p_trace) = 55
                              AND p_trace COLLATE "C" ~ '^[0-9a-f]+-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'
                              AND substr(p_trace, 3, 1) = '-' AND substr(p_trace, 36, 1) = '-'
                              AND substr(p_trace, 53, 1) = '-') THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = 'traceparent: not W3C "00-<32 hex>-<16 hex>-<2 hex>" (55 bytes)';
    END IF;
    IF p_payload IS NULL OR octet_length(p_payload) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('payload: empty (1..%s bytes required)', limit_bytes);
    END IF;
    IF octet_length(p_payload) > limit_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003',
            MESSAGE = format('payload: %s bytes, over the limit of %s bytes', octet_length(p_payload), limit_bytes);
    END IF;

    -- a retried business command gets its first event back (before the route: a route removed
    -- since does not turn a retry into an error); another event under a taken key is refused
    IF p_key <> '' THEN
        SELECT e.event_id INTO existing FROM obx.obx_event e
         WHERE e.tenant = p_tenant AND e.idempotency_key = p_key;
        IF existing IS NOT NULL THEN
            RETURN obx._idem_same(existing, p_key, p_tenant, p_type, p_atype, p_aid, p_aver, p_payload);
        END IF;
    END IF;

    SELECT r.*, EXISTS (SELECT 1 FROM obx.obx_route_set s WHERE s.route_gen = r.gen) AS has_set
      INTO rt FROM obx.obx_route r WHERE r.event_type = p_type ORDER BY r.gen DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004',
            MESSAGE = format('event_type: no route for ''%s'' (add one with `obx route set %s ...`)', p_type, p_type);
    END IF;
    -- routing key template (obx__routing_key_expand): only the four placeholders; the aggregate
    -- ID (free text) is substituted last so that its content is never expanded
    tpl := rt.routing_key;
    IF strpos(replace(replace(replace(replace(tpl, '{tenant}', ''), '{aggregate_type}', ''),
                               '{aggregate_id}', ''), '{event_type}', ''), '{') > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('routing_key: unknown placeholder in template ''%s'' (known: {tenant} {aggregate_type} {aggregate_id} {event_type})', tpl);
    END IF;
    rk := replace(replace(replace(replace(tpl, '{tenant}', p_tenant), '{aggregate_type}', p_atype),
                          '{event_type}', p_type), '{aggregate_id}', p_aid);
    IF octet_length(rk) > 255 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003', MESSAGE = 'routing_key: expands to more than 255 bytes';
    END IF;
    id := obx._event_id(now_ms);
    okey := rt.cluster || chr(31) || rt.topic || chr(31) || rk;

    -- One statement: the per-order-key lock (Q_INS_EVENT in pg_sql.c), then the event row, so a
    -- concurrent producer with the same idempotency key meets ON CONFLICT (it waits, then inserts
    -- nothing: the envelope and delta are fed by the event's RETURNING) without a subtransaction;
    -- the envelope with its digests inline and created_by; the statistics delta; the wake-up.
    -- the order key's locks (pg_sql.c, ORDER_LOCK: the key's own and its bucket shared for a
    -- transaction's first 64 events, the bucket alone after them)
    WITH lk AS MATERIALIZED (SELECT CASE WHEN coalesce(nullif(current_setting('obx.order_locks', true), ''), '0')::int < 64
                 THEN pg_advisory_xact_lock_shared(5194328, hashtext(okey) & 1023)::text
                      || pg_advisory_xact_lock(hashtextextended(okey, 5194328))::text
                      || set_config('obx.order_locks', (coalesce(nullif(current_setting(
                             'obx.order_locks', true), ''), '0')::int + 1)::text, true)
                 ELSE pg_advisory_xact_lock(5194328, hashtext(okey) & 1023)::text END),
    f AS MATERIALIZED (
        SELECT pg_current_xact_id()::text AS txid,
               coalesce(p_schema, 'sha256:' || encode(sha256(convert_to('schema:' || p_type, 'UTF8')), 'hex')) AS sch,
               'sha256:' || encode(sha256(p_payload), 'hex') AS pd
          FROM lk),
    ev AS (
        INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, correlation_id,
            order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen,
            attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since,
            primary_attempt_id, published_at, committed_at, updated_at, max_attempts,
            blind_retry, unordered, alias, dest_cluster)
        SELECT id, p_tenant, nullif(p_key, ''), p_type, p_corr, okey, 1, 'PENDING', 0, '', 0, 0,
            '', -1, 0, greatest(now_ms, nb_ms), 0, 0, '', 0, now_ms, now_ms, rt.max_attempts,
            rt.blind_retry, rt.unordered, rt.alias, rt.cluster FROM f
        ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING event_id),
    env AS (
        INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id,
            aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at,
            created_txid, correlation_id, causation_id, traceparent, idempotency_key,
            envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm,
            dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload,
            payload_len, created_at, created_by, not_before)
        SELECT ev.event_id, 1, p_atype, p_aid, p_aver, p_type, f.sch, f.pd, p_tenant, occ_ms,
            f.txid, p_corr, p_cause, p_trace, p_key,
            'sha256:' || encode(sha256(decode('000000156f62782e6f7574626f78456e76656c6f70652e7631', 'hex')
                || int4send(octet_length(ev.event_id)) || convert_to(ev.event_id, 'UTF8')
                || decode('0000000131', 'hex') -- envelope_gen 1
                || int4send(octet_length(p_atype)) || convert_to(p_atype, 'UTF8')
                || int4send(octet_length(p_aid)) || convert_to(p_aid, 'UTF8')
                || int4send(octet_length(p_aver::text)) || convert_to(p_aver::text, 'UTF8')
                || int4send(octet_length(p_type)) || convert_to(p_type, 'UTF8')
                || int4send(octet_length(f.sch)) || convert_to(f.sch, 'UTF8')
                || int4send(octet_length(f.pd)) || convert_to(f.pd, 'UTF8')
                || int4send(octet_length(p_tenant)) || convert_to(p_tenant, 'UTF8')
                || int4send(octet_length(occ_ms::text)) || convert_to(occ_ms::text, 'UTF8')
                || int4send(octet_length(f.txid)) || convert_to(f.txid, 'UTF8')
                || int4send(octet_length(p_corr)) || convert_to(p_corr, 'UTF8')
                || int4send(octet_length(p_cause)) || convert_to(p_cause, 'UTF8')
                || int4send(octet_length(p_trace)) || convert_to(p_trace, 'UTF8')
                || int4send(octet_length(p_key)) || convert_to(p_key, 'UTF8')
                -- not_before: a trailing field only when set (canonical-encoding.md)
                || CASE WHEN nb_ms <> 0 THEN int4send(octet_length(nb_ms::text))
                        || convert_to(nb_ms::text, 'UTF8') ELSE ''::bytea END), 'hex'),
            rt.cluster, rt.topic, rk, rt.algorithm, rt.gen, rt.serializer, rt.durability,
            rt.required_acks,
            'sha256:' || encode(sha256(decode('000000126f62782e64657374696e6174696f6e2e7631', 'hex')
                || int4send(octet_length(rt.cluster)) || convert_to(rt.cluster, 'UTF8')
                || int4send(octet_length(rt.topic)) || convert_to(rt.topic, 'UTF8')
                || int4send(octet_length(rk)) || convert_to(rk, 'UTF8')
                || int4send(octet_length(rt.algorithm)) || convert_to(rt.algorithm, 'UTF8')
                || int4send(octet_length(rt.gen::text)) || convert_to(rt.gen::text, 'UTF8')
                || int4send(octet_length(rt.serializer)) || convert_to(rt.serializer, 'UTF8')
                || int4send(octet_length(rt.durability)) || convert_to(rt.durability, 'UTF8')
                || int4send(octet_length(rt.required_acks)) || convert_to(rt.required_acks, 'UTF8')), 'hex'),
            p_payload, octet_length(p_payload), now_ms, session_user::text, nb_ms
          FROM ev, f),
    st AS (INSERT INTO obx.obx_stat_delta (key, n) SELECT 'state:PENDING', 1 FROM ev)
    SELECT ev.event_id,
           CASE WHEN current_setting('obx.notify', true) IS NOT DISTINCT FROM 'off' THEN NULL
                WHEN pg_try_advisory_xact_lock_shared(5194330, hashtext(rt.cluster)) THEN NULL
                ELSE obx._wake(rt.cluster) END INTO existing, notified FROM ev;
    IF existing IS NULL THEN
        -- the concurrent producer committed first: its event is the answer (visible to this new
        -- statement under READ COMMITTED; REPEATABLE READ raised a serialization failure above)
        SELECT e.event_id INTO existing FROM obx.obx_event e
         WHERE e.tenant = p_tenant AND e.idempotency_key = p_key;
        IF existing IS NOT NULL THEN
            RETURN obx._idem_same(existing, p_key, p_tenant, p_type, p_atype, p_aid, p_aver, p_payload);
        END IF;
        RAISE EXCEPTION USING ERRCODE = '23505',
            MESSAGE = format('idempotency_key: %L of tenant %L is taken by an event this transaction cannot see', p_key, p_tenant);
    END IF;
    IF rt.has_set THEN
        PERFORM obx._enqueue_targets(existing);
    END IF;
    RETURN existing;
END $$;

-- obx.enqueue() is a door to one of two bodies with the same contract: obx._enqueue_sql() above,
-- or obx._enqueue_c() from the obx_pg extension (docs/postgres.md, "The obx_pg extension") where
-- the server has it and `obx init` may create it (pg_store.c, enqueue_impl); obx._point_enqueue()
-- rewrites the door, keeping its owner and grants (both bodies run as its owner, SECURITY DEFINER).
-- obx._wake(cluster): the producers' wake-up while a relay waits (obx._enqueue_sql, pg_sql.c's
-- NOTIFY_EXPR): obx._wake_c() with the extension (latches set after the commit), else a NOTIFY
-- (docs/postgres.md, "NOTIFY"). Looked up at each call: the extension comes and goes with its
-- own DDL, and obx.enqueue()'s owner need not own this function.
CREATE FUNCTION obx._wake(cluster text) RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF to_regprocedure('obx._wake_c(text)') IS NOT NULL THEN
        PERFORM obx._wake_c(cluster);
    ELSE
        PERFORM pg_notify('obx_work', '');
    END IF;
END $$;

CREATE FUNCTION obx._point_enqueue(c boolean) RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    EXECUTE format($w$
CREATE OR REPLACE FUNCTION obx.enqueue(event_type text, aggregate_type text, aggregate_id text,
                            aggregate_version bigint, tenant text, payload bytea,
                            payload_schema text DEFAULT NULL, correlation_id text DEFAULT NULL,
                            causation_id text DEFAULT NULL, traceparent text DEFAULT NULL,
                            idempotency_key text DEFAULT NULL,
                            occurred_at timestamptz DEFAULT NULL,
                            not_before timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $b$
BEGIN
    RETURN obx.%s(event_type, aggregate_type, aggregate_id, aggregate_version, tenant, payload,
                  payload_schema, correlation_id, causation_id, traceparent, idempotency_key,
                  occurred_at, not_before);
END $b$$w$, CASE WHEN c THEN '_enqueue_c' ELSE '_enqueue_sql' END);
END $f$;

SELECT obx._point_enqueue(false);

-- Producer access to its own events: those whose first audit row names the session user (the
-- login role; obx.enqueue() records it), in the envelope (created_by) or in obx_audit.
-- A security barrier: the filter runs before any condition of the caller's query, so a
-- producer's own function in its WHERE clause (cheaper than the filter, the planner would run it
-- first) never sees another producer's rows. Every view in the schema is one (tests/pg checks).
CREATE VIEW obx.producer_events WITH (security_barrier) AS
    SELECT e.event_id, e.tenant, e.event_type, v.aggregate_type, v.aggregate_id,
           v.aggregate_version, e.idempotency_key, e.correlation_id, e.state, e.envelope_gen,
           e.committed_at, e.published_at, v.occurred_at, v.created_txid, v.payload_digest,
           v.envelope_digest, v.dest_cluster, v.dest_topic, v.dest_routing_key, v.dest_digest
      FROM obx.obx_event e
      JOIN obx.obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen
     WHERE EXISTS (SELECT 1 FROM obx.obx_envelope g
                    WHERE g.event_id = e.event_id AND g.envelope_gen = 1
                      AND g.created_by = session_user::text)
        OR EXISTS (SELECT 1 FROM obx.obx_audit a
                    WHERE a.event_id = e.event_id AND a.from_state = 'NONE'
                      AND a.to_state = 'PENDING' AND a.who = session_user::text);

-- ---- the inbox ---------------------------------------------------------------------------------
-- Consumer side (docs/design.md, "Consumers and the inbox"). These tables live in the consumer's
-- database, which may or may not be the outbox database.

-- The consume receipt. envelope_gen, attempt_id, dest_digest: what makes it evidence that the
-- broker accepted the message, for a critical consumer (the acceptance point matches them with
-- the frozen event and a registered attempt; src/engine/resolve.c); 0 / '' / '' when the
-- delivery did not carry them well-formed, and then it is never evidence.
CREATE TABLE obx.obx_inbox (
    consumer_id    TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    event_type     TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    result         TEXT NOT NULL,
    topic          TEXT NOT NULL,
    partition      INTEGER NOT NULL,
    "offset"       BIGINT NOT NULL,
    consumed_at    BIGINT NOT NULL,
    duration_us    BIGINT NOT NULL,
    envelope_gen   INTEGER NOT NULL DEFAULT 0,
    attempt_id     TEXT NOT NULL DEFAULT '',
    dest_digest    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (consumer_id, event_id)
);

CREATE TABLE obx.obx_consumer_watermark (
    consumer_id  TEXT NOT NULL,
    topic        TEXT NOT NULL,
    partition    INTEGER NOT NULL,
    "offset"     BIGINT NOT NULL,
    event_id     TEXT NOT NULL,
    occurred_at  BIGINT NOT NULL,
    committed_at BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, topic, partition)
);

CREATE TABLE obx.obx_inbox_failure (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    failures    INTEGER NOT NULL,
    last_error  TEXT NOT NULL,
    first_at    BIGINT NOT NULL,
    last_at     BIGINT NOT NULL,
    next_at     BIGINT NOT NULL DEFAULT 0, -- the next try is due then (ms; the retry back-off)
    PRIMARY KEY (consumer_id, event_id)
);

-- An unordered consumer's copy of a failed message (obx consume --unordered): the broker was
-- acknowledged past it, and its retry runs from these bytes once obx_inbox_failure.next_at is
-- due; payload_digest is the SHA-256 of payload as kept, checked before the retry runs.
CREATE TABLE obx.obx_inbox_retry (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    "offset"    BIGINT NOT NULL,
    headers     TEXT NOT NULL,
    payload     BYTEA,
    kept_at     BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, event_id)
);

CREATE TABLE obx.obx_poison (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('PARKED', 'REDRIVE', 'DONE')),
    payload_digest TEXT NOT NULL DEFAULT '', -- of this copy's bytes: a corrupt copy is its own row
    failures    INTEGER NOT NULL,
    last_error  TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    "offset"    BIGINT NOT NULL,
    headers     TEXT NOT NULL,
    payload     BYTEA,
    parked_at   BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, event_id, payload_digest)
);

CREATE TABLE obx.obx_inbox_quarantine (
    quarantine_id  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_id    TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    first_digest   TEXT NOT NULL,
    reason         TEXT NOT NULL,
    at             BIGINT NOT NULL
);
-- retention's evidence check: an event this consumer quarantined is never purged (inbox_has)
CREATE INDEX obx_inbox_quarantine_event ON obx.obx_inbox_quarantine (consumer_id, event_id);

-- Which consumer identities and tenants a database role may act for in the inbox tables, once
-- obx.create_roles() has enabled row-level security on them (docs/security.md). role_name may
-- name a login role or a group; tenant '*' means every tenant of that consumer.
CREATE TABLE obx.obx_consumer_grant (
    role_name   TEXT NOT NULL,
    consumer_id TEXT NOT NULL,
    tenant      TEXT NOT NULL,
    PRIMARY KEY (role_name, consumer_id, tenant)
);

CREATE TABLE obx.obx_consume_audit (
    audit_id    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          BIGINT NOT NULL,
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    duration_us BIGINT NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX obx_consume_audit_event ON obx.obx_consume_audit (event_id);

-- ---- the inbox in SQL (docs/inbox-sql.md) -----------------------------------------------------
-- For consumers in any language, inside the consumer's own transaction around its effect:
-- obx.inbox_receive() decides ('process', 'duplicate', 'quarantined', 'poisoned', 'delayed'),
-- obx.inbox_applied() records the effect's result before COMMIT (the broker is acknowledged only
-- after it), obx.inbox_failed() records a handler error in a transaction of its own
-- (docs/inbox-sql.md has the protocol). The semantics are obx_inbox_process()'s
-- (src/engine/inbox.c), row for row, evidence columns included; tests/store/test_inbox_sql.c
-- runs both inboxes on the same cases and compares the rows. Every function is SECURITY INVOKER:
-- a role does through them what its own grants and row-level security allow on the inbox tables
-- (the least-privilege <prefix>_consumer role of obx.create_roles()), so EXECUTE stays with
-- PUBLIC.

-- Milliseconds and microseconds since the epoch, from the clock (not the transaction start:
-- a consumer transaction may be long).
-- floor, as the producers' now_ms and the C library's clocks: a cast rounds, and a time rounded
-- up is up to half a unit in the future (a retry due "now" was then not due yet)
CREATE FUNCTION obx._inbox_ms() RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
END $$;
CREATE FUNCTION obx._inbox_us() RETURNS bigint LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
END $$;

-- A time for people, as obx__iso_ms prints it (src/core/util.c): ISO-8601 UTC with milliseconds,
-- "2026-12-08T00:45:55.849Z"; outside the years 1..9999, "<ms> ms".
CREATE FUNCTION obx._iso_ms(ms bigint) RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF ms < -62135596800000 OR ms > 253402300799999 THEN
        RETURN ms || ' ms';
    END IF;
    RETURN to_char(timestamp '1970-01-01' + ms * interval '1 millisecond',
                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');
END $$;

-- Outside text stored in a text column, as obx__text_copy does: control characters become
-- '?', at most max_bytes bytes, never cut inside a character.
CREATE FUNCTION obx._inbox_text(t text, max_bytes integer) RETURNS text LANGUAGE plpgsql
IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s text := regexp_replace(coalesce(t, ''), '[\x01-\x1f\x7f]', '?', 'g');
BEGIN
    IF octet_length(s) <= max_bytes THEN
        RETURN s;
    END IF;
    s := left(s, max_bytes);
    WHILE octet_length(s) > max_bytes LOOP
        s := left(s, length(s) - 1);
    END LOOP;
    RETURN s;
END $$;

-- "fx-" + 64 hex: the same stable key as obx_inbox_effect_key() (SHA-256 over the length-
-- prefixed "obx.effect.v1", consumer, event ID and effect name): the idempotency key of an
-- external call (a payment, an e-mail) made for this event by this consumer.
CREATE FUNCTION obx.inbox_effect_key(consumer_id text, event_id text, effect text DEFAULT 'effect')
RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN 'fx-' || encode(sha256(
        int4send(octet_length('obx.effect.v1')) || convert_to('obx.effect.v1', 'UTF8') ||
        int4send(octet_length(consumer_id)) || convert_to(consumer_id, 'UTF8') ||
        int4send(octet_length(event_id)) || convert_to(event_id, 'UTF8') ||
        int4send(octet_length(effect)) || convert_to(effect, 'UTF8')), 'hex');
END $$;

-- The key a message is parked under: its event ID, or for an unusable one "bad-" and 26 hex
-- digits of SHA-256 over the length-prefixed raw ID and the payload (as inbox.c's poison_key).
CREATE FUNCTION obx._inbox_key(event_id text, payload bytea) RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN CASE WHEN event_id ~ '^evt-[0-7][0-9A-HJKMNP-TV-Z]{25}$' THEN event_id
           ELSE 'bad-' || left(encode(sha256(int4send(octet_length(coalesce(event_id, '')))
                || convert_to(coalesce(event_id, ''), 'UTF8') || coalesce(payload, '')), 'hex'), 26)
           END;
END $$;

CREATE FUNCTION obx._inbox_audit(consumer text, key text, outcome text, duration_us bigint,
                                 detail text, at_ms bigint) RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_consume_audit (at, consumer_id, event_id, outcome, duration_us, detail)
    VALUES (at_ms, consumer, key, outcome, duration_us, obx._inbox_text(detail, 255));
END $$;

-- The poison row's headers, as inbox.c's headers_of writes them (obx poison list, re-drive).
CREATE FUNCTION obx._inbox_headers(event_id text, envelope_gen integer, payload_digest text,
                                   event_type text, tenant text, headers jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    agg text := headers ->> 'obx-aggregate';
    a_type text;
    a_id text;
    a_ver bigint := 0;
BEGIN
    IF agg ~ '^[^/]+/.+@[0-9]{1,18}$' THEN
        a_type := split_part(agg, '/', 1);
        a_id := substr(agg, length(a_type) + 2);
        a_ver := substring(a_id FROM '@([0-9]+)$')::bigint;
        a_id := left(a_id, length(a_id) - length(substring(a_id FROM '@[0-9]+$')));
    END IF;
    -- absent fields are JSON nulls, as jansson's "o*" writes them in headers_of
    RETURN (jsonb_build_object(
        'event_id', event_id, 'envelope_gen', coalesce(envelope_gen, 0),
        'event_type', event_type, 'tenant', tenant, 'aggregate_type', a_type,
        'aggregate_id', a_id, 'aggregate_version', a_ver,
        'correlation_id', headers ->> 'obx-correlation-id',
        'causation_id', headers ->> 'obx-causation-id',
        'traceparent', headers ->> 'traceparent',
        'occurred_at', CASE WHEN headers ->> 'obx-occurred-at' ~ '^[0-9]{1,15}$'
                            THEN (headers ->> 'obx-occurred-at')::bigint ELSE 0 END,
        'payload_digest', payload_digest)
        -- as headers_of: present only when the message carried them
        || CASE WHEN headers ? 'obx-attempt-id'
                THEN jsonb_build_object('attempt_id', headers ->> 'obx-attempt-id')
                ELSE '{}'::jsonb END
        || CASE WHEN headers ? 'obx-dest-digest'
                THEN jsonb_build_object('dest_digest', headers ->> 'obx-dest-digest')
                ELSE '{}'::jsonb END)::text;
END $$;

-- The key of a parked copy besides its event ID: the SHA-256 of its bytes (inbox.c's
-- obx__poison_digest), so that a corrupt copy never blocks the genuine one.
CREATE FUNCTION obx._poison_digest(payload bytea) RETURNS text LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN 'sha256:' || encode(sha256(coalesce(payload, ''::bytea)), 'hex');
END $$;

-- Parks a message as poison (the upsert and audit row of inbox.c's park).
CREATE FUNCTION obx._inbox_park(consumer text, key text, failures integer, why text, topic text,
                                "partition" integer, "offset" bigint, headers text,
                                payload bytea, at_ms bigint) RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_poison AS p (consumer_id, event_id, state, failures, last_error, topic,
        partition, "offset", headers, payload, parked_at, updated_at, payload_digest)
    VALUES (consumer, key, 'PARKED', failures, obx._inbox_text(why, 255),
        obx._inbox_text(topic, 249), coalesce("partition", 0), coalesce("offset", 0), headers,
        payload, at_ms, at_ms, obx._poison_digest(payload))
    ON CONFLICT (consumer_id, event_id, payload_digest) DO UPDATE SET state = EXCLUDED.state,
        failures = EXCLUDED.failures, last_error = EXCLUDED.last_error,
        updated_at = EXCLUDED.updated_at;
    PERFORM obx._inbox_audit(consumer, key, 'POISONED', 0, why, at_ms);
END $$;

-- The validation of inbox.c's step 1, before any effect: NULL when the message may be
-- processed, else why it is parked. Field rules are obx._check's, with its messages.
CREATE FUNCTION obx._inbox_refusal(consumer text, event_id text, envelope_gen integer,
                                   payload_digest text, topic text, payload bytea,
                                   event_type text, tenant text, accepted_types text[],
                                   accepted_tenants text[], headers jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    agg text := headers ->> 'obx-aggregate';
    digest text;
BEGIN
    IF event_id IS NULL THEN
        RETURN 'bad event ID: event_id: missing';
    ELSIF left(event_id, 4) <> 'evt-' THEN
        RETURN format('bad event ID: event_id: ''%s'' does not start with ''evt-''', left(event_id, 40));
    ELSIF octet_length(event_id) <> 30 THEN
        RETURN format('bad event ID: event_id: ''%s'' is %s bytes, expected 30', left(event_id, 40),
                      octet_length(event_id));
    ELSIF event_id !~ '^evt-[0-9A-HJKMNP-TV-Z]{26}$' THEN
        RETURN format('bad event ID: event_id: ''%s'' has a byte outside the ULID alphabet', event_id);
    ELSIF event_id !~ '^evt-[0-7]' THEN
        RETURN format('bad event ID: event_id: ''%s'' time overflows', event_id);
    END IF;
    BEGIN
        IF envelope_gen IS NULL OR envelope_gen < 1 THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = format('envelope_gen: %s is not 1 or more', coalesce(envelope_gen::text, 'missing'));
        END IF;
        PERFORM obx._check('event_type', event_type, 1, 128, 'event_type');
        PERFORM obx._check('tenant', tenant, 1, 128, 'name');
        IF agg IS NOT NULL AND agg !~ '^[A-Za-z0-9._-]{1,128}/[^\x01-\x1f\x7f]{1,255}@[0-9]{1,18}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = format('obx-aggregate: ''%s'' is not type/id@version', left(agg, 80));
        END IF;
        PERFORM obx._check('correlation_id', headers ->> 'obx-correlation-id', 0, 255, 'text');
        PERFORM obx._check('causation_id', headers ->> 'obx-causation-id', 0, 255, 'text');
        PERFORM obx._check('traceparent', headers ->> 'traceparent', 0, 55, 'name');
        PERFORM obx._check('topic', topic, 0, 249, 'name');
        IF payload IS NULL OR octet_length(payload) = 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'OB002',
                MESSAGE = 'payload: empty (an obx event carries 1 byte or more)';
        END IF;
    EXCEPTION WHEN SQLSTATE 'OB002' OR SQLSTATE 'OB003' THEN
        RETURN 'malformed message: ' || SQLERRM;
    END;
    digest := 'sha256:' || encode(sha256(payload), 'hex');
    IF payload_digest IS DISTINCT FROM digest THEN
        RETURN format('payload does not match its digest header (%s)',
                      coalesce(left(regexp_replace(payload_digest, '[\x01-\x1f\x7f]', '?', 'g'), 24), '(none)'));
    END IF;
    IF cardinality(accepted_types) > 0 AND NOT event_type = ANY (accepted_types) THEN
        RETURN format('contract ''%s'' is not accepted by consumer %s', event_type, consumer);
    END IF;
    IF cardinality(accepted_tenants) > 0 AND NOT tenant = ANY (accepted_tenants) THEN
        RETURN format('tenant ''%s'' is not served by consumer %s', tenant, consumer);
    END IF;
    RETURN NULL;
END $$;

-- Records a delivery and decides. With 'process' the consume receipt is inserted now (its unique
-- key makes a concurrent instance wait, then answer 'duplicate'), the watermark moves, and
-- obx.inbox_applied() must complete the receipt before COMMIT (a constraint trigger fails a commit
-- without it). consumer_id: [A-Za-z0-9._-]{1,128}; accepted_types / accepted_tenants as
-- obx_inbox_options (NULL or empty: any); headers: every obx header the message carries (name ->
-- value): obx-attempt-id and obx-dest-digest make the receipt evidence for the reconciler.
CREATE FUNCTION obx.inbox_receive(consumer_id text, event_id text, envelope_gen integer,
                                  payload_digest text, topic text, "partition" integer,
                                  "offset" bigint, payload bytea, event_type text, tenant text,
                                  accepted_types text[] DEFAULT NULL,
                                  accepted_tenants text[] DEFAULT NULL,
                                  headers jsonb DEFAULT NULL)
RETURNS TABLE (decision text, result text, detail text) LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_ms bigint := obx._inbox_ms();
    why text;
    prev record;
    hj text;
    digest text;
    occurred bigint := 0;
    ev_gen integer := 0;
    ev_attempt text := '';
    ev_dest text := '';
BEGIN
    PERFORM obx._check('consumer_id', consumer_id, 1, 128, 'name');
    hj := obx._inbox_headers(event_id, envelope_gen, payload_digest, event_type, tenant, headers);
    why := obx._inbox_refusal(consumer_id, event_id, envelope_gen, payload_digest, topic, payload,
                              event_type, tenant, accepted_types, accepted_tenants, headers);
    IF why IS NOT NULL THEN
        PERFORM obx._inbox_park(consumer_id, obx._inbox_key(event_id, payload), 0, why, topic,
                                "partition", "offset", hj, payload, now_ms);
        RETURN QUERY SELECT 'poisoned'::text, ''::text, why;
        RETURN;
    END IF;
    digest := payload_digest; -- checked against the payload above
    IF headers ->> 'obx-occurred-at' ~ '^[0-9]{1,15}$' THEN
        occurred := (headers ->> 'obx-occurred-at')::bigint;
    END IF;
    -- evidence for the reconciler only when well-formed (outside input), as inbox.c: otherwise
    -- the row is an ordinary consume receipt (0 / '' / '')
    IF envelope_gen > 0
       AND headers ->> 'obx-attempt-id' ~ '^att-[0-9A-HJKMNP-TV-Z]{26}$'
       AND headers ->> 'obx-dest-digest' ~ '^sha256:[0-9a-f]{64}$' THEN
        ev_gen := envelope_gen;
        ev_attempt := headers ->> 'obx-attempt-id';
        ev_dest := headers ->> 'obx-dest-digest';
    END IF;
    -- a message this consumer already parked comes again when the ack of its 'poisoned' was
    -- lost: it stays parked, the handler does not run, nothing is written (as inbox.c); only a
    -- re-drive (state REDRIVE) runs it again
    SELECT p.failures, p.last_error INTO prev FROM obx.obx_poison p
     WHERE p.consumer_id = consumer_id AND p.event_id = event_id AND p.state = 'PARKED'
       AND p.payload_digest = obx._poison_digest(payload); -- this copy, not a corrupt one
    IF FOUND THEN
        RETURN QUERY SELECT 'poisoned'::text, ''::text,
            'already parked: ' || left(prev.last_error, 200);
        RETURN;
    END IF;
    -- a failed message whose retry is not due yet (obx.inbox_failed's back-off): the handler
    -- must not run, nothing is written; do not acknowledge it (give it back until then)
    SELECT f.failures, f.next_at INTO prev FROM obx.obx_inbox_failure f
     WHERE f.consumer_id = consumer_id AND f.event_id = event_id AND f.next_at > now_ms;
    IF FOUND THEN
        RETURN QUERY SELECT 'delayed'::text, ''::text,
            format('retry %s not due for %s s', prev.failures,
                   to_char((prev.next_at - now_ms) / 1000.0, 'FM999999990.000'));
        RETURN;
    END IF;
    -- the receipt, or the one already there (a committed one, or one whose transaction this
    -- insert waited for). The placeholder duration is minus the receive time in microseconds;
    -- inbox_applied() turns it into the handler's run time.
    BEGIN
        INSERT INTO obx.obx_inbox AS i (consumer_id, event_id, payload_digest, event_type, tenant,
            outcome, result, topic, partition, "offset", consumed_at, duration_us, envelope_gen,
            attempt_id, dest_digest)
        VALUES (consumer_id, event_id, digest, event_type, tenant, 'RECEIVED', '',
            coalesce(topic, ''), coalesce("partition", 0), coalesce("offset", 0), now_ms,
            -obx._inbox_us(), ev_gen, ev_attempt, ev_dest)
        ON CONFLICT ON CONSTRAINT obx_inbox_pkey DO NOTHING;
    EXCEPTION WHEN insufficient_privilege THEN
        -- row-level security refused this consumer's receipt (the role is not granted this
        -- consumer ID or tenant): park the message, visible, instead of stalling on it
        why := format('the consumer''s database refused the receipt: %s', SQLERRM);
        PERFORM obx._inbox_park(consumer_id, event_id, 0, why, topic, "partition", "offset", hj,
                                payload, now_ms);
        RETURN QUERY SELECT 'poisoned'::text, ''::text, why;
        RETURN;
    END;
    IF FOUND THEN
        INSERT INTO obx.obx_consumer_watermark AS w (consumer_id, topic, partition, "offset",
            event_id, occurred_at, committed_at)
        VALUES (consumer_id, coalesce(topic, ''), coalesce("partition", 0), coalesce("offset", 0),
            event_id, occurred, now_ms)
        ON CONFLICT ON CONSTRAINT obx_consumer_watermark_pkey DO UPDATE SET
            event_id = CASE WHEN EXCLUDED."offset" >= w."offset" THEN EXCLUDED.event_id
                       ELSE w.event_id END,
            occurred_at = CASE WHEN EXCLUDED."offset" >= w."offset" THEN EXCLUDED.occurred_at
                          ELSE w.occurred_at END,
            "offset" = greatest(w."offset", EXCLUDED."offset"),
            committed_at = EXCLUDED.committed_at;
        RETURN QUERY SELECT 'process'::text, ''::text, ''::text;
        RETURN;
    END IF;
    SELECT i.payload_digest, i.outcome, i.result, i.consumed_at, i."offset" INTO prev
      FROM obx.obx_inbox i WHERE i.consumer_id = consumer_id AND i.event_id = event_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = format(
            'inbox: a consume receipt of %s for consumer %s exists but is not visible to this '
            'database role (row-level security?)', event_id, consumer_id);
    END IF;
    IF prev.outcome = 'RECEIVED' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004', MESSAGE = format(
            'inbox: %s was already received by consumer %s in this transaction', event_id,
            consumer_id);
    END IF;
    IF prev.payload_digest = digest THEN
        why := format('already applied at %s (offset %s)', obx._iso_ms(prev.consumed_at),
                      prev."offset");
        PERFORM obx._inbox_audit(consumer_id, event_id, 'DUPLICATE', 0, why, now_ms);
        -- a re-driven poison message that had been applied meanwhile is done
        UPDATE obx.obx_poison p SET state = 'DONE', updated_at = now_ms
         WHERE p.consumer_id = consumer_id AND p.event_id = event_id AND p.state = 'REDRIVE';
        RETURN QUERY SELECT 'duplicate'::text, prev.result, why;
        RETURN;
    END IF;
    why := format('same event ID, different payload digest (first %s..., now %s...)',
                  left(prev.payload_digest, 20), left(digest, 20));
    INSERT INTO obx.obx_inbox_quarantine (consumer_id, event_id, payload_digest, first_digest,
        reason, at)
    VALUES (consumer_id, event_id, digest, prev.payload_digest, why, now_ms);
    PERFORM obx._inbox_audit(consumer_id, event_id, 'QUARANTINED', 0, why, now_ms);
    RETURN QUERY SELECT 'quarantined'::text, ''::text, why;
END $$;

-- Completes the receipt obx.inbox_receive() inserted in this transaction with the handler's
-- result (up to 255 bytes of text): APPLIED, the failure count cleared, a re-driven poison
-- message done, the consume audit row with the handler's run time.
CREATE FUNCTION obx.inbox_applied(consumer_id text, event_id text, result text DEFAULT '')
RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_ms bigint := obx._inbox_ms();
    res text := obx._inbox_text(result, 255);
    dur bigint;
BEGIN
    UPDATE obx.obx_inbox i SET outcome = 'APPLIED', result = res,
           duration_us = greatest(obx._inbox_us() + i.duration_us, 0)
     WHERE i.consumer_id = consumer_id AND i.event_id = event_id AND i.outcome = 'RECEIVED'
    RETURNING i.duration_us INTO dur;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004', MESSAGE = format(
            'inbox_applied: %s was not received by consumer %s in this transaction '
            '(call obx.inbox_receive first, in the same transaction, and only on ''process'')',
            coalesce(event_id, 'NULL'), coalesce(consumer_id, 'NULL'));
    END IF;
    DELETE FROM obx.obx_inbox_failure f WHERE f.consumer_id = consumer_id AND f.event_id = event_id;
    UPDATE obx.obx_poison p SET state = 'DONE', updated_at = now_ms
     WHERE p.consumer_id = consumer_id AND p.event_id = event_id AND p.state = 'REDRIVE';
    PERFORM obx._inbox_audit(consumer_id, event_id, 'APPLIED', dur, res, now_ms);
END $$;

-- Records a handler failure in a transaction of its own after the handler's rolled back (so the
-- delivery's fields come again): the failure count grows; at max_failures (1..1000), or with
-- poison => true, the message is parked as poison. The retry back-off is obx_inbox_options': retry
-- n is due retry_backoff_ms * 2^(n-1) after it, at most retry_backoff_max_ms, +-20 % jitter
-- (1..86400000 ms; retry_backoff_ms 0: at once), kept in the failure row (inbox_receive answers
-- 'delayed' until then). Returns 'retry' with retry_at (do not acknowledge before), 'poisoned'
-- (acknowledge) or 'duplicate' (applied meanwhile).
CREATE FUNCTION obx.inbox_failed(consumer_id text, event_id text, error text,
                                 max_failures integer DEFAULT 5, poison boolean DEFAULT false,
                                 envelope_gen integer DEFAULT NULL,
                                 payload_digest text DEFAULT NULL, topic text DEFAULT NULL,
                                 "partition" integer DEFAULT NULL, "offset" bigint DEFAULT NULL,
                                 payload bytea DEFAULT NULL, event_type text DEFAULT NULL,
                                 tenant text DEFAULT NULL, headers jsonb DEFAULT NULL,
                                 retry_backoff_ms integer DEFAULT 1000,
                                 retry_backoff_max_ms integer DEFAULT 300000)
RETURNS TABLE (decision text, failures integer, detail text, retry_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    now_ms bigint := obx._inbox_ms();
    herr text;
    n integer;
    why text;
    prev record;
    step bigint;
    next_ms bigint;
BEGIN
    PERFORM obx._check('consumer_id', consumer_id, 1, 128, 'name');
    IF event_id IS NULL OR event_id !~ '^evt-[0-7][0-9A-HJKMNP-TV-Z]{25}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('event_id: %L is not an obx event ID', left(event_id, 40));
    END IF;
    IF max_failures IS NULL OR max_failures < 1 OR max_failures > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('max_failures: %s outside 1..1000', coalesce(max_failures::text, 'NULL'));
    END IF;
    IF retry_backoff_ms IS NULL OR retry_backoff_max_ms IS NULL OR retry_backoff_ms < 0
       OR retry_backoff_ms > 86400000 OR retry_backoff_max_ms > 86400000
       OR (retry_backoff_ms > 0 AND retry_backoff_max_ms < retry_backoff_ms) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002', MESSAGE = format(
            'retry_backoff_ms: %s, retry_backoff_max_ms: %s: each 0..86400000 ms and max >= base',
            coalesce(retry_backoff_ms::text, 'NULL'), coalesce(retry_backoff_max_ms::text, 'NULL'));
    END IF;
    -- an event this consumer has applied meanwhile (another instance received it after this one
    -- rolled back) is done: nothing counted, nothing parked, as its redelivery would answer
    SELECT i.consumed_at, i."offset" INTO prev FROM obx.obx_inbox i
     WHERE i.consumer_id = consumer_id AND i.event_id = event_id AND i.outcome = 'APPLIED';
    IF FOUND THEN
        why := format('already applied at %s (offset %s)', obx._iso_ms(prev.consumed_at),
                      prev."offset");
        PERFORM obx._inbox_audit(consumer_id, event_id, 'DUPLICATE', 0, why, now_ms);
        RETURN QUERY SELECT 'duplicate'::text, 0, why, NULL::timestamptz;
        RETURN;
    END IF;
    herr := obx._inbox_text(CASE WHEN poison THEN 'handler refused the message as poison: '
                                 ELSE 'handler failed: ' END || coalesce(error, ''), 255);
    INSERT INTO obx.obx_inbox_failure AS f (consumer_id, event_id, failures, last_error, first_at,
        last_at, next_at)
    VALUES (consumer_id, event_id, 1, herr, now_ms, now_ms, now_ms)
    ON CONFLICT ON CONSTRAINT obx_inbox_failure_pkey DO UPDATE SET failures = f.failures + 1,
        last_error = EXCLUDED.last_error, last_at = EXCLUDED.last_at, next_at = EXCLUDED.next_at
    RETURNING f.failures INTO n;
    -- the back-off of failure n, +-20 % jitter so that messages failing together spread out
    step := least(retry_backoff_ms::bigint * 2 ^ least(n - 1, 40), retry_backoff_max_ms);
    next_ms := now_ms + CASE WHEN retry_backoff_ms = 0 THEN 0
        ELSE greatest(step + floor(random() * (2 * (step / 5) + 1))::bigint - step / 5, 1) END;
    UPDATE obx.obx_inbox_failure f SET next_at = next_ms
     WHERE f.consumer_id = consumer_id AND f.event_id = event_id;
    PERFORM obx._inbox_audit(consumer_id, event_id, 'FAILED', 0, herr, now_ms);
    IF NOT (poison OR n >= max_failures) AND retry_backoff_ms > 0 THEN
        PERFORM obx._inbox_audit(consumer_id, event_id, 'RETRY_SCHEDULED', 0,
            format('retry %s scheduled: back-off %s ms +-20 %%', n, step), now_ms);
    END IF;
    IF poison OR n >= max_failures THEN
        why := CASE WHEN poison THEN herr
                    ELSE format('%s handler failures, last: %s', n, left(herr, 200)) END;
        PERFORM obx._inbox_park(consumer_id, event_id, n, why, topic, "partition", "offset",
            obx._inbox_headers(event_id, envelope_gen, payload_digest, event_type, tenant, headers),
            payload, now_ms);
        RETURN QUERY SELECT 'poisoned'::text, n, why, NULL::timestamptz;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'retry'::text, n, herr, to_timestamp(next_ms / 1000.0);
END $$;

-- Poison messages an operator marked for re-drive (`obx poison redrive`, the dashboard):
-- deliver each through obx.inbox_receive() as if it came from the broker; applying it (or
-- finding it applied) marks it DONE, failing it parks it again.
CREATE FUNCTION obx.inbox_redrives(consumer_id text)
RETURNS TABLE (event_id text, envelope_gen integer, payload_digest text, topic text,
               "partition" integer, "offset" bigint, payload bytea, event_type text,
               tenant text, headers jsonb) LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT p.event_id, coalesce((h ->> 'envelope_gen')::integer, 1), h ->> 'payload_digest',
           p.topic, p.partition, p."offset", p.payload, h ->> 'event_type', h ->> 'tenant',
           jsonb_strip_nulls(jsonb_build_object(
               'obx-aggregate', CASE WHEN h ->> 'aggregate_type' IS NOT NULL
                   THEN (h ->> 'aggregate_type') || '/' || (h ->> 'aggregate_id') || '@'
                        || (h ->> 'aggregate_version') END,
               'obx-correlation-id', h ->> 'correlation_id',
               'obx-causation-id', h ->> 'causation_id',
               'traceparent', h ->> 'traceparent',
               'obx-occurred-at', h ->> 'occurred_at',
               'obx-attempt-id', h ->> 'attempt_id',
               'obx-dest-digest', h ->> 'dest_digest'))
      FROM obx.obx_poison p, LATERAL (SELECT p.headers::jsonb AS h) x
     WHERE p.consumer_id = inbox_redrives.consumer_id AND p.state = 'REDRIVE'
     ORDER BY p.parked_at, p.event_id
$$;

-- A receipt may be committed only complete: obx.inbox_receive() inserts it as RECEIVED and
-- obx.inbox_applied() completes it. Checked at commit (deferred), only for rows inserted as
-- RECEIVED: obx_inbox_process() inserts APPLIED rows and never fires it.
CREATE FUNCTION obx._inbox_complete() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM obx.obx_inbox i WHERE i.consumer_id = NEW.consumer_id
                 AND i.event_id = NEW.event_id AND i.outcome = 'RECEIVED') THEN
        RAISE EXCEPTION USING ERRCODE = 'OB004', MESSAGE = format(
            'inbox: consumer %s received %s (decision ''process'') but did not call '
            'obx.inbox_applied() before COMMIT: roll back instead when the effect was not made',
            NEW.consumer_id, NEW.event_id);
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER obx_inbox_complete AFTER INSERT ON obx.obx_inbox
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.outcome = 'RECEIVED')
    EXECUTE FUNCTION obx._inbox_complete();

-- ---- least-privilege roles (obx init --roles PREFIX) --------------------------------------------
-- <prefix>_producer: enqueue through obx.enqueue() and read its own events (producer_events);
-- <prefix>_relay:    read the outbox, move and hold events, write attempts, receipts, audit,
--                    statistics, counters and its cluster, new envelope generations and payload
--                    drops (UPDATE of payload only); the inbox tables;
-- <prefix>_auditor:  read everything;
-- <prefix>_consumer: the inbox rows of the consumer IDs and tenants obx.obx_consumer_grant lists
--                    for the connected role (row-level security, which the owner is not under).
-- Nobody, the owner included, can change a frozen envelope or destination. NOLOGIN groups, to
-- grant to login roles; idempotent. A delivery-set target creates an event row, which (like
-- obx_enqueue() from C) needs the schema owner or INSERT on obx_event.
CREATE FUNCTION obx.create_roles(prefix text) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $$
DECLARE
    p text := prefix || '_producer';
    r text := prefix || '_relay';
    a text := prefix || '_auditor';
    c text := prefix || '_consumer';
    x text;
    t text;
    rows text;
BEGIN
    IF prefix IS NULL OR prefix !~ '^[a-z][a-z0-9_]{0,39}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = format('prefix: %L is not [a-z][a-z0-9_]{0,39}', prefix);
    END IF;
    FOREACH x IN ARRAY ARRAY[p, r, a, c] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = x) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', x);
        END IF;
    END LOOP;
    EXECUTE format('GRANT USAGE ON SCHEMA obx TO %I, %I, %I', p, r, a);
    -- obx reads the schema version whenever it opens a store
    EXECUTE format('GRANT SELECT ON obx.obx_meta TO %I, %I, %I', p, r, a);
    EXECUTE format('GRANT EXECUTE ON FUNCTION obx.dest_canonical(text, text, text, text, bigint, text, text, text),
        obx.dest_digest(text, text, text, text, bigint, text, text, text),
        obx.envelope_canonical(text, integer, text, text, bigint, text, text, text, text, bigint, text, text, text, text, text),
        obx.envelope_digest(text, integer, text, text, bigint, text, text, text, text, bigint, text, text, text, text, text)
        TO %I, %I, %I', p, r, a);

    EXECUTE format('GRANT EXECUTE ON FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz, timestamptz) TO %I', p);
    EXECUTE format('GRANT SELECT ON obx.producer_events TO %I', p);

    EXECUTE format('GRANT SELECT ON obx.obx_route, obx.obx_envelope, obx.obx_event, obx.obx_attempt,
        obx.obx_receipt, obx.obx_audit, obx.obx_counter, obx.obx_route_set, obx.obx_route_target,
        obx.obx_delivery_set, obx.obx_delivery_target, obx.obx_cluster, obx.obx_relay_cluster TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_envelope TO %I', r);
    EXECUTE format('GRANT UPDATE (payload) ON obx.obx_envelope TO %I', r);
    EXECUTE format('GRANT UPDATE (envelope_gen, state, claim_gen, owner, lease_until, attempt_gen,
        attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since,
        primary_attempt_id, published_at, updated_at, order_key, dest_cluster, held_at)
        ON obx.obx_event TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_attempt TO %I', r);
    EXECUTE format('GRANT UPDATE (partition, state, unknown_at, ended_at, offset_before, quiet_until,
        detail) ON obx.obx_attempt TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_receipt, obx.obx_audit TO %I', r);
    EXECUTE format('GRANT INSERT, UPDATE ON obx.obx_counter, obx.obx_cluster, obx.obx_relay_cluster TO %I', r);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON obx.obx_series TO %I', r);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON obx.obx_inbox, obx.obx_consumer_watermark,
        obx.obx_inbox_failure, obx.obx_inbox_retry, obx.obx_poison, obx.obx_inbox_quarantine,
        obx.obx_consume_audit TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION obx._stats() TO %I, %I', r, a);

    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA obx TO %I', a);

    -- the relay writes its audit rows as batches and the statistics deltas of its moves
    EXECUTE format('GRANT SELECT, INSERT ON obx.obx_audit_batch TO %I', r);
    EXECUTE format('GRANT SELECT ON obx.obx_audit_all TO %I', r);
    EXECUTE format('GRANT USAGE ON SEQUENCE obx.obx_audit_audit_id_seq TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_stat_delta TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION obx._compact_stats() TO %I', r);

    -- consumer: schema version, its grants, the inbox tables; nothing of the outbox
    EXECUTE format('GRANT USAGE ON SCHEMA obx TO %I', c);
    EXECUTE format('GRANT SELECT ON obx.obx_meta, obx.obx_consumer_grant TO %I', c);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON obx.obx_inbox, obx.obx_consumer_watermark,
        obx.obx_inbox_failure, obx.obx_inbox_retry, obx.obx_poison, obx.obx_inbox_quarantine,
        obx.obx_consume_audit TO %I', c);
    ALTER TABLE obx.obx_consumer_grant ENABLE ROW LEVEL SECURITY;
    EXECUTE format('DROP POLICY IF EXISTS %I ON obx.obx_consumer_grant', c || '_own');
    -- A grant row names its role as text, and DROP ROLE leaves it: to_regrole() makes a missing
    -- role NULL (pg_has_role() is strict: no row), where pg_has_role(name) raised 42704 for
    -- every consumer whose query met that row. A role later created with the name has the row.
    EXECUTE format('CREATE POLICY %I ON obx.obx_consumer_grant FOR SELECT TO %I
        USING (pg_has_role(current_user, to_regrole(quote_ident(role_name)), ''MEMBER''))',
        c || '_own', c);
    EXECUTE format('DROP POLICY IF EXISTS %I ON obx.obx_consumer_grant', a || '_all');
    EXECUTE format('CREATE POLICY %I ON obx.obx_consumer_grant FOR SELECT TO %I USING (true)',
        a || '_all', a);
    FOREACH t IN ARRAY ARRAY['obx_inbox', 'obx_consumer_watermark', 'obx_inbox_failure',
                             'obx_inbox_retry', 'obx_poison', 'obx_inbox_quarantine', 'obx_consume_audit'] LOOP
        EXECUTE format('ALTER TABLE obx.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS %I ON obx.%I', prefix || '_all', t);
        EXECUTE format('CREATE POLICY %I ON obx.%I TO %I, %I USING (true) WITH CHECK (true)',
            prefix || '_all', t, r, a);
        -- the consumer's rows: its granted consumer IDs and, where a row names one, tenants
        -- (columns qualified with the table: inside the subquery g's columns would win)
        rows := format('EXISTS (SELECT 1 FROM obx.obx_consumer_grant g WHERE '
            'pg_has_role(current_user, to_regrole(quote_ident(g.role_name)), ''MEMBER'') '
            'AND g.consumer_id = %I.consumer_id%s)',
            t, CASE WHEN t = 'obx_inbox' THEN format(' AND g.tenant IN (%I.tenant, ''*'')', t)
                    ELSE '' END);
        EXECUTE format('DROP POLICY IF EXISTS %I ON obx.%I', c || '_rows', t);
        EXECUTE format('CREATE POLICY %I ON obx.%I TO %I USING (%s) WITH CHECK (%s)', c || '_rows',
            t, c, rows, rows);
    END LOOP;
END $$;

-- ---- who may execute what ----------------------------------------------------------------------
-- Functions are executable by PUBLIC by default: nobody but the owner and the roles above, except
-- the inbox in SQL (see there) with the field check it calls (it reads and writes nothing), and
-- obx._ws_fail (it only raises; the relay's write set calls it under whatever role runs it).
-- Trigger functions run without an EXECUTE check for whoever fires them.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA obx FROM PUBLIC;
GRANT EXECUTE ON FUNCTION obx._check(text, text, integer, integer, text),
    obx._ws_fail(text, text, boolean),
    obx._inbox_ms(), obx._inbox_us(), obx._iso_ms(bigint), obx._inbox_text(text, integer),
    obx.inbox_effect_key(text, text, text), obx._inbox_key(text, bytea),
    obx._inbox_audit(text, text, text, bigint, text, bigint),
    obx._inbox_headers(text, integer, text, text, text, jsonb),
    obx._inbox_park(text, text, integer, text, text, integer, bigint, text, bytea, bigint),
    obx._poison_digest(bytea),
    obx._inbox_refusal(text, text, integer, text, text, bytea, text, text, text[], text[], jsonb),
    obx.inbox_receive(text, text, integer, text, text, integer, bigint, bytea, text, text, text[],
                      text[], jsonb),
    obx.inbox_applied(text, text, text),
    obx.inbox_failed(text, text, text, integer, boolean, integer, text, text, integer, bigint,
                     bytea, text, text, jsonb, integer, integer),
    obx.inbox_redrives(text), obx._inbox_complete(), obx._wake(text) TO PUBLIC;

-- obx outbox schema for SQLite: the baseline, schema version 1.
--
-- `obx init` (obx_store_init(); sqlite_store.c, sq_migrate) runs this file on a database without
-- obx's schema, in one transaction, and records version 1 in obx_meta; the migration runner
-- (src/store/shared.c) then applies the upgrade scripts of later versions in turn. Until obx's
-- first release a schema change edits this file; after it, each change is an upgrade script
-- from the released version. The two stores share the version number (OBX__SCHEMA_VERSION):
-- a version that changes only one store's schema is an empty script (`SELECT 1;`) on the other.
--
-- Mirrors src/store/postgres/schema.sql table by table and column by column (same names), which
-- says more about what each column means. SQLite has no stored functions: the producer is
-- obx_enqueue() in the process, the inbox obx_inbox_process(), and the statistics are counted
-- in the process.
-- Frozen data (routes, envelopes, destinations, delivery sets, receipts) is guarded by
-- triggers; every state change is written by the engine with an audit row in the same
-- transaction.
--
-- No `x IN (3 or more constants)` in a CHECK or a partial-index predicate: SQLite evaluates such
-- a list by building an ephemeral b-tree on every execution of the writing statement, and these
-- run on every insert and state change. Comparison chains instead (measured: an event UPDATE
-- ~17 -> ~6 us). Partial-index predicates are also what a query must repeat, term for term, for
-- the planner to use the index; an OR chain is implied by each of its terms (state = 'SENDING').

CREATE TABLE obx_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Route policy: every `obx route set` appends a generation; the highest one per event type is
-- current. Events freeze the generation they were enqueued under.
CREATE TABLE obx_route (
    gen           INTEGER PRIMARY KEY AUTOINCREMENT,
    event_type    TEXT NOT NULL,
    cluster       TEXT NOT NULL,
    topic         TEXT NOT NULL,
    routing_key   TEXT NOT NULL,
    algorithm     TEXT NOT NULL,
    serializer    TEXT NOT NULL,
    durability    TEXT NOT NULL,
    required_acks TEXT NOT NULL,
    max_attempts  INTEGER NOT NULL CHECK (max_attempts > 0),
    blind_retry   INTEGER NOT NULL CHECK (blind_retry IN (0, 1)),
    unordered     INTEGER NOT NULL CHECK (unordered IN (0, 1)),
    alias         TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    -- '' or the key ID the relay seals this generation's payloads with (docs/security.md)
    encrypt_key   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX obx_route_type ON obx_route (event_type, gen);
CREATE TRIGGER obx_route_frozen BEFORE UPDATE ON obx_route
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation cannot change (obx route set adds a new one)');
END;
CREATE TRIGGER obx_route_no_delete BEFORE DELETE ON obx_route
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation cannot change (obx route set adds a new one)');
END;

-- A route generation's further destinations, when it declares a delivery set (docs/migration.md;
-- target 1 is the obx_route row itself).
CREATE TABLE obx_route_set (
    route_gen  INTEGER PRIMARY KEY,
    completion TEXT NOT NULL CHECK (completion IN ('all', 'any')),
    targets    INTEGER NOT NULL CHECK (targets BETWEEN 2 AND 8)
);

CREATE TABLE obx_route_target (
    route_gen     INTEGER NOT NULL,
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
CREATE TRIGGER obx_route_set_frozen BEFORE UPDATE ON obx_route_set
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation''s delivery set cannot change (set a new generation)');
END;
CREATE TRIGGER obx_route_target_frozen BEFORE UPDATE ON obx_route_target
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation''s delivery set cannot change (set a new generation)');
END;

-- One row per (event, envelope generation): outboxEnvelope.v1 + destination.v1, frozen.
CREATE TABLE obx_envelope (
    event_id          TEXT NOT NULL,
    envelope_gen      INTEGER NOT NULL CHECK (envelope_gen >= 1),
    aggregate_type    TEXT NOT NULL,
    aggregate_id      TEXT NOT NULL,
    aggregate_version INTEGER NOT NULL,
    event_type        TEXT NOT NULL,
    payload_schema    TEXT NOT NULL,
    payload_digest    TEXT NOT NULL,
    tenant            TEXT NOT NULL,
    occurred_at       INTEGER NOT NULL,
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
    dest_route_gen    INTEGER NOT NULL,
    dest_serializer   TEXT NOT NULL,
    dest_durability   TEXT NOT NULL,
    dest_acks         TEXT NOT NULL,
    dest_digest       TEXT NOT NULL,
    payload_len       INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    not_before        INTEGER NOT NULL DEFAULT 0, -- a delayed event's time (ms); 0 = none
    -- last: a column after it would be reached only through the payload's overflow pages, so
    -- every read of an event row would read its whole payload (a claim, obx status...)
    payload           BLOB,            -- NULL only after purge (tombstone keeps the digests)
    PRIMARY KEY (event_id, envelope_gen)
);

CREATE TRIGGER obx_envelope_frozen BEFORE UPDATE ON obx_envelope
WHEN NEW.event_id IS NOT OLD.event_id OR NEW.envelope_gen IS NOT OLD.envelope_gen
  OR NEW.aggregate_type IS NOT OLD.aggregate_type OR NEW.aggregate_id IS NOT OLD.aggregate_id
  OR NEW.aggregate_version IS NOT OLD.aggregate_version OR NEW.event_type IS NOT OLD.event_type
  OR NEW.payload_schema IS NOT OLD.payload_schema OR NEW.payload_digest IS NOT OLD.payload_digest
  OR NEW.tenant IS NOT OLD.tenant OR NEW.occurred_at IS NOT OLD.occurred_at
  OR NEW.created_txid IS NOT OLD.created_txid OR NEW.correlation_id IS NOT OLD.correlation_id
  OR NEW.causation_id IS NOT OLD.causation_id OR NEW.traceparent IS NOT OLD.traceparent
  OR NEW.idempotency_key IS NOT OLD.idempotency_key OR NEW.envelope_digest IS NOT OLD.envelope_digest
  OR NEW.dest_cluster IS NOT OLD.dest_cluster OR NEW.dest_topic IS NOT OLD.dest_topic
  OR NEW.dest_routing_key IS NOT OLD.dest_routing_key OR NEW.dest_algorithm IS NOT OLD.dest_algorithm
  OR NEW.dest_route_gen IS NOT OLD.dest_route_gen OR NEW.dest_serializer IS NOT OLD.dest_serializer
  OR NEW.dest_durability IS NOT OLD.dest_durability OR NEW.dest_acks IS NOT OLD.dest_acks
  OR NEW.dest_digest IS NOT OLD.dest_digest OR NEW.payload_len IS NOT OLD.payload_len
  OR NEW.created_at IS NOT OLD.created_at OR NEW.not_before IS NOT OLD.not_before
  OR (NEW.payload IS NOT OLD.payload AND NEW.payload IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'obx: the frozen envelope and destination cannot change (only a purge may drop the payload)');
END;

CREATE TRIGGER obx_envelope_no_delete BEFORE DELETE ON obx_envelope
BEGIN
    SELECT RAISE(ABORT, 'obx: envelopes are never deleted (purge keeps a tombstone)');
END;

-- Protocol state of each event (current envelope generation).
CREATE TABLE obx_event (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id           TEXT NOT NULL UNIQUE,
    tenant             TEXT NOT NULL,
    idempotency_key    TEXT,
    event_type         TEXT NOT NULL,
    correlation_id     TEXT NOT NULL,
    order_key          TEXT NOT NULL,   -- cluster \x1f topic \x1f routing key
    envelope_gen       INTEGER NOT NULL,
    state              TEXT NOT NULL CHECK (state = 'PENDING' OR state = 'CLAIMED'
                        OR state = 'SENDING' OR state = 'PUBLISHED' OR state = 'RETAINED'
                        OR state = 'PURGED' OR state = 'DISPATCH_UNKNOWN' OR state = 'RECONCILING'
                        OR state = 'RETRY_CLAIMED' OR state = 'PARKED' OR state = 'CANCELLED'),
    claim_gen          INTEGER NOT NULL,
    owner              TEXT NOT NULL,
    lease_until        INTEGER NOT NULL,
    attempt_gen        INTEGER NOT NULL,
    attempt_id         TEXT NOT NULL,
    pinned_partition   INTEGER NOT NULL,
    rejections         INTEGER NOT NULL,
    available_at       INTEGER NOT NULL,
    next_check_at      INTEGER NOT NULL,
    unknown_since      INTEGER NOT NULL,
    primary_attempt_id TEXT NOT NULL,
    published_at       INTEGER NOT NULL,
    committed_at       INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    max_attempts       INTEGER NOT NULL,
    blind_retry        INTEGER NOT NULL,
    unordered          INTEGER NOT NULL,
    alias              TEXT NOT NULL,
    dest_cluster       TEXT NOT NULL,
    held_at            INTEGER NOT NULL DEFAULT 0  -- when an UNKNOWN was held for an operator; 0: not held
);
CREATE UNIQUE INDEX obx_event_idem ON obx_event (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The claim's walk: due rows in (available_at, seq) order; it stops at the first not-yet-due row,
-- so a delayed backlog is never read (issue 51).
CREATE INDEX obx_event_claimable ON obx_event (available_at, seq)
    WHERE state IN ('PENDING', 'CLAIMED');
CREATE INDEX obx_event_unpublished ON obx_event (order_key, seq)
    WHERE state <> 'PUBLISHED' AND state <> 'RETAINED' AND state <> 'PURGED' AND state <> 'CANCELLED';
CREATE INDEX obx_event_inflight ON obx_event (state, lease_until)
    WHERE state = 'SENDING' OR state = 'DISPATCH_UNKNOWN' OR state = 'RECONCILING'
       OR state = 'RETRY_CLAIMED';
CREATE INDEX obx_event_state_pub ON obx_event (state, published_at);
-- The reconciler's read: its states in seq order, so that ORDER BY seq LIMIT walks the index and
-- stops at its batch, with no temporary b-tree for the sort (sqlite_store.c, Q_SEL_RECONCILE).
CREATE INDEX obx_event_unknown ON obx_event (seq)
    WHERE state = 'DISPATCH_UNKNOWN' OR state = 'RECONCILING' OR state = 'RETRY_CLAIMED';
CREATE INDEX obx_event_corr ON obx_event (correlation_id) WHERE correlation_id <> '';
CREATE INDEX obx_event_held ON obx_event (held_at, seq) WHERE held_at > 0;

-- UPDATE OF: the store's updates set only the columns that change (sqlite_store.c,
-- update_stmt), so a transition that leaves these alone does not run the check.
CREATE TRIGGER obx_event_frozen BEFORE UPDATE OF event_id, seq, tenant, idempotency_key,
    event_type, correlation_id, committed_at, envelope_gen, order_key, dest_cluster ON obx_event
WHEN NEW.event_id IS NOT OLD.event_id OR NEW.seq IS NOT OLD.seq OR NEW.tenant IS NOT OLD.tenant
  OR NEW.idempotency_key IS NOT OLD.idempotency_key OR NEW.event_type IS NOT OLD.event_type
  OR NEW.correlation_id IS NOT OLD.correlation_id OR NEW.committed_at IS NOT OLD.committed_at
  OR NEW.envelope_gen < OLD.envelope_gen
  OR (NEW.envelope_gen = OLD.envelope_gen AND (NEW.order_key IS NOT OLD.order_key
      OR NEW.dest_cluster IS NOT OLD.dest_cluster))
BEGIN
    SELECT RAISE(ABORT, 'obx: an event''s identity and frozen destination cannot change');
END;

CREATE TRIGGER obx_event_no_delete BEFORE DELETE ON obx_event
BEGIN
    SELECT RAISE(ABORT, 'obx: events are never deleted (purge keeps a tombstone)');
END;

-- A delivery set is a contract chosen at enqueue time: the event goes to several destinations,
-- each frozen with its own digest, its own attempts and its own publish slot, and a completion
-- rule ('all' or 'any') says when the event counts as delivered. Each slot is an ordinary
-- obx_event row (so claims, attempts, the acceptance point and the reconciler apply per target,
-- unchanged); target 1 is the event's own row, a further target's row has its own slot ID and
-- carries the event's ID on the wire.
-- One event's delivery set: the frozen contract. A target added later (a migration, with its
-- proof and receipt) appends a row to obx_delivery_target; nothing is ever rewritten.
CREATE TABLE obx_delivery_set (
    event_id   TEXT PRIMARY KEY,
    completion TEXT NOT NULL CHECK (completion IN ('all', 'any')),
    route_gen  INTEGER NOT NULL,    -- the declaring route generation; 0 = formed by a migration
    created_at INTEGER NOT NULL
);

CREATE TABLE obx_delivery_target (
    slot_id    TEXT PRIMARY KEY,    -- the obx_event row of this target (target 1: event_id)
    event_id   TEXT NOT NULL,       -- the logical event: what brokers and consumers see
    target_no  INTEGER NOT NULL CHECK (target_no BETWEEN 1 AND 8),
    origin     TEXT NOT NULL CHECK (origin IN ('enqueue', 'migration')),
    created_at INTEGER NOT NULL,
    UNIQUE (event_id, target_no)
);
CREATE TRIGGER obx_delivery_set_frozen BEFORE UPDATE ON obx_delivery_set
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract (add a target with obx migrate)');
END;
CREATE TRIGGER obx_delivery_set_no_delete BEFORE DELETE ON obx_delivery_set
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract');
END;
CREATE TRIGGER obx_delivery_target_frozen BEFORE UPDATE ON obx_delivery_target
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract (add a target with obx migrate)');
END;
CREATE TRIGGER obx_delivery_target_no_delete BEFORE DELETE ON obx_delivery_target
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract');
END;

-- Every send: registered before it goes out (CLAIMED/RETRY_CLAIMED -> SENDING).
CREATE TABLE obx_attempt (
    attempt_id    TEXT PRIMARY KEY,
    event_id      TEXT NOT NULL,
    envelope_gen  INTEGER NOT NULL,
    attempt_gen   INTEGER NOT NULL,
    claim_gen     INTEGER NOT NULL,
    owner         TEXT NOT NULL,
    dest_digest   TEXT NOT NULL,
    partition     INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state = 'SENDING' OR state = 'UNKNOWN'
                   OR state = 'ACCEPTED' OR state = 'DUPLICATE' OR state = 'REJECTED'
                   OR state = 'NOT_FOUND' OR state = 'QUARANTINED' OR state = 'SUPERSEDED'),
    started_at    INTEGER NOT NULL,
    unknown_at    INTEGER NOT NULL,
    ended_at      INTEGER NOT NULL,
    offset_before INTEGER NOT NULL,
    quiet_until   INTEGER NOT NULL,
    detail        TEXT NOT NULL
);
-- an event's attempts in the order they are read (Q_LOAD_ATT_EVENT: started_at, attempt_gen,
-- attempt_id), so that reading them needs no sort
CREATE INDEX obx_attempt_event ON obx_attempt (event_id, started_at, attempt_gen, attempt_id);
CREATE INDEX obx_attempt_unknown ON obx_attempt (attempt_id) WHERE state = 'UNKNOWN';

-- UPDATE OF: the store's attempt update sets only the columns an outcome changes, so it does not
-- run the check.
CREATE TRIGGER obx_attempt_frozen BEFORE UPDATE OF attempt_id, event_id, envelope_gen, attempt_gen,
    claim_gen, owner, dest_digest, started_at ON obx_attempt
WHEN NEW.attempt_id IS NOT OLD.attempt_id OR NEW.event_id IS NOT OLD.event_id
  OR NEW.envelope_gen IS NOT OLD.envelope_gen OR NEW.attempt_gen IS NOT OLD.attempt_gen
  OR NEW.claim_gen IS NOT OLD.claim_gen OR NEW.owner IS NOT OLD.owner
  OR NEW.dest_digest IS NOT OLD.dest_digest OR NEW.started_at IS NOT OLD.started_at
BEGIN
    SELECT RAISE(ABORT, 'obx: an attempt''s identity and destination cannot change');
END;

-- Receipts: the primary one fills the publish slot (at most one per event and generation);
-- further valid ACKs are duplicate transport receipts; contradicting ones are quarantined;
-- migrations leave a migration receipt.
CREATE TABLE obx_receipt (
    receipt_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id       TEXT NOT NULL,
    envelope_gen   INTEGER NOT NULL,
    attempt_id     TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind = 'PRIMARY' OR kind = 'DUPLICATE'
                    OR kind = 'QUARANTINED' OR kind = 'MIGRATION'),
    cluster        TEXT NOT NULL,
    topic          TEXT NOT NULL,
    partition      INTEGER NOT NULL,
    "offset"       INTEGER NOT NULL,
    broker_ts      INTEGER NOT NULL,
    payload_digest TEXT NOT NULL,
    dest_digest    TEXT NOT NULL,
    reason         TEXT NOT NULL,
    detail         TEXT,
    created_at     INTEGER NOT NULL,
    -- what proved it: the broker's confirm, a reconciler's lookup, a critical consumer's inbox
    -- row, an operator's `obx resolve --accept` verified at the broker, or asserted where the
    -- broker cannot be asked
    source         TEXT NOT NULL DEFAULT 'broker'
        CHECK (source = 'broker' OR source = 'lookup' OR source = 'consumer'
               OR source = 'operator' OR source = 'asserted')
);
CREATE UNIQUE INDEX obx_receipt_primary ON obx_receipt (event_id, envelope_gen) WHERE kind = 'PRIMARY';
CREATE INDEX obx_receipt_event ON obx_receipt (event_id);
CREATE INDEX obx_receipt_asserted ON obx_receipt (created_at) WHERE source = 'asserted';
CREATE INDEX obx_receipt_kind ON obx_receipt (kind) WHERE kind IN ('QUARANTINED', 'MIGRATION');

CREATE TRIGGER obx_receipt_frozen BEFORE UPDATE ON obx_receipt
BEGIN
    SELECT RAISE(ABORT, 'obx: receipts are evidence and cannot change');
END;

-- Who moved what, when, and why: one row per state change (and per refused stale action).
CREATE TABLE obx_audit (
    audit_id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at           INTEGER NOT NULL,
    actor        TEXT NOT NULL,
    who          TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    envelope_gen INTEGER NOT NULL,
    from_state   TEXT NOT NULL,
    to_state     TEXT NOT NULL,
    claim_gen    INTEGER NOT NULL,
    attempt_id   TEXT NOT NULL,
    attempt_gen  INTEGER NOT NULL,
    reason       TEXT NOT NULL
);
CREATE INDEX obx_audit_event ON obx_audit (event_id);

CREATE TABLE obx_counter (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);

-- The clusters relays serve and the destination contracts their broker backends honour, so that
-- `obx route set` can refuse a contract the cluster cannot honour.
CREATE TABLE obx_cluster (
    cluster       TEXT PRIMARY KEY,
    backend       TEXT NOT NULL,
    lookup        TEXT NOT NULL CHECK (lookup = 'authoritative' OR lookup = 'best_effort'
                                          OR lookup = 'none'),
    durability    TEXT NOT NULL,
    required_acks TEXT NOT NULL,
    serializer    TEXT NOT NULL,
    relay         TEXT NOT NULL,
    seen_at       INTEGER NOT NULL
);

-- The dashboard's charts (src/drivers/series.c): one sample per slot (a multiple of the sampling
-- interval, ms since the epoch), written by the relay that sampled first, the window's older rows deleted as it goes; read
-- back by a relay that starts, so the charts survive a restart. A few hundred rows at most.
CREATE TABLE obx_series (
    slot   INTEGER PRIMARY KEY,
    at     INTEGER NOT NULL,
    sample TEXT NOT NULL     -- JSON, as series.c encodes it
);

-- Which relay serves which cluster, kept fresh by the relay's heartbeat (as in PostgreSQL's
-- schema.sql: a cluster without a row whose live_until is ahead has no live relay).
CREATE TABLE obx_relay_cluster (
    relay      TEXT NOT NULL,
    cluster    TEXT NOT NULL,
    seen_at    INTEGER NOT NULL,
    live_until INTEGER NOT NULL,
    PRIMARY KEY (relay, cluster)
);

-- Consumer side (the inbox, docs/design.md, "Consumers and the inbox"). These tables live in the
-- consumer's database, which may or may not be the outbox database.
CREATE TABLE obx_inbox (
    consumer_id    TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    event_type     TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    result         TEXT NOT NULL,
    topic          TEXT NOT NULL,
    partition      INTEGER NOT NULL,
    "offset"       INTEGER NOT NULL,
    consumed_at    INTEGER NOT NULL,
    duration_us    INTEGER NOT NULL,
    -- what makes the receipt evidence that the broker accepted the message (0 / '' / '' when
    -- the delivery did not carry them, and then it is never evidence)
    envelope_gen   INTEGER NOT NULL DEFAULT 0,
    attempt_id     TEXT NOT NULL DEFAULT '',
    dest_digest    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (consumer_id, event_id)
);

CREATE TABLE obx_consumer_watermark (
    consumer_id  TEXT NOT NULL,
    topic        TEXT NOT NULL,
    partition    INTEGER NOT NULL,
    "offset"     INTEGER NOT NULL,
    event_id     TEXT NOT NULL,
    occurred_at  INTEGER NOT NULL,
    committed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer_id, topic, partition)
);

CREATE TABLE obx_inbox_failure (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    failures    INTEGER NOT NULL,
    last_error  TEXT NOT NULL,
    first_at    INTEGER NOT NULL,
    last_at     INTEGER NOT NULL,
    next_at     INTEGER NOT NULL DEFAULT 0, -- the next try is due then (ms; the retry back-off)
    PRIMARY KEY (consumer_id, event_id)
);

-- An unordered consumer's copy of a failed message (obx consume --unordered): the broker was
-- acknowledged past it, and its retry runs from these bytes once obx_inbox_failure.next_at is
-- due; payload_digest is the SHA-256 of payload as kept, checked before the retry runs.
CREATE TABLE obx_inbox_retry (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    "offset"    INTEGER NOT NULL,
    headers     TEXT NOT NULL,
    payload     BLOB,
    kept_at     INTEGER NOT NULL,
    PRIMARY KEY (consumer_id, event_id)
);

CREATE TABLE obx_poison (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state = 'PARKED' OR state = 'REDRIVE' OR state = 'DONE'),
    payload_digest TEXT NOT NULL DEFAULT '', -- of this copy's bytes: a corrupt copy is its own row
    failures    INTEGER NOT NULL,
    last_error  TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    "offset"    INTEGER NOT NULL,
    headers     TEXT NOT NULL,
    payload     BLOB,
    parked_at   INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (consumer_id, event_id, payload_digest)
);

CREATE TABLE obx_inbox_quarantine (
    quarantine_id  INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_id    TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    payload_digest TEXT NOT NULL,
    first_digest   TEXT NOT NULL,
    reason         TEXT NOT NULL,
    at             INTEGER NOT NULL
);
-- retention's evidence check: an event this consumer quarantined is never purged (inbox_has)
CREATE INDEX obx_inbox_quarantine_event ON obx_inbox_quarantine (consumer_id, event_id);

CREATE TABLE obx_consume_audit (
    audit_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    at          INTEGER NOT NULL,
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    duration_us INTEGER NOT NULL,
    detail      TEXT NOT NULL
);
CREATE INDEX obx_consume_audit_event ON obx_consume_audit (event_id);

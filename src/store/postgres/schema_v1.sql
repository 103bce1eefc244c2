-- obx outbox schema, version 1 (PostgreSQL 13+). Applied by obx_store_init() / `obx init` in one
-- transaction, under an advisory lock, by src/store/postgres/pg_store.c.
--
-- Mirrors src/store/sqlite/schema_v1.sql table by table and column by column (same names, so a
-- diagnostic query written for one backend runs on the other with `SET search_path = obx`).
-- PostgreSQL-only additions, each explained where it is defined:
--   * obx_stat_delta + statement triggers: O(1) statistics with millions of PUBLISHED rows;
--   * a statement trigger that NOTIFYs channel obx_work when events are inserted;
--   * TRUNCATE guards (TRUNCATE bypasses row triggers);
--   * SQL functions: obx.enqueue() (any language can enqueue inside its own transaction), the
--     canonical encodings and digests of src/core/canon.c, obx.create_roles().
--
-- Error codes raised here (mapped by pg_store.c's map_error):
--   OB001 frozen data (OBX_EIMMUTABLE)   OB002 invalid input (OBX_EINVAL)
--   OB003 over a limit (OBX_ETOOBIG)     OB004 no route (OBX_ENOROUTE)
-- Every SECURITY DEFINER function pins search_path and names every object with its schema.

CREATE SCHEMA IF NOT EXISTS obx;
REVOKE ALL ON SCHEMA obx FROM PUBLIC;

CREATE TABLE obx.obx_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Route policy: every `obx route set` appends a generation; the highest one per event type is
-- current. Events freeze the generation they were enqueued under.
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
    created_at    BIGINT NOT NULL
);
CREATE INDEX obx_route_type ON obx.obx_route (event_type, gen);

-- One row per (event, envelope generation): outboxEnvelope.v1 + destination.v1, frozen.
CREATE TABLE obx.obx_envelope (
    event_id          TEXT NOT NULL,
    envelope_gen      INTEGER NOT NULL CHECK (envelope_gen >= 1),
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
    PRIMARY KEY (event_id, envelope_gen)
);

-- Raises OB001 with the trigger's first argument as the message.
CREATE FUNCTION obx._refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE = TG_ARGV[0];
END $$;

-- Every column but the payload is frozen; the payload may only become NULL (purge). Comparing
-- the whole row with the payload blanked out keeps this true for columns added later.
CREATE FUNCTION obx._envelope_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
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
-- forged payload — a rewrite in all but name.
CREATE FUNCTION obx._envelope_generation() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    g1 obx.obx_envelope;
BEGIN
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
CREATE TRIGGER obx_envelope_generation BEFORE INSERT ON obx.obx_envelope
    FOR EACH ROW WHEN (NEW.envelope_gen > 1) EXECUTE FUNCTION obx._envelope_generation();
CREATE TRIGGER obx_envelope_no_delete BEFORE DELETE ON obx.obx_envelope
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: envelopes are never deleted (purge keeps a tombstone)');
CREATE TRIGGER obx_envelope_no_truncate BEFORE TRUNCATE ON obx.obx_envelope
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: envelopes are never deleted (purge keeps a tombstone)');

-- Protocol state of each event (current envelope generation).
-- seq is the per-key order: obx takes an advisory lock on the order key's bucket before drawing
-- it, so that per order key seq order is commit order (see pg_store.c, Q_INS_EVENT).
CREATE TABLE obx.obx_event (
    seq                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           TEXT NOT NULL UNIQUE,
    tenant             TEXT NOT NULL,
    idempotency_key    TEXT,
    event_type         TEXT NOT NULL,
    correlation_id     TEXT NOT NULL,
    order_key          TEXT NOT NULL,   -- cluster \x1f topic \x1f routing key
    envelope_gen       INTEGER NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('PENDING','CLAIMED','SENDING','PUBLISHED',
                        'RETAINED','PURGED','DISPATCH_UNKNOWN','RECONCILING','RETRY_CLAIMED','PARKED')),
    claim_gen          BIGINT NOT NULL,
    owner              TEXT NOT NULL,
    lease_until        BIGINT NOT NULL,
    attempt_gen        INTEGER NOT NULL,
    attempt_id         TEXT NOT NULL,
    pinned_partition   INTEGER NOT NULL,
    rejections         INTEGER NOT NULL,
    available_at       BIGINT NOT NULL,
    next_check_at      BIGINT NOT NULL,
    unknown_since      BIGINT NOT NULL,
    primary_attempt_id TEXT NOT NULL,
    published_at       BIGINT NOT NULL,
    committed_at       BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    max_attempts       INTEGER NOT NULL,
    blind_retry        BOOLEAN NOT NULL,
    unordered          BOOLEAN NOT NULL,
    alias              TEXT NOT NULL,
    dest_cluster       TEXT NOT NULL
);
-- Partial indexes: the published bulk (millions of rows) is in none of the claim/sweep indexes.
-- The predicates are written exactly as the queries in pg_store.c write them, so the planner
-- can match them.
CREATE UNIQUE INDEX obx_event_idem ON obx.obx_event (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX obx_event_claimable ON obx.obx_event (seq) WHERE state IN ('PENDING', 'CLAIMED');
CREATE INDEX obx_event_unpublished ON obx.obx_event (order_key, seq)
    WHERE state IN ('PENDING','CLAIMED','SENDING','DISPATCH_UNKNOWN','RECONCILING','RETRY_CLAIMED','PARKED');
CREATE INDEX obx_event_inflight ON obx.obx_event (state, lease_until)
    WHERE state IN ('SENDING', 'DISPATCH_UNKNOWN', 'RECONCILING', 'RETRY_CLAIMED');
-- Sweeps of the published bucket (OBX__SEL_PUBLISHED_BEFORE). Partial, unlike SQLite's: the
-- transient states (PENDING -> CLAIMED -> SENDING) never write to it, and a claim cannot pick it.
CREATE INDEX obx_event_state_pub ON obx.obx_event (state, published_at)
    WHERE state IN ('PUBLISHED', 'RETAINED', 'PURGED');
CREATE INDEX obx_event_corr ON obx.obx_event (correlation_id) WHERE correlation_id <> '';
-- A queue table: most rows change state a few times soon after insert. Fresh statistics keep the
-- claim on the ordered obx_event_claimable scan (on a never-analyzed table the planner can prefer
-- a bitmap scan and a sort of every claimable row), and frequent vacuums keep it small.
ALTER TABLE obx.obx_event SET (autovacuum_vacuum_scale_factor = 0.02,
                               autovacuum_analyze_scale_factor = 0.02);

CREATE TRIGGER obx_event_frozen BEFORE UPDATE ON obx.obx_event FOR EACH ROW
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
CREATE TRIGGER obx_event_no_delete BEFORE DELETE ON obx.obx_event
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: events are never deleted (purge keeps a tombstone)');
CREATE TRIGGER obx_event_no_truncate BEFORE TRUNCATE ON obx.obx_event
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: events are never deleted (purge keeps a tombstone)');

-- Every send: registered before it goes out (CLAIMED/RETRY_CLAIMED -> SENDING).
CREATE TABLE obx.obx_attempt (
    attempt_id    TEXT PRIMARY KEY,
    event_id      TEXT NOT NULL,
    envelope_gen  INTEGER NOT NULL,
    attempt_gen   INTEGER NOT NULL,
    claim_gen     BIGINT NOT NULL,
    owner         TEXT NOT NULL,
    dest_digest   TEXT NOT NULL,
    partition     INTEGER NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('SENDING','UNKNOWN','ACCEPTED','DUPLICATE',
                   'REJECTED','NOT_FOUND','QUARANTINED')),
    started_at    BIGINT NOT NULL,
    unknown_at    BIGINT NOT NULL,
    ended_at      BIGINT NOT NULL,
    offset_before BIGINT NOT NULL,
    quiet_until   BIGINT NOT NULL,
    detail        TEXT NOT NULL
);
CREATE INDEX obx_attempt_event ON obx.obx_attempt (event_id, attempt_gen);
CREATE INDEX obx_attempt_unknown ON obx.obx_attempt (attempt_id) WHERE state = 'UNKNOWN';

CREATE TRIGGER obx_attempt_frozen BEFORE UPDATE ON obx.obx_attempt FOR EACH ROW
    WHEN (NEW.attempt_id IS DISTINCT FROM OLD.attempt_id OR NEW.event_id IS DISTINCT FROM OLD.event_id
       OR NEW.envelope_gen IS DISTINCT FROM OLD.envelope_gen
       OR NEW.attempt_gen IS DISTINCT FROM OLD.attempt_gen
       OR NEW.claim_gen IS DISTINCT FROM OLD.claim_gen OR NEW.owner IS DISTINCT FROM OLD.owner
       OR NEW.dest_digest IS DISTINCT FROM OLD.dest_digest
       OR NEW.started_at IS DISTINCT FROM OLD.started_at)
    EXECUTE FUNCTION obx._refuse('obx: an attempt''s identity and destination cannot change');

-- Receipts: the primary one fills the publish slot (at most one per event and generation);
-- further valid ACKs are duplicate transport receipts; contradicting ones are quarantined;
-- migrations leave a migration receipt.
CREATE TABLE obx.obx_receipt (
    receipt_id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       TEXT NOT NULL,
    envelope_gen   INTEGER NOT NULL,
    attempt_id     TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('PRIMARY','DUPLICATE','QUARANTINED','MIGRATION')),
    cluster        TEXT NOT NULL,
    topic          TEXT NOT NULL,
    partition      INTEGER NOT NULL,
    "offset"       BIGINT NOT NULL,
    broker_ts      BIGINT NOT NULL,
    payload_digest TEXT NOT NULL,
    dest_digest    TEXT NOT NULL,
    reason         TEXT NOT NULL,
    detail         TEXT,
    created_at     BIGINT NOT NULL
);
CREATE UNIQUE INDEX obx_receipt_primary ON obx.obx_receipt (event_id, envelope_gen) WHERE kind = 'PRIMARY';
CREATE INDEX obx_receipt_event ON obx.obx_receipt (event_id);
CREATE INDEX obx_receipt_kind ON obx.obx_receipt (kind) WHERE kind IN ('QUARANTINED', 'MIGRATION');

CREATE TRIGGER obx_receipt_frozen BEFORE UPDATE ON obx.obx_receipt
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: receipts are evidence and cannot change');

-- Who moved what, when, and why: one row per state change (and per refused stale action).
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

CREATE TABLE obx.obx_counter (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

-- Consumer side (the inbox, docs/design.md, "Consumers and the inbox"). These tables live in the
-- consumer's database, which may or may not be the outbox database.
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
    PRIMARY KEY (consumer_id, event_id)
);

CREATE TABLE obx.obx_poison (
    consumer_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('PARKED', 'REDRIVE', 'DONE')),
    failures    INTEGER NOT NULL,
    last_error  TEXT NOT NULL,
    topic       TEXT NOT NULL,
    partition   INTEGER NOT NULL,
    "offset"    BIGINT NOT NULL,
    headers     TEXT NOT NULL,
    payload     BYTEA,
    parked_at   BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, event_id)
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

-- ---- statistics without counting the published bulk ------------------------------------------
-- `SELECT state, count(*)` over millions of PUBLISHED rows takes seconds. Instead, statement
-- triggers append one (key, delta) row per key a statement changed: 'state:<STATE>' for events,
-- 'receipt:<KIND>' for receipts; obx._stats() sums them. The table is insert-only for writers,
-- so it adds no lock contention between transactions; obx._compact_stats() folds old rows into
-- one per key (SKIP LOCKED: it never waits for, nor blocks, anyone). Exactness: every change of
-- obx_event.state and every receipt insert/delete goes through these triggers in the writer's
-- own transaction, and events cannot be deleted or truncated.
CREATE TABLE obx.obx_stat_delta (
    id  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key TEXT NOT NULL,
    n   BIGINT NOT NULL
);

CREATE FUNCTION obx._compact_stats() RETURNS void LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    WITH d AS (
        DELETE FROM obx.obx_stat_delta WHERE id IN (
            SELECT id FROM obx.obx_stat_delta ORDER BY id LIMIT 10000 FOR UPDATE SKIP LOCKED)
        RETURNING key, n)
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT key, sum(n) FROM d GROUP BY key HAVING sum(n) <> 0;
$$;

-- After INSERT on obx_event: count the new rows by state, and wake idle relays. NOTIFY is
-- delivered at commit (never for a rolled-back insert) and coalesced per transaction; it is only
-- a hint, relays always find work by querying committed rows.
CREATE FUNCTION obx._event_inserted() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT 'state:' || state, count(*) FROM obx_new GROUP BY state;
    IF FOUND THEN
        PERFORM pg_notify('obx_work', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER obx_event_inserted AFTER INSERT ON obx.obx_event
    REFERENCING NEW TABLE AS obx_new FOR EACH STATEMENT EXECUTE FUNCTION obx._event_inserted();

-- After UPDATE on obx_event: the net change per state. Relays update constantly, so they also
-- compact now and then.
CREATE FUNCTION obx._event_updated() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT 'state:' || state, sum(d) FROM (
        SELECT state, 1 AS d FROM obx_new UNION ALL SELECT state, -1 FROM obx_old) x
    GROUP BY state HAVING sum(d) <> 0;
    IF random() < 1.0 / 256 THEN
        PERFORM obx._compact_stats();
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER obx_event_updated AFTER UPDATE ON obx.obx_event
    REFERENCING OLD TABLE AS obx_old NEW TABLE AS obx_new
    FOR EACH STATEMENT EXECUTE FUNCTION obx._event_updated();

CREATE FUNCTION obx._receipt_inserted() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO obx.obx_stat_delta (key, n)
    SELECT 'receipt:' || kind, count(*) FROM obx_new GROUP BY kind;
    RETURN NULL;
END $$;
CREATE TRIGGER obx_receipt_inserted AFTER INSERT ON obx.obx_receipt
    REFERENCING NEW TABLE AS obx_new FOR EACH STATEMENT EXECUTE FUNCTION obx._receipt_inserted();

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
-- 'receipt:<KIND>', 'oldest_pending', 'oldest_unknown', 'attempts_unknown'. Compacts first when
-- the delta table has grown (not in a read-only transaction, e.g. on a standby).
CREATE FUNCTION obx._stats() RETURNS TABLE (k text, v bigint) LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
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
         WHERE a.state = 'UNKNOWN' AND e.primary_attempt_id = '';
END $$;

-- ---- canonical encodings and digests (src/core/canon.c; tests/data/digest_vectors.json) -------
-- Each field: u32 big-endian byte length || UTF-8 bytes; integers as decimal ASCII; an absent
-- optional field (NULL) is the empty string.
-- These SQL functions carry no SET clause on purpose: PostgreSQL inlines them into the caller's
-- query only then (with SET search_path one digest took ~0.5 ms instead of ~10 us). They are
-- not SECURITY DEFINER, so a caller runs them with its own rights, and obx.enqueue() calls them
-- under its pinned search_path.
-- The canonical encodings and digests are STABLE, as convert_to() is: an IMMUTABLE SQL function
-- whose body is only STABLE is never inlined, so each call ran its own executor (22 per
-- obx.enqueue(), a fifth of its time; docs/performance.md). Inlined, they cost next to nothing.
CREATE FUNCTION obx._field(s text) RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT int4send(octet_length(convert_to(coalesce(s, ''), 'UTF8'))) || convert_to(coalesce(s, ''), 'UTF8')
$$;

CREATE FUNCTION obx.dest_canonical(cluster text, topic text, routing_key text, algorithm text,
                                   route_policy_gen bigint, serializer text, durability text,
                                   required_acks text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT obx._field('obx.destination.v1') || obx._field($1) || obx._field($2) || obx._field($3)
        || obx._field($4) || obx._field($5::text) || obx._field($6) || obx._field($7)
        || obx._field($8)
$$;

CREATE FUNCTION obx.dest_digest(cluster text, topic text, routing_key text, algorithm text,
                                route_policy_gen bigint, serializer text, durability text,
                                required_acks text)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT 'sha256:' || encode(sha256(obx.dest_canonical($1, $2, $3, $4, $5, $6, $7, $8)), 'hex')
$$;

CREATE FUNCTION obx.envelope_canonical(event_id text, envelope_gen integer, aggregate_type text,
                                       aggregate_id text, aggregate_version bigint,
                                       event_type text, payload_schema text,
                                       payload_digest text, tenant text, occurred_at bigint,
                                       created_txid text, correlation_id text,
                                       causation_id text, traceparent text,
                                       idempotency_key text)
RETURNS bytea LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT obx._field('obx.outboxEnvelope.v1') || obx._field($1) || obx._field($2::text)
        || obx._field($3) || obx._field($4) || obx._field($5::text) || obx._field($6)
        || obx._field($7) || obx._field($8) || obx._field($9) || obx._field($10::text)
        || obx._field($11) || obx._field($12) || obx._field($13) || obx._field($14)
        || obx._field($15)
$$;

CREATE FUNCTION obx.envelope_digest(event_id text, envelope_gen integer, aggregate_type text,
                                    aggregate_id text, aggregate_version bigint, event_type text,
                                    payload_schema text, payload_digest text, tenant text,
                                    occurred_at bigint, created_txid text, correlation_id text,
                                    causation_id text, traceparent text, idempotency_key text)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT 'sha256:' || encode(sha256(obx.envelope_canonical($1, $2, $3, $4, $5, $6, $7, $8, $9,
                                                             $10, $11, $12, $13, $14, $15)), 'hex')
$$;

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

-- "evt-" + ULID: 48-bit ms time and 80 random bits in Crockford base32 (src/core/ulid.c). The
-- random bits are bytes 0-5 and 10-13 of a version-4 UUID (the bytes without version or variant
-- bits); the top bit is cleared as the C generator does. IDs from one transaction are unique
-- but, unlike the C generator's, not monotonic within a millisecond.
CREATE FUNCTION obx._event_id(ms bigint) RETURNS text LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b32 CONSTANT text := '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
    u bytea := uuid_send(gen_random_uuid());
    hi bigint; -- random bits 0..39 (the top bit cleared)
    lo bigint; -- random bits 40..79
BEGIN
    IF ms < 0 OR ms >= (1::bigint << 48) THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002', MESSAGE = format('ULID time %s out of range', ms);
    END IF;
    -- one expression instead of a loop per bit: this runs once per obx.enqueue()
    -- (docs/performance.md, producer overhead)
    hi := ((get_byte(u, 0) & 127)::bigint << 32) | (get_byte(u, 1)::bigint << 24)
        | (get_byte(u, 2)::bigint << 16) | (get_byte(u, 3)::bigint << 8) | get_byte(u, 4);
    lo := (get_byte(u, 5)::bigint << 32) | (get_byte(u, 10)::bigint << 24)
        | (get_byte(u, 11)::bigint << 16) | (get_byte(u, 12)::bigint << 8) | get_byte(u, 13);
    RETURN 'evt-'
        || substr(b32, ((ms >> 45) & 31)::int + 1, 1) || substr(b32, ((ms >> 40) & 31)::int + 1, 1)
        || substr(b32, ((ms >> 35) & 31)::int + 1, 1) || substr(b32, ((ms >> 30) & 31)::int + 1, 1)
        || substr(b32, ((ms >> 25) & 31)::int + 1, 1) || substr(b32, ((ms >> 20) & 31)::int + 1, 1)
        || substr(b32, ((ms >> 15) & 31)::int + 1, 1) || substr(b32, ((ms >> 10) & 31)::int + 1, 1)
        || substr(b32, ((ms >> 5) & 31)::int + 1, 1) || substr(b32, (ms & 31)::int + 1, 1)
        || substr(b32, ((hi >> 35) & 31)::int + 1, 1) || substr(b32, ((hi >> 30) & 31)::int + 1, 1)
        || substr(b32, ((hi >> 25) & 31)::int + 1, 1) || substr(b32, ((hi >> 20) & 31)::int + 1, 1)
        || substr(b32, ((hi >> 15) & 31)::int + 1, 1) || substr(b32, ((hi >> 10) & 31)::int + 1, 1)
        || substr(b32, ((hi >> 5) & 31)::int + 1, 1) || substr(b32, (hi & 31)::int + 1, 1)
        || substr(b32, ((lo >> 35) & 31)::int + 1, 1) || substr(b32, ((lo >> 30) & 31)::int + 1, 1)
        || substr(b32, ((lo >> 25) & 31)::int + 1, 1) || substr(b32, ((lo >> 20) & 31)::int + 1, 1)
        || substr(b32, ((lo >> 15) & 31)::int + 1, 1) || substr(b32, ((lo >> 10) & 31)::int + 1, 1)
        || substr(b32, ((lo >> 5) & 31)::int + 1, 1) || substr(b32, (lo & 31)::int + 1, 1);
END $$;

-- Producer access to its own events: rows whose enqueue audit row names the session user (the
-- login role; obx.enqueue records it as `who`).
CREATE VIEW obx.producer_events AS
    SELECT e.event_id, e.tenant, e.event_type, v.aggregate_type, v.aggregate_id,
           v.aggregate_version, e.idempotency_key, e.correlation_id, e.state, e.envelope_gen,
           e.committed_at, e.published_at, v.occurred_at, v.created_txid, v.payload_digest,
           v.envelope_digest, v.dest_cluster, v.dest_topic, v.dest_routing_key, v.dest_digest
      FROM obx.obx_event e
      JOIN obx.obx_envelope v ON v.event_id = e.event_id AND v.envelope_gen = e.envelope_gen
     WHERE EXISTS (SELECT 1 FROM obx.obx_audit a
                    WHERE a.event_id = e.event_id AND a.from_state = 'NONE'
                      AND a.to_state = 'PENDING' AND a.who = session_user::text);

-- obx.enqueue(): validates like obx_enqueue() (same limits, character sets and messages), honours
-- the idempotency key (returns the first event's ID), resolves the current route, freezes the
-- destination, computes the same canonical digests as the C code, and inserts the envelope, the
-- PENDING event and the audit row inside the caller's transaction. Returns the event ID.
-- The payload limit is 1 MiB unless the setting obx.payload_limit says otherwise.
CREATE FUNCTION obx.enqueue(event_type text, aggregate_type text, aggregate_id text,
                            aggregate_version bigint, tenant text, payload bytea,
                            payload_schema text DEFAULT NULL, correlation_id text DEFAULT NULL,
                            causation_id text DEFAULT NULL, traceparent text DEFAULT NULL,
                            idempotency_key text DEFAULT NULL,
                            occurred_at timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
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
    limit_bytes bigint := coalesce(nullif(current_setting('obx.payload_limit', true), '')::bigint, 1048576);
    now_ms bigint := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    occ_ms bigint;
    rt obx.obx_route;
    existing text;
    tpl text;
    rk text;
    id text;
    txid text;
    pdigest text;
    ddigest text;
    edigest text;
    okey text;
BEGIN
    -- the common case, every field valid, in one expression; otherwise obx._check() finds the
    -- first bad field and says what is wrong with it (docs/performance.md, producer overhead)
    IF NOT coalesce(p_type COLLATE "C" ~ '^[a-z0-9._-]{1,128}$' AND p_type ~ '\.v[0-9]+$'
           AND p_atype COLLATE "C" ~ '^[A-Za-z0-9._-]{1,128}$'
           AND p_tenant COLLATE "C" ~ '^[A-Za-z0-9._-]{1,128}$'
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
    IF p_schema IS NOT NULL AND p_schema !~ '^sha256:[0-9a-f]{64}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002',
            MESSAGE = 'payload_schema: must be "sha256:" + 64 lowercase hex';
    END IF;
    IF p_trace <> '' AND p_trace !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
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
    -- since does not turn a retry into an error)
    IF p_key <> '' THEN
        SELECT e.event_id INTO existing FROM obx.obx_event e
         WHERE e.tenant = p_tenant AND e.idempotency_key = p_key;
        IF existing IS NOT NULL THEN
            RETURN existing;
        END IF;
    END IF;

    SELECT * INTO rt FROM obx.obx_route r WHERE r.event_type = p_type ORDER BY r.gen DESC LIMIT 1;
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
    txid := pg_current_xact_id()::text;
    p_schema := coalesce(p_schema, 'sha256:' || encode(sha256(convert_to('schema:' || p_type, 'UTF8')), 'hex'));
    pdigest := 'sha256:' || encode(sha256(p_payload), 'hex');
    ddigest := obx.dest_digest(rt.cluster, rt.topic, rk, rt.algorithm, rt.gen, rt.serializer,
                               rt.durability, rt.required_acks);
    edigest := obx.envelope_digest(id, 1, p_atype, p_aid, p_aver, p_type, p_schema, pdigest,
                                   p_tenant, occ_ms, txid, p_corr, p_cause, p_trace, p_key);
    okey := rt.cluster || chr(31) || rt.topic || chr(31) || rk;

    -- per order key, seq order must be commit order (see Q_INS_EVENT in pg_store.c): the lock on
    -- the key's bucket is held until the caller's transaction ends
    PERFORM pg_advisory_xact_lock(5194328, hashtext(okey) & 1023);
    -- The event row first, so that a concurrent producer with the same idempotency key is met by
    -- ON CONFLICT (it waits for that transaction, then does nothing) rather than by an error:
    -- no subtransaction per call (an EXCEPTION block would open one, and thousands of them in
    -- one transaction overflow PostgreSQL's subtransaction cache, slowing every session).
    INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, correlation_id,
        order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen,
        attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since,
        primary_attempt_id, published_at, committed_at, updated_at, max_attempts,
        blind_retry, unordered, alias, dest_cluster)
    VALUES (id, p_tenant, nullif(p_key, ''), p_type, p_corr, okey, 1, 'PENDING', 0, '', 0, 0,
        '', -1, 0, now_ms, 0, 0, '', 0, now_ms, now_ms, rt.max_attempts, rt.blind_retry,
        rt.unordered, rt.alias, rt.cluster)
    ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
    IF NOT FOUND THEN
        -- the concurrent producer committed first: its event is the answer (visible to this new
        -- statement under READ COMMITTED; REPEATABLE READ raised a serialization failure above)
        SELECT e.event_id INTO existing FROM obx.obx_event e
         WHERE e.tenant = p_tenant AND e.idempotency_key = p_key;
        IF existing IS NOT NULL THEN
            RETURN existing;
        END IF;
        RAISE EXCEPTION USING ERRCODE = '23505',
            MESSAGE = format('idempotency_key: %L of tenant %L is taken by an event this transaction cannot see', p_key, p_tenant);
    END IF;
    INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id,
        aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at,
        created_txid, correlation_id, causation_id, traceparent, idempotency_key,
        envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm,
        dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload,
        payload_len, created_at)
    VALUES (id, 1, p_atype, p_aid, p_aver, p_type, p_schema, pdigest, p_tenant, occ_ms, txid,
        p_corr, p_cause, p_trace, p_key, edigest, rt.cluster, rt.topic, rk, rt.algorithm,
        rt.gen, rt.serializer, rt.durability, rt.required_acks, ddigest, p_payload,
        octet_length(p_payload), now_ms);
    INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, from_state, to_state,
        claim_gen, attempt_id, attempt_gen, reason)
    VALUES (now_ms, 'producer', session_user::text, id, 1, 'NONE', 'PENDING', 0, '', 0,
        format('enqueued under route generation %s', rt.gen));
    RETURN id;
END $$;

-- ---- least-privilege roles (obx init --roles PREFIX) --------------------------------------------
-- <prefix>_producer: enqueue through obx.enqueue() and read its own events (producer_events);
-- <prefix>_relay:    read the outbox, move event states, register attempts, write receipts,
--                    audit rows and counters, insert new envelope generations (migration) and
--                    drop payloads (purge: UPDATE of the payload column only); the inbox tables;
-- <prefix>_auditor:  read everything;
-- <prefix>_consumer: the inbox tables only, and there only the rows of the consumer IDs and
--                    tenants obx.obx_consumer_grant lists for the connected role: row-level
--                    security, enabled on the inbox tables by this function (their owner, who
--                    ran `obx init`, is not subject to it; relay and auditor see every row).
-- Nobody, the owner included, can change a frozen envelope or destination: the triggers above.
-- The roles are NOLOGIN groups: grant them to login roles (GRANT <prefix>_relay TO relay_app).
-- Idempotent: re-running only re-grants.
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

    EXECUTE format('GRANT EXECUTE ON FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz) TO %I', p);
    EXECUTE format('GRANT SELECT ON obx.producer_events TO %I', p);

    EXECUTE format('GRANT SELECT ON obx.obx_route, obx.obx_envelope, obx.obx_event, obx.obx_attempt,
        obx.obx_receipt, obx.obx_audit, obx.obx_counter TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_envelope TO %I', r);
    EXECUTE format('GRANT UPDATE (payload) ON obx.obx_envelope TO %I', r);
    EXECUTE format('GRANT UPDATE (envelope_gen, state, claim_gen, owner, lease_until, attempt_gen,
        attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since,
        primary_attempt_id, published_at, updated_at, order_key, dest_cluster) ON obx.obx_event TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_attempt TO %I', r);
    EXECUTE format('GRANT UPDATE (partition, state, unknown_at, ended_at, offset_before, quiet_until,
        detail) ON obx.obx_attempt TO %I', r);
    EXECUTE format('GRANT INSERT ON obx.obx_receipt, obx.obx_audit TO %I', r);
    EXECUTE format('GRANT INSERT, UPDATE ON obx.obx_counter TO %I', r);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON obx.obx_inbox, obx.obx_consumer_watermark,
        obx.obx_inbox_failure, obx.obx_poison, obx.obx_inbox_quarantine, obx.obx_consume_audit TO %I', r);
    EXECUTE format('GRANT EXECUTE ON FUNCTION obx._stats() TO %I, %I', r, a);

    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA obx TO %I', a);

    -- consumer: schema version, its grants, the inbox tables; nothing of the outbox
    EXECUTE format('GRANT USAGE ON SCHEMA obx TO %I', c);
    EXECUTE format('GRANT SELECT ON obx.obx_meta, obx.obx_consumer_grant TO %I', c);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON obx.obx_inbox, obx.obx_consumer_watermark,
        obx.obx_inbox_failure, obx.obx_poison, obx.obx_inbox_quarantine, obx.obx_consume_audit TO %I', c);
    ALTER TABLE obx.obx_consumer_grant ENABLE ROW LEVEL SECURITY;
    EXECUTE format('DROP POLICY IF EXISTS %I ON obx.obx_consumer_grant', c || '_own');
    EXECUTE format('CREATE POLICY %I ON obx.obx_consumer_grant FOR SELECT TO %I
        USING (pg_has_role(current_user, role_name, ''MEMBER''))', c || '_own', c);
    EXECUTE format('DROP POLICY IF EXISTS %I ON obx.obx_consumer_grant', a || '_all');
    EXECUTE format('CREATE POLICY %I ON obx.obx_consumer_grant FOR SELECT TO %I USING (true)',
        a || '_all', a);
    FOREACH t IN ARRAY ARRAY['obx_inbox', 'obx_consumer_watermark', 'obx_inbox_failure',
                             'obx_poison', 'obx_inbox_quarantine', 'obx_consume_audit'] LOOP
        EXECUTE format('ALTER TABLE obx.%I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS %I ON obx.%I', prefix || '_all', t);
        EXECUTE format('CREATE POLICY %I ON obx.%I TO %I, %I USING (true) WITH CHECK (true)',
            prefix || '_all', t, r, a);
        -- the consumer's rows: its granted consumer IDs and, where a row names one, tenants
        -- (columns qualified with the table: inside the subquery g's columns would win)
        rows := format('EXISTS (SELECT 1 FROM obx.obx_consumer_grant g WHERE '
            'pg_has_role(current_user, g.role_name, ''MEMBER'') AND g.consumer_id = %I.consumer_id%s)',
            t, CASE WHEN t = 'obx_inbox' THEN format(' AND g.tenant IN (%I.tenant, ''*'')', t)
                    ELSE '' END);
        EXECUTE format('DROP POLICY IF EXISTS %I ON obx.%I', c || '_rows', t);
        EXECUTE format('CREATE POLICY %I ON obx.%I TO %I USING (%s) WITH CHECK (%s)', c || '_rows',
            t, c, rows, rows);
    END LOOP;
END $$;

-- Functions are executable by PUBLIC by default: nobody but the owner and the roles above.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA obx FROM PUBLIC;

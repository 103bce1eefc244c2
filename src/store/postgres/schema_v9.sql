-- obx outbox schema, version 9 (PostgreSQL): a cheaper enqueue (issue 19, docs/performance.md
-- section 3, "Schema version 9"): the producer's first audit row recorded in the envelope, and
-- the event's state checked against an enum. Applied after version 8 by pg_store.c's migrate, in
-- the same transaction, under the init advisory lock. No row is rewritten or scanned: a column
-- (NULL in every existing row, so adding it writes nothing), a type, a constraint, two views and
-- one function change, so the upgrade's time does not depend on the outbox's size.
--
--   * Every enqueue wrote four rows: the envelope, the event, an obx_audit row (NONE ->
--     PENDING) and the statistics delta. The audit row was 17 us of server time, two index
--     entries and about 420 of the 5,250 WAL bytes of a business transaction with an enqueue
--     (docs/performance.md). Everything in it but one field is already in generation 1's
--     envelope: the time (created_at), the actor (the producer), the event and generation, the
--     transition, and the route generation of its reason (dest_route_gen). The one field, who
--     enqueued (obx.enqueue(): the session user; the C path: "producer"), is now the envelope's
--     created_by, and obx.enqueue() and the C path (pg_store.c's Q_INS_EVENT_AUDIT and
--     Q_ENQ_WRITE) write no audit row. The envelope is frozen (obx._envelope_frozen compares
--     every column), so this evidence cannot change any more than an audit row could.
--   * Readers see the same rows. pg_store.c's Q_LOAD_AUDIT (obx inspect, obx trace, the
--     auditor) and obx.obx_audit_all give an envelope with created_by as the event's first
--     row: at = created_at, actor 'producer', who = created_by, envelope generation 1, NONE ->
--     PENDING, claim 0, no attempt, reason 'enqueued under route generation ' || dest_route_gen,
--     exactly what the audit row held (test_store_pg compares every field with the row the
--     producer gave; SQLite still writes the row). In obx_audit_all its audit_id is NULL: it was
--     written with the envelope, before any other row of the event.
--     obx.producer_events finds a producer's events by either record.
--   * created_by is NULL on envelopes written before this version (their first row is the
--     obx_audit row, as before), on further generations (a migration's row is an audit batch),
--     and wherever a writer recorded its own audit row (the C path does, for any row that is
--     not exactly the one above). Only generation 1's is read: a further generation's
--     created_by means nothing (no CHECK says so, to keep its evaluation off every insert).

ALTER TABLE obx.obx_envelope ADD COLUMN created_by TEXT;

--   * The event's state check, cheaper. PostgreSQL prepares a table's CHECK constraints again
--     for every statement that writes it: it parses the stored expression and simplifies it.
--     Version 1's `state = ANY (ARRAY['PENDING', ... 'PARKED'])` is stored as the array's bytes,
--     one number per byte, and parsing it was about 75,000 of the 850,000 instructions the
--     server spends on a C enqueue (callgrind, docs/performance.md); a producer's statement
--     writes one row, so nothing spreads that cost. The same ten states as an enum, and the
--     check a cast to it: the stored expression is a few nodes, the labels are looked up in
--     the server's cache, and a state outside the list is still refused by everyone, the owner
--     included (SQLSTATE 22P02, `invalid input value for enum obx.event_state: "..."`, where it
--     was 23514). The column stays text, so nothing that reads or writes it changes. NOT VALID:
--     every existing row passed the check this one replaces, and validating would read the
--     whole table; PostgreSQL enforces a NOT VALID check on every row written from now on.
CREATE TYPE obx.event_state AS ENUM ('PENDING', 'CLAIMED', 'SENDING', 'PUBLISHED', 'RETAINED',
    'PURGED', 'DISPATCH_UNKNOWN', 'RECONCILING', 'RETRY_CLAIMED', 'PARKED');
ALTER TABLE obx.obx_event DROP CONSTRAINT obx_event_state_check,
    ADD CONSTRAINT obx_event_state_check CHECK (state::obx.event_state IS NOT NULL) NOT VALID;

-- Every audit row, one per transition (version 7's view), and the first row of each event
-- recorded in its envelope.
CREATE OR REPLACE VIEW obx.obx_audit_all AS
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

-- Producer access to its own events: those whose first row names the session user, in the
-- envelope (from this version) or in obx_audit (before).
CREATE OR REPLACE VIEW obx.producer_events AS
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

-- obx.enqueue(): version 6's function, the same contract, validation, messages and rows, except
-- that who enqueued is the envelope's created_by instead of an audit row.
CREATE OR REPLACE FUNCTION obx.enqueue(event_type text, aggregate_type text, aggregate_id text,
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
    -- since does not turn a retry into an error)
    IF p_key <> '' THEN
        SELECT e.event_id INTO existing FROM obx.obx_event e
         WHERE e.tenant = p_tenant AND e.idempotency_key = p_key;
        IF existing IS NOT NULL THEN
            RETURN existing;
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

    -- One statement: the per-order-key lock (see Q_INS_EVENT in pg_store.c; held until the
    -- caller's transaction ends), then the event row, so that a concurrent producer with the
    -- same idempotency key is met by ON CONFLICT (it waits for that transaction, then inserts
    -- nothing: no envelope or delta either, they are fed by the event's RETURNING) rather than
    -- by an error, without a subtransaction per call; the envelope with the digests computed
    -- inline (schema_v1.sql's STABLE SQL functions, inlined) and who enqueued (created_by: the
    -- first audit row, schema_v9.sql); the statistics delta; the NOTIFY (delivered at commit,
    -- coalesced per transaction).
    WITH lk AS MATERIALIZED (SELECT pg_advisory_xact_lock(5194328, hashtext(okey) & 1023)),
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
            '', -1, 0, now_ms, 0, 0, '', 0, now_ms, now_ms, rt.max_attempts, rt.blind_retry,
            rt.unordered, rt.alias, rt.cluster FROM f
        ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING event_id),
    env AS (
        INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id,
            aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at,
            created_txid, correlation_id, causation_id, traceparent, idempotency_key,
            envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm,
            dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload,
            payload_len, created_at, created_by)
        SELECT ev.event_id, 1, p_atype, p_aid, p_aver, p_type, f.sch, f.pd, p_tenant, occ_ms,
            f.txid, p_corr, p_cause, p_trace, p_key,
            obx.envelope_digest(ev.event_id, 1, p_atype, p_aid, p_aver, p_type, f.sch, f.pd,
                                p_tenant, occ_ms, f.txid, p_corr, p_cause, p_trace, p_key),
            rt.cluster, rt.topic, rk, rt.algorithm, rt.gen, rt.serializer, rt.durability,
            rt.required_acks,
            obx.dest_digest(rt.cluster, rt.topic, rk, rt.algorithm, rt.gen, rt.serializer,
                            rt.durability, rt.required_acks),
            p_payload, octet_length(p_payload), now_ms, session_user::text
          FROM ev, f),
    st AS (INSERT INTO obx.obx_stat_delta (key, n) SELECT 'state:PENDING', 1 FROM ev)
    SELECT ev.event_id, pg_notify('obx_work', '') INTO existing, notified FROM ev;
    IF existing IS NULL THEN
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
    IF rt.has_set THEN
        PERFORM obx._enqueue_targets(existing);
    END IF;
    RETURN existing;
END $$;

-- obx outbox schema, version 6 (PostgreSQL): a cheaper producer (issue 19, docs/performance.md
-- section 3). Applied after version 5 by pg_store.c's migrate, in the same transaction, under
-- the init advisory lock. No table or index changes: the same rows, the same digests, the same
-- errors; fewer statements per enqueue.
--
--   * No statistics trigger on obx_event inserts. Version 1's statement trigger
--     (obx._event_inserted, a PL/pgSQL function over a transition table) counted every insert
--     into obx_stat_delta and sent the NOTIFY: 11 % of an obx.enqueue() (docs/performance.md).
--     Every statement that inserts events now writes its own delta and NOTIFY in the same
--     statement (data-modifying CTEs): obx.enqueue() and obx._enqueue_targets() below, and
--     pg_store.c's Q_INS_EVENT (obx_enqueue() from C, delivery-set slots, migrations). The
--     count stays exact (the delta commits or rolls back with the rows it counts;
--     test_store_pg's check_stats_exact compares it with count(*) after each path). The
--     updates' and receipts' triggers are unchanged (the relay's side, issue 19's relay slice).
--     Anyone inserting into obx_event by hand (nobody should: the producer role cannot) must
--     add the delta too: `INSERT INTO obx.obx_stat_delta (key, n) VALUES ('state:PENDING', n)`.
--   * obx.enqueue() in one PL/pgSQL function instead of a wrapper around version 1's function
--     plus a call of obx._enqueue_targets() per event: the route and whether its generation has
--     a delivery set in one SELECT, and the order lock, the event, the envelope, the audit row,
--     the statistics delta and the NOTIFY in one INSERT statement (one executor start instead of
--     six). The delivery-set targets are written by obx._enqueue_targets() as before, only when
--     the route generation has a set.
--   * Validation without the bounded regular expressions: `^[a-z0-9._-]{1,128}$` costs about
--     65 us per call on PostgreSQL 15 (its NFA grows with the bound), the length by
--     octet_length() and the character set by an unbounded class about 4 us. Same rules, same
--     messages: a bad field is still named by obx._check() (version 1).
--
-- obx._enqueue_one (version 1's function, wrapped by version 2) is dropped: nothing calls it
-- any more, and EXECUTE on it was revoked from everyone but the owner by version 2.

DROP TRIGGER obx_event_inserted ON obx.obx_event;
DROP FUNCTION obx._event_inserted();

-- The further targets of event `id` (version 2's function): the same rows, and now the
-- statistics delta of the slots it inserts (no insert trigger since this version).
CREATE OR REPLACE FUNCTION obx._enqueue_targets(id text) RETURNS void LANGUAGE plpgsql VOLATILE
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
        -- per order key, seq order is commit order (pg_store.c, Q_INS_EVENT)
        PERFORM pg_advisory_xact_lock(5194328, hashtext(okey) & 1023);
        INSERT INTO obx.obx_event (event_id, tenant, idempotency_key, event_type, correlation_id,
            order_key, envelope_gen, state, claim_gen, owner, lease_until, attempt_gen,
            attempt_id, pinned_partition, rejections, available_at, next_check_at, unknown_since,
            primary_attempt_id, published_at, committed_at, updated_at, max_attempts,
            blind_retry, unordered, alias, dest_cluster)
        VALUES (mid, ev.tenant, NULL, ev.event_type, ev.correlation_id, okey, 1, 'PENDING', 0,
            '', 0, 0, '', -1, 0, now_ms, 0, 0, '', 0, now_ms, now_ms, ev.max_attempts,
            ev.blind_retry, ev.unordered, ev.alias, t.cluster);
        INSERT INTO obx.obx_stat_delta (key, n) VALUES ('state:PENDING', 1);
        INSERT INTO obx.obx_envelope (event_id, envelope_gen, aggregate_type, aggregate_id,
            aggregate_version, event_type, payload_schema, payload_digest, tenant, occurred_at,
            created_txid, correlation_id, causation_id, traceparent, idempotency_key,
            envelope_digest, dest_cluster, dest_topic, dest_routing_key, dest_algorithm,
            dest_route_gen, dest_serializer, dest_durability, dest_acks, dest_digest, payload,
            payload_len, created_at)
        VALUES (mid, 1, env.aggregate_type, env.aggregate_id, env.aggregate_version,
            env.event_type, env.payload_schema, env.payload_digest, env.tenant, env.occurred_at,
            env.created_txid, env.correlation_id, env.causation_id, env.traceparent,
            env.idempotency_key, env.envelope_digest, t.cluster, t.topic, rk, t.algorithm,
            rs.route_gen, t.serializer, t.durability, t.required_acks, ddigest, env.payload,
            env.payload_len, now_ms);
        INSERT INTO obx.obx_delivery_target (slot_id, event_id, target_no, origin, created_at)
        VALUES (mid, id, t.target_no, 'enqueue', now_ms);
        INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, from_state, to_state,
            claim_gen, attempt_id, attempt_gen, reason)
        VALUES (now_ms, 'producer', session_user::text, mid, 1, 'NONE', 'PENDING', 0, '', 0,
            format('target %s of delivery set %s, enqueued under route generation %s',
                   t.target_no, id, rs.route_gen));
    END LOOP;
END $$;

-- obx.enqueue(): the contract of version 1 (validation with obx_enqueue()'s limits, character
-- sets and messages; the idempotency key returns the first event's ID; the current route's
-- destination frozen with its digest; the same canonical digests as the C code; envelope,
-- PENDING event and audit row inside the caller's transaction) and of version 2 (a route
-- generation with a delivery set gives the event its further target slots). Returns the event
-- ID. The payload limit is 1 MiB unless the setting obx.payload_limit says otherwise.
-- CREATE OR REPLACE keeps the signature and the grants (obx.create_roles, versions 1-4).
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
    -- nothing: no envelope, audit row or delta either, they are fed by the event's RETURNING)
    -- rather than by an error, without a subtransaction per call; the envelope with the
    -- digests computed inline (schema_v1.sql's STABLE SQL functions, inlined); the audit row;
    -- the statistics delta; the NOTIFY (delivered at commit, coalesced per transaction).
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
            payload_len, created_at)
        SELECT ev.event_id, 1, p_atype, p_aid, p_aver, p_type, f.sch, f.pd, p_tenant, occ_ms,
            f.txid, p_corr, p_cause, p_trace, p_key,
            obx.envelope_digest(ev.event_id, 1, p_atype, p_aid, p_aver, p_type, f.sch, f.pd,
                                p_tenant, occ_ms, f.txid, p_corr, p_cause, p_trace, p_key),
            rt.cluster, rt.topic, rk, rt.algorithm, rt.gen, rt.serializer, rt.durability,
            rt.required_acks,
            obx.dest_digest(rt.cluster, rt.topic, rk, rt.algorithm, rt.gen, rt.serializer,
                            rt.durability, rt.required_acks),
            p_payload, octet_length(p_payload), now_ms
          FROM ev, f),
    au AS (
        INSERT INTO obx.obx_audit (at, actor, who, event_id, envelope_gen, from_state, to_state,
            claim_gen, attempt_id, attempt_gen, reason)
        SELECT now_ms, 'producer', session_user::text, ev.event_id, 1, 'NONE', 'PENDING', 0, '',
            0, 'enqueued under route generation ' || rt.gen FROM ev),
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

DROP FUNCTION obx._enqueue_one(text, text, text, bigint, text, bytea, text, text, text, text,
                               text, timestamptz);

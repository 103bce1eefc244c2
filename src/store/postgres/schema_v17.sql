-- obx outbox schema, version 17 (PostgreSQL): obx.enqueue() notifies only while a relay of the
-- event's cluster waits for work (issue 19, docs/postgres.md, "NOTIFY"; docs/performance.md
-- section 3). Applied after version 16 by pg_store.c's migrate, in the same transaction, under
-- the init advisory lock; catalogue only.
--
-- PostgreSQL commits the transactions that notified one at a time (a database-wide lock from
-- PreCommit_Notify to the end of the commit, WAL flush included), so with fsync on a NOTIFY on
-- every enqueue costs producers up to half their commit rate. Each cluster has a wake lock,
-- advisory lock (5194330, hashtext(cluster)): a relay's dispatcher holds it exclusively while it
-- waits for that cluster's work (pg_store.c, pg_wait_for_work). An inserting statement notifies
-- only when it cannot take it shared for its transaction; when it can, it holds it until its
-- commit is visible, and a relay that takes the lock afterwards claims once more before it
-- sleeps. The C producer's statements (pg_store.c, NOTIFY_EXPR) and the obx_pg extension's body
-- (obx_pg.c) do the same. obx.notify = 'off' still never notifies and takes no lock.
--
-- obx._enqueue_sql(), the PL/pgSQL body (version 14's), again with one change: its NOTIFY.
-- CREATE OR REPLACE keeps the function's owner and grants.

CREATE OR REPLACE FUNCTION obx._enqueue_sql(event_type text, aggregate_type text, aggregate_id text,
                            aggregate_version bigint, tenant text, payload bytea,
                            payload_schema text DEFAULT NULL, correlation_id text DEFAULT NULL,
                            causation_id text DEFAULT NULL, traceparent text DEFAULT NULL,
                            idempotency_key text DEFAULT NULL,
                            occurred_at timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE AS $$
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
    id := obx._ulid(now_ms, uuid_send(gen_random_uuid()));
    okey := rt.cluster || chr(31) || rt.topic || chr(31) || rk;

    -- One statement: the per-order-key lock (see Q_INS_EVENT in pg_store.c; held until the
    -- caller's transaction ends), then the event row, so that a concurrent producer with the
    -- same idempotency key is met by ON CONFLICT (it waits for that transaction, then inserts
    -- nothing: no envelope or delta either, they are fed by the event's RETURNING) rather than
    -- by an error, without a subtransaction per call; the envelope with the digests computed
    -- inline (the canonical encodings of schema_v1.sql's obx.envelope_canonical and
    -- obx.dest_canonical, written out for values that are never NULL, schema_v10.sql) and who
    -- enqueued (created_by: the first audit row, schema_v9.sql); the statistics delta; the
    -- NOTIFY (delivered at commit, coalesced per transaction).
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
                || int4send(octet_length(p_key)) || convert_to(p_key, 'UTF8')), 'hex'),
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
            p_payload, octet_length(p_payload), now_ms, session_user::text
          FROM ev, f),
    st AS (INSERT INTO obx.obx_stat_delta (key, n) SELECT 'state:PENDING', 1 FROM ev)
    SELECT ev.event_id,
           CASE WHEN current_setting('obx.notify', true) IS NOT DISTINCT FROM 'off' THEN NULL
                WHEN pg_try_advisory_xact_lock_shared(5194330, hashtext(rt.cluster)) THEN NULL
                ELSE pg_notify('obx_work', '') END INTO existing, notified FROM ev;
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

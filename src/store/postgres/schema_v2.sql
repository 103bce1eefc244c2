-- obx outbox schema, version 2 (PostgreSQL): delivery sets (docs/migration.md). Applied after
-- version 1 by pg_store.c's migrate, in the same transaction, under the init advisory lock.
-- Mirrors src/store/sqlite/schema_v2.sql table by table.
--
-- A delivery set is a contract chosen at enqueue time: the event goes to several destinations,
-- each frozen with its own digest, its own attempts and its own publish slot, and a completion
-- rule ('all' or 'any') says when the event counts as delivered. Each slot is an ordinary
-- obx_event row (claims, attempts, the acceptance point and the reconciler apply per target,
-- unchanged); target 1 is the event's own row, a further target's row has its own slot ID and
-- carries the event's ID on the wire. No existing table changes. Functions changed here:
--   * obx.enqueue() becomes a wrapper: the version 1 function (renamed obx._enqueue_one) inserts
--     the event, obx._enqueue_targets() the further targets its route generation declares;
--     whoever could execute obx.enqueue() keeps that right, on the wrapper only;
--   * obx.create_roles() also grants the new tables.

-- A route generation's further destinations (target 1 is the obx_route row itself).
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

-- One event's delivery set: the frozen contract. A target added later (a migration, with its
-- proof and receipt) appends a row to obx_delivery_target; nothing is ever rewritten.
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

CREATE TRIGGER obx_route_set_frozen BEFORE UPDATE OR DELETE ON obx.obx_route_set
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a route generation''s delivery set cannot change (set a new generation)');
CREATE TRIGGER obx_route_target_frozen BEFORE UPDATE OR DELETE ON obx.obx_route_target
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a route generation''s delivery set cannot change (set a new generation)');
CREATE TRIGGER obx_delivery_set_frozen BEFORE UPDATE OR DELETE ON obx.obx_delivery_set
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract (add a target with obx migrate)');
CREATE TRIGGER obx_delivery_target_frozen BEFORE UPDATE OR DELETE ON obx.obx_delivery_target
    FOR EACH ROW EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract (add a target with obx migrate)');
CREATE TRIGGER obx_delivery_set_no_truncate BEFORE TRUNCATE ON obx.obx_delivery_set
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract');
CREATE TRIGGER obx_delivery_target_no_truncate BEFORE TRUNCATE ON obx.obx_delivery_target
    FOR EACH STATEMENT EXECUTE FUNCTION obx._refuse('obx: a delivery set is a frozen contract');

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
-- digest and the target's frozen destination), the set and target rows, one audit row per slot.
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

ALTER FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text,
                           timestamptz) RENAME TO _enqueue_one;

CREATE FUNCTION obx.enqueue(event_type text, aggregate_type text, aggregate_id text,
                            aggregate_version bigint, tenant text, payload bytea,
                            payload_schema text DEFAULT NULL, correlation_id text DEFAULT NULL,
                            causation_id text DEFAULT NULL, traceparent text DEFAULT NULL,
                            idempotency_key text DEFAULT NULL,
                            occurred_at timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id text;
BEGIN
    id := obx._enqueue_one(event_type, aggregate_type, aggregate_id, aggregate_version, tenant,
                           payload, payload_schema, correlation_id, causation_id, traceparent,
                           idempotency_key, occurred_at);
    PERFORM obx._enqueue_targets(id);
    RETURN id;
END $$;

-- Whoever could execute the version 1 function executes the wrapper now, and only the wrapper
-- (the inner function alone would skip the delivery set).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.grantee::regrole::text AS r
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'obx._enqueue_one(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz) TO %s', g.r);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION obx._enqueue_one(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz) FROM %s', g.r);
    END LOOP;
    -- roles created under version 1: whoever reads the events (the relay, the auditor) reads the
    -- new tables too (every event query joins obx_delivery_target)
    FOR g IN SELECT DISTINCT a.grantee::regrole::text AS r
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'obx.obx_event'::regclass AND a.privilege_type = 'SELECT'
                AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT SELECT ON obx.obx_route_set, obx.obx_route_target, obx.obx_delivery_set, obx.obx_delivery_target TO %s', g.r);
    END LOOP;
END $$;

-- obx.create_roles(): as in version 1 (producer, relay, auditor, consumer with row-level
-- security on the inbox tables), plus reading the delivery-set tables (relay; the auditor by
-- the final grant on all tables). Moving an event to a new envelope generation needs nothing
-- more; adding a delivery-set target creates an event row, which (like obx_enqueue() from C)
-- needs the schema owner or a role granted INSERT on obx_event.
CREATE OR REPLACE FUNCTION obx.create_roles(prefix text) RETURNS void LANGUAGE plpgsql
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
        obx.obx_receipt, obx.obx_audit, obx.obx_counter, obx.obx_route_set, obx.obx_route_target,
        obx.obx_delivery_set, obx.obx_delivery_target TO %I', r);
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

REVOKE ALL ON FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text,
                                   text, timestamptz),
                       obx._enqueue_targets(text),
                       obx._routing_key(text, text, text, text, text) FROM PUBLIC;

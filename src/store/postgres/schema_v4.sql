-- obx outbox schema, version 4 (PostgreSQL): every UNKNOWN ends (docs/design.md,
-- "Reconciliation and UNKNOWN outcomes"). Applied after version 3 by pg_store.c's migrate, in
-- the same transaction, under the init advisory lock. Mirrors src/store/sqlite/schema_v4.sql.
--
--   * obx_event.held_at: when the reconciler (or an operator) held an UNKNOWN event for an
--     operator: its route's UNKNOWN policy is "hold" and nothing could prove the outcome past
--     the attempts' quiet time, or the broker holds a copy obx cannot accept. 0 = not held.
--     Held events are counted, aged and listed (obx status, /metrics, the dashboard) through
--     the small partial index obx_event_held. The UNKNOWN policy itself is the route's
--     blind_retry column, frozen with each event as before: true = retry to the same frozen
--     target once the lookup cannot tell past the quiet time (the default of new routes),
--     false = hold. Route generations written before version 4 keep what they froze: those
--     that did not say --blind-retry hold their UNKNOWN events for an operator.
--   * obx_receipt.source: what proved a receipt. 'broker' = the broker's own confirm (every
--     receipt written before version 4 says so, lookups included), 'lookup' = a reconciler's
--     lookup found the message, 'consumer' = a critical consumer's inbox row (evidence),
--     'operator' = an operator's audited `obx resolve --accept`. The kind (PRIMARY, DUPLICATE,
--     QUARANTINED, MIGRATION) still says what the receipt did to the publish slot.
--   * obx_inbox.envelope_gen, attempt_id, dest_digest: what a consume receipt needs to serve as
--     evidence that the broker accepted a message (the acceptance point matches them with the
--     frozen event and a registered attempt). Rows written before version 4 have 0 / '' and
--     are never evidence.
--   * obx_cluster: each relay registers the cluster it serves, the broker backend behind it
--     and the frozen destination contracts that backend honours, so that `obx route set` can
--     refuse a contract the cluster cannot honour (docs/design.md, "Destination contract").

ALTER TABLE obx.obx_event ADD COLUMN held_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX obx_event_held ON obx.obx_event (held_at, seq) WHERE held_at > 0;

ALTER TABLE obx.obx_receipt ADD COLUMN source TEXT NOT NULL DEFAULT 'broker'
    CONSTRAINT obx_receipt_source CHECK (source IN ('broker', 'lookup', 'consumer', 'operator'));

ALTER TABLE obx.obx_inbox ADD COLUMN envelope_gen INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN attempt_id TEXT NOT NULL DEFAULT '',
    ADD COLUMN dest_digest TEXT NOT NULL DEFAULT '';

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

-- As version 3's, plus 'held' (events held for an operator) and 'oldest_held'.
CREATE OR REPLACE FUNCTION obx._stats() RETURNS TABLE (k text, v bigint) LANGUAGE plpgsql
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
         WHERE e.state IN ('PENDING', 'CLAIMED')
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
        SELECT 'oldest_held', coalesce(min(e.held_at), 0) FROM obx.obx_event e WHERE e.held_at > 0;
END $$;

-- obx.create_roles(): as in version 2, plus the relay's writes of held_at and obx_cluster.
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
        obx.obx_delivery_set, obx.obx_delivery_target, obx.obx_cluster TO %I', r);
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
    EXECUTE format('GRANT INSERT, UPDATE ON obx.obx_counter, obx.obx_cluster TO %I', r);
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

-- Roles created under earlier versions: whoever may move events (UPDATE of state) may hold
-- them, and registers its cluster; whoever reads the events reads the cluster registry.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.grantee::regrole::text AS r
               FROM pg_attribute t, aclexplode(t.attacl) a
              WHERE t.attrelid = 'obx.obx_event'::regclass AND t.attname = 'state'
                AND a.privilege_type = 'UPDATE' AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT UPDATE (held_at) ON obx.obx_event TO %s', g.r);
        EXECUTE format('GRANT INSERT, UPDATE ON obx.obx_cluster TO %s', g.r);
    END LOOP;
    FOR g IN SELECT DISTINCT a.grantee::regrole::text AS r
               FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'obx.obx_event'::regclass AND a.privilege_type = 'SELECT'
                AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP
        EXECUTE format('GRANT SELECT ON obx.obx_cluster TO %s', g.r);
    END LOOP;
END $$;

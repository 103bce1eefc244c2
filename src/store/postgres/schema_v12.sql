-- obx outbox schema, version 12 (PostgreSQL): obx.enqueue() becomes a door to one of two bodies
-- with the same contract, arguments, rows and errors (issue 19, docs/postgres.md, "The obx_pg
-- extension"; docs/performance.md section 3, "Schema version 12"). Applied after version 11 by
-- pg_store.c's migrate, in the same transaction, under the init advisory lock; catalogue only.
--
--   * obx._enqueue_sql(): version 10's PL/pgSQL body, renamed, unchanged. Every database has it.
--   * obx._enqueue_c(): the same in C, from the obx_pg extension (src/store/postgres/ext), for
--     the common call; it hands every other call to obx._enqueue_sql(). Only where the server
--     has the extension installed and `obx init` may create it (pg_store.c, enqueue_impl).
--   * obx.enqueue(): calls one of them. obx._point_enqueue() (re)writes it; `obx init` calls it
--     when the choice changes. Its grants are the old function's: a producer role granted
--     EXECUTE on obx.enqueue() keeps it, and needs nothing else (both bodies run with the
--     rights of obx.enqueue()'s owner, SECURITY DEFINER).

ALTER FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text,
                           timestamptz) RENAME TO _enqueue_sql;
-- called only by obx.enqueue() and obx._enqueue_c(), inside obx.enqueue()'s SECURITY DEFINER
-- and search_path: a second switch of user and search_path per call would cost for nothing
ALTER FUNCTION obx._enqueue_sql(text, text, text, bigint, text, bytea, text, text, text, text,
                                text, timestamptz) SECURITY INVOKER RESET search_path;

-- (Re)writes obx.enqueue() to call obx._enqueue_c() (c) or obx._enqueue_sql(). CREATE OR
-- REPLACE keeps its owner and grants.
CREATE FUNCTION obx._point_enqueue(c boolean) RETURNS void LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp AS $f$
BEGIN
    EXECUTE format($w$
CREATE OR REPLACE FUNCTION obx.enqueue(event_type text, aggregate_type text, aggregate_id text,
                            aggregate_version bigint, tenant text, payload bytea,
                            payload_schema text DEFAULT NULL, correlation_id text DEFAULT NULL,
                            causation_id text DEFAULT NULL, traceparent text DEFAULT NULL,
                            idempotency_key text DEFAULT NULL,
                            occurred_at timestamptz DEFAULT NULL)
RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $b$
BEGIN
    RETURN obx.%s(event_type, aggregate_type, aggregate_id, aggregate_version, tenant, payload,
                  payload_schema, correlation_id, causation_id, traceparent, idempotency_key,
                  occurred_at);
END $b$$w$, CASE WHEN c THEN '_enqueue_c' ELSE '_enqueue_sql' END);
END $f$;
REVOKE ALL ON FUNCTION obx._point_enqueue(boolean) FROM PUBLIC;

SELECT obx._point_enqueue(false);

-- the old function's grants move to the new door
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT a.grantee::regrole::text AS r
               FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'obx._enqueue_sql(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz) TO %s', g.r);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION obx._enqueue_sql(text, text, text, bigint, text, bytea, text, text, text, text, text, timestamptz) FROM %s', g.r);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION obx.enqueue(text, text, text, bigint, text, bytea, text, text, text, text,
                                   text, timestamptz),
                       obx._enqueue_sql(text, text, text, bigint, text, bytea, text, text, text,
                                        text, text, timestamptz) FROM PUBLIC;

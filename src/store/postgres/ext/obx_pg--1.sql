-- obx_pg version 1 (schema versions 12 and 13, when the library was $libdir/obx_pg): kept so that
-- the update from it is tested (test_extension_versions); `obx init` updates a database that
-- has it to the current version (obx_pg.sql.in, pg_store.c enqueue_impl).
\echo Use "CREATE EXTENSION obx_pg" to load this file. \quit

CREATE FUNCTION @extschema@._enqueue_c(event_type text, aggregate_type text, aggregate_id text,
                                       aggregate_version bigint, tenant text, payload bytea,
                                       payload_schema text, correlation_id text,
                                       causation_id text, traceparent text,
                                       idempotency_key text, occurred_at timestamptz)
RETURNS text LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', 'obx_pg_enqueue';

-- It runs with its caller's rights and writes obx's tables: obx.enqueue() (SECURITY DEFINER,
-- owned by whoever ran `obx init`) is its caller.
REVOKE ALL ON FUNCTION @extschema@._enqueue_c(text, text, text, bigint, text, bytea, text, text,
                                              text, text, text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@._enqueue_c(text, text, text, bigint, text, bytea, text,
                                                 text, text, text, text, timestamptz)
    TO @extowner@;

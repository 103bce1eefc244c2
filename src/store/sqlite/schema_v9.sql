-- obx outbox schema, version 9 (SQLite): nothing changes here.
-- Version 9 records PostgreSQL's producer's first audit row in the envelope
-- (src/store/postgres/schema_v9.sql), to save a row per enqueue; SQLite keeps writing it to
-- obx_audit. The version number is shared by both backends (OBX__SCHEMA_VERSION), so SQLite
-- records version 9 as well.
SELECT 1;

-- obx outbox schema, version 7 (SQLite): nothing changes here.
-- Version 7 batches PostgreSQL's audit writes and drops its statistics triggers on the relay's
-- updates and receipts (src/store/postgres/schema_v7.sql). SQLite keeps one obx_audit row per
-- transition and counts its statistics in the process.
-- The version number is shared by both backends (OBX__SCHEMA_VERSION), so SQLite
-- records version 7 as well.
SELECT 1;

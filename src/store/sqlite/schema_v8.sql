-- obx outbox schema, version 8 (SQLite): nothing changes here.
-- Version 8 gives PostgreSQL's obx_event room for its updates on their own page, moves two
-- identity checks to AFTER triggers and merges two receipt indexes
-- (src/store/postgres/schema_v8.sql), all about PostgreSQL's WAL. The version number is
-- shared by both backends (OBX__SCHEMA_VERSION), so
-- SQLite records version 8 as well.
SELECT 1;

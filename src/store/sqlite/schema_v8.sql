-- obx outbox schema, version 8 (SQLite): nothing changes here.
-- Version 8 gives PostgreSQL's obx_event room for its updates on their own page and moves two
-- identity checks to AFTER triggers (src/store/postgres/schema_v8.sql), both about
-- PostgreSQL's WAL. The version number is shared by both backends (OBX__SCHEMA_VERSION), so
-- SQLite records version 8 as well.
SELECT 1;

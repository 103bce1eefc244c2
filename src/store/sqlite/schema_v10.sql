-- obx outbox schema, version 10 (SQLite): nothing changes here.
-- Version 10 makes PostgreSQL's obx.enqueue() cheaper (src/store/postgres/schema_v10.sql);
-- SQLite has no SQL producer function. The version number is shared by both backends
-- (OBX__SCHEMA_VERSION), so SQLite records version 10 as well.
SELECT 1;

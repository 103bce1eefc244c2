-- obx outbox schema, version 6 (SQLite): nothing changes here.
-- Version 6 makes PostgreSQL's producer cheaper (src/store/postgres/schema_v6.sql: obx.enqueue()
-- in fewer statements, no statistics trigger on event inserts). SQLite's producer is
-- obx_enqueue() in the process and its statistics need no trigger change. The version number
-- is shared by both backends (OBX__SCHEMA_VERSION), so SQLite records version 6 as well.
SELECT 1;

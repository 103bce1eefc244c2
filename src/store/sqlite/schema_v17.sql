-- obx outbox schema, version 17 (SQLite): no change. Version 17 is PostgreSQL's
-- (src/store/postgres/schema_v17.sql: obx.enqueue() notifies only while a relay waits; SQLite
-- has no wake-up); the versions of the two stores move together.
SELECT 1;

-- obx outbox schema, version 12 (SQLite): no change. Version 12 is PostgreSQL's
-- (src/store/postgres/schema_v12.sql: obx.enqueue() in two bodies, one of them the obx_pg
-- extension's C); the versions of the two stores move together.
SELECT 1;

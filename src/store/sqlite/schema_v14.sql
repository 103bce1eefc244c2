-- obx outbox schema, version 14 (SQLite): no change. Version 14 is PostgreSQL's
-- (src/store/postgres/schema_v14.sql: a producer session can turn its NOTIFY off; SQLite has no
-- NOTIFY); the versions of the two stores move together.
SELECT 1;

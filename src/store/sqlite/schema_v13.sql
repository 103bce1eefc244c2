-- obx outbox schema, version 13 (SQLite): no change. Version 13 is PostgreSQL's
-- (src/store/postgres/schema_v13.sql: the relay's write set checks itself, so that its COMMIT
-- travels in the same round trip); the versions of the two stores move together.
SELECT 1;

-- obx outbox schema, version 16 (SQLite): no change. Version 16 is PostgreSQL's
-- (src/store/postgres/schema_v16.sql: the relay's batch statements take one array of rows each;
-- SQLite's store binds a batch's rows one statement execution at a time); the versions of the
-- two stores move together.
SELECT 1;

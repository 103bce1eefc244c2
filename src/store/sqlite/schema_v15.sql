-- obx outbox schema, version 15 (SQLite): no change. Version 15 is PostgreSQL's
-- (src/store/postgres/schema_v15.sql: the relay's checks prepared for less per statement; SQLite
-- compiles a table's CHECK constraints once per prepared statement, not per execution); the
-- versions of the two stores move together.
SELECT 1;

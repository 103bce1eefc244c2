-- obx outbox schema, version 3 (SQLite): nothing changes here.
-- Version 3 lets PostgreSQL write an attempt's outcome as a heap-only (HOT) update
-- (src/store/postgres/schema_v3.sql). SQLite has no such distinction: an UPDATE rewrites the
-- row in its b-tree and touches an index only when a column of the index, or of its WHERE
-- clause, changes, so its obx_attempt_unknown index costs the common SENDING -> ACCEPTED
-- update nothing it could save. The version number is shared by both backends
-- (OBX__SCHEMA_VERSION), so SQLite records version 3 as well.
SELECT 1;

-- obx outbox schema, version 5 (SQLite): nothing changes here.
-- Version 5 gives PostgreSQL the inbox as SQL functions (obx.inbox_receive, inbox_applied,
-- inbox_failed; src/store/postgres/schema_v5.sql) for consumers written in any language, which
-- call them inside their own transactions on their own connections. SQLite has no stored
-- functions: a consumer on SQLite uses obx_inbox_process() or `obx consume --exec`. The
-- version number is shared by both backends (OBX__SCHEMA_VERSION), so SQLite records
-- version 5 as well.
SELECT 1;

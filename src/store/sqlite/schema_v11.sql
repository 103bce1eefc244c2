-- obx outbox schema, version 11 (SQLite): a route generation cannot change, as on PostgreSQL
-- (src/store/postgres/schema_v11.sql): `obx route set` adds a generation and never edits one,
-- and events freeze the generation they were enqueued under, so its number must keep naming
-- one policy. SQLite's statistics are unchanged.
CREATE TRIGGER obx_route_frozen BEFORE UPDATE ON obx_route
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation cannot change (obx route set adds a new one)');
END;
CREATE TRIGGER obx_route_no_delete BEFORE DELETE ON obx_route
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation cannot change (obx route set adds a new one)');
END;

-- obx outbox schema, version 2 (SQLite): delivery sets (docs/migration.md). Applied after
-- version 1 by obx_store_init() / `obx init`, in the same transaction as the version bump.
--
-- A delivery set is a contract chosen at enqueue time: the event goes to several destinations,
-- each frozen with its own digest, its own attempts and its own publish slot, and a completion
-- rule ('all' or 'any') says when the event counts as delivered. Each slot is an ordinary
-- obx_event row (so claims, attempts, the acceptance point and the reconciler apply per target,
-- unchanged); target 1 is the event's own row, a further target's row has its own slot ID and
-- carries the event's ID on the wire. No existing table changes.

-- A route generation's further destinations (target 1 is the obx_route row itself).
CREATE TABLE obx_route_set (
    route_gen  INTEGER PRIMARY KEY,
    completion TEXT NOT NULL CHECK (completion IN ('all', 'any')),
    targets    INTEGER NOT NULL CHECK (targets BETWEEN 2 AND 8)
);

CREATE TABLE obx_route_target (
    route_gen     INTEGER NOT NULL,
    target_no     INTEGER NOT NULL CHECK (target_no BETWEEN 2 AND 8),
    cluster       TEXT NOT NULL,
    topic         TEXT NOT NULL,
    routing_key   TEXT NOT NULL,
    algorithm     TEXT NOT NULL,
    serializer    TEXT NOT NULL,
    durability    TEXT NOT NULL,
    required_acks TEXT NOT NULL,
    PRIMARY KEY (route_gen, target_no)
);

-- One event's delivery set: the frozen contract. A target added later (a migration, with its
-- proof and receipt) appends a row to obx_delivery_target; nothing is ever rewritten.
CREATE TABLE obx_delivery_set (
    event_id   TEXT PRIMARY KEY,
    completion TEXT NOT NULL CHECK (completion IN ('all', 'any')),
    route_gen  INTEGER NOT NULL,    -- the declaring route generation; 0 = formed by a migration
    created_at INTEGER NOT NULL
);

CREATE TABLE obx_delivery_target (
    slot_id    TEXT PRIMARY KEY,    -- the obx_event row of this target (target 1: event_id)
    event_id   TEXT NOT NULL,       -- the logical event: what brokers and consumers see
    target_no  INTEGER NOT NULL CHECK (target_no BETWEEN 1 AND 8),
    origin     TEXT NOT NULL CHECK (origin IN ('enqueue', 'migration')),
    created_at INTEGER NOT NULL,
    UNIQUE (event_id, target_no)
);

CREATE TRIGGER obx_route_set_frozen BEFORE UPDATE ON obx_route_set
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation''s delivery set cannot change (set a new generation)');
END;
CREATE TRIGGER obx_route_target_frozen BEFORE UPDATE ON obx_route_target
BEGIN
    SELECT RAISE(ABORT, 'obx: a route generation''s delivery set cannot change (set a new generation)');
END;
CREATE TRIGGER obx_delivery_set_frozen BEFORE UPDATE ON obx_delivery_set
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract (add a target with obx migrate)');
END;
CREATE TRIGGER obx_delivery_set_no_delete BEFORE DELETE ON obx_delivery_set
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract');
END;
CREATE TRIGGER obx_delivery_target_frozen BEFORE UPDATE ON obx_delivery_target
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract (add a target with obx migrate)');
END;
CREATE TRIGGER obx_delivery_target_no_delete BEFORE DELETE ON obx_delivery_target
BEGIN
    SELECT RAISE(ABORT, 'obx: a delivery set is a frozen contract');
END;

-- obx outbox schema, version 4 (SQLite): every UNKNOWN ends (docs/design.md,
-- "Reconciliation and UNKNOWN outcomes"). Applied after version 3 by obx_store_init() / `obx
-- init`, in the same transaction as the version bump. Mirrors src/store/postgres/schema_v4.sql,
-- which says what each column means; in short:
--   * obx_event.held_at: when an UNKNOWN event was held for an operator (0 = not held);
--   * obx_receipt.source: what proved a receipt (broker, lookup, consumer, operator);
--   * obx_inbox.envelope_gen, attempt_id, dest_digest: a consume receipt as evidence that the
--     broker accepted the message (rows written before version 4 are never evidence);
--   * obx_cluster: the clusters relays serve and the destination contracts they honour.

ALTER TABLE obx_event ADD COLUMN held_at INTEGER NOT NULL DEFAULT 0;
CREATE INDEX obx_event_held ON obx_event (held_at, seq) WHERE held_at > 0;

ALTER TABLE obx_receipt ADD COLUMN source TEXT NOT NULL DEFAULT 'broker'
    CHECK (source IN ('broker', 'lookup', 'consumer', 'operator'));

ALTER TABLE obx_inbox ADD COLUMN envelope_gen INTEGER NOT NULL DEFAULT 0;
ALTER TABLE obx_inbox ADD COLUMN attempt_id TEXT NOT NULL DEFAULT '';
ALTER TABLE obx_inbox ADD COLUMN dest_digest TEXT NOT NULL DEFAULT '';

CREATE TABLE obx_cluster (
    cluster       TEXT PRIMARY KEY,
    backend       TEXT NOT NULL,
    lookup        TEXT NOT NULL CHECK (lookup IN ('authoritative', 'best_effort', 'none')),
    durability    TEXT NOT NULL,
    required_acks TEXT NOT NULL,
    serializer    TEXT NOT NULL,
    relay         TEXT NOT NULL,
    seen_at       INTEGER NOT NULL
);

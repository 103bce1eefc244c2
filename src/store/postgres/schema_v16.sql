-- obx outbox schema, version 16 (PostgreSQL): the relay's batches as one array of rows each
-- (issue 19, docs/performance.md section 1, "Schema version 16"). Applied after version 15 by
-- pg_store.c's migrate, in the same transaction, under the init advisory lock; catalogue only.
--
-- A relay's batch statements (the events' update, the attempts' insert and update, the
-- receipts' insert) took one array parameter per column, read with unnest($1, $2, ...): 15 to 21
-- arrays per statement. PostgreSQL sets up a function, its result's tuple descriptor and a
-- tuplestore for each of those arrays on every execution, about 9,000 instructions per array
-- whatever the batch's size; at the small batches of a relay that keeps up (2 events at the
-- median at 1,000 ev/s) that was a tenth of the server's instructions per relayed event. Each
-- statement now takes one array of a row type of its own, one function to set up. The types
-- below are the statements' parameters, column for column as the arrays were (pg_store.c,
-- build_update_events, build_insert_attempts, build_update_attempts, build_insert_receipts);
-- they are not stored anywhere. The client sends them in PostgreSQL's binary format, so it
-- reads their type IDs once per connection (pg_store.c, rec_oids).
CREATE TYPE obx._event_update AS (
    event_id text, envelope_gen int, state text, claim_gen bigint, owner text,
    lease_until bigint, attempt_gen int, attempt_id text, pinned_partition int, rejections int,
    available_at bigint, next_check_at bigint, unknown_since bigint, primary_attempt_id text,
    published_at bigint, updated_at bigint, order_key text, dest_cluster text,
    expect_state text, expect_claim_gen bigint, held_at bigint);
CREATE TYPE obx._attempt_insert AS (
    attempt_id text, event_id text, envelope_gen int, attempt_gen int, claim_gen bigint,
    owner text, dest_digest text, partition int, state text, started_at bigint,
    unknown_at bigint, ended_at bigint, offset_before bigint, quiet_until bigint, detail text);
CREATE TYPE obx._attempt_update AS (
    attempt_id text, partition int, state text, unknown_at bigint, ended_at bigint,
    offset_before bigint, quiet_until bigint, detail text);
CREATE TYPE obx._receipt_insert AS (
    event_id text, envelope_gen int, attempt_id text, kind text, cluster text, topic text,
    partition int, off bigint, broker_ts bigint, payload_digest text, dest_digest text,
    reason text, detail text, created_at bigint, source text);

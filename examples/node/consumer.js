// An obx consumer in Node.js: a RabbitMQ queue (amqplib) through the SQL inbox on PostgreSQL
// (pg). Each message's effect -- a row in order_projection -- commits in one transaction with
// the inbox's receipt; the broker is acknowledged only after that commit. A redelivery is
// answered by the inbox ('duplicate'), so the effect happens once per event.
//
// Environment: OBX_PG_URL (a login role granted <prefix>_consumer), OBX_AMQP_URL, OBX_QUEUE,
// OBX_CONSUMER (default order-projection), OBX_IDLE_EXIT_S (stop after this long without a
// message; 0 = run for ever). Fault injection for tests, off by default: CRASH_AFTER_COMMIT=N /
// CRASH_BEFORE_COMMIT=N (exit at once after the Nth effect, after / before its commit, i.e.
// before the ack), FAIL_EVERY=N (every Nth handler call throws a transient error).
"use strict";
const amqp = require("amqplib");
const { Client } = require("pg");

const env = process.env;
const CONSUMER = env.OBX_CONSUMER || "order-projection";
const TYPES = ["order.created.v1"], TENANTS = ["tenant-7", "tenant-9"], MAX_FAILURES = 5;
const CRASH_AFTER = +(env.CRASH_AFTER_COMMIT || 0), CRASH_BEFORE = +(env.CRASH_BEFORE_COMMIT || 0);
const FAIL_EVERY = +(env.FAIL_EVERY || 0);
const counts = { delivered: 0, applied: 0, duplicate: 0, quarantined: 0, poisoned: 0, retry: 0 };
let calls = 0;

class Poison extends Error {} // the message can never be processed: parked at once

// The business effect, on the inbox's transaction. Throws to fail (retried).
async function handle(db, eventId, body) {
  if (FAIL_EVERY && ++calls % FAIL_EVERY === 0) throw new Error("injected transient failure");
  let order;
  try { order = JSON.parse(body.toString("utf8")); } catch (e) { throw new Poison("payload is not JSON: " + e.message); }
  await db.query("INSERT INTO order_projection (event_id, order_id, total) VALUES ($1, $2, $3)",
    [eventId, order.order, order.total]);
  return "projected " + order.order;
}

async function onMessage(db, ch, msg) {
  counts.delivered++;
  // header values arrive as strings or Buffers
  const h = {};
  for (const [k, v] of Object.entries(msg.properties.headers || {})) h[k] = Buffer.isBuffer(v) ? v.toString("utf8") : String(v);
  const gen = /^[0-9]{1,9}$/.test(h["obx-envelope-gen"] || "") ? +h["obx-envelope-gen"] : 0;
  const d = [CONSUMER, h["obx-event-id"] || null, gen, h["obx-payload-digest"] || null,
    msg.fields.exchange, 0, -1, msg.content, h["obx-event-type"] || null, h["obx-tenant"] || null];
  let decision;
  try {
    await db.query("BEGIN"); // one transaction: receipt + effect
    const r = await db.query("SELECT * FROM obx.inbox_receive($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
      [...d, TYPES, TENANTS, JSON.stringify(h)]);
    decision = r.rows[0].decision;
    if (decision === "process") {
      const result = await handle(db, d[1], msg.content);
      await db.query("SELECT obx.inbox_applied($1, $2, $3)", [CONSUMER, d[1], result]);
      decision = "applied";
      if (CRASH_BEFORE && counts.applied + 1 === CRASH_BEFORE) process.exit(17); // rolled back
    }
    await db.query("COMMIT");
  } catch (e) { // rolled back: record the failure in a transaction of its own
    await db.query("ROLLBACK");
    // retry_backoff_ms 0: retried as soon as the nack brings it back (a back-off needs the
    // message held until retry_at: docs/inbox-sql.md)
    const r = await db.query("SELECT decision FROM obx.inbox_failed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, 0)",
      [CONSUMER, d[1], e.message, MAX_FAILURES, e instanceof Poison, ...d.slice(2), JSON.stringify(h)]);
    decision = r.rows[0].decision;
  }
  counts[decision]++;
  if (decision === "retry") return ch.nack(msg, false, true); // comes again
  if (decision === "applied" && CRASH_AFTER && counts.applied === CRASH_AFTER) process.exit(18); // committed, not acked
  ch.ack(msg); // only after the commit
}

async function main() {
  const db = new Client({ connectionString: env.OBX_PG_URL });
  await db.connect();
  await db.query("CREATE TABLE IF NOT EXISTS order_projection (event_id text NOT NULL, order_id text NOT NULL, total bigint NOT NULL)");
  const conn = await amqp.connect(env.OBX_AMQP_URL);
  const ch = await conn.createChannel();
  await ch.prefetch(1); // one message at a time, in order
  const idleMs = +(env.OBX_IDLE_EXIT_S || 0) * 1000;
  let timer, chain = Promise.resolve();
  const done = new Promise((resolve) => {
    const arm = () => { if (idleMs) { clearTimeout(timer); timer = setTimeout(resolve, idleMs); } };
    arm();
    ch.consume(env.OBX_QUEUE, (msg) => {
      arm();
      if (msg) chain = chain.then(() => onMessage(db, ch, msg)).catch((e) => { console.error(e); process.exit(1); });
    });
  });
  await done;
  await chain;
  console.log(JSON.stringify(counts));
  await conn.close();
  await db.end();
}

main().catch((e) => { console.error(e); process.exit(1); });

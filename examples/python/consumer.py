#!/usr/bin/python3
"""An obx consumer in Python: a RabbitMQ queue (pika) through the SQL inbox on PostgreSQL
(psycopg2). Each message's effect -- a row in order_projection -- commits in one transaction
with the inbox's receipt; the broker is acknowledged only after that commit. A redelivery is
answered by the inbox (duplicate), so the effect happens once per event.

Environment: OBX_PG_URL (a login role granted <prefix>_consumer), OBX_AMQP_URL, OBX_QUEUE,
OBX_CONSUMER (default order-projection), OBX_IDLE_EXIT_S (stop after this long without a
message; 0 = run for ever). Fault injection for tests, off by default: CRASH_AFTER_COMMIT=N /
CRASH_BEFORE_COMMIT=N (exit at once after the Nth effect, after / before its commit, i.e. before
the ack), FAIL_EVERY=N (every Nth handler call raises a transient error).
"""
import json
import os
import sys

import pika
import psycopg2

CONSUMER = os.environ.get("OBX_CONSUMER", "order-projection")
QUEUE = os.environ["OBX_QUEUE"]
TYPES, TENANTS, MAX_FAILURES = ["order.created.v1"], ["tenant-7", "tenant-9"], 5
CRASH_AFTER = int(os.environ.get("CRASH_AFTER_COMMIT", "0"))
CRASH_BEFORE = int(os.environ.get("CRASH_BEFORE_COMMIT", "0"))
FAIL_EVERY = int(os.environ.get("FAIL_EVERY", "0"))
counts = {"delivered": 0, "applied": 0, "duplicate": 0, "quarantined": 0, "poisoned": 0,
          "retry": 0}
calls = 0


class Poison(Exception):
    """The message can never be processed (no retry helps): parked at once."""


def num(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0  # the inbox refuses it (parked), naming the field


def handle(cur, event_id, body):
    """The business effect, on the inbox's transaction. Raises to fail (retried)."""
    global calls
    calls += 1
    if FAIL_EVERY and calls % FAIL_EVERY == 0:
        raise RuntimeError("injected transient failure")
    try:
        order = json.loads(body)
    except ValueError as e:
        raise Poison("payload is not JSON: %s" % e) from None
    cur.execute("INSERT INTO order_projection (event_id, order_id, total) VALUES (%s, %s, %s)",
                (event_id, order["order"], order["total"]))
    return "projected %s" % order["order"]


def main():
    db = psycopg2.connect(os.environ["OBX_PG_URL"])
    with db, db.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS order_projection (event_id text NOT NULL, "
                    "order_id text NOT NULL, total bigint NOT NULL)")
    amqp = pika.BlockingConnection(pika.URLParameters(os.environ["OBX_AMQP_URL"]))
    ch = amqp.channel()
    ch.basic_qos(prefetch_count=20)
    idle = float(os.environ.get("OBX_IDLE_EXIT_S", "0")) or None
    for method, props, body in ch.consume(QUEUE, inactivity_timeout=idle):
        if method is None:
            break  # idle
        counts["delivered"] += 1
        # header values arrive as bytes or str
        h = {k: v.decode() if isinstance(v, bytes) else str(v)
             for k, v in (props.headers or {}).items()}
        delivery = (CONSUMER, h.get("obx-event-id"), num(h.get("obx-envelope-gen")),
                    h.get("obx-payload-digest"), method.exchange, 0, -1, body,
                    h.get("obx-event-type"), h.get("obx-tenant"))
        try:
            with db, db.cursor() as cur:  # one transaction: receipt + effect
                cur.execute("SELECT * FROM obx.inbox_receive(%s, %s, %s, %s, %s, %s, %s, %s, %s, "
                            "%s, %s, %s, %s)", delivery + (TYPES, TENANTS, json.dumps(h)))
                decision, result, detail = cur.fetchone()
                if decision == "process":
                    result = handle(cur, delivery[1], body)
                    cur.execute("SELECT obx.inbox_applied(%s, %s, %s)",
                                (CONSUMER, delivery[1], result))
                    decision = "applied"
                    if CRASH_BEFORE and counts["applied"] + 1 == CRASH_BEFORE:
                        os._exit(17)  # the effect is rolled back with the receipt
        except Exception as e:  # rolled back: record the failure in a transaction of its own
            with db, db.cursor() as cur:
                # retry_backoff_ms 0: retried as soon as the nack brings it back (a back-off
                # needs the message held until retry_at: docs/inbox-sql.md)
                cur.execute("SELECT decision FROM obx.inbox_failed(%s, %s, %s, %s, %s, %s, %s, "
                            "%s, %s, %s, %s, %s, %s, %s, 0)",
                            (CONSUMER, delivery[1], str(e), MAX_FAILURES, isinstance(e, Poison))
                            + delivery[2:] + (json.dumps(h),))
                decision = cur.fetchone()[0]
        counts[decision] += 1
        if decision == "retry":
            ch.basic_nack(method.delivery_tag, requeue=True)  # comes again
            continue
        if decision == "applied" and CRASH_AFTER and counts["applied"] == CRASH_AFTER:
            os._exit(18)  # committed, never acknowledged: RabbitMQ redelivers it
        ch.basic_ack(method.delivery_tag)  # only after the commit
    print(json.dumps(counts), flush=True)
    amqp.close()


if __name__ == "__main__":
    sys.exit(main())

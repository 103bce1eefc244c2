#!/usr/bin/python3
"""chaos_sql_producer.py — the SQL producer of the chaos soak (scripts/chaos.sh).

A service written in Python, as a user writes one with Debian's psycopg2: each order is one
transaction that inserts the order row, calls the SQL function obx.enqueue() for its event(s),
records each returned event ID in the producer's ledger table, then commits — or rolls back a
seeded share of orders after the enqueue. Same file ledger as the C producer
(bench/chaos_producer.c): "C|R <order_id> <event_id>[,<event_id>] <unix_ms>" per decided order.

A lost connection or a COMMIT whose reply was lost: reconnect, look the order up (present =
committed), else retry it with the same idempotency keys. Runs until SIGTERM or --max-orders.

    chaos_sql_producer.py --db URL --name NAME --ledger FILE [--rate R] [--seed S]
                          [--rollback-permille N] [--payment-permille N] [--max-orders N]
"""
import argparse
import random
import signal
import sys
import time

import psycopg2

stop = False


def on_signal(signum, frame):
    global stop
    stop = True


def draw_order(rng, name, n, rollback_pm, payment_pm):
    oid = "%s-%07d" % (name, n)
    tenant = "t%d" % rng.randint(1, 3)
    amount = rng.randint(1, 100000)
    note = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(16, 395)))
    events = [("order.created.v1", "order",
               '{"order":"%s","amount":%d,"tenant":"%s","note":"%s"}' % (oid, amount, tenant, note))]
    if rng.randrange(1000) < payment_pm:
        events.append(("payment.captured.v1", "payment",
                       '{"order":"%s","payment":"pay-%s","amount":%d}' % (oid, oid, amount)))
    return {"id": oid, "tenant": tenant, "amount": amount, "events": events,
            "rollback": rng.randrange(1000) < rollback_pm}


class Producer:
    def __init__(self, url):
        self.url = url
        self.conn = None

    def connect(self):
        if self.conn is not None and not self.conn.closed:
            return True
        try:
            self.conn = psycopg2.connect(self.url, connect_timeout=5)
            return True
        except psycopg2.Error as e:
            print("chaos_sql_producer: connect: %s" % str(e).strip(), file=sys.stderr)
            self.conn = None
            return False

    def drop(self):
        try:
            if self.conn is not None:
                self.conn.close()
        except psycopg2.Error:
            pass
        self.conn = None

    def committed_ids(self, oid):
        """Event IDs of the order if it committed, [] if not, None when it cannot tell."""
        if not self.connect():
            return None
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT event_id FROM chaos_ledger WHERE order_id = %s "
                            "ORDER BY event_type", (oid,))
                rows = [r[0] for r in cur.fetchall()]
            self.conn.rollback()
            return rows
        except psycopg2.Error:
            self.drop()
            return None

    def attempt(self, o):
        """('C'|'R', event IDs) when decided, None to retry."""
        if not self.connect():
            return None
        ids = []
        try:
            with self.conn.cursor() as cur:  # psycopg2 opens the transaction itself
                try:
                    cur.execute("INSERT INTO chaos_order (order_id, producer, amount) "
                                "VALUES (%s, split_part(%s, '-', 1), %s)",
                                (o["id"], o["id"], o["amount"]))
                except psycopg2.errors.UniqueViolation:
                    # a COMMIT whose reply was lost did commit
                    self.conn.rollback()
                    got = self.committed_ids(o["id"])
                    return ("C", got) if got else None
                for etype, atype, payload in o["events"]:
                    kind = "payment" if etype.startswith("payment") else "created"
                    cur.execute("SELECT obx.enqueue(%s, %s, %s, 1, %s, convert_to(%s, 'UTF8'), "
                                "correlation_id => %s, idempotency_key => %s)",
                                (etype, atype, o["id"], o["tenant"], payload, o["id"],
                                 "%s:%s" % (o["id"], kind)))
                    eid = cur.fetchone()[0]
                    ids.append(eid)
                    cur.execute("INSERT INTO chaos_ledger (event_id, order_id, producer, "
                                "event_type, tenant, aggregate_type, aggregate_id, payload) "
                                "VALUES (%s, %s, split_part(%s, '-', 1), %s, %s, %s, %s, "
                                "convert_to(%s, 'UTF8'))",
                                (eid, o["id"], o["id"], etype, o["tenant"], atype, o["id"],
                                 payload))
            if o["rollback"]:
                self.conn.rollback()
                return ("R", ids)
        except psycopg2.Error as e:
            print("chaos_sql_producer: %s: %s" % (o["id"], str(e).strip()), file=sys.stderr)
            self.drop()
            return None
        try:
            self.conn.commit()
            return ("C", ids)
        except psycopg2.Error:
            self.drop()
        while True:  # the COMMIT's outcome is unknown: look the order up
            got = self.committed_ids(o["id"])
            if got is not None:
                return ("C", got) if got else None
            if stop:
                return None
            time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--name", default="sql")
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--rate", type=float, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rollback-permille", type=int, default=50)
    ap.add_argument("--payment-permille", type=int, default=400)
    ap.add_argument("--max-orders", type=int, default=0)
    a = ap.parse_args()
    if "-" in a.name or a.rate <= 0:
        ap.error("--name must not contain '-' and --rate must be > 0")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rng = random.Random(a.seed)
    p = Producer(a.db)
    counts = {"C": 0, "R": 0}
    retries = 0
    t0 = time.monotonic()
    with open(a.ledger, "a") as ledger:
        n = 0
        while not stop and (not a.max_orders or n < a.max_orders):
            n += 1
            o = draw_order(rng, a.name, n, a.rollback_permille, a.payment_permille)
            backoff = 0.1
            r = p.attempt(o)
            while r is None and not stop:
                retries += 1
                time.sleep(backoff)
                backoff = min(backoff * 2, 2)
                r = p.attempt(o)
            if r is None:
                break  # stopped with the order undecided: not in the file
            ledger.write("%s %s %s %d\n" % (r[0], o["id"], ",".join(r[1]), time.time() * 1000))
            ledger.flush()
            counts[r[0]] += 1
            delay = t0 + n / a.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    p.drop()
    print("chaos_sql_producer: %s: %d orders committed, %d rolled back, %d retried transactions"
          % (a.name, counts["C"], counts["R"], retries), file=sys.stderr)


if __name__ == "__main__":
    main()

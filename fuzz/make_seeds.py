#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz/corpus/<target>/ (valid inputs and the classic bad ones
of each input). Run from anywhere; existing seed files of the same names are overwritten,
seeds found by fuzzing (named by their hash) are left alone."""
import hashlib
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
D = "sha256:" + hashlib.sha256(b'{"order":"o-1"}').hexdigest()
S = "sha256:" + hashlib.sha256(b"schema:order.created.v1").hexdigest()
X = "sha256:" + "ab" * 32
EID = "evt-01HZX3K9QW8E7R6T5Y4U3I2O1P".replace("I", "J").replace("O", "0").replace("U", "V")
AID = "att-01HZX3K9QW8E7R6T5Y4V3J201Q"
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def lines(pairs, payload=None):
    out = b"".join((k + "=").encode() + (v if isinstance(v, bytes) else v.encode()) + b"\n"
                   for k, v in pairs)
    if payload is not None:
        out += b"--\n" + payload
    return out


headers = [("obx-event-id", EID), ("obx-envelope-gen", "1"), ("obx-attempt-id", AID),
           ("obx-attempt-gen", "1"), ("obx-payload-digest", D), ("obx-dest-digest", X),
           ("obx-event-type", "order.created.v1"), ("obx-tenant", "tenant-7"),
           ("obx-aggregate", "order/o-1@17"), ("obx-occurred-at", "1700000000000"),
           ("obx-payload-schema", S), ("obx-correlation-id", "checkout-17"),
           ("obx-causation-id", "cmd-9"), ("traceparent", TP)]
write("headers", "valid", lines(headers))
write("headers", "minimal", lines(headers[:8]))
write("headers", "nul-in-tenant", lines([h if h[0] != "obx-tenant" else ("obx-tenant", b"t\x001")
                                         for h in headers]))
write("headers", "bad-utf8-correlation",
      lines([h if h[0] != "obx-correlation-id" else ("obx-correlation-id", b"c\xc3\x28")
             for h in headers]))
write("headers", "aggregate-slash-at",
      lines([h if h[0] != "obx-aggregate" else ("obx-aggregate", "order/a/b@c@5")
             for h in headers]))
write("headers", "aggregate-empty-parts",
      lines([h if h[0] != "obx-aggregate" else ("obx-aggregate", "/@") for h in headers]))
write("headers", "gen-overflow",
      lines([h if h[0] != "obx-envelope-gen" else ("obx-envelope-gen", "99999999999999999999")
             for h in headers]))
write("headers", "version-overflow",
      lines([h if h[0] != "obx-aggregate" else ("obx-aggregate", "order/o@99999999999999999999")
             for h in headers]))
write("headers", "digest-upper", lines([h if h[0] != "obx-payload-digest" else
                                        ("obx-payload-digest", D.upper()) for h in headers]))

urls = ["sqlite:obx.db", "sqlite::memory:", "sqlite://tmp/x.db?synchronous=full",
        "postgres://relay:pw@db.example:5432/obx?sslmode=verify-full&sslrootcert=/etc/ca.pem",
        "postgresql://u@/obx?host=/var/run/postgresql", "postgres://u:p%40ss@h/db",
        "postgres://u:${PGPASS}@h:5432/db", "postgres://u:${file:/run/secrets/pg}@h/db",
        "${DATABASE_URL}", "log:broker.db?cluster=local&partitions=4&drop_ack=0.1",
        "kafka://k1:9092,k2:9092?linger.ms=5", "amqp://guest:guest@127.0.0.1:5672/%2f",
        "amqps://u:p@rabbit.example:5671/vh?cacert=/etc/ca.pem", "amqp://u:pa/ss@h:5672/",
        "postgres://u:pa?ss@h/db", "amqp://u:p@ss@h:5672/", "kafka://h:99999",
        "mysql://x", "amqp:u:secret@h", "postgres://h/db?application_name=a@b", "$${literal}"]
for i, u in enumerate(urls):
    write("url", "seed-%02d" % i, u)

configs = {
    "readme": """db: sqlite:obx.db
broker: log:obx-broker.db
broker_properties:
  linger.ms: 5
  sasl.password: ${KAFKA_PASSWORD}
relay:
  id: relay-1
  dispatchers: 2
  batch: 256
  lease_ms: 30000
  reconciler: true
  aliases: [obx]
http:
  listen: 127.0.0.1:8080
log:
  format: json
  level: info
""",
    "unknown-key": "relay:\n  dispatchrs: 2\n",
    "wrong-type": "relay:\n  dispatchers: [1, 2]\n",
    "nul": 'db: "sqlite:a.db\\0junk"\n',
    "control": 'relay:\n  id: "r\\x1b[31m"\n',
    "anchors": "base: &b {dispatchers: 2}\nrelay: *b\n",
    "two-docs": "db: sqlite:a.db\n---\ndb: sqlite:b.db\n",
    "duplicate": "db: sqlite:a.db\ndb: sqlite:b.db\n",
    "props-list": "broker_properties: [linger.ms=5, acks=all]\n",
    "json": '{"db": "sqlite:x.db", "relay.dispatchers": 3, "relay.aliases": ["a", "b"]}\n',
    "flow": "{relay: {dispatchers: 2, batch: 10}, log: {level: debug}}\n",
}
for n, c in configs.items():
    write("config", n, c)

ev = [("type", "order.created.v1"), ("aggregate_type", "order"), ("aggregate_id", "o-42"),
      ("version", "17"), ("tenant", "tenant-7"), ("idempotency_key", "create-o-42"),
      ("correlation_id", "checkout-17"), ("traceparent", TP)]
write("enqueue", "valid", lines(ev, b'{"order":"o-42","total":1999}'))
write("enqueue", "sql-meta", lines([("type", "order.created.v1"), ("aggregate_type", "order"),
                                    ("aggregate_id", "o'); DROP TABLE obx_event;--"),
                                    ("tenant", "t'1"), ("idempotency_key", "k' OR '1'='1"),
                                    ("topic", "orders;DELETE")], b"x"))
write("enqueue", "bad-utf8", lines([("type", "order.created.v1"), ("aggregate_type", "order"),
                                    ("aggregate_id", b"o-\xff\xfe"), ("tenant", "t1")], b"x"))
write("enqueue", "control", lines([("type", "order.created.v1"), ("aggregate_type", "order"),
                                   ("aggregate_id", "o\x1b[2J"), ("tenant", "t1")], b"x"))
write("enqueue", "empty-payload", lines(ev, b""))
write("enqueue", "limit", lines(ev + [("payload_limit", "3")], b"12345"))
write("enqueue", "long-key", lines([("type", "order.created.v1"), ("aggregate_type", "o" * 128),
                                    ("aggregate_id", "i" * 255), ("tenant", "t" * 128),
                                    ("routing_key", "{tenant}.{aggregate_type}.{aggregate_id}")],
                                   b"x"))
write("enqueue", "template", lines(ev + [("routing_key", "{tenant}{nope}")], b"x"))
write("enqueue", "unversioned", lines([("type", "order.created"), ("aggregate_type", "order"),
                                       ("aggregate_id", "o"), ("tenant", "t")], b"x"))

msg = [("event_id", EID), ("envelope_gen", "1"), ("event_type", "order.created.v1"),
       ("tenant", "tenant-7"), ("aggregate_type", "order"), ("aggregate_id", "o-1"),
       ("aggregate_version", "1"), ("payload_digest", "auto"), ("topic", "orders"),
       ("partition", "0"), ("offset", "5"), ("deliveries", "2")]
write("inbox", "valid", lines(msg, b'{"order":"o-1"}'))
write("inbox", "filters", lines(msg + [("types", "order.created.v2"), ("tenants", "a,b")],
                                b"{}"))
write("inbox", "bad-digest", lines([m for m in msg if m[0] != "payload_digest"] +
                                   [("payload_digest", D)], b"other"))
write("inbox", "handler-fails", lines(msg + [("handler", "fail"), ("deliveries", "3")], b"{}"))
write("inbox", "handler-fails-once", lines(msg + [("handler", "fail1")], b"{}"))
write("inbox", "bad-result", lines(msg + [("handler", "badresult"),
                                          ("aggregate_id", "o-\xe2\x82")], b"{}"))
write("inbox", "bad-utf8-tenant", lines([m if m[0] != "tenant" else ("tenant", b"t\xff")
                                         for m in msg], b"{}"))
write("inbox", "bad-event-id", lines([m if m[0] != "event_id" else ("event_id", b"evt-\x1b\xff")
                                      for m in msg], b"{}"))
write("inbox", "header-error", lines(msg + [("header_error", "obx-tenant: missing")], b"{}"))
write("inbox", "no-fields", b"--\n{}")
write("inbox", "empty-payload", lines(msg, b""))

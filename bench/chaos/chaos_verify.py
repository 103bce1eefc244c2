#!/usr/bin/python3
"""chaos_verify.py — the chaos soak's verifier (scripts/chaos.sh, docs/reliability.md).

It trusts nothing obx says. Its inputs are read without obx:
  * the producers' ledger: the business table chaos_ledger (event ID obx returned, type, tenant,
    aggregate, payload bytes) of committed transactions, and the producers' own files (C/R
    lines: committed, rolled back after the enqueue);
  * the broker, read with a plain client (pika on verifier queues bound to each exchange, or
    kcat on the mock cluster's bootstrap list): every copy with its exchange/topic, partition,
    routing key, obx headers and body bytes;
  * the consumers' business table (order_projection in their SQLite database).
From them it computes lost events, wrong destinations, digest and envelope mismatches,
phantoms (an event of a rolled-back or unknown transaction anywhere), duplicate deliveries
(counted, expected) and duplicate effects, recomputing each digest the way
docs/canonical-encoding.md defines it: payload digest = sha256 of the payload bytes;
destination digest = sha256 of the length-prefixed fields of obx.destination.v1; the Kafka
partition = murmur2(routing key) mod partitions, as Kafka's Java client computes it.

UNKNOWN figures are obx's own view (unknown_episodes, from obx's audit rows read with psql),
kept beside the outside view and never mixed with it.

`chaos_verify.py --self-check` runs the verifier's own tests (known vectors, one synthetic
case per counter, each of which must move exactly that counter): a verifier that cannot fail
is worth nothing.
"""
import hashlib
import json
import os
import struct
import sys

# ---- independent re-implementations -------------------------------------------------------


def sha256_digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(tag, fields):
    out = b""
    for f in (tag,) + tuple(fields):
        b = str(f).encode("utf-8")
        out += struct.pack(">I", len(b)) + b
    return out


def dest_digest(cluster, topic, routing_key, algorithm, gen, serializer="raw",
                durability="persistent", required_acks="all"):
    return sha256_digest(canonical("obx.destination.v1", (cluster, topic, routing_key, algorithm,
                                                          gen, serializer, durability,
                                                          required_acks)))


def murmur2(data):
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2), as a signed 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for i in range(n4):
        k = struct.unpack_from("<I", data, i * 4)[0]
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = data[n4 * 4:]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_partition(key, partitions):
    return (murmur2(key.encode("utf-8")) & 0x7FFFFFFF) % partitions


def percentile(values, p):
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))
    return v[k]


# ---- obx's view: UNKNOWN episodes from its audit rows -----------------------------------------

def unknown_family(state):
    """States in which an event's publish outcome is unknown (or held for an operator)."""
    return "UNKNOWN" in state or "RECONCIL" in state or "HELD" in state


def unknown_episodes(rows, end_ms):
    """rows: (event_id, at_ms, from_state, to_state) ordered by event and audit order.
    An episode starts when an event enters the UNKNOWN family from outside it and ends at the
    first row that takes it out. Returns (episodes, unresolved): episodes is a list of
    (event_id, start_ms, end_ms or None)."""
    episodes = []
    open_ep = {}
    for eid, at, frm, to in rows:
        if unknown_family(to) and not unknown_family(frm) and eid not in open_ep:
            open_ep[eid] = at
        elif eid in open_ep and not unknown_family(to):
            episodes.append((eid, open_ep.pop(eid), at))
    for eid, start in open_ep.items():
        episodes.append((eid, start, None))
    return episodes, len(open_ep)


def unknown_summary(rows, end_ms):
    eps, unresolved = unknown_episodes(rows, end_ms)
    # an unresolved episode counts with its age at the end: a lower bound, never left out
    durs = [((e if e is not None else end_ms) - s) / 1000.0 for _, s, e in eps]
    p99 = percentile(durs, 99)
    return {"unknown_total": len(eps), "unknown_unresolved": unresolved,
            "unknown_p99_s": None if p99 is None else round(p99, 3),
            "unknown_unresolved_ids": sorted({eid for eid, _, e in eps if e is None})[:50]}


# ---- the verification --------------------------------------------------------------------------

def header(rec, name):
    v = rec["headers"].get(name)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return None if v is None else str(v)


def verify(ledger, files, routes, records, projection, partitions=None, cluster="", runs=None):
    """ledger: {event_id: {order_id, producer, event_type, tenant, aggregate_type, aggregate_id,
                           payload (bytes)}} — the committed events (chaos_ledger).
    files: [(status 'C'|'R', order_id, [event_ids])] — the producers' files.
    routes: {event_type: {"topic", "gen"}} — what `obx route set` was told (and its generation).
    records: [{topic, partition, key, headers {name: value}, body (bytes)}] — every copy the
             broker holds, read by a plain client.
    projection: [(event_id, payload bytes)] — the consumers' business rows.
    partitions: {topic: count} for Kafka (partition check), None for RabbitMQ.
    runs: [event_id], one per run of the `--exec` handler of the second consumer ID (two
          instances; its effect is outside the inbox's transaction): written by the handler
          itself, so an event's second run is counted however the consumers saw it. None: no
          such consumer.
    Returns the counts (and up to 20 example event IDs per finding)."""
    rolled_back = {e for st, _, ids in files if st == "R" for e in ids}
    file_committed = {e for st, _, ids in files if st == "C" for e in ids}
    ex = {k: [] for k in ("lost_at_broker", "lost_at_consumer", "wrong_destination",
                          "digest_mismatch", "envelope_mismatch", "phantom", "duplicate_effects",
                          "ledger_mismatch", "lost_at_handler", "handler_runs_twice")}
    copies = {}  # event_id -> copies at the right destination
    wrong, digest_bad, env_bad, phantom = set(), set(), set(), set()
    for rec in records:
        eid = header(rec, "obx-event-id")
        led = ledger.get(eid)
        if led is None:
            phantom.add(eid or "(no obx-event-id)")
            continue
        route = routes.get(led["event_type"])
        rk = "%s.%s.%s" % (led["tenant"], led["aggregate_type"], led["aggregate_id"])
        good_dest = route is not None and rec["topic"] == route["topic"] and rec["key"] == rk
        if good_dest and partitions is not None:
            good_dest = rec["partition"] == kafka_partition(rk, partitions[rec["topic"]])
        if not good_dest:
            wrong.add(eid)
            continue
        copies[eid] = copies.get(eid, 0) + 1
        body_digest = sha256_digest(rec["body"])
        want_dest = dest_digest(cluster, route["topic"], rk, "murmur2", route["gen"])
        if (body_digest != header(rec, "obx-payload-digest") or
                body_digest != sha256_digest(led["payload"]) or
                header(rec, "obx-dest-digest") != want_dest):
            digest_bad.add(eid)
        if (header(rec, "obx-event-type") != led["event_type"] or
                header(rec, "obx-tenant") != led["tenant"] or
                header(rec, "obx-aggregate") != "%s/%s@1" % (led["aggregate_type"],
                                                             led["aggregate_id"])):
            env_bad.add(eid)
    effects = {}
    for eid, payload in projection:
        effects[eid] = effects.get(eid, 0) + 1
        led = ledger.get(eid)
        if led is None:
            phantom.add(eid)
        elif sha256_digest(payload) != sha256_digest(led["payload"]):
            digest_bad.add(eid)
    lost_b = sorted(e for e in ledger if e not in copies)
    lost_c = sorted(e for e in ledger if e not in effects)
    dup_fx = sorted(e for e, n in effects.items() if n > 1)
    ledger_bad = sorted((file_committed - set(ledger)) | (rolled_back & set(ledger)))
    handled = {}
    for eid in runs or []:
        handled[eid] = handled.get(eid, 0) + 1
        if eid not in ledger:
            phantom.add(eid)
    lost_h = sorted(e for e in ledger if e not in handled) if runs is not None else []
    twice = sorted(e for e, n in handled.items() if n > 1)
    lost = sorted(set(lost_b) | set(lost_c) | set(lost_h))
    res = {
        "committed": len(ledger),
        "rolled_back": len(rolled_back),
        "lost": len(lost),
        "lost_at_broker": len(lost_b),
        "lost_at_consumer": len(lost_c),
        "wrong_destination": len(wrong),
        "digest_mismatch": len(digest_bad),
        "envelope_mismatch": len(env_bad),
        "phantom": len(phantom),
        "broker_copies": sum(copies.values()),
        "duplicate_deliveries": sum(n - 1 for n in copies.values()),
        "effects": sum(effects.values()),
        "duplicate_effects": sum(effects[e] - 1 for e in dup_fx),
        "ledger_mismatch": len(ledger_bad),
        "lost_at_handler": len(lost_h),
        "handler_runs": sum(handled.values()),
        "handler_runs_twice": sum(handled[e] - 1 for e in twice),
    }
    for k, v in (("lost", lost), ("lost_at_broker", lost_b), ("lost_at_consumer", lost_c),
                 ("wrong_destination", sorted(wrong)), ("digest_mismatch", sorted(digest_bad)),
                 ("envelope_mismatch", sorted(env_bad)), ("phantom", sorted(phantom)),
                 ("duplicate_effects", dup_fx), ("ledger_mismatch", ledger_bad),
                 ("lost_at_handler", lost_h), ("handler_runs_twice", twice)):
        ex[k] = v[:20]
    res["examples"] = {k: v for k, v in ex.items() if v}
    return res


FAILING = ("lost", "wrong_destination", "digest_mismatch", "envelope_mismatch", "phantom",
           "duplicate_effects", "handler_runs_twice", "ledger_mismatch", "unknown_unresolved")


def failures(result):
    """The counters that make a soak fail (the JSON's "failed" list)."""
    out = [k for k in FAILING if result.get(k)]
    if result.get("obx_report_ok") is False:
        out.append("obx_report_ok")
    return out


# ---- self-check ----------------------------------------------------------------------------

def self_check(vectors_path):
    errors = []

    def check(cond, what):
        if not cond:
            errors.append(what)

    # murmur2 against Kafka's Java test vectors (same as tests/broker/test_broker_kafka.c)
    for key, h in (("21", -973932308), ("foobar", -790332482),
                   ("a-little-bit-long-string", -985981536),
                   ("a-little-bit-longer-string", -1486304829),
                   ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
                   ("abc", 479470107)):
        check(murmur2(key.encode()) == h, "murmur2(%r) = %d, want %d" % (key, murmur2(key.encode()), h))
    # destination digests against the independent vectors of tests/data
    with open(vectors_path) as f:
        vec = json.load(f)
    for v in vec["destination"]:
        fl = v["fields"]
        got = dest_digest(fl["cluster"], fl["topic"], fl["routing_key"], fl["algorithm"],
                          fl["route_policy_gen"], fl["serializer"], fl["durability"],
                          fl["required_acks"])
        check(got == v["digest"], "dest digest of %s: %s, want %s" % (fl, got, v["digest"]))

    # a clean synthetic case, then one fault per counter: each must move exactly its counter
    routes = {"order.created.v1": {"topic": "orders", "gen": 1}}

    def event(n):
        payload = b'{"order":"c-%d"}' % n
        return ("evt-%d" % n, {"order_id": "c-%d" % n, "producer": "c",
                               "event_type": "order.created.v1", "tenant": "t1",
                               "aggregate_type": "order", "aggregate_id": "c-%d" % n,
                               "payload": payload})

    def record(eid, led, topic="orders", body=None, parts=None):
        rk = "t1.order.%s" % led["aggregate_id"]
        body = led["payload"] if body is None else body
        return {"topic": topic, "key": rk,
                "partition": kafka_partition(rk, parts) if parts else 0,
                "headers": {"obx-event-id": eid, "obx-payload-digest": sha256_digest(led["payload"]),
                            "obx-dest-digest": dest_digest("k", topic, rk, "murmur2", 1),
                            "obx-event-type": led["event_type"], "obx-tenant": "t1",
                            "obx-aggregate": "order/%s@1" % led["aggregate_id"]},
                "body": body}

    runs = []  # the handler's runs of the current case (case() fills it)

    def case(parts=None):
        ledger = dict(event(n) for n in range(1, 6))
        files = [("C", led["order_id"], [eid]) for eid, led in ledger.items()]
        files.append(("R", "c-99", ["evt-99"]))
        records = [record(eid, led, parts=parts) for eid, led in ledger.items()]
        projection = [(eid, led["payload"]) for eid, led in ledger.items()]
        runs[:] = list(ledger)
        return ledger, files, records, projection

    zero = ("lost", "wrong_destination", "digest_mismatch", "envelope_mismatch", "phantom",
            "duplicate_effects", "duplicate_deliveries", "ledger_mismatch", "lost_at_handler",
            "handler_runs_twice")
    for parts in (None, 8):
        pmap = {"orders": 8, "payments": 8} if parts else None
        ledger, files, records, projection = case(parts)
        r = verify(ledger, files, routes, records, projection, pmap, "k", runs)
        check(all(r[k] == 0 for k in zero), "clean case not clean: %s" % r)
        r = verify(ledger, files, routes, records, projection, pmap, "k")
        check(all(r[k] == 0 for k in zero), "clean case without a handler not clean: %s" % r)

        def expect(name, want, mutate):
            lg, fl, rc, pj = case(parts)
            mutate(lg, fl, rc, pj)
            got = verify(lg, fl, routes, rc, pj, pmap, "k", runs)
            moved = {k: got[k] for k in zero if got[k]}
            check(moved == want, "%s (partitions %s): moved %s, want %s" % (name, parts, moved,
                                                                          want))

        def extra_ledger(lg, fl, rc, pj):
            eid, led = event(7)
            lg[eid] = led
        expect("ledger row without event", {"lost": 1, "lost_at_handler": 1}, extra_ledger)
        expect("message deleted from the broker", {"lost": 1},
               lambda lg, fl, rc, pj: rc.pop(0))
        expect("effect missing", {"lost": 1}, lambda lg, fl, rc, pj: pj.pop(0))
        expect("copy at another exchange/topic", {"wrong_destination": 1},
               lambda lg, fl, rc, pj: rc.append(dict(rc[1], topic="payments")))
        expect("copy with another routing key", {"wrong_destination": 1},
               lambda lg, fl, rc, pj: rc.append(dict(rc[1], key="t2.order.x")))
        if parts:
            def wrong_partition(lg, fl, rc, pj):
                rc.append(dict(rc[1], partition=(rc[1]["partition"] + 1) % parts))
            expect("copy in another partition", {"wrong_destination": 1}, wrong_partition)
        expect("body changed", {"digest_mismatch": 1, "duplicate_deliveries": 1},
               lambda lg, fl, rc, pj: rc.append(dict(rc[2], body=rc[2]["body"] + b" ")))

        def bad_dest_header(lg, fl, rc, pj):
            rc[3] = dict(rc[3], headers=dict(rc[3]["headers"], **{"obx-dest-digest": "sha256:0"}))
        expect("destination digest header wrong", {"digest_mismatch": 1}, bad_dest_header)

        def bad_tenant(lg, fl, rc, pj):
            rc[3] = dict(rc[3], headers=dict(rc[3]["headers"], **{"obx-tenant": "t9"}))
        expect("tenant header wrong", {"envelope_mismatch": 1}, bad_tenant)
        expect("second copy", {"duplicate_deliveries": 1},
               lambda lg, fl, rc, pj: rc.append(dict(rc[0])))
        expect("second effect", {"duplicate_effects": 1},
               lambda lg, fl, rc, pj: pj.append(pj[0]))
        expect("handler run twice", {"handler_runs_twice": 1},
               lambda lg, fl, rc, pj: runs.append(runs[1]))
        expect("handler never ran", {"lost": 1, "lost_at_handler": 1},
               lambda lg, fl, rc, pj: runs.pop(2))
        expect("handler ran for a rolled-back event", {"phantom": 1},
               lambda lg, fl, rc, pj: runs.append("evt-99"))

        def phantom_rb(lg, fl, rc, pj):
            rc.append(dict(rc[0], headers=dict(rc[0]["headers"], **{"obx-event-id": "evt-99"})))
        expect("rolled-back event at the broker", {"phantom": 1}, phantom_rb)
        expect("rolled-back event applied", {"phantom": 1},
               lambda lg, fl, rc, pj: pj.append(("evt-99", b"x")))

        def committed_not_in_table(lg, fl, rc, pj):
            eid = next(iter(lg))
            del lg[eid]
            rc[:] = [x for x in rc if x["headers"]["obx-event-id"] != eid]
            pj[:] = [x for x in pj if x[0] != eid]
            runs.remove(eid)
        expect("file says committed, table has no row", {"ledger_mismatch": 1},
               committed_not_in_table)

    # UNKNOWN episodes: resolved, re-entered, unresolved; p99 counts the unresolved one
    rows = [("e1", 1000, "SENDING", "DISPATCH_UNKNOWN"), ("e1", 1500, "DISPATCH_UNKNOWN",
                                                          "RECONCILING"),
            ("e1", 1600, "RECONCILING", "DISPATCH_UNKNOWN"), ("e1", 4000, "DISPATCH_UNKNOWN",
                                                               "RECONCILING"),
            ("e1", 4100, "RECONCILING", "RETRY_CLAIMED"), ("e1", 4200, "RETRY_CLAIMED", "SENDING"),
            ("e1", 5000, "SENDING", "DISPATCH_UNKNOWN"), ("e1", 6000, "DISPATCH_UNKNOWN",
                                                          "PUBLISHED"),
            ("e2", 2000, "SENDING", "DISPATCH_UNKNOWN"), ("e2", 2500, "DISPATCH_UNKNOWN",
                                                          "RECONCILING")]
    s = unknown_summary(rows, 102000)
    check(s["unknown_total"] == 3 and s["unknown_unresolved"] == 1,
          "UNKNOWN episodes: %s" % s)
    check(s["unknown_p99_s"] == 100.0, "UNKNOWN p99 must count the unresolved episode: %s" % s)
    check(percentile([1, 2, 3, 4], 50) == 2 and percentile([5], 99) == 5, "percentile")
    check(failures({"lost": 0, "unknown_unresolved": 1}) == ["unknown_unresolved"],
          "failures(): unresolved UNKNOWN must fail")
    check(failures({"obx_report_ok": False}) == ["obx_report_ok"], "failures(): obx report")
    return errors


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--self-check":
        here = os.path.dirname(os.path.abspath(__file__))
        path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "..", "tests", "data",
                                                                  "digest_vectors.json")
        errs = self_check(path)
        for e in errs:
            print("FAIL: " + e)
        if errs:
            sys.exit(1)
        print("ok: chaos verifier self-check (vectors, one synthetic fault per counter, UNKNOWN "
              "episodes)")
        sys.exit(0)
    print("usage: chaos_verify.py --self-check [digest_vectors.json]", file=sys.stderr)
    sys.exit(2)

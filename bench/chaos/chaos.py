#!/usr/bin/python3
"""chaos.py — the chaos soak: obx on real servers under many faults at once, judged by a
verifier that reads no obx table through obx (docs/reliability.md). scripts/chaos.sh
(bench/chaos/soak.sh) starts the private PostgreSQL primary and synchronous standby and the
RabbitMQ cluster of three nodes and runs this; run it through that script.

What runs (all separate processes):
  producers  chaos_producer (C, obx_enqueue() on its own libpq connection) and
             chaos_sql_producer.py (psycopg2, SELECT obx.enqueue()); each order is one
             business transaction with its ledger rows; a seeded share is rolled back after the
             enqueue
  relays     r1..rN `obx relay` (shipped defaults), each reaching every PostgreSQL (and
             RabbitMQ) node through socat proxies of its own, so that one relay's connections
             can be cut alone; every URL names every node (failover, a node lost)
  consumers  two `obx consume` processes (the inbox, the sample order projection in one SQLite
             database), competing on the RabbitMQ queues or sharing a Kafka consumer group;
             and two of a second consumer ID, `notifier`, whose `--exec` handler (an effect
             outside the inbox's transaction) writes a line per run, so that the verifier
             counts handler runs itself (no fault targets them: every second run is a defect)
  Kafka      chaos_kmock owns librdkafka's mock cluster and executes its fault commands
  verifier   reads the verifier queues (pika) or the topics (kcat) as they fill, for arrival
             times, then checks everything at the end (chaos_verify.py)

Faults run on a schedule drawn from the seed (`--schedule-only` prints it): the first round
fires every kind once in a seeded order, then kinds are drawn at random with exponential gaps;
each fault runs in its own thread, so several overlap. Every fault heals before the producers
stop; then the soak drains (until the outside view is complete and obx has no open UNKNOWN, or
--drain seconds), stops everything and verifies.
"""
import argparse
import base64
import bisect
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_verify as cv  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
T0 = time.monotonic()
TOPICS = ("orders", "payments")
TYPES = {"order.created.v1": "orders", "payment.captured.v1": "payments"}
COMMON_KINDS = ["relay_kill", "relay_pause", "consumer_kill", "consumer_pause", "pg_crash",
                "pg_failover", "net_reject", "net_drop", "proxy_stall"]
BROKER_KINDS = {"amqp": ["rabbit_kill", "rabbit_node_loss", "rabbit_partition"],
                "kafka": ["kafka_broker_down", "kafka_leader_change", "kafka_request_errors",
                          "kafka_lost_ack"]}
KAFKA_ERRORS = ["NOT_LEADER_FOR_PARTITION", "REQUEST_TIMED_OUT", "NOT_ENOUGH_REPLICAS",
                "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "LEADER_NOT_AVAILABLE"]
KAFKA_MESSAGE_TIMEOUT_MS = 30000
# the shortest a fault of each kind may be (relay_pause: plus the lease)
MIN_DURATION = {"relay_kill": 1, "consumer_kill": 1, "relay_pause": 3, "consumer_pause": 3,
                "pg_crash": 2, "pg_failover": 2, "rabbit_kill": 2, "rabbit_node_loss": 3,
                "rabbit_partition": 20, "net_reject": 3, "net_drop": 5, "proxy_stall": 3,
                "kafka_broker_down": 3, "kafka_lost_ack": KAFKA_MESSAGE_TIMEOUT_MS / 1000.0 + 5}


def log(msg):
    print("chaos: [%7.1fs] %s" % (time.monotonic() - T0, msg), file=sys.stderr, flush=True)


def sleep_until(deadline, stop_event):
    while not stop_event.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return True
        stop_event.wait(min(left, 0.5))
    return False


# ---- the fault schedule ----------------------------------------------------------------------

def make_schedule(seed, minutes, broker, lease_s, relays, kinds=None):
    """A list of faults {t, kind, target, duration, ...} drawn from the seed alone."""
    rng = random.Random(seed)
    all_kinds = COMMON_KINDS + BROKER_KINDS[broker]
    kinds = [k for k in all_kinds if kinds is None or k in kinds]
    dur = minutes * 60.0
    start, end = min(10.0, dur * 0.08), dur * 0.85
    sched = []
    first = kinds[:]
    rng.shuffle(first)
    # the long ones first, so that every kind fits whole in a short run
    first.sort(key=lambda k: -(MIN_DURATION.get(k, 0) + (lease_s if k == "relay_pause" else 0)))
    gap = min(8.0, (end - start) / max(len(first), 1))
    times = [start + i * gap for i in range(len(first))]
    t = times[-1] if times else start
    picks = list(zip(times, first))
    while kinds:
        t += rng.expovariate(1 / 8.0)
        if t >= end:
            break
        picks.append((t, rng.choice(kinds)))
    limit = dur * 0.97  # every fault heals before the producers stop
    for t, kind in picks:
        f = {"t": round(t, 2), "kind": kind}
        if kind in ("relay_kill", "consumer_kill"):
            f.update(target=rng.randrange(relays if kind == "relay_kill" else 2),
                     duration=rng.uniform(1, 5))
        elif kind == "relay_pause":  # past the lease: the relay must be fenced
            f.update(target=rng.randrange(relays), duration=lease_s + rng.uniform(3, 15))
        elif kind == "consumer_pause":
            f.update(target=rng.randrange(2), duration=rng.uniform(3, 20))
        elif kind in ("pg_crash", "rabbit_kill"):
            f.update(duration=rng.uniform(2, 10))
        elif kind == "pg_failover":  # from the primary's kill to the standby's promotion
            f.update(duration=rng.uniform(2, 10))
        elif kind == "rabbit_node_loss":
            f.update(target=rng.randint(1, 3), duration=rng.uniform(3, 20))
        elif kind == "rabbit_partition":  # past Erlang's net_ticktime (10 s in the soak)
            f.update(target=rng.randint(1, 3), duration=rng.uniform(20, 35))
        elif kind in ("net_reject", "net_drop", "proxy_stall"):
            lo, hi = {"net_reject": (3, 15), "net_drop": (5, 45), "proxy_stall": (3, 40)}[kind]
            side = "db" if broker == "kafka" else rng.choice(["db", "broker"])
            f.update(target=rng.randrange(relays), side=side, duration=rng.uniform(lo, hi))
        elif kind == "kafka_broker_down":
            f.update(target=rng.randint(1, 3), duration=rng.uniform(3, 15))
        elif kind == "kafka_leader_change":
            f.update(topic=rng.choice(TOPICS), partition=rng.randrange(8),
                     target=rng.randint(1, 3), duration=0)
        elif kind == "kafka_request_errors":
            f.update(target=rng.randint(1, 3), kafka_error=rng.choice(KAFKA_ERRORS),
                     count=rng.randint(1, 5), duration=0)
        elif kind == "kafka_lost_ack":  # answered after message.timeout.ms: POSSIBLY_PERSISTED
            f.update(target=rng.randint(1, 3), count=rng.randint(1, 3),
                     duration=KAFKA_MESSAGE_TIMEOUT_MS / 1000.0 + 5)
        if t + f["duration"] > limit:  # shortened to end in time, never below its floor
            f["duration"] = max(limit - t, MIN_DURATION.get(kind, 0) + (
                lease_s if kind == "relay_pause" else 0))
        f["duration"] = round(f["duration"], 2)
        sched.append(f)
    return sched


# ---- processes -------------------------------------------------------------------------------

class Proc:
    """A child process in its own session (signals reach its whole group), logging to a file;
    the supervisor restarts it when it exits while no fault holds it down."""

    def __init__(self, name, argv, logdir, restart=True, env=None):
        self.name, self.argv, self.restart, self.env = name, argv, restart, env
        self.logpath = os.path.join(logdir, name + ".log")
        self.p = None
        self.held = False
        self.starts = 0
        self.exits = []  # unexpected exit codes
        self.lock = threading.Lock()

    def start(self):
        with open(self.logpath, "ab") as lf:
            self.p = subprocess.Popen(self.argv, stdout=lf, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                      env=self.env)
        self.starts += 1

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def group_signal(self, sig):
        try:
            os.killpg(self.p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill9(self):
        with self.lock:
            self.held = True
        self.group_signal(signal.SIGKILL)
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def release(self):
        with self.lock:
            if not self.alive():
                self.start()
            self.held = False

    def stop(self, timeout=20):
        with self.lock:
            self.held = True
        if not self.alive():
            return
        self.group_signal(signal.SIGCONT)
        self.group_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log("%s did not stop in %d s: SIGKILL" % (self.name, timeout))
            self.group_signal(signal.SIGKILL)
            self.p.wait()


class Firewall:
    """iptables rules on loopback ports of this soak only, each tagged with a comment naming the
    soak; every rule is removed at the end (and by scripts/chaos.sh's EXIT trap)."""

    def __init__(self, tag):
        self.tag = tag
        self.lock = threading.Lock()

    def _run(self, args):
        return subprocess.run(["iptables", "-w", "5"] + args, capture_output=True, text=True)

    def specs(self, port, action):
        tail = ["-j", action] + (["--reject-with", "tcp-reset"] if action == "REJECT" else [])
        # to and from the proxy's listening port on 127.0.0.1 (a port with a listener is never
        # handed out as an ephemeral source port, so nobody else's connection matches)
        return [["INPUT", "-i", "lo", "-p", "tcp", a, "127.0.0.1", d, str(port), "-m", "comment",
                 "--comment", self.tag] + tail
                for a, d in (("-d", "--dport"), ("-s", "--sport"))]

    def add(self, port, action):
        return self.add_specs(self.specs(port, action))

    def partition_specs(self, cut, dist_ports):
        """Node `cut` (1..3) cut from the others: every packet between its distribution
        connections and theirs dropped. Node i's connections to the others leave from
        127.0.0.1i (scripts/rabbit_cluster.sh), so the rules name the one node alone."""
        specs = []
        for j in range(1, len(dist_ports) + 1):
            if j == cut:
                continue
            for src, port in ((cut, dist_ports[j - 1]), (j, dist_ports[cut - 1])):
                for a, d in (("-s", "--dport"), ("-d", "--sport")):
                    specs.append(["INPUT", "-i", "lo", "-p", "tcp", a, "127.0.0.1%d" % src, d,
                                  str(port), "-m", "comment", "--comment", self.tag, "-j",
                                  "DROP"])
        return specs

    def add_specs(self, specs):
        with self.lock:
            for s in specs:
                r = self._run(["-I"] + s)
                if r.returncode:
                    raise RuntimeError("iptables -I %s: %s" % (" ".join(s), r.stderr.strip()))
        return specs

    def remove(self, specs):
        with self.lock:
            for s in specs:
                self._run(["-D"] + s)

    def flush(self):
        with self.lock:
            r = self._run(["-S", "INPUT"])
            for line in r.stdout.splitlines():
                if "--comment %s " % self.tag in line + " " and line.startswith("-A "):
                    self._run(["-D"] + line.split()[1:])

    def check(self):
        r = self._run(["-S", "INPUT"])
        if r.returncode:
            raise RuntimeError("iptables does not work here: %s" % r.stderr.strip())


# ---- the broker readers (the verifier's plain clients) --------------------------------------

class AmqpReader(threading.Thread):
    """Consumes the verifier queues (one per exchange, bound with '#') with pika, records every
    copy with its arrival time in memory and in a file, then acks it. `urls`: the cluster's
    nodes, tried in turn."""

    def __init__(self, urls, queues, path):
        super().__init__(daemon=True)
        self.urls, self.queues, self.path = urls, queues, path
        self.records, self.first, self.keys = [], {}, set()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.errors = 0

    def on_msg(self, ch, method, props, body):
        headers = {}
        for k, v in (props.headers or {}).items():
            headers[k] = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        eid = headers.get("obx-event-id")
        key = (eid, headers.get("obx-attempt-id"), headers.get("obx-publish-seq"))
        now = time.time()
        with self.lock:
            if not (method.redelivered and key in self.keys):  # else: our own redelivery
                self.keys.add(key)
                rec = {"topic": method.exchange, "partition": 0, "key": method.routing_key,
                       "headers": headers, "body": body, "t": now}
                self.records.append(rec)
                self.first.setdefault(eid, now)
                with open(self.path, "a") as f:
                    f.write(json.dumps(dict(rec, body=base64.b64encode(body).decode())) + "\n")
        ch.basic_ack(method.delivery_tag)

    def run(self):
        import pika
        while not self.stopping.is_set():
            try:
                params = [pika.URLParameters(u) for u in self.urls]
                for p in params:
                    p.heartbeat = 10
                    p.socket_timeout = 5
                    p.blocked_connection_timeout = 30
                conn = pika.BlockingConnection(params)
                ch = conn.channel()
                ch.basic_qos(prefetch_count=500)
                for q in self.queues:
                    ch.basic_consume(q, self.on_msg)
                while not self.stopping.is_set():
                    conn.process_data_events(time_limit=0.5)
                conn.close()
            except Exception as e:  # the node was killed, restarting, or the queue recovering
                self.errors += 1
                if self.errors % 10 == 1:
                    log("verifier reader: %s: %s (reconnecting)" % (type(e).__name__, e))
                self.stopping.wait(1)


def kcat_record(line, topic):
    j = json.loads(line)
    h = j.get("headers") or []
    headers = {h[i]: h[i + 1] for i in range(0, len(h) - 1, 2)}
    payload = j.get("payload")
    return {"topic": j.get("topic", topic), "partition": j["partition"], "offset": j["offset"],
            "key": j.get("key"), "headers": headers,
            "body": (payload or "").encode("utf-8")}


class KcatReader(threading.Thread):
    """Follows one topic with kcat (-J, from the beginning) for arrival times; restarts kcat if
    it exits. The authoritative read is kafka_read_all() at the end."""

    def __init__(self, boot, topic, logdir):
        super().__init__(daemon=True)
        self.boot, self.topic, self.logdir = boot, topic, logdir
        self.first, self.seen = {}, set()
        self.stopping = threading.Event()
        self.p = None

    def run(self):
        while not self.stopping.is_set():
            with open(os.path.join(self.logdir, "kcat-%s.log" % self.topic), "ab") as lf:
                self.p = subprocess.Popen(["kcat", "-C", "-b", self.boot, "-t", self.topic, "-o",
                                           "beginning", "-J", "-u", "-q"],
                                          stdout=subprocess.PIPE, stderr=lf, text=True)
            for line in self.p.stdout:
                try:
                    r = kcat_record(line, self.topic)
                except (ValueError, KeyError):
                    continue
                k = (r["partition"], r["offset"])
                if k in self.seen:
                    continue
                self.seen.add(k)
                self.first.setdefault(r["headers"].get("obx-event-id"), time.time())
            self.p.wait()
            self.stopping.wait(1)

    def close(self):
        self.stopping.set()
        if self.p and self.p.poll() is None:
            self.p.terminate()


def kafka_read_all(boot, topic):
    r = subprocess.run(["kcat", "-C", "-b", boot, "-t", topic, "-o", "beginning", "-e", "-J",
                        "-q"], capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError("kcat read of %s: %s" % (topic, r.stderr.strip()))
    recs = {}
    for line in r.stdout.splitlines():
        if line.strip():
            rec = kcat_record(line, topic)
            recs[(rec["partition"], rec["offset"])] = rec
    return list(recs.values())


# ---- the soak --------------------------------------------------------------------------------

class Soak:
    def __init__(self, a):
        self.a = a
        self.env = os.environ
        self.obx = self.env["OBX_BIN"]
        self.build = self.env["CHAOS_BUILD"]
        self.pg_port = int(self.env["OBX_SVC_PG_PORT"])
        self.amqp_port = int(self.env["OBX_SVC_AMQP_PORT"])
        self.dir = a.dir
        self.logdir = os.path.join(self.dir, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.runs_path = os.path.join(self.dir, "handler-runs.txt")  # the notifier's handler
        # PostgreSQL: two nodes (scripts/pg_failover.sh), named by their role at the start;
        # pg_primary is the one that is primary now (each pg_failover swaps the roles)
        self.fo_dir = self.env["OBX_FO_DIR"]
        self.pg_nodes = {"primary": int(self.env["OBX_FO_PRIMARY_PORT"]),
                         "standby": int(self.env["OBX_FO_STANDBY_PORT"])}
        self.pg_primary = "primary"
        self.pg_down = set()  # nodes killed and not started again: their proxies are down too
        self.db = self.pg_url(list(self.pg_nodes.values()), "chaos")
        # RabbitMQ: three nodes (scripts/rabbit_cluster.sh): AMQP ports, distribution ports
        rc = int(self.env.get("OBX_RC_PORT", "0"))
        self.rc_dir = self.env.get("OBX_RC_DIR")
        self.rc_ports = [rc + 10 * k for k in range(3)]
        self.rc_dist = [p + 1 for p in self.rc_ports]
        self.fw = Firewall(self.env.get("CHAOS_IPT_TAG", "obx-chaos-%d" % self.pg_port))
        self.stop_faults = threading.Event()
        self.procs = {}
        self.busy = set()
        self.busy_lock = threading.Lock()
        self.faults = []
        self.fault_threads = []
        self.kmock = None
        self.kmock_lock = threading.Lock()
        self.boot = None
        self.reader = None
        self.kreaders = []
        self.supervising = threading.Event()
        self.scheduler = None
        self.lease_s = 30.0
        self.t_end = float("inf")  # when the producers stop (main sets it)
        for kv in a.relay_set:
            if kv.startswith("relay.lease_ms="):
                self.lease_s = int(kv.split("=", 1)[1]) / 1000.0

    # -- helpers
    def run(self, argv, check=True, **kw):
        r = subprocess.run(argv, capture_output=True, text=True, **kw)
        if check and r.returncode:
            raise RuntimeError("%s: exit %d: %s" % (" ".join(argv[:3]), r.returncode,
                                                    (r.stderr or r.stdout).strip()[-2000:]))
        return r

    def sql(self, query, args=(), fetch=True, retries=60):
        for i in range(retries):
            try:
                c = psycopg2.connect(self.db, connect_timeout=5)
                try:
                    with c.cursor() as cur:
                        cur.execute(query, args)
                        rows = cur.fetchall() if fetch else None
                    c.commit()
                    return rows
                finally:
                    c.close()
            except psycopg2.OperationalError:
                if i == retries - 1:
                    raise
                time.sleep(1)

    @staticmethod
    def pg_url(ports, db):
        """libpq's multi-host URL: whichever node accepts writes (a failover moves it)."""
        return "postgres://postgres@%s/%s?target_session_attrs=read-write" % (
            ",".join("127.0.0.1:%d" % p for p in ports), db)

    def pika_urls(self):
        return ["amqp://guest:guest@127.0.0.1:%d/%%2f" % p for p in self.rc_ports]

    def pika_url(self):
        return self.pika_urls()[0]

    def db_proxy_port(self, relay, node):
        return self.pg_port + 1 + relay + (5 if node == "standby" else 0)

    def broker_proxy_port(self, relay, k):
        return self.amqp_port + 1 + 5 * k + relay

    def broker_url(self, ports=None, relay=False):
        """The broker's URL: the three RabbitMQ nodes (`ports`: a relay's proxies to them), or
        the Kafka mock cluster."""
        if self.a.broker == "amqp":
            return "amqp://guest:guest@%s/%%2f?cluster=rabbit-chaos" % ",".join(
                "127.0.0.1:%d" % p for p in (ports or self.rc_ports))
        extra = "&message.timeout.ms=%d" % KAFKA_MESSAGE_TIMEOUT_MS if relay else ""
        return "kafka://%s?cluster=kafka-chaos%s" % (self.boot, extra)

    def kmock_cmd(self, cmd):
        with self.kmock_lock:
            self.kmock.stdin.write(cmd + "\n")
            self.kmock.stdin.flush()
            reply = self.kmock.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise RuntimeError("chaos_kmock: %s" % (reply or "no reply"))

    # -- setup
    def setup(self):
        base = self.pg_url(list(self.pg_nodes.values()), "postgres")
        c = psycopg2.connect(base)
        c.autocommit = True
        with c.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS chaos WITH (FORCE)")
            cur.execute("CREATE DATABASE chaos")
        c.close()
        self.run([self.obx, "init", "--db", self.db])
        self.sql("""
            CREATE TABLE chaos_order (order_id text PRIMARY KEY, producer text NOT NULL,
                amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT clock_timestamp());
            CREATE TABLE chaos_ledger (event_id text PRIMARY KEY,
                order_id text NOT NULL REFERENCES chaos_order, producer text NOT NULL,
                event_type text NOT NULL, tenant text NOT NULL, aggregate_type text NOT NULL,
                aggregate_id text NOT NULL, payload bytea NOT NULL,
                created_at timestamptz NOT NULL DEFAULT clock_timestamp())""", fetch=False)
        self.fw.check()
        self.fw.flush()
        if self.a.broker == "amqp":
            self.cluster = "rabbit-chaos"
            import pika
            c = pika.BlockingConnection(pika.URLParameters(self.pika_url()))
            ch = c.channel()
            # the topology an operator declares at deployment (docs/amqp.md): quorum queues for
            # the consumers and, bound the same way, one for the verifier per exchange
            for ex in TOPICS:
                ch.exchange_declare(ex, "topic", durable=True)
                for q in (ex + ".app", ex + ".notify", ex + ".verify"):
                    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
                    ch.queue_bind(q, ex, "#")
            c.close()
        else:
            self.cluster = "kafka-chaos"
            self.kmock = subprocess.Popen(
                [os.path.join(self.build, "bench", "chaos_kmock"), "--brokers", "3"] +
                sum((["--topic", "%s:8" % t] for t in TOPICS), []),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=open(os.path.join(self.logdir, "kmock.log"), "ab"), text=True)
            line = self.kmock.stdout.readline().split()
            if len(line) != 2 or line[0] != "bootstraps":
                raise RuntimeError("chaos_kmock did not start: %r" % line)
            self.boot = line[1]
        # routes as a new user makes them: type, cluster, topic; every other setting default
        self.routes = {}
        for etype, topic in TYPES.items():
            out = self.run([self.obx, "route", "set", etype, "--db", self.db, "--cluster",
                            self.cluster, "--topic", topic]).stdout
            self.routes[etype] = {"topic": topic, "gen": int(out.rsplit("generation", 1)[1])}
        log("setup: database chaos, routes %s, broker %s" % (
            ", ".join("%s -> %s (gen %d)" % (t, r["topic"], r["gen"])
                      for t, r in self.routes.items()), self.broker_url()))

    def start_processes(self):
        a = self.a
        add = self.procs.__setitem__
        def proxy(name, listen, to):
            add(name, Proc(name, ["socat", "TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr,fork" % listen,
                                  "TCP:127.0.0.1:%d" % to], self.logdir))
        for i in range(a.relays):
            # one proxy per relay and server node, so that one relay's connections can be cut
            for node, port in sorted(self.pg_nodes.items()):
                proxy("proxy-db-r%d-%s" % (i + 1, node), self.db_proxy_port(i, node), port)
            relay_db = self.pg_url([self.db_proxy_port(i, n) for n in self.pg_nodes], "chaos")
            relay_broker = self.broker_url(relay=True)
            if a.broker == "amqp":
                for k, port in enumerate(self.rc_ports):
                    proxy("proxy-broker-r%d-n%d" % (i + 1, k + 1), self.broker_proxy_port(i, k),
                          port)
                relay_broker = self.broker_url(ports=[self.broker_proxy_port(i, k)
                                                      for k in range(3)])
            argv = [self.obx, "relay", "--db", relay_db, "--broker", relay_broker,
                    "--id", "r%d" % (i + 1)]
            for kv in a.relay_set:
                argv += ["--set", kv]
            add("relay-r%d" % (i + 1), Proc("relay-r%d" % (i + 1), argv, self.logdir))
        cdb = "sqlite:" + os.path.join(self.dir, "consumer.db")
        for i in range(2):
            # every contract and tenant the producers write (the sample projection declares
            # order.created.v1 and tenants tenant-7, tenant-9 unless told otherwise)
            argv = [self.obx, "consume", "--consumer-db", cdb, "--broker", self.broker_url(),
                    "--consumer", "projection", "--types", "*", "--tenants", "*"]
            if a.broker == "amqp":
                argv += ["--topic", ",".join(t + ".app" for t in TOPICS)]
            else:
                argv += ["--topic", ",".join(TOPICS), "--group", "projection",
                         "--broker-prop", "consumer.session.timeout.ms=10000"]
            add("consumer-k%d" % (i + 1), Proc("consumer-k%d" % (i + 1), argv, self.logdir))
        # the second consumer ID: an `--exec` handler, whose effect is outside the inbox's
        # transaction, in two instances on one inbox; the handler writes one line per run, so
        # the verifier counts the runs itself (handler_runs_twice)
        handler = os.path.join(self.dir, "notify.sh")
        with open(handler, "w") as f:
            f.write("#!/bin/sh\ncat >/dev/null\necho \"$OBX_EVENT_ID $PPID\" >>%s\n"
                    % self.runs_path)
        os.chmod(handler, 0o755)
        for i in range(2):
            argv = [self.obx, "consume", "--consumer-db",
                    "sqlite:" + os.path.join(self.dir, "notifier.db"), "--broker",
                    self.broker_url(), "--consumer", "notifier", "--types", "*", "--tenants", "*",
                    "--exec", handler]
            if a.broker == "amqp":
                argv += ["--topic", ",".join(t + ".notify" for t in TOPICS)]
            else:
                argv += ["--topic", ",".join(TOPICS), "--group", "notifier",
                         "--broker-prop", "consumer.session.timeout.ms=10000"]
            add("notifier-n%d" % (i + 1), Proc("notifier-n%d" % (i + 1), argv, self.logdir))
        add("producer-c", Proc("producer-c", [
            os.path.join(self.build, "bench", "chaos_producer"), "--db", self.db, "--name", "c",
            "--ledger", os.path.join(self.dir, "ledger-c.txt"), "--rate", str(a.rate),
            "--seed", str(a.seed * 2 + 1), "--rollback-permille", str(a.rollback_permille)],
            self.logdir))
        add("producer-sql", Proc("producer-sql", [
            "/usr/bin/python3", os.path.join(HERE, "chaos_sql_producer.py"), "--db", self.db,
            "--name", "sql", "--ledger", os.path.join(self.dir, "ledger-sql.txt"),
            "--rate", str(a.rate / 2.0), "--seed", str(a.seed * 2 + 2),
            "--rollback-permille", str(a.rollback_permille)], self.logdir))
        # the consumer database's schema first, by one process, so that two do not race on it
        for name in sorted(self.procs):
            if name.startswith("proxy"):
                self.procs[name].start()
        time.sleep(0.5)
        for name in sorted(self.procs):
            if name.startswith(("relay", "consumer", "notifier")):
                self.procs[name].start()
                if name in ("consumer-k1", "notifier-n1"):
                    time.sleep(1.5)
        if a.broker == "amqp":
            self.reader = AmqpReader(self.pika_urls(), [t + ".verify" for t in TOPICS],
                                     os.path.join(self.dir, "broker.jsonl"))
            self.reader.start()
        else:
            self.kreaders = [KcatReader(self.boot, t, self.logdir) for t in TOPICS]
            for r in self.kreaders:
                r.start()
        time.sleep(1)
        for name in ("producer-c", "producer-sql"):
            self.procs[name].start()
        self.supervisor = threading.Thread(target=self.supervise, daemon=True)
        self.supervisor.start()

    def supervise(self):
        """Restarts what exits on its own, as a service manager would; counts it."""
        while not self.supervising.is_set():
            for p in list(self.procs.values()):
                with p.lock:
                    if p.held or p.alive() or p.p is None or not p.restart:
                        continue
                    if p.name.startswith("proxy-db-") and p.name.rsplit("-", 1)[1] in self.pg_down:
                        continue
                    rc = p.p.returncode
                    p.exits.append(rc)
                    log("%s exited on its own (status %s): restarting" % (p.name, rc))
                    p.start()
            self.supervising.wait(1)

    # -- faults
    def claim(self, keys):
        with self.busy_lock:
            if any(k in self.busy for k in keys):
                return False
            self.busy.update(keys)
            return True

    def unclaim(self, keys):
        with self.busy_lock:
            self.busy.difference_update(keys)

    def pick(self, f):
        """(target, busy keys) of fault f: its own target, or the next free one when that is
        busy (a relay, a consumer or a Kafka broker has one fault at a time; so has each
        server); (None, None) when none is free."""
        kind, a = f["kind"], self.a
        if kind in ("relay_kill", "relay_pause", "net_reject", "net_drop", "proxy_stall"):
            n, fmt, base = a.relays, "relay%d", 0
        elif kind in ("consumer_kill", "consumer_pause"):
            n, fmt, base = 2, "consumer%d", 0
        elif kind == "kafka_broker_down":
            n, fmt, base = 3, "kbroker%d", 1
        else:  # one fault at a time per server (its nodes included)
            keys = {"pg_crash": ["pg"], "pg_failover": ["pg"], "rabbit_kill": ["rabbit"],
                    "rabbit_node_loss": ["rabbit"], "rabbit_partition": ["rabbit"]}.get(kind, [])
            return (None, keys) if self.claim(keys) else (None, None)
        for d in range(n):
            t = (f["target"] - base + d) % n + base
            if self.claim([fmt % t]):
                return (t, [fmt % t])
        return (None, None)

    def fault(self, f):
        kind = f["kind"]
        target, keys = self.pick(f)
        # a busy target: try again every 2 s for up to 2 minutes, until the producers stop (but
        # 45 s at least): a kind must not miss its turn, and a server's faults wait for one
        # another (a failover holds PostgreSQL until its new standby is synchronous, a RabbitMQ
        # fault until the three nodes run together again); one that starts late is cut short
        # when the run is over
        now = time.monotonic()
        deadline = max(now + 45, min(now + 120, self.t_end))
        while keys is None and sleep_until(min(time.monotonic() + 2, deadline), self.stop_faults) \
                and time.monotonic() < deadline:
            target, keys = self.pick(f)
        rec = dict(f, start=time.time())
        if keys is None:
            rec.update(skipped="every target busy")
            log("fault: %s skipped: every target busy" % kind)
            self.faults.append(rec)
            with open(os.path.join(self.dir, "faults.jsonl"), "a") as fl:
                fl.write(json.dumps(rec) + "\n")
            return
        if target is not None:
            rec["target"] = target
        heal = None
        try:
            heal = self.fault_start(kind, target, f)
            rec["started"] = time.time()
            sleep_until(time.monotonic() + f["duration"], self.stop_faults)
        except Exception as e:
            rec["error"] = "%s: %s" % (type(e).__name__, e)
            log("fault %s failed to start: %s" % (kind, e))
        finally:
            try:
                if heal:
                    heal()
            except Exception as e:
                rec["heal_error"] = "%s: %s" % (type(e).__name__, e)
                log("fault %s: heal failed: %s" % (kind, e))
            rec["healed"] = time.time()
            self.unclaim(keys)
            self.faults.append(rec)
            with open(os.path.join(self.dir, "faults.jsonl"), "a") as fl:
                fl.write(json.dumps(rec) + "\n")

    def fault_start(self, kind, t, f):
        """Starts fault `kind` on target t; returns the function that heals it."""
        desc = "%s %s" % (kind, f.get("target", "") if t is None else t)
        log("fault: %s for %.1f s%s" % (desc, f["duration"], " (%s)" % f["side"]
                                          if "side" in f else ""))
        if kind in ("relay_kill", "consumer_kill"):
            p = self.procs["relay-r%d" % (t + 1) if kind == "relay_kill" else
                           "consumer-k%d" % (t + 1)]
            p.kill9()
            return p.release
        if kind in ("relay_pause", "consumer_pause"):
            p = self.procs["relay-r%d" % (t + 1) if kind == "relay_pause" else
                           "consumer-k%d" % (t + 1)]
            with p.lock:
                p.held = True
            p.group_signal(signal.SIGSTOP)

            def cont():
                p.group_signal(signal.SIGCONT)
                with p.lock:
                    p.held = False
            return cont
        if kind in ("pg_crash", "pg_failover", "rabbit_kill", "rabbit_node_loss",
                    "rabbit_partition"):
            return self.server_fault(kind, f)
        if kind in ("net_reject", "net_drop"):
            ports = ([self.db_proxy_port(t, n) for n in self.pg_nodes] if f["side"] == "db" else
                     [self.broker_proxy_port(t, k) for k in range(3)])
            action = "REJECT" if kind == "net_reject" else "DROP"
            specs = self.fw.add_specs(sum((self.fw.specs(p, action) for p in ports), []))
            return lambda: self.fw.remove(specs)
        if kind == "proxy_stall":  # the relay's proxies to every node of that server
            ps = [p for n, p in sorted(self.procs.items())
                  if n.startswith("proxy-%s-r%d-" % (f["side"], t + 1))]
            for p in ps:
                with p.lock:
                    p.held = True
                p.group_signal(signal.SIGSTOP)

            def resume():
                for p in ps:
                    p.group_signal(signal.SIGCONT)
                    with p.lock:
                        p.held = False
            return resume
        if kind == "kafka_broker_down":
            self.kmock_cmd("down %d" % t)
            return lambda: self.kmock_cmd("up %d" % t)
        if kind == "kafka_leader_change":
            self.kmock_cmd("leader %s %d %d" % (f["topic"], f["partition"], f["target"]))
            return None
        if kind == "kafka_request_errors":
            self.kmock_cmd("error %d %s %d" % (f["target"], f["kafka_error"], f["count"]))
            return None
        if kind == "kafka_lost_ack":
            self.kmock_cmd("delay %d %d %d" % (f["target"], KAFKA_MESSAGE_TIMEOUT_MS + 5000,
                                               f["count"]))
            return None
        raise ValueError("unknown fault kind " + kind)

    def server_fault(self, kind, f):
        """The faults of the servers' nodes; returns the function that heals the fault.
          pg_crash          the primary killed (-m immediate), started again on its data
          pg_failover       the primary killed (-m immediate); the heal promotes the standby,
                            then rebuilds the old primary as the new one's synchronous standby
                            (a base backup), so that the next failover loses nothing either
          rabbit_kill       every RabbitMQ node killed (SIGKILL), started again together
          rabbit_node_loss  node f["target"] killed (SIGKILL), started again
          rabbit_partition  node f["target"] cut from the other two (iptables on their
                            distribution ports), healed
        A RabbitMQ heal waits until the three nodes run together again."""
        if kind == "pg_crash":
            node = self.pg_primary
            self.pg_node_down(node)

            def restart():
                self.pgfo("restart", node, tries=3)
                self.pg_node_up(node)
            return restart
        if kind == "pg_failover":
            old = self.pg_primary
            new = "standby" if old == "primary" else "primary"
            self.pg_node_down(old)

            def failover():
                self.pgfo("promote", new)
                self.pg_primary = new
                log("pg_failover: %s (127.0.0.1:%d) promoted; rebuilding %s as its standby" % (
                    new, self.pg_nodes[new], old))
                self.pgfo("rebuild", old, tries=3)
                self.pg_node_up(old)
                log("pg_failover: %s is %s's synchronous standby" % (old, new))
            return failover
        if kind == "rabbit_partition":
            specs = self.fw.add_specs(self.fw.partition_specs(f["target"], self.rc_dist))

            def heal():
                self.fw.remove(specs)
                self.rabbit_wait()
            return heal
        nodes = [f["target"]] if kind == "rabbit_node_loss" else [1, 2, 3]
        for n in nodes:
            self.rabbit("kill", n)

        def restart():
            # together: a node whose peers went down with it waits for them at its start
            ths = [threading.Thread(target=self.rabbit, args=("restart", n),
                                    kwargs={"check": False}) for n in nodes]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            self.rabbit_wait()
        return restart

    def pg_node_down(self, node):
        """Node killed (-m immediate), and the relays' proxies to it with it: a host that is
        down refuses connections. (A proxy that accepts a connection and then closes it, as
        socat does when its server is gone, keeps libpq 15 from trying the URL's next host:
        the relays would never reach the promoted standby; docs/reliability.md.)"""
        self.pg_down.add(node)
        self.pgfo("kill", node)
        for name, p in sorted(self.procs.items()):
            if name.startswith("proxy-db-") and name.endswith("-" + node):
                p.kill9()

    def pg_node_up(self, node):
        self.pg_down.discard(node)
        for name, p in sorted(self.procs.items()):
            if name.startswith("proxy-db-") and name.endswith("-" + node):
                p.release()

    def pgfo(self, cmd, node, tries=1):
        """scripts/pg_failover.sh CMD on node NODE; tries again (a start on a loaded machine can
        time out) up to `tries` times."""
        argv = [os.path.join(ROOT, "scripts", "pg_failover.sh"), cmd, self.fo_dir, node]
        for i in range(tries):
            r = self.run(argv, check=False, timeout=300)
            if r.returncode == 0:
                return
            log("pg_failover.sh %s %s: exit %d (%s)%s" % (
                cmd, node, r.returncode, (r.stderr or r.stdout).strip()[-300:],
                ": retrying" if i + 1 < tries else ""))
        raise RuntimeError("pg_failover.sh %s %s failed" % (cmd, node))

    def rabbit(self, cmd, n, check=True):
        r = self.run([os.path.join(ROOT, "scripts", "rabbit_cluster.sh"), cmd, self.rc_dir,
                      str(n)], check=False, timeout=300)
        if r.returncode:
            log("rabbit_cluster.sh %s %d: exit %d (%s)" % (cmd, n, r.returncode,
                                                         (r.stderr or r.stdout).strip()[-300:]))
            if check:
                raise RuntimeError("rabbit_cluster.sh %s %d failed" % (cmd, n))
        return r.stdout.strip()

    def rabbit_wait(self, timeout=240):
        """Until some node sees the three running together (a booting node, or one paused in
        a minority, takes a while); else the heal failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in (1, 2, 3):
                if self.rabbit("running", n, check=False) == "3":
                    return
            time.sleep(2)
        raise RuntimeError("RabbitMQ: the three nodes do not run together %d s after the heal"
                           % timeout)

    def run_schedule(self, schedule, t_start):
        for f in schedule:
            if not sleep_until(t_start + f["t"], self.stop_faults):
                break
            th = threading.Thread(target=self.fault, args=(f,), daemon=True)
            th.start()
            self.fault_threads.append(th)

    # -- the outside view, live
    def seen_at_broker(self):
        if self.reader:
            with self.reader.lock:
                return set(self.reader.first)
        s = set()
        for r in self.kreaders:
            s |= set(r.first)
        return s

    def arrivals(self):
        if self.reader:
            with self.reader.lock:
                return dict(self.reader.first)
        out = {}
        for r in self.kreaders:
            for k, v in r.first.items():
                out[k] = min(v, out.get(k, v))
        return out

    def projection(self):
        path = os.path.join(self.dir, "consumer.db")
        for i in range(30):
            try:
                c = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
                try:
                    return c.execute("SELECT event_id, payload, applied_at / 1000.0 "
                                     "FROM order_projection").fetchall()
                finally:
                    c.close()
            except sqlite3.OperationalError:
                time.sleep(1)
        raise RuntimeError("cannot read the consumers' projection in %s" % path)

    def handler_runs(self):
        """The event ID of each run of the notifier's handler (its own lines)."""
        if not os.path.exists(self.runs_path):
            return []
        with open(self.runs_path) as f:
            return [line.split()[0] for line in f if line.split()]

    def open_unknown(self):
        return self.sql("SELECT count(*) FROM obx.obx_event WHERE state IN "
                        "('DISPATCH_UNKNOWN', 'RECONCILING')")[0][0]

    def drain(self):
        deadline = time.monotonic() + self.a.drain
        last = None
        while time.monotonic() < deadline:
            committed = {r[0] for r in self.sql("SELECT event_id FROM chaos_ledger")}
            at_broker = self.seen_at_broker()
            applied = {r[0] for r in self.projection()}
            handled = set(self.handler_runs())
            unknown = self.open_unknown()
            missing_b, missing_c = len(committed - at_broker), len(committed - applied)
            missing_h = len(committed - handled)
            state = (missing_b, missing_c, missing_h, unknown)
            if state != last:
                log("drain: %d committed, %d not yet at the broker, %d not yet applied, "
                    "%d not yet handled, %d UNKNOWN in obx" % (len(committed), missing_b,
                                                              missing_c, missing_h, unknown))
                last = state
            if missing_b == 0 and missing_c == 0 and missing_h == 0 and unknown == 0:
                time.sleep(3)  # late duplicates
                return True
            time.sleep(2)
        log("drain: gave up after %d s" % self.a.drain)
        return False

    # -- the end
    def collect(self):
        ledger = {}
        for (eid, oid, prod, etype, tenant, atype, aid, payload,
             created) in self.sql("SELECT event_id, order_id, producer, event_type, tenant, "
                                  "aggregate_type, aggregate_id, payload, "
                                  "extract(epoch FROM created_at)::float8 FROM chaos_ledger"):
            ledger[eid] = {"order_id": oid, "producer": prod, "event_type": etype,
                           "tenant": tenant, "aggregate_type": atype, "aggregate_id": aid,
                           "payload": bytes(payload), "created": created}
        files = []
        commit_t = {}
        for prod in ("c", "sql"):
            path = os.path.join(self.dir, "ledger-%s.txt" % prod)
            if not os.path.exists(path):
                continue
            for line in open(path):
                parts = line.split()
                if len(parts) != 4:
                    continue
                ids = [x for x in parts[2].split(",") if x]
                files.append((parts[0], parts[1], ids))
                if parts[0] == "C":
                    for e in ids:
                        commit_t[e] = int(parts[3]) / 1000.0
        for eid, led in ledger.items():
            commit_t.setdefault(eid, led["created"])
        if self.reader:
            with self.reader.lock:
                records = list(self.reader.records)
            partitions = None
        else:
            records = []
            for t in TOPICS:
                records += kafka_read_all(self.boot, t)
            partitions = {t: 8 for t in TOPICS}
        return ledger, files, records, partitions, commit_t

    def obx_view(self, end_ms):
        rows = self.sql("""
            SELECT event_id, at, from_state, to_state FROM obx.obx_audit_all
             WHERE event_id IN (SELECT event_id FROM obx.obx_audit_all
                                 WHERE to_state = 'DISPATCH_UNKNOWN')
             ORDER BY event_id, audit_id NULLS FIRST, ord""")
        view = cv.unknown_summary(rows, end_ms)
        r = self.run([self.obx, "report", "--db", self.db, "--json"], check=False)
        try:
            rep = json.loads(r.stdout)
            # exit 1 is also an open alarm (a quarantined receipt): the invariants are in the document
            view["obx_report_ok"] = r.returncode in (0, 1) and bool(rep["invariants"]["hold"])
            view["obx_report"] = {"committed": rep.get("committed"),
                                  "published": rep.get("published"),
                                  "states": rep.get("states"), "receipts": rep.get("receipts"),
                                  "unknown": rep.get("unknown"),
                                  "invariants": rep.get("invariants")}
        except (ValueError, KeyError):
            view["obx_report_ok"] = False
            view["obx_report"] = {"error": (r.stderr or r.stdout)[-500:]}
        r = self.run([self.obx, "audit", "--db", self.db, "--broker", self.broker_url(),
                      "--consumer", "projection=sqlite:" + os.path.join(self.dir, "consumer.db"),
                      "--json"], check=False, timeout=600)
        try:
            aud = json.loads(r.stdout)
            view["obx_audit"] = {"ok": r.returncode == 0, "findings_total":
                                 aud.get("findings_total"),
                                 "findings": [{k: x.get(k) for k in ("kind", "count", "detail")}
                                              for x in aud.get("findings", [])]}
        except ValueError:
            view["obx_audit"] = {"ok": False, "error": (r.stderr or r.stdout)[-500:]}
        return view

    def recovery(self, commit_t, arrival):
        """Per fault kind, from `arrival` (event -> when it was first seen: applied by a
        consumer, end to end, or at the broker): seconds from the heal until work committed
        after it arrives at normal latency again (recovery), and until the work committed before
        the heal (from a minute before the fault) and stuck behind it has arrived (backlog).
        Overlapping faults make both upper bounds."""
        lat = {e: arrival[e] - commit_t[e] for e in commit_t if e in arrival}
        p50 = cv.percentile(list(lat.values()), 50) or 0
        normal = max(1.0, 3 * p50)
        by_commit = sorted((commit_t[e], e) for e in lat)
        times = [t for t, _ in by_commit]
        # suffix minimum of the arrival of normal-latency events, in commit order
        sufmin = [float("inf")] * (len(by_commit) + 1)
        for i in range(len(by_commit) - 1, -1, -1):
            t, e = by_commit[i]
            sufmin[i] = min(sufmin[i + 1], arrival[e] if lat[e] <= normal else float("inf"))
        out = {}
        for f in self.faults:
            if "skipped" in f or "error" in f:
                continue
            h = f["healed"]
            i = bisect.bisect_left(times, h)
            if i == len(times):
                continue  # nothing committed after the heal: nothing to measure
            rec = sufmin[i] - h if sufmin[i] != float("inf") else None
            lo = bisect.bisect_left(times, f["start"] - 60)
            stuck = [arrival[by_commit[j][1]] for j in range(lo, i)
                     if arrival[by_commit[j][1]] > h]
            k = out.setdefault(f["kind"], {"recovery": [], "backlog": [], "never": 0})
            if rec is None:
                k["never"] += 1
            else:
                k["recovery"].append(max(0.0, rec))
            k["backlog"].append(max(stuck) - h if stuck else 0.0)
        res = {}
        for kind, k in sorted(out.items()):
            res[kind] = {"n": len(k["recovery"]) + k["never"],
                         "p50_s": rnd(cv.percentile(k["recovery"], 50)),
                         "max_s": rnd(max(k["recovery"]) if k["recovery"] else None),
                         "not_recovered": k["never"],
                         "backlog_max_s": rnd(max(k["backlog"]) if k["backlog"] else None)}
        lats = list(lat.values())
        return res, {"p50_s": rnd(cv.percentile(lats, 50)), "p99_s": rnd(cv.percentile(lats, 99)),
                     "max_s": rnd(max(lats) if lats else None), "normal_s": rnd(normal)}

    def heal_everything(self):
        """Whatever a fault may have left: paused processes, firewall rules, servers down."""
        self.stop_faults.set()
        if self.scheduler:
            self.scheduler.join(timeout=10)
        for th in self.fault_threads:
            th.join(timeout=240)
        self.fw.flush()
        for p in self.procs.values():
            if p.p is not None:
                p.group_signal(signal.SIGCONT)

    def shutdown(self):
        """Stops every process and reader; the Kafka mock cluster stays (obx audit reads it)."""
        self.supervising.set()
        for name in sorted(self.procs, key=lambda n: (n.startswith("proxy"), n)):
            self.procs[name].stop()
        if self.reader:
            self.reader.stopping.set()
            self.reader.join(timeout=10)
        for r in self.kreaders:
            r.close()

    def close_broker(self):
        if self.kmock and self.kmock.poll() is None:
            try:
                self.kmock.stdin.write("quit\n")
                self.kmock.stdin.flush()
                self.kmock.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kmock.kill()


def rnd(x):
    return None if x is None else round(x, 2)


def tamper(soak, ledger, files, records):
    """--self-test: plants one fault of each kind the verifier must see, for real where the
    store allows it: a ledger row without an event (lost), a copy at a wrong destination, a copy
    with a changed body (digest), a rolled-back event's ID at the broker (phantom), a second
    effect row (duplicate effect)."""
    rolled = [e for st, _, ids in files if st == "R" for e in ids if e not in ledger]
    by_type = {}
    for rec in records:
        eid = rec["headers"].get("obx-event-id")
        if eid in ledger:
            by_type.setdefault(ledger[eid]["event_type"], []).append(rec)
    orders, payments = by_type.get("order.created.v1", []), by_type.get("payment.captured.v1", [])
    if not rolled or len(orders) < 3 or not payments:
        raise RuntimeError("self-test: the run made too little to tamper with (%d rolled back, "
                           "%d order copies, %d payment copies)" % (len(rolled), len(orders),
                                                                      len(payments)))
    planted = {}
    soak.sql("INSERT INTO chaos_order (order_id, producer, amount) VALUES ('tamper-1', 'tamper', 1);"
             "INSERT INTO chaos_ledger (event_id, order_id, producer, event_type, tenant, "
             "aggregate_type, aggregate_id, payload) VALUES ('evt-00000000000000000000TAMPER', "
             "'tamper-1', 'tamper', 'order.created.v1', 't1', 'order', 'tamper-1', '\\x7b7d')",
             fetch=False)
    planted["lost"] = "evt-00000000000000000000TAMPER"
    wrong = payments[0]
    changed = orders[0]
    phantom = dict(orders[1], headers=dict(orders[1]["headers"], **{"obx-event-id": rolled[0]}))
    msgs = [("orders", wrong, wrong["body"]), ("orders", changed, changed["body"] + b" "),
            ("orders", phantom, phantom["body"])]
    planted["wrong_destination"] = wrong["headers"]["obx-event-id"]
    planted["digest_mismatch"] = changed["headers"]["obx-event-id"]
    planted["phantom"] = rolled[0]
    if soak.a.broker == "amqp":
        import pika
        c = pika.BlockingConnection(pika.URLParameters(soak.pika_url()))
        ch = c.channel()
        ch.confirm_delivery()
        for ex, rec, body in msgs:
            ch.basic_publish(ex, rec["key"], body, pika.BasicProperties(
                delivery_mode=2, headers={k: v for k, v in rec["headers"].items()
                                          if k.startswith("obx-")}), mandatory=True)
        c.close()
    else:
        for topic, rec, body in msgs:
            argv = ["kcat", "-P", "-b", soak.boot, "-t", topic, "-p", str(rec["partition"]),
                    "-k", rec["key"]]
            for k, v in rec["headers"].items():
                if k.startswith("obx-"):
                    argv += ["-H", "%s=%s" % (k, v)]
            subprocess.run(argv, input=body, check=True, capture_output=True)
    dup = orders[2]["headers"]["obx-event-id"]
    c = sqlite3.connect(os.path.join(soak.dir, "consumer.db"), timeout=30)
    c.execute("INSERT INTO order_projection SELECT * FROM order_projection WHERE event_id = ? "
              "LIMIT 1", (dup,))
    c.commit()
    c.close()
    planted["duplicate_effects"] = dup
    # a second run of the notifier's handler for an event it ran once
    twice = orders[1]["headers"]["obx-event-id"]
    with open(soak.runs_path, "a") as f:
        f.write("%s 0\n" % twice)
    planted["handler_runs_twice"] = twice
    return planted


def summary_lines(res):
    rows = [("broker", res["broker"]), ("seed", res["seed"]), ("minutes", res["minutes"]),
            ("events committed (producers' ledger)", res["committed"]),
            ("events rolled back after enqueue", res["rolled_back"]),
            ("lost (not at the broker or not applied)", res["lost"]),
            ("  not at the broker", res["lost_at_broker"]),
            ("  not applied by the consumers", res["lost_at_consumer"]),
            ("wrong destination", res["wrong_destination"]),
            ("digest mismatch", res["digest_mismatch"]),
            ("envelope mismatch", res["envelope_mismatch"]),
            ("phantom (uncommitted event seen)", res["phantom"]),
            ("ledger mismatch (file vs table)", res["ledger_mismatch"]),
            ("copies at the broker", res["broker_copies"]),
            ("duplicate deliveries (expected)", res["duplicate_deliveries"]),
            ("duplicate effects", res["duplicate_effects"]),
            ("handler runs (--exec, 2 instances)", res["handler_runs"]),
            ("  events never handled", res["lost_at_handler"]),
            ("  handler runs twice", res["handler_runs_twice"]),
            ("commit -> broker p50 / p99 / max (s)", "%s / %s / %s" % tuple(
                res["latency_s"]["commit_to_broker"][k] for k in ("p50_s", "p99_s", "max_s"))),
            ("commit -> applied p50 / p99 / max (s)", "%s / %s / %s" % tuple(
                res["latency_s"]["commit_to_applied"][k] for k in ("p50_s", "p99_s", "max_s"))),
            ("obx's view: UNKNOWN episodes", res["unknown_total"]),
            ("obx's view: UNKNOWN unresolved", res["unknown_unresolved"]),
            ("obx's view: UNKNOWN p99 (s)", res["unknown_p99_s"]),
            ("obx report (invariants hold)", res["obx_report_ok"]),
            ("obx audit (no findings)", res["obx_audit"].get("ok")),
            ("drained", res["drained"]),
            ("restarts the supervisor made: relays / consumers", "%d / %d" % (
                res["relay_restarts"], res["consumer_restarts"])),
            ("faults skipped / failed / kinds missing", "%d / %d / %s" % (
                res["faults_skipped"], res["faults_failed"],
                ",".join(res["faults_missing"]) or "none"))]
    out = ["", "obx chaos soak — %s" % ("PASSED" if not res["failed"] else
                                         "FAILED: " + ", ".join(res["failed"])), ""]
    out += ["  %-42s %s" % (k, v) for k, v in rows]
    out += ["", "  %-22s %6s %10s %10s %8s %12s" % ("fault", "fired", "recov p50", "recov max",
                                                     "never", "backlog max")]
    for kind, n in sorted(res["faults"].items()):
        rc = res["recovery_s"].get(kind, {})
        out.append("  %-22s %6d %10s %10s %8s %12s" % (
            kind, n, rc.get("p50_s", "-"), rc.get("max_s", "-"), rc.get("not_recovered", "-"),
            rc.get("backlog_max_s", "-")))
    if res.get("process_exits"):
        out.append("")
        out.append("  processes that exited on their own (restarted): %s" % res["process_exits"])
    for k, v in sorted(res.get("examples", {}).items()):
        out.append("  e.g. %s: %s" % (k, " ".join(v[:5])))
    if res.get("unknown_unresolved_ids"):
        out.append("  e.g. unresolved UNKNOWN: %s" % " ".join(res["unknown_unresolved_ids"][:5]))
    out.append("  work folder: %s" % res["dir"])
    return out


def main():
    ap = argparse.ArgumentParser(description="obx chaos soak (run it through scripts/chaos.sh)")
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--broker", choices=("amqp", "kafka"), default="amqp")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--relays", type=int, default=3, choices=range(1, 6), metavar="1..5")
    ap.add_argument("--rate", type=float, default=8.0, help="C producer orders/s (SQL: half)")
    ap.add_argument("--rollback-permille", type=int, default=50)
    ap.add_argument("--drain", type=float, default=300)
    ap.add_argument("--relay-set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--faults", default=None, help="comma-separated kinds (default: all)")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--schedule-only", action="store_true")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.minutes <= 0 or a.rate <= 0 or a.drain < 0:
        ap.error("--minutes and --rate must be > 0, --drain >= 0")
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(3), "big")
    kinds = None if a.faults is None else a.faults.split(",")
    if kinds:
        bad = [k for k in kinds if k not in COMMON_KINDS + BROKER_KINDS[a.broker]]
        if bad:
            ap.error("--faults: unknown for %s: %s (known: %s)" % (
                a.broker, ",".join(bad), ",".join(COMMON_KINDS + BROKER_KINDS[a.broker])))
    lease = 30.0
    for kv in a.relay_set:
        if kv.startswith("relay.lease_ms="):
            lease = int(kv.split("=", 1)[1]) / 1000.0
    schedule = [] if a.no_faults or a.self_test else make_schedule(a.seed, a.minutes, a.broker,
                                                                   lease, a.relays, kinds)
    if a.schedule_only:
        print(json.dumps(schedule, indent=1))
        print("chaos: seed %d: %d faults" % (a.seed, len(schedule)), file=sys.stderr)
        return 0
    log("seed %d, %s, %.1f min, %d faults scheduled; replay: scripts/chaos.sh --minutes %g "
        "--broker %s --seed %d" % (a.seed, a.broker, a.minutes, len(schedule), a.minutes,
                                   a.broker, a.seed))
    with open(os.path.join(a.dir, "schedule.json"), "w") as f:
        json.dump(schedule, f, indent=1)
    soak = Soak(a)
    res = None
    try:
        soak.setup()
        soak.start_processes()
        t_start = time.monotonic()
        soak.t_end = t_start + a.minutes * 60 * 0.97
        soak.scheduler = threading.Thread(target=soak.run_schedule, args=(schedule, t_start),
                                          daemon=True)
        soak.scheduler.start()
        sleep_until(t_start + a.minutes * 60, threading.Event())
        log("run over: healing, stopping the producers")
        soak.heal_everything()
        for name in ("producer-c", "producer-sql"):
            soak.procs[name].stop(timeout=60)
        drained = soak.drain()
        ledger, files, records, partitions, commit_t = soak.collect()
        clean = cv.verify(ledger, files, soak.routes, records,
                          [r[:2] for r in soak.projection()], partitions, soak.cluster,
                          soak.handler_runs())
        planted = None
        if a.self_test:
            planted = tamper(soak, ledger, files, records)
            time.sleep(5)  # the tampered copies reach the verifier queues
            ledger, files, records, partitions, commit_t = soak.collect()
        proj = soak.projection()
        res = cv.verify(ledger, files, soak.routes, records, [r[:2] for r in proj], partitions,
                        soak.cluster, soak.handler_runs())
        applied = {}
        for eid, _, at in proj:
            applied[eid] = min(at, applied.get(eid, at))
        end_ms = int(time.time() * 1000)
        arrival = soak.arrivals()
        soak.shutdown()
        view = soak.obx_view(end_ms)
        recov, latency = soak.recovery(commit_t, applied)
        latency = {"commit_to_broker": soak.recovery(commit_t, arrival)[1],
                   "commit_to_applied": latency}
        counts = {}
        for f in soak.faults:
            if "skipped" not in f and "error" not in f:
                counts[f["kind"]] = counts.get(f["kind"], 0) + 1
        counts["rollback"] = res["rolled_back"]
        enabled = sorted({f["kind"] for f in schedule})
        res.update(view)
        res.update({
            "broker": a.broker, "seed": a.seed, "minutes": a.minutes, "drained": drained,
            "faults": counts, "faults_skipped": sum(1 for f in soak.faults if "skipped" in f),
            "faults_failed": sum(1 for f in soak.faults if "error" in f or "heal_error" in f),
            "recovery_s": recov, "latency_s": latency, "dir": a.dir,
            "faults_missing": [k for k in enabled if not counts.get(k)],
            "process_exits": {p.name: len(p.exits) for p in soak.procs.values() if p.exits},
            # restarts the supervisor had to make (an exit no fault caused): outages are waited
            # out, so each one is a defect
            "relay_restarts": sum(len(p.exits) for p in soak.procs.values()
                                  if p.name.startswith("relay")),
            "consumer_restarts": sum(len(p.exits) for p in soak.procs.values()
                                     if p.name.startswith(("consumer", "notifier"))),
        })
        res["failed"] = cv.failures(res)
        res["failed"] += [k for k in ("relay_restarts", "consumer_restarts") if res[k]]
        # the soak did not test what it says it tested, or left its servers broken
        if res["faults_missing"]:
            res["failed"].append("faults_missing")
        if res["faults_failed"]:
            res["failed"].append("faults_failed")
        if a.self_test:
            return self_test_verdict(clean, res, planted)
    finally:
        soak.heal_everything()
        soak.shutdown()
        soak.close_broker()
        soak.fw.flush()
    with open(os.path.join(a.dir, "result.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = summary_lines(res)
    if a.json:
        print("\n".join(lines), file=sys.stderr)
        print(json.dumps(res))
    else:
        print("\n".join(lines))
    return 1 if res["failed"] else 0


def self_test_verdict(clean, res, planted):
    """The clean verification must be clean; after tampering each planted fault must move its
    own counter by exactly one, and the soak must count as failed."""
    keys = ("lost", "wrong_destination", "digest_mismatch", "phantom", "duplicate_effects",
            "envelope_mismatch", "ledger_mismatch", "handler_runs_twice")
    errors = []
    if any(clean[k] for k in keys):
        errors.append("the untampered run is not clean: %s" % {k: clean[k] for k in keys
                                                                 if clean[k]})
    for k in keys:
        want = clean[k] + (1 if k in planted else 0)
        if res[k] != want:
            errors.append("%s: %d after tampering, want %d (planted %s)" % (
                k, res[k], want, planted.get(k, "nothing")))
        elif k in planted and planted[k] not in res["examples"].get(k, []):
            errors.append("%s: counted, but not the planted %s" % (k, planted[k]))
    if not res["failed"]:
        errors.append("the tampered soak did not fail")
    for e in errors:
        print("chaos self-test: FAIL: " + e)
    if errors:
        return 1
    print("chaos self-test: ok: the verifier found every planted fault (%s) and nothing else; "
          "the soak fails on them (%s)" % (", ".join("%s=%s" % kv for kv in planted.items()),
                                           ", ".join(res["failed"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""otlp_receiver.py — a minimal OTLP/HTTP (JSON) trace receiver for test_otel.sh.

Usage: otlp_receiver.py OUT_FILE PORT_FILE
Listens on 127.0.0.1 (a free port, written to PORT_FILE once listening), accepts
POST /v1/traces with Content-Type application/json, appends each request body as one line of
OUT_FILE and answers 200 with an empty ExportTraceServiceResponse ({}). Anything else: 404/415.
OTLP_FAIL_FIRST=K in the environment: the first K POSTs are answered 503 (a collector that is
restarting), and counted in OUT_FILE.fails.
"""
import http.server
import json
import sys

import os
import threading

out_path, port_path = sys.argv[1], sys.argv[2]
fail_first = int(os.environ.get("OTLP_FAIL_FIRST", "0"))
posts = [0]
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        if not self.headers.get("Content-Type", "").startswith("application/json"):
            self.send_response(415)
            self.end_headers()
            return
        with lock:
            posts[0] += 1
            refuse = posts[0] <= fail_first
        if refuse:
            with open(out_path + ".fails", "a") as f:
                f.write("503\n")
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        doc = json.loads(body)  # a body that is not JSON ends the handler with a 500
        with open(out_path, "a") as f:
            f.write(json.dumps(doc) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(port_path + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(port_path + ".tmp", port_path)
srv.serve_forever()

"""cdp.py — a minimal Chrome DevTools Protocol client on the Python standard library only.

Starts Debian's headless Chromium with a remote debugging port, finds the page target and
speaks CDP over a WebSocket (RFC 6455 client framing implemented here: no third-party
packages, no downloaded browsers). Used by the dashboard's end-to-end test.
"""
import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-dev-shm-usage",
]


class CDPError(Exception):
    pass


class WebSocket:
    """A client WebSocket: text frames out (masked), text/continuation/ping/close in."""

    def __init__(self, url, timeout=30):
        assert url.startswith("ws://"), url
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port or 80)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n")
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CDPError("websocket handshake: connection closed")
            head += chunk
        status, _, rest = head.partition(b"\r\n")
        if b" 101 " not in status:
            raise CDPError("websocket handshake refused: %r" % status)
        self.buf = rest.partition(b"\r\n\r\n")[2]

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise CDPError("websocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _frame(self, opcode, payload):
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send(self, text):
        self._frame(0x1, text.encode())

    def recv(self):
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == 0x9:  # ping
                self._frame(0xA, data)
                continue
            if opcode == 0x8:
                raise CDPError("websocket closed by the browser")
            if opcode in (0x1, 0x2, 0x0):
                parts.append(data)
                if b0 & 0x80:
                    return b"".join(parts).decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Browser:
    """Headless Chromium with one page, driven through CDP."""

    def __init__(self, binary=None):
        self.binary = binary or shutil.which("chromium") or shutil.which("chromium-browser")
        if not self.binary:
            raise CDPError("chromium not found (scripts/deps.sh test installs it)")
        self.profile = tempfile.mkdtemp(prefix="obx-chromium-")
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             "about:blank"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.time() + 30
        port = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise CDPError("chromium exited with %s: %s" % (self.proc.returncode, self.logtail()))
            try:
                with open(port_file) as f:
                    port = int(f.readline().strip())
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        if not port:
            raise CDPError("chromium did not open its debugging port: " + self.logtail())
        page = None
        while time.time() < deadline and not page:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    targets = json.load(r)
                page = next((t for t in targets if t.get("type") == "page"), None)
            except OSError:
                pass
            if not page:
                time.sleep(0.05)
        if not page:
            raise CDPError("no page target")
        self.ws = WebSocket(page["webSocketDebuggerUrl"])
        self.next_id = 0
        self.console = []  # console messages and exceptions seen (for diagnostics)
        self.call("Runtime.enable")
        self.call("Page.enable")

    def logtail(self):
        try:
            with open(os.path.join(self.profile, "chromium.log"), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def call(self, method, **params):
        self.next_id += 1
        my = self.next_id
        self.ws.send(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my:
                if "error" in msg:
                    raise CDPError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            m = msg.get("method", "")
            if m == "Runtime.consoleAPICalled":
                self.console.append(" ".join(str(a.get("value", a.get("description", "")))
                                             for a in msg["params"].get("args", [])))
            elif m == "Runtime.exceptionThrown":
                self.console.append("exception: " + json.dumps(msg["params"]["exceptionDetails"])[:500])

    def eval(self, expr):
        """Evaluates expr in the page (promises awaited) and returns its JSON value."""
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise CDPError("page exception in %r: %s" % (expr[:80], r["exceptionDetails"].get("text")))
        return r.get("result", {}).get("value")

    def navigate(self, url):
        self.call("Page.navigate", url=url)

    def screenshot(self, clip=None):
        """PNG bytes of the page, or of clip {x, y, width, height} (CSS pixels)."""
        params = {"format": "png"}
        if clip:
            params["clip"] = dict(clip, scale=1)
        return base64.b64decode(self.call("Page.captureScreenshot", **params)["data"])

    def resize(self, width, height):
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)


    def wait(self, expr, timeout=15, what=None):
        """Polls expr until it is truthy; returns its value."""
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.eval(expr)
            except CDPError as e:
                last = str(e)
            if last:
                return last
            time.sleep(0.1)
        raise CDPError("timed out waiting for %s (last value %r; console %s)"
                       % (what or expr, last, self.console[-5:]))

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def png_pixels(data):
    """Decodes an 8-bit RGB or RGBA PNG (what Chromium writes) with the standard library:
    returns (width, height, rows) where rows[y][x] is an (r, g, b) tuple."""
    import zlib
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and not interlace, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return w, h, rows

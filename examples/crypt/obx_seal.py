"""obx_seal.py — obx's sealed payload format in Python, written from docs/security.md
("Payload encryption"), independently of the C code (src/core/crypt.c): a consumer in another
language opens a sealed body with it before it hands the payload to the SQL inbox
(obx.inbox_receive), and tests/data/seal_vectors.json is made with it.

    body  = nonce (12 bytes) || AES-256-GCM ciphertext || tag (16 bytes)
    AAD   = b"obx-aes256gcm-v1\\0" + key_id + b"\\0" + event_id + b"\\0" + envelope_gen (u32 BE)
    nonce = HMAC-SHA256(key, b"obx-nonce-v1\\0" + AAD + payload_digest)[:12]

payload_digest is the frozen payload digest as obx writes it: "sha256:" + 64 lowercase hex digits
(the obx-payload-digest header).

open_body() refuses a body whose tag does not verify, or whose nonce is not the one derived from
the plaintext (only the exact body obx seals is accepted).
"""
import hashlib
import hmac
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def aad(key_id, event_id, gen):
    return (b"obx-aes256gcm-v1\0" + key_id.encode() + b"\0" + event_id.encode() + b"\0" +
            struct.pack(">I", gen))


def digest(payload):
    return "sha256:" + hashlib.sha256(payload).hexdigest()


def nonce(key, a, payload_digest):
    return hmac.new(key, b"obx-nonce-v1\0" + a + payload_digest.encode(),
                    hashlib.sha256).digest()[:12]


def seal(key, key_id, event_id, gen, payload):
    a = aad(key_id, event_id, gen)
    n = nonce(key, a, digest(payload))
    return n + AESGCM(key).encrypt(n, payload, a)


def open_body(key, key_id, event_id, gen, body):
    """The clear payload, or ValueError (cryptography's InvalidTag is a subclass of Exception)."""
    if len(body) < 28:
        raise ValueError("shorter than a nonce and a tag")
    a = aad(key_id, event_id, gen)
    plain = AESGCM(key).decrypt(body[:12], body[12:], a)
    if not hmac.compare_digest(nonce(key, a, digest(plain)), body[:12]):
        raise ValueError("the nonce is not the one derived from the plaintext")
    return plain


def parse_ring(text):
    """{key_id: 32 bytes} from "KEY_ID=HEX64" lines (',' and ';' separate too, '#' comments)."""
    ring = {}
    for part in text.replace(",", "\n").replace(";", "\n").splitlines():
        part = part.strip()
        if not part or part.startswith("#"):
            continue
        kid, _, hexkey = part.replace(":", "=", 1).partition("=")
        ring[kid.strip()] = bytes.fromhex(hexkey.strip())
    return ring


if __name__ == "__main__":
    import json
    key = bytes(range(32))
    cases = []
    for kid, eid, gen, payload in [
        ("k1", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1W", 1, b'{"order":"o-1","total":100}'),
        ("k2", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1W", 2, b'{"order":"o-1","total":100}'),
        ("rotated-2026.12", "evt-01JD6X3M8Z4N5P6Q7R8S9T0V1X", 7, b"x"),
    ]:
        body = seal(key, kid, eid, gen, payload)
        assert open_body(key, kid, eid, gen, body) == payload
        cases.append({"key_hex": key.hex(), "key_id": kid, "event_id": eid, "envelope_gen": gen,
                      "payload": payload.decode(), "body_hex": body.hex()})
    print(json.dumps({"seal": cases}, indent=2))

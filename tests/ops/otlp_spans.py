"""otlp_spans.py — what test_otel.sh's checks read of the spans otlp_receiver.py wrote, once.

load(path)  every span of every request in the receiver's JSON-lines file
attrs(span) the span's attributes, name -> stringValue (or intValue)
"""
import json


def load(path):
    return [s for line in open(path) for rs in json.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]


def attrs(s):
    return {a["key"]: a["value"].get("stringValue", a["value"].get("intValue")) for a in s["attributes"]}

"""Feeds the ingest service's Kafka source (refinery-ingest --source-topic):
submits a run with Control.Submit, then writes the raw lines of the given
files to the topic, LINES lines per message, keyed by the run id, and ends
with the run's end marker (an empty value). Prints {"run_id", "lines",
"messages"} as JSON.

With --bad it writes, instead of a run's lines, one message of each kind the
source must refuse without stopping: no key, a key that is not UTF-8, a run
that does not exist, a value that claims to be gzip but is not, and lines that
are not JSON, lack the text field, hold invalid UTF-8 or a NUL escape; then
the end marker.

Usage: kafka_source_feed.py --proto DIR --server HOST:PORT --kafka BOOTSTRAP
                            --spec SPEC.yaml --run-id ID [--topic docs.raw]
                            [--lines N] [--bad] [FILE.json[.gz]...]
"""
import argparse
import gzip
import json
import sys

import grpc
from confluent_kafka import Producer

from rfproto import load


def submit(pb, pbg, server, spec, run_id):
    with grpc.insecure_channel(server) as ch:
        st = pbg.ControlStub(ch).Submit(pb.SubmitRequest(spec_yaml=open(spec).read(),
                                                         run_id=run_id), timeout=30)
        assert st.run_id == run_id, st


def raw_lines(paths):
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            yield from f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--topic", default="docs.raw")
    ap.add_argument("--lines", type=int, default=20)
    ap.add_argument("--bad", action="store_true")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    pb, pbg = load(a.proto)[:2]
    submit(pb, pbg, a.server, a.spec, a.run_id)
    p = Producer({"bootstrap.servers": a.kafka, "enable.idempotence": True})
    key = a.run_id.encode()
    lines = messages = 0
    if a.bad:
        p.produce(a.topic, value=b'{"text": "no key, no run"}\n')
        p.produce(a.topic, key=b"\xff\xfe", value=b'{"text": "a key that is not UTF-8"}\n')
        p.produce(a.topic, key=b"no-such-run", value=b'{"text": "an unknown run"}\n')
        p.produce(a.topic, key=key, value=b"\x1f\x8b\x08\x00 not really gzip")
        body = (b'{"reviewText": "not json\n'
                b'{"title": "no text field"}\n'
                b'{"overall": 5.0, "reviewText": "bad \xff\xfe bytes in an otherwise fine review text"}\n'
                b'{"overall": 4.0, "reviewText": "a NUL \\u0000 inside an otherwise fine review text"}\n'
                b'{"overall": 5.0, "reviewText": "A fine review of a fine product, it works well."}\n')
        p.produce(a.topic, key=key, value=body)
        lines, messages = 1 + body.count(b"\n"), 5
    else:
        batch = []
        for line in raw_lines(a.files):
            batch.append(line)
            if len(batch) == a.lines:
                p.produce(a.topic, key=key, value=b"".join(batch))
                lines, messages, batch = lines + len(batch), messages + 1, []
        if batch:
            p.produce(a.topic, key=key, value=b"".join(batch))
            lines, messages = lines + len(batch), messages + 1
    p.produce(a.topic, key=key, value=b"")  # end of the run's input
    if p.flush(60) != 0:
        sys.exit("kafka_source_feed: messages not delivered")
    print(json.dumps({"run_id": a.run_id, "lines": lines, "messages": messages}))


if __name__ == "__main__":
    main()

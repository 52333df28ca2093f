"""Bad input for the Kafka side of the services: writes, to every topic a
service consumes (docs.clean, docs.unique, tokens.train, tokens.eval,
checkpoints), messages that are not what the topic carries:
  - bytes that are no protobuf at all;
  - a batch of RUN whose run id and seq read fine but whose rest is cut short;
  - on the document topics, a batch of RUN whose document text is not UTF-8;
  - an announcement of a checkpoint of a run that does not exist;
  - with --unknown-run, also well-formed batches of a run that does not exist.
Prints the number of messages written per topic as JSON.

Usage: kafka_poison.py --proto DIR --kafka BOOTSTRAP --run RUN [--unknown-run]
"""
import argparse
import json
import sys

from confluent_kafka import Producer

from rfproto import load

UNKNOWN_RUN = "bad-no-such-run"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", required=True)
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--unknown-run", action="store_true")
    a = ap.parse_args()
    pb = load(a.proto)[0]
    p = Producer({"bootstrap.servers": a.kafka, "enable.idempotence": True})
    written = {}
    failed = []

    def send(topic, key, value):
        p.produce(topic, key=key.encode(), value=value,
                  on_delivery=lambda err, msg: err and failed.append((topic, err)))
        written[topic] = written.get(topic, 0) + 1

    # Field 1 = run id, 2 = seq in DocumentBatch and TokenBatch alike; then a
    # field 3 whose length runs past the end.
    run = a.run.encode()
    cut = field(1, run) + b"\x10\x07" + b"\x1a\x7f\x0a\x01x"
    not_utf8 = field(1, b"poison-1") + field(2, b"caf\xc3 \xff text") + b"\x18\x01"
    doc = pb.Document(id="u1", text="a document of a run nobody submitted", label=1)
    seq = pb.TokenSequence(doc_id="u1", ids=[101, 7, 102], label=1)
    for topic in ("docs.clean", "docs.unique", "tokens.train", "tokens.eval"):
        send(topic, a.run, b"\xff\xfe not protobuf \x00\x01")
        send(topic, a.run, cut)
        if topic.startswith("docs."):
            send(topic, a.run, field(1, run) + b"\x10\x02" + field(3, not_utf8))
        if a.unknown_run and topic.startswith("docs."):
            send(topic, UNKNOWN_RUN, pb.DocumentBatch(run_id=UNKNOWN_RUN, seq=1,
                                                      docs=[doc]).SerializeToString())
        elif a.unknown_run:
            send(topic, UNKNOWN_RUN, pb.TokenBatch(run_id=UNKNOWN_RUN, seq=1,
                                                   eval=topic == "tokens.eval",
                                                   seqs=[seq]).SerializeToString())
    send("checkpoints", a.run, b"\xff\xfe not protobuf \x00\x01")
    send("checkpoints", UNKNOWN_RUN, pb.CheckpointAnnounce(
        run_id=UNKNOWN_RUN, step=3, path="/nonexistent/step-3", final=True).SerializeToString())
    if p.flush(60) != 0 or failed:
        sys.exit(f"kafka_poison: not delivered: {failed or 'flush timed out'}")
    print(json.dumps(written, sort_keys=True))


if __name__ == "__main__":
    main()

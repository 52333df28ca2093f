"""Writes a JSON Lines file to a Kafka topic for refinery-ingest's Kafka
source (--source-topic): LINES lines per message, keyed by the run id, lz4
compressed, then the run's end marker (an empty value). Prints the number of
messages.

Usage: kafka_feed.py BOOTSTRAP TOPIC RUN FILE [LINES]
"""
import sys

from confluent_kafka import Producer


def main():
    bootstrap, topic, run, path = sys.argv[1:5]
    lines = int(sys.argv[5]) if len(sys.argv) > 5 else 256
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "compression.type": "lz4", "linger.ms": 5})
    key, batch, n = run.encode(), [], 0
    with open(path, "rb") as f:
        for line in f:
            batch.append(line)
            if len(batch) == lines:
                p.produce(topic, key=key, value=b"".join(batch))
                batch, n = [], n + 1
                p.poll(0)
    if batch:
        p.produce(topic, key=key, value=b"".join(batch))
        n += 1
    p.produce(topic, key=key, value=b"")
    if p.flush(120) != 0:
        sys.exit("kafka_feed: messages not delivered")
    print(n)


if __name__ == "__main__":
    main()

"""Checks one finished run against what the services left in Kafka and in
PostgreSQL; prints a one-line JSON summary, exits 1 naming the first broken
rule.

Usage: e2e_check.py --proto DIR --kafka BOOTSTRAP --pg CONNINFO --run RUN
                    --pushed N --steps S

Kafka (every batch taken once per (topic, run, seq); a batch delivered again
after a crash must be identical to the first copy):
  docs.clean ids = docs.unique ids + docs.duplicates ids, each exactly once;
  tokens.train ids + tokens.eval ids, each exactly once, are docs.unique's
  but the tokenizer's rejects;
  docs.rejected holds the run's rejects (by run id, one per source and line); `checkpoints` announces the run's
  checkpoints, the last one final.
PostgreSQL stage_progress, per stage, equals those topic counts:
  ingest in = pushed = clean + rejected; dedup in = clean, out = unique,
  duplicate = duplicates; tokenizer in = unique, out = train + eval
  sequences; trainer in = train sequences over every train batch (empty
  ones too); evaluator in = eval sequences over every eval batch.
The run succeeded; its checkpoints reach step S; training metrics and the
evaluator's accuracy / macro_f1 for the final checkpoint are recorded.
"""
import argparse
import json
import subprocess
import sys
from collections import Counter

from google.protobuf.message import DecodeError
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from rfproto import load

DOC_TOPICS = ("docs.clean", "docs.unique", "docs.duplicates")
TOKEN_TOPICS = ("tokens.train", "tokens.eval")


def fail(msg):
    print(f"e2e_check: {msg}", file=sys.stderr)
    sys.exit(1)


def read_topic(bootstrap, topic):
    """Every message of topic from the beginning: [(key, value)]."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-check",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=30)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return []
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in t.partitions]
        c.assign(parts)
        left, out = {p.partition for p in parts}, []
        while left:
            m = c.poll(30)
            if m is None:
                fail(f"{topic}: no message nor end of partition within 30 s")
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
                    continue
                fail(f"{topic}: {m.error()}")
            out.append((m.key(), m.value()))
        return out
    finally:
        c.close()


def batches(pb, bootstrap, topic, run, cls):
    """The run's batches of topic by seq (one copy each) and the number of
    repeated deliveries; repeats must equal the first copy."""
    got, repeats = {}, 0
    for key, value in read_topic(bootstrap, topic):
        try:
            b = cls.FromString(value)
        except DecodeError:  # another test's garbage: the consumers skip it too
            continue
        if b.run_id != run:
            continue
        if key is not None and key.decode() != run:
            fail(f"{topic}: batch {b.seq} of {run} keyed {key!r}")
        if b.seq in got:
            repeats += 1
            if got[b.seq] != value:
                fail(f"{topic}: batch ({run}, {b.seq}) delivered twice with different content")
            continue
        got[b.seq] = value
    return {seq: cls.FromString(v) for seq, v in got.items()}, repeats


def once(ids, what):
    dup = [i for i, n in Counter(ids).items() if n > 1]
    if dup:
        fail(f"{what}: {len(dup)} document ids more than once, e.g. {dup[:3]}")
    return set(ids)


def psql(pg, sql):
    r = subprocess.run(["psql", pg, "-Atc", sql], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"psql: {r.stderr.strip()}")
    return [line.split("|") for line in r.stdout.splitlines()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", required=True)
    ap.add_argument("--kafka", required=True)
    ap.add_argument("--pg", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--pushed", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    a = ap.parse_args()
    pb = load(a.proto)[0]
    run = a.run.replace("'", "''")

    docs, repeats = {}, {}
    for t in DOC_TOPICS:
        bs, repeats[t] = batches(pb, a.kafka, t, a.run, pb.DocumentBatch)
        docs[t] = bs
    toks = {}
    for t in TOKEN_TOPICS:
        bs, repeats[t] = batches(pb, a.kafka, t, a.run, pb.TokenBatch)
        toks[t] = bs
        if any(b.eval != (t == "tokens.eval") for b in bs.values()):
            fail(f"{t}: a batch with eval = {t != 'tokens.eval'}")
    ids = {t: [d.id for b in docs[t].values() for d in b.docs] for t in DOC_TOPICS}
    ids.update({t: [s.doc_id for b in toks[t].values() for s in b.seqs] for t in TOKEN_TOPICS})
    clean, unique, dups = (once(ids[t], t) for t in DOC_TOPICS)
    train, evals = (once(ids[t], t) for t in TOKEN_TOPICS)
    if unique & dups or unique | dups != clean:
        fail(f"docs.unique ({len(unique)}) + docs.duplicates ({len(dups)}) "
             f"!= docs.clean ({len(clean)}) as id sets")
    if train & evals or not (train | evals) <= unique:
        fail(f"tokens.train ({len(train)}) + tokens.eval ({len(evals)}) "
             f"not a partition of a subset of docs.unique ({len(unique)})")
    # The tokenizer keeps every input batch's seq in both splits.
    for t in TOKEN_TOPICS:
        if set(toks[t]) != set(docs["docs.unique"]):
            fail(f"{t}: batch seqs differ from docs.unique's")
    # The run's rejects carry its id, one per (source, line).
    kept_at = {(d.source, d.line) for b in docs["docs.clean"].values() for d in b.docs}
    rejected_at = set()
    for _, v in read_topic(a.kafka, "docs.rejected"):
        try:
            r = pb.Reject.FromString(v)
        except DecodeError:
            continue
        if r.run_id == a.run:
            rejected_at.add((r.source, r.line))
    if rejected_at & kept_at:
        fail(f"docs.rejected: {len(rejected_at & kept_at)} documents both kept and rejected")

    progress = {row[0]: [int(x) for x in row[1:]] for row in psql(a.pg, f"""
        SELECT stage, count(*), sum(docs_in), sum(docs_out), sum(rejected), sum(duplicate)
        FROM stage_progress WHERE run_id = '{run}' GROUP BY stage""")}

    def expect(stage, field, want):
        col = {"batches": 0, "in": 1, "out": 2, "rejected": 3, "duplicate": 4}[field]
        got = progress.get(stage, [0] * 5)[col]
        if got != want:
            fail(f"stage_progress {stage}.{field} = {got}, expected {want}")

    nonempty = {t: [b for b in toks[t].values() if b.seqs] for t in TOKEN_TOPICS}
    expect("ingest", "in", a.pushed)
    expect("ingest", "out", len(clean))
    expect("ingest", "rejected", a.pushed - len(clean))
    if len(rejected_at) != a.pushed - len(clean):
        fail(f"docs.rejected has {len(rejected_at)} rejects of run {run}, expected "
             f"{a.pushed - len(clean)}")
    expect("dedup", "batches", len(docs["docs.clean"]))
    expect("dedup", "in", len(clean))
    expect("dedup", "out", len(unique))
    expect("dedup", "duplicate", len(dups))
    expect("tokenizer", "batches", len(docs["docs.unique"]))
    expect("tokenizer", "in", len(unique))
    expect("tokenizer", "out", len(train) + len(evals))
    expect("tokenizer", "rejected", len(unique) - len(train) - len(evals))
    expect("trainer", "batches", len(toks["tokens.train"]))
    expect("trainer", "in", len(train))
    expect("evaluator", "batches", len(toks["tokens.eval"]))
    expect("evaluator", "in", len(evals))

    state = psql(a.pg, f"SELECT state, coalesce(error, '') FROM runs WHERE id = '{run}'")
    if not state or state[0][0] != "succeeded":
        fail(f"run {a.run} is {state}")
    steps = [int(r[0]) for r in psql(a.pg, f"SELECT step FROM checkpoints "
                                           f"WHERE run_id = '{run}' ORDER BY step")]
    if not steps or steps[-1] != a.steps:
        fail(f"checkpoints of {a.run}: steps {steps}, expected the last at {a.steps}")
    metrics = int(psql(a.pg, f"SELECT count(*) FROM training_metrics "
                             f"WHERE run_id = '{run}'")[0][0])
    if metrics == 0:
        fail("no training_metrics rows")
    ev = {r[0]: float(r[1]) for r in psql(a.pg, f"""SELECT metric, value FROM eval_results
        WHERE run_id = '{run}' AND checkpoint_step = {steps[-1]}""")}
    for m in ("accuracy", "macro_f1"):
        if m not in ev or not 0 <= ev[m] <= 1:
            fail(f"eval_results of the final checkpoint: {m} missing or out of range: {ev}")
    announced = []
    for k, v in read_topic(a.kafka, "checkpoints"):
        try:
            c = pb.CheckpointAnnounce.FromString(v)
        except DecodeError:
            continue
        if c.run_id == a.run:
            announced.append(c)
    if not announced or not any(c.final and c.step == a.steps for c in announced):
        fail(f"checkpoints topic: no final announcement at step {a.steps}: "
             f"{[(c.step, c.final) for c in announced]}")

    print(json.dumps({"run": a.run, "pushed": a.pushed, "clean": len(clean),
                      "rejected": a.pushed - len(clean), "unique": len(unique),
                      "duplicates": len(dups), "train": len(train), "eval": len(evals),
                      "train_batches": len(nonempty["tokens.train"]),
                      "checkpoints": steps, "training_metrics": metrics,
                      "accuracy": ev["accuracy"], "macro_f1": ev["macro_f1"],
                      "redelivered": repeats}, sort_keys=True))


if __name__ == "__main__":
    main()

"""Writes a deterministic document set with planted exact and near duplicates,
in the same order, as DIR/docs.tsv (id<TAB>text, for the Kafka producer) and
DIR/docs.jsonl (for `refinery dedup`).  usage: dedup_docs.py DIR N_ORIGINALS"""
import json
import random
import sys

out, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(6)
vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(3000)]
docs, originals = [], []
for i in range(n):
    words = [rng.choice(vocab) for _ in range(40)]
    originals.append(words)
    docs.append(("o%d" % i, " ".join(words)))
    r = rng.random()
    if r < 0.2 and originals:  # exact copy of an earlier document
        docs.append(("x%d" % i, " ".join(rng.choice(originals))))
    elif r < 0.35:  # near copy: one word replaced
        w = list(rng.choice(originals))
        w[rng.randrange(len(w))] = "changed"
        docs.append(("n%d" % i, " ".join(w)))
with open(out + "/docs.tsv", "w") as t, open(out + "/docs.jsonl", "w") as j:
    for id_, text in docs:
        t.write("%s\t%s\n" % (id_, text))
        j.write(json.dumps({"id": id_, "text": text}) + "\n")
print(len(docs))

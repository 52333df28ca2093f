#!/usr/bin/env python3
"""Writes real corpora from $SHARED as ingest-format JSON Lines (id, text,
label, source, line, offset) for the dedup tests and benchmarks, using only the
standard library: Amazon 5-core reviews (.json.gz), SST-2 (.tsv with a header)
and WikiText raw files (.raw: one document per non-heading paragraph line)."""
import gzip, json, os, sys


def amazon(path):
    name = os.path.basename(path).split(".")[0]
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            r = json.loads(line)
            yield {"id": f"{name}:{i}", "text": r.get("reviewText", ""),
                   "label": 1 if r["overall"] >= 3 else 0, "source": name, "line": i, "offset": 0}


def sst2(path):
    name = "sst2-" + os.path.basename(path).split(".")[0]
    with open(path, encoding="utf-8") as f:
        next(f)
        for i, line in enumerate(f, 2):
            sentence, label = line.rstrip("\n").rsplit("\t", 1)
            yield {"id": f"{name}:{i}", "text": sentence, "label": int(label), "source": name,
                   "line": i, "offset": 0}


def wikitext(path):
    name = "wikitext-" + os.path.basename(path).split(".")[1]
    offset = 0
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            line = raw.decode("utf-8").strip()
            if line and not line.startswith("= "):
                yield {"id": f"{name}:{i}", "text": line, "source": name, "line": i, "offset": offset}
            offset += len(raw)


def main():
    out = sys.stdout
    for path in sys.argv[1:]:
        if not os.path.exists(path):
            sys.exit(f"make_input.py: {path} is missing (is $SHARED set to the shared data folder?)")
        if path.endswith(".json.gz"):
            gen = amazon(path)
        elif path.endswith(".raw"):
            gen = wikitext(path)
        else:
            gen = sst2(path)
        for doc in gen:
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

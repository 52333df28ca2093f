#!/usr/bin/env python3
"""Python baseline of the seed ingest pipeline, for scripts/bench/bench_ingest.sh.

Per record, as the seed scripts did: lowercase, regex clean (URLs, HTML tags,
characters outside letters/digits/basic punctuation), whitespace collapse, a
length filter (3 to 5000 words), JSON Lines out. Records are read the way
`refinery ingest --preset P` reads them, so both sides see the same records:

  amazon    JSON Lines (summary + "\\n" + reviewText, overall 1-2 -> 0, 3-5 -> 1)
            or the header-less CSV (same fields by position)
  sst2      TSV with a header, no quoting
  wikitext  a document per non-blank line, " = Heading = " lines dropped

Standard library only, single process. Prints one JSON summary line on stdout.
"""
import argparse
import csv
import json
import os
import re
import resource
import sys
import time

URL = re.compile(r"https?://\S+|www\.\S+")
TAG = re.compile(r"<[^>]+>")
NON_TEXT = re.compile(r"[^\w\s.,!?;:'\"()-]")
SPACE = re.compile(r"\s+")
HEADING = re.compile(r"^ *= .* = *$")
MIN_WORDS, MAX_WORDS = 3, 5000


def clean(text):
    text = text.lower()
    text = URL.sub(" ", text)
    text = TAG.sub(" ", text)
    text = NON_TEXT.sub(" ", text)
    return SPACE.sub(" ", text).strip()


def star_label(value):
    v = float(value)
    return 0 if 1 <= v <= 2 else 1 if 3 <= v <= 5 else None


def amazon_json(f):
    for line in f:
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            parts = [r[k] for k in ("summary", "reviewText") if isinstance(r.get(k), str)]
            yield "\n".join(parts), star_label(r["overall"])
        except (ValueError, KeyError, TypeError):
            yield None, None


def amazon_csv(f):
    for row in csv.reader(f):
        try:
            parts = [p for p in (row[6], row[4]) if p]
            yield "\n".join(parts), star_label(row[5])
        except (ValueError, IndexError):
            yield None, None


def sst2(f):
    next(f, None)  # header
    for line in f:
        fields = line.rstrip("\r\n").split("\t")
        yield (fields[0], int(fields[1])) if len(fields) == 2 and fields[1].isdigit() else (None, None)


def wikitext(f):
    for line in f:
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        yield (None, None) if HEADING.match(line) else (line, None)


def reader(preset, path):
    if preset == "amazon":
        return amazon_csv if path.endswith(".csv") else amazon_json
    return {"sst2": sst2, "wikitext": wikitext}[preset]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True, choices=["amazon", "sst2", "wikitext"])
    ap.add_argument("--out", required=True)
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args()
    csv.field_size_limit(1 << 30)
    t0 = time.perf_counter()
    records = kept = nbytes = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for path in args.inputs:
            with open(path, encoding="utf-8", errors="replace", newline="") as f:
                for n, (text, label) in enumerate(reader(args.preset, path)(f), 1):
                    records += 1
                    if text is None:
                        continue
                    text = clean(text)
                    if not MIN_WORDS <= len(text.split()) <= MAX_WORDS:
                        continue
                    doc = {"id": f"{path}:{n}", "text": text}
                    if label is not None:
                        doc["label"] = label
                    out.write(json.dumps(doc) + "\n")
                    kept += 1
            nbytes += os.path.getsize(path)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"records": records, "kept": kept, "bytes": nbytes, "seconds": seconds,
                      "peak_rss_kb": rss}))


if __name__ == "__main__":
    sys.exit(main())

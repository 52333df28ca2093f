#!/usr/bin/env python3
"""HF `tokenizers` baseline for bench_tokenizer.sh: encodes every line of a
corpus file with Tokenizer.encode_batch and prints one JSON object with the
wall and CPU time of encode_batch alone (loading and reading are not
counted), the bytes and tokens. Threads come from RAYON_NUM_THREADS (set by the caller).

A line is defined as in `refinery tokenize`: the bytes before each '\\n'.
Padding is switched off (the MiniLM tokenizer.json pads batches to their
longest member, which encode() never does); truncation stays as configured."""
import json
import sys
import time

from tokenizers import Tokenizer
from tokenizers.models import BPE
from tokenizers import decoders, pre_tokenizers, processors


def load(path):
    if path.endswith("vocab.json"):
        vocab, merges = BPE.read_file(path, path[: -len("vocab.json")] + "merges.txt")
        tok = Tokenizer(BPE(vocab, merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.add_special_tokens(["<|endoftext|>"])
        return tok
    return Tokenizer.from_file(path)


def main():
    tok_path, corpus, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tok = load(tok_path)
    tok.no_padding()
    data = open(corpus, "rb").read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    texts = [l.decode("utf-8", "replace") for l in lines]
    best = cpu = None
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        encs = tok.encode_batch(texts)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if best is None or dt < best:
            best, cpu = dt, dc
    tokens = sum(len(e.ids) for e in encs)
    print(json.dumps({"seconds": best, "cpu_seconds": cpu, "bytes": len(data), "lines": len(texts),
                      "tokens": tokens}))


if __name__ == "__main__":
    main()

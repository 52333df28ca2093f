#!/usr/bin/env python3
"""datasketch baseline for scripts/bench/bench_dedup.sh: MinHash signatures of
the same documents with the same shingling (word n-grams of the lowercased,
whitespace-split text) and num_perm = bands * rows, on one core.
  text_to_sig: split + shingle + MinHash.update_batch (sha1 per shingle + permutations)
  sign_only:   MinHash.update_batch on shingles built beforehand
  lsh:         MinHashLSH(b, r) insert + query of every signature
If datatrove imports, its MinhashDedupSignature.get_shingles + get_signature
(spaCy word tokenizer, xxhash64, (a*x+b) mod 2^61-1) is timed as well on the
same texts (documents without shingles are skipped there, as datatrove fails
on them). Permutations are generated once and shared, datasketch's fastest usage.
Times are CPU seconds of this process (the machine may be shared); wall
seconds are printed beside them. Prints one JSON object."""
import argparse, json, time

import numpy as np
from datasketch import MinHash, MinHashLSH


def shingles(text, n):
    words = text.lower().split()
    if len(words) < n:
        return [" ".join(words).encode()] if words else []
    return [" ".join(words[i:i + n]).encode() for i in range(len(words) - n + 1)]


class Timer:
    def __enter__(self):
        self.cpu, self.wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.cpu = time.process_time() - self.cpu
        self.wall = time.perf_counter() - self.wall


def rates(t, n, nbytes=None):
    r = {"cpu_seconds": round(t.cpu, 4), "wall_seconds": round(t.wall, 4), "docs_per_s": n / t.cpu}
    if nbytes is not None:
        r["mb_per_s"] = nbytes / 1e6 / t.cpu
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--bands", type=int, default=20)
    ap.add_argument("--rows", type=int, default=5)
    args = ap.parse_args()
    texts = [json.loads(l)["text"] for l in open(args.input, encoding="utf-8") if l.strip()]
    nbytes = sum(len(t.encode()) for t in texts)
    num_perm = args.bands * args.rows
    perms = MinHash(num_perm=num_perm, seed=1, scheme="affine32").permutations

    sigs = []
    with Timer() as t_sig:
        for t in texts:
            m = MinHash(num_perm=num_perm, permutations=perms, scheme="affine32")
            m.update_batch(shingles(t, args.ngram))
            sigs.append(m)

    sh = [shingles(t, args.ngram) for t in texts]
    with Timer() as t_sign:
        for s in sh:
            m = MinHash(num_perm=num_perm, permutations=perms, scheme="affine32")
            m.update_batch(s)

    lsh = MinHashLSH(num_perm=num_perm, params=(args.bands, args.rows))
    with Timer() as t_lsh:
        for i, m in enumerate(sigs):
            lsh.query(m)
            lsh.insert(str(i), m)

    n = len(texts)
    out = {"impl": "datasketch", "docs": n, "bytes": nbytes,
           "shingles": int(sum(len(s) for s in sh)),
           "text_to_sig": rates(t_sig, n, nbytes), "sign_only": rates(t_sign, n),
           "lsh_query_insert": rates(t_lsh, n)}
    out["datatrove"] = datatrove_rates(texts, nbytes, args)
    print(json.dumps(out))


def datatrove_rates(texts, nbytes, args):
    try:
        import tempfile
        from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
    except Exception as e:  # not installed: report why instead of a number
        return {"error": f"datatrove unavailable: {e}"}
    cfg = MinhashConfig(n_grams=args.ngram, num_buckets=args.bands, hashes_per_bucket=args.rows)
    step = MinhashDedupSignature(output_folder=tempfile.mkdtemp(), config=cfg)
    skipped = 0
    with Timer() as t:
        for text in texts:
            sh = step.get_shingles(text)
            if len(sh):
                step.get_signature(sh)
            else:
                skipped += 1
    r = rates(t, len(texts), nbytes)
    r["skipped_empty"] = skipped
    return r


if __name__ == "__main__":
    main()

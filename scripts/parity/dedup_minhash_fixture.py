#!/usr/bin/env python3
"""Generates tests/fixtures/dedup/minhash_pairs.json: pairs of token documents
with controlled overlap, their exact word-5-gram Jaccard (Python sets) and
datasketch's MinHash estimate with 100 permutations (datasketch 2.x, affine32).
tests/dedup/test_parity.c checks that refinery's shingling gives the same exact
Jaccard and that its MinHash estimates are as accurate as datasketch's.
Documents are synthetic tokens ("t042 t317 ..."): nothing from ../shared is
committed. Run: $(scripts/pyenv.sh parity)/bin/python scripts/parity/dedup_minhash_fixture.py"""
import json, os, random

from datasketch import MinHash

N_PAIRS, WORDS, VOCAB, NGRAM, PERM = 240, 60, 400, 5, 100


def shingles(text):
    w = text.split(" ")
    return {" ".join(w[i:i + NGRAM]) for i in range(len(w) - NGRAM + 1)}


def main():
    rng = random.Random(20261122)
    perms = MinHash(num_perm=PERM, seed=1, scheme="affine32").permutations
    pairs = []
    for i in range(N_PAIRS):
        a = [f"t{rng.randrange(VOCAB):03d}" for _ in range(WORDS)]
        b = list(a)
        for _ in range(rng.randrange(0, 25)):  # substitutions spread the Jaccard over [0, 1]
            b[rng.randrange(WORDS)] = f"t{rng.randrange(VOCAB):03d}"
        ta, tb = " ".join(a), " ".join(b)
        sa, sb = shingles(ta), shingles(tb)
        ma = MinHash(num_perm=PERM, permutations=perms, scheme="affine32")
        mb = MinHash(num_perm=PERM, permutations=perms, scheme="affine32")
        ma.update_batch([s.encode() for s in sa])
        mb.update_batch([s.encode() for s in sb])
        pairs.append({"a": ta, "b": tb, "jaccard": len(sa & sb) / len(sa | sb),
                      "datasketch": ma.jaccard(mb)})
    out = os.path.join(os.path.dirname(__file__), "../../tests/fixtures/dedup/minhash_pairs.json")
    with open(out, "w") as f:
        json.dump({"ngram": NGRAM, "num_perm": PERM, "pairs": pairs}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()

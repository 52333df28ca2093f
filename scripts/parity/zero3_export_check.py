#!/usr/bin/env python3
"""By-hand check (issue 13, "Done when"): a model trained by a group with
`trainer.parallel: {dp: 2, zero: 3}` exports a folder that transformers loads,
with the same logits as C and as the one-process run.

    P=/work/main/.venv-parity/bin/python   # or $(scripts/pyenv.sh parity)/bin/python
    $P scripts/parity/zero3_export_check.py [--model build/models/minilm-l6] [--np 2] [--zero 3]

Trains the same few steps twice with build/refinery (1 process, and
scripts/mpirun.sh -np N with parallel {dp: N, zero: Z}), then for each export:
loads it with AutoModelForSequenceClassification / AutoTokenizer (any missing
or unexpected weight fails), computes transformers' logits on the training
sentences, and compares their softmax with `refinery eval --predictions` on the
same folder. Prints the largest differences; exits 1 beyond 1e-4."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(tmp, name, model, dp, zero, data):
    spec = os.path.join(tmp, name + ".yaml")
    out = os.path.join(tmp, name)
    with open(spec, "w") as f:
        f.write("trainer:\n  model: %s\n  train: %s\n  output: %s\n  max_steps: 4\n"
                "  batch_size: 8\n  grad_accum: 2\n  lr: 0.0001\n  warmup_ratio: 0.25\n"
                "  dropout: false\n  log_every: 1\n  threads: 1\n  max_len: 32\n"
                "  parallel: {dp: %d, zero: %d}\n" % (model, data, out, dp, zero))
    cmd = [os.path.join(ROOT, "build", "refinery"), "train", spec]
    if dp > 1:
        cmd = [os.path.join(ROOT, "scripts", "mpirun.sh"), "-np", str(dp)] + cmd
    subprocess.run(cmd, check=True, stderr=open(out + ".log", "w"))
    return os.path.join(out, "model")


def hf_probs(folder, texts):
    tok = AutoTokenizer.from_pretrained(folder)
    m, info = AutoModelForSequenceClassification.from_pretrained(folder, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}  # missing, unexpected, mismatched keys, errors
    if bad:
        sys.exit("%s: loading info %s" % (folder, bad))
    m.eval()
    with torch.no_grad():
        enc = tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
        logits = m(**enc).logits
    return logits, torch.softmax(logits, -1)


def c_probs(folder, data, tmp, name):
    pred = os.path.join(tmp, name + ".preds.jsonl")
    subprocess.run([os.path.join(ROOT, "build", "refinery"), "eval", "--model", folder, "--data",
                    data, "--max-len", "32", "--predictions", pred, "--threads", "1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = sorted((json.loads(l) for l in open(pred)), key=lambda r: r["index"])
    return torch.tensor([r["probs"] for r in rows], dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "minilm-l6"))
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--zero", type=int, default=3)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    random.seed(5)
    pos, neg = ["good", "great", "fun", "brilliant"], ["bad", "awful", "boring", "dull"]
    filler = "the a movie film plot actor story scene music ending is was very really".split()
    texts, data = [], os.path.join(tmp, "data.jsonl")
    with open(data, "w") as f:
        for i in range(64):
            y = i % 2
            words = random.sample(filler, random.randint(2, 9)) + [random.choice(pos if y else neg)]
            random.shuffle(words)
            texts.append(" ".join(words))
            f.write(json.dumps({"id": "m%d" % i, "text": texts[-1], "label": y}) + "\n")
    one = train(tmp, "one", a.model, 1, 0, data)
    grp = train(tmp, "dp%dz%d" % (a.np, a.zero), a.model, a.np, a.zero, data)
    l1, p1 = hf_probs(one, texts)
    lg, pg = hf_probs(grp, texts)
    cg = c_probs(grp, data, tmp, "grp")
    d_hf = (lg - l1).abs().max().item()
    d_c = (pg - cg).abs().max().item()
    print("export of dp%d/zero%d loads in transformers (no missing/unexpected weights)" % (a.np, a.zero))
    print("transformers logits, dp%d/zero%d export vs 1-process export: max |diff| %.3g "
          "(logits up to %.3g)" % (a.np, a.zero, d_hf, l1.abs().max().item()))
    print("probabilities, transformers vs refinery eval on the dp%d/zero%d export: max |diff| %.3g"
          % (a.np, a.zero, d_c))
    print("predictions agree: %s" % bool((lg.argmax(-1) == l1.argmax(-1)).all()))
    if d_hf > 1e-4 or d_c > 1e-4:
        sys.exit("beyond 1e-4")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Perplexity of a causal LM on a text file with transformers, computed with
the loop of Hugging Face's guide "Perplexity of fixed-length models"
(https://huggingface.co/docs/transformers/perplexity) as written there: the
reference of `refinery eval --task lm` (services/evaluator/perplexity.h).

    PYTHONPATH=/tmp/gen-py $(scripts/pyenv.sh parity)/bin/python \\
        scripts/parity/ppl_reference.py MODEL FILE.txt [--max-len N] [--stride S]

MODEL is a Hugging Face folder, a .gguf file (loaded with gguf_file=, weights
dequantized to float32) or a folder holding one .gguf file. The text is the
file's bytes decoded as UTF-8 with CRLF turned into LF (what the C side
reads), tokenized whole with tokenizer(text). max_len defaults to the model's
position limit and stride to max_len // 2, as the C side does. Prints one JSON
line: perplexity, nll, tokens (the guide's n_tokens), seq_len, windows,
max_len, stride, seconds. float32, eager attention, CPU.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def load(path):
    """(model, tokenizer) for a folder, a .gguf file or a folder with one."""
    kw = {}
    if os.path.isfile(path):
        folder, kw["gguf_file"] = os.path.split(path)
    elif not os.path.exists(os.path.join(path, "config.json")):
        ggufs = [f for f in os.listdir(path) if f.endswith(".gguf")]
        if len(ggufs) != 1:
            sys.exit(f"{path}: expected config.json or exactly one .gguf file")
        folder, kw["gguf_file"] = path, ggufs[0]
    else:
        folder = path
    tok = AutoTokenizer.from_pretrained(folder, **kw)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager", **kw)
    model.eval()
    return model, tok


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8").replace("\r\n", "\n")


def max_positions(model):
    c = model.config
    return getattr(c, "n_positions", None) or c.max_position_embeddings


def perplexity(model, input_ids, max_length, stride, progress=False):
    """The guide's loop, unchanged but for the arguments."""
    seq_len = input_ids.size(1)
    nll_sum = 0.0
    n_tokens = 0
    prev_end_loc = 0
    windows = 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc  # may be different from stride on last loop
        ids = input_ids[:, begin_loc:end_loc]
        target_ids = ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            outputs = model(ids, labels=target_ids)
            neg_log_likelihood = outputs.loss
        num_valid_tokens = (target_ids != -100).sum().item()
        batch_size = target_ids.size(0)
        num_loss_tokens = num_valid_tokens - batch_size
        nll_sum += neg_log_likelihood * num_loss_tokens
        n_tokens += num_loss_tokens
        windows += 1
        if progress:
            print(f"\rwindow {windows}", end="", file=sys.stderr, flush=True)
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    if progress:
        print(file=sys.stderr)
    avg_nll = nll_sum / n_tokens
    ppl = torch.exp(avg_nll)
    return {"perplexity": float(ppl), "nll": float(avg_nll), "tokens": int(n_tokens),
            "seq_len": int(seq_len), "windows": windows, "max_len": max_length,
            "stride": stride}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--max-len", type=int, default=0)
    ap.add_argument("--stride", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    model, tok = load(a.model)
    enc = tok(read_text(a.data), return_tensors="pt")
    max_len = a.max_len or max_positions(model)
    stride = a.stride or max(max_len // 2, 1)
    r = perplexity(model, enc.input_ids, max_len, stride, progress=sys.stderr.isatty())
    r["seconds"] = round(time.time() - t0, 1)
    r["model"], r["data"] = a.model, a.data
    r["torch"], r["transformers"] = torch.__version__, __import__("transformers").__version__
    print(json.dumps(r))


if __name__ == "__main__":
    main()

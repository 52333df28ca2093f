#!/usr/bin/env python3
"""Checks that the causal-LM folders `refinery train` exports load in
transformers and give the C trainer's logits (by hand, in the parity venv,
after `make` and `TESTS=trainer/test_causal_export make test` built the test):

    P=$(scripts/pyenv.sh parity)/bin/python
    $P scripts/parity/causal_export_check.py [--from RUN/model]

It runs build/tests/trainer/test_causal_export with REFINERY_CAUSAL_EXPORT_OUT
set: the tiny random GPT-2, untied and tied Llama fixtures and
../shared/models/tiny-gpt2, each trained two steps in C, are exported and
their C logits on a right-padded 2 x 7 batch kept beside them. For each, this
script loads the folder with AutoModelForCausalLM (any missing, unexpected or
mismatched weight is a failure; eager attention, float32), runs the same ids
and attention mask, and prints the largest |C - torch| over the valid rows,
relative to the largest |torch| logit, failing above 1e-5; a folder with a
tokenizer must load with AutoTokenizer. --from adds an existing export (a
`refinery run` model/ folder): its logits as loaded, without training."""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5


def check(name, folder, ref):
    model, info = AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, attn_implementation="eager", dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit("%s: transformers reported problems loading %s: %s" % (name, folder, bad))
    model.eval()
    r = load_file(ref)
    ids, mask, c = r["ids"].long(), r["mask"].long(), r["logits"]
    with torch.no_grad():
        t = model(input_ids=ids, attention_mask=mask).logits.reshape(c.shape)
    valid = mask.reshape(-1).bool()
    err = ((c - t)[valid].abs().max() / t[valid].abs().max()).item()
    tok = ""
    if any(os.path.exists(os.path.join(folder, f)) for f in ("tokenizer.json", "vocab.json")):
        enc = AutoTokenizer.from_pretrained(folder)("The tower is 324 metres tall.")["input_ids"]
        tok = ", tokenizer loads (%d ids for a test sentence)" % len(enc)
    print("%-11s %-16s %2d tensors, logits rel err %.2e (limit %.0e)%s"
          % (name, type(model).__name__, len(model.state_dict()), err, TOL, tok))
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", help="an exported folder to check as it is")
    a = ap.parse_args()
    out = tempfile.mkdtemp()
    env = dict(os.environ, REFINERY_CAUSAL_EXPORT_OUT=out, REFINERY_ROOT=ROOT,
               SHARED=os.path.join(os.path.dirname(ROOT), "shared"))
    if a.src:
        env["REFINERY_CAUSAL_EXPORT_FROM"] = os.path.abspath(a.src)
    subprocess.run([os.path.join(ROOT, "build", "tests", "trainer", "test_causal_export")],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    worst = 0.0
    for name in ("gpt2-rand", "llama-rand", "llama-tied", "tiny-gpt2"):
        ref = os.path.join(out, name + ".logits.safetensors")
        if not os.path.exists(ref):
            print("%-11s not run (../shared/models/tiny-gpt2 missing?)" % name)
            continue
        worst = max(worst, check(name, os.path.join(out, name), ref))
    if a.src:
        worst = max(worst, check("--from", a.src, os.path.join(out, "extra.logits.safetensors")))
    if worst > TOL:
        sys.exit("logits differ beyond %g" % TOL)


if __name__ == "__main__":
    main()

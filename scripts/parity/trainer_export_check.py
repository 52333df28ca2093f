#!/usr/bin/env python3
"""Checks that a folder exported by `refinery train` loads in transformers
(run with the `parity` venv after `make`):

    $(scripts/pyenv.sh parity)/bin/python scripts/parity/trainer_export_check.py

Fine-tunes the tiny BERT fixture for a few steps with build/refinery on a small
JSONL task, loads the export with AutoModelForSequenceClassification and
AutoTokenizer (failing on any missing or unexpected weight), and commits:
  tests/fixtures/trainer/exported/           the exported folder
  tests/fixtures/trainer/exported_logits.safetensors
                                             transformers' logits on the tiny_ref inputs
tests/trainer/test_export.c then checks that C gives the same logits from the
same folder and that exporting it again reproduces model.safetensors byte for byte."""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FX = os.path.join(ROOT, "tests", "fixtures", "trainer")


def main():
    tmp = tempfile.mkdtemp()
    random.seed(5)
    with open(os.path.join(tmp, "data.jsonl"), "w") as f:
        for i in range(48):
            y = i % 2
            words = random.sample("the a movie film plot story is was very".split(), 4)
            words.append(random.choice(["good", "great"] if y else ["bad", "dull"]))
            f.write(json.dumps({"id": str(i), "text": " ".join(words), "label": y}) + "\n")
    with open(os.path.join(tmp, "spec.yaml"), "w") as f:
        f.write("trainer:\n  model: %s\n  train: %s/data.jsonl\n  output: %s/out\n"
                "  epochs: 2\n  batch_size: 8\n  lr: 0.003\n  max_len: 16\n  log_every: 0\n"
                % (os.path.join(FX, "tiny-bert"), tmp, tmp))
    subprocess.run([os.path.join(ROOT, "build", "refinery"), "train", tmp + "/spec.yaml"],
                   check=True)
    export = os.path.join(tmp, "out", "model")
    model, info = AutoModelForSequenceClassification.from_pretrained(
        export, output_loading_info=True, attn_implementation="eager")
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit("transformers reported problems loading the export: %s" % bad)
    tok = AutoTokenizer.from_pretrained(export)
    enc = tok("a good movie", return_tensors="pt")
    model.eval()
    ref = load_file(os.path.join(FX, "tiny_ref.safetensors"))
    with torch.no_grad():
        logits = model(input_ids=ref["in.ids"].long(), token_type_ids=ref["in.types"].long(),
                       attention_mask=ref["in.mask"].long()).logits
        text_logits = model(**enc).logits
    dst = os.path.join(FX, "exported")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        shutil.copy(os.path.join(export, name), dst)
    save_file({"logits": logits.float().contiguous(),
               "text.ids": enc["input_ids"].float(),
               "text.logits": text_logits.float().contiguous()},
              os.path.join(FX, "exported_logits.safetensors"))
    print("transformers loaded the export (%s, %d labels); logits %s"
          % (type(model).__name__, model.config.num_labels, logits.tolist()))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

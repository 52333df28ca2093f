#!/usr/bin/env python3
"""Side-by-side fine-tuning: `refinery train` + `refinery eval` against the
Hugging Face Trainer, from the same MiniLM-L6 checkpoint, on the same examples
in the same order (no shuffling on either side), with the same
hyperparameters (AdamW, linear warmup + decay, clipping 1.0, dropout on).

    $(scripts/pyenv.sh bench)/bin/python scripts/hf_trainer_compare.py --task sst2 --train-n 1000

Tasks (data from ../shared, never copied into the repository):
  sst2    GLUE SST-2: the first --train-n sentences of train.tsv after a seeded
          shuffle; scored on all 872 dev sentences (accuracy).
  amazon  the three Amazon review files, exact-deduplicated by text, rating 3-5
          positive / 1-2 negative, split 90/10 by a hash of the text; --train-n
          caps the training part; scored with macro-F1 and per-class F1.
Prints a table with both sides' scores and training times (the training loops
alone: refinery's from train.json, the HF Trainer's train_runtime) and writes
it as JSON to <out>/compare.json. The two classifier heads start from
different random draws (C's seeded RNG vs torch's), so the runs are
comparable, not identical."""
import argparse
import csv
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_sst2(shared, n, seed):
    def tsv(name):
        with open(os.path.join(shared, "data/sst2", name)) as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        return [{"text": r[0], "label": int(r[1])} for r in rows[1:]]
    train = tsv("train.tsv")
    random.Random(seed).shuffle(train)
    return train[:n], tsv("dev.tsv")


def load_amazon(shared, n, seed):
    seen, rows = set(), []
    def add(text, rating):
        text = " ".join(text.split())
        if text and text not in seen:
            seen.add(text)
            rows.append({"text": text, "label": int(float(rating) >= 3)})
    for name in ("All_Beauty_5.json.gz", "Appliances_5.json.gz"):
        for line in gzip.open(os.path.join(shared, "data/amazon", name), "rt"):
            r = json.loads(line)
            add(r.get("summary", "") + ". " + r.get("reviewText", ""), r["overall"])
    csv.field_size_limit(1 << 24)
    with open(os.path.join(shared, "data/amazon/Musical_instruments_reviews.PARTIAL.csv"),
              newline="") as f:
        for r in csv.reader(f):
            if len(r) >= 7:
                add(r[6] + ". " + r[4], r[5])
    h = lambda t: int(hashlib.sha1(t.encode()).hexdigest()[:8], 16) % 10
    train = [r for r in rows if h(r["text"]) != 0]
    test = [r for r in rows if h(r["text"]) == 0]
    random.Random(seed).shuffle(train)
    return train[:n], test


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": str(i), "text": r["text"], "label": r["label"]}) + "\n")


def scores(labels, preds, k=2):
    out = {"accuracy": sum(int(a == b) for a, b in zip(labels, preds)) / len(labels)}
    f1s = []
    for c in range(k):
        tp = sum(1 for a, b in zip(labels, preds) if a == c and b == c)
        p = tp / max(1, sum(1 for b in preds if b == c))
        r = tp / max(1, sum(1 for a in labels if a == c))
        f1s.append(2 * p * r / (p + r) if p + r else 0.0)
    out["f1"] = f1s
    out["macro_f1"] = sum(f1s) / k
    return out


def run_refinery(a, model, out):
    cached = os.path.join(out, "refinery.json")
    if a.reuse_refinery and os.path.exists(cached):
        return json.load(open(cached))
    spec = os.path.join(out, "spec.yaml")
    with open(spec, "w") as f:
        f.write("trainer:\n  model: %s\n  train: %s/train.jsonl\n  output: %s/refinery\n"
                "  num_labels: 2\n  epochs: %d\n  batch_size: %d\n  max_len: %d\n  lr: %g\n"
                "  weight_decay: %g\n  warmup_ratio: %g\n  seed: %d\n  shuffle: false\n"
                "  resume: false\n  threads: %d\n  log_every: 10\n"
                % (model, out, out, a.epochs, a.batch, a.max_len, a.lr, a.wd, a.warmup, a.seed,
                   a.threads))
    if not (a.reuse_refinery and os.path.exists(out + "/refinery/model/model.safetensors")):
        subprocess.run([os.path.join(ROOT, "build/refinery"), "train", spec], check=True)
    train_s = json.load(open(out + "/refinery/train.json"))["seconds"]
    rep = subprocess.run([os.path.join(ROOT, "build/refinery"), "eval", "--model",
                          out + "/refinery/model", "--data", out + "/test.jsonl", "--max-len",
                          str(a.max_len), "--threads", str(a.threads)],
                         check=True, capture_output=True, text=True)
    r = json.loads(rep.stdout)
    res = {"accuracy": r["accuracy"], "macro_f1": r["macro"]["f1"],
           "f1": [c["f1"] for c in r["per_class"]], "train_seconds": train_s,
           "loss": json.load(open(out + "/refinery/train.json"))["last_loss"]}
    with open(cached, "w") as f:
        json.dump(res, f)
    return res


def run_hf(a, model_dir, train, test):
    import torch
    from transformers import (AutoTokenizer, BertForSequenceClassification,
                              DataCollatorWithPadding, Trainer, TrainingArguments)
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(model_dir)

    class DS(torch.utils.data.Dataset):
        def __init__(self, rows):
            self.enc = [dict(tok(r["text"], truncation=True, max_length=a.max_len),
                             labels=r["label"]) for r in rows]

        def __len__(self):
            return len(self.enc)

        def __getitem__(self, i):
            return self.enc[i]

    class InOrder(Trainer):  # the same order as refinery's shuffle: false
        def _get_train_sampler(self, *args, **kw):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    args = TrainingArguments(output_dir=os.path.join(a.out, "hf"), per_device_train_batch_size=a.batch,
                             per_device_eval_batch_size=64, learning_rate=a.lr, optim="adamw_torch",
                             weight_decay=a.wd, warmup_steps=a.warmup, num_train_epochs=a.epochs,
                             lr_scheduler_type="linear", max_grad_norm=1.0, seed=a.seed,
                             save_strategy="no", report_to=[], logging_steps=10, use_cpu=True,
                             dataloader_num_workers=0)
    tr = InOrder(model=model, args=args, train_dataset=DS(train),
                 data_collator=DataCollatorWithPadding(tok))
    res = tr.train()
    train_s = res.metrics["train_runtime"]
    pred = tr.predict(DS(test))
    preds = pred.predictions.argmax(-1).tolist()
    s = scores([r["label"] for r in test], preds)
    s["train_seconds"] = train_s
    s["loss"] = res.training_loss
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=["sst2", "amazon"], default="sst2")
    ap.add_argument("--train-n", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=66)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "compare"))
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-refinery", action="store_true")
    ap.add_argument("--reuse-refinery", action="store_true",
                    help="evaluate an existing <out>/refinery/model instead of training again")
    a = ap.parse_args()
    a.out = os.path.join(a.out, a.task)
    os.makedirs(a.out, exist_ok=True)
    model = subprocess.run([os.path.join(ROOT, "scripts/fetch-minilm.sh")], check=True,
                           capture_output=True, text=True, cwd=ROOT).stdout.strip()
    model = os.path.join(ROOT, model)
    load = load_sst2 if a.task == "sst2" else load_amazon
    train, test = load(a.shared, a.train_n, a.seed)
    write_jsonl(os.path.join(a.out, "train.jsonl"), train)
    write_jsonl(os.path.join(a.out, "test.jsonl"), test)
    result = {"task": a.task, "train_examples": len(train), "test_examples": len(test),
              "args": vars(a)}
    if not a.skip_refinery:
        result["refinery"] = run_refinery(a, model, a.out)
    if not a.skip_hf:
        result["hf_trainer"] = run_hf(a, model, train, test)
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("%s: %d training examples, %d test examples, %d epoch(s), batch %d, lr %g, %d threads"
          % (a.task, len(train), len(test), a.epochs, a.batch, a.lr, a.threads))
    print("%-12s %9s %9s %9s %9s %12s" % ("", "accuracy", "macro-F1", "F1(neg)", "F1(pos)",
                                          "train time"))
    for side in ("refinery", "hf_trainer"):
        if side in result:
            r = result[side]
            print("%-12s %9.4f %9.4f %9.4f %9.4f %11.0fs" % (side, r["accuracy"], r["macro_f1"],
                                                            r["f1"][0], r["f1"][1],
                                                            r["train_seconds"]))


if __name__ == "__main__":
    sys.exit(main())

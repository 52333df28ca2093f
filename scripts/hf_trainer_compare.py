#!/usr/bin/env python3
"""Side-by-side fine-tuning: `refinery train` + `refinery eval` against the
Hugging Face Trainer, from the same MiniLM-L6 checkpoint, on the same examples
in the same order (no shuffling on either side, every epoch in file order),
with the same hyperparameters (AdamW, linear warmup + decay, clipping 1.0,
dropout on, dynamic padding to the longest sequence of each batch).

    $(scripts/pyenv.sh bench)/bin/python scripts/hf_trainer_compare.py --task sst2 --train-n 1000

Tasks (data from ../shared, never copied into the repository):
  sst2    GLUE SST-2: the first --train-n sentences of train.tsv after a seeded
          shuffle (--train-n 0 = all 67,349); scored on all 872 dev sentences.
  amazon  the three Amazon review files, exact-deduplicated by text, rating 3-5
          positive / 1-2 negative, split 90/10 by a hash of the text; --train-n
          caps the training part (0 = all); scored with macro-F1 and per-class F1.

The two sides can run in separate invocations (--side refinery / --side hf,
e.g. at different times or concurrently, one thread each): each writes
<out>/<side>.json with its scores, timings, thread count, command lines and
the data's sha256; every invocation then merges whatever side files exist
into <out>/compare.json and prints the table — only when both sides were run
on the same data and hyperparameters (otherwise it refuses). The default
<out> names the task and the settings, so runs of different sizes do not mix.

Both heads are seeded (--seed), but C's RNG and torch's draw different
initial heads and dropout masks, so the runs are comparable, not identical;
each side on its own is reproducible (refinery bitwise for a fixed thread
count)."""
import argparse
import csv
import gzip
import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_KEYS = ("task", "train_n", "epochs", "batch", "max_len", "lr", "wd", "warmup", "seed",
              "data_seed")


def load_sst2(shared, n, seed):
    def tsv(name):
        with open(os.path.join(shared, "data/sst2", name)) as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        return [{"text": r[0], "label": int(r[1])} for r in rows[1:]]
    train = tsv("train.tsv")
    random.Random(seed).shuffle(train)
    return train[:n] if n > 0 else train, tsv("dev.tsv")


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
    return train[:n] if n > 0 else train, test


def write_jsonl(path, rows):
    """Writes atomically and returns the sha256 of the content; an identical
    existing file is left alone (two sides may run concurrently)."""
    text = "".join(json.dumps({"id": str(i), "text": r["text"], "label": r["label"]}) + "\n"
                   for i, r in enumerate(rows)).encode()
    digest = hashlib.sha256(text).hexdigest()
    if os.path.exists(path) and hashlib.sha256(open(path, "rb").read()).hexdigest() == digest:
        return digest
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(text)
    os.replace(tmp, path)
    return digest


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
    out["confusion"] = [[sum(1 for a, b in zip(labels, preds) if a == t and b == q)
                         for q in range(k)] for t in range(k)]
    return out


def git_state():
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = [l[3:] for l in git("status", "--porcelain", "--", "services").splitlines()]
    return {"commit": git("rev-parse", "HEAD").strip(), "uncommitted_services_files": dirty}


def run_refinery(a, model, out):
    spec = os.path.join(out, "spec.yaml")
    with open(spec, "w") as f:
        f.write("trainer:\n  model: %s\n  train: %s/train.jsonl\n  output: %s/refinery\n"
                "  num_labels: 2\n  epochs: %d\n  batch_size: %d\n  max_len: %d\n  lr: %g\n"
                "  weight_decay: %g\n  warmup_ratio: %g\n  seed: %d\n  shuffle: false\n"
                "  resume: false\n  threads: %d\n  log_every: 10\n"
                % (model, out, out, a.epochs, a.batch, a.max_len, a.lr, a.wd, a.warmup, a.seed,
                   a.threads))
    binary = os.path.abspath(a.refinery_bin)
    train_cmd = [binary, "train", spec]
    eval_cmd = [binary, "eval", "--model", out + "/refinery/model", "--data",
                out + "/test.jsonl", "--max-len", str(a.max_len), "--threads", str(a.threads)]
    state = git_state()  # before the run: others may commit during it
    state["binary_sha256"] = hashlib.sha256(open(binary, "rb").read()).hexdigest()
    t0 = time.time()
    subprocess.run(train_cmd, check=True)
    t1 = time.time()
    rep = subprocess.run(eval_cmd, check=True, capture_output=True, text=True)
    t2 = time.time()
    r = json.loads(rep.stdout)
    tr = json.load(open(out + "/refinery/train.json"))
    return {"accuracy": r["accuracy"], "macro_f1": r["macro"]["f1"],
            "f1": [c["f1"] for c in r["per_class"]], "confusion": r["confusion"],
            "train_seconds": tr["seconds"], "tokens": tr["tokens"],
            "tokens_per_s": tr["tokens_per_s"], "steps": tr["steps"], "loss": tr["last_loss"],
            "peak_rss_kb": tr["peak_rss_kb"], "train_process_seconds": t1 - t0,
            "eval_process_seconds": t2 - t1,
            "commands": [" ".join(shlex.quote(c) for c in train_cmd),
                         " ".join(shlex.quote(c) for c in eval_cmd)],
            "spec": open(spec).read(), **state}


def run_hf(a, model_dir, train, test):
    import torch
    import transformers
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

    t0 = time.time()
    transformers.set_seed(a.seed)  # the classifier head's init, then dropout
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    args = TrainingArguments(output_dir=os.path.join(a.out, "hf"), per_device_train_batch_size=a.batch,
                             per_device_eval_batch_size=64, learning_rate=a.lr, optim="adamw_torch",
                             weight_decay=a.wd, warmup_steps=a.warmup, num_train_epochs=a.epochs,
                             lr_scheduler_type="linear", max_grad_norm=1.0, seed=a.seed,
                             save_strategy="no", report_to=[], logging_steps=10, use_cpu=True,
                             dataloader_num_workers=0)
    train_ds = DS(train)
    tr = InOrder(model=model, args=args, train_dataset=train_ds,
                 data_collator=DataCollatorWithPadding(tok))
    res = tr.train()
    t1 = time.time()
    pred = tr.predict(DS(test))
    t2 = time.time()
    preds = pred.predictions.argmax(-1).tolist()
    s = scores([r["label"] for r in test], preds)
    tokens = a.epochs * sum(len(e["input_ids"]) for e in train_ds.enc)
    s.update({"train_seconds": res.metrics["train_runtime"], "tokens": tokens,
              "tokens_per_s": tokens / res.metrics["train_runtime"],
              "steps": res.global_step, "mean_loss": res.training_loss,
              # the last logged window (steps 10k-9..10k); refinery's "loss" is the
              # window after its last multiple of 10, so compare the logs, not these
              "loss": [h["loss"] for h in tr.state.log_history if "loss" in h][-1],
              "train_process_seconds": t1 - t0, "eval_process_seconds": t2 - t1,
              "torch_threads": torch.get_num_threads(),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}})
    return s


def merge(out):
    """compare.json from the side files of out, when their setups agree."""
    sides = {}
    for side in ("refinery", "hf_trainer"):
        path = os.path.join(out, side + ".json")
        if os.path.exists(path):
            sides[side] = json.load(open(path))
    setups = {json.dumps(v["setup"], sort_keys=True) for v in sides.values()}
    if len(setups) > 1:
        sys.exit("%s: the side files were run with different data or settings; not merged" % out)
    result = dict(next(iter(sides.values()))["setup"]) if sides else {}
    result.update(sides)
    tmp = os.path.join(out, "compare.json.tmp%d" % os.getpid())
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, os.path.join(out, "compare.json"))
    return result


def print_table(result):
    if not result:
        return
    print("%s: %d training examples (%d test), %d epoch(s), batch %d, max_len %d, lr %g, "
          "warmup %g, weight decay %g, seed %d" % (
              result["task"], result["train_examples"], result["test_examples"],
              result["epochs"], result["batch"], result["max_len"], result["lr"],
              result["warmup"], result["wd"], result["seed"]))
    print("%-11s %8s %8s %8s %8s %7s %10s %9s" % (
        "", "accuracy", "macroF1", "F1(neg)", "F1(pos)", "threads", "train loop", "tokens/s"))
    for side in ("refinery", "hf_trainer"):
        if side in result:
            r = result[side]
            print("%-11s %8.4f %8.4f %8.4f %8.4f %7d %9.0fs %9.1f" % (
                side, r["accuracy"], r["macro_f1"], r["f1"][0], r["f1"][1], r["threads"],
                r["train_seconds"], r["tokens_per_s"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=["sst2", "amazon"], default="sst2")
    ap.add_argument("--train-n", type=int, default=1000, help="0 = the whole training part")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=66)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--warmup", type=float, default=0.1, help="< 1: ratio of the steps")
    ap.add_argument("--seed", type=int, default=42, help="head init, dropout")
    ap.add_argument("--data-seed", type=int, default=42, help="the shuffle that picks --train-n")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--refinery-bin", default=os.path.join(ROOT, "build/refinery"),
                    help="e.g. a copy of build/refinery, so that rebuilds during a long run "
                    "do not touch it")
    ap.add_argument("--side", choices=["both", "refinery", "hf"], default="both")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--out", help="default: build/compare/<task>-n<N>-e<E>-b<B>-len<L>-lr<LR>"
                    "[-seed<S>-data<D> unless both are 42]")
    ap.add_argument("--merge-only", action="store_true",
                    help="only merge the existing side files and print the table")
    a = ap.parse_args()
    if not a.out:
        a.out = os.path.join(ROOT, "build", "compare", "%s-n%d-e%d-b%d-len%d-lr%g" % (
            a.task, a.train_n, a.epochs, a.batch, a.max_len, a.lr))
        if (a.seed, a.data_seed) != (42, 42):
            a.out += "-seed%d-data%d" % (a.seed, a.data_seed)
    os.makedirs(a.out, exist_ok=True)
    if a.merge_only:
        print_table(merge(a.out))
        return 0
    model = subprocess.run([os.path.join(ROOT, "scripts/fetch-minilm.sh")], check=True,
                           capture_output=True, text=True, cwd=ROOT).stdout.strip()
    model = os.path.join(ROOT, model)
    load = load_sst2 if a.task == "sst2" else load_amazon
    train, test = load(a.shared, a.train_n, a.data_seed)
    setup = {k: getattr(a, k) for k in SETUP_KEYS}
    setup.update(train_examples=len(train), test_examples=len(test),
                 train_negatives=sum(1 for r in train if r["label"] == 0),
                 test_negatives=sum(1 for r in test if r["label"] == 0),
                 train_sha256=write_jsonl(os.path.join(a.out, "train.jsonl"), train),
                 test_sha256=write_jsonl(os.path.join(a.out, "test.jsonl"), test))
    command = " ".join(shlex.quote(c) for c in [os.path.relpath(sys.executable, ROOT)] + sys.argv)
    for side, run in (("refinery", lambda: run_refinery(a, model, a.out)),
                      ("hf_trainer", lambda: run_hf(a, model, train, test))):
        if a.side not in ("both", side.split("_")[0]):
            continue
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        r = run()
        r.update(setup=setup, threads=a.threads, command=command, started=started,
                 finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 load_average_at_end=os.getloadavg())
        with open(os.path.join(a.out, side + ".json"), "w") as f:
            json.dump(r, f, indent=1)
    print_table(merge(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

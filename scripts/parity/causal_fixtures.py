#!/usr/bin/env python3
"""Generates the causal-LM parity fixtures (run with the parity venv, torch +
transformers, CPU):

    /work/main/.venv-parity/bin/python scripts/parity/causal_fixtures.py

Writes into tests/fixtures/causal/:

tiny-gpt2-rand/           a random GPT2LMHeadModel (n_embd 32, 2 layers, 4 heads,
                          vocab 64, 32 positions, gelu_new, dropout 0) saved with
                          save_pretrained (config.json + model.safetensors).
gpt2_rand_ref.safetensors for a fixed batch of 3 sequences of 8 tokens (one
                          right-padded to 5 tokens, one with -100 labels on its
                          first 3 tokens, as an SFT prompt would have): the
                          inputs, logits, loss and the gradient of every
                          parameter (transformer.wte.weight's includes the
                          tied head's), and every parameter after 3 AdamW
                          steps (after.3.<name>: lr 1e-3 as in the BERT
                          fixture, linear warmup over 1 step and decay to
                          step 4, clipping at 1.0, weight decay 0.01 on
                          matrices). With lr 1e-2 the tied Llama's weights
                          differed by up to 1.9e-5 after one large step (loss
                          5.16 -> 3.03): AdamW magnifies round-off there.
gpt2_shared_ref.safetensors the same batch shape for ../shared/models/tiny-gpt2
                          (hidden size 2, vocab 50257; its weights are not
                          committed: the test reads them from ../shared and
                          skips without them). Tensors up to 4096 elements are
                          stored whole; larger ones (logits, wte, wpe) as
                          sum., sumsq. and samp. = 1000 elements at flat
                          indices i * numel // 1000.

tiny-llama-rand/          a random LlamaForCausalLM (hidden 32, 2 layers, 4 heads,
                          2 key/value heads, intermediate 48, vocab 64, rope
                          theta 10000, RMSNorm eps 1e-6, untied head), and
llama_rand_ref.safetensors  its reference on the same kind of batch, with
                          the same 3 AdamW steps.
tiny-llama-tied/, llama_tied_ref.safetensors  the same for a Llama shaped like
                          SmolLM2 in miniature: tied head, 6 query heads over 2
                          key/value heads of size 6, rope theta 1e5, eps 1e-5.

Attention runs in eager mode; dropout is off (eval mode), so both sides are
deterministic. Ids and labels are stored as F32 (small integers, exact)."""
import os

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "causal")
SHARED = os.path.join(ROOT, "..", "shared", "models", "tiny-gpt2")
FULL_MAX, SAMPLES = 4096, 1000
LR, WD, BETAS, EPS, CLIP, WARMUP, TOTAL, STEPS = 1e-3, 0.01, (0.9, 0.999), 1e-8, 1.0, 1, 4, 3


def batch(vocab, gen):
    B, T = 3, 8
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[2, :3] = -100
    return ids, mask, labels


def put(out, name, t):
    t = t.detach().float().contiguous()
    if t.numel() <= FULL_MAX:
        out[name] = t.clone()
        return
    flat = t.reshape(-1).double()
    n = flat.numel()
    idx = torch.tensor([i * n // SAMPLES for i in range(SAMPLES)])
    out["sum." + name] = flat.sum().float().reshape(1)
    out["sumsq." + name] = (flat * flat).sum().float().reshape(1)
    out["samp." + name] = flat[idx].float().clone()


def reference(model, vocab, seed, steps=0):
    """The first forward/backward's logits, loss and gradients; with steps > 0
    also every parameter after that many AdamW steps on the same batch (lr
    LR with linear warmup over WARMUP steps and linear decay to TOTAL, global
    clipping at CLIP, weight decay WD on matrices only, as the C side's tensor
    tables flag them)."""
    gen = torch.Generator().manual_seed(seed)
    ids, mask, labels = batch(vocab, gen)
    model.eval()
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for p in params.values() if p.dim() == 2], "weight_decay": WD},
        {"params": [p for p in params.values() if p.dim() != 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / WARMUP if s < WARMUP else max(0.0, (TOTAL - s) / (TOTAL - WARMUP)))
    ref = {"in.ids": ids.float(), "in.mask": mask.float(), "in.labels": labels.float()}
    loss0 = None
    for step in range(max(steps, 1)):
        opt.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        if step == 0:
            put(ref, "out.logits", out.logits)
            ref["out.loss"] = out.loss.detach().reshape(1)
            loss0 = out.loss.item()
            for n, p in params.items():
                put(ref, "grad." + n, p.grad)
        if steps == 0:
            break
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    if steps:
        for n, p in params.items():
            put(ref, "after.%d.%s" % (steps, n), p)
    return ref, loss0


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # non-trivial LayerNorm and biases, so their gradients are tested
        for n, p in model.named_parameters():
            if n.endswith(".bias") or "ln_" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(os.path.join(OUT, "tiny-gpt2-rand"))
    ref, loss = reference(model, cfg.vocab_size, 1, STEPS)
    save_file(ref, os.path.join(OUT, "gpt2_rand_ref.safetensors"))
    print("tiny-gpt2-rand: loss %.6f" % loss)

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                      initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # RMSNorm weights away from 1, so their gradients are tested
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(os.path.join(OUT, "tiny-llama-rand"))
    ref, loss = reference(model, cfg.vocab_size, 3, STEPS)
    save_file(ref, os.path.join(OUT, "llama_rand_ref.safetensors"))
    print("tiny-llama-rand: loss %.6f" % loss)

    torch.manual_seed(2)  # tied head, 6 query heads over 2 kv heads of size 6, theta 1e5
    cfg = LlamaConfig(vocab_size=64, hidden_size=36, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                      initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(os.path.join(OUT, "tiny-llama-tied"))
    ref, loss = reference(model, cfg.vocab_size, 4, STEPS)
    save_file(ref, os.path.join(OUT, "llama_tied_ref.safetensors"))
    print("tiny-llama-tied: loss %.6f" % loss)

    if os.path.isdir(SHARED):
        model = GPT2LMHeadModel.from_pretrained(SHARED, attn_implementation="eager")
        ref, loss = reference(model, model.config.vocab_size, 2)
        save_file(ref, os.path.join(OUT, "gpt2_shared_ref.safetensors"))
        print("shared tiny-gpt2: loss %.6f" % loss)


if __name__ == "__main__":
    main()

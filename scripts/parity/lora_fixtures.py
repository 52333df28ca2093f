#!/usr/bin/env python3
"""Generates the LoRA / QLoRA parity fixtures (parity venv: torch,
transformers, peft, bitsandbytes; CPU):

    $(scripts/pyenv.sh parity)/bin/python scripts/parity/lora_fixtures.py

Writes into tests/fixtures/lora/, over the random tiny models of
tests/fixtures/causal/ (scripts/parity/causal_fixtures.py):

{gpt2,llama}_lora/          peft adapter folders (save_pretrained: adapter_config.json +
                            adapter_model.safetensors): LoRA r 4, lora_alpha 12 (scale 3),
                            dropout 0, every projection targeted (GPT-2: attn.c_attn,
                            attn.c_proj, mlp.c_fc, mlp.c_proj with fan_in_fan_out; Llama:
                            q, k, v, o, gate, up, down), lora_A as peft initialises it,
                            lora_B random (normal, std 0.2) so that every gradient is non-zero.
{gpt2,llama}_lora_ref.safetensors  for the batch of causal_fixtures.py (3 x 8, right padding,
                            -100 labels): inputs, logits, loss, the gradient of every LoRA
                            tensor (grad.<module>.lora_A.weight: peft's names without
                            "base_model.model." and the adapter name) and every LoRA tensor
                            after 3 AdamW steps of the adapter alone (after.3.<...>; lr 1e-3,
                            warmup 1 step, linear decay to step 4, clipping 1.0 over the
                            adapter's gradients, weight decay 0.01).
{gpt2,llama}_qlora_ref.safetensors  the same adapter over the base loaded in
                            4 bits by transformers + bitsandbytes (BitsAndBytesConfig: nf4,
                            double quantization, compute dtype float32): every projection
                            is a bnb Linear4bit (GPT-2's Conv1D transposed to [out, in]).
                            The ref file also holds each Linear4bit's quantized state as
                            bitsandbytes made it: nf4.<module>.packed (U8), .qabsmax (U8),
                            .absmax2 (F32), .offset (F32[1]).
quant_ref.safetensors       the quantizers: bitsandbytes' dynamic 8-bit map (dynamic_code);
                            for random weights w.<k> ([300, 130] and [37, 29], normal * 0.05)
                            bitsandbytes' NF4 state (bnb.*), its dequantization (bnb.deq.<k>),
                            and the state by bitsandbytes' reference rule for the nested
                            8-bit step (ref.*: see below); for w.int8 ([48, 40]) its int8
                            codes (CB), row absmaxes (SCB) and dequantization (int8.deq).

bitsandbytes 0.50 on the CPU quantizes the 4-bit level with its "default" torch kernel
(scaled = x * (1 / absmax), code = bucket of the midpoints of the NF4 values), which the C
side follows. The nested 8-bit step of the double quantization goes through its C++ CPU
kernel (cquantize_blockwise_cpu_fp32: x / absmax, then a "Direct2" lookup search), which is
not always the nearest code; the reference kernel of the same library (backends/default,
"the same assumption as the CUDA kernel") takes the nearest code by the same bucket rule as
the 4-bit level. The ref.* state is that rule, with the offset taken as the float64 mean of
the block absmaxes rounded once (torch's float32 mean may differ in the last bit). The
script prints how often the two differ. The QLoRA fixtures use bitsandbytes' own state, which
the C test loads as it is; the C quantizer is compared with ref.* bit for bit.

Attention runs eagerly, dropout is 0. Ids and labels are stored as F32 (exact)."""
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

import bitsandbytes as bnb
import bitsandbytes.functional as F
from peft import LoraConfig, get_peft_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAUSAL = os.path.join(ROOT, "tests", "fixtures", "causal")
OUT = os.path.join(ROOT, "tests", "fixtures", "lora")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from causal_fixtures import batch  # noqa: E402  the same batch shape and masks

LR, WD, BETAS, EPS, CLIP, WARMUP, TOTAL, STEPS = 1e-3, 0.01, (0.9, 0.999), 1e-8, 1.0, 1, 4, 3
RANK, ALPHA = 4, 12
TARGETS = {
    "gpt2": ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}
MODELS = {"gpt2": ("tiny-gpt2-rand", 11), "llama": ("tiny-llama-rand", 13)}


def c_name(n):
    """peft parameter name -> the C table's name."""
    return n.replace("base_model.model.", "", 1).replace(".default", "")


def load(arch, qlora):
    d = os.path.join(CAUSAL, MODELS[arch][0])
    kw = {"attn_implementation": "eager"}
    if qlora:
        kw["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32)
        kw["device_map"] = "cpu"
    return AutoModelForCausalLM.from_pretrained(d, **kw)


def reference(arch, qlora):
    base = load(arch, qlora)
    cfg = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS[arch],
                     fan_in_fan_out=arch == "gpt2", task_type="CAUSAL_LM")
    torch.manual_seed(MODELS[arch][1])
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.2)
    name = "%s_%s" % (arch, "qlora" if qlora else "lora")
    adapter = os.path.join(OUT, arch + "_lora")
    if not qlora:
        model.save_pretrained(adapter)
        os.remove(os.path.join(adapter, "README.md"))  # peft's model card template
        path = os.path.join(adapter, "adapter_config.json")
        with open(path) as f:
            text = f.read().replace(os.path.join(CAUSAL, ""), "")  # no absolute path
        with open(path, "w") as f:
            f.write(text)
    else:  # the QLoRA run starts from the same adapter weights
        saved = load_file(os.path.join(adapter, "adapter_model.safetensors"))
        for n, p in model.named_parameters():
            if "lora_" in n:
                assert torch.equal(saved[n.replace(".default", "")], p.detach()), n
    model.eval()
    train = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in train)
    opt = torch.optim.AdamW(list(train.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / WARMUP if s < WARMUP else max(0.0, (TOTAL - s) / (TOTAL - WARMUP)))
    gen = torch.Generator().manual_seed(MODELS[arch][1])
    ids, mask, labels = batch(base.config.vocab_size, gen)
    ref = {"in.ids": ids.float(), "in.mask": mask.float(), "in.labels": labels.float()}
    for step in range(STEPS):
        opt.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        if step == 0:
            ref["out.logits"] = out.logits.detach().float().clone()
            ref["out.loss"] = out.loss.detach().reshape(1)
            for n, p in train.items():
                ref["grad." + c_name(n)] = p.grad.detach().clone()
            loss0 = out.loss.item()
        torch.nn.utils.clip_grad_norm_(list(train.values()), CLIP)
        opt.step()
        sched.step()
    for n, p in train.items():
        ref["after.%d.%s" % (STEPS, c_name(n))] = p.detach().clone()
    if qlora:
        for n, mod in model.named_modules():
            if isinstance(mod, bnb.nn.Linear4bit):
                qs = mod.weight.quant_state
                key = "nf4." + c_name(n).replace(".base_layer", "")
                assert qs.nested and qs.blocksize == 64 and qs.state2.blocksize == 256
                ref[key + ".packed"] = mod.weight.data.reshape(-1).clone()
                ref[key + ".qabsmax"] = qs.absmax.reshape(-1).clone()
                ref[key + ".absmax2"] = qs.state2.absmax.float().clone()
                ref[key + ".offset"] = qs.offset.float().reshape(1).clone()
                ref[key + ".shape"] = torch.tensor(list(qs.shape), dtype=torch.float32)
    save_file(ref, os.path.join(OUT, name + "_ref.safetensors"))
    print("%s: loss %.6f, %d LoRA tensors" % (name, loss0, len(train)))


def ref_nested(absmax, code):
    """bitsandbytes' reference rule (backends/default quantize_blockwise) for the
    nested step, the offset as the float64 mean rounded once."""
    offset = torch.tensor(absmax.double().mean().item(), dtype=torch.float32)
    x = absmax - offset
    n, bs = x.numel(), 256
    full = n - n % bs
    a = x[:full].reshape(-1, bs)
    a2 = a.abs().max(dim=-1)[0]
    scaled = torch.clamp(a * (1.0 / a2.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if n % bs:
        am = x[full:].abs().max().clamp(min=1e-38)
        a2 = torch.cat([a2, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(x[full:] / am, -1, 1)])
    bounds = (code[:-1] + code[1:]) / 2
    q = torch.bucketize(scaled, bounds, out_int32=True).to(torch.uint8)
    return q, a2, offset


def quant_ref():
    torch.manual_seed(5)
    code = F.create_dynamic_map().float()
    ref = {"dynamic_code": code.clone()}
    total = diff = 0
    for k, shape in (("a", (300, 130)), ("b", (37, 29))):
        w = torch.randn(*shape) * 0.05
        w[0, :64] = 0  # an all-zero block
        packed, st = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        deq = F.dequantize_4bit(packed, st)
        ref["w." + k] = w.clone()
        ref["bnb.packed." + k] = packed.reshape(-1).clone()
        ref["bnb.qabsmax." + k] = st.absmax.clone()
        ref["bnb.absmax2." + k] = st.state2.absmax.float().clone()
        ref["bnb.offset." + k] = st.offset.float().reshape(1).clone()
        ref["bnb.deq." + k] = deq.float().clone()
        # the block absmaxes again (bitsandbytes' 4-bit kernel, no nesting)
        _, st1 = F.quantize_4bit(w, blocksize=64, compress_statistics=False, quant_type="nf4")
        q, a2, off = ref_nested(st1.absmax.float(), code)
        ref["ref.qabsmax." + k] = q.clone()
        ref["ref.absmax2." + k] = a2.clone()
        ref["ref.offset." + k] = off.reshape(1).clone()
        total += q.numel()
        diff += int((q != st.absmax).sum())
        print("nf4 %s %s: offset bnb %r ref %r; nested codes differing %d of %d" % (
            k, tuple(shape), st.offset.item(), off.item(), int((q != st.absmax).sum()), q.numel()))
    w = torch.randn(48, 40)
    cb, scb, _ = F.int8_vectorwise_quant(w.clone())
    ref["w.int8"] = w.clone()
    ref["int8.CB"] = cb.float().clone()
    ref["int8.SCB"] = scb.float().clone()
    ref["int8.deq"] = F.int8_vectorwise_dequant(cb, scb).float().clone()
    save_file(ref, os.path.join(OUT, "quant_ref.safetensors"))
    print("quant_ref: nested 8-bit codes of bitsandbytes' CPU kernel off its reference rule: "
          "%d of %d" % (diff, total))


def main():
    os.makedirs(OUT, exist_ok=True)
    print("torch %s, transformers %s, peft %s, bitsandbytes %s" % (
        torch.__version__, __import__("transformers").__version__, __import__("peft").__version__,
        bnb.__version__))
    quant_ref()
    for arch in ("gpt2", "llama"):
        for qlora in (False, True):
            reference(arch, qlora)


if __name__ == "__main__":
    main()

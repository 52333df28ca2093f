#!/usr/bin/env python3
"""Checks the PEFT adapter export of lora.h by hand (not part of make test):
build/trainer/lora_run trains a LoRA adapter on a model for a few steps and
writes it as PEFT files (adapter_config.json + adapter_model.safetensors) with
the logits it computes for its batch after training; this script loads the
base with transformers, the adapter over it with peft.PeftModel.from_pretrained,
computes the logits of the same ids and prints the norm-wise relative error
(and, for scale, how far the base alone is from the adapted logits).

    make && $(scripts/pyenv.sh parity)/bin/python scripts/parity/peft_export_check.py [--smollm2]

Cases: the random tiny GPT-2 and Llama of tests/fixtures/causal/ (fp32 base,
every projection targeted); the tiny Llama trained over an NF4 base, loaded by
peft over transformers + bitsandbytes' 4-bit base (the two sides quantize the
base themselves: their nested absmax codes can differ, see
scripts/parity/lora_fixtures.py); with --smollm2, SmolLM2-135M from its Q4_1
GGUF (scripts/fetch-smollm2.sh), dequantized to fp32 by both sides
(transformers with gguf-py), on WikiText-2 text (../shared). Exits 1 if an
error exceeds its limit (1e-5; 1e-3 for the NF4 case, 1e-4 for SmolLM2)."""
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import PeftModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "build", "trainer", "lora_run")
CAUSAL = os.path.join(ROOT, "tests", "fixtures", "causal")
SMOL = os.path.join(ROOT, "build", "models", "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")
WIKI = os.path.join(ROOT, "..", "shared", "data", "wikitext2", "wiki.valid.raw")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def case(name, model, args, load_base, limit):
    with tempfile.TemporaryDirectory() as tmp:
        adapter, logits = os.path.join(tmp, "adapter"), os.path.join(tmp, "logits.safetensors")
        cmd = [RUN, "--model", model, "--adapter-out", adapter, "--logits-out", logits] + args
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        meas = json.loads(out.stdout.strip().splitlines()[-1])
        ref = load_file(logits)
        ids = ref["ids"].long()
        base = load_base()
        with torch.no_grad():
            plain = base(input_ids=ids).logits
        peft_model = PeftModel.from_pretrained(base, adapter)
        peft_model.eval()
        with torch.no_grad():
            got = peft_model(input_ids=ids).logits
        err, base_err = rel(ref["logits"], got), rel(ref["logits"], plain)
        cfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
        print("%-34s logits rel err %.3g (base alone: %.3g); r %d, alpha %g, targets %s; C loss "
              "after %d steps %.4f" % (name, err, base_err, cfg["r"], cfg["lora_alpha"],
                                       ",".join(cfg["target_modules"]), meas["steps"],
                                       meas["loss_after"]))
        return err <= limit


def main():
    if not os.path.exists(RUN):
        sys.exit("build/trainer/lora_run is missing: run make first")
    ok = True
    common = ["--rank", "4", "--alpha", "12", "--steps", "3", "--lr", "1e-2", "--seq", "8",
              "--batch", "2"]
    for arch in ("gpt2", "llama"):
        d = os.path.join(CAUSAL, "tiny-%s-rand" % arch)
        targets = "q,k,v,o,up,down" + (",gate" if arch == "llama" else "")
        ok &= case("tiny %s, fp32 base" % arch, d, common + ["--targets", targets],
                   lambda: AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager"),
                   1e-5)
    d = os.path.join(CAUSAL, "tiny-llama-rand")
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                           bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    ok &= case("tiny llama, NF4 base (QLoRA)", d,
               common + ["--targets", "q,v,down", "--base", "nf4"],
               lambda: AutoModelForCausalLM.from_pretrained(
                   d, quantization_config=q, device_map="cpu", attn_implementation="eager"),
               1e-3)
    if "--smollm2" in sys.argv:
        if not os.path.exists(SMOL) or not os.path.exists(WIKI):
            print("SKIP: SmolLM2 (scripts/fetch-smollm2.sh) or ../shared WikiText-2 missing")
            sys.exit(77)
        ok &= case("SmolLM2-135M (GGUF), fp32 base", SMOL,
                   ["--rank", "8", "--alpha", "16", "--steps", "2", "--lr", "1e-3", "--seq", "32",
                    "--targets", "q,k,v,o,up,down,gate", "--text", WIKI],
                   lambda: AutoModelForCausalLM.from_pretrained(
                       os.path.dirname(SMOL), gguf_file=os.path.basename(SMOL),
                       torch_dtype=torch.float32, attn_implementation="eager"),
                   1e-4)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

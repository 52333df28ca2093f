#!/usr/bin/env python3
"""Generates the fixtures of inference with a LoRA adapter (`refinery generate
--adapter`, `refinery eval --task lm --adapter`; tests/evaluator/lm_adapter_cli.test.sh,
tests/trainer/test_lora_merge.c) with peft over transformers, float32, eager
attention, CPU:

    $(scripts/pyenv.sh parity)/bin/python scripts/parity/lora_infer_fixtures.py

Writes into tests/fixtures/lora/:

tiny_gpt2_lora/          a peft adapter folder (save_pretrained) over ../shared/models/tiny-gpt2
                         (which has a tokenizer): LoRA r 4, lora_alpha 8, every projection
                         (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, fan_in_fan_out),
                         lora_A as peft initialises it, lora_B normal (std 60: tiny-gpt2's
                         weights are ~0.1 and its hidden size 2, so a smaller B leaves its
                         greedy output as the base's).
tiny_gpt2_lora_ref.json  for each prompt: prompt_ids, peft's greedy generate(do_sample=False,
                         20 new tokens) ids with the adapter, and the base's (they must
                         differ, or the fixture would not show the adapter is applied); the
                         perplexity of tests/fixtures/lm/ppl_text.txt with the adapter at
                         max_len 64, stride 32 (scripts/parity/ppl_reference.py's loop).
llama_tied_lora/         a peft adapter over tests/fixtures/causal/tiny-llama-tied (the model
                         of tests/fixtures/lm/tiny-llama-tied.gguf): r 4, lora_alpha 12,
                         q, k, v, o, gate, up, down; lora_B normal (std 0.2).
llama_tied_lora_ref.safetensors  in.ids (the 12 ids of llama_gguf_ref.safetensors) and
                         out.logits [12, vocab] of peft's model with that adapter (unmerged).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from peft import LoraConfig, get_peft_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ppl_reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "lora")
TINY_GPT2 = os.path.join(ROOT, "..", "shared", "models", "tiny-gpt2")
TIED = os.path.join(ROOT, "tests", "fixtures", "causal", "tiny-llama-tied")
PROMPTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog."]


def save_adapter(model, dir, base_name):
    model.save_pretrained(dir)
    os.remove(os.path.join(dir, "README.md"))  # peft's model card template
    path = os.path.join(dir, "adapter_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = base_name  # no absolute path
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def randomize_b(model, std, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def tiny_gpt2():
    base, tok = ppl_reference.load(TINY_GPT2)
    greedy = {}
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        o = base.generate(ids, do_sample=False, max_new_tokens=20, pad_token_id=tok.eos_token_id)
        greedy[p] = o[0, ids.size(1):].tolist()
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, fan_in_fan_out=True,
                     target_modules=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"],
                     task_type="CAUSAL_LM")
    torch.manual_seed(21)
    model = get_peft_model(base, cfg)
    randomize_b(model, 60.0, 22)
    model.eval()
    save_adapter(model, os.path.join(OUT, "tiny_gpt2_lora"), "tiny-gpt2")
    ref = {"transformers": __import__("transformers").__version__,
           "peft": __import__("peft").__version__, "max_new_tokens": 20, "generate": []}
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            o = model.generate(input_ids=ids, do_sample=False, max_new_tokens=20,
                               pad_token_id=tok.eos_token_id)
        got = o[0, ids.size(1):].tolist()
        assert got != greedy[p], "the adapter does not change the greedy output"
        ref["generate"].append({"prompt": p, "prompt_ids": ids[0].tolist(), "ids": got,
                                "base_ids": greedy[p]})
    text = ppl_reference.read_text(os.path.join(ROOT, "tests", "fixtures", "lm", "ppl_text.txt"))
    enc = tok(text, return_tensors="pt")
    ref["ppl"] = ppl_reference.perplexity(model, enc.input_ids, 64, 32)
    with model.disable_adapter():
        ref["ppl_base"] = ppl_reference.perplexity(model, enc.input_ids, 64, 32)
    with open(os.path.join(OUT, "tiny_gpt2_lora_ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(json.dumps(ref))


def llama_tied():
    base = AutoModelForCausalLM.from_pretrained(TIED, dtype=torch.float32,
                                                attn_implementation="eager")
    cfg = LoraConfig(r=4, lora_alpha=12, lora_dropout=0.0,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"], task_type="CAUSAL_LM")
    torch.manual_seed(31)
    model = get_peft_model(base, cfg)
    randomize_b(model, 0.2, 32)
    model.eval()
    save_adapter(model, os.path.join(OUT, "llama_tied_lora"), "tiny-llama-tied")
    ids = torch.tensor([[5, 17, 33, 2, 63, 0, 41, 8, 8, 29, 50, 12]])
    with torch.no_grad():
        lg = model(input_ids=ids).logits[0]
        with model.disable_adapter():
            lb = model(input_ids=ids).logits[0]
    print(f"llama_tied_lora: logits with vs without the adapter: max |diff| "
          f"{(lg - lb).abs().max().item():.3g}")
    save_file({"in.ids": ids[0].float(), "out.logits": lg.contiguous()},
              os.path.join(OUT, "llama_tied_lora_ref.safetensors"))


def main():
    torch.manual_seed(0)
    print("torch %s, transformers %s, peft %s" % (
        torch.__version__, __import__("transformers").__version__, __import__("peft").__version__))
    tiny_gpt2()
    llama_tied()


if __name__ == "__main__":
    main()

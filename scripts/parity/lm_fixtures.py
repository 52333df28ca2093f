#!/usr/bin/env python3
"""Generates the fixtures of the causal-LM evaluation and generation tests
(tests/trainer/test_llama_gguf.c, tests/evaluator/test_lm.c) with
transformers, float32, eager attention, CPU:

    scripts/fetch-smollm2.sh
    PYTHONPATH=DIR_WITH_gguf_AND_accelerate $(scripts/pyenv.sh parity)/bin/python \\
        scripts/parity/lm_fixtures.py
(gguf and accelerate are in scripts/deps/py-parity.txt; transformers needs
both to load GGUF files.)

Writes into tests/fixtures/lm/:

tiny-llama-tied.gguf     tests/fixtures/causal/tiny-llama-tied (a random Llama
                         shaped like SmolLM2 in miniature: 6 query heads over 2
                         key/value heads of size 6, tied head) converted to a
                         GGUF file (F32) the way convert_hf_to_gguf.py does it:
                         llama.* metadata, llama.cpp tensor names, q_proj and
                         k_proj rows permuted per head for llama.cpp's RoPE.
llama_gguf_ref.safetensors  in.ids (1 x 12) and out.logits of transformers
                         loading that file with gguf_file= (which undoes the
                         permutation), and out.logits_hf of the original
                         folder (the two are equal: F32 round trip).
smollm2_ref.safetensors  SmolLM2-135M-Instruct (the Q4_1 GGUF of
                         scripts/fetch-smollm2.sh) loaded with gguf_file=:
                         for each prompt p: in.ids.p and the logits [T, 49152]
                         as sum.out.logits.p, sumsq.out.logits.p and
                         samp.out.logits.p (1000 elements at flat indices
                         i * numel // 1000), plus out.argmax.p (per position).
generate_ref.json        greedy generate(do_sample=False) ids of tiny-gpt2
                         (../shared/models/tiny-gpt2) and SmolLM2 for a few
                         prompts; SmolLM2's apply_chat_template ids
                         (add_generation_prompt=True) for a few user messages
                         and greedy output from them.
ppl_ref.json             perplexity, nll, tokens, seq_len, windows of
                         ppl_text.txt with scripts/parity/ppl_reference.py's
                         loop (the HF guide's) for tiny-gpt2 at several
                         (max_len, stride) and SmolLM2 at one.
"""
import json
import os
import sys

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ppl_reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "lm")
TINY_GPT2 = os.path.join(ROOT, "..", "shared", "models", "tiny-gpt2")
SMOL_DIR = os.path.join(ROOT, "build", "models", "smollm2-135m")
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAMPLES = 1000

SMOL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
GPT2_PROMPTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog."]
CHAT_PROMPTS = ["What is the capital of France?", "Write a haiku about refineries."]


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def tiny_llama_gguf():
    src = os.path.join(ROOT, "tests", "fixtures", "causal", "tiny-llama-tied")
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    c = hf.config
    path = os.path.join(OUT, "tiny-llama-tied.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama-tied")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(0)  # all F32
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, t in hf.state_dict().items():
        a = t.detach().float().numpy()
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            continue  # tied
        else:
            parts = name.split(".")  # model.layers.N.<module...>.weight
            mod = ".".join(parts[3:-1])
            out = f"blk.{parts[2]}.{names[mod]}.weight"
            if mod == "self_attn.q_proj":
                a = permute(a, c.num_attention_heads, c.num_attention_heads)
            elif mod == "self_attn.k_proj":
                a = permute(a, c.num_attention_heads, c.num_key_value_heads)
        w.add_tensor(out, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gm = AutoModelForCausalLM.from_pretrained(OUT, gguf_file="tiny-llama-tied.gguf",
                                              dtype=torch.float32,
                                              attn_implementation="eager").eval()
    ids = torch.tensor([[5, 17, 33, 2, 63, 0, 41, 8, 8, 29, 50, 12]])
    with torch.no_grad():
        lg, lh = gm(ids).logits[0], hf(ids).logits[0]
    print(f"tiny-llama-tied.gguf: logits via gguf_file= vs the folder: max |diff| "
          f"{(lg - lh).abs().max().item():.3g}")
    save_file({"in.ids": ids[0].float(), "out.logits": lg.contiguous(),
               "out.logits_hf": lh.contiguous()},
              os.path.join(OUT, "llama_gguf_ref.safetensors"))


def put_sampled(out, name, t):
    flat = t.detach().reshape(-1).double()
    n = flat.numel()
    idx = torch.tensor([i * n // SAMPLES for i in range(SAMPLES)])
    out["sum." + name] = flat.sum().float().reshape(1)
    out["sumsq." + name] = (flat * flat).sum().float().reshape(1)
    out["samp." + name] = flat[idx].float().clone()


def smollm2(ref):
    tok = AutoTokenizer.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE)
    m = AutoModelForCausalLM.from_pretrained(SMOL_DIR, gguf_file=SMOL_FILE, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    out = {}
    for i, p in enumerate(SMOL_PROMPTS):
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            lg = m(ids).logits[0]
        out[f"in.ids.{i}"] = ids[0].float()
        out[f"out.argmax.{i}"] = lg.argmax(-1).float()
        put_sampled(out, f"out.logits.{i}", lg)
    save_file(out, os.path.join(OUT, "smollm2_ref.safetensors"))
    gen = []
    for p in SMOL_PROMPTS[:2]:
        ids = tok(p, return_tensors="pt").input_ids
        o = m.generate(ids, do_sample=False, max_new_tokens=24)
        gen.append({"prompt": p, "prompt_ids": ids[0].tolist(),
                    "ids": o[0, ids.size(1):].tolist()})
    chat = []
    for p in CHAT_PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}],
                                      add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        x = torch.tensor([ids])
        o = m.generate(x, do_sample=False, max_new_tokens=24)
        chat.append({"prompt": p, "prompt_ids": list(ids), "ids": o[0, x.size(1):].tolist(),
                     "text": tok.decode(o[0, x.size(1):], skip_special_tokens=True)})
    ref["smollm2"] = {"max_new_tokens": 24, "generate": gen, "chat": chat}
    text = ppl_reference.read_text(os.path.join(OUT, "ppl_text.txt"))
    enc = tok(text, return_tensors="pt")
    ref["smollm2_ppl"] = [ppl_reference.perplexity(m, enc.input_ids, 64, 32)]


def tiny_gpt2(ref):
    model, tok = ppl_reference.load(TINY_GPT2)
    gen = []
    for p in GPT2_PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        o = model.generate(ids, do_sample=False, max_new_tokens=20,
                           pad_token_id=tok.eos_token_id)
        gen.append({"prompt": p, "prompt_ids": ids[0].tolist(),
                    "ids": o[0, ids.size(1):].tolist()})
    ref["tiny_gpt2"] = {"max_new_tokens": 20, "generate": gen}
    text = ppl_reference.read_text(os.path.join(OUT, "ppl_text.txt"))
    enc = tok(text, return_tensors="pt")
    ref["tiny_gpt2_ppl"] = [ppl_reference.perplexity(model, enc.input_ids, ml, st)
                            for ml, st in [(64, 32), (64, 64), (100, 37), (16, 40), (1024, 512)]]


def main():
    torch.manual_seed(0)
    tiny_llama_gguf()
    ref = {"transformers": __import__("transformers").__version__, "torch": torch.__version__}
    tiny_gpt2(ref)
    smollm2(ref)
    gen = {k: ref[k] for k in ("transformers", "torch", "tiny_gpt2", "smollm2")}
    ppl = {k: ref[k] for k in ("transformers", "torch", "tiny_gpt2_ppl", "smollm2_ppl")}
    with open(os.path.join(OUT, "generate_ref.json"), "w") as f:
        json.dump(gen, f, indent=1, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(OUT, "ppl_ref.json"), "w") as f:
        json.dump(ppl, f, indent=1)
        f.write("\n")
    print(json.dumps(ppl, indent=1))
    print(json.dumps({k: v["generate"] for k, v in gen.items() if isinstance(v, dict)}))


if __name__ == "__main__":
    main()

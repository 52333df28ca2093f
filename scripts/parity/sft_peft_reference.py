#!/usr/bin/env python3
"""SFT LoRA reference: peft + the transformers Trainer on the token shards our
tokenizer stage writes, with the hyperparameters of a Refinery SFT run, and
the generated-answer accuracy on the held-out split before and after.

    PYTHONPATH=/tmp/gen-py $(scripts/pyenv.sh parity)/bin/python \\
        scripts/parity/sft_peft_reference.py --data RUN/tokenizer \\
        --model build/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf \\
        [--rank 8 --alpha 16 --dropout 0 --targets q,k,v,o,up,down,gate \\
         --lr 1e-3 --steps N --batch B --max-len L --warmup-ratio 0.1 \\
         --weight-decay 0.0 --max-grad-norm 1.0 --seed 42 --eval-max 0 \\
         --threads 2 --layout doc|pack --json OUT --save-adapter DIR]

DATA is read with numpy alone (no Refinery code): for SPLIT in train, eval,
SPLIT.bin (uint32 ids), SPLIT.idx (tokenizer/shard.h: 64-byte header, 24-byte
records u64 start, u32 len, i32 label, u64 cluster) and SPLIT.mask (one byte
per token, 1 = loss target). A document not ending with the EOS id gets one
appended, a target when its last token is (trainer/lm_data.h's rule).

TRAINING ROWS (--layout):
  doc   (default) one document per row, right-padded to the longest row of
        the batch (attention_mask 0, label -100 on padding). A document longer
        than max_len is cut into pieces of max_len, each its own row starting
        at position 0 with its first token not predicted.
  pack  trainer/lm_data.h's packing exactly: documents concatenated in file
        order and cut into rows of max_len (a long document continues in the
        next row); every document its own segment (position_ids restart at 0,
        its first token not predicted). Passed as position_ids with NO
        attention_mask and use_cache=False (with a cache the detection is
        skipped and documents would attend across), so transformers' masking_utils builds the
        block-diagonal causal mask from the position restarts
        (find_packed_sequence_indices); the script checks this on the first
        row (packed logits == each segment run alone) before training. A short
        last row is padded with a segment of its own (labels -100).
Labels are HF's unshifted labels (the model shifts): id where mask == 1 else
-100, and -100 on the first token of every row and every document.

LOSS: one micro-batch per optimizer step (no accumulation); the Trainer passes
num_items_in_batch (labels[..., 1:] != -100 over the batch) to the model, so
the loss is the sum of token NLLs over the step / the number of predicted
tokens of the step: the mean over the step's target tokens, as train.c.

TRAINER: TrainingArguments(per_device_train_batch_size=B, max_steps=N,
learning_rate, weight_decay, max_grad_norm, lr_scheduler_type
linear, optim adamw_torch, warmup_steps = ceil(warmup_ratio * N) (train.c's
rounding) unless --warmup-steps, seed, use_cpu, report_to [], save_strategy no,
train_sampling_strategy "sequential" (data in file order, every epoch the
same), dataloader_drop_last False). --steps 0 = one epoch.

EVAL (on the base model before training, after on base + adapter, merged with
peft's merge_and_unload as our evaluator merges; --no-merge: unmerged): for every
EVAL document (the first --eval-max, 0 = all): prompt = its ids before the
first mask-1 token; reference = the mask-1 tokens from there up to (not
including) the first id 2 (<|im_end|>) or the first mask-0 token; greedy
generate(prompt, max_new_tokens=len(reference)+4, eos_token_id=2); prediction
= the generated ids before the first id 2; correct when
decode(pred).strip().lower() == decode(reference).strip().lower(). Documents
without a mask-1 token or with an empty reference are skipped and counted.

Prints one JSON line on stdout (also written to --json); progress on stderr. float32, eager attention, CPU.
"""
import argparse
import collections
import contextlib
import json
import math
import os
import sys
import time

import numpy as np
import torch

IM_END = 2
TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
           "up": "up_proj", "down": "down_proj", "gate": "gate_proj"}
IDX_REC = np.dtype([("start", "<u8"), ("len", "<u4"), ("label", "<i4"), ("cluster", "<u8")])


def die(msg):
    print(f"sft_peft_reference: {msg}", file=sys.stderr)
    sys.exit(2)


def read_split(folder, split):
    """[(ids int64 array, mask uint8 array)] per record, and the header."""
    prefix = os.path.join(folder, split)
    for ext in (".bin", ".idx", ".mask"):
        if not os.path.isfile(prefix + ext):
            die(f"{prefix + ext}: missing")
    raw = np.fromfile(prefix + ".idx", dtype=np.uint8)
    if raw.size < 64 or bytes(raw[:8]) != b"RFTOKIDX":
        die(f"{prefix}.idx: not a token shard index (magic)")
    h = raw[:64].tobytes()
    u32 = lambda o: int.from_bytes(h[o:o + 4], "little")
    i32 = lambda o: int.from_bytes(h[o:o + 4], "little", signed=True)
    u64 = lambda o: int.from_bytes(h[o:o + 8], "little")
    hdr = {"version": u32(8), "flags": u32(12), "n_seqs": u64(16), "n_tokens": u64(24),
           "vocab_size": u32(32), "eos_id": i32(36), "pad_id": i32(40), "block_len": u32(44)}
    if hdr["version"] != 1:
        die(f"{prefix}.idx: version {hdr['version']} (expected 1)")
    if raw.size != 64 + 24 * hdr["n_seqs"]:
        die(f"{prefix}.idx: {raw.size} bytes for {hdr['n_seqs']} records")
    recs = np.frombuffer(raw[64:].tobytes(), dtype=IDX_REC)
    ids = np.fromfile(prefix + ".bin", dtype="<u4")
    mask = np.fromfile(prefix + ".mask", dtype=np.uint8)
    if ids.size != hdr["n_tokens"] or mask.size != hdr["n_tokens"]:
        die(f"{prefix}: n_tokens {hdr['n_tokens']}, .bin holds {ids.size}, .mask {mask.size}")
    if mask.size and mask.max() > 1:
        die(f"{prefix}.mask: a byte other than 0/1")
    docs = []
    for r in recs:
        s, n = int(r["start"]), int(r["len"])
        if s + n > ids.size:
            die(f"{prefix}.idx: record [{s}, {s + n}) past the end of .bin")
        docs.append((ids[s:s + n].astype(np.int64), mask[s:s + n].copy()))
    return docs, hdr


def with_eos(docs, eos):
    """lm_data.h: a document not ending with EOS gets one (target iff its last token is)."""
    out = []
    for ids, m in docs:
        if ids.size and ids[-1] != eos:
            ids = np.append(ids, eos)
            m = np.append(m, m[-1])
        out.append((ids, m))
    return out


def doc_rows(docs, max_len):
    """One document per row; longer ones cut into max_len pieces.
    A row: (ids, labels, position_ids) lists."""
    rows = []
    for ids, m in docs:
        for s in range(0, ids.size, max_len):
            pid, pm = ids[s:s + max_len], m[s:s + max_len]
            lab = np.where(pm == 1, pid, -100)
            lab[0] = -100
            rows.append((pid.tolist(), lab.tolist(), list(range(pid.size))))
    return rows


def pack_rows(docs, max_len):
    """lm_data.h's packing: concatenate, cut into rows of max_len, segments per
    document (positions restart, first token of each segment not predicted)."""
    rows = []
    ids_r, lab_r, pos_r = [], [], []
    for ids, m in docs:
        i = 0
        while i < ids.size:
            take = min(max_len - len(ids_r), ids.size - i)
            pid, pm = ids[i:i + take], m[i:i + take]
            lab = np.where(pm == 1, pid, -100)
            lab[0] = -100
            ids_r += pid.tolist()
            lab_r += lab.tolist()
            pos_r += list(range(take))
            i += take
            if len(ids_r) == max_len:
                rows.append((ids_r, lab_r, pos_r))
                ids_r, lab_r, pos_r = [], [], []
    if ids_r:
        rows.append((ids_r, lab_r, pos_r))
    return rows


class Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def make_collate(layout, pad_id):
    def collate(batch):
        T = max(len(r[0]) for r in batch)
        ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
        lab = torch.full((len(batch), T), -100, dtype=torch.long)
        pos = torch.zeros((len(batch), T), dtype=torch.long)
        att = torch.zeros((len(batch), T), dtype=torch.long)
        for b, (i, l, p) in enumerate(batch):
            n = len(i)
            ids[b, :n] = torch.tensor(i)
            lab[b, :n] = torch.tensor(l)
            pos[b, :n] = torch.tensor(p)
            att[b, :n] = 1
            # pack: padding is a segment of its own (positions from 0)
            pos[b, n:] = torch.arange(T - n)
        if layout == "pack":
            # use_cache False: masking_utils skips the packed detection when a cache exists
            return {"input_ids": ids, "labels": lab, "position_ids": pos, "use_cache": False}
        return {"input_ids": ids, "labels": lab, "attention_mask": att}
    return collate


def check_packing(model, rows):
    """The first packed row with >1 segment: its logits equal each segment's
    logits run alone (so the block-diagonal mask is really applied)."""
    for ids, _, pos in rows:
        starts = [t for t, p in enumerate(pos) if p == 0]
        if len(starts) < 2:
            continue
        with torch.no_grad():
            full = model(input_ids=torch.tensor([ids]),
                         position_ids=torch.tensor([pos]), use_cache=False).logits[0]
            worst = 0.0
            for a, b in zip(starts, starts[1:] + [len(ids)]):
                alone = model(input_ids=torch.tensor([ids[a:b]])).logits[0]
                worst = max(worst, (full[a:b] - alone).abs().max().item())
        if worst > 1e-3:
            die(f"packing check failed: packed logits differ from per-segment logits by {worst:g} "
                "(this transformers version does not build the packed mask from position_ids)")
        return {"segments": len(starts), "max_abs_logit_diff": worst}
    return {"segments": 1, "max_abs_logit_diff": None}


def evaluate(model, tok, docs, eval_max):
    model.eval()
    t0 = time.time()
    n = correct = skipped = 0
    preds = collections.Counter()
    for ids, m in (docs[:eval_max] if eval_max > 0 else docs):
        on = np.flatnonzero(m == 1)
        if on.size == 0:
            skipped += 1
            continue
        p = int(on[0])
        e = p
        while e < ids.size and m[e] == 1 and ids[e] != IM_END:
            e += 1
        ref = ids[p:e].tolist()
        if not ref:
            skipped += 1
            continue
        prompt = torch.tensor([ids[:p].tolist()])
        with torch.no_grad():
            out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                 max_new_tokens=len(ref) + 4, do_sample=False,
                                 eos_token_id=IM_END, pad_token_id=IM_END)
        gen = out[0, p:].tolist()
        pred = gen[:gen.index(IM_END)] if IM_END in gen else gen
        ps = tok.decode(pred).strip().lower()
        rs = tok.decode(ref).strip().lower()
        correct += ps == rs
        preds[ps] += 1
        n += 1
    return {"accuracy": correct / n if n else None, "correct": correct, "n": n,
            "skipped": skipped, "top5": preds.most_common(5),
            "seconds": round(time.time() - t0, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--targets", default="q,k,v,o,up,down,gate")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=0, help="0 = one epoch")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--warmup-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=-1, help=">= 0 overrides the ratio")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--eval-max", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layout", choices=("doc", "pack"), default="doc")
    ap.add_argument("--json")
    ap.add_argument("--save-adapter", help="write the peft adapter here")
    ap.add_argument("--no-merge", action="store_true",
                    help="evaluate base + adapter unmerged (default: merge_and_unload first)")
    a = ap.parse_args()

    targets = []
    for t in a.targets.split(","):
        if t.strip() not in TARGETS:
            die(f"--targets: unknown '{t}' (one of {','.join(TARGETS)})")
        targets.append(TARGETS[t.strip()])
    if not os.path.isfile(a.model):
        die(f"--model {a.model}: not a file")
    if a.max_len < 2 or a.batch < 1 or a.steps < 0:
        die("--max-len >= 2, --batch >= 1, --steps >= 0")

    torch.set_num_threads(a.threads)
    import transformers
    import peft
    from transformers import (AutoModelForCausalLM, AutoTokenizer, GgufConfig, Trainer,
                              TrainingArguments, set_seed)
    from peft import LoraConfig, get_peft_model
    transformers.logging.set_verbosity_error()

    t_all = time.time()
    train_docs, th = read_split(a.data, "train")
    eval_docs, eh = read_split(a.data, "eval")
    folder, name = os.path.split(os.path.abspath(a.model))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # dequantize=True: a plain dense fp32 model without an hf_quantizer (the
    # default load gives the same weights, bit for bit, but keeps a GGUF
    # quantizer that the Trainer refuses to train: "do not support training")
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager",
        quantization_config=GgufConfig(gguf_file=name, dequantize=True))
    for mn, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor) and w.dtype != torch.float32:
            die(f"{mn}: weight {w.dtype} after loading (expected float32)")
    if model.is_quantized:
        die("the model loaded with a quantizer attached (expected a dense fp32 model)")
    eos = th["eos_id"] if th["eos_id"] >= 0 else model.config.eos_token_id
    pad = th["pad_id"] if th["pad_id"] >= 0 else eos
    vocab = model.config.vocab_size
    for split, docs in (("train", train_docs), ("eval", eval_docs)):
        if any(d[0].size and d[0].max() >= vocab for d in docs):
            die(f"{split}: a token id >= the model's vocab_size {vocab}")
    train_docs = with_eos(train_docs, eos)
    eval_docs = with_eos(eval_docs, eos)
    rows = (pack_rows if a.layout == "pack" else doc_rows)(train_docs, a.max_len)
    if not rows:
        die("train: no documents")
    n_targets = sum(sum(1 for x in r[1][1:] if x != -100) for r in rows)
    steps = a.steps or -(-len(rows) // a.batch)
    # transformers 5: warmup_steps < 1 is a ratio, ceil(ratio * steps); train.c the same
    warmup = a.warmup_steps if a.warmup_steps >= 0 else math.ceil(a.warmup_ratio * steps)
    t_load = time.time() - t_all

    pack_check = check_packing(model, rows) if a.layout == "pack" else None

    before = evaluate(model, tok, eval_docs, a.eval_max)
    print(f"before: {json.dumps(before)}", file=sys.stderr)

    set_seed(a.seed)
    cfg = LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout,
                     target_modules=targets, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    args = TrainingArguments(
        output_dir=os.path.join("/tmp", f"sft_peft_ref_{os.getpid()}"),
        per_device_train_batch_size=a.batch, gradient_accumulation_steps=1,
        max_steps=steps, learning_rate=a.lr,
        warmup_steps=warmup, weight_decay=a.weight_decay, max_grad_norm=a.max_grad_norm,
        lr_scheduler_type="linear", optim="adamw_torch", seed=a.seed,
        use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
        train_sampling_strategy="sequential", dataloader_drop_last=False,
        dataloader_num_workers=0, remove_unused_columns=False, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(rows),
                      data_collator=make_collate(a.layout, pad))
    t0 = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer's log lines; stdout: the summary
        trainer.train()
    t_train = time.time() - t0
    log = [h for h in trainer.state.log_history if "loss" in h]
    losses = [round(h["loss"], 6) for h in log]
    lrs = [h.get("learning_rate") for h in log]
    if a.save_adapter:
        model.save_pretrained(a.save_adapter)
    if not a.no_merge:
        model = model.merge_and_unload()  # as the evaluator (rf_lm_cache_get_adapter) merges

    after = evaluate(model, tok, eval_docs, a.eval_max)
    print(f"after: {json.dumps(after)}", file=sys.stderr)

    r = {"data": a.data, "model": a.model, "layout": a.layout,
         "train_docs": len(train_docs), "train_rows": len(rows), "train_targets": n_targets,
         "eval_docs": len(eval_docs), "steps": steps, "batch": a.batch, "max_len": a.max_len,
         "rank": a.rank, "alpha": a.alpha, "dropout": a.dropout, "targets": targets,
         "lr": a.lr, "warmup_ratio": a.warmup_ratio, "warmup_steps": warmup, "weight_decay": a.weight_decay,
         "max_grad_norm": a.max_grad_norm, "seed": a.seed, "threads": a.threads,
         "trainable_params": n_trainable, "loss_first": losses[0] if losses else None,
         "loss_last": losses[-1] if losses else None, "losses": losses, "lrs": lrs,
         "before": before, "after": after, "after_merged": not a.no_merge, "pack_check": pack_check,
         "seconds_load": round(t_load, 2), "seconds_train": round(t_train, 2),
         "seconds_total": round(time.time() - t_all, 2),
         "loss_averaging": "mean over the step's predicted tokens (one micro-batch per step, "
                           "num_items_in_batch)",
         "order": "file order, sequential sampler, no shuffle",
         "torch": torch.__version__, "transformers": transformers.__version__,
         "peft": peft.__version__}
    line = json.dumps(r)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()

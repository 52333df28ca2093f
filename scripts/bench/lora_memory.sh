#!/usr/bin/env bash
# Peak memory of fine-tuning SmolLM2-135M (issue 18): full fine-tuning (fp32,
# AdamW over every parameter) against LoRA on an fp32 base, on an int8 base
# and on the 4-bit bases (QLoRA: NF4 with double quantization, and the GGUF's
# own Q4_1 blocks). Each configuration runs in its own process
# (build/trainer/lora_run, so peak RSS is its own): the model loaded from
# scripts/fetch-smollm2.sh's Q4_1 GGUF, LORA_STEPS (default 2) AdamW steps on
# one batch of LORA_BATCH x LORA_SEQ (default 1 x 256) tokens of WikiText-2
# (../shared/data/wikitext2/wiki.valid.raw, SmolLM2's own tokenizer), LoRA
# rank 8, alpha 16, on q, k, v, o, gate, up and down of every layer.
# Prints a Markdown table (also build/bench/lora-memory/table.md) with the
# JSON line of each run in build/bench/lora-memory/runs.jsonl;
# LORA_REPORT_ONLY=1 only rebuilds the table from the last runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared}
BUILD=${BUILD:-build}
seq=${LORA_SEQ:-256}
batch=${LORA_BATCH:-1}
steps=${LORA_STEPS:-2}
text=$SHARED/data/wikitext2/wiki.valid.raw
[ -f "$text" ] || { echo "lora_memory: $text missing" >&2; exit 1; }
[ -x "$BUILD/trainer/lora_run" ] || { echo "lora_memory: run make first" >&2; exit 1; }
model=$(scripts/fetch-smollm2.sh)/SmolLM2-135M-Instruct.Q4_1.gguf
out=$BUILD/bench/lora-memory
mkdir -p "$out"
run() { # NAME ARGS...
    local name=$1
    shift
    echo "== $name" >&2
    "$BUILD/trainer/lora_run" --model "$model" --text "$text" --seq "$seq" --batch "$batch" \
        --steps "$steps" --rank 8 --alpha 16 --targets q,k,v,o,up,down,gate "$@" \
        | tail -n 1 | sed "s/^{/{\"config\": \"$name\", /" >> "$out/runs.jsonl"
}
if [ -z "${LORA_REPORT_ONLY:-}" ]; then
    : > "$out/runs.jsonl"
    run "full fine-tuning (fp32)" --mode full --lr 1e-5
    run "LoRA, fp32 base" --base fp32
    run "LoRA, int8 base" --base int8
    run "QLoRA, NF4 base" --base nf4
    run "QLoRA, Q4_1 base (GGUF blocks)" --base q4_1
fi
python3 - "$out/runs.jsonl" "$seq" "$batch" "$steps" > "$out/table.md" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
seq, batch, steps = sys.argv[2:5]
print("SmolLM2-135M, batch %s x %s tokens, %s AdamW steps, %d threads; MB = 2^20 bytes"
      % (batch, seq, steps, runs[0]["threads"]))
print()
print("| configuration | peak RSS MB | fp32 weights held MB | quantized base MB | trainable "
      "parameters | adapter weights MB | gradients + AdamW moments MB | activations + their "
      "gradients MB | loss after | s/step |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in runs:
    lora = r["mode"] == "lora"
    print("| %s | %.0f | %.0f | %.1f | %s | %.1f | %.1f | %.0f | %.3f | %.1f |" % (
        r["config"], r["peak_rss_mb"], r["base_fp32_mb"], r["base_quantized_mb"],
        format(r["trainable_params"], ","), r["trainable_mb"] if lora else 0.0,
        r["grads_mb"] + r["moments_mb"], r["activations_mb"], r["loss_after"], r["step_s"]))
PY
cat "$out/table.md"

#!/usr/bin/env bash
# LoRA through `refinery train` on the test device cpu-guarded (backend.h: the
# CPU's kernels under another identity, on memory only its slots can touch,
# so the driver, the loop, clipping,
# AdamW, checkpoints and the PEFT export take the device paths of the adapter:
# lora.h) against trainer.device: cpu, for the tiny random GPT-2 on an NF4
# base and the tied Llama on an int8 base with dropout, 8 steps with a
# checkpoint every 4: the logged losses and the exported adapter must be the
# CPU's bit for bit (the kernels being the same). A run resumed from the
# staged run's step-4 checkpoint ends on the same adapter too.
set -euo pipefail
bin=$REFINERY_BIN
root=$REFINERY_ROOT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

. "$REFINERY_ROOT/tests/trainer/causal_lib.sh"
causal_models tiny-gpt2-rand tiny-llama-tied
lm_jsonl data.jsonl

spec() { # spec NAME MODEL DEVICE LORA [EXTRA_LINE]
    printf 'trainer:\n  task: causal_lm\n  model: %s\n  train: data.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.01\n  weight_decay: 0.01\n  clip_norm: 0.5\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 4\n  lora: %s\n%b' \
        "$2" "$1" "$3" "$4" "${5:-}" > "$1.yaml"
}
same() { # same RUN_A RUN_B WHAT
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, what = sys.argv[1:]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl")]
assert len(la) == 8 and la == lb, (what, la, lb)
print("%s: %d losses equal (%.6f -> %.6f)" % (what, len(la), la[0], la[-1]))
PY
    cmp "$1/model/adapter_model.safetensors" "$2/model/adapter_model.safetensors"
    cmp "$1/model/adapter_config.json" "$2/model/adapter_config.json"
}

for case in "g tiny-gpt2-rand {rank: 4, alpha: 8, targets: [q, k, v, o, up, down], base: nf4}" \
            "l tiny-llama-tied {rank: 4, alpha: 8, dropout: 0.1, targets: [q, k, v, o, gate, up, down], base: int8}"; do
    read -r n model lora <<<"$case"
    spec "${n}c" "$model" cpu "$lora"
    spec "${n}d" "$model" cpu-guarded "$lora"
    "$bin" train "${n}c.yaml" 2>"${n}c.log" || { cat "${n}c.log"; exit 1; }
    "$bin" train "${n}d.yaml" 2>"${n}d.log" || { cat "${n}d.log"; exit 1; }
    same "${n}c" "${n}d" "$model LoRA on cpu-guarded vs cpu"
done
# stopped after 4 steps on cpu-guarded, resumed from its checkpoint there
spec gr tiny-gpt2-rand cpu-guarded "{rank: 4, alpha: 8, targets: [q, k, v, o, up, down], base: nf4}" "  stop_after: 4\n"
"$bin" train gr.yaml 2>gr.log || { cat gr.log; exit 1; }
test ! -e gr/model/adapter_model.safetensors
sed -i '/stop_after/d' gr.yaml
"$bin" train gr.yaml 2>gr2.log || { cat gr2.log; exit 1; }
cmp gc/model/adapter_model.safetensors gr/model/adapter_model.safetensors
echo "tiny-gpt2-rand LoRA on cpu-guarded stopped at step 4 and resumed: the uninterrupted CPU run's adapter"

echo "lora_device_run.test.sh: ok"

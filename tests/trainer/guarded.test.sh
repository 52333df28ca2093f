#!/usr/bin/env bash
# `refinery train` on the test device cpu-guarded (backend.h,
# backend_guarded.c: the CPU's kernels on buffers that only the backend's
# slots and the collectives can read or write; any other host access is a
# SIGSEGV naming the buffer), against trainer.device: cpu, for the full
# fine-tuning of every model: the tiny BERT classifier with dropout, class
# weights and the evaluation of its export, the random GPT-2 and the tied
# Llama with the perplexity evaluation; each with checkpoints and clipping. A
# run that ends here went through the backend for every touch of model memory
# (issue 14: "the training step runs entirely through the backend"), and its
# losses, export and evaluation must be the CPU's bit for bit; so must the
# exports' greedy sample generations (`refinery eval --samples 3 --device`:
# KV-cache inference through the backend's slots, causal_infer.c), the
# report naming the device they ran on. Then a cpu-guarded BERT run stopped
# at step 2 and resumed ends on the uninterrupted CPU run. (LoRA on
# cpu-guarded: lora_device_run.test.sh; data, tensor and pipeline
# parallelism, ZeRO: dp_staged, tp_staged, pp_staged, causal_dp,
# lora_dp_staged.)
set -euo pipefail
bin=$REFINERY_BIN
root=$REFINERY_ROOT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
. "$root/tests/trainer/cls_lib.sh"
. "$root/tests/trainer/causal_lib.sh"
cls_jsonl cls.jsonl
causal_models tiny-gpt2-rand tiny-llama-tied
lm_jsonl lm.jsonl

cls_spec() { # cls_spec NAME DEVICE [EXTRA]
    printf 'trainer:\n  model: %s\n  train: cls.jsonl\n  eval: cls.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: true\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 2\n  class_weights: [1.0, 2.0]\n%b' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" "${3:-}" >"$1.yaml"
}
lm_spec() { # lm_spec NAME MODEL DEVICE
    printf 'trainer:\n  task: causal_lm\n  model: %s\n  train: lm.jsonl\n  eval: lm.jsonl\n  output: %s\n  device: %s\n  epochs: 1\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.01\n  weight_decay: 0.01\n  clip_norm: 0.5\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 2\n' \
        "$2" "$1" "$3" >"$1.yaml"
}
train() { # train NAME
    "$bin" train "$1.yaml" >"$1.out" 2>"$1.log" || { tail -40 "$1.log"; exit 1; }
}
same() { # same CPU_RUN GUARDED_RUN WHAT: losses, exported files, evaluation
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b, what = sys.argv[1:]
la = [json.loads(l)["loss"] for l in open(a + "/metrics.jsonl")]
lb = [json.loads(l)["loss"] for l in open(b + "/metrics.jsonl")]
assert la and la == lb, (what, la, lb)
ea, eb = json.load(open(a + "/eval.json")), json.load(open(b + "/eval.json"))
for e in (ea, eb):
    e.pop("seconds", None), e.pop("model", None)
assert ea == eb, (what, ea, eb)
print("%s: %d losses equal (%.6f -> %.6f), evaluation equal" % (what, len(la), la[0], la[-1]))
PY
    local f
    for f in "$1"/model/*; do cmp "$f" "$2/model/${f##*/}"; done
    echo "  exported: $(cd "$1/model" && ls | tr '\n' ' ')identical"
}

cls_spec bc cpu; train bc
cls_spec bg cpu-guarded; train bg
same bc bg "tiny BERT classifier on cpu-guarded vs cpu"

for case in "g tiny-gpt2-rand" "l tiny-llama-tied"; do
    read -r n model <<<"$case"
    lm_spec "${n}c" "$model" cpu; train "${n}c"
    lm_spec "${n}g" "$model" cpu-guarded; train "${n}g"
    same "${n}c" "${n}g" "$model on cpu-guarded vs cpu"
    # the export's greedy sample generations (KV-cache inference) on each device
    for dev in cpu cpu-guarded; do
        "$bin" eval --model "${n}g/model" --data lm.jsonl --max-len 24 --samples 3 \
            --device $dev >"${n}-$dev.json" 2>"${n}-$dev.log" || { cat "${n}-$dev.log"; exit 1; }
    done
    python3 - "${n}-cpu.json" "${n}-cpu-guarded.json" "$model" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
sa, sb = a["samples"], b["samples"]
assert len(sa) == 3 and all(s["new_tokens"] > 0 for s in sa), sa
assert sa == sb, (sa, sb)
assert (a["samples_device"], b["samples_device"]) == ("cpu", "cpu-guarded"), (a, b)
print("  %s: 3 sample generations (%d new tokens) on cpu-guarded equal the CPU's" %
      (sys.argv[3], sum(s["new_tokens"] for s in sa)))
PY
done

# stopped after 2 steps on cpu-guarded, resumed there from its checkpoint
cls_spec br cpu-guarded '  stop_after: 2\n'; train br
test ! -e br/model/model.safetensors
sed -i '/stop_after/d' br.yaml; train br
grep -q 'resumed from br/checkpoint.bin at step 2' br.log
cmp bc/model/model.safetensors br/model/model.safetensors
echo "tiny BERT on cpu-guarded stopped at step 2 and resumed: the uninterrupted CPU run's weights"

echo "guarded.test.sh: ok"

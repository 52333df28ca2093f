#!/usr/bin/env bash
# Data-parallel LoRA on a device backend's code path (issue 14), checked on
# the CPU under mpirun: the test device cpu-guarded (backend.h: the CPU's
# kernels and host memory under a device's identity, memory that only its
# slots and the collectives can touch) takes the device branches
# of train.c's data-parallel group (the adapter's parameter, gradient and
# moment blocks as backend memory, host access through to_host/to_device,
# the step's scalars staged; MPI carries what NCCL would). dp 2 with the tiny
# random GPT-2 on an NF4 base (zero 1) and the tied Llama on an int8 base with
# adapter dropout (zero 0): the logged losses and the exported PEFT adapter
# must be the cpu group's bit for bit. Then a cpu-guarded group stopped after 4
# steps is resumed by a cpu group and ends on the same adapter. Under ASan
# (REFINERY_SANITIZED=1) the GPT-2 cases only. Skips (77) without mpirun or an
# MPI build.
set -euo pipefail
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"

. "$REFINERY_ROOT/tests/trainer/causal_lib.sh"
causal_models tiny-gpt2-rand tiny-llama-tied
lm_jsonl data.jsonl

spec() { # spec NAME MODEL DEVICE ZERO LORA [EXTRA_LINE]
    printf 'trainer:\n  task: causal_lm\n  model: %s\n  train: data.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.01\n  weight_decay: 0.01\n  clip_norm: 0.5\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 4\n  parallel: {dp: 2, zero: %s}\n  lora: %s\n%b' \
        "$2" "$1" "$3" "$4" "$5" "${6:-}" > "$1.yaml"
}
train() { # train NAME
    mpi -np 2 "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
}
same() { # same RUN_A RUN_B WHAT: every loss and the adapter files bit for bit
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

gl="{rank: 4, alpha: 8, targets: [q, k, v, o, up, down], base: nf4}"
ll="{rank: 4, alpha: 8, dropout: 0.1, targets: [q, k, v, o, gate, up, down], base: int8}"
spec gc tiny-gpt2-rand cpu 1 "$gl"; train gc
spec gd tiny-gpt2-rand cpu-guarded 1 "$gl"; train gd
grep -q "rank 1 of 2" gd.log
same gc gd "gpt2 nf4 LoRA dp2 zero1 cpu-guarded vs cpu"
if [ -z "${REFINERY_SANITIZED:-}" ]; then
    spec lc tiny-llama-tied cpu 0 "$ll"; train lc
    spec ld tiny-llama-tied cpu-guarded 0 "$ll"; train ld
    same lc ld "tied llama int8 LoRA + dropout dp2 zero0 cpu-guarded vs cpu"
fi

# 4 steps on cpu-guarded, the rest on the cpu group
spec gr tiny-gpt2-rand cpu-guarded 1 "$gl" "  stop_after: 4\n"; train gr
test ! -e gr/model/adapter_model.safetensors
spec gr tiny-gpt2-rand cpu 1 "$gl"; train gr
test "$(grep -c 'resumed from' gr.log)" -ge 1
cmp gc/model/adapter_model.safetensors gr/model/adapter_model.safetensors
echo "gpt2 nf4 LoRA dp2: cpu-guarded stopped at step 4, resumed by a cpu group: the uninterrupted run's adapter"
echo "lora_dp_staged.test.sh: ok"

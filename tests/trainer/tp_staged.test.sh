#!/usr/bin/env bash
# Tensor parallelism on a device backend's code path (issue 14), checked on
# the CPU: on the test device cpu-guarded (backend.h: the CPU's kernels and
# host memory under a device's identity, memory that only its slots and the
# collectives can touch) a model's tp shard is the backend's memory, cut on
# the host through to_host/to_device (model_tp.c), and its layers run tp.h's
# ops through the backend's slots (linear_ld_*, embed_rows_*, embed_add_fwd,
# vxent_*, attention on the local heads), the all-reduces on backend buffers
# after a wait for its queue, while MPI carries what NCCL would on a GPU.
# Each mesh on cpu-guarded must give the cpu run's loss at every step and its
# final weights bit for bit. Meshes: tiny BERT tp 2 (dropout on: attention
# masks per global head; and off), dp 2 x tp 2 (zero 1) and tp 2 x pp 2
# (2 micro-batches); the random GPT-2 (learned positions) and the tied Llama
# (its head reads the split embedding) at tp 2, and GPT-2 at dp 2 x tp 2 and
# tp 2 x pp 2: the vocabulary-parallel embedding and cross-entropy on the
# device. Then a checkpoint crosses the two: a cpu-guarded BERT tp 2 group
# stopped after 2 steps, resumed by a cpu group, ends on the uninterrupted
# cpu run bit for bit. Under ASan (REFINERY_SANITIZED=1) BERT tp 2 with
# dropout, GPT-2 and Llama tp 2 and the crossing only. Skips (77) without
# mpirun or an MPI build.
set -euo pipefail
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"
export REFINERY_COMM_SYNC_SEND=1 # comm.h: sends complete once matched, as NCCL's (tp x pp)

# cls_lib.sh's data: 21 sequences, batch 8 x accum 2, 2 epochs = 4 steps
. "$REFINERY_ROOT/tests/trainer/cls_lib.sh"
cls_jsonl data.jsonl
# the random GPT-2 and the tied Llama with a 64-word vocab.txt, and 40
# documents (causal_lib.sh)
. "$REFINERY_ROOT/tests/trainer/causal_lib.sh"
causal_models tiny-gpt2-rand tiny-llama-tied
lm_jsonl lm.jsonl

spec() { # spec NAME DEVICE PARALLEL DROPOUT [extra yaml lines]
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: %s\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 1\n  class_weights: [1.0, 2.0]\n  parallel: %s\n%s' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" "$4" "$3" "${5:-}" > "$1.yaml"
}
lmspec() { # lmspec NAME MODEL DEVICE PARALLEL
    printf 'trainer:\n  task: causal_lm\n  model: %s\n  train: lm.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.5\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 4\n  parallel: %s\n' \
        "$2" "$1" "$3" "$4" > "$1.yaml"
}
train() { # train NAME NP
    mpi -np "$2" "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
}
same() { # same WHAT REF RUN: bit for bit
    echo -n "$1: "; cmp_runs "$2" "$3" 0 | tee cmp.out; grep -q bitwise cmp.out
}

meshes=("tp2d|2|{tp: 2}|true")
[ -n "${REFINERY_SANITIZED:-}" ] || meshes+=("tp2|2|{tp: 2}|false"
    "dp2tp2|4|{dp: 2, tp: 2, zero: 1}|true"
    "tp2pp2|4|{tp: 2, pp: 2, microbatches: 2}|true")
for c in "${meshes[@]}"; do
    IFS='|' read -r n np par drop <<< "$c"
    spec "c$n" cpu "$par" "$drop"; train "c$n" "$np"
    spec "s$n" cpu-guarded "$par" "$drop"; train "s$n" "$np"
    test "$(wc -l < "s$n/metrics.jsonl")" = 4
    grep -q "mesh dp [12] x tp 2 x pp [12]" "s$n.log"
    same "bert $par dropout $drop, cpu-guarded vs cpu" "c$n" "s$n"
done

lmeshes=("g|tiny-gpt2-rand|2|{tp: 2}" "l|tiny-llama-tied|2|{tp: 2}")
[ -n "${REFINERY_SANITIZED:-}" ] || lmeshes+=("gdp|tiny-gpt2-rand|4|{dp: 2, tp: 2, zero: 1}"
    "gpp|tiny-gpt2-rand|4|{tp: 2, pp: 2, microbatches: 2}")
for c in "${lmeshes[@]}"; do
    IFS='|' read -r n model np par <<< "$c"
    lmspec "c$n" "$model" cpu "$par"; train "c$n" "$np"
    lmspec "s$n" "$model" cpu-guarded "$par"; train "s$n" "$np"
    test "$(wc -l < "s$n/metrics.jsonl")" = 8
    grep -q "mesh dp [12] x tp 2 x pp [12]" "s$n.log"
    same "$model $par, cpu-guarded vs cpu" "c$n" "s$n"
done

# a checkpoint across the two (tp 2, dropout on): 2 steps on cpu-guarded,
# the rest on cpu; it must end as the uninterrupted cpu run does
spec x1 cpu-guarded '{tp: 2}' true $'  stop_after: 2\n'; train x1 2
test "$(ls x1/checkpoint.d)" = step-00000002
spec x1 cpu '{tp: 2}' true; train x1 2
test "$(grep -c 'resumed from x1/checkpoint.bin at step 2' x1.log)" = 2
same "cpu-guarded tp2 2 steps, then cpu tp2" ctp2d x1

if [ -n "${REFINERY_SANITIZED:-}" ]; then echo "tp_staged.test.sh: ok (reduced set under ASan)"; exit 0; fi
echo "tp_staged.test.sh: ok"

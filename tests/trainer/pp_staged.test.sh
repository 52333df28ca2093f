#!/usr/bin/env bash
# Pipeline parallelism on a device backend's code path (issue 14), checked on
# the CPU: on the test device cpu-guarded (backend.h: the CPU's kernels and
# host memory under a device's identity, memory that only its slots and the
# collectives can touch) the mesh trainer (parallel.c) takes
# every branch it takes for a GPU: the stage's blocks and the tied
# embedding's copy from be->alloc, the boundaries in backend memory moved by
# the paired executor (pipeline.h; under synchronous sends, as NCCL's: a
# schedule that needed MPI's buffering would time out), the norm by the backend's
# sumsq, the tied gradient added by a slot, the initial weights, checkpoints
# and the final gather through host copies (to_host/to_device), while MPI
# carries what NCCL would on a GPU. Dropout off: each mesh on
# cpu-guarded must give the cpu run's loss at every step and its final weights
# bit for bit (the same kernels, reductions and order). Meshes: tiny BERT pp
# 2 x 2 micro-batches and dp 2 x pp 2 (zero 1); the tied GPT-2 pp 2 (its LM
# head's copy of the word embedding crosses the stages) and dp 2 x pp 2
# (zero 2). Then checkpoints cross the two: a cpu-guarded pp 2 group stopped
# after 2 steps, resumed by a cpu group, and the reverse, each ending on the
# uninterrupted cpu run bit for bit. Under ASan (REFINERY_SANITIZED=1) the
# BERT pp 2 pair and the first crossing only. Skips (77) without mpirun or an
# MPI build.
set -euo pipefail
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"
export REFINERY_COMM_SYNC_SEND=1 # comm.h: sends complete once matched, as NCCL's

# cls_lib.sh's data: 21 sequences, batch 8 x accum 2, 2 epochs = 4 steps
. "$REFINERY_ROOT/tests/trainer/cls_lib.sh"
cls_jsonl data.jsonl
# the tied GPT-2 with a 64-word vocab.txt, and 40 documents (causal_lib.sh)
. "$REFINERY_ROOT/tests/trainer/causal_lib.sh"
causal_models tiny-gpt2-rand
lm_jsonl lm.jsonl

spec() { # spec NAME DEVICE PARALLEL [extra yaml lines]
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 1\n  class_weights: [1.0, 2.0]\n  parallel: %s\n%s' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" "$3" "${4:-}" > "$1.yaml"
}
lmspec() { # lmspec NAME DEVICE PARALLEL
    printf 'trainer:\n  task: causal_lm\n  model: tiny-gpt2-rand\n  train: lm.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.5\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 4\n  parallel: %s\n' \
        "$1" "$2" "$3" > "$1.yaml"
}
train() { # train NAME NP
    mpi -np "$2" "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
}
same() { # same WHAT REF RUN: bit for bit
    echo -n "$1: "; cmp_runs "$2" "$3" 0 | tee cmp.out; grep -q bitwise cmp.out
}

meshes=("bpp2:2:{pp: 2, microbatches: 2}")
[ -n "${REFINERY_SANITIZED:-}" ] || meshes+=("bdp2pp2:4:{dp: 2, pp: 2, zero: 1, microbatches: 2}")
for c in "${meshes[@]}"; do
    n=${c%%:*} rest=${c#*:}; np=${rest%%:*} par=${rest#*:}
    spec "c$n" cpu "$par"; train "c$n" "$np"
    spec "s$n" cpu-guarded "$par"; train "s$n" "$np"
    test "$(wc -l < "s$n/metrics.jsonl")" = 4
    grep -q "mesh dp [12] x tp 1 x pp 2" "s$n.log"
    same "bert $par cpu-guarded vs cpu" "c$n" "s$n"
done
if [ -z "${REFINERY_SANITIZED:-}" ]; then
    for c in "gpp2:2:{pp: 2, microbatches: 2}" "gdp2pp2:4:{dp: 2, pp: 2, zero: 2, microbatches: 2}"; do
        n=${c%%:*} rest=${c#*:}; np=${rest%%:*} par=${rest#*:}
        lmspec "c$n" cpu "$par"; train "c$n" "$np"
        lmspec "s$n" cpu-guarded "$par"; train "s$n" "$np"
        test "$(wc -l < "s$n/metrics.jsonl")" = 8
        same "tied gpt2 $par cpu-guarded vs cpu" "c$n" "s$n"
    done
fi

# checkpoints across the two (pp 2 x 2 micro-batches): 2 steps on one, the
# rest on the other; each must end as the uninterrupted cpu run does
spec x1 cpu-guarded '{pp: 2, microbatches: 2}' $'  stop_after: 2\n'; train x1 2
test "$(ls x1/checkpoint.d)" = step-00000002
spec x1 cpu '{pp: 2, microbatches: 2}'; train x1 2
test "$(grep -c 'resumed from x1/checkpoint.bin at step 2' x1.log)" = 2
same "cpu-guarded pp2 2 steps, then cpu pp2" cbpp2 x1
if [ -n "${REFINERY_SANITIZED:-}" ]; then echo "pp_staged.test.sh: ok (reduced set under ASan)"; exit 0; fi
spec x2 cpu '{pp: 2, microbatches: 2}' $'  stop_after: 2\n'; train x2 2
spec x2 cpu-guarded '{pp: 2, microbatches: 2}'; train x2 2
test "$(grep -c 'resumed from x2/checkpoint.bin at step 2' x2.log)" = 2
same "cpu pp2 2 steps, then cpu-guarded pp2" cbpp2 x2
echo "pp_staged.test.sh: ok"

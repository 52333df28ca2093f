#!/usr/bin/env bash
# Data parallelism on a device backend's code path (issue 14), checked on the
# CPU: the test device cpu-guarded (backend.h) is the CPU's kernels and host
# memory under an identity of its own, memory that only its slots and the
# collectives can touch (a stray host access dies: backend_guarded.c), so the
# trainer takes every branch it
# takes for a GPU (shards, unit buffers and scalars from be->alloc, host
# access through to_host/to_device, checkpoint pieces staged to the host)
# while MPI carries the collectives (NCCL needs a GPU; it never ran here).
# On the tiny BERT fixture, dropout off: dp2 at zero 0, 1, 2 and 3 with
# device cpu-guarded against device cpu must give the same loss at every step
# and the same final weights, bit for bit (the same kernels and the same
# reductions in the same order). Then checkpoints cross the two: 2 steps of a
# cpu-guarded group resumed by a cpu group, and the reverse, each against the
# uninterrupted cpu run. Under ASan (REFINERY_SANITIZED=1, where each launch
# takes ~7 s) zero 1 and 3 and the first crossing only: the flat and the
# per-unit paths. Skips (77) without mpirun or an MPI build.
set -euo pipefail
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"

# 21 sequences of uneven lengths: batch 8 x accum 2, 2 epochs = 4 steps, a
# short last micro-batch (5 rows: the ranks' loss shares differ)
. "$REFINERY_ROOT/tests/trainer/cls_lib.sh"
cls_jsonl data.jsonl

spec() { # spec NAME DEVICE ZERO [extra yaml lines]
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  device: %s\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 1\n  class_weights: [1.0, 2.0]\n  parallel: {dp: 2, zero: %s}\n%s' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" "$3" "${4:-}" > "$1.yaml"
}
train() { # train NAME
    mpi -np 2 "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
}

zeros="0 1 2 3"
[ -z "${REFINERY_SANITIZED:-}" ] || zeros="1 3"
for z in $zeros; do
    spec "c$z" cpu $z; train "c$z"
    spec "s$z" cpu-guarded $z; train "s$z"
    test "$(wc -l < "s$z/metrics.jsonl")" = 4
    echo -n "dp2 zero$z cpu-guarded vs cpu: "; cmp_runs "c$z" "s$z" 0 | tee cmp.out; grep -q bitwise cmp.out
done

# checkpoints across the two: stop a cpu-guarded group after 2 steps and
# resume with a cpu group (zero 3 -> zero 1), and the reverse (zero 1 ->
# zero 2 on cpu-guarded); both must end as the uninterrupted cpu run does
spec x1 cpu-guarded 3 $'  stop_after: 2\n'; train x1
test "$(ls x1/checkpoint.d)" = step-00000002
spec x1 cpu 1; train x1
test "$(grep -c 'resumed from x1/checkpoint.bin at step 2' x1.log)" = 2
echo -n "cpu-guarded zero3 2 steps, then cpu zero1: "; cmp_runs c1 x1
if [ -n "${REFINERY_SANITIZED:-}" ]; then echo "dp_staged.test.sh: ok (reduced set under ASan)"; exit 0; fi
spec x2 cpu 1 $'  stop_after: 2\n'; train x2
spec x2 cpu-guarded 2; train x2
test "$(grep -c 'resumed from x2/checkpoint.bin at step 2' x2.log)" = 2
echo -n "cpu zero1 2 steps, then cpu-guarded zero2: "; cmp_runs c2 x2
# the same layout both ways is the same computation: bitwise
spec x3 cpu-guarded 0 $'  stop_after: 2\n'; train x3
spec x3 cpu 0; train x3
echo -n "cpu-guarded zero0 2 steps, then cpu zero0: "; cmp_runs c0 x3 0 | tee cmp.out; grep -q bitwise cmp.out

echo "dp_staged.test.sh: ok"

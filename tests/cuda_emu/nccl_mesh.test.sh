#!/usr/bin/env bash
# The trainer's multi-GPU paths on emulated GPUs: `refinery train` with
# trainer.device: cuda from the CUDA=emu build ($BUILD-emu/refinery, made by
# make test), under scripts/mpirun.sh, each process standing for one GPU and
# cuda_emu's NCCL carrying the device collectives between them over MPI
# (cuemu_nccl.cc): the NCCL twins of the data, tensor and pipeline groups,
# ordered after the backend's stream, ZeRO's reduce-scatters and gathers, the
# paired pipeline executor's grouped send-receive. Each mesh must match the
# single emulated GPU: the loss at every step and the exported weights within
# 1e-5 relative (dp_compare.py; GPT-2's key biases, whose gradient is
# analytically zero, within lr x steps absolute, as causal_dp.test.sh). The
# tiny BERT classifier: dp 2 at ZeRO 0, 1 and 3, pp 2, dp 2 x pp 2, tp 2; the
# tiny GPT-2: dp 2 at ZeRO 2, pp 2, tp 2. Under ASan (REFINERY_SANITIZED) dp
# 2 ZeRO 1 and pp 2 only. Then the host waits per step of three meshes (tp
# 2, ZeRO 3, pp 2, and one GPU; ZeRO 3 only under ASan). This is NCCL's API
# on MPI, not NCCL: no GPU, no NVLink, no NCCL kernels
# (tests/cuda_emu/README.md).
set -euo pipefail
export REFINERY_BIN=${REFINERY_BUILD:?}-emu/refinery
[ -x "$REFINERY_BIN" ] || { echo "SKIP: $REFINERY_BIN is not built (make test builds it with CUDA=emu)"; exit 77; }
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"
. "$REFINERY_ROOT/tests/trainer/cls_lib.sh"
. "$REFINERY_ROOT/tests/trainer/causal_lib.sh"
cls_jsonl data.jsonl
causal_models tiny-gpt2-rand
lm_jsonl lm.jsonl

spec() { # spec NAME PARALLEL
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  device: cuda\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 1\n  class_weights: [1.0, 2.0]\n  parallel: %s\n' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" >"$1.yaml"
}
lmspec() { # lmspec NAME PARALLEL
    printf 'trainer:\n  task: causal_lm\n  model: tiny-gpt2-rand\n  train: lm.jsonl\n  output: %s\n  device: cuda\n  epochs: 2\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.5\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 4\n  parallel: %s\n' \
        "$1" "$2" >"$1.yaml"
}
train() { # train NAME NP
    local t0=$SECONDS
    mpi -np "$2" "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
    grep -q "collectives on cuda memory by nccl" "$1.log" || [ "$2" = 1 ] ||
        { echo "$1: the device collectives did not go through NCCL"; exit 1; }
    echo -n "$1 ($2 processes, $((SECONDS - t0)) s): "
}

spec b1 '{dp: 1}'; train b1 1; echo "one emulated GPU"
lmspec g1 '{dp: 1}'; train g1 1; echo "one emulated GPU"
bert=("bz1:2:{dp: 2, zero: 1}" "bpp2:2:{pp: 2, microbatches: 2}")
gpt=()
if [ -z "${REFINERY_SANITIZED:-}" ]; then
    bert+=("bz0:2:{dp: 2, zero: 0}" "bz3:2:{dp: 2, zero: 3}" "bdp2pp2:4:{dp: 2, pp: 2, zero: 1, microbatches: 2}"
        "btp2:2:{tp: 2}")
    gpt=("gz2:2:{dp: 2, zero: 2}" "gpp2:2:{pp: 2, microbatches: 2}" "gtp2:2:{tp: 2}")
fi
for c in "${bert[@]}"; do
    n=${c%%:*} rest=${c#*:}; np=${rest%%:*} par=${rest#*:}
    spec "$n" "$par"; train "$n" "$np"
    test "$(wc -l <"$n/metrics.jsonl")" = 4
    echo -n "bert $par vs one: "; cmp_runs b1 "$n"
done
for c in ${gpt[@]+"${gpt[@]}"}; do
    n=${c%%:*} rest=${c#*:}; np=${rest%%:*} par=${rest#*:}
    lmspec "$n" "$par"; train "$n" "$np"
    test "$(wc -l <"$n/metrics.jsonl")" = 8
    echo -n "gpt2 $par vs one: "; cmp_runs g1 "$n" --abs-mid-third c_attn.bias 0.024
done

# Host waits per optimizer step: the emulator counts the calls that make the
# host wait for a GPU (stream and device synchronisations, cudaMemcpy,
# cudaFree; CUEMU_STATS), here of one mesh run for 1 and for 3 epochs, one
# micro-batch a step (pp: two), no checkpoints. At most 8 per extra step on
# the busiest rank (measured 3-7: each micro-batch's one upload of its inputs
# and its loss, the norm read once the update is queued, the logged loss's
# all-reduce; 3 on one GPU). Before: a norm summed per tensor took 170 at tp
# 2, ZeRO-3's unit buffers allocated and freed per unit 45, an upload per
# input (ids, types, mask, labels) 6 on one GPU, ZeRO 3's norm brought to the
# host before and after its all-reduce 9. The device operations (kernels,
# cuBLAS calls, asynchronous copies and memsets; NCCL's not counted) at most
# 190 per step (measured 126 on one GPU, 141-147 on the meshes, 176-197
# before the attention's head copies and the [CLS] rows took one launch each;
# each is a host API call and a command in a GPU's stream): an op launched
# per tensor or per row would exceed it.
waits() { # waits NAME NP: the largest counts over the ranks (waits, operations)
    CUEMU_STATS=1 mpi -np "$2" "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
    grep -o "cuda_emu: [0-9]* host waits, [0-9]* device operations" "$1.log" |
        awk '$2 > w {w = $2} $5 > o {o = $5} END {print w + 0, o + 0}'
}
wmesh=("wz3:2:{dp: 2, zero: 3}")
[ -n "${REFINERY_SANITIZED:-}" ] || wmesh+=("wtp:2:{tp: 2}" "wpp:2:{pp: 2, microbatches: 2}" "w1:1:{dp: 1}")
for c in "${wmesh[@]}"; do
    n=${c%%:*} rest=${c#*:}; np=${rest%%:*} par=${rest#*:}
    for e in 1 3; do
        spec "$n$e" "$par"
        sed -i "s/^  epochs: .*/  epochs: $e/; s/^  grad_accum: .*/  grad_accum: 1/; s/^  checkpoint_every: .*/  checkpoint_every: 0/" "$n$e.yaml"
    done
    read -r w1 o1 <<<"$(waits "${n}1" "$np")"
    read -r w3 o3 <<<"$(waits "${n}3" "$np")"
    s1=$(wc -l <"${n}1/metrics.jsonl") s3=$(wc -l <"${n}3/metrics.jsonl")
    [ "$w1" -gt 0 ] && [ "$o1" -gt 0 ] && [ "$s3" -gt "$s1" ] || { echo "$n: no count ($w1 waits, $o1 operations) or no extra step ($s1, $s3)"; exit 1; }
    per=$(((w3 - w1 + s3 - s1 - 1) / (s3 - s1))) ops=$(((o3 - o1 + s3 - s1 - 1) / (s3 - s1)))
    echo "bert $par ($np processes): $w1 host waits in $s1 steps, $w3 in $s3: $per per step (at most 8); $ops device operations per step (at most 190)"
    [ "$per" -le 8 ] || { echo "$n: $per host waits per step"; exit 1; }
    [ "$ops" -le 190 ] || { echo "$n: $ops device operations per step"; exit 1; }
done
echo "nccl_mesh.test.sh: ok${REFINERY_SANITIZED:+ (reduced set under ASan)}"

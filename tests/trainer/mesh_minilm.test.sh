#!/usr/bin/env bash
# Tensor and pipeline parallelism (issue 17) on the pretrained MiniLM-L6: 3
# steps (the first at lr 0: warmup) of batch 8 at max_len 16, dropout off,
# `refinery train` on the meshes tp 2, pp 2 with 4 micro-batches, dp 2 x tp 2,
# tp 2 x pp 2 and dp 2 x pp 2 at zero 1 under scripts/mpirun.sh against one
# process: the loss at every step and every weight within 1e-5 relative (per
# tensor, to its largest weight; dp_compare.py), with two tensors held to an
# absolute bound instead, as dp_minilm.test.sh does and for the same reason:
# the attention key biases (analytically zero gradient: both sides hold
# round-off noise that AdamW turns into steps of about lr; 2 x lr x steps)
# and the pooler bias, which is all zero in MiniLM's checkpoint, so after the
# run it holds nothing but the two AdamW updates, lr m/(sqrt(v) + eps) each,
# whose gradient (a sum over the batch with cancellation between the labels)
# carries rounding differences of ~1e-5 of itself between any two summation
# orders: 1e-8 absolute (its values are ~1.5e-4; the data-parallel path of
# train.c at dp 4 differs by the same 1e-5 relative on this batch). Kept
# small for CI; not under ASan (mesh.test.sh runs the tiny model there).
# Skips (77) without mpirun, MPI, or the MiniLM weights (scripts/fetch-minilm.sh).
set -euo pipefail
bin=$REFINERY_BIN
root=$REFINERY_ROOT
model=$root/build/models/minilm-l6
[ -z "${REFINERY_SANITIZED:-}" ] || { echo "SKIP: MiniLM is not run under ASan (mesh.test.sh runs the tiny model)"; exit 77; }
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
ldd "$bin" | grep libmpi >/dev/null || { echo "SKIP: $bin was built without MPI"; exit 77; }
[ -f "$model/model.safetensors" ] || { echo "SKIP: no MiniLM weights at $model (scripts/fetch-minilm.sh)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
export REFINERY_COMM_TIMEOUT=120
t_start=$(date +%s)

python3 - data.jsonl <<'PY'
import random, sys
random.seed(5)
pos, neg = ["good", "great", "fun", "brilliant"], ["bad", "awful", "boring", "dull"]
filler = "the a movie film plot actor story scene music ending is was very really".split()
with open(sys.argv[1], "w") as f:
    for i in range(29):
        y = i % 2
        words = random.sample(filler, random.randint(2, 9)) + [random.choice(pos if y else neg)]
        random.shuffle(words)
        f.write('{"id":"m%d","text":"%s","label":%d}\n' % (i, " ".join(words), y))
PY
lr=0.0001
steps=3
spec() { # spec NAME PARALLEL
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  max_steps: %s\n  batch_size: 8\n  grad_accum: 1\n  lr: %s\n  warmup_ratio: 0.3\n  weight_decay: 0.01\n  clip_norm: 1.0\n  dropout: false\n  shuffle: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 0\n  parallel: %s\n' \
        "$model" "$1" "$steps" "$lr" "$2" > "$1.yaml"
}
spec one '{dp: 1}'
"$bin" train one.yaml 2>one.log || { tail -5 one.log; exit 1; }
test "$(wc -l < one/metrics.jsonl)" = $steps
key_tol=$(python3 -c "print(2 * $lr * $steps)")
# the stages are given ([3, 3]) except at tp 2 x pp 2, which measures them
for cfg in "tp2:2:{tp: 2}" "pp2m4:2:{pp: 2, microbatches: 4, stages: [3, 3]}" \
           "dp2tp2:4:{dp: 2, tp: 2}" "tp2pp2:4:{tp: 2, pp: 2, microbatches: 2}" \
           "dp2pp2z1:4:{dp: 2, pp: 2, zero: 1, microbatches: 2, stages: [3, 3]}"; do
    name=${cfg%%:*} rest=${cfg#*:}; np=${rest%%:*} par=${rest#*:}
    spec "$name" "$par"
    "$root/scripts/mpirun.sh" -np "$np" "$bin" train "$name.yaml" 2>"$name.log" || { tail -20 "$name.log"; exit 1; }
    echo -n "MiniLM $par vs 1 process: "
    python3 "$root/tests/trainer/dp_compare.py" one "$name" 1e-5 --abs 'attention.self.key.bias' "$key_tol" \
        --abs 'pooler.dense.bias' 1e-8
done
grep -o 'stages (balanced by measured cost): [^"]*' tp2pp2.log
echo "mesh_minilm.test.sh: ok ($(( $(date +%s) - t_start )) s)"

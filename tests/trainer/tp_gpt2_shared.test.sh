#!/usr/bin/env bash
# Tensor parallelism on the pretrained tiny-gpt2 of ../shared (2 heads of 1
# channel, a 50,257-id vocabulary: odd, so tp rank 1's word-embedding block
# ends in a zero padding row that the vocabulary-parallel head and loss must
# ignore): `refinery train` at tp 2 and tp 2 x pp 2 for 4 steps on 24 short
# documents (the ids of a 64-word vocab.txt) must equal one process within
# 1e-5 relative (loss per step, exported weights; the key biases, with an
# analytically zero gradient, to lr x steps absolute). Needs ../shared
# (models/tiny-gpt2) and mpirun; skipped under ASan (the 50,257-id head; the
# same code runs there in tp_causal.test.sh).
set -euo pipefail
[ "${REFINERY_SANITIZED:-0}" = 1 ] && { echo "SKIP: a 50,257-id LM head at 3 runs is slow under ASan; the same code runs there in tp_causal.test.sh"; exit 77; }
[ -d "${SHARED:-}/models/tiny-gpt2" ] || { echo "SKIP: ../shared has no models/tiny-gpt2 (SHARED=${SHARED:-})"; exit 77; }
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"
export OMP_NUM_THREADS=1
mkdir m
cp "$SHARED/models/tiny-gpt2/config.json" "$SHARED/models/tiny-gpt2/model.safetensors" m/
python3 -c 'import sys; open(sys.argv[1], "w").write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["w%d" % i for i in range(5, 64)]) + "\n")' m/vocab.txt
python3 - data.jsonl <<'PY'
import random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:
    for i in range(24):
        n, s = random.randint(3, 20), random.randint(5, 63)
        f.write('{"text":"%s"}\n' % " ".join("w%d" % (5 + (s - 5 + k) % 59) for k in range(n)))
PY
spec() { # spec NAME PARALLEL
    printf 'trainer:\n  task: causal_lm\n  model: m\n  train: data.jsonl\n  output: %s\n  max_steps: 4\n  batch_size: 4\n  grad_accum: 1\n  lr: 0.003\n  weight_decay: 0.01\n  max_len: 16\n  log_every: 0\n  threads: 1\n  parallel: %s\n' \
        "$1" "$2" > "$1.yaml"
}
spec one '{dp: 1}'
"$bin" train one.yaml 2>one.log || { tail -20 one.log; exit 1; }
for r in "tp2|{tp: 2}|2" "tp2pp2|{tp: 2, pp: 2}|4"; do
    IFS="|" read -r name par np <<<"$r"
    spec "$name" "$par"
    timeout -k 5 300 "$root/scripts/mpirun.sh" -np "$np" "$bin" train "$name.yaml" 2>"$name.log" || { tail -20 "$name.log"; exit 1; }
    grep -q "x tp 2 x" "$name.log"
    echo -n "tiny-gpt2 (V 50257) $name vs 1 process: "
    python3 "$root/tests/trainer/dp_compare.py" one "$name" 1e-5 --abs-mid-third c_attn.bias 0.012
done

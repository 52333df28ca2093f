#!/usr/bin/env bash
# Data parallelism and ZeRO on the pretrained MiniLM-L6 (issue 13): a few
# steps at short sequences, dropout off, `refinery train` at dp in {2, 4} x
# zero in {0, 1, 2, 3} under scripts/mpirun.sh against one process: the
# loss at every step and every weight within 1e-5 relative (per tensor, to its
# largest weight), except the attention key biases: their gradient is
# analytically zero (softmax ignores a constant added to every key), so each
# side holds round-off noise there and AdamW turns noise of any size into steps
# of about lr; they get a bound of 2 x lr x steps absolute instead (see the
# trainer README). Kept small for CI (~1 min on 2 cores); not under ASan (the
# tiny model's dp.test.sh covers the same code there). Skips (77) without
# mpirun, MPI, or the MiniLM weights (scripts/fetch-minilm.sh).
set -euo pipefail
bin=$REFINERY_BIN
root=$REFINERY_ROOT
model=$root/build/models/minilm-l6
[ -z "${REFINERY_SANITIZED:-}" ] || { echo "SKIP: MiniLM is not run under ASan (dp.test.sh runs the tiny model)"; exit 77; }
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
ldd "$bin" | grep libmpi >/dev/null || { echo "SKIP: $bin was built without MPI"; exit 77; }
[ -f "$model/model.safetensors" ] || { echo "SKIP: no MiniLM weights at $model (scripts/fetch-minilm.sh)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
export REFINERY_COMM_TIMEOUT=120

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
spec() { # spec NAME DP ZERO
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  max_steps: %s\n  batch_size: 10\n  grad_accum: 1\n  lr: %s\n  warmup_ratio: 0.3\n  weight_decay: 0.01\n  clip_norm: 1.0\n  dropout: false\n  shuffle: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 0\n  parallel: {dp: %s, zero: %s}\n' \
        "$model" "$1" "$steps" "$lr" "$2" "$3" > "$1.yaml"
}
spec one 1 0
"$bin" train one.yaml 2>one.log || { tail -5 one.log; exit 1; }
test "$(wc -l < one/metrics.jsonl)" = $steps
key_tol=$(python3 -c "print(2 * $lr * $steps)")
for cfg in "2 0" "2 1" "2 2" "2 3" "4 0" "4 1" "4 2" "4 3"; do
    set -- $cfg
    spec "d$1z$2" "$1" "$2"
    "$root/scripts/mpirun.sh" -np "$1" "$bin" train "d$1z$2.yaml" 2>"d$1z$2.log" || { tail -20 "d$1z$2.log"; exit 1; }
    echo -n "MiniLM dp$1 zero$2 vs 1 process: "
    python3 "$root/tests/trainer/dp_compare.py" one "d$1z$2" 1e-5 --abs 'attention.self.key.bias' "$key_tol"
done
echo "dp_minilm.test.sh: ok"

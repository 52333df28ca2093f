#!/usr/bin/env bash
# Tensor and pipeline parallelism in `refinery train` (issue 17; parallel.h)
# on the tiny BERT fixture, dropout off, under scripts/mpirun.sh: every mesh
# must give the single process's loss at every step (metrics.jsonl) and its
# final weights (model.safetensors) within 1e-5 relative (dp_compare.py):
# tp 2; pp 2 with 4 micro-batches; dp 2 x tp 2; tp 2 x pp 2; dp 2 x pp 2 at
# zero 1; and tp 4, dp 2 x pp 2 at zero 2, dp 2 x tp 2 x pp 2 at zero 1. Then:
# the bubble and the measured balance are reported; a checkpoint saved at
# tp 2 x pp 2 resumes at 1 process and at dp 4 to the same weights; the
# causal LMs (tiny GPT-2, tied Llama) at pp 2 and dp 2 x pp 2 (the tied word
# embedding's two gradients summed across the pipeline); the clear errors
# before any work; and one rank of a tp 2 x pp 2 group killed (-9), the group
# failing in bounded time and the relaunch resuming to the uninterrupted
# run's weights, bitwise. Skips (77) without mpirun or MPI in the build.
set -euo pipefail
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"
t_start=$(date +%s)

# dp.test.sh's data: 45 sequences of uneven lengths, one third positive;
# batch 8 x accum 2 gives 6 steps over 2 epochs and a short last batch (5
# rows: some micro-batches and dp slices are empty or 1 row)
python3 - data.jsonl <<'PY'
import random, sys
random.seed(3)
pos, neg = ["good", "great", "fun", "brilliant"], ["bad", "awful", "boring", "dull"]
filler = "the a movie film plot actor story scene music ending is was very really".split()
with open(sys.argv[1], "w") as f:
    for i in range(45):
        y = 1 if i % 3 == 0 else 0
        words = random.sample(filler, random.randint(2, 9)) + [random.choice(pos if y else neg)]
        random.shuffle(words)
        f.write('{"id":"d%d","text":"%s","label":%d}\n' % (i, " ".join(words), y))
PY

spec() { # spec NAME PARALLEL [extra yaml lines]
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 1\n  class_weights: [1.0, 2.0]\n  parallel: %s\n%s' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" "${3:-}" > "$1.yaml"
}
run() { # run NAME NP PARALLEL: train, then compare with the single process
    spec "$1" "$3"
    mpi -np "$2" "$bin" train "$1.yaml" 2>"$1.log" || { tail -20 "$1.log"; exit 1; }
    echo -n "$1 ($3) vs 1 process: "; cmp_runs one "$1"
}

spec one '{dp: 1}'
"$bin" train one.yaml 2>one.log
test "$(wc -l < one/metrics.jsonl)" = 6
python3 -c 'import json,sys; n=[json.loads(l)["grad_norm"] for l in open("one/metrics.jsonl")]; sys.exit(0 if any(x > 0.3 for x in n) else "no step clipped: %s" % n)'

run tp2 2 '{tp: 2}'
run pp2m4 2 '{pp: 2, microbatches: 4}'
run dp2tp2 4 '{dp: 2, tp: 2}'
run tp2pp2 4 '{tp: 2, pp: 2, microbatches: 2}'
run dp2pp2z1 4 '{dp: 2, pp: 2, zero: 1, microbatches: 2}'
run tp4 4 '{tp: 4}'
run dp2pp2z2 4 '{dp: 2, pp: 2, zero: 2, microbatches: 4, stages: [1, 1]}'
run dp2tp2pp2 8 '{dp: 2, tp: 2, pp: 2, zero: 1, microbatches: 2}'

# the stages were balanced by measured cost where not given; every step
# reports the bubble beside (p - 1) / (m + p - 1) with m the step's
# micro-batches (4 at pp 2 x 4 micro-batches and accum 2: theory 1/9, the
# short last step of an epoch fewer)
grep -q 'stages (balanced by measured cost): 1 layer(s) = units \[0, 2), 1 layer(s) = units \[2, 4)' tp2pp2.log
grep -q 'stages (given): 1 layer(s)' dp2pp2z2.log
python3 - <<'PY'
import json
# the global gradient norm (clipping at 0.3 is exercised: see above) is one
# process's on every mesh: tp-replicated parameters counted once, the
# stages' and dp shards' sums added
one = [json.loads(l)["grad_norm"] for l in open("one/metrics.jsonl")]
all_worst = 0
for run in ("tp2", "pp2m4", "dp2tp2", "tp2pp2", "dp2pp2z1", "tp4", "dp2pp2z2", "dp2tp2pp2"):
    g = [json.loads(l)["grad_norm"] for l in open(run + "/metrics.jsonl")]
    worst = max(abs(a - b) / a for a, b in zip(one, g))
    assert len(g) == len(one) and worst < 1e-5, (run, worst, one, g)
    all_worst = max(all_worst, worst)
print("gradient norm per step vs 1 process: largest relative difference %.1e over the 8 meshes" % all_worst)
for run, p, per_batch in (("pp2m4", 2, 4), ("tp2pp2", 2, 2), ("tp2", 1, 1)):
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    for r in rows:
        assert 0 <= r["bubble"] <= r["bubble_max"] <= 1, r
        if p == 1:
            assert r["bubble_theory"] == 0 and r["bubble_s"] == 0, r
    full = [r["bubble_theory"] for r in rows[:2]]
    want = round((p - 1) / (2 * per_batch + p - 1), 4)
    assert full == [want, want], (run, full, want)
    s = json.load(open(run + "/train.json"))["per_step"]
    print("%s: bubble per step %.3f (max over ranks %.3f), theory %.3f; step %.1f ms: compute "
          "%.1f, comm %.1f, bubble %.1f, wait %.1f ms (mean over ranks)"
          % (run, s["bubble"], s["bubble_max"], s["bubble_theory"], 1e3 * s["step_s"],
             1e3 * s["compute_s"], 1e3 * s["comm_s"], 1e3 * s["bubble_s"], 1e3 * s["wait_s"]))
PY

# resharding: 2 steps at tp 2 x pp 2 (4 shards in the whole model's
# coordinates), resumed by 1 process and by dp 4 (zero 1)
spec r1 '{tp: 2, pp: 2, microbatches: 2}' '  stop_after: 2
'
mpi -np 4 "$bin" train r1.yaml 2>r1a.log
test "$(ls r1/checkpoint.d/step-00000002 | tr '\n' ' ')" = "COMPLETE manifest.bin shard-00000-of-00004.bin shard-00001-of-00004.bin shard-00002-of-00004.bin shard-00003-of-00004.bin "
test ! -d r1/model
cp -r r1 r2
spec r1 '{dp: 1}'
"$bin" train r1.yaml 2>r1b.log
grep -q "resumed from r1/checkpoint.bin at step 2" r1b.log
echo -n "tp2 x pp2 2 steps, then 1 process: "; cmp_runs one r1
spec r2 '{dp: 4, zero: 1}'
mpi -np 4 "$bin" train r2.yaml 2>r2b.log
test "$(grep -c 'resumed from r2/checkpoint.bin at step 2' r2b.log)" = 4
echo -n "tp2 x pp2 2 steps, then dp4/zero1: "; cmp_runs one r2

# the causal LMs through the same pipeline (causal_dp.test.sh's fixtures and
# data); GPT-2's key biases (the middle third of c_attn.bias) have a zero
# gradient and hold round-off noise on both sides: lr x steps absolute
. "$REFINERY_ROOT/tests/trainer/causal_lib.sh"
causal_models tiny-gpt2-rand tiny-llama-tied
lm_jsonl lm.jsonl sft
lmspec() { # lmspec NAME MODEL PARALLEL
    printf 'trainer:\n  task: causal_lm\n  model: %s\n  train: lm.jsonl\n  output: %s\n  epochs: 2\n  batch_size: 4\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  max_len: 24\n  log_every: 0\n  threads: 1\n  checkpoint_every: 4\n  parallel: %s\n' \
        "$2" "$1" "$3" > "$1.yaml"
}
for m in gpt2:tiny-gpt2-rand llama:tiny-llama-tied; do
    a=${m%%:*} dir=${m#*:}
    lmspec "${a}1" "$dir" '{dp: 1}'
    "$bin" train "${a}1.yaml" 2>"${a}1.log" || { tail -5 "${a}1.log"; exit 1; }
    for c in "pp2:2:{pp: 2, microbatches: 2}" "dp2pp2:4:{dp: 2, pp: 2, zero: 1, microbatches: 2}"; do
        n=${c%%:*} rest=${c#*:}; np=${rest%%:*} par=${rest#*:}
        lmspec "$a$n" "$dir" "$par"
        mpi -np "$np" "$bin" train "$a$n.yaml" 2>"$a$n.log" || { tail -20 "$a$n.log"; exit 1; }
        echo -n "$a $par vs 1 process: "; cmp_runs "${a}1" "$a$n" 1e-5 --abs-mid-third c_attn.bias 0.024
    done
done

# errors before any work, naming the numbers
expect_fail() { # expect_fail PATTERN cmd...
    local pat=$1; shift
    set +e; "$@" >out 2>err; local rc=$?; set -e
    if [ $rc -eq 0 ] || ! grep -q "$pat" err; then echo "expected failure with '$pat' from: $*"; tail -5 err; exit 1; fi
    echo "clear error: $(grep -m1 -o "$pat[^\"]*" err | head -c 200)"
}
spec e1 '{tp: 2, pp: 2}'
expect_fail "dp 1 x tp 2 x pp 2 = 4 rank(s) but the group has 2" mpi -np 2 "$bin" train e1.yaml
spec e2 '{tp: 3}'
expect_fail "tp is 3 but the model has 4 attention heads" mpi -np 3 "$bin" train e2.yaml
spec e3 '{pp: 3}'
expect_fail "pp is 3 but the model has 2 layer(s)" mpi -np 3 "$bin" train e3.yaml
spec e4 '{pp: 2, stages: [1, 2]}'
expect_fail "stages sum to 3 layer(s) but the model has 2" mpi -np 2 "$bin" train e4.yaml
spec e5 '{dp: 2, tp: 2, zero: 3}'
expect_fail "zero 3 with tp 2 x pp 1 is not supported" mpi -np 4 "$bin" train e5.yaml
spec e6 '{pp: 2, microbatches: 3}'
expect_fail "microbatches is 3 but the batch size 8 is not a multiple of it" mpi -np 2 "$bin" train e6.yaml
# (the causal models' tp errors: tp_causal.test.sh)
for e in e1 e2 e3 e4 e5 e6; do test ! -d $e; done

# a rank of a tp 2 x pp 2 group killed (-9): mpirun ends the group promptly,
# naming the killed rank; the relaunch resumes from the last complete sharded
# checkpoint and ends bitwise equal to an uninterrupted run of the same mesh
ksteps=120 kevery=20
[ -z "${REFINERY_SANITIZED:-}" ] || { ksteps=60 kevery=10; }
for k in k1 k2; do
    spec $k '{tp: 2, pp: 2, microbatches: 2, stages: [1, 1]}' "$(printf "  max_steps: $ksteps\n")"
    sed -i "s/^  epochs: 2\$//; s/^  checkpoint_every: 1\$/  checkpoint_every: $kevery/" $k.yaml
done
kill_rank_and_resume 4 3 'tp 1, pp 1'
echo "mesh.test.sh: ok ($(( $(date +%s) - t_start )) s)"

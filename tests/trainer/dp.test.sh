#!/usr/bin/env bash
# Data parallelism and ZeRO-1/2/3 (issue 13) on the tiny BERT fixture, dropout
# off: `refinery train` under scripts/mpirun.sh at dp 2 and 4, zero 0, 1, 2
# and 3, must give the single process's loss at every step (metrics.jsonl) and
# its final weights (model.safetensors) within 1e-5 relative (dp_compare.py
# says which runs are bitwise equal). Then sharded checkpoints across layouts:
# 2 steps at dp4/zero3 resumed by 1 process, by dp2/zero1 and by dp2/zero2, 3 steps at 1
# process resumed at dp4/zero1, all against the uninterrupted run; an
# incomplete checkpoint is not used; the clear errors (world size != dp), a
# rank-0 data stage failing in `refinery run`, and a rank killed (-9)
# mid-training at dp2/zero3 then relaunched. Skips (77) without mpirun or a
# refinery built without MPI.
set -euo pipefail
. "$REFINERY_ROOT/tests/trainer/mpi_lib.sh"

# 45 sequences of uneven lengths, one third positive: batch 8 x accum 2 gives
# 6 steps over 2 epochs, a short last micro-batch (5 rows: at dp4 one rank
# gets 1 row, and the weighted loss shares differ per rank).
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

spec() { # spec NAME DP ZERO [extra yaml lines]
    printf 'trainer:\n  model: %s\n  train: data.jsonl\n  output: %s\n  epochs: 2\n  batch_size: 8\n  grad_accum: 2\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  clip_norm: 0.3\n  dropout: false\n  log_every: 0\n  threads: 1\n  max_len: 16\n  checkpoint_every: 1\n  parallel: {dp: %s, zero: %s}\n%s' \
        "$root/tests/fixtures/trainer/tiny-bert" "$1" "$2" "$3" "${4:-}" > "$1.yaml"
}
weights='  class_weights: [1.0, 2.0]\n'

spec one 1 0 "$(printf "$weights")"
"$bin" train one.yaml 2>one.log
test "$(wc -l < one/metrics.jsonl)" = 6
# clipping must be exercised (the global norm decides it)
python3 -c 'import json,sys; n=[json.loads(l)["grad_norm"] for l in open("one/metrics.jsonl")]; sys.exit(0 if any(x > 0.3 for x in n) else "no step clipped: %s" % n)'

for np in 2 4; do
    for z in 0 1 2 3; do
        spec "d${np}z$z" $np $z "$(printf "$weights")"
        mpi -np $np "$bin" train "d${np}z$z.yaml" 2>"d${np}z$z.log" || { tail -20 "d${np}z$z.log"; exit 1; }
        echo -n "dp$np zero$z vs 1 process: "; cmp_runs one "d${np}z$z"
    done
    echo -n "dp$np zero1 vs zero0: "; cmp_runs "d${np}z0" "d${np}z1"
    echo -n "dp$np zero2 vs zero0: "; cmp_runs "d${np}z0" "d${np}z2"
    # zero 2 is zero 3 without the parameter shards: the same floats
    echo -n "dp$np zero3 vs zero2: "; cmp_runs "d${np}z2" "d${np}z3" | tee cmp.out; grep -q bitwise cmp.out
done
# bytes per step follow the ring model (per rank): all-reduce 2 psi (N-1)/N
# (zero 0); zero 1 adds the parameters' all-gather, (N-1)/N psi more; zero 2
# is reduce-scatter + all-gather, 2 psi (N-1)/N, as in the ZeRO paper
# zero 2 reduce-scatters each unit's gradient after its backward, every
# micro-batch (psi (N-1)/N each; step 1 has 2 micro-batches, accum 2), and
# all-gathers the updated parameters once per step (psi (N-1)/N); zero 3
# also gathers every unit's parameters before its forward and again before
# its backward (the head's buffer is kept from forward to backward): 3 psi
# (N-1)/N per micro-batch, less the head's second gather, and no gather after
# the step. Each unit is padded to N equal blocks. The units of the tiny
# model (config: vocab 100, positions 16, types 2, hidden 32, intermediate 64,
# 2 layers, 2 labels): embeddings 3840, each layer 8544, pooler+classifier 1122.
python3 - <<'PY'
import json
psi = 4 * 22050  # the tiny model's 22050 float parameters
units = [3840, 8544, 8544, 1122]
assert sum(units) == 22050
for np in (2, 4):
    b = [json.loads(open("d%dz%d/metrics.jsonl" % (np, z)).readline())["comm_bytes"] for z in range(4)]
    f = (np - 1) / np
    blk = [-(-u // np) for u in units]
    z2 = (np - 1) * 4 * (2 * sum(blk) + sum(blk))
    z3 = 2 * (np - 1) * 4 * (2 * sum(blk) - blk[-1] + sum(blk))
    expect = [2 * f * psi, 3 * f * psi, z2, z3]  # plus a few scalars
    for z in range(4):
        assert abs(b[z] - expect[z]) <= 64 + f * 4 * np * 2, (np, z, b[z], expect[z])
    print("dp%d bytes/step sent per rank: zero0 %d, zero1 %d, zero2 %d, zero3 %d (psi = %d bytes; "
          "2 micro-batches; zero3 per micro-batch %.2f psi)" % (np, *b, psi, b[3] / 2 / psi))
PY

# per-rank memory (each rank logs it) against the ZeRO paper's formulas for
# fp32 AdamW: params 4 psi, grads 4 psi, moments 8 psi (zero 0); zero 1:
# moments 8 psi/N (padded to N*ceil(psi/N)); zero 2: + grads 4 psi/N; zero 3:
# + params 4 psi/N, where zero 2 and 3 pad each unit to N equal blocks
python3 - <<'PY'
import json, re
n = 22050
units = [3840, 8544, 8544, 1122]
for np in (2, 4):
    block = -(-n // np)
    # zero 2/3: grads and each moment (and at zero 3 params) are the rank's
    # piece of every unit, padded per unit: S = sum ceil(u / N), within
    # len(units) of n / N
    S = sum(-(-u // np) for u in units)
    assert 0 <= S - n / np < len(units), (np, S)
    for z in range(4):
        seen = 0
        for line in open("d%dz%d.log" % (np, z)):
            m = re.search(r"rank (\d+) memory: params (\d+) B, grads (\d+) B, moments (\d+) B", line)
            if not m:
                continue
            seen += 1
            p, g, mo = map(int, m.group(2, 3, 4))
            if z >= 2:
                assert p == (4 * S if z == 3 else 4 * n) and g == 4 * S and mo == 8 * S, (np, z, p, g, mo)
                continue
            want_mo = 8 * n if z == 0 else 8 * block
            assert mo == want_mo and abs(mo - (8 * n if z == 0 else 8 * n / np)) <= 8 * np, (np, z, mo)
            assert p == g == (4 * n if z == 0 else 4 * np * block), (np, z, p, g)  # zero 1: padded
        assert seen == np, (np, z, seen)
    # the working buffers of zero 3 (rank 0's train.json): at most two units'
    # gathered parameters and two units' full gradients
    mem = json.load(open("d%dz3/train.json" % np))["memory"]
    bmax = max(-(-u // np) for u in units)
    assert mem["params_bytes"] == 4 * S and mem["moments_bytes"] == 8 * S, mem
    assert 0 < mem["working_peak_bytes"] <= 4 * (2 * np * bmax + 2 * np * bmax), mem
    mem2 = json.load(open("d%dz2/train.json" % np))["memory"]
    assert mem2["grads_bytes"] == 4 * S and mem2["params_bytes"] == 4 * n, mem2
    assert 0 < mem2["working_peak_bytes"] <= 4 * 2 * np * bmax, mem2  # two units' gradients
    print("dp%d per rank: moments %d B at zero 1 (8 psi/N = %d B), %d B at zero 0; zero 2: grads %d B "
          "(4 psi/N = %d B), moments %d B, working peak %d B; zero 3: params %d B, grads %d B, "
          "moments %d B, working peak %d B"
          % (np, 8 * block, 8 * n // np, 8 * n, 4 * S, 4 * n // np, 8 * S, mem2["working_peak_bytes"],
             4 * S, 4 * S, 8 * S, mem["working_peak_bytes"]))
PY

# unweighted loss (the counted-rows path of the loss)
spec u1 1 0; "$bin" train u1.yaml 2>u1.log
spec u2 2 0; mpi -np 2 "$bin" train u2.yaml 2>u2.log
echo -n "unweighted dp2 vs 1 process: "; cmp_runs u1 u2

# sharded checkpoints load at any layout: stop 2 steps into dp4/zero3 (4
# shards, a manifest, the marker), resume with 1 process, and (r3) at dp2/zero1
spec r1 4 3 "$(printf "$weights  stop_after: 2\n")"
mpi -np 4 "$bin" train r1.yaml 2>r1a.log
test -f r1/checkpoint.bin && test ! -d r1/model
test "$(ls r1/checkpoint.d)" = step-00000002
test "$(ls r1/checkpoint.d/step-00000002 | tr '\n' ' ')" = "COMPLETE manifest.bin shard-00000-of-00004.bin shard-00001-of-00004.bin shard-00002-of-00004.bin shard-00003-of-00004.bin "
cp -r r1 r3; cp -r r1 r5
# a checkpoint whose writing was cut short (shards of step 3, no manifest,
# no marker, checkpoint.bin not moved on) is not used: resume takes step 2
mkdir r1/checkpoint.d/step-00000003
cp r1/checkpoint.d/step-00000002/shard-0000[01]-of-00004.bin r1/checkpoint.d/step-00000003/
# a run killed after logging a step it did not checkpoint leaves a line
# behind: resuming drops it (cmp_runs below sees each step once, real losses)
echo '{"step":3,"loss":99}' >> r1/metrics.jsonl
spec r1 1 0 "$(printf "$weights")"
"$bin" train r1.yaml 2>r1b.log
grep -q "resumed from r1/checkpoint.bin at step 2" r1b.log
echo -n "dp4/zero3 2 steps, then 1 process: "; cmp_runs one r1
test "$(ls r1/checkpoint.d)" = step-00000006   # the incomplete step 3 and old steps are gone
spec r3 2 1 "$(printf "$weights")"
mpi -np 2 "$bin" train r3.yaml 2>r3b.log
test "$(grep -c 'resumed from r3/checkpoint.bin at step 2' r3b.log)" = 2
echo -n "dp4/zero3 2 steps, then dp2/zero1: "; cmp_runs one r3
spec r5 2 2 "$(printf "$weights")"
mpi -np 2 "$bin" train r5.yaml 2>r5b.log
test "$(grep -c 'resumed from r5/checkpoint.bin at step 2' r5b.log)" = 2
echo -n "dp4/zero3 2 steps, then dp2/zero2: "; cmp_runs one r5
# a manifest without its COMPLETE marker is refused, not half-used
spec r4 2 3 "$(printf "$weights  stop_after: 1\n")"
mpi -np 2 "$bin" train r4.yaml 2>r4a.log
rm r4/checkpoint.d/step-00000001/COMPLETE
spec r4 2 3 "$(printf "$weights")"
set +e; mpi -np 2 "$bin" train r4.yaml 2>r4b.log; rc=$?; set -e
[ $rc -ne 0 ] && grep -q 'COMPLETE is missing or does not match (incomplete)' r4b.log || { echo "an incomplete checkpoint was used"; tail -5 r4b.log; exit 1; }
echo "incomplete checkpoint refused: $(grep -o 'checkpoint r4/checkpoint.bin: [^"]*' r4b.log | head -1)"
# and the other way: 3 steps at 1 process, resumed at dp4/zero1
spec r2 1 0 "$(printf "$weights  stop_after: 3\n")"
"$bin" train r2.yaml 2>r2a.log
spec r2 4 1 "$(printf "$weights")"
mpi -np 4 "$bin" train r2.yaml 2>r2b.log
test "$(grep -c 'resumed from r2/checkpoint.bin at step 3' r2b.log)" = 4
echo -n "1 process 3 steps, then dp4/zero1: "; cmp_runs one r2

# refinery run under mpirun: the data stages run once (rank 0; here the
# trainer reads JSONL itself), every rank trains, rank 0 exports and evaluates.
# (Warmup as in every run here: without it, step 1's AdamW update of elements
# whose gradient is near eps (1e-8) turns the gradients' rounding differences
# into up to 8e-7 absolute, 1.2e-5 of that tensor's largest weight: measured,
# see services/trainer/README.md.)
for np in 1 2; do
    cat > "run$np.yaml" <<YAML
run:
  name: dp-run
trainer:
  model: $root/tests/fixtures/trainer/tiny-bert
  train: $tmp/data.jsonl
  epochs: 1
  batch_size: 8
  lr: 0.003
  warmup_ratio: 0.1
  max_len: 16
  log_every: 0
  dropout: false
  threads: 1
  parallel: {dp: $np, zero: 1}
evaluator:
  data: $tmp/data.jsonl
  max_len: 16
YAML
done
"$bin" run run1.yaml --out run1 --no-progress 2>run1.log
mpi -np 2 "$bin" run run2.yaml --out run2 --no-progress 2>run2.log >run2.out || { tail -20 run2.log; exit 1; }
test "$(grep -c 'run complete' run2.out)" = 1   # rank 0 alone reports
test -f run2/evaluator/report.json && test -f run2/stats.json
for d in run1 run2; do mkdir -p "c$d"; ln -s "../$d/model" "c$d/model"; ln -s "../$d/trainer/metrics.jsonl" "c$d/metrics.jsonl"; done
echo -n "refinery run dp2/zero1 vs 1 process: "; cmp_runs crun1 crun2

# a rank killed (-9) mid-training at zero 3: mpirun ends the group non-zero
# promptly, naming the killed rank; relaunching resumes from the last complete
# sharded checkpoint and ends bitwise equal to an uninterrupted run of the
# same group (same world size, same reductions)
# (3000 steps take ~9 s here; under ASan each step is ~10x slower: 600)
ksteps=3000 kevery=100
[ -z "${REFINERY_SANITIZED:-}" ] || { ksteps=600 kevery=20; }
for k in k1 k2; do
    spec $k 2 3 "$(printf "  max_steps: $ksteps\n  checkpoint_every: $kevery\n")"
    sed -i 's/^  epochs: 2$//; 0,/^  checkpoint_every: 1$/s///' $k.yaml
done
kill_rank_and_resume 2 1

# errors before any work: world size != dp, zero 3
expect_fail() { # expect_fail PATTERN cmd...
    local pat=$1; shift
    set +e; "$@" >out 2>err; local rc=$?; set -e
    if [ $rc -eq 0 ] || ! grep -q "$pat" err; then echo "expected failure with '$pat' from: $*"; cat err; exit 1; fi
    echo "clear error: $(grep -m1 "$pat" err | head -c 200)"
}
# rank 0's data stage fails: it tells the others, which stop at once
cat > fail.yaml <<YAML
run:
  name: dp-fail
ingest:
  inputs: [$tmp/does-not-exist.jsonl]
trainer:
  model: $root/tests/fixtures/trainer/tiny-bert
  max_len: 16
  threads: 1
  parallel: {dp: 2}
YAML
start=$(date +%s)
expect_fail "rank 1: run: rank 0 failed before training" mpi -np 2 "$bin" run fail.yaml --out runF --no-progress
[ $(( $(date +%s) - start )) -lt 30 ] || { echo "the other rank did not stop promptly"; exit 1; }
spec bad 4 0
expect_fail "parallel.dp is 4 but the group has 2 rank(s)" mpi -np 2 "$bin" train bad.yaml
test ! -d bad
echo "dp.test.sh: ok"

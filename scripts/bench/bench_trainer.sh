#!/usr/bin/env bash
# Training throughput: `refinery train` vs PyTorch eager (transformers) on the
# same data, model (MiniLM-L6, fp32), sequence length 128, batch 32, the same
# number of optimizer steps and 2 threads. Also GFLOP/s (analytic FLOPs of
# forward + backward) against this machine's measured sgemm peak, and peak RSS.
# Data: Amazon reviews (../shared) long enough to fill 128 tokens, deduplicated.
# BENCH_STEPS (default 4) sets the steps per side.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared}
BUILD=${BUILD:-build}
steps=${BENCH_STEPS:-4}
threads=2 seq=128 batch=32
[ -d "$SHARED/data/amazon" ] || { echo "bench_trainer: $SHARED/data/amazon missing" >&2; exit 1; }
model=$(scripts/fetch-minilm.sh)
venv=$(scripts/pyenv.sh bench)
work=$BUILD/bench/trainer
mkdir -p "$work"

"$venv/bin/python" - "$SHARED" "$work/data.jsonl" $((steps * batch)) <<'PY'
import csv, gzip, json, sys
shared, out, need = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen, rows = set(), []
def add(text, rating):
    if len(text.split()) < 150 or text in seen:
        return
    seen.add(text)
    rows.append({"id": str(len(rows)), "text": text, "label": int(float(rating) >= 3)})
for name in ("All_Beauty_5.json.gz", "Appliances_5.json.gz"):
    for line in gzip.open("%s/data/amazon/%s" % (shared, name), "rt"):
        r = json.loads(line)
        add((r.get("summary", "") + ". " + r.get("reviewText", "")).strip(), r["overall"])
csv.field_size_limit(1 << 24)
for r in csv.reader(open(shared + "/data/amazon/Musical_instruments_reviews.PARTIAL.csv", newline="")):
    if len(r) >= 7:
        add((r[6] + ". " + r[4]).strip(), r[5])
if len(rows) < need:
    sys.exit("bench_trainer: only %d long reviews, need %d" % (len(rows), need))
with open(out, "w") as f:
    for r in rows[:need]:
        f.write(json.dumps(r) + "\n")
PY

cat > "$work/spec.yaml" <<YAML
trainer:
  model: $model
  train: $work/data.jsonl
  output: $work/out
  num_labels: 2
  max_steps: $steps
  batch_size: $batch
  max_len: $seq
  lr: 5.0e-5
  weight_decay: 0.01
  threads: $threads
  resume: false
  log_every: 1
YAML
rm -rf "$work/out"
/usr/bin/time -f '%M' -o "$work/c.rss" "$BUILD/refinery" train "$work/spec.yaml" 2>"$work/c.log"
OMP_NUM_THREADS=$threads "$venv/bin/python" scripts/bench/trainer_torch.py --model "$model" \
    --data "$work/data.jsonl" --seq $seq --batch $batch --steps "$steps" --threads $threads \
    2>"$work/torch.log" >"$work/torch.json"
OPENBLAS_NUM_THREADS=$threads "$venv/bin/python" - "$work" "$model" $seq $threads <<'PY'
import json, sys, time
import numpy as np
work, model, seq, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
c = json.load(open(work + "/out/train.json"))
t = json.load(open(work + "/torch.json"))
c_rss = int(open(work + "/c.rss").read().split()[-1])
cfg = json.load(open(model + "/config.json"))
C, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
# forward FLOPs per token: linear layers + attention scores and context; x3 for fwd+bwd
fwd = L * (2 * (4 * C * C + 2 * C * I) + 4 * seq * C) + 2 * C * C + 2 * C * 2
flops_per_token = 3 * fwd
a = np.random.rand(4096, 384).astype(np.float32)
b = np.random.rand(384, 1536).astype(np.float32)
a @ b
best = 0
for _ in range(5):
    t0 = time.perf_counter(); a @ b; dt = time.perf_counter() - t0
    best = max(best, 2 * 4096 * 384 * 1536 / dt / 1e9)
cg = c["tokens_per_s"] * flops_per_token / 1e9
tg = t["tokens_per_s"] * flops_per_token / 1e9
print("MiniLM-L6 training, seq %d (padded batch length C %s / torch %d), batch 32, %d threads, %d steps"
      % (seq, "<=128", t["seq"], threads, c["steps"]))
print("%-28s %14s %14s %8s" % ("", "refinery", "pytorch", "ratio"))
print("%-28s %14.0f %14.0f %7.2fx" % ("tokens/s", c["tokens_per_s"], t["tokens_per_s"],
                                     c["tokens_per_s"] / t["tokens_per_s"]))
print("%-28s %14.1f %14.1f" % ("GFLOP/s (analytic)", cg, tg))
print("%-28s %13.0f%% %13.0f%%" % ("of sgemm peak %.1f GFLOP/s" % best, 100 * cg / best, 100 * tg / best))
print("%-28s %14.0f %14.0f %7.2fx" % ("peak RSS (MB)", c_rss / 1024, t["peak_rss_kb"] / 1024,
                                     c_rss / t["peak_rss_kb"]))
print("%-28s %14d %14d" % ("tokens trained", c["tokens"], t["tokens"]))
# refinery runs the last layer's queries and everything after its attention on
# the [CLS] rows only (the head reads nothing else); GFLOP/s above counts the
# full model on both sides, so say how much of it refinery actually computes.
skipped = 3 * (1 - 1 / seq) * (2 * (C * C + 2 * C * I) + 4 * seq * C)
print("refinery computes %.0f%% of the analytic FLOPs (last layer on [CLS] rows only)"
      % (100 * (1 - skipped / flops_per_token)))
PY
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# The seeds' comparison (issue 13): the same fine-tuning of MiniLM-L6 on an
# SST-2 subset as 1 process and as data-parallel groups (DP2 = dp 2 zero 0,
# ZeRO-1 and ZeRO-2 at dp 2, and ZeRO-3 when the trainer accepts it: detected
# as in bench_distributed.sh), each scored on all 872 SST-2 dev sentences.
# One table: dev accuracy, predictions differing from the 1-process run, the
# final weights' largest difference from it (relative to each tensor's
# largest weight; the attention key biases apart: their exact gradient is 0,
# so they hold rounding noise, see services/trainer/README.md), the loss at
# the last step, and the time per optimizer step.
# Data: SST2_N (default 1024) training sentences, a seeded shuffle (seed 42)
# of ../shared/data/sst2/train.tsv (GLUE SST-2, see its SOURCE.txt);
# max_len 64, batch 32, 1 epoch, lr 1e-4 with 10% warmup, dropout off (so
# that N ranks compute the same function as 1 process), seed 42.
# 1 process uses 2 threads; each rank of a dp-2 group 1 thread (the same 2
# cores). SST2_DP4=1 adds the same four configurations at dp 4 (4 ranks of
# 1 thread, oversubscribed). Writes build/bench/sst2-parallel/table.md;
# SST2_REPORT_ONLY=1 only rebuilds the table from the last runs; SST2_RUN
# (e.g. "dp4z0 dp4z1") runs only those configurations, and the table is
# built from every configuration's last run.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared}
BUILD=${BUILD:-build}
n=${SST2_N:-1024}
bin=$BUILD/refinery
[ -f "$SHARED/data/sst2/train.tsv" ] || { echo "sst2_parallel_table: $SHARED/data/sst2 missing" >&2; exit 1; }
command -v mpirun >/dev/null 2>&1 || { echo "sst2_parallel_table: mpirun not found" >&2; exit 1; }
model=$(scripts/fetch-minilm.sh)
work=$BUILD/bench/sst2-parallel
mkdir -p "$work"
export REFINERY_COMM_TIMEOUT=${REFINERY_COMM_TIMEOUT:-600}

python3 - "$SHARED/data/sst2/train.tsv" "$work/train.jsonl" "$n" <<'PY'
import csv, json, random, sys
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = list(csv.DictReader(open(src, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
random.Random(42).shuffle(rows)
with open(out, "w") as f:
    for i, r in enumerate(rows[:n]):
        f.write(json.dumps({"id": "t%d" % i, "text": r["sentence"].strip(), "label": int(r["label"])}) + "\n")
PY

spec() { # NAME DP ZERO THREADS
    cat > "$work/$1.yaml" <<YAML
trainer:
  model: $model
  train: $work/train.jsonl
  output: $work/$1
  num_labels: 2
  epochs: 1
  batch_size: 32
  max_len: 64
  lr: 1.0e-4
  warmup_ratio: 0.1
  weight_decay: 0.01
  dropout: false
  seed: 42
  threads: $4
  resume: false
  log_every: 4
  parallel: {dp: $2, zero: $3}
YAML
}
spec detect 2 3 1
configs="dp1z0 dp2z0 dp2z1 dp2z2"
if "$bin" train "$work/detect.yaml" >"$work/detect.log" 2>&1; then
    echo "sst2_parallel_table: the zero-3 detection run did not fail on the group size" >&2; exit 1
elif grep -q "but the group has 1 rank" "$work/detect.log"; then
    configs="$configs dp2z3"
    [ "${SST2_DP4:-0}" = 1 ] && configs="$configs dp4z0 dp4z1 dp4z2 dp4z3"
else
    echo "zero 3: not in the table, the trainer refuses it: $(grep -o 'trainer.parallel.zero[^"]*' "$work/detect.log" | head -1)"
fi

for c in ${SST2_RUN:-$configs}; do
    [ "${SST2_REPORT_ONLY:-0}" = 1 ] && break # the table from the last runs' files
    dp=${c:2:1} z=${c:4:1}
    threads=$([ "$dp" = 1 ] && echo 2 || echo 1)
    spec "$c" "$dp" "$z" "$threads"
    rm -rf "${work:?}/$c"
    echo "=== $c: dp $dp, zero $z, $threads thread(s) per rank"
    if [ "$dp" = 1 ]; then
        "$bin" train "$work/$c.yaml" 2>"$work/$c.log"
    else
        scripts/mpirun.sh -np "$dp" --tag-output "$bin" train "$work/$c.yaml" 2>"$work/$c.log"
    fi || { tail -20 "$work/$c.log"; exit 1; }
    "$bin" eval --model "$work/$c/model" --data "$SHARED/data/sst2/dev.tsv" --max-len 64 \
        --threads 2 --out "$work/$c/dev.json" --predictions "$work/$c/dev.preds.jsonl" \
        2>"$work/$c.eval.log" >/dev/null
done

python3 - "$work" "$n" $configs <<'PY'
import json, struct, sys
work, n, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def load_st(path):
    data = open(path, "rb").read()
    (hlen,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + hlen])
    out = {}
    for name, t in hdr.items():
        if name != "__metadata__":
            a, b = t["data_offsets"]
            out[name] = struct.unpack("<%df" % ((b - a) // 4), data[8 + hlen + a:8 + hlen + b])
    return out

def rel(wa, wb, keep):
    worst, where = 0.0, ""
    for k in wa:
        if not keep(k):
            continue
        a, b = wa[k], wb[k]
        s = max(max(abs(x) for x in a), 1e-30)
        d = max(abs(x - y) for x, y in zip(a, b)) / s
        if d > worst:
            worst, where = d, k
    return worst, where

def jsonl(path):
    """The records of a JSONL file; blank lines are skipped and reported (one
    was seen once at the end of a dp4/zero3 run's metrics.jsonl)."""
    lines = open(path).read().split("\n")
    blank = sum(1 for l in lines[:-1] if not l.strip())
    if blank:
        print("warning: %s has %d blank line(s), skipped" % (path, blank), file=sys.stderr)
    return [json.loads(l) for l in lines if l.strip()]

key_bias = lambda k: k.endswith("attention.self.key.bias")
ref = configs[0]
wref = load_st("%s/%s/model/model.safetensors" % (work, ref))
pref = [r["pred"] for r in jsonl("%s/%s/dev.preds.jsonl" % (work, ref))]
lines = ["SST-2: %d training sentences (seeded shuffle of train.tsv), 1 epoch, batch 32, max_len 64, lr 1e-4, dropout off; dev = all 872 sentences.\n" % n,
         "| configuration | dev accuracy | predictions differing from 1 process | loss per step vs 1 process (largest rel.) | weights vs 1 process (largest, key biases apart) | key biases | final weights bitwise equal to (same dp) | last-step loss | s/step (mean) | training s |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
lref = [r["loss"] for r in jsonl("%s/%s/metrics.jsonl" % (work, ref))]
weights = {}
def w_of(c):
    if c not in weights:
        weights[c] = load_st("%s/%s/model/model.safetensors" % (work, c))
    return weights[c]
label = {"dp1z0": "1 process (2 threads)"}
for dp in (2, 4):
    label["dp%dz0" % dp] = "DP%d (dp %d, zero 0)" % (dp, dp)
    for z in (1, 2, 3):
        label["dp%dz%d" % (dp, z)] = "ZeRO-%d, dp %d" % (z, dp)
for c in configs:
    rep = json.load(open("%s/%s/dev.json" % (work, c)))
    acc = rep.get("accuracy")
    preds = [r["pred"] for r in jsonl("%s/%s/dev.preds.jsonl" % (work, c))]
    ndiff = sum(a != b for a, b in zip(pref, preds))
    met = jsonl("%s/%s/metrics.jsonl" % (work, c))
    sps = sum(r["tokens"] / r["tokens_per_s"] for r in met if r["tokens_per_s"] > 0) / len(met)
    tr = json.load(open("%s/%s/train.json" % (work, c)))
    loss_rel = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(lref, [r["loss"] for r in met]))
    bitwise = "-"
    if c == ref:
        w, kb = "(reference)", "(reference)"
    else:
        wb = w_of(c)
        d, where = rel(wref, wb, lambda k: not key_bias(k))
        dk, _ = rel(wref, wb, key_bias)
        w, kb = "%.1e (%s)" % (d, where.replace("bert.", "")), "%.1e" % dk
        same = ["zero %s" % o[4] for o in configs if o != c and o != ref and o[:3] == c[:3] and w_of(o) == wb]
        bitwise = ", ".join(same) or "none"
    lines.append("| %s | %.2f%% | %d of %d | %.1e | %s | %s | %s | %.6f | %.2f | %.0f |" % (
        label.get(c, c), 100 * acc, ndiff, len(preds), loss_rel, w, kb, bitwise, met[-1]["loss"], sps,
        tr.get("seconds", 0)))
text = "\n".join(lines) + "\n"
open(work + "/table.md", "w").write(text)
print(text)
PY
echo "Load during the runs (shared machine): $(cut -d' ' -f1-3 /proc/loadavg). Table: $work/table.md"

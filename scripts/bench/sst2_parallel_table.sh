#!/usr/bin/env bash
# The seeds' comparison (issues 13 and 17): the same fine-tuning of MiniLM-L6
# on an SST-2 subset as 1 process and as every kind of parallel group, one
# row each: data parallel (DP2 = dp 2 zero 0), ZeRO-1/2/3 at dp 2 (ZeRO-3
# when the trainer accepts it: detected as in bench_distributed.sh), tensor
# parallel (tp 2), pipeline parallel (pp 2, 4 micro-batches per batch), the
# 2-D mixes dp 2 x tp 2, tp 2 x pp 2 and dp 2 x pp 2 (zero 1), and the 3-D
# dp 2 x tp 2 x pp 2 (zero 1, 8 ranks); each scored on all 872 SST-2 dev
# sentences. Columns: dev accuracy, predictions differing from the 1-process
# run, the loss and final weights' largest difference from it (relative to
# each tensor's largest weight; the attention key biases apart: their exact
# gradient is 0, so they hold rounding noise, see services/trainer/README.md),
# time per optimizer step, speedup over 1 process, memory per rank (params +
# grads + AdamW moments the trainer holds, the largest rank; and its peak
# RSS), bytes sent per step by rank 0 (ring model, metrics.jsonl) and MFU:
#   MFU = (6 N + 12 L C T) x tokens per step / s per step / peak,
# N = the parameters of the matrix products (all but the embeddings), L
# layers, C hidden size, T the mean sequence length (non-padding), tokens the
# step's non-padding tokens, peak = 2 cores x the best 1-thread OpenBLAS
# sgemm (1024^3) measured by scripts/bench/sgemm_peak.c at the start (on the
# shared machine a 2-thread measurement is depressed by the load; the
# 1-thread best is the cleaner number).
# Data: SST2_N (default 1024) training sentences, a seeded shuffle (seed 42)
# of ../shared/data/sst2/train.tsv (GLUE SST-2, see its SOURCE.txt);
# max_len 64, batch 32, 1 epoch, lr 1e-4 with 10% warmup, dropout off (so
# that N ranks compute the same function as 1 process), seed 42.
# 1 process uses 2 threads; each rank of a group 1 thread (2 ranks: the same
# 2 cores; 4 and 8 ranks oversubscribe them). SST2_DP4=1 adds dp 4 at zero
# 0..3. Writes build/bench/sst2-parallel/table.md; SST2_REPORT_ONLY=1 only
# rebuilds the table from the last runs; SST2_RUN (e.g. "tp2 pp2") runs only
# those configurations, and the table is built from every configuration's
# last run (one never run is left out with a note; dp1z0 must have run).
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

# NAME -> ranks and trainer.parallel
par_of() {
    case $1 in
    dp1z0) echo "1 {dp: 1}" ;;
    dp[24]z[0-3]) echo "${1:2:1} {dp: ${1:2:1}, zero: ${1:4:1}}" ;;
    tp2) echo "2 {tp: 2}" ;;
    pp2) echo "2 {pp: 2, microbatches: 4}" ;;
    dp2tp2) echo "4 {dp: 2, tp: 2}" ;;
    tp2pp2) echo "4 {tp: 2, pp: 2, microbatches: 4}" ;;
    dp2pp2z1) echo "4 {dp: 2, pp: 2, zero: 1, microbatches: 4}" ;;
    dp2tp2pp2z1) echo "8 {dp: 2, tp: 2, pp: 2, zero: 1, microbatches: 4}" ;;
    *) echo "sst2_parallel_table: unknown configuration $1" >&2; exit 1 ;;
    esac
}
spec() { # NAME PARALLEL THREADS
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
  threads: $3
  resume: false
  log_every: 4
  parallel: $2
YAML
}
spec detect "{dp: 2, zero: 3}" 1
configs="dp1z0 dp2z0 dp2z1 dp2z2"
if "$bin" train "$work/detect.yaml" >"$work/detect.log" 2>&1; then
    echo "sst2_parallel_table: the zero-3 detection run did not fail on the group size" >&2; exit 1
elif grep -q "but the group has 1 rank" "$work/detect.log"; then
    configs="$configs dp2z3"
else
    echo "zero 3: not in the table, the trainer refuses it: $(grep -o 'trainer.parallel.zero[^"]*' "$work/detect.log" | head -1)"
fi
configs="$configs tp2 pp2 dp2tp2 tp2pp2 dp2pp2z1 dp2tp2pp2z1"
[ "${SST2_DP4:-0}" = 1 ] && configs="$configs dp4z0 dp4z1 dp4z2 dp4z3"

# the peak for MFU (see above)
d=$(dirname "$(ls /usr/lib/*/openblas-openmp/libopenblas.so 2>/dev/null | head -1)")
cc -O2 -o "$work/sgemm_peak" scripts/bench/sgemm_peak.c ${d:+-L$d -Wl,-rpath,$d} -lopenblas
[ "${SST2_REPORT_ONLY:-0}" = 1 ] && [ -f "$work/peak.json" ] || "$work/sgemm_peak" 1024 2 > "$work/peak.json"

for c in ${SST2_RUN:-$configs}; do
    [ "${SST2_REPORT_ONLY:-0}" = 1 ] && break # the table from the last runs' files
    read -r np par <<<"$(par_of "$c")"
    threads=$([ "$np" = 1 ] && echo 2 || echo 1)
    spec "$c" "$par" "$threads"
    rm -rf "${work:?}/$c"
    echo "=== $c: $np rank(s), $par, $threads thread(s) per rank"
    if [ "$np" = 1 ]; then
        "$bin" train "$work/$c.yaml" 2>"$work/$c.log"
    else
        scripts/mpirun.sh -np "$np" --tag-output "$bin" train "$work/$c.yaml" 2>"$work/$c.log"
    fi || { tail -20 "$work/$c.log"; exit 1; }
    "$bin" eval --model "$work/$c/model" --data "$SHARED/data/sst2/dev.tsv" --max-len 64 \
        --threads 2 --out "$work/$c/dev.json" --predictions "$work/$c/dev.preds.jsonl" \
        2>"$work/$c.eval.log" >/dev/null
done

python3 - "$work" "$n" "$model" $configs <<'PY'
import json, re, struct, sys
work, n, model, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
import os
# a configuration never run (SST2_RUN chose others) is left out, and said so
missing = [c for c in configs if not os.path.exists("%s/%s/dev.json" % (work, c))]
if missing:
    print("not in the table (no run in %s): %s" % (work, " ".join(missing)), file=sys.stderr)
configs = [c for c in configs if c not in missing]
if not configs or configs[0] != "dp1z0":
    sys.exit("sst2_parallel_table: the 1-process reference dp1z0 has no run; run it first")
cfg = json.load(open(model + "/config.json"))
peak = json.load(open(work + "/peak.json"))
peak_flops = 2 * peak["gflops_1thread"] * 1e9

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
def tr_nparams(log):
    m = re.search(r"; (\d+) parameters\)", log)
    return int(m.group(1))
ref = configs[0]
wref = load_st("%s/%s/model/model.safetensors" % (work, ref))
pref = [r["pred"] for r in jsonl("%s/%s/dev.preds.jsonl" % (work, ref))]
L, C = cfg["num_hidden_layers"], cfg["hidden_size"]
# parameters of the matrix products: all but the word, position and type embeddings
emb = (cfg["vocab_size"] + cfg["max_position_embeddings"] + cfg["type_vocab_size"]) * C
lines = ["SST-2: %d training sentences (seeded shuffle of train.tsv), 1 epoch, batch 32, max_len 64, lr 1e-4, dropout off; dev = all 872 sentences. "
         "MFU peak: 2 cores x %.1f GFLOP/s (best 1-thread sgemm 1024^3 measured at the start; 2 threads measured %.1f under the load).\n"
         % (n, peak["gflops_1thread"], peak["gflops"]),
         "| configuration | ranks | dev accuracy | predictions differing from 1 process | loss per step vs 1 process (largest rel.) | weights vs 1 process (largest, key biases apart) | key biases | final weights bitwise equal to | s/step (mean) | speedup over 1 process | memory per rank: params + grads + moments, MiB (largest rank) | peak RSS, MiB (largest rank) | bytes sent per step, rank 0 | MFU |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
lref = [r["loss"] for r in jsonl("%s/%s/metrics.jsonl" % (work, ref))]
import hashlib
def digest(c):  # the same file bytes: bitwise equal weights
    return hashlib.sha256(open("%s/%s/model/model.safetensors" % (work, c), "rb").read()).hexdigest()
digests = {c: digest(c) for c in configs}
label = {"dp1z0": "1 process (2 threads)", "tp2": "TP (tp 2)", "pp2": "PP (pp 2, 4 micro-batches)",
         "dp2tp2": "2-D: dp 2 x tp 2", "tp2pp2": "2-D: tp 2 x pp 2 (4 micro-batches)",
         "dp2pp2z1": "2-D: dp 2 x pp 2, ZeRO-1 (4 micro-batches)",
         "dp2tp2pp2z1": "3-D: dp 2 x tp 2 x pp 2, ZeRO-1 (4 micro-batches)"}
for dp in (2, 4):
    label["dp%dz0" % dp] = "DP%d (dp %d, zero 0)" % (dp, dp)
    for z in (1, 2, 3):
        label["dp%dz%d" % (dp, z)] = "ZeRO-%d, dp %d" % (z, dp)
ranks = {"dp1z0": 1, "tp2": 2, "pp2": 2, "dp2tp2": 4, "tp2pp2": 4, "dp2pp2z1": 4, "dp2tp2pp2z1": 8}
sps_ref = None
for c in configs:
    rep = json.load(open("%s/%s/dev.json" % (work, c)))
    acc = rep.get("accuracy")
    preds = [r["pred"] for r in jsonl("%s/%s/dev.preds.jsonl" % (work, c))]
    ndiff = sum(a != b for a, b in zip(pref, preds))
    met = jsonl("%s/%s/metrics.jsonl" % (work, c))
    sps = sum(r["tokens"] / r["tokens_per_s"] for r in met if r["tokens_per_s"] > 0) / len(met)
    tr = json.load(open("%s/%s/train.json" % (work, c)))
    log = open("%s/%s.log" % (work, c)).read()
    mem = [sum(int(m.group(i)) for i in (1, 2, 3)) for m in
           re.finditer(r"rank \d+ memory: params (\d+) B, grads (\d+) B, moments (\d+) B", log)]
    rss = [int(m.group(1)) for m in re.finditer(r"rank \d+: \d+ bytes sent[^,]*, peak RSS (\d+) KiB", log)] or [tr["peak_rss_kb"]]
    if sps_ref is None:
        sps_ref = sps
    toks = sum(r["tokens"] for r in met) / len(met)
    seqs = min(32, n)  # sequences per step (the last step may be short; the mean length is what matters)
    tbar = sum(r["tokens"] for r in met) / n
    flops = (6 * (tr_nparams(log) - emb) + 12 * L * C * tbar) * toks
    mfu = flops / sps / peak_flops
    bsent = sum(r["comm_bytes"] for r in met) / len(met)
    loss_rel = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(lref, [r["loss"] for r in met]))
    bitwise = "-"
    if c == ref:
        w, kb = "(reference)", "(reference)"
    else:
        wb = load_st("%s/%s/model/model.safetensors" % (work, c))
        d, where = rel(wref, wb, lambda k: not key_bias(k))
        dk, _ = rel(wref, wb, key_bias)
        w, kb = "%.1e (%s)" % (d, where.replace("bert.", "")), "%.1e" % dk
        same = [label.get(o, o) for o in configs if o != c and o != ref and digests[o] == digests[c]]
        del wb
        bitwise = ", ".join(same) or "none"
    lines.append("| %s | %d | %.2f%% | %d of %d | %.1e | %s | %s | %s | %.2f | %.2f | %.1f | %.0f | %.1f MB | %.1f%% |" % (
        label.get(c, c), ranks.get(c, int(c[2]) if c.startswith("dp") else 0), 100 * acc, ndiff, len(preds),
        loss_rel, w, kb, bitwise, sps, sps_ref / sps, max(mem) / 1048576 if mem else 0, max(rss) / 1024,
        bsent / 1e6, 100 * mfu))
text = "\n".join(lines) + "\n"
open(work + "/table.md", "w").write(text)
print(text)
PY
echo "Load during the runs (shared machine): $(cut -d' ' -f1-3 /proc/loadavg). Table: $work/table.md"

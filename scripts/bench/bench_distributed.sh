#!/usr/bin/env bash
# `BENCH=distributed make bench` (issue 13): data parallelism and ZeRO on
# MiniLM-L6, fp32, batch 8 x sequence 64 (Amazon reviews long enough to fill
# 64 tokens, so every step has 512 tokens), BENCH_STEPS (default 8) steps,
# for dp in {1, 2, 4} x zero in {0, 1, 2}, and zero 3 when the trainer accepts
# it (detected: a spec with zero 3 is parsed and must fail only on the group
# size, not on the stage). Every configuration uses the machine's 2 cores:
# dp 1 with 2 threads, dp 2 with 1 thread per rank, dp 4 oversubscribed (4
# ranks of 1 thread on 2 cores, scripts/mpirun.sh).
# Reported, from each run's metrics.jsonl (rank 0) and each rank's log:
# - tokens/s (steps 2.., the first step's warm-up left out) and s/step;
# - per-rank bytes of parameters, gradients and AdamW moments (the trainer's
#   "rank r memory" line) against the ZeRO paper's formulas for fp32 AdamW
#   (params 4psi, grads 4psi, moments 8psi; stage 1: moments/N; stage 2:
#   + grads/N; stage 3: + params/N), and peak RSS per rank;
# - bytes sent per step and rank (metrics.jsonl comm_bytes, ring model)
#   against theory: 2psi(N-1)/N for DP and ZeRO-1/2, 3psi(N-1)/N for ZeRO-3
#   (psi in bytes = 4 x parameters);
# - a model of the speedup on real interconnects (see the table's notes);
# - tensor and pipeline parallelism (issue 17): the step-time breakdown of
#   every mesh run by the mesh trainer (parallel.c): tp 2 and 4, pp 2 and 4,
#   dp 2 x tp 2, tp 2 x pp 2, dp 2 x pp 2 (zero 1), dp 2 x tp 2 x pp 2 (zero
#   1, 8 ranks), and the data-parallel configurations dp 2 at zero 0/1/2
#   through the same trainer (`microbatches: 2` routes them there; train.c's
#   loop does not time its parts): compute (forward/backward and the
#   optimizer, without the tp collectives), communication (tp all-reduces,
#   the dp sync, the tied-embedding exchange, the norm and loss all-reduces),
#   pipeline bubble (receive waits and the flush, with its share of the
#   pipeline's time beside (p-1)/(m+p-1)) and wait (the opening barrier: the
#   previous step's imbalance between stages), each the mean over ranks and
#   steps 2..; memory per rank and bytes per step.
# Writes build/bench/distributed/{results.json,table.md,mesh.md}; BENCH_REPORT_ONLY=1
# only rebuilds them from the last runs; BENCH_MESH=0 skips the mesh runs;
# BENCH_DP=0 skips the dp x zero runs and reuses their last files (the mesh
# table needs dp1z0's metrics.jsonl as its reference).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared}
BUILD=${BUILD:-build}
steps=${BENCH_STEPS:-8}
seq=64 batch=8
bin=$BUILD/refinery
[ -d "$SHARED/data/amazon" ] || { echo "bench_distributed: $SHARED/data/amazon missing" >&2; exit 1; }
command -v mpirun >/dev/null 2>&1 || { echo "bench_distributed: mpirun not found (openmpi-bin)" >&2; exit 1; }
ldd "$bin" | grep libmpi >/dev/null || { echo "bench_distributed: $bin built without MPI" >&2; exit 1; }
model=$(scripts/fetch-minilm.sh)
work=$BUILD/bench/distributed
mkdir -p "$work"
export REFINERY_COMM_TIMEOUT=${REFINERY_COMM_TIMEOUT:-600}

python3 - "$SHARED" "$work/data.jsonl" $((steps * batch)) <<'PY'
import csv, gzip, json, sys
shared, out, need = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen, rows = set(), []
def add(text, rating):
    if len(text.split()) < 80 or text in seen:
        return
    seen.add(text)
    rows.append({"id": str(len(rows)), "text": text, "label": int(float(rating) >= 3)})
for name in ("All_Beauty_5.json.gz", "Appliances_5.json.gz"):
    for line in gzip.open("%s/data/amazon/%s" % (shared, name), "rt"):
        r = json.loads(line)
        add((r.get("summary", "") + ". " + r.get("reviewText", "")).strip(), r["overall"])
        if len(rows) >= need:
            break
if len(rows) < need:
    sys.exit("bench_distributed: only %d long reviews, need %d" % (len(rows), need))
with open(out, "w") as f:
    for r in rows[:need]:
        f.write(json.dumps(r) + "\n")
PY

spec() { # NAME DP ZERO THREADS [PARALLEL]
    cat > "$work/$1.yaml" <<YAML
trainer:
  model: $model
  train: $work/data.jsonl
  output: $work/$1
  num_labels: 2
  max_steps: $steps
  batch_size: $batch
  max_len: $seq
  lr: 5.0e-5
  shuffle: false
  dropout: false
  threads: $4
  resume: false
  log_every: 1
  parallel: ${5:-{dp: $2, zero: $3\}}
YAML
}

# zero 3: accepted by the trainer? (refused at parse time while not written)
spec detect 2 3 1
zeros="0 1 2"
if "$bin" train "$work/detect.yaml" >"$work/detect.log" 2>&1; then
    echo "bench_distributed: the zero-3 detection run did not fail on the group size" >&2; exit 1
elif grep -q "but the group has 1 rank" "$work/detect.log"; then
    zeros="0 1 2 3"
    echo "zero 3: accepted by the trainer, measured"
else
    echo "zero 3: not measured, the trainer refuses it: $(grep -o 'trainer.parallel.zero[^"]*' "$work/detect.log" | head -1)"
    cp "$work/detect.log" "$work/zero3-refused.log"
fi

for dp in 1 2 4; do
    [ "${BENCH_REPORT_ONLY:-0}" = 1 ] && break # the tables from the last runs' files
    [ "${BENCH_DP:-1}" = 0 ] && break
    for z in $zeros; do
        [ $dp = 1 ] && [ $z != 0 ] && continue # one rank: nothing to shard
        name=dp${dp}z$z
        threads=$([ $dp = 1 ] && echo 2 || echo 1)
        spec $name $dp $z $threads
        rm -rf "${work:?}/$name"
        echo "=== $name: dp $dp, zero $z, $threads thread(s) per rank"
        # CPU seconds of the whole command (every rank: mpirun waits for them)
        if [ $dp = 1 ]; then
            /usr/bin/time -f '%U %S %e' -o "$work/$name.time" "$bin" train "$work/$name.yaml" 2>"$work/$name.log"
        else
            /usr/bin/time -f '%U %S %e' -o "$work/$name.time" \
                scripts/mpirun.sh -np $dp --tag-output "$bin" train "$work/$name.yaml" 2>"$work/$name.log"
        fi || { tail -20 "$work/$name.log"; exit 1; }
    done
done

# the meshes: NAME RANKS PARALLEL (batch 8: micro-batches of 2 rows at pp, 4 rows at dp x pp)
meshes="m_dp2z0:2:{dp: 2, microbatches: 2}
m_dp2z1:2:{dp: 2, zero: 1, microbatches: 2}
m_dp2z2:2:{dp: 2, zero: 2, microbatches: 2}
tp2:2:{tp: 2}
tp4:4:{tp: 4}
pp2:2:{pp: 2, microbatches: 4}
pp4:4:{pp: 4, microbatches: 8}
dp2tp2:4:{dp: 2, tp: 2}
tp2pp2:4:{tp: 2, pp: 2, microbatches: 4}
dp2pp2z1:4:{dp: 2, pp: 2, zero: 1, microbatches: 2}
dp2tp2pp2z1:8:{dp: 2, tp: 2, pp: 2, zero: 1, microbatches: 2}"
if [ "${BENCH_MESH:-1}" = 1 ]; then
    while IFS= read -r line; do
        [ "${BENCH_REPORT_ONLY:-0}" = 1 ] && break
        name=${line%%:*} rest=${line#*:}; np=${rest%%:*} par=${rest#*:}
        spec "$name" 0 0 1 "$par"
        rm -rf "${work:?}/$name"
        echo "=== $name: $np ranks, $par, 1 thread per rank"
        /usr/bin/time -f '%U %S %e' -o "$work/$name.time" \
            scripts/mpirun.sh -np "$np" --tag-output "$bin" train "$work/$name.yaml" 2>"$work/$name.log" </dev/null \
            || { tail -20 "$work/$name.log"; exit 1; }
    done <<<"$meshes"
    python3 - "$work" "$meshes" <<'PY'
import json, re, statistics, sys
work, meshes = sys.argv[1], [l.split(":", 2) for l in sys.argv[2].splitlines()]
MiB = 1048576.0
ref = [json.loads(l) for l in open(work + "/dp1z0/metrics.jsonl") if l.strip()]
t1 = statistics.mean(r["tokens"] / r["tokens_per_s"] for r in ref[1:] if r["tokens_per_s"] > 0)
out = ["Step-time breakdown on the meshes (MiniLM-L6, batch 8 x 64 tokens, steps 2.. of %d; mean over ranks; "
       "1 process: %.2f s/step). Every rank is 1 thread; 2 ranks use the 2 cores, 4 and 8 oversubscribe them.\n" % (len(ref), t1),
       "| config | ranks | s/step | compute | comm | bubble (share; max over ranks) | theory (p-1)/(m+p-1) | wait | loss vs 1 process (largest rel.) | params + grads + moments per rank, MiB (min..max) | peak RSS per rank, MiB (max) | bytes/step, rank 0 | CPU s / wall s (whole command) |",
       "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
rows = []
for name, np, par in meshes:
    try:
        met = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (work, name)) if l.strip()]
    except FileNotFoundError:
        continue
    later = met[1:] if len(met) > 1 else met
    mean = lambda k: statistics.mean(r[k] for r in later)
    log = open("%s/%s.log" % (work, name)).read()
    mem = [sum(int(m.group(i)) for i in (1, 2, 3)) for m in re.finditer(r"rank \d+ memory: params (\d+) B, grads (\d+) B, moments (\d+) B", log)]
    rss = [int(m.group(1)) for m in re.finditer(r"rank \d+: \d+ bytes sent[^,]*, peak RSS (\d+) KiB", log)]
    loss_rel = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, met))
    u, sy, wall = map(float, open("%s/%s.time" % (work, name)).read().split()[-3:])
    row = dict(name=name, ranks=int(np), parallel=par, step=mean("step_s"), compute=mean("compute_s"), comm=mean("comm_s"),
               bubble=mean("bubble_s"), share=mean("bubble"), share_max=max(r["bubble_max"] for r in later),
               theory=mean("bubble_theory"), wait=mean("wait_s"), loss_rel=loss_rel, mem=mem, rss=rss,
               bytes=mean("comm_bytes"), cpu=u + sy, wall=wall)
    rows.append(row)
    out.append("| %s `%s` | %d | %.2f | %.2f | %.2f | %.2f (%.2f; %.2f) | %.3f | %.2f | %.1e | %.1f..%.1f | %.0f | %.2f MB | %.1f / %.1f |" % (
        name, par, row["ranks"], row["step"], row["compute"], row["comm"], row["bubble"], row["share"], row["share_max"],
        row["theory"], row["wait"], loss_rel, min(mem) / MiB, max(mem) / MiB, max(rss) / 1024 if rss else 0,
        row["bytes"] / 1e6, row["cpu"], row["wall"]))
text = "\n".join(out) + "\n"
open(work + "/mesh.md", "w").write(text)
json.dump(rows, open(work + "/mesh.json", "w"), indent=1)
print(text)
PY
fi

python3 - "$work" "$steps" "$batch" "$seq" "$zeros" "$model" <<'PY'
import json, re, statistics, sys
work, steps, batch, seq, zeros = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()
# zero 2/3 shard per unit (rf_bert_units: embeddings, each layer, the head),
# each unit padded to a multiple of N: at most N-1 floats of padding per unit
nunits = json.load(open(sys.argv[6] + "/config.json"))["num_hidden_layers"] + 2
MiB = 1048576.0
def jsonl(path):
    """The records of a JSONL file; blank lines are skipped and reported (one
    was seen once at the end of a dp4/zero3 run's metrics.jsonl)."""
    lines = open(path).read().split("\n")
    blank = sum(1 for l in lines[:-1] if not l.strip())
    if blank:
        print("warning: %s has %d blank line(s), skipped" % (path, blank), file=sys.stderr)
    return [json.loads(l) for l in lines if l.strip()]
rows = []
for dp in (1, 2, 4):
    for z in map(int, zeros):
        if dp == 1 and z:
            continue
        name = "dp%dz%d" % (dp, z)
        met = jsonl("%s/%s/metrics.jsonl" % (work, name))
        log = open("%s/%s.log" % (work, name)).read()
        mem = {}
        for m in re.finditer(r'rank (\d+) memory: params (\d+) B, grads (\d+) B, moments (\d+) B[^"]*; (\d+) parameters', log):
            mem[int(m.group(1))] = tuple(int(m.group(i)) for i in range(2, 6))
        work_b = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r'rank (\d+) zero \d+ working buffers: peak (\d+) B', log)}
        rss = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r'rank (\d+): \d+ bytes sent in collectives, peak RSS (\d+) KiB', log)}
        if not rss:  # one process logs no group line: its train.json has the peak
            rss = {0: json.load(open("%s/%s/train.json" % (work, name)))["peak_rss_kb"]}
        later = met[1:] if len(met) > 1 else met
        tps = statistics.mean(r["tokens_per_s"] for r in later)
        sps = statistics.mean(r["tokens"] / r["tokens_per_s"] for r in later if r["tokens_per_s"] > 0)
        u, sy, wall = map(float, open("%s/%s.time" % (work, name)).read().split()[-3:])
        rows.append(dict(name=name, dp=dp, zero=z, tokens_per_s=tps, s_per_step=sps, cpu_s=u + sy, wall_s=wall,
                         tokens_per_step=statistics.mean(r["tokens"] for r in later),
                         comm_bytes=[r["comm_bytes"] for r in met], mem=mem, rss_kib=rss, work_bytes=work_b,
                         loss=[r["loss"] for r in met]))
nparams = rows[0]["mem"][0][3]
psi = 4 * nparams  # bytes of one fp32 copy of the parameters

def formula(dp, z):
    """Per-rank bytes (params, grads, moments) by the ZeRO paper, fp32 AdamW:
    psi/N per sharded copy, unpadded."""
    blk = psi / dp
    p = blk if z >= 3 else psi
    g = blk if z >= 2 else psi
    m = 2 * blk if z >= 1 else 2 * psi
    return p, g, m

def pad_allow(dp, z):
    """Bytes of shard padding allowed per copy: zero 1 pads the flat block to
    a multiple of N (and zero 0 keeps the block padded for it); zero 2/3 pad
    each unit to a multiple of N."""
    return 4 * (dp - 1) * (nunits if z >= 2 else 1)

def theory(dp, z):
    f = (dp - 1) / dp
    return (3 if z == 3 else 2) * psi * f

out = []
out.append("MiniLM-L6 (psi = %d parameters = %.2f MiB fp32), batch %d x seq %d = %d tokens/step, %d steps (steps 2-%d timed)\n"
           % (nparams, psi / MiB, batch, seq, batch * seq, steps, steps))
out.append("| config | tokens/s | s/step | CPU s (all ranks, whole command) / wall s | params / grads / moments per rank, MiB (measured) | ZeRO formula, MiB | padding, B (allowed) | zero 2/3 working buffers, peak MiB | peak RSS per rank, MiB | bytes/step/rank sent (measured) | theory 2psi or 3psi x (N-1)/N | measured / theory |")
out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    dp, z = r["dp"], r["zero"]
    m0 = r["mem"][0]
    fp, fg, fm = formula(dp, z)
    meas = "%.2f / %.2f / %.2f" % (m0[0] / MiB, m0[1] / MiB, m0[2] / MiB)
    if any(r["mem"][k][:3] != m0[:3] for k in r["mem"]):
        meas += " (rank 0; others differ: %s)" % ", ".join("%d: %.2f/%.2f/%.2f" % (k, v[0] / MiB, v[1] / MiB, v[2] / MiB) for k, v in sorted(r["mem"].items()) if k)
    form = "%.2f / %.2f / %.2f" % (fp / MiB, fg / MiB, fm / MiB)
    flags, pads = [], []
    allow = pad_allow(dp, z)
    for what, meas_b, f_b, copies in (("params", m0[0], fp, 1), ("grads", m0[1], fg, 1), ("moments", m0[2], fm, 2)):
        pad = meas_b - f_b
        pads.append("%.0f" % pad)
        if pad < 0 or pad > copies * allow:
            flags.append(what)
    if flags: form += " (differs: %s)" % ", ".join(flags)
    padcell = "%s (%d)" % (" / ".join(pads), allow)
    wk = r["work_bytes"].get(0)
    wkcell = "%.2f" % (wk / MiB) if wk is not None else "-"
    rss = " / ".join("%.0f" % (r["rss_kib"][k] / 1024) for k in sorted(r["rss_kib"])) or "-"
    b = r["comm_bytes"][1] if len(r["comm_bytes"]) > 1 else r["comm_bytes"][0]
    th = theory(dp, z)
    ratio = "%.3f" % (b / th) if th else "-"
    out.append("| dp%d zero%d | %.0f | %.2f | %.1f / %.1f | %s | %s | %s | %s | %s | %d | %d | %s |" % (dp, z, r["tokens_per_s"], r["s_per_step"], r["cpu_s"], r["wall_s"], meas, form, padcell, wkcell, rss, b, th, ratio))

# speedup model: compute of the global batch measured at 1 rank (2 threads),
# split perfectly over N ranks; communication = bytes sent per rank / link
# bandwidth (ring collectives: each rank sends and receives its bytes on its
# own link at once); no overlap (T = C/N + B/bw) and full overlap
# (T = max(C/N, B/bw)); latency, stragglers and the optimizer's own time ignored
t1 = [r for r in rows if r["dp"] == 1][0]["s_per_step"]
out.append("")
out.append("Speedup model (compute per step measured at 1 rank here: %.2f s for %d tokens; communication = measured bytes/rank / bandwidth):\n" % (t1, batch * seq))
out.append("| config | bytes/rank/step | comm at 25 GB/s | comm at 100 GB/s | speedup 25 GB/s no overlap / full overlap | speedup 100 GB/s no overlap / full overlap | same, compute 100x faster (GPU-like), 25 GB/s | 100 GB/s |")
out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    if r["dp"] == 1:
        continue
    n = r["dp"]
    b = r["comm_bytes"][1] if len(r["comm_bytes"]) > 1 else r["comm_bytes"][0]
    cells = []
    for c in (t1, t1 / 100):
        for bw in (25e9, 100e9):
            tc = b / bw
            cells.append((c / (c / n + tc), c / max(c / n, tc)))
    out.append("| dp%d zero%d | %.1f MB | %.2f ms | %.2f ms | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f |"
               % (n, r["zero"], b / 1e6, b / 25e9 * 1e3, b / 100e9 * 1e3, *cells[0], *cells[1], *cells[2], *cells[3]))
text = "\n".join(out) + "\n"
open(work + "/table.md", "w").write(text)
json.dump(dict(nparams=nparams, psi_bytes=psi, rows=rows), open(work + "/results.json", "w"), indent=1)
print(text)
PY
echo "Two cores cannot show a speedup: dp 2 runs 2 ranks of 1 thread on the 2 cores that dp 1 uses with 2 threads, and dp 4 oversubscribes them. On a machine shared with other jobs (load now: $(cut -d' ' -f1-3 /proc/loadavg)) more single-threaded processes also get a larger share of the cores, and one 2-thread process loses time in OpenMP barriers when a thread is descheduled, so tokens/s across dp here measure the scheduler as much as the trainer; compare CPU seconds. The tables are in $work/table.md."

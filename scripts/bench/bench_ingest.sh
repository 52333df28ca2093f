#!/usr/bin/env bash
# Ingest throughput: `refinery ingest` (parse + UTF-8 + NFKC + cleanup + quality
# filters, JSON out) against the Python baseline of the seed pipeline
# (scripts/bench/ingest_baseline.py: lowercase, regex clean, whitespace
# collapse, length filter, JSON out), on the same data in the same run.
#
# Corpus (1x = 15.7 MB): the real shared data as the presets read it: Amazon
# All_Beauty + Appliances JSON (decompressed), the Musical Instruments CSV,
# SST-2 train + dev TSV, WikiText-2 valid + test. Throughput is measured on
# REPLICAS x that (default 10: every file listed 10 times), one process per
# preset group (amazon, sst2, wikitext), times and bytes summed. Each process
# is timed whole (start-up included): wall time, and CPU time (user + sys, from
# wait4) which stays meaningful on a machine shared with other jobs. Best of
# BENCH_REPS (default 2) by wall time. A last row shows the cost without the
# quality filters (parse + NFKC + cleanup + JSON out only). Peak RSS (VmHWM) is
# measured on 1x and on REPLICAS x input: a streaming stage must not grow with
# input size.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
BUILD=${BUILD:-build}
BIN=${REFINERY_BIN:-$BUILD/refinery}
data=$SHARED/data
[ -d "$data/amazon" ] || { echo "bench_ingest: SHARED=$SHARED has no data/amazon" >&2; exit 1; }
[ -x "$BIN" ] || { echo "bench_ingest: build $BIN first (make)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
zcat "$data/amazon/All_Beauty_5.json.gz" "$data/amazon/Appliances_5.json.gz" >"$tmp/amazon.jsonl"

python3 - "$BIN" "$data" "$tmp" "${REPLICAS:-10}" "${BENCH_REPS:-2}" <<'PY'
import json, os, subprocess, sys, time

binary, data, tmp, replicas, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
groups = {
    "amazon": [f"{tmp}/amazon.jsonl", f"{data}/amazon/Musical_instruments_reviews.PARTIAL.csv"],
    "sst2": [f"{data}/sst2/train.tsv", f"{data}/sst2/dev.tsv"],
    "wikitext": [f"{data}/wikitext2/wiki.valid.raw", f"{data}/wikitext2/wiki.test.raw"],
}

def vm_hwm_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0

def timed(cmd):
    """Runs cmd; returns (wall s, cpu s, peak RSS KB, stdout). Peak RSS is the
    process's VmHWM sampled every 10 ms: wait4's ru_maxrss would include the
    Python parent's RSS that the child inherits at fork."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    hwm = 0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        hwm = max(hwm, vm_hwm_kb(p.pid))
        time.sleep(0.01)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.stdout.read(), p.stderr.read()
    if p.returncode != 0:
        sys.exit(f"bench_ingest: {' '.join(cmd[:4])} ... failed:\n{err.decode(errors='replace')}")
    return wall, ru.ru_utime + ru.ru_stime, hwm, out

def ours(group, threads, n, extra=()):
    best = None
    for _ in range(reps):
        cmd = [binary, "ingest", "--preset", group, "--threads", str(threads), *extra] + groups[group] * n + [
            "--out", f"{tmp}/o.jsonl", "--rejects", f"{tmp}/r.jsonl", "--stats", f"{tmp}/s.json"]
        wall, cpu, rss, _ = timed(cmd)
        s = json.load(open(f"{tmp}/s.json"))["ingest"]
        run = (wall, cpu, rss, s["records_in"], s["bytes_in"], s["kept"])
        best = run if best is None or wall < best[0] else best
    return best

def python(group, n):
    best = None
    for _ in range(reps):
        cmd = [sys.executable, "scripts/bench/ingest_baseline.py", "--preset", group,
               "--out", f"{tmp}/p.jsonl"] + groups[group] * n
        wall, cpu, rss, out = timed(cmd)
        s = json.loads(out)
        run = (wall, cpu, rss, s["records"], s["bytes"], s["kept"])
        best = run if best is None or wall < best[0] else best
    return best

def total(runs):
    return (sum(r[0] for r in runs), sum(r[1] for r in runs), max(r[2] for r in runs),
            sum(r[3] for r in runs), sum(r[4] for r in runs), sum(r[5] for r in runs))

py = total([python(g, replicas) for g in groups])
o1 = total([ours(g, 1, replicas) for g in groups])
o2 = total([ours(g, 2, replicas) for g in groups])
m1 = total([ours(g, 1, 1) for g in groups])
nq = total([ours(g, 1, replicas, ["--no-quality"]) for g in groups])
assert py[3] == o1[3] == o2[3], f"record counts differ: python {py[3]}, refinery {o1[3]} / {o2[3]}"

mb = o1[4] / 1e6
print(f"corpus: Amazon JSON (decompressed) + Amazon CSV + SST-2 train/dev + WikiText-2 valid/test, "
      f"x{replicas} = {mb:.1f} MB, {o1[3]} records; {os.cpu_count()} cores, load average "
      f"{os.getloadavg()[0]:.1f}")
print(f"{'impl':<16} {'thr':>3} | {'wall s':>7} {'MB/s':>7} {'docs/s':>9} | {'cpu s':>7} {'MB/cpu-s':>8} | "
      f"{'RSS MB':>6} | {'kept':>8} | vs python (wall, cpu)")
def row(name, thr, r, ref=None):
    wall, cpu, rss, rec, by, kept = r
    ratio = f"{ref[0] / wall:5.1f}x {ref[1] / cpu:5.1f}x" if ref else ""
    print(f"{name:<16} {thr:>3} | {wall:7.2f} {by / 1e6 / wall:7.1f} {rec / wall:9.0f} | {cpu:7.2f} "
          f"{by / 1e6 / cpu:8.1f} | {rss / 1024:6.1f} | {kept:>8} | {ratio}")
row("python baseline", 1, py)
row("refinery ingest", 1, o1, py)
row("refinery ingest", 2, o2, py)
row("  --no-quality", 1, nq, py)
print(f"memory: refinery ingest, 1 thread: peak RSS {m1[2] / 1024:.1f} MB on 1x input "
      f"({m1[4] / 1e6:.1f} MB), {o1[2] / 1024:.1f} MB on {replicas}x input ({mb:.1f} MB)")
PY

#!/usr/bin/env bash
# Tokenizer throughput: `refinery tokenize` against Hugging Face `tokenizers`
# Tokenizer.encode_batch, same corpus, same tokenizer, 1 and 2 threads
# (RAYON_NUM_THREADS for HF). Prints MB/s, tokens/s, the ratio and peak RSS.
#
# Corpus: every line of WikiText-2 valid+test, the SST-2 train sentences and
# the Amazon review texts (JSON and CSV), concatenated (about 13 MB of real
# text), one text per line. Ours is timed end to end (process start, tokenizer
# load, reading, encoding, writing ids to /dev/null); HF's only around
# encode_batch. Best of BENCH_REPS runs (default 3) for both. Besides wall-clock
# MB/s, the CPU seconds of each (user+system) are printed: on a shared, loaded
# machine the CPU-time ratio is the steadier of the two.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
BUILD=${BUILD:-build}
BIN=$BUILD/refinery
REPS=${BENCH_REPS:-3}
[ -d "$SHARED/data" ] || { echo "bench_tokenizer: SHARED=$SHARED has no data/" >&2; exit 1; }
[ -x "$BIN" ] || { echo "bench_tokenizer: build $BIN first (make)" >&2; exit 1; }
venv=$(scripts/pyenv.sh bench)
py=$venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
corpus=$tmp/corpus.txt

"$py" - "$SHARED" "$corpus" <<'PY'
import csv, gzip, json, os, sys
shared, out = sys.argv[1], sys.argv[2]
texts = []
for name in ("wiki.valid.raw", "wiki.test.raw"):
    texts += open(os.path.join(shared, "data/wikitext2", name), encoding="utf-8").read().split("\n")
for line in open(os.path.join(shared, "data/sst2/train.tsv"), encoding="utf-8").read().split("\n")[1:]:
    texts.append(line.split("\t")[0])
for name in ("All_Beauty_5.json.gz", "Appliances_5.json.gz"):
    for line in gzip.open(os.path.join(shared, "data/amazon", name), "rt", encoding="utf-8"):
        t = json.loads(line).get("reviewText")
        if isinstance(t, str):
            texts.append(t)
csv.field_size_limit(1 << 30)
with open(os.path.join(shared, "data/amazon/Musical_instruments_reviews.PARTIAL.csv"), newline="", encoding="utf-8") as f:
    texts += [r[4] for r in csv.reader(f) if len(r) > 4]
with open(out, "w", encoding="utf-8", newline="") as f:
    for t in texts:
        f.write(t.replace("\r", "").replace("\n", " ") + "\n")
PY
bytes=$(stat -c %s "$corpus")
lines=$(wc -l < "$corpus")
printf 'corpus: %s lines, %.1f MB (WikiText-2 valid+test, SST-2 train, Amazon reviews)\n' "$lines" "$(echo "$bytes/1000000" | bc -l)"
printf '%-10s %3s | %9s %11s %6s %6s | %9s %11s %6s %6s | %6s %6s\n' tokenizer thr "ours MB/s" "ours tok/s" "CPU s" "RSS MB" \
    "HF MB/s" "HF tok/s" "CPU s" "RSS MB" ratio "CPU ratio"

run_ours() { # tokenizer threads -> "seconds cpu_seconds rss_kb tokens"
    local best="" cpu=0 rss=0 t u s r
    for _ in $(seq "$REPS"); do
        /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" "$BIN" tokenize --tokenizer "$1" \
            --input "$corpus" --threads "$2" > "$tmp/ids"
        read -r t u s r < "$tmp/time"
        rss=$r
        if [ -z "$best" ] || (( $(echo "$t < $best" | bc) )); then best=$t; cpu=$(echo "$u + $s" | bc); fi
    done
    echo "$best $cpu $rss $(wc -w < "$tmp/ids")"
}

for spec in minilm:"$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json" \
            gpt2:"$SHARED/data/tokenizers/gpt2/vocab.json"; do
    name=${spec%%:*}; path=${spec#*:}
    for thr in 1 2; do
        read -r ours_s ours_cpu ours_rss ours_tok < <(run_ours "$path" "$thr")
        /usr/bin/time -f '%M' -o "$tmp/hftime" env RAYON_NUM_THREADS=$thr \
            "$py" scripts/bench/bench_tokenizer_hf.py "$path" "$corpus" "$REPS" > "$tmp/hf.json"
        hf_rss=$(cat "$tmp/hftime")
        read -r hf_s hf_cpu hf_tok < <("$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["seconds"], d["cpu_seconds"], d["tokens"])' "$tmp/hf.json")
        [ "$hf_tok" = "$ours_tok" ] || echo "WARNING: token counts differ (ours $ours_tok, HF $hf_tok)"
        awk -v n="$name" -v th="$thr" -v b="$bytes" -v os="$ours_s" -v oc="$ours_cpu" -v ot="$ours_tok" \
            -v orss="$ours_rss" -v hs="$hf_s" -v hc="$hf_cpu" -v ht="$hf_tok" -v hrss="$hf_rss" 'BEGIN {
            if (os <= 0) os = 0.005
            if (oc <= 0) oc = 0.005
            printf "%-10s %3d | %9.1f %11.0f %6.2f %6.0f | %9.1f %11.0f %6.2f %6.0f | %5.1fx %5.1fx\n", n, th,
                b/os/1e6, ot/os, oc, orss/1024, b/hs/1e6, ht/hs, hc, hrss/1024, hs/os, hc/oc }'
    done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
echo "ours: $BIN tokenize --tokenizer T --input corpus --threads N > file (whole process, /usr/bin/time)"
echo "HF:   tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)') Tokenizer.encode_batch (padding off), RAYON_NUM_THREADS=N"

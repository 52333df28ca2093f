#!/usr/bin/env bash
# Dedup benchmark (make bench), all on the same real text and one core unless
# stated: Amazon 5-core reviews (All_Beauty + Appliances) and WikiText-2
# valid+test paragraphs as ingest JSON Lines.
#  1. MinHash signatures, word 5-grams, 100 permutations (20 bands x 5 rows):
#     refinery dedup-speed vs datasketch (and datatrove's signature code when it
#     imports), CPU seconds, side by side, with the ratio.
#  2. LSH index: refinery's band table query + insert vs datasketch MinHashLSH
#     query + insert per document; and refinery's whole decide phase (plus
#     Jaccard verification and union-find) inside a real dedup run.
#  3. refinery dedup end to end (1 and 2 threads) on the above plus SST-2 train:
#     docs/s, MB/s, index bytes and memory per document.
#  4. The full planted near-duplicate benchmark: F1 and the S-curve.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
BIN=${BUILD:-build}/refinery
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in amazon/All_Beauty_5.json.gz amazon/Appliances_5.json.gz wikitext2/wiki.valid.raw \
         wikitext2/wiki.test.raw sst2/train.tsv; do
    [ -f "$SHARED/data/$f" ] || { echo "bench_dedup: missing $SHARED/data/$f"; exit 1; }
done
python3 tests/dedup/make_input.py "$SHARED/data/amazon/All_Beauty_5.json.gz" \
    "$SHARED/data/amazon/Appliances_5.json.gz" "$SHARED/data/wikitext2/wiki.valid.raw" \
    "$SHARED/data/wikitext2/wiki.test.raw" >"$work/text.jsonl"
python3 tests/dedup/make_input.py "$SHARED/data/sst2/train.tsv" | cat "$work/text.jsonl" - >"$work/all.jsonl"
venv=$(scripts/pyenv.sh bench)

"$BIN" dedup-speed "$work/text.jsonl" >"$work/ours.json"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$venv/bin/python" scripts/bench/dedup_datasketch.py \
    "$work/text.jsonl" >"$work/ref.json"
for t in 1 2; do
    "$BIN" dedup "$work/all.jsonl" --out "$work/kept$t.jsonl" --dups "$work/dups$t.jsonl" \
        --index "$work/idx$t" --threads $t --stats "$work/stats$t.json" 2>/dev/null
    cmp "$work/kept$t.jsonl" "$work/kept1.jsonl"
done
"$BIN" dedup-eval "$work/text.jsonl" --originals 100000 --copies 3 --threads 2 >"$work/planted.json"

python3 - "$work" <<'PY'
import json, os, sys
w = sys.argv[1]
ours = json.load(open(f"{w}/ours.json"))
ref = json.load(open(f"{w}/ref.json"))
print(f"data: {ours['docs']} docs, {ours['bytes']/1e6:.2f} MB (Amazon All_Beauty+Appliances, "
      f"WikiText-2 valid+test); word 5-grams, {ours['perm']} permutations; one core, CPU seconds")
print(f"{'measure':34} {'refinery':>12} {'datasketch':>12} {'ratio':>8}")
def row(name, a, b, unit):
    print(f"{name:34} {a:12.1f} {b:12.1f} {a/b:7.1f}x   {unit}")
row("text -> signature (MB/s)", ours["text_to_sig"]["mb_per_s"], ref["text_to_sig"]["mb_per_s"], "")
row("text -> signature (docs/s)", ours["text_to_sig"]["docs_per_s"], ref["text_to_sig"]["docs_per_s"], "")
row("MinHash on ready shingles (docs/s)", ours["sign_only"]["docs_per_s"], ref["sign_only"]["docs_per_s"],
    "datasketch includes its sha1 per shingle")
dt = ref.get("datatrove", {})
if "mb_per_s" in dt:
    print(f"{'text -> signature, datatrove (MB/s)':34} {ours['text_to_sig']['mb_per_s']:12.1f} "
          f"{dt['mb_per_s']:12.2f} {ours['text_to_sig']['mb_per_s']/dt['mb_per_s']:7.1f}x   "
          f"(datatrove column; {dt['skipped_empty']} empty docs skipped there)")
else:
    print(f"datatrove: {dt.get('error', 'not measured')}")
s = [json.load(open(f"{w}/stats{t}.json"))["dedup"] for t in (1, 2)]
bi = ours["band_index"]
row("LSH band index query+insert (docs/s)", bi["docs_per_s"], ref["lsh_query_insert"]["docs_per_s"],
    f"{bi['keys_per_s']/1e6:.1f} M key ops/s, {bi['bytes_per_doc']:.0f} bytes/doc")
dec = s[0]["docs"] / max(s[0]["this_run"]["decide_seconds"], 1e-9)
print(f"refinery decide phase in dedup (band query+insert, Jaccard verification, union-find): "
      f"{dec:.0f} docs/s wall on {s[0]['docs']} docs")
print()
print(f"refinery dedup end to end on {s[0]['docs']} docs (+SST-2 train), outputs identical for 1 and 2 threads:")
for t, st in zip((1, 2), s):
    r = st["this_run"]
    print(f"  threads={t}: {r['docs_per_s']:9.0f} docs/s {r['input_mb_per_s']:6.1f} MB/s (wall) | prepare "
          f"{r['prepare_seconds']:.2f}s decide {r['decide_seconds']:.2f}s commit(fsync) {r['commit_seconds']:.2f}s")
st = s[0]
print(f"  index {st['index_bytes_per_doc']} bytes/doc on disk, {st['memory_bytes_per_doc']} bytes/doc in memory, "
      f"peak RSS {st['peak_rss_kb']/1024:.1f} MiB; kept {st['kept']}, exact {st['exact']}, near {st['near']}")
p = json.load(open(f"{w}/planted.json"))
d = p["documents"]
print()
print(f"planted near-duplicates: {p['originals']} originals + {p['copies']} edited copies, threshold "
      f"{p['config']['threshold']}, {p['config']['bands']}x{p['config']['rows']}")
print(f"  pairs:     P {p['precision']:.4f}  R {p['recall']:.4f}  F1 {p['f1']:.4f}  (tp {p['tp']} fp {p['fp']} fn {p['fn']})")
print(f"  documents: P {d['precision']:.4f}  R {d['recall']:.4f}  F1 {d['f1']:.4f}")
print(f"  {'Jaccard':10} {'pairs':>7} {'measured':>9} {'theory':>7}")
for b in p["s_curve"]:
    print(f"  {b['jaccard'][0]:.1f}-{b['jaccard'][1]:.1f}    {b['pairs']:7d} {b['measured']:9.4f} {b['theory']:7.4f}")
print(f"  max excess over tolerance (3 s.e. + 0.03): {p['s_curve_max_excess']:.4f} (<= 0 is within)")
PY

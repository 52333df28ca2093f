#!/usr/bin/env bash
# Planted near-duplicate benchmark, small version (the full one is in make bench):
# 600 real documents (Amazon reviews and WikiText paragraphs of >= 30 words),
# 3 edited copies each, deduplicated as one shuffled stream with the default
# configuration. Asserts F1 >= 0.95 (pairs and documents) at the threshold and
# that the measured LSH S-curve stays within 3 standard errors + 0.03 of
# 1-(1-s^r)^b in every Jaccard bin with at least 30 pairs.
set -euo pipefail
: "${SHARED:?SHARED must point at the shared data folder}"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$here/make_input.py" "$SHARED/data/amazon/All_Beauty_5.json.gz" \
    "$SHARED/data/wikitext2/wiki.valid.raw" >"$work/corpus.jsonl"
"$REFINERY_BIN" dedup-eval "$work/corpus.jsonl" --originals 600 --copies 3 --threads 2 \
    >"$work/report.json"
cat "$work/report.json"
python3 - "$work/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["originals"] == 600 and r["copies"] == 1800, r
assert r["tp"] + r["fn"] >= 200, "too few planted positives to measure"
assert r["f1"] >= 0.95, f"pair F1 {r['f1']} < 0.95"
assert r["documents"]["f1"] >= 0.95, f"document F1 {r['documents']['f1']} < 0.95"
assert r["s_curve_max_excess"] <= 0, "measured S-curve outside tolerance"
assert len([b for b in r["s_curve"] if b["pairs"] >= 30]) >= 6, "S-curve bins too sparse"
print(f"planted: pair F1 {r['f1']}, document F1 {r['documents']['f1']}, S-curve within tolerance")
PY

#!/usr/bin/env bash
# refinery dedup on both real Amazon 5-core files, audited by dedup_audit.py:
# every repeated review text is found as an exact duplicate (Appliances: 2,277
# reviews, 144 distinct texts), the exact count equals a plain normalized-text
# count, and near-duplicate decisions match the exact Jaccard of word 5-grams.
set -euo pipefail
: "${SHARED:?SHARED must point at the shared data folder}"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for f in Appliances_5 All_Beauty_5; do
    src=$SHARED/data/amazon/$f.json.gz
    [ -f "$src" ] || { echo "missing $src (shared data not found)"; exit 1; }
    python3 "$here/make_input.py" "$src" >"$work/$f.jsonl"
    "$REFINERY_BIN" dedup "$work/$f.jsonl" --out "$work/kept.jsonl" --dups "$work/dups.jsonl" \
        --stats "$work/stats.json"
    echo "$f: $(python3 "$here/dedup_audit.py" --input "$work/$f.jsonl" --kept "$work/kept.jsonl" \
        --dups "$work/dups.jsonl")"
    python3 - "$work/stats.json" "$work/kept.jsonl" "$f" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["dedup"]
kept = sum(1 for _ in open(sys.argv[2]))
assert s["kept"] == kept, (s["kept"], kept)
assert s["docs"] == s["kept"] + s["exact"] + s["near"]
assert sum(s["cluster_size"].values()) == s["clusters"]
if sys.argv[3] == "Appliances_5":
    assert s["docs"] == 2277 and s["kept"] + s["near"] <= 144, s
PY
done
echo "amazon dedup audit passed"

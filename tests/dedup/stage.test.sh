#!/usr/bin/env bash
# The dedup stage inside `refinery run` (ingest -> dedup) on the real Amazon
# files: documents in = kept (emitted downstream) + duplicates written to
# <run>/dedup/dups.jsonl, and rerunning into the same run directory replays
# the index: identical dups.jsonl and counters, nothing counted twice.
set -euo pipefail
: "${SHARED:?SHARED must point at the shared data folder}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/spec.yaml" <<YAML
run:
  name: dedup-stage-test
ingest:
  inputs: [$SHARED/data/amazon/Appliances_5.json.gz, $SHARED/data/amazon/All_Beauty_5.json.gz]
  preset: amazon
dedup:
  ngram: 5
  bands: 20
  rows: 5
  threshold: 0.7
  normalize: [case, punct, space, digits]
YAML
"$REFINERY_BIN" run "$work/spec.yaml" --out "$work/run" --no-progress 2>/dev/null
cp "$work/run/dedup/dups.jsonl" "$work/dups.first"
cp "$work/run/stats.json" "$work/stats.first"
"$REFINERY_BIN" run "$work/spec.yaml" --out "$work/run" --no-progress 2>/dev/null
cmp "$work/dups.first" "$work/run/dedup/dups.jsonl"
python3 - "$work/stats.first" "$work/run/stats.json" "$work/run/dedup/dups.jsonl" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
dups = sum(1 for _ in open(sys.argv[3]))
for s in (a, b):
    d = s["dedup"]
    assert d["docs_in"] == s["ingest"]["docs_out"] == d["docs"], (d, s["ingest"])
    assert d["docs_out"] == d["kept"], d
    assert d["exact"] + d["near"] == dups, (d, dups)
    assert d["kept"] + dups == d["docs_in"]
for k in ("docs", "kept", "exact", "near", "clusters", "cluster_size"):
    assert a["dedup"][k] == b["dedup"][k], k
print(f"dedup stage: {a['dedup']['docs_in']} in, {a['dedup']['kept']} kept, {dups} duplicates; rerun identical")
PY

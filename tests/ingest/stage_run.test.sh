#!/usr/bin/env bash
# The ingest stage inside `refinery run`: outputs in <run>/ingest/, counters in
# the run's stats.json, documents handed downstream in full, bad keys named.
set -euo pipefail
bin=${REFINERY_BIN:?REFINERY_BIN not set}
data=${SHARED:?SHARED not set}/data
[ -d "$data/amazon" ] || { echo "FAIL: shared data not found under $data" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cat >"$tmp/spec.yaml" <<YAML
run:
  name: ingest-stage-test
  threads: 2
ingest:
  inputs:
    - $data/amazon/Appliances_5.json.gz
    - $data/amazon/Musical_instruments_reviews.PARTIAL.csv
  preset: amazon
  clean:
    lowercase: true
YAML
"$bin" run "$tmp/spec.yaml" --out "$tmp/run" >"$tmp/log" 2>&1 || { cat "$tmp/log"; fail "run failed"; }
python3 - "$tmp/run" <<'PY' || fail "stage outputs and stats disagree"
import json, sys
run = sys.argv[1]
s = json.load(open(run + "/stats.json"))["ingest"]
docs = [json.loads(l) for l in open(run + "/ingest/docs.jsonl")]
rejects = [json.loads(l) for l in open(run + "/ingest/rejects.jsonl")]
assert s["records_in"] == 2277 + 5050, s
assert s["records_in"] == s["kept"] + sum(s.get("rejected", {}).values())
assert len(docs) == s["kept"] and len(rejects) == s["rejected_total"]
assert s["docs_out"] == s["kept"], "documents emitted downstream"
assert all(d["text"] == d["text"].lower() for d in docs), "clean.lowercase from the spec"
assert all(r["reason"] and r["source"] and r["line"] >= 1 for r in rejects)
PY

# A misspelt key is named, with its line, and the run fails.
sed 's/lowercase: true/lowercase: true\n  treads: 2/' "$tmp/spec.yaml" >"$tmp/bad.yaml"
if "$bin" run "$tmp/bad.yaml" --out "$tmp/run2" >"$tmp/log2" 2>&1; then fail "bad key accepted"; fi
grep -q "treads" "$tmp/log2" || { cat "$tmp/log2"; fail "message does not name the key"; }
echo "stage run: ok"

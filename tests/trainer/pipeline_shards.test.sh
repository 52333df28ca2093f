#!/usr/bin/env bash
# The trainer and evaluator fed by the real upstream stages: ingest (SST-2 dev
# TSV from ../shared) -> dedup -> tokenizer (the tiny fixture's WordPiece
# vocabulary, token shards) -> trainer (tiny BERT) -> evaluator. Checks that
# the shards reach both stages (train/eval sequence counts add up) and that
# the run writes the model, the report and the counters. The tiny random model
# cannot learn SST-2 with a 100-word vocabulary: accuracy is not asserted.
set -euo pipefail
[ -f "$SHARED/data/sst2/dev.tsv" ] || { echo "missing $SHARED/data/sst2/dev.tsv" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
cat > "$tmp/spec.yaml" <<YAML
run:
  name: shards
  threads: 2
ingest:
  preset: sst2
  inputs:
    - $SHARED/data/sst2/dev.tsv
dedup:
  ngram: 5
tokenizer:
  tokenizer: $fx/vocab.txt
  max_length: 16
  eval_fraction: 0.2
trainer:
  model: $fx
  num_labels: 2
  epochs: 1
  batch_size: 32
  lr: 0.001
  log_every: 0
evaluator:
  max_len: 16
YAML
"$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/run" --no-progress 2>"$tmp/log" || { tail -20 "$tmp/log"; exit 1; }
test -f "$tmp/run/model/model.safetensors" && test -f "$tmp/run/tokenizer/train.idx"
python3 - "$tmp/run" <<'PY'
import json, sys
run = sys.argv[1]
s = json.load(open(run + "/stats.json"))
r = json.load(open(run + "/evaluator/report.json"))
n_train, n_eval = s["trainer"]["sequences"], r["examples"]
assert n_train > 500 and n_eval > 100, (n_train, n_eval)
assert n_train + n_eval <= 872, (n_train, n_eval)          # SST-2 dev after dedup
assert s["trainer"]["steps"] == (n_train + 31) // 32, s["trainer"]
assert sum(map(sum, r["confusion"])) == n_eval
print("shards: %d training and %d eval sequences, %d steps, eval accuracy %.3f"
      % (n_train, n_eval, s["trainer"]["steps"], r["accuracy"]))
PY

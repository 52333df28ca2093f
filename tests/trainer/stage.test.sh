#!/usr/bin/env bash
# The trainer and evaluator stages inside `refinery run`: a spec with only those
# two sections (data given as JSONL) trains the tiny BERT fixture, exports
# <run>/model, and writes <run>/evaluator/report.json and stats counters.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
python3 - "$tmp/data.jsonl" <<'PY'
import random, sys
random.seed(4)
pos, neg = ["good", "great", "fun"], ["bad", "awful", "dull"]
filler = "the a movie film plot actor story scene music is was very".split()
with open(sys.argv[1], "w") as f:
    for i in range(64):
        y = i % 2
        words = random.sample(filler, 4) + [random.choice(pos if y else neg)]
        random.shuffle(words)
        f.write('{"id":"d%d","text":"%s","label":%d}\n' % (i, " ".join(words), y))
PY
cat > "$tmp/spec.yaml" <<YAML
run:
  name: stage-test
trainer:
  model: $fx
  train: $tmp/data.jsonl
  epochs: 5
  batch_size: 8
  lr: 0.003
  max_len: 16
  log_every: 0
evaluator:
  data: $tmp/data.jsonl
  max_len: 16
YAML
"$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/run" --no-progress 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
test -f "$tmp/run/model/model.safetensors"
test -f "$tmp/run/trainer/checkpoint.bin"
python3 - "$tmp/run" <<'PY'
import json, sys
run = sys.argv[1]
r = json.load(open(run + "/evaluator/report.json"))
assert r["examples"] == 64 and r["accuracy"] >= 0.9, r
s = json.load(open(run + "/stats.json"))
assert s["trainer"]["steps"] == 40, s
assert abs(s["evaluator"]["accuracy"] - r["accuracy"]) < 1e-9, s
print("stage run: %d steps, accuracy %.3f" % (s["trainer"]["steps"], r["accuracy"]))
PY

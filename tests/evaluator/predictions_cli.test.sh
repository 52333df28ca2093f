#!/usr/bin/env bash
# `refinery eval --predictions FILE` and the evaluator stage's default
# <run>/evaluator/predictions.jsonl on the tiny BERT fixture: one line per
# evaluated example (records without label or id, and bad lines, are skipped
# as in the report), each with the input's id, text and gold label, probs
# summing to 1 and pred their arg-max; the report's accuracy and confusion
# matrix recomputed from the lines.
set -euo pipefail
bin=$REFINERY_BIN
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert

python3 - "$tmp/data.jsonl" <<'PY'
import random, sys
random.seed(7)
words = "good bad great awful movie film plot actor boring fun the a is was not very".split()
with open(sys.argv[1], "w") as f:
    for i in range(40):
        text = " ".join(random.sample(words, random.randint(1, 12)))
        f.write('{"id":"doc-%d","text":"%s","label":%d}\n' % (i, text, i % 3))
        if i == 10:
            f.write('{"id":"nolabel","text":"good movie"}\n')
            f.write('not json\n')
PY

check() { # check PREDICTIONS REPORT
    python3 - "$tmp/data.jsonl" "$1" "$2" <<'PY'
import json, sys
data = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
data = [d for d in data if "label" in d and "id" in d]
preds = [json.loads(l) for l in open(sys.argv[2])]
report = json.load(open(sys.argv[3]))
assert len(preds) == len(data) == report["examples"], (len(preds), len(data), report["examples"])
k = len(report["confusion"])
conf = [[0] * k for _ in range(k)]
for i, (p, d) in enumerate(zip(preds, data)):
    assert p["index"] == i and p["id"] == d["id"] and p["text"] == d["text"], (p, d)
    assert p["label"] == d["label"], (p, d)
    assert len(p["probs"]) == k and abs(sum(p["probs"]) - 1) < 1e-5, p
    assert p["pred"] == max(range(k), key=lambda c: (p["probs"][c], -c)), p
    conf[p["label"]][p["pred"]] += 1
acc = sum(conf[c][c] for c in range(k)) / len(preds)
assert abs(acc - report["accuracy"]) < 5e-7, (acc, report["accuracy"])
assert conf == report["confusion"], (conf, report["confusion"])
print("%d predictions, accuracy %.4f recomputed = report's" % (len(preds), acc))
PY
}

"$bin" eval --model "$fx" --data "$tmp/data.jsonl" --max-len 16 --batch 7 \
    --predictions "$tmp/preds.jsonl" --out "$tmp/report.json" >/dev/null
check "$tmp/preds.jsonl" "$tmp/report.json"

# --help documents it
"$bin" eval --help | grep -q -- "--predictions FILE"

# an unwritable path fails with the path in the message
set +e
"$bin" eval --model "$fx" --data "$tmp/data.jsonl" --predictions "$tmp/no/dir/p.jsonl" 2>"$tmp/err" >/dev/null
rc=$?
set -e
[ $rc -eq 1 ] && grep -q "no/dir/p.jsonl" "$tmp/err" || { echo "expected exit 1 naming the path, got $rc:"; cat "$tmp/err"; exit 1; }

# the evaluator stage writes <run>/evaluator/predictions.jsonl by default ...
printf 'run:\n  name: preds\nevaluator:\n  model: %s\n  data: %s\n  max_len: 16\n' \
    "$fx" "$tmp/data.jsonl" > "$tmp/spec.yaml"
"$bin" run "$tmp/spec.yaml" --out "$tmp/run" --no-progress 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
check "$tmp/run/evaluator/predictions.jsonl" "$tmp/run/evaluator/report.json"
# ... and none with predictions: ""
printf '  predictions: ""\n' >> "$tmp/spec.yaml"
"$bin" run "$tmp/spec.yaml" --out "$tmp/run2" --no-progress 2>"$tmp/log" || { cat "$tmp/log"; exit 1; }
test -f "$tmp/run2/evaluator/report.json"
test ! -e "$tmp/run2/evaluator/predictions.jsonl"
echo ok

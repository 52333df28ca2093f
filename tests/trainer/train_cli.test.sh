#!/usr/bin/env bash
# `refinery train` and `refinery eval` end to end on the tiny BERT fixture with
# JSONL text (tokenized by its 100-word vocabulary): a run killed with SIGKILL
# and rerun ends with the same exported weights as an uninterrupted run; the
# export reloads and evaluates; bad specs and inputs fail with clear messages.
set -euo pipefail
bin=$REFINERY_BIN
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert

# A learnable task: label 1 iff the text has a positive word.
python3 - "$tmp/data.jsonl" <<'PY'
import random, sys
random.seed(3)
pos, neg = ["good", "great", "fun", "brilliant"], ["bad", "awful", "boring", "dull"]
filler = "the a movie film plot actor story scene music ending is was very really".split()
with open(sys.argv[1], "w") as f:
    for i in range(96):
        y = i % 2
        words = random.sample(filler, 5) + [random.choice(pos if y else neg)]
        random.shuffle(words)
        f.write('{"id":"d%d","text":"%s","label":%d}\n' % (i, " ".join(words), y))
    f.write('{"id":"nolabel","text":"good movie"}\n')
    f.write('not json\n')
PY

spec() { # spec NAME
    printf 'trainer:\n  model: %s\n  train: %s\n  eval: %s\n  output: %s\n  epochs: 4\n  batch_size: 8\n  lr: 0.003\n  warmup_ratio: 0.1\n  weight_decay: 0.01\n  checkpoint_every: 1\n  log_every: 0\n  threads: 2\n  max_len: 16\n' \
        "$fx" "$tmp/data.jsonl" "$tmp/data.jsonl" "$tmp/$1" > "$tmp/$1.yaml"
}

spec full
"$bin" train "$tmp/full.yaml" 2>"$tmp/full.log"
test -f "$tmp/full/model/model.safetensors" && test -f "$tmp/full/model/vocab.txt"
grep -q '"architectures": \["BertForSequenceClassification"\]' "$tmp/full/model/config.json"
python3 - "$tmp/full/eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["examples"] == 96, r
assert r["skipped"] == 2, r            # the unlabelled record and the bad line
assert r["accuracy"] >= 0.9, r         # the task is learnable
print("eval after training: accuracy %.3f macro-F1 %.3f" % (r["accuracy"], r["macro"]["f1"]))
PY

# Kill -9 in the middle of training, rerun: same final weights, byte for byte.
spec killed
"$bin" train "$tmp/killed.yaml" 2>"$tmp/killed1.log" &
pid=$!
for _ in $(seq 1 400); do
    [ -f "$tmp/killed/checkpoint.bin" ] && break
    sleep 0.01
done
sleep 0.05
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
"$bin" train "$tmp/killed.yaml" 2>"$tmp/killed2.log"
if grep -q resumed "$tmp/killed2.log"; then
    echo "resumed: $(grep -o 'resumed from [^"]*' "$tmp/killed2.log")"
else
    echo "note: the first run ended before the kill (no resume exercised this time)"
fi
cmp "$tmp/full/model/model.safetensors" "$tmp/killed/model/model.safetensors"
echo "killed + resumed run: identical exported weights"

# refinery eval on the export agrees with the report written after training
"$bin" eval --model "$tmp/full/model" --data "$tmp/data.jsonl" --max-len 16 --out "$tmp/r.json" >"$tmp/stdout.json"
summary='import json,sys; r=json.load(open(sys.argv[1])); print(r["accuracy"], r["confusion"])'
cmp <(python3 -c "$summary" "$tmp/r.json") <(python3 -c "$summary" "$tmp/full/eval.json")
cmp <(python3 -c "$summary" "$tmp/r.json") <(python3 -c "$summary" "$tmp/stdout.json")

# errors: missing model key, unknown key, truncated weights, missing data
expect_fail() { # expect_fail CODE PATTERN cmd...
    local code=$1 pat=$2; shift 2
    set +e; "$@" 2>"$tmp/err"; local rc=$?; set -e
    if [ $rc -ne "$code" ] || ! grep -q "$pat" "$tmp/err"; then
        echo "expected exit $code and '$pat' from: $*; got $rc:"; cat "$tmp/err"; exit 1
    fi
    echo "clear error: $(head -c 200 "$tmp/err")"
}
printf 'trainer:\n  train: x\n' > "$tmp/bad1.yaml"
expect_fail 2 "trainer.model" "$bin" train "$tmp/bad1.yaml"
printf 'trainer:\n  model: %s\n  learning_rate: 1\n' "$fx" > "$tmp/bad2.yaml"
expect_fail 2 "learning_rate" "$bin" train "$tmp/bad2.yaml"
mkdir "$tmp/broken" && cp "$fx"/config.json "$fx"/vocab.txt "$tmp/broken/"
head -c 5000 "$fx/model.safetensors" > "$tmp/broken/model.safetensors"
expect_fail 1 "safetensors" "$bin" eval --model "$tmp/broken" --data "$tmp/data.jsonl"
expect_fail 1 "nope.jsonl" "$bin" eval --model "$fx" --data "$tmp/nope.jsonl"
expect_fail 2 "usage" "$bin" eval --model "$fx"
echo "ok"

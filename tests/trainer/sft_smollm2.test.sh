#!/usr/bin/env bash
# SFT end to end with the real chat model (issue 18), small enough for make
# test: `refinery run` of 24 prompt/response conversations (preset sft) ->
# tokenizer (SmolLM2's ChatML template from the GGUF's metadata, the answer
# mask beside the shards) -> trainer (LoRA r 4 over the Q4_1 blocks, 2 steps,
# the loss on answer tokens only) -> evaluator (generated-answer accuracy on
# the held-out conversations, of the adapter and of the base model). Checks
# that every stage ran, that the tokenizer marked only answer tokens as
# targets, and that the evaluator scored the same held-out conversations for
# both models, and that `refinery eval --task answers` over the adapter gives
# the stage's answers. It does not check that 2 steps make the model better (the
# measured result is in the trainer README, from
# examples/smollm2-sft-amazon.yaml). The 135M-parameter model is not run
# under the sanitizers (tokenizer/chat_stage.test.sh covers the data path
# there).
set -euo pipefail
: "${REFINERY_BIN:?}" "${REFINERY_ROOT:?}"
if [ -n "${REFINERY_SANITIZED:-}" ]; then
    echo "SKIP: SmolLM2 (135M parameters) runs in make test only; chat_stage.test.sh covers the data path under the sanitizers"
    exit 77
fi
gguf=${REFINERY_SMOLLM2_DIR:-$REFINERY_ROOT/build/models/smollm2-135m}/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$gguf" ] || { echo "SKIP: $gguf is missing (scripts/fetch-smollm2.sh)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp/sft.jsonl" <<'PY'
import json, sys
words = ["red", "green", "blue", "black", "white", "yellow"]
with open(sys.argv[1], "w") as f:
    for i in range(24):
        w = words[i % len(words)]
        f.write(json.dumps({"prompt": f"Item {i} is {w}. What colour is item {i}? One word.",
                            "response": w}) + "\n")
PY
cat > "$tmp/sft.yaml" <<EOF
run:
  name: sft
  threads: 2
ingest:
  inputs: [$tmp/sft.jsonl]
  preset: sft
tokenizer:
  tokenizer: $gguf
  max_length: 128
  add_special_tokens: false
  append_eos: true
  eos_token: "<|im_end|>"
  eval_fraction: 0.25
trainer:
  task: causal_lm
  model: $gguf
  lora: {rank: 4, alpha: 8, targets: [q, v], base: q4_1}
  max_len: 128
  batch_size: 2
  max_steps: 2
  lr: 1.0e-3
  log_every: 1
evaluator:
  answers: 3
  samples: 0
EOF
"$REFINERY_BIN" run "$tmp/sft.yaml" --out "$tmp/run" --no-progress > "$tmp/run.log" 2>&1 ||
    { tail -n 30 "$tmp/run.log"; exit 1; }
python3 - "$tmp/run" <<'PY'
import json, sys
run = sys.argv[1]
st = json.load(open(run + "/stats.json"))
tk = st["tokenizer"]
assert st["ingest"]["kept"] == 24, st["ingest"]
assert tk["train"]["docs"] + tk["eval"]["docs"] == 24 and tk["eval"]["docs"] >= 3, tk
assert 0 < tk["train"]["target_tokens"] < tk["train"]["tokens"] / 4, tk  # answers only
rep = json.load(open(run + "/evaluator/report.json"))
a, b = rep["answers"], rep["answers_before"]
assert a["n"] == b["n"] == 3 and rep["adapter"].endswith("/model"), rep
for r in (a, b):
    assert 0 <= r["correct"] <= 3 and abs(r["accuracy"] - r["correct"] / 3) < 1e-6, r
    assert len(r["examples"]) == 3 and all(e["reference"] in
        ("red", "green", "blue", "black", "white", "yellow") for e in r["examples"]), r
assert st["evaluator"]["answer_accuracy"] == a["accuracy"], st["evaluator"]
print("sft: answer accuracy before %.3f after %.3f (3 held-out conversations, 2 LoRA steps)"
      % (b["accuracy"], a["accuracy"]))
PY
grep -q '"comp":"trainer","msg":"step 2/2' "$tmp/run.log" || { echo "no step 2/2 line" >&2; exit 1; }
# `refinery eval --task answers` over the adapter gives the evaluator stage's answers
"$REFINERY_BIN" eval --task answers --model "$gguf" --adapter "$tmp/run/model" \
    --data "$tmp/run/tokenizer/eval" --answers 3 > "$tmp/answers.json" 2>"$tmp/answers.log" ||
    { cat "$tmp/answers.log"; exit 1; }
python3 - "$tmp" <<'PY'
import json, sys
cli = json.load(open(sys.argv[1] + "/answers.json"))["answers"]
stage = json.load(open(sys.argv[1] + "/run/evaluator/report.json"))["answers"]
for k in ("n", "correct", "answers", "examples"):
    assert cli[k] == stage[k], (k, cli[k], stage[k])
print("refinery eval --task answers: the stage's answers")
PY
grep -q "generated-answer accuracy <b>" "$tmp/run/report.html" ||
    { echo "report.html lacks the answer accuracy" >&2; exit 1; }
echo "sft_smollm2.test.sh: ok"

#!/usr/bin/env bash
# Continued pretraining with LoRA through `refinery run` (tiny-gpt2, fast
# enough for the sanitizers): WikiText-2 valid paragraphs -> tokenizer (whole
# documents, EOS appended) -> trainer (trainer.lora over the fp32 base, 4
# steps) -> the PEFT adapter -> evaluator, which scores an adapter on data
# without an answer mask by the perplexity of the held-out documents, each
# its own sequence, under the base and under base + adapter. Checks: the
# report has both, over the same documents and tokens; the stats carry them;
# the adapter moved the perplexity; `documents` caps the count; report.html
# shows both.
set -euo pipefail
: "${REFINERY_BIN:?}"
[ -d "${SHARED:-}/models/tiny-gpt2" ] || { echo "SKIP: $SHARED/models/tiny-gpt2 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 60000 "$SHARED/data/wikitext2/wiki.valid.raw" > "$tmp/wiki.raw"
cat > "$tmp/spec.yaml" <<EOF
run:
  name: cpt-lora
  threads: 1
ingest:
  preset: wikitext
  inputs: [$tmp/wiki.raw]
tokenizer:
  tokenizer: $SHARED/models/tiny-gpt2/tokenizer.json
  max_length: 0
  add_special_tokens: false
  append_eos: true
  eos_token: "<|endoftext|>"
  eval_fraction: 0.2
trainer:
  task: causal_lm
  model: $SHARED/models/tiny-gpt2
  lora: {rank: 2, alpha: 4, targets: [q, k, v, o, up, down]}
  max_len: 64
  batch_size: 4
  max_steps: 4
  lr: 5.0e-2
  log_every: 1
evaluator:
  documents: 5
  max_len: 64
  samples: 0
EOF
"$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/run" --no-progress > "$tmp/run.log" 2>&1 ||
    { tail -n 30 "$tmp/run.log"; exit 1; }
test -f "$tmp/run/model/adapter_config.json"
python3 - "$tmp/run" <<'PY'
import json, math, sys
run = sys.argv[1]
rep = json.load(open(run + "/evaluator/report.json"))
a, b = rep["documents"], rep["documents_before"]
assert a["documents"] == b["documents"] == 5 and a["tokens"] == b["tokens"] > 5, rep
for r in (a, b):
    assert math.isfinite(r["perplexity"]) and r["perplexity"] > 1, r
    assert abs(math.log(r["perplexity"]) - r["nll"]) < 1e-5, r
assert a["perplexity"] != b["perplexity"], "the adapter did not change the model"
st = json.load(open(run + "/stats.json"))["evaluator"]
assert abs(st["perplexity"] - a["perplexity"]) <= 1e-5 * a["perplexity"], st
assert abs(st["perplexity_before"] - b["perplexity"]) <= 1e-5 * b["perplexity"], st
print("cpt lora: perplexity %.2f -> %.2f on %d tokens of 5 held-out documents"
      % (b["perplexity"], a["perplexity"], a["tokens"]))
PY
grep -q "held-out documents' perplexity <b>" "$tmp/run/report.html" ||
    { echo "report.html lacks the adapter's perplexity" >&2; exit 1; }
echo "cpt_lora_run.test.sh: ok"

#!/usr/bin/env bash
# `refinery run examples/gpt2-cpt-wikitext.yaml`, shortened (4 steps of 4 rows
# of 64 tokens, 1% held out): ingest -> dedup -> tokenizer (every document a
# record ending with <|endoftext|>, checked with an independent reader of
# shard.h) -> trainer (task causal_lm on ../shared/models/tiny-gpt2) -> the
# exported folder -> evaluator (eval loss and perplexity, the same number as
# `refinery eval` on the export) -> report.html; a second run reuses every
# stage from the cache. Needs ../shared (models/tiny-gpt2, data/wikitext2).
# Skipped under ASan: ~20 s here, mostly tiny-gpt2's 50,257-id LM head; its C
# paths run under ASan in test_causal_export, test_lm_data and causal_dp.test.sh.
set -euo pipefail
if [ "${REFINERY_SANITIZED:-0}" = 1 ]; then
    echo "SKIP: the whole pipeline with a 50,257-id LM head is too slow under ASan; its code runs there in test_causal_export, test_lm_data and causal_dp.test.sh"
    exit 77
fi
: "${REFINERY_BIN:?}"
bin=$REFINERY_BIN
[ -d "${SHARED:-}/models/tiny-gpt2" ] && [ -f "$SHARED/data/wikitext2/wiki.valid.raw" ] ||
    { echo "SKIP: ../shared has no models/tiny-gpt2 or data/wikitext2 (SHARED=$SHARED)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -e "s#\.\./shared#$SHARED#g" "$REFINERY_ROOT/examples/gpt2-cpt-wikitext.yaml" > "$tmp/spec.yaml"
export REFINERY__TRAINER__MAX_STEPS=4 REFINERY__TRAINER__BATCH_SIZE=4 REFINERY__TRAINER__MAX_LEN=64
export REFINERY__TOKENIZER__EVAL_FRACTION=0.01 REFINERY__TRAINER__LOG_EVERY=1
unset REFINERY__RUN__CACHE # tests/run.sh turns the cache off; this test checks it
export REFINERY__RUN__CACHE_DIR="$tmp/cache"
run() { "$bin" run "$tmp/spec.yaml" --out "$tmp/$1" --no-progress 2>"$tmp/$1.log" ||
    { tail -30 "$tmp/$1.log"; exit 1; }; }
run run
test -f "$tmp/run/model/model.safetensors" && test -f "$tmp/run/model/tokenizer.json"
"$bin" eval --model "$tmp/run/model" --data "$tmp/run/tokenizer/eval" --max-len 64 --batch 16 \
    --samples 3 > "$tmp/eval.json" 2>"$tmp/eval.log" || { cat "$tmp/eval.log"; exit 1; }
# the report's first sample generation, redone by `refinery generate` from its prompt's text
prompt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples"][0]["prompt"], end="")' "$tmp/run/evaluator/report.json")
"$bin" generate --model "$tmp/run/model" --prompt "$prompt" --max-new-tokens 32 --json \
    > "$tmp/gen.json" 2>"$tmp/gen.log" || { cat "$tmp/gen.log"; exit 1; }
python3 - "$tmp" <<'PY'
import json, math, struct, sys
tmp = sys.argv[1]
run = tmp + "/run"

def records(prefix):
    idx = open(prefix + ".idx", "rb").read()
    ids = open(prefix + ".bin", "rb").read()
    assert idx[:8] == b"RFTOKIDX"
    ver, flags, n, ntok, vocab, eos, pad, block = struct.unpack_from("<IIQQIiiI", idx, 8)
    toks = struct.unpack("<%dI" % ntok, ids)
    out = []
    for i in range(n):
        start, ln, label, cluster = struct.unpack_from("<QIiQ", idx, 64 + 24 * i)
        out.append(toks[start:start + ln])
    return flags, eos, out

flags, eos, docs = records(run + "/tokenizer/train")
assert flags == 0 and eos == 50256, (flags, eos)
assert len(docs) > 1000 and all(d and d[-1] == 50256 for d in docs), "every document ends with EOS"
assert all(50256 not in d[:-1] for d in docs), "one document per record"
st = json.load(open(run + "/stats.json"))
assert st["trainer"]["steps"] == 4, st["trainer"]
m = [json.loads(l) for l in open(run + "/trainer/metrics.jsonl")]
assert len(m) == 4 and all(math.isfinite(x["loss"]) for x in m)
ev = json.load(open(run + "/evaluator/report.json"))
assert ev["task"] == "causal_lm" and ev["tokens"] > 0 and ev["max_len"] == 64, ev
assert abs(ev["perplexity"] - math.exp(ev["eval_loss"])) <= 1e-3 * ev["perplexity"], ev
cli = json.load(open(tmp + "/eval.json"))
assert cli["eval_loss"] == ev["eval_loss"] and cli["tokens"] == ev["tokens"], (cli, ev)
assert abs(st["evaluator"]["perplexity"] - ev["perplexity"]) <= 1e-5 * ev["perplexity"]  # stats keep 6 digits
html = open(run + "/report.html").read()
assert "perplexity" in html
# sample generations (evaluator.samples, default 3): prompt, greedy completion
# and the text's own continuation, the same in `refinery eval --samples 3`
# (same model, same rows) and shown in the report
assert len(ev["samples"]) == 3 and ev["samples"] == cli["samples"], (ev.get("samples"), cli.get("samples"))
for smp in ev["samples"]:
    assert smp["prompt"] and smp["reference"] and 0 < smp["new_tokens"] <= 32, smp
    assert smp["finish"] in ("eos", "length"), smp
assert "Sample generations" in html and html.count('<td class="ex">') >= 12
gen = json.load(open(tmp + "/gen.json"))
assert gen["text"] == ev["samples"][0]["completion"], (gen, ev["samples"][0])
cfg = json.load(open(run + "/model/config.json"))
assert cfg["model_type"] == "gpt2" and cfg["torch_dtype"] == "float32", cfg
print("wikitext: %d train documents (each ending with EOS), 4 steps, train loss %.4f -> %.4f, "
      "eval loss %.4f (perplexity %.1f) on %d tokens; refinery eval agrees"
      % (len(docs), m[0]["loss"], m[-1]["loss"], ev["eval_loss"], ev["perplexity"], ev["tokens"]))
PY
run second
python3 - "$tmp/second/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
c = {k: s[k]["cached"] for k in ("ingest", "dedup", "tokenizer", "trainer", "evaluator")}
assert all(c.values()), c
print("second run: every stage from the cache")
PY

#!/usr/bin/env bash
# `refinery eval --task lm` and `refinery generate` on ../shared/models/tiny-gpt2:
# the perplexity report of tests/fixtures/lm/ppl_text.txt at max-len 64,
# stride 32 equals transformers' (ppl_ref.json, scripts/parity/lm_fixtures.py:
# tokens exactly, perplexity within 1e-5 relative), also with --out; greedy
# --json output equals generate(do_sample=False) (generate_ref.json); the
# streamed text equals the JSON's; usage errors exit 2 with a reason
# (the adapter path: tests/evaluator/lm_adapter_cli.test.sh), runtime errors exit 1.
set -euo pipefail
bin=$REFINERY_BIN
model=$SHARED/models/tiny-gpt2
fx=$REFINERY_ROOT/tests/fixtures/lm
[ -d "$model" ] || { echo "SKIP: $model is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" eval --task lm --model "$model" --data "$fx/ppl_text.txt" --max-len 64 --stride 32 \
    --out "$tmp/report.json" >"$tmp/stdout.json"
cmp "$tmp/report.json" "$tmp/stdout.json"
python3 - "$tmp/report.json" "$fx/ppl_ref.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ref = [c for c in json.load(open(sys.argv[2]))["tiny_gpt2_ppl"] if c["max_len"] == 64 and c["stride"] == 32][0]
assert r["task"] == "lm" and r["tokens"] == ref["tokens"] and r["seq_len"] == ref["seq_len"], (r, ref)
assert r["windows"] == ref["windows"] and r["max_len"] == 64 and r["stride"] == 32, r
e = abs(r["perplexity"] - ref["perplexity"]) / ref["perplexity"]
assert e <= 1e-5, (r["perplexity"], ref["perplexity"], e)
print(f"eval --task lm: perplexity {r['perplexity']:.4f} (transformers {ref['perplexity']:.4f}, "
      f"rel diff {e:.2g}), {r['tokens']} tokens")
PY

"$bin" generate --model "$model" --prompt "Hello, my name is" --max-new-tokens 20 --json >"$tmp/gen.json"
"$bin" generate --model "$model" --prompt "Hello, my name is" --max-new-tokens 20 >"$tmp/gen.txt"
python3 - "$tmp/gen.json" "$tmp/gen.txt" "$fx/generate_ref.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
text = open(sys.argv[2], encoding="utf-8").read()
ref = json.load(open(sys.argv[3]))["tiny_gpt2"]["generate"][0]
assert g["prompt_ids"] == ref["prompt_ids"] and g["ids"] == ref["ids"], (g, ref)
assert g["finish"] == "length" and text == g["text"] + "\n", (text, g["text"])
print(f"generate: {len(g['ids'])} greedy tokens equal transformers'")
PY
# seeded sampling repeats itself
a=$("$bin" generate --model "$model" --prompt "Hi" --temperature 0.8 --top-p 0.9 --seed 5 --json)
b=$("$bin" generate --model "$model" --prompt "Hi" --temperature 0.8 --top-p 0.9 --seed 5 --json)
[ "$a" = "$b" ] || { echo "FAIL: the same seed gave different tokens"; exit 1; }

expect() { # expect STATUS SUBSTRING ARGS...
    local want=$1 says=$2 rc=0
    shift 2
    "$bin" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [ "$rc" != "$want" ] || ! grep -q -- "$says" "$tmp/err"; then
        echo "FAIL: refinery $* exited $rc (want $want), stderr:"; cat "$tmp/err"; exit 1
    fi
}
expect 1 "adapter_config.json" generate --model "$model" --adapter "$tmp" --prompt hi
expect 2 "for --task lm" eval --model "$model" --data "$fx/ppl_text.txt" --adapter "$tmp"
expect 2 "temperature" generate --model "$model" --prompt hi --top-k 5
expect 2 "top-p" generate --model "$model" --prompt hi --temperature 1 --top-p 0
expect 2 "usage" generate --model "$model"
expect 1 "no such file" generate --model "$tmp/none" --prompt hi
expect 1 "chat template" generate --model "$model" --prompt hi --chat
expect 2 "expected classify, lm or answers" eval --task mlm --model "$model" --data "$fx/ppl_text.txt"
expect 2 "for --task lm" eval --model "$model" --data "$fx/ppl_text.txt" --stride 4
expect 1 "1024 positions" eval --task lm --model "$model" --data "$fx/ppl_text.txt" --max-len 2048
printf 'x' >"$tmp/one.txt"
expect 1 "at least 2" eval --task lm --model "$model" --data "$tmp/one.txt"
echo "lm CLI: usage and runtime errors refused with their reasons"

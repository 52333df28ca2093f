#!/usr/bin/env bash
# `refinery generate --adapter` and `refinery eval --task lm --adapter` with
# peft's adapter tests/fixtures/lora/tiny_gpt2_lora over ../shared/models/tiny-gpt2
# (scripts/parity/lora_infer_fixtures.py): greedy --json ids equal peft's
# generate(do_sample=False) with the adapter (and differ from the base's), the
# perplexity of ppl_text.txt at max-len 64, stride 32 equals peft's within 1e-5
# relative (and the base's is farther away than that); a bad adapter exits 1
# with its reason.
set -euo pipefail
bin=$REFINERY_BIN
model=$SHARED/models/tiny-gpt2
fx=$REFINERY_ROOT/tests/fixtures
adapter=$fx/lora/tiny_gpt2_lora
[ -d "$model" ] || { echo "SKIP: $model is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ref=$fx/lora/tiny_gpt2_lora_ref.json
for i in 0 1; do
    prompt=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["generate"][int(sys.argv[2])]["prompt"])' "$ref" $i)
    "$bin" generate --model "$model" --adapter "$adapter" --prompt "$prompt" --max-new-tokens 20 \
        --json >"$tmp/gen$i.json"
    python3 - "$tmp/gen$i.json" "$ref" $i <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
ref = json.load(open(sys.argv[2]))["generate"][int(sys.argv[3])]
assert g["prompt_ids"] == ref["prompt_ids"], (g, ref)
assert g["ids"] == ref["ids"], ("ids", g["ids"], "peft", ref["ids"])
assert g["ids"] != ref["base_ids"]
print(f"generate --adapter: {len(g['ids'])} greedy tokens equal peft's ({ref['prompt']!r})")
PY
done

"$bin" eval --task lm --model "$model" --adapter "$adapter" --data "$fx/lm/ppl_text.txt" \
    --max-len 64 --stride 32 >"$tmp/ppl.json"
python3 - "$tmp/ppl.json" "$ref" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ref = json.load(open(sys.argv[2]))
p, b = ref["ppl"], ref["ppl_base"]
assert r["adapter"].endswith("tiny_gpt2_lora") and r["tokens"] == p["tokens"], (r, p)
e = abs(r["perplexity"] - p["perplexity"]) / p["perplexity"]
eb = abs(r["perplexity"] - b["perplexity"]) / b["perplexity"]
assert e <= 1e-5 and eb > 1e-4, (r["perplexity"], p["perplexity"], e, eb)
print(f"eval --task lm --adapter: perplexity {r['perplexity']:.6f} (peft {p['perplexity']:.6f}, "
      f"rel diff {e:.2g}; the base's {b['perplexity']:.6f})")
PY

expect() { # expect STATUS SUBSTRING ARGS...
    local want=$1 says=$2 rc=0
    shift 2
    "$bin" "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [ "$rc" != "$want" ] || ! grep -q -- "$says" "$tmp/err"; then
        echo "FAIL: refinery $* exited $rc (want $want), stderr:"; cat "$tmp/err"; exit 1
    fi
}
expect 1 "adapter_config.json" generate --model "$model" --adapter "$tmp/none" --prompt hi
expect 1 "is not \[" generate --model "$model" --adapter "$fx/lora/gpt2_lora" --prompt hi
expect 1 "unknown target module" eval --task lm --model "$model" --adapter "$fx/lora/llama_lora" \
    --data "$fx/lm/ppl_text.txt"
echo "--adapter: bad adapters refused with their reasons"

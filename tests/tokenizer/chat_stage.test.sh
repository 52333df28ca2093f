#!/usr/bin/env bash
# SFT data through `refinery run` (ingest preset sft -> tokenizer): the
# conversations rendered with the tokenizer folder's ChatML template
# (tokenizer_config.json) and the answer-only loss mask written beside the
# shards (<split>.mask, trainer/lm_data.h's format). The tokenizer is
# tiny-gpt2's byte-level BPE with <|im_start|> / <|im_end|> added as special
# tokens. Checks, with an independent reader of shard.h's format: one record
# per conversation, the mask as long as the shard, zeros then ones per
# record (the prompt, then the answer + <|im_end|> + "\n" + the appended
# <|im_end|>), the target count in the stats; refused records with their
# reasons; a tokenizer without a template rejects conversations as
# chat_failed; pack: true with conversations fails with a clear message.
set -euo pipefail
: "${REFINERY_BIN:?}"
[ -d "${SHARED:-}/models/tiny-gpt2" ] || { echo "SKIP: $SHARED/models/tiny-gpt2 is missing"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$SHARED/models/tiny-gpt2/tokenizer.json" "$tmp" <<'PY'
import json, sys
tok = json.load(open(sys.argv[1]))
for i, t in ((50257, "<|im_start|>"), (50258, "<|im_end|>")):
    tok["added_tokens"].append({"id": i, "content": t, "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
for d in ("chat", "plain"):
    import os
    os.makedirs(f"{sys.argv[2]}/{d}")
    json.dump(tok, open(f"{sys.argv[2]}/{d}/tokenizer.json", "w"))
tmpl = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}")
json.dump({"chat_template": tmpl}, open(f"{sys.argv[2]}/chat/tokenizer_config.json", "w"))
with open(f"{sys.argv[2]}/sft.jsonl", "w") as f:
    for i in range(40):
        if i % 2:
            f.write(json.dumps({"prompt": f"Question {i}: is {i} odd?", "response": "yes"}) + "\n")
        else:
            f.write(json.dumps({"messages": [{"role": "system", "content": "Answer."},
                                             {"role": "user", "content": f"Is {i} odd?"},
                                             {"role": "assistant", "content": "no"}]}) + "\n")
    f.write('{"prompt": "no answer"}\n{"messages": [{"role": "user", "content": "x"}]}\n')
PY

spec() { # TOKENIZER_DIR PACK
    cat <<EOF2
run:
  name: chat
  threads: 1
ingest:
  inputs: [$tmp/sft.jsonl]
  preset: sft
tokenizer:
  tokenizer: $1/tokenizer.json
  max_length: 0
  add_special_tokens: false
  append_eos: true
  eos_token: "<|im_end|>"
  eval_fraction: 0.25
  pack: $2
EOF2
}
spec "$tmp/chat" false > "$tmp/a.yaml"
spec "$tmp/plain" false > "$tmp/b.yaml"
spec "$tmp/chat" true > "$tmp/c.yaml"
for s in a b; do
    "$REFINERY_BIN" run "$tmp/$s.yaml" --out "$tmp/$s" --no-progress > "$tmp/$s.log" 2>&1 ||
        { cat "$tmp/$s.log"; exit 1; }
done
if "$REFINERY_BIN" run "$tmp/c.yaml" --out "$tmp/c" --no-progress > "$tmp/c.log" 2>&1; then
    echo "pack: true with conversations succeeded" >&2
    exit 1
fi
grep -q "conversation, whose loss mask packed blocks do not keep" "$tmp/c.log" ||
    { cat "$tmp/c.log"; exit 1; }

python3 - "$tmp" <<'PY'
import json, struct, sys
tmp = sys.argv[1]

def read(prefix):
    idx = open(prefix + ".idx", "rb").read()
    ids = open(prefix + ".bin", "rb").read()
    assert idx[:8] == b"RFTOKIDX"
    ver, flags, n, ntok, vocab, eos, pad, block = struct.unpack_from("<IIQQIiiI", idx, 8)
    toks = struct.unpack("<%dI" % ntok, ids)
    mask = open(prefix + ".mask", "rb").read()
    assert len(mask) == ntok, (len(mask), ntok)
    seqs = []
    for i in range(n):
        start, ln, label, cluster = struct.unpack_from("<QIiQ", idx, 64 + 24 * i)
        seqs.append((toks[start:start + ln], mask[start:start + ln]))
    return eos, seqs

vocab = json.load(open(f"{tmp}/chat/tokenizer.json"))["model"]["vocab"]
inv = {v: k for k, v in vocab.items()}
inv.update({50257: "<|im_start|>", 50258: "<|im_end|>"})
def text(ids):  # byte-level BPE pieces of ASCII text
    return "".join(inv[t] for t in ids).replace("\u0120", " ").replace("\u010a", "\n")

st = json.load(open(f"{tmp}/a/stats.json"))
ing, tk = st["ingest"], st["tokenizer"]
assert ing["kept"] == 40 and ing["rejected"]["missing_response"] == 1, ing
assert ing["rejected"]["no_assistant"] == 1, ing
total = 0
n = 0
for split in ("train", "eval"):
    eos, seqs = read(f"{tmp}/a/tokenizer/{split}")
    assert eos == 50258, eos
    n += len(seqs)
    for ids, m in seqs:
        first = m.index(1)
        assert set(m[:first]) == {0} and set(m[first:]) == {1}, m  # prompt, then answer
        assert text(ids[:first]).endswith("<|im_end|>\n<|im_start|>assistant\n"), text(ids[:first])
        assert text(ids[first:]) in ("yes<|im_end|>\n<|im_end|>", "no<|im_end|>\n<|im_end|>")
        assert len(ids) - first == 4, ids[first:]  # "yes"/"no", <|im_end|>, "\n", EOS
        total += len(ids) - first
        sys_turn = text(ids).split("<|im_end|>")[0]
        own = "<|im_start|>system\nAnswer." == sys_turn
        default = sys_turn.startswith("<|im_start|>system\nYou are a helpful AI assistant")
        assert own != default and own == text(ids).endswith("no<|im_end|>\n<|im_end|>"), sys_turn
    assert tk[split]["target_tokens"] == sum(len(ids) - ids_m.index(1) for ids, ids_m in seqs)
assert n == 40, n
print("chat stage:", n, "conversations,", total, "target tokens")

st = json.load(open(f"{tmp}/b/stats.json"))
assert st["tokenizer"]["rejected"]["chat_failed"] == 40, st["tokenizer"]
print("no template: 40 conversations rejected as chat_failed")
PY
echo "chat_stage.test.sh: ok"

#!/usr/bin/env bash
# The tokenizer stage under `refinery run`: ingest -> tokenizer on SST-2 dev
# (sequences) and WikiText-2 valid (causal-LM packing with GPT-2). Checks the
# shards with an independent reader of the documented format (shard.h), the
# split, the report, and that thread count does not change a byte.
set -euo pipefail
: "${REFINERY_BIN:?}"
[ -d "${SHARED:-}/data" ] || { echo "stage.test.sh: SHARED ($SHARED) has no data/; it must point at ../shared" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

spec() { # threads pack
    cat <<EOF2
run:
  name: tok
  threads: $1
ingest:
  inputs: [$SHARED/data/$2]
  preset: $3
tokenizer:
  tokenizer: $4
  max_length: 64
  eval_fraction: 0.2
  pack: $5
  block_len: 128
  batch_size: 16
  partitions: 2
EOF2
}
minilm=$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
gpt2=$SHARED/models/tiny-gpt2/tokenizer.json
spec 1 sst2/dev.tsv sst2 "$minilm" false > "$tmp/a1.yaml"
spec 2 sst2/dev.tsv sst2 "$minilm" false > "$tmp/a2.yaml"
spec 2 wikitext2/wiki.valid.raw wikitext "$gpt2" true > "$tmp/p.yaml"
for s in a1 a2 p; do
    "$REFINERY_BIN" run "$tmp/$s.yaml" --out "$tmp/$s" --no-progress > "$tmp/$s.log" 2>&1 ||
        { cat "$tmp/$s.log"; exit 1; }
done
for f in train.bin train.idx eval.bin eval.idx; do cmp "$tmp/a1/tokenizer/$f" "$tmp/a2/tokenizer/$f"; done

python3 - "$tmp" <<'PY'
import json, os, struct, sys
tmp = sys.argv[1]

def read_shard(prefix):
    idx = open(prefix + ".idx", "rb").read()
    ids = open(prefix + ".bin", "rb").read()
    assert idx[:8] == b"RFTOKIDX", "magic"
    ver, flags, n, ntok, vocab, eos, pad, block = struct.unpack_from("<IIQQIiiI", idx, 8)
    assert ver == 1 and len(idx) == 64 + 24 * n and len(ids) == 4 * ntok
    toks = struct.unpack("<%dI" % ntok, ids)
    assert all(t < vocab for t in toks)
    seqs, at = [], 0
    for i in range(n):
        start, ln, label, cluster = struct.unpack_from("<QIiQ", idx, 64 + 24 * i)
        assert start == at, "contiguous"
        seqs.append((toks[start:start + ln], label, cluster))
        at += ln
    assert at == ntok
    return flags, block, eos, seqs

# SST-2 dev: [CLS] ... [SEP] sequences with labels, split ~20% eval by cluster hash
_, _, _, train = read_shard(f"{tmp}/a2/tokenizer/train")
_, _, _, evl = read_shard(f"{tmp}/a2/tokenizer/eval")
n = len(train) + len(evl)
assert n == 872, n
assert 0.12 < len(evl) / n < 0.28, len(evl)
for ids, label, cluster in train + evl:
    assert ids[0] == 101 and ids[-1] == 102 and len(ids) <= 64 and label in (0, 1) and cluster
assert not {c for _, _, c in train} & {c for _, _, c in evl}, "a cluster on both sides"
rep = json.load(open(f"{tmp}/a2/tokenizer/report.json"))
pf = rep["splits"]["train"]["padding_fraction"]
assert pf["length_bucketed"] < 0.05 < pf["fixed_length"], pf
print("sst2 dev:", len(train), "train,", len(evl), "eval, padding", pf)

# WikiText packing: fixed 128-token blocks, EOS (50256) between documents
flags, block, eos, blocks = read_shard(f"{tmp}/p/tokenizer/train")
assert flags == 1 and block == 128 and eos == 50256 and len(blocks) > 100
assert all(len(b) == 128 for b, _, _ in blocks)
assert sum(b.count(50256) for b, _, _ in blocks) > 50
print("wikitext packed:", len(blocks), "train blocks")
PY
echo "stage.test.sh: ok"

#!/usr/bin/env python3
"""Reference ids of SmolLM2's GGUF tokenizer, from transformers, for
tests/trainer/test_gguf_tokenizer.c.

transformers builds the tokenizer from the GGUF metadata itself
(AutoTokenizer.from_pretrained(dir, gguf_file=...), which needs PyPI `gguf`).
Texts: the first 1000 non-empty lines of WikiText-2 test (bytes before each
'\\n'), the first 1000 reviews (string reviewText) of Amazon All_Beauty_5,
the committed tokenizer adversarial texts and a few chat-formatted strings.
Writes, in tests/fixtures/gguf/:
  smollm2_tokens.txt    per corpus a digest of its texts, then per text
                        "<n ids> <xxh3-64 of the little-endian uint32 ids, low 32 bits>"
  smollm2_samples.jsonl full ids of the first 3 and every 50th corpus text
                        (by corpus and index: no corpus text is committed), and of
                        every adversarial and chat text (with the text and what
                        Tokenizer.decode(ids) gives back), and of 4 pairs
                        (Tokenizer.encode(a, b): ids and type ids)

Usage: needs the model (scripts/fetch-smollm2.sh) and ../shared. Run with the
parity venv's python and a small venv holding `gguf` on the path:
    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf==0.17.1
    PYTHONPATH=/tmp/venv-gguf/lib/python3.11/site-packages \\
        /work/main/.venv-parity/bin/python scripts/parity/gguf_tokenizer_fixtures.py
"""
import gzip
import json
import os
import struct
import sys

import tokenizers
import transformers
import xxhash
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
MODEL = os.environ.get("SMOLLM2_DIR", os.path.join(ROOT, "build", "models", "smollm2-135m"))
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = os.environ.get("OUT", os.path.join(ROOT, "tests", "fixtures", "gguf"))
# texts per corpus (a larger N, with OUT elsewhere, makes a one-off check:
# REFINERY_GGUF_TOK_FIXTURE=$OUT/smollm2_tokens.txt build/tests/trainer/test_gguf_tokenizer)
N = int(os.environ.get("N", "1000"))


def wikitext_lines():
    data = open(os.path.join(SHARED, "data", "wikitext2", "wiki.test.raw"), "rb").read()
    return [p for p in data.split(b"\n") if p][:N]


def amazon_reviews():
    out = []
    with gzip.open(os.path.join(SHARED, "data", "amazon", "All_Beauty_5.json.gz"), "rb") as f:
        for line in f:
            t = json.loads(line).get("reviewText")
            if isinstance(t, str):
                # lone surrogates from \\u escapes become U+FFFD, as in common/json.h
                t = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in t)
                out.append(t.encode("utf-8"))
                if len(out) == N:
                    break
    return out


def chat_texts():
    return [
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nIs this review positive or negative?<|im_end|>\n"
        "<|im_start|>assistant\npositive<|im_end|>\n",
        "<|endoftext|>a<|endoftext|><|endoftext|>", "<|im_start|<|im_end|>>", "<repo_name>x<file_sep>",
        "Numbers: 12345 3.14159 1,000,000 2023-11-25 x86_64 ½ ² Ⅻ ٣",
        # bytes without a token in SmolLM2's vocabulary (0x04, 0x06, 0x13, 0xF1, ...)
        "a\x04b \x06\x13-\x14- x\U00040000y --\x16--", "\x04", "\x1d\x1d \U0007ffff",
    ]


def text_digest(texts):
    h = xxhash.xxh3_64(seed=0)
    for t in texts:
        h.update(struct.pack("<Q", len(t)))
        h.update(t)
    return h.intdigest()


def ids_hash(ids):
    return xxhash.xxh3_64_intdigest(struct.pack("<%dI" % len(ids), *ids)) & 0xFFFFFFFF


def main():
    tok = AutoTokenizer.from_pretrained(MODEL, gguf_file=GGUF)
    backend = tok.backend_tokenizer
    adversarial = [json.loads(l) for l in open(os.path.join(ROOT, "tests", "fixtures", "tokenizer",
                                                            "adversarial.jsonl"), encoding="utf-8")]
    corpora = {"wikitext_test": wikitext_lines(), "amazon_beauty": amazon_reviews()}
    os.makedirs(OUT, exist_ok=True)
    samples = []
    with open(os.path.join(OUT, "smollm2_tokens.txt"), "w") as f:
        f.write(f"# SmolLM2-135M-Instruct GGUF tokenizer: transformers {transformers.__version__} "
                f"(AutoTokenizer gguf_file=), tokenizers {tokenizers.__version__}\n")
        for name, texts in corpora.items():
            strs = [t.decode("utf-8") for t in texts]
            encs = backend.encode_batch(strs)
            for i in (0, 1, len(strs) - 1):  # the high-level call gives the same ids
                assert tok(strs[i])["input_ids"] == encs[i].ids
            f.write(f"# corpus {name} texts={len(texts)} text_digest={text_digest(texts):016x}\n")
            for i, e in enumerate(encs):
                f.write(f"{len(e.ids)} {ids_hash(e.ids):08x}\n")
                if i < 3 or i % 50 == 0:
                    samples.append({"corpus": name, "index": i, "ids": e.ids})
            print(f"{name}: {len(texts)} texts, {sum(len(e.ids) for e in encs)} ids", file=sys.stderr)
    for t in adversarial + chat_texts():
        ids = tok(t)["input_ids"]
        assert ids == backend.encode(t).ids
        decoded = backend.decode(ids, skip_special_tokens=False)
        samples.append({"text": t, "ids": ids, "decoded": decoded})
    # pairs: the template (A, then B with type id 1, no special tokens)
    ch = chat_texts()
    for a, b in [(ch[0], ch[1]), ("Is it good?", " Yes<|im_end|>"), ("", "x"), (adversarial[5], ch[4])]:
        e = backend.encode(a, b)
        samples.append({"text": a, "pair": b, "ids": e.ids, "type_ids": e.type_ids})
    with open(os.path.join(OUT, "smollm2_samples.jsonl"), "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()

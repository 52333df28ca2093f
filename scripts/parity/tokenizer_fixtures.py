#!/usr/bin/env python3
"""Generates the tokenizer parity fixtures in tests/fixtures/tokenizer/ with the
real Hugging Face `tokenizers` package.

Run: $(scripts/pyenv.sh parity)/bin/python scripts/parity/tokenizer_fixtures.py

For every (tokenizer, corpus) pair it writes <tokenizer>.<corpus>.hashes.gz:
  line 1: "# texts=N text_digest=HEX tokenizers=VERSION"
  then one line per text: 8 hex digits, the low 32 bits of
  xxh3_64(seed 0) over the ids of Tokenizer.encode(text) as little-endian uint32.
text_digest is xxh3_64 over every text as <u64 little-endian byte length><bytes>,
so the C test can tell "I read the corpus differently" from "I tokenized it
differently". <tokenizer>.samples.jsonl holds full ids (with and without special
tokens), decode() output and pair encodings for a sample.

Definitions shared with tests/tokenizer/test_parity.c (change both together):
  sst2_train, sst2_dev   each row after the header of train.tsv / dev.tsv: the
                         bytes before the first tab (the sentence column)
  amazon_beauty,         reviewText of each JSON line of the .json.gz files
  amazon_appliances      (lines without a string reviewText are skipped)
  amazon_musical         column 5 (reviewText) of each CSV record (RFC 4180)
  wikitext_valid/test    every line: bytes before each '\\n'; a '\\r' stays
  adversarial            the JSON strings of tests/fixtures/tokenizer/adversarial.jsonl
  codepoints_spaced      every code point except surrogates, in blocks of 256
                         joined by ' '
  codepoints_dense       the same blocks with nothing between the code points
Texts are UTF-8; the shared corpora are valid UTF-8 (asserted here).
"""
import csv
import gzip
import json
import os
import struct
import sys

import tokenizers
import xxhash
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("SHARED", os.path.join(os.path.dirname(ROOT), "shared"))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
SAMPLE_EVERY = 1999
DECODE_CORPORA = ("sst2_dev", "wikitext_valid", "adversarial", "codepoints_spaced")


def lines_of(path):
    data = open(path, "rb").read()
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return parts


def sst2(name):
    rows = lines_of(os.path.join(SHARED, "data", "sst2", name))[1:]
    return [r.split(b"\t")[0] for r in rows]


def amazon_json(name):
    out = []
    with gzip.open(os.path.join(SHARED, "data", "amazon", name), "rb") as f:
        for line in f:
            obj = json.loads(line)
            t = obj.get("reviewText")
            if isinstance(t, str):
                # lone surrogates from \\u escapes become U+FFFD, as in common/json.h
                t = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in t)
                out.append(t.encode("utf-8"))
    return out


def amazon_csv(name):
    csv.field_size_limit(1 << 30)
    path = os.path.join(SHARED, "data", "amazon", name)
    with open(path, newline="", encoding="utf-8") as f:
        return [row[4].encode("utf-8") for row in csv.reader(f) if len(row) > 4]


def wikitext(name):
    return lines_of(os.path.join(SHARED, "data", "wikitext2", name))


def codepoint_blocks(sep):
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    return [sep.join(chr(c) for c in cps[i:i + 256]).encode("utf-8") for i in range(0, len(cps), 256)]


def adversarial_texts():
    """Hand-written hard cases; written to adversarial.jsonl (committed)."""
    t = [
        "", " ", "  ", "\t", "\n", "\r", "\r\n", " \r\n ", "a\rb", "\x00", "a\x00b", "\x0b\x0c\x85",
        "\x1f\x7f\x9f", "\u200b\u200c\u200d\u2060\ufeff", "zero\u200bwidth", "soft\u00adhyphen",
        "e\u0301", "\u00e9", "e\u0301\u0301\u0327", "a\u0316\u0301b", "\u1e9b\u0323", "Å Å Å",
        "\u0130stanbul \u0131", "STRASSE stra\u00dfe \u1e9e", "\u03a3\u039f\u03a3 \u03c3\u03bf\u03c2",
        "\ufb01ne \ufb03", "\u2160\u2161 \u2460", "\uff21\uff22\uff23\uff41", "\u212b\u2126",
        "\u4e2d\u6587\u5b57\u7b26 mixed\u4e2d\u6587", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
        "\U00020000\U0002a6df\U0002a700\U0002b820\U0002ceb0\U0002f800",
        "\U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
        "\U0001f1fa\U0001f1f8\U0001f3f3\ufe0f\u200d\U0001f308 \u2764\ufe0f \U0001fae0\U0001f972",
        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea",
        "\u202eRTL override\u202c \u200f\u200e \u2066isolate\u2069",
        "\u0915\u094d\u0937 \u0939\u093f\u0928\u094d\u0926\u0940", "\u1100\u1161\u11a8 \uac00",
        "\ue000\U000f0000 private", "\ufffd\ufffe\uffff", "\U0010ffff\U000e0001",
        "a" * 99, "a" * 100, "a" * 101, "b" * 5000, "\u00e9" * 150, "x" + "\u0301" * 300,
        "supercalifragilisticexpialidocious" * 4, "antidisestablishmentarianism",
        "     leading", "trailing     ", "a     b", "a \t\n b", "\n\n\n", " \n a", "a  \n  b",
        "\u3000ideographic\u3000space", "nbsp\u00a0here", "\u2028line\u2029para", "\u1680ogham",
        "0123456789", "3.14159 2,718 1e10 -42 +7 0x1F", "\u0660\u0661\u0662 \u0966\u0967 \u00bd\u00b2",
        "1,000,000.00 $5 \u20ac10 \u00a3\u00a5", "2023-11-22T09:16:14Z",
        "!!!???...,,,;;;:::", "---___===+++***", "((([[[{{{}}}]]])))", "\"'`\u2018\u2019\u201c\u201d",
        "\u2014\u2013\u2026\u00ab\u00bb\u00bf\u00a1", "<html><b>bold</b></html>", "http://x.y/z?a=1&b=2#c",
        "foo@bar.com #hashtag @user", "don't won't I'm you're they've we'll she'd it's",
        "DON'T I'M 'S 'T", "''s ''t 'll'", "rock 'n' roll", "O'Neil's", "'", "''", "'s",
        "a'sb 're've", "  's", "[CLS] [SEP] [PAD] [MASK] [UNK]", "[cls] [Sep]", "x[SEP]y[SEP]",
        "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", "<|endoftext", "< |endoftext|>",
        " <|endoftext|> ", "\u00c0\u00c1\u00c2\u00c3\u00c4\u00c5\u00c6\u00c7 \u00e0\u00e1\u00e2",
        "na\u00efve caf\u00e9 r\u00e9sum\u00e9 co\u00f6perate", "\u0178\u00ff \u0152\u0153",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354L\u0348\u0347\u0330",
        "\u0301leading mark", "mark at end\u0301", "\u00a8\u00b4 spacing marks",
        "tab\tsep\tvalues", "mixed CASE WoRdS", "HTTP/1.1 200 OK", "C++ C# F# .NET",
        "\u00b5\u00b5 \u03bc", "\u2102\u2115\u211a", "\U0001d400\U0001d401 \U0001d7ce",
        "\u00ad", "\u034f", "\u180e", "\u061c", "\ufe0f", "\U000e007f",
    ]
    return t


def write_adversarial():
    texts = adversarial_texts()
    path = os.path.join(OUT, "adversarial.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for s in texts:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    return [s.encode("utf-8", "surrogatepass") for s in texts]


def gpt2_from_files():
    """What transformers' GPT2TokenizerFast builds from vocab.json + merges.txt
    (convert_slow_tokenizer.GPT2Converter): BPE without dropout or prefixes,
    ByteLevel pre-tokenizer without prefix space, ByteLevel decoder, ByteLevel
    post-processor (trim_offsets=False), <|endoftext|> a special added token."""
    d = os.path.join(SHARED, "data", "tokenizers", "gpt2")
    vocab, merges = BPE.read_file(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))
    tok = Tokenizer(BPE(vocab, merges, dropout=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def bert_from_vocab_txt():
    """What transformers' BertTokenizerFast builds from a vocab.txt (uncased)."""
    from tokenizers import normalizers
    from tokenizers.models import WordPiece
    path = os.path.join(SHARED, "data", "tokenizers", "bert-base-uncased", "vocab.txt")
    tok = Tokenizer(WordPiece(WordPiece.read_file(path), unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def ids_hash(ids):
    return xxhash.xxh3_64_intdigest(struct.pack("<%dI" % len(ids), *ids)) & 0xFFFFFFFF


def text_digest(texts):
    h = xxhash.xxh3_64(seed=0)
    for t in texts:
        h.update(struct.pack("<Q", len(t)))
        h.update(t)
    return h.intdigest()


def main():
    os.makedirs(OUT, exist_ok=True)
    corpora = {
        "sst2_train": lambda: sst2("train.tsv"),
        "sst2_dev": lambda: sst2("dev.tsv"),
        "amazon_beauty": lambda: amazon_json("All_Beauty_5.json.gz"),
        "amazon_appliances": lambda: amazon_json("Appliances_5.json.gz"),
        "amazon_musical": lambda: amazon_csv("Musical_instruments_reviews.PARTIAL.csv"),
        "wikitext_valid": lambda: wikitext("wiki.valid.raw"),
        "wikitext_test": lambda: wikitext("wiki.test.raw"),
        "adversarial": write_adversarial,
        "codepoints_spaced": lambda: codepoint_blocks(" "),
        "codepoints_dense": lambda: codepoint_blocks(""),
    }
    tokenizers_ = {
        "minilm": lambda: Tokenizer.from_file(
            os.path.join(SHARED, "data", "tokenizers", "all-MiniLM-L6-v2", "tokenizer.json")),
        "gpt2": gpt2_from_files,
        "tinygpt2": lambda: Tokenizer.from_file(os.path.join(SHARED, "models", "tiny-gpt2", "tokenizer.json")),
        "bertvocab": bert_from_vocab_txt,
    }
    # the vocab.txt layout is checked on the smaller corpora only (fixture size)
    only = {"bertvocab": {"sst2_dev", "adversarial", "wikitext_valid", "codepoints_spaced", "codepoints_dense"}}
    texts = {}
    for name, fn in corpora.items():
        texts[name] = fn()
        for i, t in enumerate(texts[name]):
            t.decode("utf-8")  # the corpora must be valid UTF-8 (raises otherwise)
    for tname, make in tokenizers_.items():
        tok = make()
        tok.no_padding()  # encode() never pads with BatchLongest; encode_batch would
        samples = []
        for cname, tx in texts.items():
            if tname in only and cname not in only[tname]:
                continue
            strs = [t.decode("utf-8") for t in tx]
            encs = tok.encode_batch(strs)
            path = os.path.join(OUT, f"{tname}.{cname}.hashes.gz")
            with gzip.GzipFile(path, "wb", mtime=0) as f:
                f.write(f"# texts={len(tx)} text_digest={text_digest(tx):016x} "
                        f"tokenizers={tokenizers.__version__}\n".encode())
                f.write("".join(f"{ids_hash(e.ids):08x}\n" for e in encs).encode())
            if cname in DECODE_CORPORA:
                decoded = tok.decode_batch([e.ids for e in encs])
                path = os.path.join(OUT, f"{tname}.{cname}.decode.gz")
                with gzip.GzipFile(path, "wb", mtime=0) as f:
                    f.write(f"# texts={len(tx)} text_digest={text_digest(tx):016x} "
                            f"tokenizers={tokenizers.__version__}\n".encode())
                    f.write("".join(f"{xxhash.xxh3_64_intdigest(d.encode('utf-8')) & 0xFFFFFFFF:08x}\n"
                                    for d in decoded).encode())
            for i in list(range(min(3, len(tx)))) + list(range(3, len(tx), SAMPLE_EVERY)):
                ids = encs[i].ids
                samples.append({"corpus": cname, "index": i, "ids": ids,
                                "ids_no_special": tok.encode(strs[i], add_special_tokens=False).ids,
                                "decoded": tok.decode(ids)})
            print(f"{tname}.{cname}: {len(tx)} texts", file=sys.stderr)
        # pairs: consecutive SST-2 dev sentences, and long WikiText lines that truncate
        for cname, step in (("sst2_dev", 97), ("wikitext_valid", 251)):
            tx = texts[cname]
            for i in range(0, len(tx) - 1, step):
                e = tok.encode(tx[i].decode("utf-8"), tx[i + 1].decode("utf-8"))
                samples.append({"corpus": cname, "pair": [i, i + 1], "ids": e.ids,
                                "type_ids": e.type_ids})
        with open(os.path.join(OUT, f"{tname}.samples.jsonl"), "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()

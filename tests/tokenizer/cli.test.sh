#!/usr/bin/env bash
# `refinery tokenize` end to end: ids per line equal to HF's (from the committed
# samples) on a CRLF corpus, --no-special-tokens, --format jsonl, --threads,
# stdin, a last line without '\n', and usage/runtime exit codes.
set -euo pipefail
: "${REFINERY_BIN:?}" "${REFINERY_ROOT:?}"
[ -d "${SHARED:-}/data" ] || { echo "cli.test.sh: SHARED ($SHARED) has no data/; it must point at ../shared" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=$REFINERY_ROOT/tests/fixtures/tokenizer
wiki=$SHARED/data/wikitext2/wiki.valid.raw
minilm=$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
gpt2=$SHARED/data/tokenizers/gpt2/vocab.json

check_samples() { # name tokenizer extra-flags key
    "$REFINERY_BIN" tokenize --tokenizer "$2" --input "$wiki" $3 > "$tmp/$1.ids"
    python3 - "$fx/$1.samples.jsonl" "$tmp/$1.ids" "$4" <<'PY'
import json, sys
samples, out, key = sys.argv[1], sys.argv[2], sys.argv[3]
lines = open(out).read().split("\n")[:-1]
n = 0
for s in map(json.loads, open(samples)):
    if s["corpus"] != "wikitext_valid" or "pair" in s:
        continue
    got = [int(x) for x in lines[s["index"]].split()]
    if got != s[key]:
        sys.exit(f"line {s['index']}: got {got[:12]}... want {s[key][:12]}...")
    n += 1
assert n >= 3, n
assert len(lines) == 3760, len(lines)
print(f"{samples}: {n} sampled lines match ({key})")
PY
}
check_samples minilm "$minilm" "" ids
check_samples gpt2 "$gpt2" "" ids
check_samples minilm "$minilm" --no-special-tokens ids_no_special

# threads do not change the output
"$REFINERY_BIN" tokenize --tokenizer "$minilm" --input "$wiki" --threads 2 > "$tmp/t2.ids"
cmp "$tmp/t2.ids" <("$REFINERY_BIN" tokenize --tokenizer "$minilm" --input "$wiki")
cmp "$tmp/gpt2.ids" <("$REFINERY_BIN" tokenize --tokenizer "$gpt2" --input "$wiki" --threads 2)

# stdin, a last line without '\n', an empty line, CR kept
printf 'Hello world\n\nlast\r' | "$REFINERY_BIN" tokenize --tokenizer "$gpt2" > "$tmp/stdin.ids"
printf '15496 995\n\n12957 201\n' | cmp - "$tmp/stdin.ids"

# jsonl carries the same ids plus type ids and attention mask
printf 'the cat\n' | "$REFINERY_BIN" tokenize --tokenizer "$minilm" --format jsonl > "$tmp/j"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d=={"ids":[101,1996,4937,102],"type_ids":[0,0,0,0],"attention_mask":[1,1,1,1]}, d' "$tmp/j"

# exit codes: 2 usage, 1 runtime
set +e
"$REFINERY_BIN" tokenize --input "$wiki" >/dev/null 2>&1; [ $? -eq 2 ] || { echo "missing --tokenizer should exit 2"; exit 1; }
"$REFINERY_BIN" tokenize --tokenizer "$minilm" --format xml </dev/null >/dev/null 2>&1; [ $? -eq 2 ] || { echo "bad --format should exit 2"; exit 1; }
"$REFINERY_BIN" tokenize --tokenizer /nonexistent.json </dev/null >/dev/null 2>"$tmp/err"; [ $? -eq 1 ] || { echo "missing tokenizer should exit 1"; exit 1; }
grep -q nonexistent "$tmp/err" || { echo "error should name the file"; cat "$tmp/err"; exit 1; }
printf 'bad \xff byte\n' | "$REFINERY_BIN" tokenize --tokenizer "$minilm" > "$tmp/o" 2>"$tmp/err"; [ $? -eq 0 ] || exit 1
grep -q "1 lines had invalid UTF-8" "$tmp/err" || { echo "repair not reported"; cat "$tmp/err"; exit 1; }
echo "cli.test.sh: ok"

#!/usr/bin/env bash
# `refinery ingest` on the crafted bad-input corpus (tests/ingest/badinput/) and
# on inputs generated here (a 100 MB line, compressed and truncated files):
# every record must end in the output or in the rejects with the expected
# reason, nothing crashes, memory stays bounded. Quality filters are off
# (--no-quality) so the reasons asserted are the readers' and the cleaner's.
set -euo pipefail
bin=${REFINERY_BIN:?REFINERY_BIN not set}
dir=$(cd "$(dirname "$0")" && pwd)/badinput
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR

fail() { echo "FAIL: $*" >&2; exit 1; }

# check STATS.json 'python expression over s (the ingest stats)' [message]
check() {
    python3 - "$1" "$2" <<'EOF' || fail "$1: $2"
import json, sys
s = json.load(open(sys.argv[1]))["ingest"]
r = s.get("rejected", {})
if not eval(sys.argv[2]):
    print("stats:", json.dumps(s, sort_keys=True), file=sys.stderr)
    sys.exit(1)
EOF
}

# Every record accounted for, and the files agree with the stats.
accounted() { # STATS DOCS REJECTS
    check "$1" "s['records_in'] == s['kept'] + sum(r.values()) == s['kept'] + s['rejected_total']"
    [ "$(wc -l <"$2")" -eq "$(python3 -c "import json;s=json.load(open('$1'))['ingest'];print(s['kept']+s['augmented'])")" ] ||
        fail "$2: line count differs from kept + augmented"
    [ "$(wc -l <"$3")" -eq "$(python3 -c "import json;print(json.load(open('$1'))['ingest']['rejected_total'])")" ] ||
        fail "$3: line count differs from rejected_total"
    python3 -c "import json,sys; [json.loads(l) for f in sys.argv[1:] for l in open(f, 'rb')]" "$2" "$3" ||
        fail "$2/$3: not valid JSON lines"
}

run() { # NAME ARGS... ; writes $tmp/NAME.{docs,rej,stats}
    local name=$1; shift
    "$bin" ingest "$@" --out "$tmp/$name.docs" --rejects "$tmp/$name.rej" \
        --stats "$tmp/$name.stats" 2>"$tmp/$name.err" || {
        local rc=$?
        cat "$tmp/$name.err"
        fail "$name: exit $rc"
    }
    accounted "$tmp/$name.stats" "$tmp/$name.docs" "$tmp/$name.rej"
}

# --- JSON Lines: malformed JSON, raw NUL, \u0000, invalid UTF-8, missing fields,
# non-numeric and out-of-range ratings, empty text, deep nesting, CRLF, no final newline.
run jsonl --preset amazon --no-quality "$dir/bad.jsonl"
check "$tmp/jsonl.stats" "s['records_in'] == 18 and s['lines_skipped'] == 1 and s['kept'] == 5"
check "$tmp/jsonl.stats" "r == {'invalid_json': 4, 'missing_text': 1, 'bad_label': 1, 'missing_label': 2,
    'unmapped_label': 1, 'empty': 2, 'not_an_object': 1, 'text_not_string': 1}"
check "$tmp/jsonl.stats" "s['clean']['utf8_repairs'] == 2 and s['clean']['nul_bytes'] == 1"
grep -q '"line":2,.*"reason":"invalid_json","detail":"JSON: ' "$tmp/jsonl.rej" || fail "reject lacks line/detail"
grep -q '"id":"bad.jsonl:19"' "$tmp/jsonl.docs" || fail "last line without newline was lost"

# The same with invalid UTF-8 rejected instead of repaired.
run jsonl_reject --preset amazon --no-quality --utf8 reject "$dir/bad.jsonl"
check "$tmp/jsonl_reject.stats" "r.get('invalid_utf8') == 1 and s['kept'] == 4"

# --- CSV (header-less Amazon rendering): multi-line quoted fields, bad and
# unterminated quotes, wrong field counts, bad/missing ratings, invalid UTF-8.
run csv --preset amazon --no-quality "$dir/bad.csv"
check "$tmp/csv.stats" "s['records_in'] == 11 and s['kept'] == 4"
check "$tmp/csv.stats" "r == {'csv_bad_quote': 2, 'csv_field_count': 1, 'bad_label': 1, 'empty': 1,
    'missing_label': 1, 'csv_unterminated_quote': 1}"
grep -q '"text":"Multi A review that spans three lines, with a blank one inside the quotes."' \
    "$tmp/csv.docs" || fail "multi-line quoted field not joined"
grep -q '"line":14,.*"reason":"csv_unterminated_quote"' "$tmp/csv.rej" || fail "unterminated quote line"

# --- TSV (SST-2 style): literal quotes, field counts, non-numeric label.
run tsv --preset sst2 --no-quality "$dir/bad.tsv"
check "$tmp/tsv.stats" "s['records_in'] == 6 and s['kept'] == 2 and s['lines_skipped'] == 1"
check "$tmp/tsv.stats" "r == {'csv_field_count': 2, 'bad_label': 1, 'empty': 1}"

# --- The same run from a --config spec (its ingest: section and inputs), and
# with --set: identical documents.
cat >"$tmp/cfg.yaml" <<YAML
ingest:
  preset: sst2
  quality_filter: false
  inputs: [$dir/bad.tsv]
YAML
"$bin" ingest --config "$tmp/cfg.yaml" --out "$tmp/cfg.docs" --rejects "$tmp/cfg.rej" 2>/dev/null ||
    fail "--config run failed"
cmp "$tmp/cfg.docs" "$tmp/tsv.docs" && cmp "$tmp/cfg.rej" "$tmp/tsv.rej" || fail "--config differs from flags"
run set --preset sst2 --set quality_filter=false "$dir/bad.tsv"
cmp "$tmp/set.docs" "$tmp/tsv.docs" || fail "--set differs from flags"

# --- Text: WikiText headings, blank separators, a raw NUL byte; paragraphs.
run text --preset wikitext --no-quality "$dir/bad.txt"
check "$tmp/text.stats" "s['records_in'] == 6 and r == {'heading': 2} and s['clean']['nul_bytes'] == 1"
run para --format text --paragraphs --no-quality "$dir/bad.txt"
check "$tmp/para.stats" "s['records_in'] == 4 and s['kept'] == 4 and s['lines_skipped'] == 4"

# --- A 100 MB line in JSON Lines: rejected as line_too_long without being held
# (peak RSS far below 100 MB), its neighbours kept. The same reader path in CSV
# and text with a 1 MB line over a 64 KB --max-line.
python3 - "$tmp" <<'EOF'
import sys
tmp = sys.argv[1]
good = b'{"overall": 5, "reviewText": "A short and perfectly ordinary review of the product."}\n'
with open(tmp + "/long.jsonl", "wb") as f:
    f.write(good + b'{"overall": 5, "reviewText": "')
    chunk = b"a" * (1 << 20)
    for _ in range(100):
        f.write(chunk)
    f.write(b'"}\n' + good)
big = b"b" * (1 << 20)
with open(tmp + "/long.txt", "wb") as f:
    f.write(b"first line of text\n" + big + b"\nlast line of text\n")
with open(tmp + "/long.csv", "wb") as f:
    f.write(b'text,label\n"quoted\n' + big + b'",1\nplain row,0\n')
EOF
run long_jsonl --preset amazon --no-quality "$tmp/long.jsonl"
check "$tmp/long_jsonl.stats" "s['kept'] == 2 and r == {'line_too_long': 1} and s['peak_rss_kb'] < 80000"
grep -q '"line":2,.*"reason":"line_too_long","detail":"104857632 bytes' "$tmp/long_jsonl.rej" ||
    fail "100 MB line: reject lacks its line or length"
run long_text --format text --no-quality --max-line 65536 "$tmp/long.txt"
check "$tmp/long_text.stats" "s['kept'] == 2 and r == {'line_too_long': 1}"
run long_csv --format csv --text-field text --label-field label --no-quality --max-line 65536 "$tmp/long.csv"
check "$tmp/long_csv.stats" "s['kept'] == 1 and r == {'line_too_long': 1}"
grep -q '"line":2,.*"reason":"line_too_long"' "$tmp/long_csv.rej" || fail "CSV too-long record line"
rm -f "$tmp"/long.*

# --- Compressed inputs read transparently: same documents as the plain file.
gzip -c "$dir/bad.jsonl" >"$tmp/c.jsonl.gz"
zstd -q -c "$dir/bad.jsonl" >"$tmp/c.jsonl.zst"
cp "$dir/bad.jsonl" "$tmp/c.jsonl"
run plain --preset amazon --no-quality "$tmp/c.jsonl"
for z in gz zst; do
    run "$z" --preset amazon --no-quality "$tmp/c.jsonl.$z"
    python3 - "$tmp/plain.docs" "$tmp/$z.docs" <<'EOF' || fail "$z: documents differ from plain"
import json, sys
strip = lambda f: [{k: v for k, v in json.loads(l).items() if k not in ("id", "source")} for l in open(f)]
sys.exit(strip(sys.argv[1]) != strip(sys.argv[2]))
EOF
done

# --- Thread count does not change a byte, augmentation included.
for t in 1 2 3; do
    run "aug$t" --preset amazon --threads $t --augment 2 --seed 7 "$dir/bad.jsonl" "$dir/bad.csv"
done
cmp "$tmp/aug1.docs" "$tmp/aug2.docs" && cmp "$tmp/aug1.docs" "$tmp/aug3.docs" || fail "docs depend on threads"
cmp "$tmp/aug1.rej" "$tmp/aug2.rej" && cmp "$tmp/aug1.rej" "$tmp/aug3.rej" || fail "rejects depend on threads"
check "$tmp/aug1.stats" "s['augmented'] == 2 * s['kept']"
grep -q '"aug_of":"bad.jsonl:1"' "$tmp/aug1.docs" || fail "augmented copies lack aug_of"

# --- Failures: clear message, non-zero exit, no partial output left behind.
expect_exit() { # CODE PATTERN ARGS...
    local code=$1 pat=$2; shift 2
    set +e
    "$bin" ingest "$@" >"$tmp/x.out" 2>"$tmp/x.err"
    local rc=$?
    set -e
    [ $rc -eq "$code" ] || { cat "$tmp/x.err"; fail "exit $rc, expected $code: $*"; }
    grep -q -- "$pat" "$tmp/x.err" || { cat "$tmp/x.err"; fail "message lacks '$pat': $*"; }
}
head -c 300 "$tmp/c.jsonl.gz" >"$tmp/trunc.jsonl.gz"
expect_exit 1 "trunc.jsonl.gz" "$tmp/trunc.jsonl.gz" --out "$tmp/t.docs" --rejects "$tmp/t.rej"
[ ! -e "$tmp/t.docs" ] || fail "partial output left after a failed run"
expect_exit 1 "no-such-file" "$tmp/no-such-file.jsonl" --out "$tmp/t.docs" --rejects "$tmp/t.rej"
expect_exit 2 "required" "$dir/bad.jsonl" --out "$tmp/t.docs"
expect_exit 2 "unknown preset 'imdb'" --preset imdb "$dir/bad.jsonl" --out "$tmp/t.docs" --rejects "$tmp/t.rej"
expect_exit 2 "ingest.threads" --threads many "$dir/bad.jsonl" --out "$tmp/t.docs" --rejects "$tmp/t.rej"
expect_exit 2 "label_map" --label-map 1-2 "$dir/bad.jsonl" --out "$tmp/t.docs" --rejects "$tmp/t.rej"
expect_exit 1 "column 'body'" --format csv --text-field body "$dir/bad.tsv" --out "$tmp/t.docs" --rejects "$tmp/t.rej"
echo "badinput: ok"

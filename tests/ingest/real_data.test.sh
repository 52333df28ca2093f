#!/usr/bin/env bash
# `refinery ingest` on the real shared data (../shared/data): every record of
# every file is accounted for, with the exact counts of shared/README.md, the
# per-reason counts are the same on every run and thread count, and the labels
# follow the reference mapping (ratings 3-5 -> 1, 1-2 -> 0).
set -euo pipefail
bin=${REFINERY_BIN:?REFINERY_BIN not set}
data=${SHARED:?SHARED not set}/data
[ -d "$data/amazon" ] && [ -d "$data/sst2" ] && [ -d "$data/wikitext2" ] || {
    echo "FAIL: shared data not found under $data (expected ../shared beside the repository)" >&2
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND" >&2' ERR
fail() { echo "FAIL: $*" >&2; exit 1; }

check() { # STATS 'python expression over s (ingest stats) and r (rejects)'
    python3 - "$1" "$2" <<'EOF' || fail "$1: $2"
import json, sys
s = json.load(open(sys.argv[1]))["ingest"]
r = s.get("rejected", {})
if not eval(sys.argv[2]):
    print("stats:", json.dumps(s, sort_keys=True), file=sys.stderr)
    sys.exit(1)
EOF
}

run() { # NAME ARGS...
    local name=$1; shift
    "$bin" ingest "$@" --out "$tmp/$name.docs" --rejects "$tmp/$name.rej" \
        --stats "$tmp/$name.stats" 2>"$tmp/$name.err" || { cat "$tmp/$name.err"; fail "$name"; }
    check "$tmp/$name.stats" "s['records_in'] == s['kept'] + sum(r.values()) == s['kept'] + s['rejected_total']"
    check "$tmp/$name.stats" "s['kept'] == $(wc -l <"$tmp/$name.docs") and s['rejected_total'] == $(wc -l <"$tmp/$name.rej")"
}

labels() { # DOCS -> "n0 n1"
    python3 -c "import json,sys,collections as c; k=c.Counter(json.loads(l).get('label') for l in open(sys.argv[1])); print(k[0], k[1])" "$1"
}

amazon=$data/amazon
# Exact record counts per file; none lost by the readers (no reader-level rejects).
reader_reasons="[k for k in r if k in ('invalid_json','not_an_object','line_too_long','csv_bad_quote',
    'csv_unterminated_quote','csv_field_count','csv_record_too_long','bad_label','unmapped_label','missing_label')] == []"
run beauty --preset amazon "$amazon/All_Beauty_5.json.gz"
check "$tmp/beauty.stats" "s['records_in'] == 5269 and $reader_reasons"
run appliances --preset amazon "$amazon/Appliances_5.json.gz"
check "$tmp/appliances.stats" "s['records_in'] == 2277 and $reader_reasons"
run instruments --preset amazon "$amazon/Musical_instruments_reviews.PARTIAL.csv"
check "$tmp/instruments.stats" "s['records_in'] == 5050 and $reader_reasons and s['lines_skipped'] == 0"

# All three at once, on 1 and 2 threads: byte-identical outputs, identical counts.
all=("$amazon/All_Beauty_5.json.gz" "$amazon/Appliances_5.json.gz" "$amazon/Musical_instruments_reviews.PARTIAL.csv")
run all1 --preset amazon --threads 1 "${all[@]}"
run all2 --preset amazon --threads 2 "${all[@]}"
check "$tmp/all1.stats" "s['records_in'] == 5269 + 2277 + 5050"
# The preset leaves out a summary contained in its review (text_join_skip_contained):
# measured 10 quality rejects with it, 196 when summary + review are always joined.
check "$tmp/all1.stats" "s['rejected_total'] == 10"
run nojoin --preset amazon --no-join-skip-contained "${all[@]}"
check "$tmp/nojoin.stats" "s['rejected_total'] == 196 and s['rejected'] == {'dup_ngram': 92, 'top_ngram': 104}"
cmp "$tmp/all1.docs" "$tmp/all2.docs" || fail "amazon documents differ between 1 and 2 threads"
cmp "$tmp/all1.rej" "$tmp/all2.rej" || fail "amazon rejects differ between 1 and 2 threads"
python3 - "$tmp/all1.stats" "$tmp/all2.stats" "$tmp/beauty.stats" "$tmp/appliances.stats" "$tmp/instruments.stats" <<'EOF' || fail "per-reason counts not stable"
import json, sys
load = lambda f: json.load(open(f))["ingest"]
a, b = load(sys.argv[1]), load(sys.argv[2])
keys = ("records_in", "kept", "rejected", "rejected_total", "lines_skipped", "bytes_in", "clean")
assert all(a.get(k) == b.get(k) for k in keys), "1 vs 2 threads"
parts = [load(f) for f in sys.argv[3:]]
assert a["kept"] == sum(p["kept"] for p in parts), "kept: files together vs one by one"
for reason, n in a.get("rejected", {}).items():
    assert n == sum(p.get("rejected", {}).get(reason, 0) for p in parts), reason
EOF

# Labels with the filters off: the rating histogram of shared/README.md mapped
# 3-5 -> 1 and 1-2 -> 0 (All_Beauty 5:4649 4:332 3:109 2:64 1:115).
run beauty_all --preset amazon --no-quality "$amazon/All_Beauty_5.json.gz"
check "$tmp/beauty_all.stats" "s['kept'] == 5269"
[ "$(labels "$tmp/beauty_all.docs")" = "179 5090" ] || fail "All_Beauty labels: $(labels "$tmp/beauty_all.docs")"
# The CSV: the same histogram as Python's csv module finds in the file.
run instruments_all --preset amazon --no-quality "$amazon/Musical_instruments_reviews.PARTIAL.csv"
want=$(python3 -c "
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline='', encoding='utf-8')))
print(sum(float(r[5]) <= 2 for r in rows), sum(float(r[5]) >= 3 for r in rows))" "$amazon/Musical_instruments_reviews.PARTIAL.csv")
[ "$(labels "$tmp/instruments_all.docs")" = "$want" ] || fail "CSV labels $(labels "$tmp/instruments_all.docs") != $want"

# SST-2: 67,349 train + 872 dev rows (label 1: 37,569 + 444, 0: 29,780 + 428).
run sst2 --preset sst2 --no-quality "$data/sst2/train.tsv" "$data/sst2/dev.tsv"
check "$tmp/sst2.stats" "s['records_in'] == 67349 + 872 and s['kept'] == 67349 + 872 and s['lines_skipped'] == 2"
[ "$(labels "$tmp/sst2.docs")" = "$((29780 + 428)) $((37569 + 444))" ] || fail "SST-2 labels: $(labels "$tmp/sst2.docs")"
run sst2_q --preset sst2 --threads 2 "$data/sst2/train.tsv" "$data/sst2/dev.tsv"
check "$tmp/sst2_q.stats" "s['records_in'] == 67349 + 872"

# WikiText: every line is a record, a blank separator or a heading reject.
wiki=$data/wikitext2/wiki.valid.raw
run wiki --preset wikitext "$wiki"
lines=$(wc -l <"$wiki")
headings=$(grep -c $'^ = .* = \r$' "$wiki")
blank=$(grep -c $'^ *\r$' "$wiki")
check "$tmp/wiki.stats" "s['records_in'] + s['lines_skipped'] == $lines and r.get('heading') == $headings and s['lines_skipped'] == $blank"
echo "real data: ok"

#!/usr/bin/env bash
# The run report in a real browser. A small run of all five stages (generated
# reviews with exact and near duplicates, lines that are not JSON, two of them
# carrying HTML that must stay text; the MiniLM-L6 tokenizer and weights, a
# few training steps) writes report.html; headless Chromium then
#   - dumps the DOM: every chart is an inline <svg> that draws something, no
#     <script>, nothing that loads from anywhere, the hostile strings are text
#     (tests/pipeline/report_check.py dom);
#   - takes a screenshot that is not blank and shows the chart colours
#     (report_check.py png, a PNG decoder in the standard library);
#   - logs the page's console to stderr (--enable-logging=stderr): no console
#     message at all is allowed. A control page with a failing script proves
#     that such a message is caught.
# `refinery report RUN_DIR` regenerates the same bytes.
# Skipped (77) only when Chromium is not installed (Debian package chromium,
# scripts/deps/debian.txt).
set -euo pipefail
cd "$REFINERY_ROOT"
chrome=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chrome" ] || { echo "SKIP: chromium is not installed (apt-get install chromium)"; exit 77; }
tok=$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
[ -f "$tok" ] || { echo "missing $tok (SHARED=$SHARED)" >&2; exit 1; }
model=$REFINERY_ROOT/build/models/minilm-l6
scripts/fetch-minilm.sh "$model" >/dev/null ||
    { echo "cannot fetch MiniLM-L6 into $model (scripts/fetch-minilm.sh)" >&2; exit 1; }
tmp=$(mktemp -d /tmp/rf-report.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp/reviews.jsonl" <<'PY'
import random, sys
random.seed(7)
pos = "great excellent love perfect works wonderful sturdy recommend".split()
neg = "broken awful returned useless cheap disappointed leaks refund".split()
filler = "the this blender mixer kettle arrived quickly box price color size".split()
lines = ['not json <script>alert(\'x\')</script>', '"><img src=x onerror=alert(1)> broken']
for i in range(90):
    y = 1 if i % 3 else 0
    words = random.sample(filler, 6) + random.sample(pos if y else neg, 3)
    random.shuffle(words)
    lines.append('{"text": "%s", "label": %d}' % (" ".join(words), y))
lines += lines[5:15]  # exact duplicates
lines.append('{"text": "%s extra", "label": 1}' % lines[20].split('"')[3])  # a near one
lines += ['{"text": "   ", "label": 1}', "{broken"]
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
PY
cat >"$tmp/spec.yaml" <<EOF
run:
  name: report-test
  threads: 2
ingest:
  format: jsonl
  inputs: [$tmp/reviews.jsonl]
  text_fields: text
  label_field: label
dedup:
  threshold: 0.7
tokenizer:
  tokenizer: $tok
  max_length: 32
  eval_fraction: 0.3
trainer:
  model: $model
  num_labels: 2
  epochs: 1
  max_len: 32
  max_steps: 6
  batch_size: 8
  lr: 1.0e-4
  warmup_ratio: 0.2
  seed: 1
evaluator:
  max_len: 32
EOF
"$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/run" --no-progress 2>"$tmp/run.log" ||
    { tail -20 "$tmp/run.log" >&2; exit 1; }
report=$tmp/run/report.html
[ -s "$report" ] && [ -s "$tmp/run/spec.yaml" ] || { echo "no report.html or spec.yaml" >&2; exit 1; }

# Chromium: headless, no sandbox (containers), a fresh profile each time.
chrome_run() { # chrome_run NAME ARGS... : stdout to $tmp/NAME.out, stderr to $tmp/NAME.err
    local name=$1
    shift
    timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --no-first-run \
        --user-data-dir="$tmp/profile-$name" --enable-logging=stderr --v=0 \
        --window-size=1100,6000 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
}
console() { grep -E ':CONSOLE[:(]' "$1" || true; }

# The control: a failing script must show up as a console message.
printf '<!DOCTYPE html><html><body><p>control</p><script>notDefined();</script></body></html>' \
    >"$tmp/control.html"
chrome_run control --dump-dom "file://$tmp/control.html"
console "$tmp/control.err" | grep -q 'notDefined is not defined' ||
    { echo "the console check does not see a script error" >&2; cat "$tmp/control.err" >&2; exit 1; }

chrome_run dom --dump-dom "file://$report"
chrome_run shot --screenshot="$tmp/shot.png" "file://$report"
for run in dom shot; do
    if [ -n "$(console "$tmp/$run.err")" ]; then
        echo "console messages while loading the report:" >&2
        console "$tmp/$run.err" >&2
        exit 1
    fi
done
python3 tests/pipeline/report_check.py dom "$tmp/dom.out" funnel rejects clusters tokens-train \
    tokens-eval loss lr grad-norm tokens-per-s stage-seconds confusion
python3 tests/pipeline/report_check.py png "$tmp/shot.png"
# the sections carry the run's data
for want in 'invalid_json' 'duplicate_exact' 'Worst-classified examples' 'padding: length-bucketed' \
    'threshold: 0.7'; do
    grep -q "$want" "$tmp/dom.out" || { echo "the report lacks '$want'" >&2; exit 1; }
done

# refinery report regenerates it, byte for byte
mv "$report" "$tmp/first.html"
"$REFINERY_BIN" report "$tmp/run" >/dev/null
cmp "$tmp/first.html" "$report"
rc=0
"$REFINERY_BIN" report "$tmp/nowhere" 2>/dev/null || rc=$?
[ $rc = 2 ] || { echo "refinery report of a missing directory: exit $rc, not 2" >&2; exit 1; }
echo PASS

#!/usr/bin/env bash
# The stage cache, retries and memory budgets of `refinery run` with the real
# stages: ingest (SST-2 dev TSV, copied so that a byte can change) -> dedup ->
# tokenizer (the tiny fixture's vocabulary) -> trainer (tiny BERT, 2 steps) ->
# evaluator. Checks: an unchanged rerun reuses every stage; a tokenizer setting
# reruns tokenizer, trainer and evaluator only; one byte of the input reruns
# everything; a corrupt entry is detected and rebuilt; --no-cache; an injected
# I/O failure is retried; a memory budget fails the stage naming it; refinery
# values; plain progress lines off a terminal.
set -euo pipefail
unset REFINERY__RUN__CACHE # tests/run.sh turns the cache off for the other tests
[ -f "$SHARED/data/sst2/dev.tsv" ] || { echo "missing $SHARED/data/sst2/dev.tsv" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fx=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
head -301 "$SHARED/data/sst2/dev.tsv" > "$tmp/dev.tsv"
cat > "$tmp/spec.yaml" <<YAML
run:
  name: cache-test
  threads: 2
  cache_dir: $tmp/cache
  retry_backoff: 0.01
ingest:
  preset: sst2
  inputs: [$tmp/dev.tsv]
dedup:
  ngram: 5
tokenizer:
  tokenizer: $fx/vocab.txt
  max_length: 16
  eval_fraction: 0.2
trainer:
  model: $fx
  num_labels: 2
  max_steps: 2
  batch_size: 16
  log_every: 0
  resources: {cpu: "1", memory: 2Gi}
evaluator:
  max_len: 16
YAML
run() { # NAME [ARGS...]: runs the spec into $tmp/NAME
    local name=$1
    shift
    "$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/$name" --no-progress "$@" >"$tmp/$name.log" 2>&1 ||
        { cat "$tmp/$name.log"; exit 1; }
}
# cached: prints "stage=true|false ..." from a run's stats.json
cached() {
    python3 - "$tmp/$1/stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(" ".join(f"{k}={str(s[k]['cached']).lower()}" for k in ("ingest", "dedup", "tokenizer", "trainer", "evaluator")))
PY
}
expect() { # RUN EXPECTED
    local got
    got=$(cached "$1")
    [ "$got" = "$2" ] || { echo "$1: expected '$2', got '$got'" >&2; cat "$tmp/$1.log" >&2; exit 1; }
    echo "$1: $got"
}

t0=$(date +%s.%N)
run first
t1=$(date +%s.%N)
expect first "ingest=false dedup=false tokenizer=false trainer=false evaluator=false"
run second
[ -n "${CACHE_TEST_KEEP:-}" ] && cp "$tmp/second.log" /tmp/second.log
t2=$(date +%s.%N)
expect second "ingest=true dedup=true tokenizer=true trainer=true evaluator=true"
python3 - "$tmp" "$t0" "$t1" "$t2" <<'PY'
import json, os, sys
tmp, t0, t1, t2 = sys.argv[1], *map(float, sys.argv[2:])
a, b = (json.load(open(f"{tmp}/{r}/stats.json")) for r in ("first", "second"))
for st in ("ingest", "dedup", "tokenizer", "trainer", "evaluator"):
    assert a[st]["key"] == b[st]["key"] and len(a[st]["key"]) == 32, st
    assert a[st]["attempts"] == 1 and b[st]["attempts"] == 0, st
# counters come back with the entries; outputs are links into the cache, not copies
assert a["dedup"]["kept"] == b["dedup"]["kept"] > 0
assert a["evaluator"]["accuracy"] == b["evaluator"]["accuracy"]
for d in ("ingest", "dedup", "tokenizer", "trainer", "model", "evaluator"):
    p = f"{tmp}/second/{d}"
    assert os.path.islink(p) and os.path.realpath(p).startswith(f"{tmp}/cache/"), p
    assert os.path.realpath(p) == os.path.realpath(f"{tmp}/first/{d}"), d
assert os.path.isfile(f"{tmp}/second/model/model.safetensors")
print(f"unchanged: first run {t1 - t0:.2f}s, second {t2 - t1:.2f}s, all cached")
PY

# a tokenizer setting: the tokenizer and what follows it run again
REFINERY__TOKENIZER__MAX_LENGTH=12 run maxlen
expect maxlen "ingest=true dedup=true tokenizer=false trainer=false evaluator=false"

# the same setting spelled differently (the default of a key written out) changes nothing
REFINERY__TOKENIZER__SEED=0 run seed
expect seed "ingest=true dedup=true tokenizer=true trainer=true evaluator=true"

# one byte of the input: everything
python3 - "$tmp/dev.tsv" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
i = b.index(b"\n") + 1  # the first character of the first review
b[i] = ord("X") if b[i] != ord("X") else ord("Y")
open(p, "wb").write(bytes(b))
PY
mkdir -p "$tmp/cache/ingest/0123.tmp.2147483646/out" # left by a killed run
run edited
test ! -e "$tmp/cache/ingest/0123.tmp.2147483646" # swept when ingest stored its entry
expect edited "ingest=false dedup=false tokenizer=false trainer=false evaluator=false"

# a corrupt entry (one byte of the model) is detected and rebuilt, never used
model=$(readlink -f "$tmp/edited/model")/model.safetensors
printf '\x01' | dd of="$model" bs=1 seek=100 conv=notrunc 2>/dev/null
run corrupt
expect corrupt "ingest=true dedup=true tokenizer=true trainer=false evaluator=true"
grep -q "unusable, rebuilding: out/model/model.safetensors: content differs" "$tmp/corrupt.log"
# so is a partial one (no COMPLETE marker); what follows keeps its entries (the keys chain)
rm "$(readlink -f "$tmp/corrupt/dedup")/../../COMPLETE"
run partial
expect partial "ingest=true dedup=false tokenizer=true trainer=true evaluator=true"

run nocache --no-cache
expect nocache "ingest=false dedup=false tokenizer=false trainer=false evaluator=false"
test -d "$tmp/nocache/tokenizer"
test ! -L "$tmp/nocache/tokenizer"

# an injected I/O failure: retried with retries, fatal without
REFINERY_TEST_FAIL=tokenizer:1 REFINERY__TOKENIZER__RETRIES=2 run retried --no-cache
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['tokenizer']['attempts']==2 and s['ingest']['attempts']==2, s['tokenizer']" "$tmp/retried/stats.json"
grep -q "stage tokenizer: attempt 1 of 3 failed" "$tmp/retried.log"
# refinery status RUN_DIR shows the attempts (and no server is needed)
"$REFINERY_BIN" status "$tmp/retried" > "$tmp/retried.status"
python3 - "$tmp/retried.status" "$tmp/retried" <<'PY'
import json, sys
s = json.loads(open(sys.argv[1]).read())
assert s["run_dir"] == sys.argv[2] and s["state"] == "succeeded" and s["error"] is None, s
st = {x["stage"]: x for x in s["stages"]}
assert list(st) == ["ingest", "dedup", "tokenizer", "trainer", "evaluator"], s
assert st["tokenizer"]["attempts"] == 2 and st["ingest"]["attempts"] == 2, s
assert st["trainer"]["attempts"] == 1 and not st["trainer"]["cached"], s
PY
"$REFINERY_BIN" status "$tmp/retried" --lines | grep -q "^$tmp/retried succeeded | ingest 2 attempts .* | tokenizer 2 attempts "
if REFINERY_TEST_FAIL=tokenizer:1 "$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/noretry" --no-cache \
    --no-progress >"$tmp/noretry.log" 2>&1; then
    echo "an injected failure without retries passed" >&2
    exit 1
fi
grep -q "injected transient failure 1 of 1" "$tmp/noretry.log"
echo "retries: attempt 2 passed; without retries the failure stops the run"

# a memory budget too small for the trainer (another seed, so that it runs, after
# cached stages, so that it allocates anew rather than reusing what they freed)
if REFINERY__TRAINER__RESOURCES__MEMORY=64Ki REFINERY__TRAINER__SEED=7 "$REFINERY_BIN" run \
    "$tmp/spec.yaml" --out "$tmp/mem" --no-progress >"$tmp/mem.log" 2>&1; then
    echo "a 64Ki budget passed" >&2
    exit 1
fi
grep -q "stage trainer exceeded its memory budget of 64 KiB (resources.memory: trainer 64 KiB)" "$tmp/mem.log" ||
    { cat "$tmp/mem.log"; exit 1; }
grep -q '"trainer":{"attempts":1,"cached":false' "$tmp/mem/stats.json" # failed once, not retried
"$REFINERY_BIN" status "$tmp/mem" --lines > "$tmp/mem.status"
grep -q "^$tmp/mem failed | .* | trainer 1 attempt .* | error: .*exceeded its memory budget of 64 KiB" "$tmp/mem.status" ||
    { cat "$tmp/mem.status"; exit 1; }
# a run directory without stats.json (killed, or still running) is unfinished
mkdir "$tmp/killed" && cp "$tmp/mem/run.log" "$tmp/killed/"
"$REFINERY_BIN" status "$tmp/killed" | grep -q '"state":"unfinished"'
echo "status: $(cat "$tmp/mem.status")"
echo "memory: $(grep -o 'stage trainer exceeded[^"]*' "$tmp/mem.log" | head -1)"

# deployment values
"$REFINERY_BIN" values "$tmp/spec.yaml" > "$tmp/values.yaml"
python3 - "$tmp/values.yaml" <<'PY'
import sys
text = open(sys.argv[1]).read()
assert 'trainer:\n  resources:\n    requests: {cpu: "1", memory: 2Gi}\n    limits: {cpu: "1", memory: 2Gi}' in text, text
PY

# progress off a terminal: plain log lines
"$REFINERY_BIN" run "$tmp/spec.yaml" --out "$tmp/plain" --no-cache --progress-every 0.01 \
    >"$tmp/plain.log" 2>&1
grep -q '"comp":"progress","msg":"[a-z]* running [0-9]' "$tmp/plain.log" || { cat "$tmp/plain.log"; exit 1; }
echo "progress: $(grep -c '"comp":"progress"' "$tmp/plain.log") plain lines"

#!/usr/bin/env bash
# Restartability of refinery dedup on real data (Amazon reviews + SST-2):
#  1. a run killed right after writing a batch but before committing it
#     (REFINERY_DEDUP_CRASH_AFTER), then restarted on the same index, ends with
#     outputs byte-identical to an uninterrupted run;
#  2. the same under real SIGKILLs at arbitrary moments;
#  3. the thread count does not change the output;
#  4. a corrupt index or other parameters on an existing index are refused clearly.
set -euo pipefail
: "${SHARED:?SHARED must point at the shared data folder}"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Amazon (7,546 reviews) + the first 20,000 SST-2 training sentences.
python3 "$here/make_input.py" "$SHARED/data/amazon/Appliances_5.json.gz" \
    "$SHARED/data/amazon/All_Beauty_5.json.gz" "$SHARED/data/sst2/train.tsv" >"$work/all.jsonl"
head -n 27546 "$work/all.jsonl" >"$work/in.jsonl"
ndocs=$(wc -l <"$work/in.jsonl")

dd() { # dd NAME [extra args]: one run into $work/NAME.{kept,dups}, index $work/NAME.idx
    local name=$1; shift
    "$REFINERY_BIN" dedup "$work/in.jsonl" --out "$work/$name.kept" --dups "$work/$name.dups" \
        --index "$work/$name.idx" --batch 500 "$@"
}
same() {
    cmp "$work/ref.kept" "$work/$1.kept" && cmp "$work/ref.dups" "$work/$1.dups" ||
        { echo "FAIL: $1 differs from the uninterrupted run"; exit 1; }
    local n=$(( $(wc -l <"$work/$1.kept") + $(wc -l <"$work/$1.dups") ))
    [ "$n" -eq "$ndocs" ] || { echo "FAIL: $1 accounts for $n of $ndocs documents"; exit 1; }
}

dd ref --threads 2 --stats "$work/ref.stats" 2>/dev/null
echo "reference: $ndocs docs, $(wc -l <"$work/ref.kept") kept"

# 1. Injected crash between the output fsync and the index commit.
set +e
REFINERY_DEDUP_CRASH_AFTER=12000 dd crash --threads 2 2>/dev/null
rc=$?
set -e
[ $rc -eq 137 ] || { echo "FAIL: injected crash exited $rc, expected SIGKILL (137)"; exit 1; }
partial=$(( $(wc -l <"$work/crash.kept") + $(wc -l <"$work/crash.dups") ))
[ "$partial" -ge 12000 ] && [ "$partial" -lt "$ndocs" ] || { echo "FAIL: partial output $partial"; exit 1; }
dd crash --threads 2 --stats "$work/crash.stats" 2>/dev/null
same crash
python3 - "$work/ref.stats" "$work/crash.stats" <<'PY'
import json, sys
a, b = (json.load(open(p))["dedup"] for p in sys.argv[1:])
for k in ("docs", "kept", "exact", "near", "clusters", "cluster_size", "pairs_checked"):
    assert a[k] == b[k], (k, a[k], b[k])
assert b["this_run"]["docs"] < b["docs"], "the restarted run should only decide the rest"
PY
echo "injected crash at 12000 docs: restart output identical"

# 2. Real SIGKILLs at arbitrary moments, restarting until the run completes.
kills=0
for delay in 0.2 0.3 0.25 0.4 0.3; do
    "$REFINERY_BIN" dedup "$work/in.jsonl" --out "$work/kill.kept" --dups "$work/kill.dups" \
        --index "$work/kill.idx" --batch 200 --threads 2 2>/dev/null &
    pid=$!
    sleep "$delay"
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" && kills=$((kills + 1)); fi
    wait "$pid" 2>/dev/null || true
done
dd kill --threads 2 --batch 200 2>/dev/null
same kill
echo "killed $kills times with SIGKILL: restart output identical"

# 3. One thread gives the same bytes.
dd one --threads 1 2>/dev/null
same one
echo "threads 1 vs 2: identical"

# 4. Clear errors.
if dd ref --bands 10 2>"$work/err"; then echo "FAIL: other parameters accepted"; exit 1; fi
grep -q "bands=20" "$work/err" || { cat "$work/err"; exit 1; }
python3 - "$work/ref.idx/index.rfdd" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x10
open(p, "wb").write(bytes(b))
PY
if dd ref 2>"$work/err"; then echo "FAIL: corrupt index accepted"; exit 1; fi
grep -Eq "checksum|corrupt|dedup index" "$work/err" || { cat "$work/err"; exit 1; }
echo "refused: $(tail -1 "$work/err")"
echo "restart test passed"

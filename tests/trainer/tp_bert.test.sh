#!/usr/bin/env bash
# Tensor parallelism inside the BERT classifier (issue 17; model.h
# rf_bert_tp_split) under scripts/mpirun.sh at 1, 2 and 4 ranks on the tiny
# fixture: build/trainer/tp_bert_check (see tests/trainer/tp_bert_check.c)
# splits the model over tp = world (and at 4 ranks dp 2 x tp 2) and compares
# logits, loss and every gradient with the whole model, dropout off and on
# (masks must not depend on tp), and the weights after 3 AdamW steps, within
# 1e-5 relative; replicated parameters must be the same bits on every tp
# rank. ~3 s, also under `make asan`. MiniLM-L6 by hand:
#   OMP_NUM_THREADS=1 scripts/mpirun.sh -np 2 build/trainer/tp_bert_check build/models/minilm-l6
# Skips (77) without mpirun or with a tp_bert_check built without MPI.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${REFINERY_BUILD:-$PWD/${BUILD:-build}}
bin=$BUILD_DIR/trainer/tp_bert_check
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -x "$bin" ] || { echo "FAIL: $bin is not built (make)"; exit 1; }
ldd "$bin" | grep -q libmpi || { echo "SKIP: $bin was built without MPI (no pkg-config ompi-c)"; exit 77; }
export REFINERY_LOG_FORMAT=text REFINERY_LOG_LEVEL=warn OMP_NUM_THREADS=1 REFINERY_COMM_TIMEOUT=60
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$PWD/tests/comm/lsan-openmpi.supp"
fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for np in 1 2 4; do
    if timeout -k 5 180 scripts/mpirun.sh -np $np "$bin" tests/fixtures/trainer/tiny-bert >"$log" 2>&1 &&
        grep -q "all checks passed at $np rank" "$log"; then
        n=$(grep -c '^ok ' "$log")
        worst=$(grep -oE 'rel err [0-9.e+-]+' "$log" | awk '{print $3}' | sort -g | tail -1)
        echo "ok: $np rank(s): $n checks, worst relative error $worst"
    else
        echo "FAIL: tp_bert_check at $np rank(s):"; sed 's/^/    /' "$log"; fail=1
    fi
done
exit $fail

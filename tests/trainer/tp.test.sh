#!/usr/bin/env bash
# Tensor-parallel building blocks (issue 17; services/trainer/tp.h) under
# scripts/mpirun.sh at 1, 2 and 4 ranks: build/trainer/tp_check (see
# tests/trainer/tp_check.c) runs the column- and row-parallel linears, the
# fused QKV split by heads, the vocab-parallel embedding and cross-entropy,
# the causal-LM loss (vs rf_op_causal_xent_*), an attention block and an MLP block on every mesh that fits (tp = world;
# at 4 ranks also dp 2 x tp 2) and compares each output and gradient with the
# unsplit op (within 1e-5 relative in fp32; it says which are bitwise), and
# replicated results across the tp ranks (bitwise). Sizes are tiny, so this
# stays short under `make asan` too. Every mpirun has an outer `timeout`.
# Skips (77) without mpirun or with a tp_check built without MPI.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${REFINERY_BUILD:-$PWD/${BUILD:-build}}
bin=$BUILD_DIR/trainer/tp_check
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -x "$bin" ] || { echo "FAIL: $bin is not built (make)"; exit 1; }
ldd "$bin" | grep -q libmpi || { echo "SKIP: $bin was built without MPI (no pkg-config ompi-c)"; exit 77; }
export REFINERY_LOG_FORMAT=text OMP_NUM_THREADS=1 REFINERY_COMM_TIMEOUT=60
# Under `make asan`: OpenMPI's own leaks at exit are suppressed (as in
# tests/comm/mpi.test.sh). Ignored otherwise.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$PWD/tests/comm/lsan-openmpi.supp"
fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for np in 1 2 4; do
    if timeout -k 5 180 scripts/mpirun.sh -np $np "$bin" >"$log" 2>&1 && grep -q "all checks passed at $np rank" "$log"; then
        n=$(grep -c '^ok ' "$log")
        worst=$(grep -oE 'rel err [0-9.e+-]+' "$log" | awk '{print $3}' | sort -g | tail -1)
        echo "ok: $np rank(s): $n checks, worst relative error $worst"
    else
        echo "FAIL: tp_check at $np rank(s):"; sed 's/^/    /' "$log"; fail=1
    fi
done
exit $fail

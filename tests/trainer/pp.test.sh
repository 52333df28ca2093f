#!/usr/bin/env bash
# The 1F1B pipeline executor (issue 17; services/trainer/pipeline.h) under
# scripts/mpirun.sh at 1, 2 and 4 ranks: build/trainer/pp_check (see
# tests/trainer/pp_check.c) runs a toy chain of layers cut into stages (pp =
# world; at 4 ranks also dp 2 x pp 2) for 1, 2, 4 and 8 micro-batches and
# compares every stage's gradients and the loss with one process running the
# whole chain (bitwise, reported against 1e-6), checks that each stage ran
# rf_pp_schedule's order, and measures the bubble of sleeping stages against
# (p-1)/(m+p-1), with the overlapped and the paired executor (pipeline.h);
# then at 2 and 4 ranks again with synchronous sends
# (REFINERY_COMM_SYNC_SEND=1, comm.h): the paired executor is the one that
# moves device boundaries over NCCL, whose sends wait for their receive, so
# it must not need MPI's buffering. The schedule itself is checked against hand-written tables
# in test_pipeline. ~3 s; tiny, so it runs under `make asan` too. Every
# mpirun has an outer `timeout`. Skips (77) without mpirun or with a pp_check
# built without MPI.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${REFINERY_BUILD:-$PWD/${BUILD:-build}}
bin=$BUILD_DIR/trainer/pp_check
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -x "$bin" ] || { echo "FAIL: $bin is not built (make)"; exit 1; }
ldd "$bin" | grep -q libmpi || { echo "SKIP: $bin was built without MPI (no pkg-config ompi-c)"; exit 77; }
export REFINERY_LOG_FORMAT=text OMP_NUM_THREADS=1 REFINERY_COMM_TIMEOUT=60
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$PWD/tests/comm/lsan-openmpi.supp"
fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for run in "1 0" "2 0" "4 0" "2 1" "4 1"; do
    set -- $run
    np=$1 sync=$2
    what="$np rank(s)$([ "$sync" = 1 ] && echo ', synchronous sends')"
    if timeout -k 5 180 env REFINERY_COMM_SYNC_SEND=$sync scripts/mpirun.sh -np $np "$bin" >"$log" 2>&1 &&
        grep -q "all checks passed at $np rank" "$log"; then
        n=$(grep -c '^ok ' "$log")
        echo "ok: $what: $n checks"
        grep 'bubble' "$log" | sed 's/^/    /'
    else
        echo "FAIL: pp_check at $what:"; sed 's/^/    /' "$log"; fail=1
    fi
done
exit $fail

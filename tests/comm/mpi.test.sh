#!/usr/bin/env bash
# The communication layer under mpirun (scripts/mpirun.sh): every collective
# at 1, 2 and 4 ranks against locally computed values (build/comm/mpi_check,
# see tests/comm/mpi_check.c), then the faults: a rank that kill -9s itself or
# goes silent before a collective must not hang the others. Every mpirun has
# an outer `timeout`, so a hang fails this test instead of stalling CI.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${REFINERY_BUILD:-$PWD/${BUILD:-build}}
bin=$BUILD_DIR/comm/mpi_check
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
[ -x "$bin" ] || { echo "FAIL: $bin is not built (make)"; exit 1; }
export REFINERY_LOG_FORMAT=text
# Under `make asan`: OpenMPI's own leaks at exit are suppressed (see the file);
# full unwinding lets the suppressions see OpenMPI's frames. Ignored otherwise.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}fast_unwind_on_malloc=0"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$PWD/tests/comm/lsan-openmpi.supp"
limit=2 # seconds a collective may take in the fault cases
fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

for np in 1 2 4; do
    if timeout -k 5 120 scripts/mpirun.sh -np $np "$bin" all >"$log" 2>&1; then
        grep "all checks passed" "$log"
    else
        echo "FAIL: mpi_check all at $np ranks:"; sed 's/^/    /' "$log"; fail=1
    fi
done

# Elapsed seconds of a command, its output in $log, its status in $rc.
timed() {
    local s; s=$(date +%s%N)
    "$@" >"$log" 2>&1; rc=$?
    took=$(( ($(date +%s%N) - s) / 1000000 ))
}

# Every survivor must say "rank R: io after T s: timeout: ..." with T within
# the limit (plus slack for polling on an oversubscribed machine).
survivors_timed_out() { # NAME WANT [MIN]: WANT survivors report the timeout (at least MIN)
    local name=$1 want=$2 min=${3:-$2} n
    if grep -q '^FAIL' "$log"; then
        echo "FAIL: $name:"; sed 's/^/    /' "$log"; fail=1; return
    fi
    n=$(grep -cE '^rank [0-9]+: io after [0-9.]+ s: timeout: comm \(mpi\): all-reduce of 1 f32 on rank [0-9]+ of 4 did not complete' "$log")
    if [ "$n" -lt "$min" ] || [ "$n" -gt "$want" ]; then
        echo "FAIL: $name: $n of $want surviving ranks reported the timeout:"; sed 's/^/    /' "$log"; fail=1; return
    fi
    local worst
    worst=$(grep -oE '^rank [0-9]+: io after [0-9.]+' "$log" | awk '{print $5}' | sort -n | tail -1)
    if awk -v w="$worst" -v l="$limit" 'BEGIN{exit !(w > l + 1.5)}'; then
        echo "FAIL: $name: a survivor took $worst s, the limit is $limit s"; fail=1; return
    fi
    echo "ok: $name: $n of $want survivors failed in <= $worst s with a timeout"
}

# 1. kill -9 under a plain mpirun: mpirun itself ends the job; it must exit
#    non-zero at once (this is what `mpirun -np N refinery train` sees).
timed env REFINERY_COMM_TIMEOUT=$limit timeout -k 5 60 scripts/mpirun.sh -np 4 "$bin" fault-kill
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $took -gt 20000 ]; then
    echo "FAIL: fault-kill: mpirun exit $rc after ${took} ms"; sed 's/^/    /' "$log"; fail=1
else
    echo "ok: fault-kill: mpirun exit $rc after ${took} ms"
fi

# 2. kill -9 with nobody to end the survivors (as in pods without mpirun):
#    --enable-recovery keeps mpirun from killing them, so each must detect the
#    dead peer itself within the limit. (mpirun's own status is 0 in this mode;
#    the survivors' messages are the evidence.)
timed env REFINERY_COMM_TIMEOUT=$limit timeout -k 5 60 scripts/mpirun.sh --enable-recovery -np 4 "$bin" fault-kill
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "FAIL: fault-kill with recovery hung (exit $rc)"; sed 's/^/    /' "$log"; fail=1
else
    survivors_timed_out "fault-kill, no mpirun clean-up" 3
fi

# 3. A rank alive but silent: the others time out, exit 3, and mpirun ends
#    the job non-zero. mpirun kills the remaining ranks as soon as the first
#    survivor exits, so on a loaded machine a slower survivor may be ended
#    before it prints: at least one must report the timeout, and none may
#    report anything else.
timed env REFINERY_COMM_TIMEOUT=$limit timeout -k 5 60 scripts/mpirun.sh -np 4 "$bin" fault-silent
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "FAIL: fault-silent: mpirun exit $rc after ${took} ms"; sed 's/^/    /' "$log"; fail=1
else
    survivors_timed_out "fault-silent (mpirun exit $rc after ${took} ms)" 3 1
fi

# 4. Synchronous sends (REFINERY_COMM_SYNC_SEND=1, comm.h): every collective
#    of `all` still passes at 2 ranks; a matched blocking pair completes and
#    two ranks that both send first each time out (MPI's buffering would
#    let that 1-element exchange through).
if timeout -k 5 120 env REFINERY_COMM_SYNC_SEND=1 scripts/mpirun.sh -np 2 "$bin" all >"$log" 2>&1 &&
    grep -q "all checks passed" "$log"; then
    echo "ok: all checks at 2 ranks with synchronous sends"
else
    echo "FAIL: mpi_check all with REFINERY_COMM_SYNC_SEND=1:"; sed 's/^/    /' "$log"; fail=1
fi
timed env REFINERY_COMM_SYNC_SEND=1 REFINERY_COMM_TIMEOUT=$limit timeout -k 5 60 scripts/mpirun.sh -np 2 "$bin" sync-send
n=$(grep -cE '^rank [01]: io after [0-9.]+ s: timeout: comm \(mpi\): send of 1 i32 on rank [01] of 2 to peer [01] did not complete' "$log")
if [ $rc -eq 124 ] || [ $rc -eq 137 ] || grep -q '^FAIL' "$log" || [ "$n" -lt 1 ]; then
    echo "FAIL: sync-send (exit $rc, $n of 2 ranks timed out):"; sed 's/^/    /' "$log"; fail=1
else
    echo "ok: sync-send: $n of 2 ranks' unmatched synchronous sends timed out (mpirun exit $rc after ${took} ms)"
fi

exit $fail

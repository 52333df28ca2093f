# Sourced by the trainer tests that run `refinery` under mpirun (dp, dp_staged,
# mesh, causal_dp, tp_causal, tp_gpt2_shared): bin and root from the test
# runner's environment; a skip (exit 77) without mpirun or without MPI in
# $bin; a temporary working directory, removed on exit;
# REFINERY_COMM_TIMEOUT 60 unless set; and two helpers, mpi (scripts/mpirun.sh)
# and cmp_runs (dp_compare.py), which a test may redefine.
bin=$REFINERY_BIN
root=$REFINERY_ROOT
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
ldd "$bin" | grep libmpi >/dev/null || { echo "SKIP: $bin was built without MPI (no pkg-config ompi-c)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
export REFINERY_COMM_TIMEOUT=${REFINERY_COMM_TIMEOUT:-60}
mpi() { "$root/scripts/mpirun.sh" "$@"; }
cmp_runs() { python3 "$root/tests/trainer/dp_compare.py" "$@"; }

# kill_rank_and_resume NP RANK [WHERE]: k1.yaml and k2.yaml (one spec with
# checkpoints, max_steps $ksteps) under mpi -np NP: k1 uninterrupted; rank
# RANK of k2 killed (-9) once k2 has a checkpoint. The group must end within
# 30 s with an error naming the rank (mpirun) or a timeout (the comm layer),
# without a model; the relaunch must resume from the checkpoint and end on
# k1's weights bit for bit. WHERE describes the rank in the log line.
kill_rank_and_resume() {
    local np=$1 r=$2 where=${3:+ ($3)} mp pid start rc at
    mpi -np "$np" "$bin" train k1.yaml 2>k1.log
    mpi -np "$np" "$bin" train k2.yaml 2>k2a.log &
    mp=$!
    for _ in $(seq 1 1000); do
        [ -f k2/checkpoint.bin ] && grep -q "\"rank $r of $np (pid" k2a.log && break
        sleep 0.01
    done
    pid=$(grep -o "\"msg\":\"rank $r of $np (pid [0-9]*" k2a.log | grep -o '[0-9]*$')
    start=$(date +%s)
    kill -9 "$pid"
    set +e
    wait $mp
    rc=$?
    set -e
    [ $rc -ne 0 ] || { echo "mpirun exited 0 after a rank was killed"; exit 1; }
    [ $(($(date +%s) - start)) -lt 30 ] || { echo "the group did not end promptly"; exit 1; }
    grep -q "process rank $r with PID [0-9]* on node .* exited on signal 9\|timeout:" k2a.log ||
        { echo "no clear error after the kill"; tail -5 k2a.log; exit 1; }
    echo "after kill -9 of rank $r$where: $(grep -m1 -o "process rank $r with PID [0-9]* on node .* exited on signal 9\|timeout:[^\"]*" k2a.log)"
    test ! -d k2/model
    mpi -np "$np" "$bin" train k2.yaml 2>k2b.log
    at=$(grep -o 'resumed from k2/checkpoint.bin at step [0-9]*' k2b.log | head -1)
    [ -n "$at" ] || { echo "the relaunch did not resume"; exit 1; }
    cmp k1/model/model.safetensors k2/model/model.safetensors
    echo -n "rank $r killed (mpirun exit $rc), relaunch ${at#resumed from k2/checkpoint.bin } of $ksteps: "
    cmp_runs k1 k2
}

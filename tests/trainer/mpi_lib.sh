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

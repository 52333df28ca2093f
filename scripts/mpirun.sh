#!/usr/bin/env bash
# mpirun with the settings Refinery needs, in one place: used by the tests
# (tests/comm/mpi.test.sh) and by hand, e.g.
#   scripts/mpirun.sh -np 2 build/refinery train SPEC.yaml
# Arguments pass through to OpenMPI's mpirun.
#   --oversubscribe      more ranks than cores (the CI machine has 2 cores)
#   --bind-to none       let oversubscribed ranks float instead of pinning
#                        several to one core
#   --allow-run-as-root  only when running as root (containers)
#   btl_vader_single_copy_mechanism=none: containers usually forbid the
#                        ptrace-based cross-memory attach that the shared-memory
#                        transport uses for large messages
# REFINERY_MPIRUN overrides the mpirun binary.
# Under `make asan` (REFINERY_SANITIZED=1) every rank gets LeakSanitizer's
# suppressions for OpenMPI's own exit-time leaks (tests/comm/lsan-openmpi.supp:
# only stacks through OpenMPI's libraries) and the full unwinding they need.
set -eu
mpirun=${REFINERY_MPIRUN:-mpirun}
command -v "$mpirun" >/dev/null 2>&1 || { echo "mpirun.sh: $mpirun not found (install openmpi-bin)" >&2; exit 127; }
args=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
if [ "${REFINERY_SANITIZED:-0}" = 1 ]; then
    supp=$(cd "$(dirname "$0")/.." && pwd)/tests/comm/lsan-openmpi.supp
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}fast_unwind_on_malloc=0"
    case ${LSAN_OPTIONS:-} in *lsan-openmpi.supp*) ;; *)
        export LSAN_OPTIONS="${LSAN_OPTIONS:-}${LSAN_OPTIONS:+:}suppressions=$supp" ;; esac
fi
exec "$mpirun" "${args[@]}" "$@"

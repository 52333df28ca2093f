#!/usr/bin/env bash
# The GPU tests with their CUDA kernels run by tests/cuda_emu, a CPU emulator
# of the CUDA runtime, cuBLAS and NCCL at one rank (README.md beside this):
# test_cuda_ops (every kernel against its CPU twin), test_cuda_step (whole
# training steps, resumes across devices, LoRA) and test_comm_nccl (the NCCL
# backend at world size 1), first the emulator's own test. make test builds
# them in $BUILD-emu (make asan: build-asan-emu, where AddressSanitizer also
# watches every kernel's loads and stores). Each must pass with no case
# skipped. This is not a GPU: it checks the kernels' logic, indexing, launch
# limits and warp discipline, not their speed, nvcc's floating-point
# contraction or the memory model of concurrent streams (make test-gpu).
set -u
dir=${REFINERY_BUILD:?}-emu
bins=(cuda_emu/selftest tests/trainer/test_cuda_ops tests/trainer/test_cuda_step tests/comm/test_comm_nccl)
for b in "${bins[@]}"; do
    [ -x "$dir/$b" ] || { echo "SKIP: $dir/$b is not built (make test builds it with CUDA=emu)"; exit 77; }
done
status=0
for b in "${bins[@]}"; do
    log=$(mktemp)
    start=$(date +%s)
    CMOCKA_MESSAGE_OUTPUT=stdout "$dir/$b" >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    if [ $rc -ne 0 ]; then
        echo "FAIL $b (exit $rc, ${secs}s):"
        grep -v '^  ' "$log" | tail -30
        status=1
    elif grep -q '^\[  SKIPPED \]' "$log"; then
        echo "FAIL $b: cases skipped under the emulator:"
        grep -B3 '^\[  SKIPPED \]' "$log" | tail -20
        status=1
    elif [ "$b" = cuda_emu/selftest ]; then
        echo "ok $b: $(grep -c '^ok ' "$log") checks (${secs}s)"
    else
        ran=$(sed -n 's/^\[==========\] \([0-9]*\) test(s) run\./\1/p' "$log")
        passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\./\1/p' "$log")
        if [ -z "$ran" ] || [ "$ran" != "$passed" ]; then
            echo "FAIL $b: ran ${ran:-?}, passed ${passed:-?}"
            status=1
        else
            echo "ok $b: $passed cases passed (${secs}s)"
        fi
    fi
    rm -f "$log"
done
exit $status

#!/usr/bin/env bash
# Runs every cmocka binary under $BUILD/tests and every tests/*/*.test.sh script,
# each with a time limit, and ends with one "N passed, N failed" line.
# TESTS=pattern limits the run to matching names.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export REFINERY_ROOT=$PWD
export SHARED=${SHARED:-$(cd .. && pwd)/shared}
export REFINERY_BIN=$PWD/$BUILD/refinery
export REFINERY_BUILD=$PWD/$BUILD
export CMOCKA_MESSAGE_OUTPUT=stdout
limit=${TEST_TIMEOUT:-900}
pattern=${TESTS:-}

passed=0 failed=0 failures=()
run_one() {
    local name=$1; shift
    [ -n "$pattern" ] && [[ $name != *$pattern* ]] && return
    local log start rc
    log=$(mktemp)
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        printf 'PASS %-50s %4ss\n' "$name" $(($(date +%s) - start))
    else
        failed=$((failed + 1)); failures+=("$name")
        printf 'FAIL %-50s %4ss (exit %d)\n' "$name" $(($(date +%s) - start)) $rc
        tail -n 60 "$log" | sed 's/^/    | /'
    fi
    rm -f "$log"
}

for bin in $(find "$BUILD/tests" -type f -perm -u+x 2>/dev/null | sort); do
    run_one "${bin#$BUILD/tests/}" "$bin"
done
for script in $(ls tests/*/*.test.sh 2>/dev/null | sort); do
    run_one "${script#tests/}" bash "$script"
done

[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

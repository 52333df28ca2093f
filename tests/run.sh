#!/usr/bin/env bash
# Runs every cmocka binary under $BUILD/tests and every tests/*/*.test.sh script,
# each with a time limit (TEST_TIMEOUT seconds, default 900), and ends with one line
#
#     N passed, N failed, N skipped
#
# TESTS=pattern limits the run to names containing it (e.g. trainer/test_ops).
# The exit status is 0 only when nothing failed (a timeout is a failure).
#
# How a test is counted:
#   - A script passes with exit 0 and is skipped with exit 77 (Automake's
#     convention); it says why on a line "SKIP: <reason>". Any other exit fails.
#   - A cmocka binary fails when it exits non-zero. Each case it skipped (cmocka's
#     "[  SKIPPED ] <case>") gets its own line "SKIP <binary>:<case> — <reason>"
#     and counts once in `skipped`; the reason is the last "SKIP: <reason>" line the
#     case printed (tests/support/skip.h: RF_SKIP), else "(no reason given)".
#     A binary that passed counts in `passed` (its line says how many of its cases
#     were skipped) unless every case it ran was skipped: then it shows only as its
#     SKIP lines. So `grep -c '^SKIP '` on the output equals `skipped`.
#   So `passed` and `failed` count programs, `skipped` counts skipped scripts and
#   skipped cmocka cases: a skip never shows as a pass.
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD=${BUILD:-build}
export REFINERY_ROOT=$PWD
export SHARED=${SHARED:-$(cd .. && pwd)/shared}
export REFINERY_BIN=$PWD/$BUILD/refinery
# `refinery run` reuses unchanged stages from a cache under ~/.cache by default:
# tests run their stages unless they turn the cache on themselves (tests/pipeline).
export REFINERY__RUN__CACHE=false
export REFINERY_BUILD=$PWD/$BUILD
export CMOCKA_MESSAGE_OUTPUT=stdout
limit=${TEST_TIMEOUT:-900}
pattern=${TESTS:-}

passed=0 failed=0 skipped=0 failures=()

# Prints the cmocka cases the log shows as skipped, one "case<TAB>reason" a line.
# A case is skipped when "[  SKIPPED ] X" follows its "[ RUN      ] X"; cmocka's
# closing list repeats the names without a RUN line, and is not counted again.
skipped_cases() {
    awk '
        /^\[ RUN      \] / { c = substr($0, 14); r = ""; next }
        /^SKIP: / { r = substr($0, 7); next }
        /^\[  SKIPPED \] / {
            n = substr($0, 14)
            if (c != "" && n == c) { print c "\t" (r == "" ? "(no reason given)" : r) }
            c = ""; r = ""; next
        }
        /^\[       OK \] |^\[  FAILED  \] |^\[  ERROR   \] / { c = ""; r = "" }
    ' "$1"
}

run_one() { # KIND NAME COMMAND...   KIND: cmocka or script
    local kind=$1 name=$2
    shift 2
    [ -n "$pattern" ] && [[ $name != *"$pattern"* ]] && return
    local log start rc secs ran=0 nskip=0 lines=() c r reason
    log=$(mktemp)
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    if [ "$kind" = cmocka ]; then
        ran=$(grep -c '^\[ RUN      \] ' "$log")
        while IFS=$'\t' read -r c r; do
            lines+=("$(printf 'SKIP %s:%s — %s' "$name" "$c" "$r")")
        done < <(skipped_cases "$log")
        nskip=${#lines[@]}
        skipped=$((skipped + nskip))
    fi
    if [ $rc -eq 77 ] && [ "$kind" = script ]; then
        skipped=$((skipped + 1))
        reason=$(sed -n 's/^SKIP: //p' "$log" | tail -n 1)
        printf 'SKIP %-50s %4ss — %s\n' "$name" "$secs" "${reason:-(no reason given)}"
    elif [ $rc -eq 0 ] && [ "$kind" = cmocka ] && [ "$ran" -gt 0 ] && [ "$nskip" -ge "$ran" ]; then
        : # every case skipped: only their SKIP lines below
    elif [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        if [ "$nskip" -gt 0 ]; then
            printf 'PASS %-50s %4ss (%d of %d cases skipped)\n' "$name" "$secs" "$nskip" "$ran"
        else
            printf 'PASS %-50s %4ss\n' "$name" "$secs"
        fi
    else
        failed=$((failed + 1))
        failures+=("$name")
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            printf 'FAIL %-50s %4ss (timed out after %ss, exit %d)\n' "$name" "$secs" "$limit" $rc
        else
            printf 'FAIL %-50s %4ss (exit %d)\n' "$name" "$secs" $rc
        fi
        tail -n 60 "$log" | sed 's/^/    | /'
    fi
    for c in ${lines[@]+"${lines[@]}"}; do printf '%s\n' "$c"; done
    rm -f "$log"
}

for bin in $(find "$BUILD/tests" -type f -perm -u+x 2>/dev/null | sort); do
    run_one cmocka "${bin#"$BUILD"/tests/}" "$bin"
done
for script in $(ls tests/*/*.test.sh 2>/dev/null | sort); do
    run_one script "${script#tests/}" bash "$script"
done

[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]

#!/usr/bin/env bash
# Builds every libFuzzer target (tests/fuzz/fuzz_*.c) with clang + ASan/UBSan in
# build-fuzz/ and runs each for $1 seconds (default 60), starting from its seeds
# in tests/fuzz/corpus/<name>/. A crash leaves build-fuzz/<name>-crash-* behind.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
make --no-print-directory -j2 BUILD=build-fuzz CC=clang CXX=clang++ OPT="-O1 -g" WARN=-w \
    SANITIZE="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" fuzz-bins >/dev/null
status=0
for src in tests/fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    work=build-fuzz/corpus/$name
    mkdir -p "$work"
    seeds=()
    [ -d "tests/fuzz/corpus/$name" ] && seeds+=("tests/fuzz/corpus/$name")
    log=build-fuzz/$name.log
    if ASAN_OPTIONS=detect_leaks=1 "build-fuzz/fuzz/$name" -max_total_time="$secs" -max_len=65536 \
            -rss_limit_mb=2048 -timeout=10 -artifact_prefix="build-fuzz/$name-" \
            "$work" "${seeds[@]}" >"$log" 2>&1; then
        printf 'fuzz %-28s ok   %s\n' "$name" "$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1)"
    else
        printf 'fuzz %-28s FAIL (see %s)\n' "$name" "$log"
        grep -A30 -E '==ERROR|runtime error|SUMMARY' "$log" | head -60
        status=1
    fi
done
exit $status

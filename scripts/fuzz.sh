#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang + ASan/UBSan and
# runs each for $1 seconds (default 60) on its seed corpus in tests/fuzz/corpus/<name>/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
make --no-print-directory BUILD=build-fuzz CC=clang CXX=clang++ OPT="-O1 -g" \
    SANITIZE="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
    libs >/dev/null
status=0
for src in tests/fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .c)
    bin=build-fuzz/fuzz/$name
    mkdir -p build-fuzz/fuzz "build-fuzz/corpus/$name"
    clang -std=c17 -O1 -g -Iservices -Ibuild-fuzz/gen -D_GNU_SOURCE \
        -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer \
        "$src" -o "$bin" -Wl,--whole-archive build-fuzz/lib/*.a -Wl,--no-whole-archive \
        $(pkg-config --libs libutf8proc libxxhash libzstd zlib yaml-0.1 openblas lmdb libprotobuf-c) -lcld2 -lstdc++ -lm -fopenmp -pthread
    seeds=()
    [ -d "tests/fuzz/corpus/$name" ] && seeds+=("tests/fuzz/corpus/$name")
    echo "fuzz: $name for ${secs}s"
    if ! "$bin" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
            -artifact_prefix="build-fuzz/$name-" "build-fuzz/corpus/$name" "${seeds[@]}" \
            >"build-fuzz/$name.log" 2>&1; then
        echo "fuzz: $name FAILED (see build-fuzz/$name.log)"; tail -40 "build-fuzz/$name.log"; status=1
    else
        grep -E '^Done|#[0-9]+.*DONE' "build-fuzz/$name.log" | tail -1
    fi
done
exit $status

#!/usr/bin/env bash
# Every tracked C, CUDA and header file is clang-formatted (.clang-format), as
# `make format` leaves it: `make check-format` must pass.
set -euo pipefail
cd "$REFINERY_ROOT"
if [ -n "${REFINERY_SANITIZED:-}" ]; then
    echo "SKIP: the format check runs once, in make test (nothing sanitizer-specific to check)"
    exit 77
fi
if ! command -v clang-format >/dev/null; then
    echo "SKIP: clang-format is not installed (scripts/deps/debian.txt lists it)"
    exit 77
fi
if ! out=$(make --no-print-directory check-format 2>&1); then
    echo "$out" | grep 'error:' | head -20
    echo "files not clang-formatted: run make format"
    exit 1
fi
echo "$(git ls-files 'services/*.[ch]' 'services/*.cc' 'services/*.cu' 'tests/*.[ch]' | wc -l) files clang-formatted"

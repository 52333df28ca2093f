#!/usr/bin/env bash
# Fuzz smoke run inside `make test`: every libFuzzer target for a few seconds.
# Skipped (exit 77) inside `make asan` (the fuzz build has its own sanitizers).
set -euo pipefail
if [ -n "${REFINERY_SANITIZED:-}" ]; then echo "SKIP: not under make asan (the fuzz build has its own sanitizers)"; exit 77; fi
cd "$REFINERY_ROOT"
scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-5}"

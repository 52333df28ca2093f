#!/usr/bin/env bash
# Fuzz smoke run inside `make test`: every libFuzzer target for a few seconds.
# Skipped inside `make asan` (the fuzz build has its own sanitizers).
set -euo pipefail
if [ -n "${REFINERY_SANITIZED:-}" ]; then echo "skipped under make asan"; exit 0; fi
cd "$REFINERY_ROOT"
scripts/fuzz.sh "${FUZZ_SMOKE_SECONDS:-5}"

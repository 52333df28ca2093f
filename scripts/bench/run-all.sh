#!/usr/bin/env bash
# `make bench`: runs every scripts/bench/bench_*.sh in turn. Each prints its own
# side-by-side table (Refinery against the reference on the same data and cores).
set -u
cd "$(dirname "$0")/../.."
status=0
for b in scripts/bench/bench_*.sh; do
    [ -e "$b" ] || continue
    [ -n "${BENCH:-}" ] && [[ $b != *$BENCH* ]] && continue
    echo "=== $b"
    bash "$b" || { echo "bench failed: $b"; status=1; }
done
exit $status

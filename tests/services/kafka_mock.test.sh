#!/usr/bin/env bash
# The Kafka tests again, this time against the standalone mock cluster process
# (build/refinery-kafka-mock via scripts/test-env/kafka.sh), with the broker
# faults sent through its control FIFO.
. "$REFINERY_ROOT/tests/services/lib.sh"
env_start kafka
# Under make asan: librdkafka 2.0.2 (Debian's) now and then leaves a partition
# list of its own unfreed after the broker faults (a CI run on 2026-11-28: 16 +
# 64 + 22 bytes, allocated inside librdkafka). LeakSanitizer reports leaks
# without failing the process (exitcode=0; any other sanitizer error still
# aborts), with whole stacks (fast_unwind_on_malloc=0), and
# tests/support/lsan_foreign.sh fails the test on any leak with a frame of ours.
if [ -n "${REFINERY_SANITIZED:-}" ]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}abort_on_error=1:exitcode=0:fast_unwind_on_malloc=0"
fi
KAFKA_MOCK_CONTROL=$TEST_DIR/kafka.ctl REFINERY_LOG_LEVEL=warn \
    "$REFINERY_BUILD/tests/services/test_kafka" >"$TEST_DIR/test_kafka.log" 2>&1 ||
    { grep -v '"comp":"kafka"' "$TEST_DIR/test_kafka.log"; exit 1; }
grep -v '"comp":"kafka"' "$TEST_DIR/test_kafka.log"
if [ -n "${REFINERY_SANITIZED:-}" ]; then
    "$REFINERY_ROOT/tests/support/lsan_foreign.sh" "$TEST_DIR/test_kafka.log" librdkafka.so || exit 1
fi
# Every command reached the helper and was accepted.
grep -c '^ok ' "$TEST_DIR/kafka.out"
if grep '^error' "$TEST_DIR/kafka.out"; then echo "a command was refused" >&2; exit 1; fi

#!/usr/bin/env bash
# The Kafka tests again, this time against the standalone mock cluster process
# (build/refinery-kafka-mock via scripts/test-env/kafka.sh), with the broker
# faults sent through its control FIFO.
. "$REFINERY_ROOT/tests/services/lib.sh"
env_start kafka
KAFKA_MOCK_CONTROL=$TEST_DIR/kafka.ctl REFINERY_LOG_LEVEL=warn \
    "$REFINERY_BUILD/tests/services/test_kafka" >"$TEST_DIR/test_kafka.log" 2>&1 ||
    { grep -v '"comp":"kafka"' "$TEST_DIR/test_kafka.log"; exit 1; }
grep -v '"comp":"kafka"' "$TEST_DIR/test_kafka.log"
# Every command reached the helper and was accepted.
grep -c '^ok ' "$TEST_DIR/kafka.out"
if grep '^error' "$TEST_DIR/kafka.out"; then echo "a command was refused" >&2; exit 1; fi

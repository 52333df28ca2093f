#!/usr/bin/env bash
# The test harness itself: a real PostgreSQL answers and survives a restart,
# the mock Kafka cluster takes broker commands, and both go away at the end.
. "$REFINERY_ROOT/tests/services/lib.sh"
env_start pg kafka

[ "$(psql "$REFINERY_PG" -Atc 'select 40 + 2')" = 42 ]
scripts/test-env/pg.sh restart "$TEST_DIR"
[ "$(psql "$REFINERY_PG" -Atc 'select 1')" = 1 ]

[[ $KAFKA_BOOTSTRAP =~ ^127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$ ]]
scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic docs.clean 4"
scripts/test-env/kafka.sh cmd "$TEST_DIR" "down 2"
scripts/test-env/kafka.sh cmd "$TEST_DIR" "up 2"
if scripts/test-env/kafka.sh cmd "$TEST_DIR" "down 4" 2>/dev/null; then
    echo "broker 4 of 3 was accepted" >&2
    exit 1
fi
echo "test env: ok"

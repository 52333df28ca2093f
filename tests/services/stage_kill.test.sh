#!/usr/bin/env bash
# A stage service process (the toy stage of test_stage_loop on the stage loop,
# against the standalone mock Kafka cluster and a real PostgreSQL) is SIGKILLed
# mid-stream and restarted: every input batch ends up counted exactly once in
# stage_progress and present in the output topic, and the successor stops
# cleanly (exit 0) on SIGTERM.
. "$REFINERY_ROOT/tests/services/lib.sh"
tool=$REFINERY_BUILD/tests/services/test_stage_loop
N=200
env_start pg kafka
scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic in 3"
scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic out 3"
"$tool" --run "$REFINERY_PG" run-kill # schema and run
"$tool" --produce "$KAFKA_BOOTSTRAP" run-kill $N

progress() {
    psql "$REFINERY_PG" -Atc "SELECT count(*), coalesce(sum(docs_in), 0),
        coalesce(sum(docs_out), 0), coalesce(sum(rejected), 0)
        FROM stage_progress WHERE run_id = 'run-kill' AND stage = 'upper'"
}
wait_batches() { # MIN SECONDS
    local n=0
    for _ in $(seq $(($2 * 5))); do
        n=$(progress | cut -d'|' -f1)
        [ "$n" -ge "$1" ] && return 0
        sleep 0.2
    done
    echo "only $n of $1 batches recorded after $2 s" >&2
    return 1
}

"$tool" --stage "$KAFKA_BOOTSTRAP" "$REFINERY_PG" >"$TEST_DIR/stage1.out" 2>"$TEST_DIR/stage1.log" &
first=$!
env_track_pid $first
wait_batches 40 60
kill -KILL $first
wait $first 2>/dev/null || true
echo "killed at $(progress)"

# The successor gets the partitions once the dead member's session (10 s) ends.
"$tool" --stage "$KAFKA_BOOTSTRAP" "$REFINERY_PG" >"$TEST_DIR/stage2.out" 2>"$TEST_DIR/stage2.log" &
second=$!
env_track_pid $second
wait_batches $N 90
kill -TERM $second
wait $second # exit 0: the loop finished its poll and committed
cat "$TEST_DIR/stage2.out"

row=$(progress)
echo "stage_progress: $row"
[ "$row" = "$N|$((N * 10))|$((N * 8))|$((N * 2))" ]
"$tool" --check "$KAFKA_BOOTSTRAP" run-kill $N
echo "stage kill/restart: ok"

#!/usr/bin/env bash
# Loss detection (issue 15): records deleted by retention before a stage
# consumed them fail the run, with a reason, instead of a silent stall.
#   1. A fresh mock cluster with only docs.clean, one partition so that both
#      runs share it; the services create their other topics.
#   2. Run A (small) goes through ingest and dedup; dedup commits and stops.
#   3. Run B, larger than the mock's 5 MB partition log, is pushed and sealed
#      while dedup is down: its first batches leave the log unread.
#   4. dedup restarts: its committed offset is below the log's start (a gap,
#      recorded in input_gaps), it consumes what is left, and run B ends
#      FAILED with the input-lost reason (topic, partition, missing batches,
#      probable retention), which `refinery status` shows. Run A is untouched.
. "$REFINERY_ROOT/tests/services/lib.sh"
[ -d "$SHARED/data/amazon" ] || { echo "SHARED ($SHARED) has no data/amazon" >&2; exit 1; }
env_start pg kafka
scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic docs.clean 1"
export REFINERY_LOG_FORMAT=text
sql() { psql "$REFINERY_PG" -v ON_ERROR_STOP=1 -Atc "$1"; }
wait_for() { # DESC SECONDS CMD...
    local desc=$1 end=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || { echo "timed out waiting for $desc" >&2; return 1; }
        sleep 0.2
    done
}
"$REFINERY_BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ingest.port" \
    --pg "$REFINERY_PG" --batch-docs 64 2>"$TEST_DIR/ingest.log" &
env_track_pid $!
wait_for "refinery-ingest to serve" 60 test -s "$TEST_DIR/ingest.port"
export REFINERY_SERVER=127.0.0.1:$(cat "$TEST_DIR/ingest.port")
dedup_n=0
dedup_start() {
    dedup_n=$((dedup_n + 1))
    "$REFINERY_BUILD/refinery-dedup" --index "$TEST_DIR/dedup-index" \
        2>"$TEST_DIR/dedup.$dedup_n.log" &
    dedup_pid=$!
    env_track_pid $dedup_pid
}
spec() { # FILE INPUT...
    local f=$1
    shift
    { printf 'run:\n  name: loss\ningest:\n  preset: amazon\n  inputs:\n'
      for i in "$@"; do echo "    - $i"; done; } >"$f"
}
batches() { # RUN STAGE
    sql "SELECT count(*) FROM stage_progress WHERE run_id = '$1' AND stage = '$2' AND docs_out > 0"
}
run_state_is() { [ "$(sql "SELECT state FROM runs WHERE id = '$1'")" = "$2" ]; }
dedup_has_all() { [ "$(batches "$1" dedup)" -eq "$(batches "$1" ingest)" ]; }

beauty=$SHARED/data/amazon/All_Beauty_5.json.gz
appl=$SHARED/data/amazon/Appliances_5.json.gz
dedup_start
{ zcat "$beauty" || true; } | head -n 300 >"$TEST_DIR/small.jsonl"
spec "$TEST_DIR/a.yaml" "$TEST_DIR/small.jsonl"
"$REFINERY_BIN" submit "$TEST_DIR/a.yaml" --run-id run-a >"$TEST_DIR/a.json"
wait_for "dedup to take run A" 60 dedup_has_all run-a
kill -TERM $dedup_pid
wait $dedup_pid

spec "$TEST_DIR/b.yaml" "$appl" "$appl" "$appl" "$beauty" "$beauty" "$appl" "$appl"
"$REFINERY_BIN" submit "$TEST_DIR/b.yaml" --run-id run-b >"$TEST_DIR/b.json"
echo "run B: $(cat "$TEST_DIR/b.json" | cut -c1-200)"
echo "run B: $(batches run-b ingest) batches, sealed with $(sql "SELECT sealed_batches FROM runs WHERE id = 'run-b'")"

t0=$SECONDS
dedup_start
wait_for "run B to fail" 90 run_state_is run-b failed
took=$(sql "SELECT count(*) FROM stage_progress WHERE run_id = 'run-b' AND stage = 'dedup'")
sealed=$(sql "SELECT sealed_batches FROM runs WHERE id = 'run-b'")
echo "run B failed after $((SECONDS - t0)) s, dedup took $took of $sealed batches"
reason=$(sql "SELECT error FROM runs WHERE id = 'run-b'")
echo "reason: $reason"
# Failed once dedup had taken everything left in the log, not before.
missing=$(sed -n 's/.*never received \([0-9]*\) of the.*/\1/p' <<<"$reason")
[ "$((took + missing))" -eq "$sealed" ] ||
    { echo "dedup took $took and $missing are missing, of $sealed" >&2; exit 1; }
[ "$missing" -gt 0 ] && [ "$took" -gt 0 ]
for want in "input lost" "docs.clean [0]" "probable retention" "run run-b" "deleted before dedup"; do
    grep -qF "$want" <<<"$reason" || { echo "the reason lacks '$want'" >&2; exit 1; }
done
echo "gaps: $(sql "SELECT stage, topic, partition, from_offset, to_offset FROM input_gaps")"
[ "$(sql "SELECT count(*) FROM input_gaps WHERE stage = 'dedup' AND topic = 'docs.clean'")" -ge 1 ]
status=$("$REFINERY_BIN" status run-b)
echo "status: $(cut -c1-400 <<<"$status")"
grep -q '"state":"failed"' <<<"$status" && grep -qF "probable retention" <<<"$status" ||
    { echo "refinery status does not show the failure and its reason" >&2; exit 1; }
# Run A lost nothing and stays as it was; dedup keeps running.
[ "$(sql "SELECT state FROM runs WHERE id = 'run-a'")" = running ]
kill -0 $dedup_pid
kill -TERM $dedup_pid
wait $dedup_pid
echo "loss retention: ok"

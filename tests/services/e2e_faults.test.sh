#!/usr/bin/env bash
# Faults during an end-to-end run (the five services on a real PostgreSQL and
# the 3-broker mock Kafka cluster; the Python grpcio client submits the run,
# pushes all of All_Beauty, seals it and watches it):
#   1. refinery-dedup is SIGKILLed mid-stream and restarted on its index;
#   2. refinery-tokenizer is SIGKILLed mid-stream and restarted;
#   3. a mock-cluster broker goes down for a few seconds and comes back;
#   4. PostgreSQL restarts (same port) while the run is still going.
# The run must still succeed, and e2e_check.py must find every document
# exactly once in the topics, deduplicated by (run, seq) (replayed batches
# identical to the first copy), and per-stage totals in stage_progress that
# count each batch once.
. "$REFINERY_ROOT/tests/services/lib.sh"
. "$REFINERY_ROOT/tests/services/e2e_lib.sh"
reviews=$SHARED/data/amazon/All_Beauty_5.json.gz
RUN=e2e-faults
e2e_env
e2e_spec "$TEST_DIR/spec.yaml" "$reviews"
# Small batches (~330 of them), 4 per poll: the kills land mid-stream, often
# between a poll's outputs and its commit, so that batches are replayed.
export REFINERY_MAX_MESSAGES=4
svc_start ingest --batch-docs 16
for s in dedup tokenizer trainer evaluator; do svc_start $s; done
pushed=$(zcat "$reviews" | wc -l)

"$PY" tests/services/e2e_client.py --proto proto --server 127.0.0.1:${PORT[ingest]} \
    --evaluator 127.0.0.1:${PORT[evaluator]} --spec "$TEST_DIR/spec.yaml" --run-id $RUN \
    --timeout 600 --classify "nice" "$reviews" >"$TEST_DIR/client.json" \
    2>"$TEST_DIR/client.log" &
client=$!
env_track_pid $client
t0=$SECONDS

ingest_batches() { sql "SELECT count(*) FROM stage_progress WHERE run_id = '$RUN'
    AND stage = 'ingest' AND docs_out > 0"; }
kill_mid_stream() { # STAGE AT: SIGKILL once AT batches are recorded, restart
    wait_for "$1 to record $2 batches" 120 batches_at_least $RUN "$1" "$2"
    svc_kill "$1"
    echo "$1 killed at $(progress $RUN "$1" | cut -d'|' -f1) batches ($(ingest_batches) from ingest so far)"
    killed_at[$1]=$(progress $RUN "$1" | cut -d'|' -f1)
    svc_start "$1"
}
declare -A killed_at
kill_mid_stream dedup 40
kill_mid_stream tokenizer 80

scripts/test-env/kafka.sh cmd "$TEST_DIR" "down 2"
echo "broker 2 down at $(progress $RUN tokenizer | cut -d'|' -f1) tokenizer batches"
sleep 3 # the outage itself, not a wait for something
scripts/test-env/kafka.sh cmd "$TEST_DIR" "up 2"

scripts/test-env/pg.sh restart "$TEST_DIR"
echo "PostgreSQL restarted at $(progress $RUN tokenizer | cut -d'|' -f1) tokenizer batches, run $(sql "SELECT state FROM runs WHERE id = '$RUN'")"

wait $client || { cat "$TEST_DIR/client.log"; exit 1; }
echo "run ended after $((SECONDS - t0)) s: $(cut -c1-300 "$TEST_DIR/client.json")"
"$PY" tests/services/e2e_check.py --proto proto --kafka "$KAFKA_BOOTSTRAP" \
    --pg "$REFINERY_PG" --run $RUN --pushed "$pushed" --steps "$E2E_STEPS"
# The kills really were mid-stream: the stage had batches left to do.
total=$(ingest_batches)
for s in dedup tokenizer; do
    [ "${killed_at[$s]}" -lt "$total" ] || {
        echo "$s was killed after its last batch (${killed_at[$s]} of $total)" >&2
        exit 1
    }
done
for s in ingest dedup tokenizer trainer evaluator; do svc_stop $s; done
echo "e2e faults: ok"

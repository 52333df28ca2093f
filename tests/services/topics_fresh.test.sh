#!/usr/bin/env bash
# A fresh mock cluster with no topic created beforehand (issue 15):
#   1. refinery-dedup with --create-topics=false refuses to start, naming the
#      topics it misses;
#   2. ingest, dedup and the tokenizer, started before any topic exists,
#      create theirs, and a submitted run goes through all three: every
#      ingest batch with documents is recorded by dedup, every dedup batch
#      with documents by the tokenizer (no "no start position" crash).
. "$REFINERY_ROOT/tests/services/lib.sh"
env_start pg kafka
export REFINERY_LOG_FORMAT=text
model=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
sql() { psql "$REFINERY_PG" -v ON_ERROR_STOP=1 -Atc "$1"; }
wait_for() { # DESC SECONDS CMD...
    local desc=$1 end=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || { echo "timed out waiting for $desc" >&2; return 1; }
        sleep 0.2
    done
}

rc=0
"$REFINERY_BUILD/refinery-dedup" --index "$TEST_DIR/index0" --create-topics=false \
    2>"$TEST_DIR/refused.log" || rc=$?
cat "$TEST_DIR/refused.log"
[ $rc -ne 0 ] || { echo "dedup started without its topics" >&2; exit 1; }
for t in docs.clean docs.unique docs.duplicates; do
    grep -q "missing topic(s):.*$t" "$TEST_DIR/refused.log" ||
        { echo "the refusal does not name $t" >&2; exit 1; }
done

pids=()
"$REFINERY_BUILD/refinery-dedup" --index "$TEST_DIR/index" 2>"$TEST_DIR/dedup.log" &
pids+=($!)
"$REFINERY_BUILD/refinery-tokenizer" --tokenizer "$model/vocab.txt" \
    --port-file "$TEST_DIR/tokenizer.port" 2>"$TEST_DIR/tokenizer.log" &
pids+=($!)
"$REFINERY_BUILD/refinery-ingest" --port-file "$TEST_DIR/ingest.port" --pg "$REFINERY_PG" \
    --batch-docs 32 2>"$TEST_DIR/ingest.log" &
pids+=($!)
for p in "${pids[@]}"; do env_track_pid "$p"; done
wait_for "refinery-ingest to serve" 60 test -s "$TEST_DIR/ingest.port"
wait_for "refinery-tokenizer to serve" 60 test -s "$TEST_DIR/tokenizer.port"
export REFINERY_SERVER=127.0.0.1:$(cat "$TEST_DIR/ingest.port")

{ zcat "$SHARED/data/amazon/All_Beauty_5.json.gz" || true; } | head -n 500 >"$TEST_DIR/in.jsonl"
printf 'run:\n  name: fresh\ningest:\n  preset: amazon\n  inputs: [%s]\n' "$TEST_DIR/in.jsonl" \
    >"$TEST_DIR/spec.yaml"
"$REFINERY_BIN" submit "$TEST_DIR/spec.yaml" --run-id fresh >"$TEST_DIR/submit.json"
cat "$TEST_DIR/submit.json"
owed() { # UPSTREAM STAGE: batches upstream recorded with documents that STAGE has not
    sql "SELECT count(*) FROM stage_progress u WHERE u.run_id = 'fresh' AND u.stage = '$1'
        AND u.docs_out > 0 AND NOT EXISTS (SELECT 1 FROM stage_progress d
        WHERE d.run_id = 'fresh' AND d.stage = '$2' AND d.batch_seq = u.batch_seq)"
}
caught_up() { [ "$(owed ingest dedup)" -eq 0 ] && [ "$(owed dedup tokenizer)" -eq 0 ]; }
wait_for "dedup and the tokenizer to take the run" 120 caught_up
counts=$(sql "SELECT stage, count(*), sum(docs_out) FROM stage_progress WHERE run_id = 'fresh'
    GROUP BY stage ORDER BY stage")
echo "$counts"
[ "$(sql "SELECT count(*) FROM stage_progress WHERE run_id = 'fresh' AND stage = 'tokenizer'")" -gt 0 ]
[ "$(sql "SELECT state FROM runs WHERE id = 'fresh'")" = running ]
# Every service created the topics it needed, nobody crashed or stopped.
for t in docs.clean docs.rejected docs.unique docs.duplicates tokens.train tokens.eval; do
    grep -q "created topic $t\|topic $t: the brokers have no admin API" "$TEST_DIR"/*.log ||
        { echo "nobody created $t" >&2; exit 1; }
done
if grep -i "no start position\|stopped on error\|consumer stopped" "$TEST_DIR"/dedup.log \
    "$TEST_DIR"/tokenizer.log; then
    echo "a consumer stopped or had no start position" >&2; exit 1
fi
# SIGTERM: each exits 0 (under ASan: no leak).
for p in "${pids[@]}"; do kill -TERM "$p"; done
for p in "${pids[@]}"; do wait "$p"; done
echo "topics fresh: ok"

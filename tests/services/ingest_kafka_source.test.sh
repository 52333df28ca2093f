#!/usr/bin/env bash
# The ingest service's Kafka source (refinery-ingest --source-topic docs.raw)
# with the other four services, on a real PostgreSQL and the mock Kafka
# cluster:
#   1. The raw lines of the shared Appliances reviews go to docs.raw in
#      messages of 10 lines keyed by the run, then the end marker. The ingest
#      service is SIGKILLed mid-stream and restarted: the run still completes,
#      e2e_check.py finds every line accounted for exactly once (a batch sent
#      again after the kill must equal its first copy), and the ingest
#      counts equal `refinery ingest` on the same file with the same spec.
#   2. Messages the source must refuse (no key, a key that is not UTF-8, an
#      unknown run, a value that is not the gzip it claims to be, lines that
#      are not JSON or lack the text): counted or rejected with a reason,
#      and the service keeps running and exits 0 on SIGTERM.
. "$REFINERY_ROOT/tests/services/lib.sh"
. "$REFINERY_ROOT/tests/services/e2e_lib.sh"
reviews=$SHARED/data/amazon/Appliances_5.json.gz
RUN=kafka-src
e2e_env
scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic docs.raw 2"
e2e_spec "$TEST_DIR/run.yaml" "$reviews"
svc_start ingest --pg "$REFINERY_PG" # Control only, until the feed is written
for s in dedup tokenizer trainer evaluator; do svc_start $s; done
feed() { # RUN [ARGS...]
    local run=$1
    shift
    "$PY" tests/services/kafka_source_feed.py --proto "$REFINERY_ROOT/proto" \
        --server "127.0.0.1:${PORT[ingest]}" --kafka "$KAFKA_BOOTSTRAP" \
        --spec "$TEST_DIR/run.yaml" --run-id "$run" "$@"
}

# 1. A run through the Kafka source, with a SIGKILL mid-stream: the whole
# feed waits in docs.raw, so the source is busy when the kill comes.
feed $RUN --lines 10 "$reviews" | tee "$TEST_DIR/feed.json"
svc_stop ingest
svc_start ingest --pg "$REFINERY_PG" --source-topic docs.raw --source-max-messages 1
lines=$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["lines"])' <"$TEST_DIR/feed.json")
messages=$("$PY" -c 'import json,sys; print(json.load(sys.stdin)["messages"])' <"$TEST_DIR/feed.json")
[ "$lines" = "$(zcat "$reviews" | wc -l)" ]
wait_for "ingest to record 10 messages" 120 batches_at_least $RUN ingest 10
svc_kill ingest
at_kill=$(progress $RUN ingest | cut -d'|' -f1)
echo "ingest killed at $at_kill of $((messages + 1)) messages"
[ "$at_kill" -le "$messages" ] || {
    echo "the kill came after the last message: not mid-stream" >&2
    exit 1
}
run_state_is $RUN running
[ "$(sql "SELECT sealed_at IS NOT NULL FROM runs WHERE id = '$RUN'")" = f ]
svc_start ingest --pg "$REFINERY_PG" --source-topic docs.raw
wait_for "run $RUN to succeed" 600 run_state_is $RUN succeeded
# Every message (and the end marker) recorded exactly once.
[ "$(progress $RUN ingest | cut -d'|' -f1)" = $((messages + 1)) ]
("$PY" tests/services/e2e_check.py --proto "$REFINERY_ROOT/proto" --kafka "$KAFKA_BOOTSTRAP" \
    --pg "$REFINERY_PG" --run $RUN --pushed "$lines" --steps "$E2E_STEPS")
# The same documents as the ingest library reading the file.
"$REFINERY_BIN" ingest --config "$TEST_DIR/run.yaml" "$reviews" --out "$TEST_DIR/ref.jsonl" \
    --rejects "$TEST_DIR/ref.rejects" --stats "$TEST_DIR/ref.stats" 2>/dev/null
read -r _ in out rejected _ <<<"$(progress $RUN ingest | tr '|' ' ')"
echo "kafka source: in $in, kept $out, rejected $rejected;" \
    "refinery ingest: kept $(wc -l <"$TEST_DIR/ref.jsonl"), rejected $(wc -l <"$TEST_DIR/ref.rejects")"
[ "$in" = "$lines" ]
[ "$out" = "$(wc -l <"$TEST_DIR/ref.jsonl")" ]
[ "$rejected" = "$(wc -l <"$TEST_DIR/ref.rejects")" ]

# 2. Bad messages.
feed kafka-bad --bad | tee "$TEST_DIR/bad.json"
bad_sealed() { [ "$(sql "SELECT sealed_at IS NOT NULL FROM runs WHERE id = 'kafka-bad'")" = t ]; }
wait_for "the bad run to be sealed" 60 bad_sealed
read -r _ in out rejected _ <<<"$(progress kafka-bad ingest | tr '|' ' ')"
echo "bad run: in $in, kept $out, rejected $rejected"
[ "$in" = 6 ] && [ $((out + rejected)) = 6 ] && [ "$rejected" -ge 3 ]
kill -0 "${PID[ingest]}"
svc_stop ingest
svc_stats ingest | "$PY" -c 'import json, sys
s = json.load(sys.stdin)["source"]
print(s)
assert s["bad_messages"] == 2 and s["unknown_run"] == 1, s
for r in ("unreadable_message", "invalid_json", "missing_text"):
    assert s["reasons"][r] >= 1, (r, s["reasons"])'
for s in dedup tokenizer trainer evaluator; do svc_stop $s; done
echo "ingest kafka source: ok"

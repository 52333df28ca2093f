#!/usr/bin/env bash
# refinery-dedup against the standalone mock Kafka cluster and a real
# PostgreSQL: a known document set (planted exact and near duplicates) goes
# into docs.clean, the service is SIGKILLed mid-stream and restarted on the
# same index, and then: stage_progress counts every document exactly once
# (kept + duplicate = in), docs.unique and docs.duplicates deduplicated by
# (run, seq) hold every document once, and the kept ids are exactly those of
# `refinery dedup` on the same input in the same order. A second run with the
# same documents is deduplicated on its own (per-run index): same kept ids.
. "$REFINERY_ROOT/tests/services/lib.sh"
tool=$REFINERY_BUILD/tests/services/test_dedup_service
svc=$REFINERY_BUILD/refinery-dedup
BATCH=10
env_start pg kafka
# One partition: the stream order is the produce order, as for `refinery dedup`.
for t in docs.clean docs.unique docs.duplicates; do
    scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 1"
done
ndocs=$(python3 tests/services/dedup_docs.py "$TEST_DIR" 2000)
nbatch=$(((ndocs + BATCH - 1) / BATCH))

progress() { # [RUN]
    psql "$REFINERY_PG" -Atc "SELECT count(*), coalesce(sum(docs_in), 0),
        coalesce(sum(docs_out), 0), coalesce(sum(duplicate), 0)
        FROM stage_progress WHERE run_id = '${1:-run-dd}' AND stage = 'dedup'"
}
wait_batches() { # MIN SECONDS [RUN]
    local n=0
    for _ in $(seq $(($2 * 10))); do
        n=$(progress "${3:-}" 2>/dev/null | cut -d'|' -f1)
        [ "${n:-0}" -ge "$1" ] && return 0
        sleep 0.1
    done
    echo "only $n of $1 batches recorded after $2 s" >&2
    return 1
}

export REFINERY_DEDUP_INDEX=$TEST_DIR/index REFINERY_MAX_MESSAGES=1
"$svc" 2>"$TEST_DIR/dedup1.log" &
first=$!
env_track_pid $first
for _ in $(seq 300); do # the service applies the schema at start
    psql "$REFINERY_PG" -Atc "SELECT 1 FROM runs LIMIT 1" >/dev/null 2>&1 && break
    sleep 0.1
done
psql "$REFINERY_PG" -qc "INSERT INTO runs (id, spec) VALUES ('run-dd', '{}')"
"$tool" --produce "$KAFKA_BOOTSTRAP" run-dd "$TEST_DIR/docs.tsv" $BATCH
wait_batches $((nbatch / 5)) 60
kill -KILL $first
wait $first 2>/dev/null || true
echo "killed at $(progress)"

# The successor gets the partition once the dead member's session ends.
"$svc" 2>"$TEST_DIR/dedup2.log" &
second=$!
env_track_pid $second
wait_batches $nbatch 120
# A second run with the same documents, while the first is in the index.
psql "$REFINERY_PG" -qc "INSERT INTO runs (id, spec) VALUES ('run-dd2', '{}')"
"$tool" --produce "$KAFKA_BOOTSTRAP" run-dd2 "$TEST_DIR/docs.tsv" $BATCH
wait_batches $nbatch 120 run-dd2
kill -TERM $second
wait $second # exit 0
grep -o 'continuing after.*' "$TEST_DIR/dedup2.log" || true

row=$(progress)
echo "stage_progress (batches|in|kept|duplicate): $row"
IFS='|' read -r b in kept dup <<<"$row"
[ "$b" = "$nbatch" ] && [ "$in" = "$ndocs" ] && [ $((kept + dup)) = "$ndocs" ]

"$tool" --collect "$KAFKA_BOOTSTRAP" run-dd $nbatch $ndocs "$TEST_DIR/kept.ids"
[ "$(wc -l <"$TEST_DIR/kept.ids")" = "$kept" ]

"$REFINERY_BIN" dedup "$TEST_DIR/docs.jsonl" --out "$TEST_DIR/ref.jsonl" \
    --dups "$TEST_DIR/ref.dups" 2>"$TEST_DIR/ref.log"
python3 -c 'import json,sys; [print(json.loads(l)["id"]) for l in open(sys.argv[1])]' \
    "$TEST_DIR/ref.jsonl" >"$TEST_DIR/ref.ids"
sort -o "$TEST_DIR/kept.ids" "$TEST_DIR/kept.ids"
sort -o "$TEST_DIR/ref.ids" "$TEST_DIR/ref.ids"
cmp "$TEST_DIR/kept.ids" "$TEST_DIR/ref.ids"
[ "$(progress run-dd2)" = "$row" ]
"$tool" --collect "$KAFKA_BOOTSTRAP" run-dd2 $nbatch $ndocs "$TEST_DIR/kept2.ids"
sort -o "$TEST_DIR/kept2.ids" "$TEST_DIR/kept2.ids"
cmp "$TEST_DIR/kept2.ids" "$TEST_DIR/ref.ids"
echo "dedup service kill/restart: $ndocs docs, $kept kept, $dup duplicates, same kept ids as refinery dedup, also for a second run: ok"

#!/usr/bin/env bash
# The `refinery` client commands against a running refinery-ingest (real
# PostgreSQL, standalone mock Kafka): submit pushes a spec's JSONL input
# (mapped client-side, cleaned server-side) and seals the run, every record
# accounted for; status, list, watch and cancel; a bad spec is refused naming
# the key and line; unknown runs are NOT_FOUND; a sealed or cancelled run
# takes no more pushes; REFINERY__* overrides reach the stored spec; classify against refinery-evaluator (gRPC side) with
# a recorded checkpoint. The run's later stages are the end-to-end test's.
. "$REFINERY_ROOT/tests/services/lib.sh"
# The stored spec must be the file as sent: no REFINERY__* override from the
# caller (tests/run.sh on main sets REFINERY__RUN__CACHE=false for the
# embedded runner); the overrides case below sets its own.
while read -r v; do unset "$v"; done < <(env | sed -n 's/^\(REFINERY__[A-Za-z0-9_]*\)=.*/\1/p')
env_start pg kafka
bin=$REFINERY_BIN

"$REFINERY_BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ingest.port" \
    --kafka "$KAFKA_BOOTSTRAP" --pg "$REFINERY_PG" --max-watches 1 2>"$TEST_DIR/ingest.log" &
pid=$!
env_track_pid $pid
for _ in $(seq 150); do [ -s "$TEST_DIR/ingest.port" ] && break; sleep 0.1; done
[ -s "$TEST_DIR/ingest.port" ] || { echo "refinery-ingest did not start" >&2; exit 1; }
export REFINERY_SERVER=127.0.0.1:$(cat "$TEST_DIR/ingest.port")

# Every value of a flat JSON line by key: json KEY <<<"$line"
json() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p"; }
expect_fail() { # expect_fail STATUS TEXT command...: exit 1 or 2, stderr naming both
    local want=$1 text=$2 rc=0
    shift 2
    "$@" >"$TEST_DIR/out" 2>"$TEST_DIR/err" || rc=$?
    cat "$TEST_DIR/err"
    [ $rc -ne 0 ] || { echo "expected a failure from: $*" >&2; exit 1; }
    grep -q -- "$want" "$TEST_DIR/err" && grep -q -- "$text" "$TEST_DIR/err" ||
        { echo "expected '$want' and '$text' in the error of: $*" >&2; exit 1; }
}

# Six records: three good, one that cleans to nothing (the server rejects it),
# one that is not JSON and one without a label (refused here, with reasons).
docs=$TEST_DIR/docs.jsonl
cat >"$docs" <<'EOF'
{"text": "The first document is about gardening and tomatoes.", "label": 1}
{"text": "A second one talks about rain in the mountains.", "label": 0}
{"text": "   ", "label": 1}
not json at all
{"text": "No label on this one."}
{"text": "Third good document with plenty of words here.", "label": 1}
EOF
spec=$TEST_DIR/spec.yaml
cat >"$spec" <<EOF
run:
  name: cli
ingest:
  format: jsonl
  inputs: [$docs]
  text_fields: text
  label_field: label
dedup:
  threshold: 0.8
EOF

# submit: Submit, Push, Seal; the summary accounts for every record.
summary=$("$bin" submit "$spec" --run-id cli-1 2>"$TEST_DIR/submit.err")
cat "$TEST_DIR/submit.err"
echo "summary: $summary"
[ "$(json records <<<"$summary")" = 6 ]
[ "$(json pushed <<<"$summary")" = 4 ]
[ "$(json accepted <<<"$summary")" = 3 ]
[ "$(json rejected <<<"$summary")" = 1 ]
[ "$(json client_rejected <<<"$summary")" = 2 ]
grep -q '"client_reject_reasons":{"invalid_json":1,"missing_label":1}' <<<"$summary"
[ "$(json sealed <<<"$summary")" = true ]
grep -q '"reason":"invalid_json"' "$TEST_DIR/submit.err"

# status: running (pushed into), sealed, the ingest totals, ingest complete.
status=$("$bin" status cli-1)
echo "status: $status"
[ "$(json state <<<"$status")" = '"running"' ]
[ "$(json sealed <<<"$status")" = true ]
grep -q '"ingest":{"batches":[0-9]*,"docs_in":4,"docs_out":3,"rejected":1,"duplicate":0,"complete":true,"liveness":"complete",' <<<"$status"
grep -q '"dedup":{"batches":0,[^}]*"complete":false,"liveness":"down","liveness_reason":"no heartbeat of refinery-dedup recorded"' <<<"$status"
row=$(psql "$REFINERY_PG" -Atc "SELECT sum(docs_in), sum(docs_out), sum(rejected)
    FROM stage_progress WHERE run_id = 'cli-1' AND stage = 'ingest'")
[ "$row" = "4|3|1" ]
[ "$(psql "$REFINERY_PG" -Atc "SELECT spec FROM runs WHERE id = 'cli-1'")" = "$(cat "$spec")" ]

# REFINERY__* overrides apply to submit as to run: the stored spec is the
# effective one (and the inputs, read here, are the same documents).
summary=$(REFINERY__DEDUP__THRESHOLD=0.93 REFINERY__RUN__NAME=cli-override \
    "$bin" submit "$spec" --run-id cli-ov 2>"$TEST_DIR/submit.err")
cat "$TEST_DIR/submit.err"
grep -q "override REFINERY__DEDUP__THRESHOLD=0.93" "$TEST_DIR/submit.err"
[ "$(json accepted <<<"$summary")" = 3 ]
stored=$(psql "$REFINERY_PG" -Atc "SELECT spec FROM runs WHERE id = 'cli-ov'")
echo "stored spec with overrides:"; echo "$stored"
grep -Eq "^  threshold: '?0.93'?$" <<<"$stored"
grep -Eq "^  name: '?cli-override'?$" <<<"$stored"
grep -q "$docs" <<<"$stored"
if grep -q "0\.8" <<<"$stored"; then echo "the override did not replace 0.8" >&2; exit 1; fi

# A sealed run takes no more documents.
expect_fail "status 9" "sealed" "$REFINERY_BUILD/refinery-push" --target "$REFINERY_SERVER" \
    --run cli-1 --input "$docs"

# Bad specs: refused before anything is created, naming key and line (a
# section the client reads is checked here, the others by the server).
sed 's/threshold/treshold/' "$spec" >"$TEST_DIR/bad.yaml"
expect_fail INVALID_ARGUMENT "spec:9: unknown key 'dedup.treshold'" \
    "$bin" submit "$TEST_DIR/bad.yaml" --run-id cli-bad
sed 's/text_fields/txt_fields/' "$spec" >"$TEST_DIR/bad2.yaml"
expect_fail "bad2.yaml:6" "unknown key 'ingest.txt_fields'" \
    "$bin" submit "$TEST_DIR/bad2.yaml" --run-id cli-bad
[ "$(psql "$REFINERY_PG" -Atc "SELECT count(*) FROM runs WHERE id = 'cli-bad'")" = 0 ]
expect_fail ALREADY_EXISTS cli-1 "$bin" submit "$spec" --run-id cli-1
expect_fail INVALID_ARGUMENT run_id "$bin" submit "$spec" --run-id ../up

# Unknown runs.
for cmd in status watch cancel; do
    expect_fail NOT_FOUND no-such-run "$bin" $cmd no-such-run
done

# A generated run id; watch follows it until it ends (here: marked
# succeeded in the store, as the evaluator service does) and exits 0.
summary=$("$bin" submit "$spec" 2>/dev/null)
run2=$(json run_id <<<"$summary" | tr -d '"')
[[ $run2 == run-* ]]
"$bin" watch "$run2" >"$TEST_DIR/watch.out" 2>&1 &
watcher=$!
sleep 1
psql "$REFINERY_PG" -qc "UPDATE runs SET state = 'succeeded', updated_at = now() WHERE id = '$run2'"
wait $watcher # exit 0: succeeded
cat "$TEST_DIR/watch.out"
grep -q "$run2 running sealed | ingest 4>3 rej 1 done" "$TEST_DIR/watch.out"
tail -n 1 "$TEST_DIR/watch.out" | grep -q "$run2 succeeded sealed"

# cancel: a submitted --watch run is cancelled from outside; the watch exits 1.
"$bin" submit "$spec" --run-id cli-3 --watch >"$TEST_DIR/watch3.out" 2>&1 &
watcher=$!
for _ in $(seq 100); do grep -q "cli-3 running" "$TEST_DIR/watch3.out" && break; sleep 0.1; done
[ "$(json state <<<"$("$bin" cancel cli-3)")" = '"cancelled"' ]
rc=0
wait $watcher || rc=$?
cat "$TEST_DIR/watch3.out"
[ $rc -eq 1 ]
grep -q "run cli-3 cancelled" "$TEST_DIR/watch3.out"
expect_fail FAILED_PRECONDITION "already ended" "$bin" cancel cli-3
expect_fail "status 9" cancelled "$REFINERY_BUILD/refinery-push" --target "$REFINERY_SERVER" \
    --run cli-3 --input "$docs"

# PostgreSQL restarts under two watchers of one run (the store reconnects;
# a Watch that fails with UNAVAILABLE meanwhile is made again); the second
# watcher, over the --max-watches limit, polls with Get. Both see the run
# succeed.
"$bin" submit "$spec" --run-id cli-4 >/dev/null 2>&1
"$bin" watch cli-4 >"$TEST_DIR/watch4a.out" 2>&1 &
w1=$!
for _ in $(seq 100); do grep -q "cli-4 running" "$TEST_DIR/watch4a.out" && break; sleep 0.1; done
"$bin" watch cli-4 >"$TEST_DIR/watch4b.out" 2>&1 &
w2=$!
for _ in $(seq 100); do grep -q "cli-4 running" "$TEST_DIR/watch4b.out" && break; sleep 0.1; done
scripts/test-env/pg.sh restart "$TEST_DIR"
psql "$REFINERY_PG" -qc "UPDATE runs SET state = 'succeeded', updated_at = now() WHERE id = 'cli-4'"
wait $w1
wait $w2
cat "$TEST_DIR/watch4a.out" "$TEST_DIR/watch4b.out"
grep -q "polling instead" "$TEST_DIR/watch4b.out"
for f in watch4a watch4b; do tail -n 1 "$TEST_DIR/$f.out" | grep -q "cli-4 succeeded"; done

# Giving up. Only ingest runs here, so a sealed run stalls at dedup: watch
# exits 3 after --stall-timeout, naming the stages that have not moved with
# their last counts (and submit --watch likewise, its timeout from the
# environment). Against a port where nothing listens it exits 4 after
# --unreachable-timeout, naming the address and the error, retrying with
# growing pauses meanwhile instead of in a loop.
"$bin" submit "$spec" --run-id cli-5 >/dev/null 2>&1
timed() { # timed NAME command...: output in NAME.out and NAME.err; sets rc and secs
    local name=$1 start
    shift
    start=$(date +%s.%N)
    rc=0
    "$@" >"$TEST_DIR/$name.out" 2>"$TEST_DIR/$name.err" || rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    cat "$TEST_DIR/$name.out" "$TEST_DIR/$name.err"
    echo "$name: exit $rc after $secs s"
}
within() { awk -v s="$secs" -v lo="$1" -v hi="$2" 'BEGIN { exit !(s >= lo && s < hi) }'; }
timed stall "$bin" watch cli-5 --stall-timeout 3
[ $rc -eq 3 ]
within 3 8
# No dedup runs here: the line flags it (and the later stages) down.
grep -q "cli-5 running sealed | ingest 4>3 rej 1 done | dedup 0>0 DOWN |.* | dedup down: no heartbeat of refinery-dedup recorded" "$TEST_DIR/stall.out"
grep -q "giving up: run cli-5 (running, sealed) made no progress for 3.[0-9] s (--stall-timeout 3)" \
    "$TEST_DIR/stall.err"
grep -q "not moving: dedup 0>0 (batches 0) \[down: no heartbeat of refinery-dedup recorded\], tokenizer 0>0 (batches 0) \[down: .*\], trainer 0>0 (batches 0) \[down: .*\], evaluator 0>0 (batches 0) \[down: .*\]; complete: ingest 4>3 (batches 1)$" \
    "$TEST_DIR/stall.err"
timed stall6 env REFINERY_STALL_TIMEOUT=2 "$bin" submit "$spec" --run-id cli-6 --watch --json
[ $rc -eq 3 ]
within 2 8
grep -q '"run_id":"cli-6","state":"running"' "$TEST_DIR/stall6.out"
grep -q "refinery submit: giving up: run cli-6 .* (--stall-timeout 2).*not moving: dedup 0>0" \
    "$TEST_DIR/stall6.err"
nobody=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timed down "$bin" watch cli-5 --server 127.0.0.1:$nobody --unreachable-timeout 2
[ $rc -eq 4 ]
within 2 6
grep -q "giving up: no status from the Control server at 127.0.0.1:$nobody for 2.[0-9] s (--unreachable-timeout 2); last error: UNAVAILABLE: .*127.0.0.1:$nobody" \
    "$TEST_DIR/down.err"
[ "$(wc -l <"$TEST_DIR/down.err")" -eq 2 ] # the first failure and the verdict, no retry lines
[ ! -s "$TEST_DIR/down.out" ]
# Bad timeouts are usage errors.
rc=0; "$bin" watch cli-5 --stall-timeout soon 2>/dev/null || rc=$?; [ $rc -eq 2 ]
rc=0; REFINERY_UNREACHABLE_TIMEOUT=-1 "$bin" watch cli-5 2>/dev/null || rc=$?; [ $rc -eq 2 ]

# The list: newest first, one line per run.
"$bin" status >"$TEST_DIR/list"
cat "$TEST_DIR/list"
[ "$(wc -l <"$TEST_DIR/list")" -eq 7 ] # cli-1, cli-ov, a generated id, cli-3, cli-4, cli-5, cli-6
head -n 1 "$TEST_DIR/list" | grep -q '"run_id":"cli-6"'
[ "$("$bin" status --limit 1 --lines | wc -l)" -eq 1 ]

# classify against refinery-evaluator (gRPC side only), with a checkpoint
# recorded for cli-1 as the trainer service records them: the tiny exported
# model of the trainer tests.
env -u KAFKA_BOOTSTRAP "$REFINERY_BUILD/refinery-evaluator" --listen 127.0.0.1:0 --port-file "$TEST_DIR/eval.port" \
    --pg "$REFINERY_PG" 2>"$TEST_DIR/evaluator.log" &
epid=$!
env_track_pid $epid
for _ in $(seq 150); do [ -s "$TEST_DIR/eval.port" ] && break; sleep 0.1; done
[ -s "$TEST_DIR/eval.port" ] || { echo "refinery-evaluator did not start" >&2; exit 1; }
export REFINERY_EVALUATOR=127.0.0.1:$(cat "$TEST_DIR/eval.port")
expect_fail FAILED_PRECONDITION cli-1 "$bin" classify --run cli-1 "a text"
expect_fail NOT_FOUND no-such-run "$bin" classify --run no-such-run "a text"
psql "$REFINERY_PG" -qc "INSERT INTO checkpoints (run_id, step, path, train_loss)
    VALUES ('cli-1', 5, '$REFINERY_ROOT/tests/fixtures/trainer/exported', 0.5)"
printf 'one text\nanother, longer text\nthird\n' | "$bin" classify --run cli-1 --batch 2 - \
    >"$TEST_DIR/classify.out"
cat "$TEST_DIR/classify.out"
[ "$(wc -l <"$TEST_DIR/classify.out")" -eq 3 ]
sed -n 2p "$TEST_DIR/classify.out" | grep -q '"text":"another, longer text"}$'
# Each line: the checkpoint step, a label and its class probabilities summing to 1.
while read -r line; do
    [ "$(json step <<<"$line")" = 5 ]
    probs=$(sed -n 's/.*"probs":\[\([^]]*\)\].*/\1/p' <<<"$line")
    label=$(json label <<<"$line")
    awk -v p="$probs" -v l="$label" 'BEGIN { n = split(p, a, ","); s = 0; m = 1;
        for (i = 1; i <= n; i++) { s += a[i]; if (a[i] > a[m]) m = i }
        exit !(n >= 2 && s > 0.999 && s < 1.001 && m - 1 == l) }'
done <"$TEST_DIR/classify.out"
expect_fail NOT_FOUND "checkpoint 7" "$bin" classify --run cli-1 --step 7 "a text"
# Usage errors exit 2 before any connection.
rc=0; "$bin" classify hello 2>/dev/null || rc=$?; [ $rc -eq 2 ]
rc=0; "$bin" classify --run cli-1 --step x hello 2>/dev/null || rc=$?; [ $rc -eq 2 ]

kill -TERM $pid
wait $pid
echo "control CLI: ok"

#!/usr/bin/env bash
# Liveness and readiness (issue 15), with real service processes:
# - every service writes a heartbeat to PostgreSQL (runtime/ready.h; checked
#   for all five, with their pids); Control
#   (refinery-ingest --down-after / --stall-after) flags each stage of a run:
#   a stage whose service never started or was SIGKILLed is "down" within
#   --down-after plus a heartbeat interval; a live stage with batches waiting
#   for it that makes no progress (here refinery-dedup consuming the wrong
#   topic) is "stalled" after --stall-after; a working stage is neither;
#   `refinery status` (JSON) and `refinery status --lines` / `watch` show it;
#   a live stage whose Kafka does not answer is "unready" with the reason;
# - readiness of refinery-ingest (refinery.v1.Ingest, refinery.v1.Control)
#   and refinery-evaluator (refinery.v1.Evaluator): NOT_SERVING while
#   PostgreSQL is stopped, and (Ingest, Evaluator) while every Kafka broker is
#   down, SERVING again when they return, "" SERVING throughout.
. "$REFINERY_ROOT/tests/services/lib.sh"
env_start pg kafka
for t in docs.clean docs.rejected docs.unique docs.duplicates tokens.train tokens.eval checkpoints; do
    scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 1"
done
bin=$REFINERY_BIN
venv=$(scripts/pyenv.sh test)
DOWN=3 STALL=4 BEAT=0.5

wait_port() { # FILE: prints the port once the service wrote it
    for _ in $(seq 300); do [ -s "$1" ] && break; sleep 0.1; done
    cat "$1"
}
json_stage() { # RUN STAGE FIELD: a field of a stage in `refinery status RUN`
    "$bin" status "$1" | "$venv/bin/python" -c \
        "import json,sys; print(json.load(sys.stdin)['stages']['$2']['$3'])"
}
wait_liveness() { # RUN STAGE STATE SECONDS: prints the seconds it took
    local start=$(date +%s%N) end=$((SECONDS + $4)) got
    while :; do
        got=$(json_stage "$1" "$2" liveness)
        [ "$got" = "$3" ] && break
        if [ $SECONDS -ge $end ]; then
            echo "run $1: $2 is '$got', not '$3' after $4 s:" >&2
            "$bin" status "$1" >&2
            exit 1
        fi
        sleep 0.2
    done
    echo "$(( ($(date +%s%N) - start) / 1000000 )) ms"
}

"$REFINERY_BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ingest.port" \
    --ready-interval $BEAT --down-after $DOWN --stall-after $STALL --batch-docs 2 \
    2>"$TEST_DIR/ingest.log" &
ingest_pid=$!
env_track_pid $ingest_pid
ingest_port=$(wait_port "$TEST_DIR/ingest.port")
export REFINERY_SERVER=127.0.0.1:$ingest_port

docs=$TEST_DIR/docs.jsonl
for i in $(seq 12); do
    echo "{\"text\": \"Document number $i talks about topic $i in its own words.\", \"label\": $((i % 2))}"
done >"$docs"
spec() { # FILE
    cat >"$1" <<YAML
run:
  name: liveness
ingest:
  format: jsonl
  inputs: [$docs]
  text_fields: text
  label_field: label
  batch_docs: 2
YAML
}
spec "$TEST_DIR/spec.yaml"

# --- stalled: dedup is alive (heartbeats) but consumes another topic ---
"$REFINERY_BUILD/refinery-dedup" --listen 127.0.0.1:0 --index "$TEST_DIR/index" \
    --topic-in docs.elsewhere --ready-interval $BEAT 2>"$TEST_DIR/dedup.1.log" &
dedup_pid=$!
env_track_pid $dedup_pid
"$bin" submit "$TEST_DIR/spec.yaml" --run-id live-1 >/dev/null
[ "$(json_stage live-1 ingest liveness)" = complete ]
# Never started: down at once, saying so.
[ "$(json_stage live-1 tokenizer liveness)" = down ]
json_stage live-1 tokenizer liveness_reason | grep -q "no heartbeat of refinery-tokenizer recorded"
echo "stalled after $(wait_liveness live-1 dedup stalled $((STALL + 6)))"
reason=$(json_stage live-1 dedup liveness_reason)
echo "dedup: $reason"
[[ $reason == *"batch(es) wait for it and it made no progress"*"stalled after $STALL s"* ]]
"$bin" status live-1 --lines | tee "$TEST_DIR/line"
grep -q "dedup 0>0 STALLED" "$TEST_DIR/line"
grep -q "| dedup stalled: " "$TEST_DIR/line"
# A watch shows it too, and its give-up message names it.
rc=0
"$bin" watch live-1 --stall-timeout 1 >"$TEST_DIR/watch.out" 2>"$TEST_DIR/watch.err" || rc=$?
[ $rc -eq 3 ] || { echo "watch exited $rc, not 3" >&2; cat "$TEST_DIR/watch.err" >&2; exit 1; }
grep -q "STALLED" "$TEST_DIR/watch.out"
grep -q "dedup 0>0 (batches 0) \[stalled: " "$TEST_DIR/watch.err"

# --- working, then complete: dedup on the right topic ---
kill -TERM $dedup_pid
wait $dedup_pid
"$REFINERY_BUILD/refinery-dedup" --listen 127.0.0.1:0 --index "$TEST_DIR/index" \
    --ready-interval $BEAT 2>"$TEST_DIR/dedup.2.log" &
dedup_pid=$!
env_track_pid $dedup_pid
echo "complete after $(wait_liveness live-1 dedup complete 30)"
[ "$(json_stage live-1 dedup last_progress)" != None ]

# --- down: dedup SIGKILLed; flagged within --down-after + a heartbeat ---
kill -KILL $dedup_pid
wait $dedup_pid 2>/dev/null || true
killed=$(date +%s%N)
"$bin" submit "$TEST_DIR/spec.yaml" --run-id live-2 >/dev/null
wait_liveness live-2 dedup down $((DOWN + 10)) >/dev/null
ms=$(( ($(date +%s%N) - killed) / 1000000 ))
echo "down ${ms} ms after SIGKILL: $(json_stage live-2 dedup liveness_reason)"
limit=$(( (DOWN + 2) * 1000 ))
[ $ms -le $limit ] || { echo "down seen after $ms ms (limit $limit)" >&2; exit 1; }
json_stage live-2 dedup liveness_reason | grep -q "no heartbeat of refinery-dedup for"
[ "$(json_stage live-2 dedup last_heartbeat)" != None ]
"$bin" status live-2 --lines | grep -q "dedup 0>0 DOWN"
# An ended run flags nothing.
"$bin" cancel live-2 >/dev/null
[ "$(json_stage live-2 dedup liveness)" = ended ]

# --- unready: dedup beats but says Kafka does not answer ---
"$REFINERY_BUILD/refinery-dedup" --listen 127.0.0.1:0 --index "$TEST_DIR/index" \
    --ready-interval $BEAT 2>"$TEST_DIR/dedup.3.log" &
dedup_pid=$!
env_track_pid $dedup_pid
"$bin" submit "$TEST_DIR/spec.yaml" --run-id live-3 >/dev/null
wait_liveness live-3 dedup complete 30 >/dev/null

# --- readiness of ingest (Ingest, Control) and the evaluator ---
"$REFINERY_BUILD/refinery-evaluator" --listen 127.0.0.1:0 --port-file "$TEST_DIR/eval.port" \
    --state "$TEST_DIR/eval" --ready-interval $BEAT --threads 1 2>"$TEST_DIR/evaluator.log" &
eval_pid=$!
env_track_pid $eval_pid
eval_port=$(wait_port "$TEST_DIR/eval.port")
hc() { # PORT SERVICE STATUS
    "$venv/bin/python" tests/services/health_client.py proto "$1" "$2" wait "$3" 20
}
hc "$ingest_port" refinery.v1.Ingest SERVING
hc "$ingest_port" refinery.v1.Control SERVING
hc "$eval_port" refinery.v1.Evaluator SERVING
# The evaluator's heartbeat is recorded too.
[ "$(psql "$REFINERY_PG" -Atc "select count(*) from heartbeats where service = 'evaluator'")" -ge 1 ]
for b in 1 2 3; do scripts/test-env/kafka.sh cmd "$TEST_DIR" "down $b"; done
hc "$ingest_port" refinery.v1.Ingest NOT_SERVING
hc "$eval_port" refinery.v1.Evaluator NOT_SERVING
hc "$ingest_port" refinery.v1.Control SERVING # Control needs only PostgreSQL
grep -q '"refinery.v1.Ingest NOT_SERVING: Kafka unreachable: ' "$TEST_DIR/ingest.log"
grep -q '"refinery.v1.Evaluator NOT_SERVING: Kafka unreachable: ' "$TEST_DIR/evaluator.log"
echo "unready after $(wait_liveness live-3 dedup unready 15)"
json_stage live-3 dedup liveness_reason | grep -q "^Kafka unreachable: "
for b in 1 2 3; do scripts/test-env/kafka.sh cmd "$TEST_DIR" "up $b"; done
hc "$ingest_port" refinery.v1.Ingest SERVING
hc "$eval_port" refinery.v1.Evaluator SERVING
wait_liveness live-3 dedup complete 15 >/dev/null
scripts/test-env/pg.sh stop "$TEST_DIR"
hc "$ingest_port" refinery.v1.Ingest NOT_SERVING
hc "$ingest_port" refinery.v1.Control NOT_SERVING
hc "$eval_port" refinery.v1.Evaluator NOT_SERVING
grep -q '"refinery.v1.Control NOT_SERVING: PostgreSQL unreachable: ' "$TEST_DIR/ingest.log"
grep -q '"refinery.v1.Evaluator NOT_SERVING: PostgreSQL unreachable: ' "$TEST_DIR/evaluator.log"
scripts/test-env/pg.sh restart "$TEST_DIR"
hc "$ingest_port" refinery.v1.Ingest SERVING
hc "$ingest_port" refinery.v1.Control SERVING
hc "$eval_port" refinery.v1.Evaluator SERVING
kill -TERM $eval_pid
wait $eval_pid
kill -TERM $dedup_pid
wait $dedup_pid

# --- the tokenizer and the trainer beat too ---
"$REFINERY_BUILD/refinery-tokenizer" --listen 127.0.0.1:0 \
    --tokenizer tests/fixtures/trainer/tiny-bert/vocab.txt --ready-interval $BEAT \
    2>"$TEST_DIR/tokenizer.log" &
tok_pid=$!
env_track_pid $tok_pid
"$REFINERY_BUILD/refinery-trainer" --listen 127.0.0.1:0 --state "$TEST_DIR/trainer" \
    --checkpoints "$TEST_DIR/ck" --threads 1 --ready-interval $BEAT 2>"$TEST_DIR/trainer.log" &
trainer_pid=$!
env_track_pid $trainer_pid
beats() { # the services with a ready heartbeat younger than 2 s, by this host and pid
    psql "$REFINERY_PG" -Atc "select service || ' ' || split_part(instance, ':', 2) from heartbeats
        where ready and beat_at > now() - interval '2 seconds' order by 1"
}
for _ in $(seq 100); do
    [ "$(beats | grep -c -E "^(tokenizer $tok_pid|trainer $trainer_pid)$")" -eq 2 ] && break
    sleep 0.2
done
beats
beats | grep -qx "tokenizer $tok_pid" || { echo "no heartbeat of refinery-tokenizer" >&2; exit 1; }
beats | grep -qx "trainer $trainer_pid" || { echo "no heartbeat of refinery-trainer" >&2; exit 1; }
kill -TERM $tok_pid $trainer_pid
wait $tok_pid
wait $trainer_pid
kill -TERM $ingest_pid
wait $ingest_pid
echo "liveness: ok"

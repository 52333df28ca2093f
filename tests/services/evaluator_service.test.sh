#!/usr/bin/env bash
# refinery-evaluator with the mock Kafka cluster and a real PostgreSQL, on
# checkpoint folders exported by `refinery train` from the tiny BERT fixture:
# - eval TokenBatches on tokens.eval and two CheckpointAnnounce messages sent
#   before the run is sealed: nothing is evaluated until the seal; then
#   eval_results of both checkpoints equal `refinery eval` on the same
#   sequences, and the final one sets the run succeeded;
# - Classify (latest checkpoint) equals the folder's forward pass for every
#   text; health SERVING; bad requests get INVALID_ARGUMENT / NOT_FOUND;
# - a second run, the service SIGKILLed mid-intake and restarted on its state
#   directory, some batches replayed: every batch recorded once and the same
#   results as the first run, written once;
# - SIGTERM while an announcement waits for an unsealed run: exit 0.
. "$REFINERY_ROOT/tests/services/lib.sh"
tool=$REFINERY_BUILD/tests/services/test_evaluator_service
svc=$REFINERY_BUILD/refinery-evaluator
fx=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
PER=4
env_start pg kafka
for t in tokens.eval checkpoints; do
    scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 2"
done

# A learnable task (label 1 iff a positive word), as in tests/trainer/train_cli.test.sh.
python3 - "$TEST_DIR" <<'PY'
import random, sys
random.seed(5)
pos, neg = ["good", "great", "fun", "brilliant"], ["bad", "awful", "boring", "dull"]
filler = "the a movie film plot actor story scene music ending is was very really".split()
for name, n in (("train", 64), ("eval", 38)):
    with open("%s/%s.jsonl" % (sys.argv[1], name), "w") as f:
        for i in range(n):
            y = i % 2
            words = random.sample(filler, 5) + [random.choice(pos if y else neg)]
            random.shuffle(words)
            f.write('{"id":"%s%d","text":"%s","label":%d}\n' % (name, i, " ".join(words), y))
PY
neval=$(wc -l <"$TEST_DIR/eval.jsonl")
nbatch=$(((neval + PER - 1) / PER))
for steps in 8 48; do # two checkpoints: `refinery train` exports after 8 and 48 steps
    printf 'trainer:\n  model: %s\n  train: %s\n  output: %s\n  export: %s\n  max_steps: %d\n  batch_size: 8\n  lr: 0.003\n  log_every: 0\n  threads: 2\n  max_len: 16\n' \
        "$fx" "$TEST_DIR/train.jsonl" "$TEST_DIR/train-$steps" "$TEST_DIR/ckpt-$steps" $steps \
        >"$TEST_DIR/train-$steps.yaml"
    "$REFINERY_BIN" train "$TEST_DIR/train-$steps.yaml" 2>"$TEST_DIR/train-$steps.log"
    "$REFINERY_BIN" eval --model "$TEST_DIR/ckpt-$steps" --data "$TEST_DIR/eval.jsonl" \
        --max-len 16 --batch 32 --threads 2 --out "$TEST_DIR/ref-$steps.json" 2>/dev/null >/dev/null
done

start() { # LOG: starts the service, sets pid and port
    rm -f "$TEST_DIR/port"
    "$svc" --state "$TEST_DIR/state" --listen 127.0.0.1:0 --port-file "$TEST_DIR/port" \
        --max-messages 1 --batch-size 32 --threads 2 2>"$TEST_DIR/$1" &
    pid=$!
    env_track_pid $pid
    for _ in $(seq 300); do [ -s "$TEST_DIR/port" ] && break; sleep 0.1; done
    port=$(cat "$TEST_DIR/port")
}
sql() { psql "$REFINERY_PG" -Atqc "$1"; }
new_run() { # RUN: a running run whose upstream stages recorded nbatch batches
    sql "INSERT INTO runs (id, spec, state) VALUES ('$1', '{}', 'running')"
    for st in ingest dedup tokenizer; do
        sql "INSERT INTO stage_progress (run_id, stage, batch_seq, docs_in, docs_out, rejected, duplicate)
             SELECT '$1', '$st', s, $PER, $PER, 0, 0 FROM generate_series(0, $nbatch - 1) s"
    done
}
progress() { # RUN -> batches|sequences recorded by the evaluator
    sql "SELECT count(*), coalesce(sum(docs_in), 0) FROM stage_progress
         WHERE run_id = '$1' AND stage = 'evaluator'"
}
wait_for() { # SECONDS SQL EXPECTED
    local got=
    for _ in $(seq $(($1 * 10))); do
        got=$(sql "$2")
        [ "$got" = "$3" ] && return 0
        sleep 0.1
    done
    echo "after $1 s: '$2' gives '$got', not '$3'" >&2
    return 1
}
# The metrics of RUN's checkpoint STEP against `refinery eval`'s report.
check_results() { # RUN STEP REPORT
    sql "SELECT metric, value FROM eval_results WHERE run_id = '$1' AND checkpoint_step = $2
         ORDER BY metric" >"$TEST_DIR/got-$1-$2.txt"
    python3 - "$TEST_DIR/got-$1-$2.txt" "$3" <<'PY'
import json, sys
got = dict(l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip())
got = {k: float(v) for k, v in got.items()}
ref = json.load(open(sys.argv[2]))
want = {"n": ref["examples"], "accuracy": ref["accuracy"], "loss": ref["loss"],
        "macro_f1": ref["macro"]["f1"], "macro_precision": ref["macro"]["precision"],
        "macro_recall": ref["macro"]["recall"]}
for c, pc in enumerate(ref["per_class"]):
    for k in ("precision", "recall", "f1", "support"):
        want["%s.%d" % (k, c)] = pc[k]
assert set(got) == set(want), (sorted(got), sorted(want))
for k, v in want.items():
    assert abs(got[k] - v) <= 1e-6 * max(1, abs(v)), (k, got[k], v)
print("  %s: accuracy %.4f macro-F1 %.4f loss %.5f n %d = refinery eval" %
      (sys.argv[1].rsplit("/", 1)[1], got["accuracy"], got["macro_f1"], got["loss"], got["n"]))
PY
}

start evaluator1.log
for _ in $(seq 300); do # the service applies the schema when it opens the store
    sql "SELECT 1 FROM runs LIMIT 1" >/dev/null 2>&1 && break
    sleep 0.1
done

# Run 1: everything sent before the seal; nothing is evaluated until then.
new_run ev-a
"$tool" --produce "$KAFKA_BOOTSTRAP" ev-a "$TEST_DIR/ckpt-8" "$TEST_DIR/eval.jsonl" $PER
sql "INSERT INTO checkpoints (run_id, step, path) VALUES ('ev-a', 8, '$TEST_DIR/ckpt-8'), ('ev-a', 48, '$TEST_DIR/ckpt-48')"
"$tool" --announce "$KAFKA_BOOTSTRAP" ev-a 8 "$TEST_DIR/ckpt-8" 0
"$tool" --announce "$KAFKA_BOOTSTRAP" ev-a 48 "$TEST_DIR/ckpt-48" 1
wait_for 60 "SELECT count(*) FROM stage_progress WHERE run_id = 'ev-a' AND stage = 'evaluator'" $nbatch
sleep 1
[ "$(sql "SELECT count(*) FROM eval_results WHERE run_id = 'ev-a'")" = 0 ]
grep -q 'waiting for its eval intake' "$TEST_DIR/evaluator1.log"
sql "UPDATE runs SET sealed_at = now() WHERE id = 'ev-a'"
wait_for 120 "SELECT state FROM runs WHERE id = 'ev-a'" succeeded
echo "run ev-a: $(progress ev-a) batches|sequences, evaluated after the seal, succeeded"
check_results ev-a 8 "$TEST_DIR/ref-8.json"
check_results ev-a 48 "$TEST_DIR/ref-48.json"

"$tool" --classify "$port" ev-a "$TEST_DIR/ckpt-48" "$TEST_DIR/eval.jsonl"
"$tool" --bad "$port" ev-a

# Run 2: SIGKILL mid-intake, restart on the same state, replays.
new_run ev-b
sql "UPDATE runs SET sealed_at = now() WHERE id = 'ev-b'"
sql "INSERT INTO checkpoints (run_id, step, path) VALUES ('ev-b', 48, '$TEST_DIR/ckpt-48')"
"$tool" --announce "$KAFKA_BOOTSTRAP" ev-b 48 "$TEST_DIR/ckpt-48" 1
half=$((nbatch / 2))
head -n $((half * PER)) "$TEST_DIR/eval.jsonl" >"$TEST_DIR/eval-1.jsonl"
tail -n +$((half * PER + 1)) "$TEST_DIR/eval.jsonl" >"$TEST_DIR/eval-2.jsonl"
"$tool" --produce "$KAFKA_BOOTSTRAP" ev-b "$TEST_DIR/ckpt-48" "$TEST_DIR/eval-1.jsonl" $PER
wait_for 60 "SELECT count(*) > 0 FROM stage_progress WHERE run_id = 'ev-b' AND stage = 'evaluator'" t
kill -KILL $pid
wait $pid 2>/dev/null || true
echo "killed after $(progress ev-b) of $nbatch|$neval batches|sequences of run ev-b"
"$tool" --produce "$KAFKA_BOOTSTRAP" ev-b "$TEST_DIR/ckpt-48" "$TEST_DIR/eval-2.jsonl" $PER $half
# Upstream replays of the first batches, with other labels: ignored.
sed 's/"label":\([01]\)/"label":9/' "$TEST_DIR/eval.jsonl" | head -n $((2 * PER)) >"$TEST_DIR/replay.jsonl"
"$tool" --produce "$KAFKA_BOOTSTRAP" ev-b "$TEST_DIR/ckpt-48" "$TEST_DIR/replay.jsonl" $PER
start evaluator2.log
wait_for 120 "SELECT state FROM runs WHERE id = 'ev-b'" succeeded
row=$(progress ev-b)
echo "run ev-b after the restart: $row batches|sequences, succeeded"
[ "$row" = "$nbatch|$neval" ]
check_results ev-b 48 "$TEST_DIR/ref-48.json"
[ "$(sql "SELECT count(*) FROM eval_results a JOIN eval_results b USING (checkpoint_step, metric)
          WHERE a.run_id = 'ev-a' AND b.run_id = 'ev-b' AND a.value = b.value")" = \
  "$(sql "SELECT count(*) FROM eval_results WHERE run_id = 'ev-b'")" ]

# SIGTERM while an announcement waits for a run that is not sealed: exit 0 at once.
new_run ev-c
"$tool" --announce "$KAFKA_BOOTSTRAP" ev-c 48 "$TEST_DIR/ckpt-48" 1
for _ in $(seq 300); do
    [ "$(grep -c 'run ev-c checkpoint 48: waiting' "$TEST_DIR/evaluator2.log")" = 1 ] && break
    sleep 0.1
done
grep -q 'run ev-c checkpoint 48: waiting' "$TEST_DIR/evaluator2.log"
start_term=$(date +%s)
kill -TERM $pid
wait $pid # exit 0
echo "SIGTERM while waiting for run ev-c: exit 0 after $(($(date +%s) - start_term)) s"
echo "evaluator service: ok"

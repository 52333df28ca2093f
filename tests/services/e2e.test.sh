#!/usr/bin/env bash
# End to end: the five services as processes on a real PostgreSQL and the
# 3-broker mock Kafka cluster. The shared Amazon reviews go through gRPC
# twice, each run training the tiny BERT fixture for a few steps:
#   1. `refinery submit SPEC --watch` (the CLI reads the spec's inputs and
#      pushes them), then `refinery classify` and `refinery status`;
#   2. tests/services/e2e_client.py, a Python client generated from proto/
#      by grpcio-tools: Submit, Push, Seal, Watch to the end, Classify;
#   3. a long run cancelled once it has a checkpoint: the trainer stops it.
# For each run, e2e_check.py asserts from the topics and PostgreSQL that every
# document is accounted for (kept + rejected + duplicate = pushed, by id and
# per stage), that the token batches reached the trainer and the evaluator,
# that the checkpoints reach the last step, and that the evaluator's metrics
# are recorded and the run succeeded. Every service then exits 0 on SIGTERM.
. "$REFINERY_ROOT/tests/services/lib.sh"
. "$REFINERY_ROOT/tests/services/e2e_lib.sh"
cli_reviews=$SHARED/data/amazon/Appliances_5.json.gz
py_reviews=$SHARED/data/amazon/All_Beauty_5.json.gz
PY_LIMIT=2000 # first reviews of All_Beauty (5,269): keeps the run short under ASan
e2e_env
e2e_spec "$TEST_DIR/cli.yaml" "$cli_reviews"
e2e_spec "$TEST_DIR/py.yaml" "$py_reviews"
for s in ingest dedup tokenizer trainer evaluator; do svc_start $s; done
export REFINERY_SERVER=127.0.0.1:${PORT[ingest]} REFINERY_EVALUATOR=127.0.0.1:${PORT[evaluator]}
check() { # RUN PUSHED
    ("$PY" tests/services/e2e_check.py --proto "$REFINERY_ROOT/proto" \
        --kafka "$KAFKA_BOOTSTRAP" --pg "$REFINERY_PG" --run "$1" --pushed "$2" \
        --steps "$E2E_STEPS")
}

# 1. The CLI.
t0=$SECONDS
"$REFINERY_BIN" submit "$TEST_DIR/cli.yaml" --run-id e2e-cli --watch >"$TEST_DIR/submit.out" \
    2>"$TEST_DIR/submit.log" || { cat "$TEST_DIR/submit.out" "$TEST_DIR/submit.log"; exit 1; }
cat "$TEST_DIR/submit.out"
# The first line is submit's JSON summary: every review line read and pushed.
pushed=$(head -n 1 "$TEST_DIR/submit.out" | "$PY" -c 'import json,sys
s = json.load(sys.stdin)
assert s["records"] == s["pushed"] == s["accepted"] + s["rejected"] and s["sealed"], s
print(s["pushed"])')
[ "$pushed" = "$(zcat "$cli_reviews" | wc -l)" ]
check e2e-cli "$pushed"
echo "CLI run: $((SECONDS - t0)) s"
"$REFINERY_BIN" status e2e-cli | tee "$TEST_DIR/status.out"
grep -q succeeded "$TEST_DIR/status.out"
"$REFINERY_BIN" classify --run e2e-cli "Works great, easy to install." \
    "Broke after two days, returned it." >"$TEST_DIR/classify.out"
cat "$TEST_DIR/classify.out"
[ "$(grep -c . "$TEST_DIR/classify.out")" -ge 2 ]

# 2. The external Python client.
t0=$SECONDS
("$PY" tests/services/e2e_client.py --proto "$REFINERY_ROOT/proto" \
    --server "$REFINERY_SERVER" --evaluator "$REFINERY_EVALUATOR" --spec "$TEST_DIR/py.yaml" \
    --run-id e2e-py --limit $PY_LIMIT --timeout 600 \
    --classify "Love this shampoo, my hair feels great." \
    --classify "Terrible smell, gave me a rash." --classify "ok" "$py_reviews") \
    >"$TEST_DIR/client.json"
cat "$TEST_DIR/client.json"
"$PY" - "$TEST_DIR/client.json" $PY_LIMIT "$E2E_STEPS" <<'PY'
import json, sys
j, n, steps = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
assert j["state"] == "succeeded", j
assert j["pushed"] == j["received"] == j["accepted"] + j["rejected"] == n, j
assert j["stages"]["ingest"]["docs_in"] == n, j["stages"]
assert j["checkpoint_step"] == j["eval_step"] == steps, j
assert "accuracy" in j["eval"] and "macro_f1" in j["eval"], j["eval"]
c = j["classify"]
assert c["run_id"] == j["run_id"] and c["checkpoint_step"] == steps, c
assert len(c["predictions"]) == 3, c
for p in c["predictions"]:  # a label and probabilities summing to 1
    assert len(p["probs"]) == 2 and abs(sum(p["probs"]) - 1) < 1e-4, p
    assert p["label"] == max(range(2), key=lambda i: p["probs"][i]), p
PY
check e2e-py $PY_LIMIT
echo "Python client run: $((SECONDS - t0)) s"

# 3. Cancel: a run set to train for thousands of steps is cancelled once it
# has a checkpoint; the trainer stops it and keeps its state, the run stays
# cancelled, `refinery watch` reports it with exit status 1.
E2E_STEPS=0 E2E_EPOCHS=200 E2E_CHECKPOINT_EVERY=10 e2e_spec "$TEST_DIR/long.yaml" "$cli_reviews"
"$REFINERY_BIN" submit "$TEST_DIR/long.yaml" --run-id e2e-cancel >/dev/null 2>>"$TEST_DIR/submit.log"
has_checkpoint() { [ "$(sql "SELECT count(*) FROM checkpoints WHERE run_id = 'e2e-cancel'")" -gt 0 ]; }
wait_for "a checkpoint of e2e-cancel" 300 has_checkpoint
"$REFINERY_BIN" cancel e2e-cancel >/dev/null
trainer_stopped() { grep -q 'run e2e-cancel: stopped at step' "$TEST_DIR/trainer.1.log"; }
wait_for "the trainer to stop e2e-cancel" 60 trainer_stopped
grep -o 'run e2e-cancel: stopped at step.*' "$TEST_DIR/trainer.1.log"
run_state_is e2e-cancel cancelled
[ "$(sql "SELECT max(step) FROM checkpoints WHERE run_id = 'e2e-cancel'")" -lt 3400 ]
rc=0
"$REFINERY_BIN" watch e2e-cancel >/dev/null || rc=$?
[ $rc -eq 1 ]

for s in ingest dedup tokenizer trainer evaluator; do svc_stop $s; done
echo "e2e: ok"

#!/usr/bin/env bash
# refinery-trainer as a 2-rank group (scripts/mpirun.sh -np 2; issue 13),
# with the mock Kafka cluster and a real PostgreSQL, on the tiny BERT fixture
# (dropout off) and 40 generated token sequences:
# - run `one`: trained by the service as ONE process; stopped (SIGTERM);
# - run `two`: the same spec (no `parallel`: the group's size is used) and
#   data, trained by the group restarted on the same --state/--checkpoints:
#   the loss at every step and the final export equal run one's within 1e-5
#   relative (tests/trainer/dp_compare.py); only rank 0 opened a port, Kafka
#   and PostgreSQL; rank 1 trained with it;
# - run `three`: rank 1 is kill -9ed after the first saved state; the group
#   ends within a bound, is relaunched, resumes from the last checkpoint and
#   finishes; `four` (same spec and data, uninterrupted): bitwise the same
#   final export; PostgreSQL holds every batch, checkpoint and metric row
#   once (counts and step lists), the announcements name every checkpoint;
# - a spec with parallel.dp 3 fails its run with the reason, the group goes
#   on; SIGTERM to rank 1 stops the whole group, mpirun exits 0;
# - run `five`: rank 1 kill -9ed where nobody ends the survivor (mpirun
#   --enable-recovery, as in pods): rank 0 times out (REFINERY_COMM_TIMEOUT
#   3 s) and exits, the run stays running; the relaunched group finishes it,
#   bitwise equal to run four.
# Skips (77) without mpirun or without MPI in the build.
. "$REFINERY_ROOT/tests/services/lib.sh"
svc=$REFINERY_BUILD/refinery-trainer
tool=$REFINERY_BUILD/tests/services/test_trainer_service
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (install openmpi-bin)"; exit 77; }
ldd "$svc" | grep libmpi >/dev/null || { echo "SKIP: $svc was built without MPI"; exit 77; }
model=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
export REFINERY_COMM_TIMEOUT=60
N=40 BATCH=8
env_start pg kafka
for t in tokens.train checkpoints; do scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 2"; done

# 40 sequences [CLS]=2 ... [SEP]=3 of 3 to 14 ids below the tiny vocabulary
# (100); the label follows one marker id, so there is something to learn.
python3 - "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as fi, open(sys.argv[2], "w") as fl:
    for i in range(40):
        y = i % 2
        ids = [random.randint(10, 99) for _ in range(random.randint(1, 12))]
        ids.insert(random.randint(0, len(ids)), 7 if y else 8)
        fi.write(" ".join(map(str, [2] + ids + [3])) + "\n")
        fl.write("%d\n" % y)
PY

SPEC='trainer:
  max_len: 16
  batch_size: 4
  max_steps: 6
  checkpoint_every: 3
  log_every: 1
  lr: 0.003
  warmup_ratio: 0.1
  dropout: false
  seed: 7'
LONG='trainer:
  max_len: 16
  batch_size: 4
  max_steps: 3000
  checkpoint_every: 300
  lr: 0.001
  dropout: false
  seed: 7'
q() { psql "$REFINERY_PG" -Atqc "$1"; }
run() { q "INSERT INTO runs (id, spec, state) VALUES ('$1', \$s\$$2\$s\$, 'running')"; }
feed() { # ID: its TokenBatches to tokens.train and the tokenizer's rows, then seal
    local nb i
    nb=$("$tool" --produce "$KAFKA_BOOTSTRAP" "$1" "$TEST_DIR/ids.txt" "$TEST_DIR/labels.txt" $BATCH)
    for ((i = 0; i < nb; i++)); do
        q "INSERT INTO stage_progress (run_id, stage, batch_seq, docs_in, docs_out, rejected, duplicate)
           VALUES ('$1', 'tokenizer', $i, $BATCH, $BATCH, 0, 0)"
    done
    q "UPDATE runs SET sealed_at = now() WHERE id = '$1'"
}
wait_for() { # SECONDS DESCRIPTION COMMAND (evaluated each time)
    local s=$1 what=$2 cmd=$3
    for _ in $(seq $((s * 20))); do eval "$cmd" && return 0; sleep 0.05; done
    echo "timed out after $s s waiting for $what" >&2
    return 1
}
args=(--state "$TEST_DIR/state" --checkpoints "$TEST_DIR/ck" --model "$model" --threads 1
      --cancel-poll 0.5)
start_one() { "$svc" "${args[@]}" 2>"$TEST_DIR/$1" & pid=$!; env_track_pid $pid; }
start_group() { # LOG [MPIRUN FLAGS]: mpirun's pid in $pid; each rank's lines are tagged [1,r]
    glog=$TEST_DIR/$1
    shift
    scripts/mpirun.sh "$@" -np 2 --tag-output "$svc" "${args[@]}" 2>"$glog" &
    pid=$!
    env_track_pid $pid
    wait_for 60 "the group to form" 'grep -q "\[1,1\]<stderr>:.*group: rank 1 of 2 (pid" "$glog"'
}
rank_pid() { grep -o "\[1,$2\]<stderr>:.*group: rank $2 of 2 (pid [0-9]*" "$TEST_DIR/$1" | grep -o '[0-9]*$'; }
trained() { test -f "$TEST_DIR/state/$1/trained"; }

# 1. one process
start_one one.log
wait_for 30 "the schema" 'q "SELECT 1 FROM runs LIMIT 0" 2>/dev/null'
run one "$SPEC"
feed one
wait_for 120 "run one trained" 'trained one'
kill -TERM $pid
wait $pid
if grep -q "group: rank" "$TEST_DIR/one.log"; then echo "one process started a group" >&2; exit 1; fi

# 2. the same service as a group of 2 on the same directories
start_group group1.log
run two "$SPEC"
feed two
wait_for 120 "run two trained" 'trained two'
# rank 1 logs its end of the run after rank 0 wrote the marker: wait for it
wait_for 30 "rank 1 to end run two" \
    'grep -q "\[1,1\]<stderr>:.*group: rank 1: run two trained at step 6" "$TEST_DIR/group1.log"'
grep -q "\[1,0\]<stderr>:.*rank 0 of 2 .*zero 0" "$TEST_DIR/group1.log"
# rank 0 alone is the service: its port, Kafka and PostgreSQL
[ "$(grep -c "health on port" "$TEST_DIR/group1.log")" = 1 ]
grep -q "\[1,0\]<stderr>:.*health on port" "$TEST_DIR/group1.log"
for r in one two; do
    mkdir -p "$TEST_DIR/cmp/$r"
    cp "$TEST_DIR/state/$r/train/metrics.jsonl" "$TEST_DIR/cmp/$r/"
    ln -s "$TEST_DIR/ck/$r/step-6" "$TEST_DIR/cmp/$r/model"
done
echo -n "run two (group of 2) vs run one (1 process): "
python3 tests/trainer/dp_compare.py "$TEST_DIR/cmp/one" "$TEST_DIR/cmp/two" 1e-5

# a run whose spec asks for another group size fails with the reason; the
# group goes on (runs three and four below)
run dp3 'trainer: {max_len: 16, batch_size: 4, max_steps: 2, parallel: {dp: 3}}'
feed dp3
wait_for 60 "run dp3 to fail" '[ "$(q "SELECT state FROM runs WHERE id = '"'dp3'"'")" = failed ]'
err=$(q "SELECT error FROM runs WHERE id = 'dp3'")
echo "dp3: failed: $err"
[[ $err == *"trainer.parallel.dp is 3 but the group has 2 rank(s)"* ]]

# 3. kill -9 of rank 1 mid-run: the group ends, the relaunched one resumes
run three "$LONG"
feed three
wait_for 120 "run three's first saved state" 'test -f "$TEST_DIR/state/three/train/checkpoint.bin"'
r1=$(rank_pid group1.log 1)
t0=$(date +%s.%N)
kill -KILL "$r1"
rc=0
wait $pid || rc=$?
t1=$(date +%s.%N)
ended=$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")
echo "rank 1 (pid $r1) killed: the group ended in $ended s (mpirun exit $rc)"
[ $rc -ne 0 ]
awk "BEGIN{exit !($t1 - $t0 < 30)}"
done_before=$(q "SELECT coalesce(max(step), 0) FROM checkpoints WHERE run_id = 'three'")
[ "$done_before" -lt 3000 ] || { echo "run three finished before the kill" >&2; exit 1; }
start_group group2.log
wait_for 300 "run three trained" 'trained three'
resumed=$(grep -o "\[1,0\]<stderr>:.*resumed from .*three/train/checkpoint.bin at step [0-9]*" "$TEST_DIR/group2.log" | grep -o '[0-9]*$')
grep -q "\[1,1\]<stderr>:.*resumed from .*three/train/checkpoint.bin at step $resumed" "$TEST_DIR/group2.log"
echo "run three: checkpoints before the kill up to step $done_before; both ranks resumed at step $resumed"
run four "$LONG"
feed four
wait_for 300 "run four trained" 'trained four'
cmp "$TEST_DIR/ck/three/step-3000/model.safetensors" "$TEST_DIR/ck/four/step-3000/model.safetensors"
echo "run three (rank killed, group relaunched) and four (uninterrupted): identical final model.safetensors"

# nothing lost or duplicated in PostgreSQL
steps=$(seq -s, 300 300 3000)
for r in two three four; do
    row=$(q "SELECT count(*), sum(docs_in), sum(docs_out) FROM stage_progress
             WHERE run_id = '$r' AND stage = 'trainer'")
    [ "$row" = "5|$N|$N" ] || { echo "$r progress: $row" >&2; exit 1; }
done
[ "$(q "SELECT string_agg(step::text, ',' ORDER BY step) FROM checkpoints WHERE run_id = 'two'")" = "3,6" ]
for r in three four; do
    ck=$(q "SELECT string_agg(step::text, ',' ORDER BY step) FROM checkpoints WHERE run_id = '$r'")
    [ "$ck" = "$steps" ] || { echo "$r checkpoints: $ck" >&2; exit 1; }
    m=$(q "SELECT count(*), count(DISTINCT (step, name)) FROM training_metrics WHERE run_id = '$r'")
    [ "$m" = "30|30" ] || { echo "$r metrics: $m" >&2; exit 1; }
done
# every checkpoint announced (at least once: the step redone after the kill
# may be announced twice, which the evaluator ignores); final on the last only
"$tool" --announcements "$KAFKA_BOOTSTRAP" 24 "$TEST_DIR/ann.txt"
ck=$(realpath "$TEST_DIR/ck")
for r in three four; do
    for s in ${steps//,/ }; do
        grep -qx "$r $s $([ $s = 3000 ] && echo 1 || echo 0) $ck/$r/step-$s" "$TEST_DIR/ann.txt"
    done
done

# SIGTERM to rank 1: its stop reaches rank 0 at the next heartbeat, rank 0
# stops and tells rank 1, both exit 0, and so does mpirun (SIGTERM to mpirun
# itself is no clean stop: OpenMPI forwards it and kills the ranks soon after)
kill -TERM "$(rank_pid group2.log 1)"
wait $pid
grep -q "\[1,0\]<stderr>:.*group: a rank is stopping: the group stops" "$TEST_DIR/group2.log"
grep -q "\[1,1\]<stderr>:.*group: rank 1 stops (rank 0 said so)" "$TEST_DIR/group2.log"
echo "SIGTERM to rank 1: the group stopped, exit 0"

# 4. The same kill with nobody to end the survivor (as in pods without
# mpirun: --enable-recovery keeps mpirun from killing rank 0): rank 0's next
# collective times out (REFINERY_COMM_TIMEOUT=3), it exits non-zero and leaves
# the run running (the group failed, not the run); the relaunched group
# resumes it to the same final weights as run four.
REFINERY_COMM_TIMEOUT=3 start_group group3.log --enable-recovery
run five "$LONG"
feed five
wait_for 120 "run five's first saved state" 'test -f "$TEST_DIR/state/five/train/checkpoint.bin"'
t0=$(date +%s.%N)
kill -KILL "$(rank_pid group3.log 1)"
wait $pid || true
t1=$(date +%s.%N)
ended=$(awk "BEGIN{printf \"%.1f\", $t1 - $t0}")
grep -q "\[1,0\]<stderr>:.*run five: the trainer group failed: .*timeout: .*the run resumes when the group restarts" "$TEST_DIR/group3.log"
[ "$(q "SELECT state FROM runs WHERE id = 'five'")" = running ]
awk "BEGIN{exit !($t1 - $t0 < 30)}"
echo "rank 1 killed, no mpirun clean-up: rank 0 timed out and exited in $ended s; run five still running"
start_group group4.log
wait_for 300 "run five trained" 'trained five'
cmp "$TEST_DIR/ck/four/step-3000/model.safetensors" "$TEST_DIR/ck/five/step-3000/model.safetensors"
ck=$(q "SELECT string_agg(step::text, ',' ORDER BY step) FROM checkpoints WHERE run_id = 'five'")
[ "$ck" = "$steps" ] || { echo "five checkpoints: $ck" >&2; exit 1; }
echo "run five: resumed by the relaunched group, identical final model.safetensors to run four"
kill -TERM "$(rank_pid group4.log 1)"
wait $pid
echo "trainer group: ok"

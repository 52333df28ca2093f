# Sourced by the end-to-end scripts (e2e*.test.sh, bad_input.test.sh) after
# lib.sh: the five services as processes on a real PostgreSQL and the mock
# Kafka cluster, each logging to $TEST_DIR/<name>.<n>.log, stopped at exit.
#
#   e2e_env                 # PostgreSQL, Kafka, topics, the spec's files
#   svc_start NAME [ARGS]   # ingest dedup tokenizer trainer evaluator; sets PID[NAME], PORT[NAME]
#   svc_stop NAME           # SIGTERM; fails unless it exits 0 (under ASan: no leak)
#   svc_kill NAME           # SIGKILL
#   wait_for DESC SECONDS CMD...   # polls CMD until it succeeds, fails naming DESC
#   sql "SELECT ..."        # one psql query, unaligned output
#   svc_stats NAME          # the counters its last run logged when it stopped (JSON)
[ -d "$SHARED/data/amazon" ] || {
    echo "SHARED ($SHARED) has no data/amazon: see /work/shared/README.md" >&2
    exit 1
}
E2E_MODEL=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert # 2 layers, 16 positions, 100 words
E2E_STEPS=${E2E_STEPS:-6}
declare -A PID PORT
declare -A _svc_starts

sql() { psql "$REFINERY_PG" -v ON_ERROR_STOP=1 -Atc "$1"; }

wait_for() { # DESC SECONDS CMD...
    local desc=$1 end=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            echo "timed out waiting for $desc" >&2
            return 1
        fi
        sleep 0.2
    done
}

# The run spec both clients submit: the shared Amazon reviews as
# examples/amazon.yaml maps them, a tiny model and a few steps (CI, ASan);
# E2E_STEPS (0: no limit), E2E_EPOCHS and E2E_CHECKPOINT_EVERY change them.
e2e_spec() { # FILE INPUT...
    local f=$1
    shift
    {
        echo "run:"
        echo "  name: e2e"
        echo "  threads: 1"
        echo "ingest:"
        echo "  preset: amazon"
        echo "  inputs:"
        for i in "$@"; do echo "    - $i"; done
        cat <<YAML
dedup:
  ngram: 5
tokenizer:
  tokenizer: $E2E_MODEL/vocab.txt
  max_length: 16
  eval_fraction: 0.1
trainer:
  model: $E2E_MODEL
  num_labels: 2
  epochs: ${E2E_EPOCHS:-1}
  max_steps: $E2E_STEPS
  batch_size: 8
  max_len: 16
  lr: 0.001
  checkpoint_every: ${E2E_CHECKPOINT_EVERY:-$((E2E_STEPS / 2))}
  log_every: 1
evaluator:
  max_len: 16
YAML
    } >"$f"
}

e2e_env() {
    env_start pg kafka
    # Two partitions each; a run's batches share one (key = run id).
    local t
    for t in docs.clean docs.rejected docs.unique docs.duplicates tokens.train tokens.eval \
        checkpoints; do
        scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 2"
    done
    export REFINERY_LOG_FORMAT=text
    VENV=$(scripts/pyenv.sh test)
    PY="$VENV/bin/python"
}

svc_start() { # NAME [EXTRA ARGS]
    local name=$1 n
    shift
    n=$((${_svc_starts[$name]:-0} + 1))
    _svc_starts[$name]=$n
    local args=() port_file=$TEST_DIR/$name.port
    rm -f "$port_file"
    case $name in
    ingest) args=(--listen 127.0.0.1:0 --port-file "$port_file" --batch-docs 64) ;;
    dedup) args=(--index "$TEST_DIR/dedup-index") ;;
    tokenizer)
        args=(--tokenizer "$E2E_MODEL/vocab.txt" --listen 127.0.0.1:0 --port-file "$port_file")
        ;;
    trainer) args=(--state "$TEST_DIR/trainer" --checkpoints "$TEST_DIR/checkpoints" --threads 1) ;;
    evaluator)
        args=(--listen 127.0.0.1:0 --port-file "$port_file" --state "$TEST_DIR/evaluator"
            --threads 1)
        ;;
    esac
    "$REFINERY_BUILD/refinery-$name" "${args[@]}" "$@" 2>"$TEST_DIR/$name.$n.log" &
    PID[$name]=$!
    env_track_pid "${PID[$name]}"
    case $name in
    ingest | tokenizer | evaluator)
        wait_for "refinery-$name to serve" 60 _serving "$port_file" "${PID[$name]}"
        [ -s "$port_file" ] || {
            echo "refinery-$name exited before serving:" >&2
            tail -n 20 "$TEST_DIR/$name.$n.log" >&2
            return 1
        }
        PORT[$name]=$(cat "$port_file")
        ;;
    esac
}

_serving() { test -s "$1" || ! kill -0 "$2"; } # PORT_FILE PID: serving, or dead

svc_stop() { # NAME: SIGTERM, and the exit status must be 0
    local name=$1 rc=0
    kill -TERM "${PID[$name]}"
    wait "${PID[$name]}" || rc=$?
    if [ $rc -ne 0 ]; then
        echo "refinery-$name exited $rc after SIGTERM" >&2
        tail -n 40 "$TEST_DIR/$name.${_svc_starts[$name]}.log" >&2
        return 1
    fi
}

svc_kill() { # NAME
    kill -KILL "${PID[$1]}"
    wait "${PID[$1]}" 2>/dev/null || true
}

# Stage totals of a run: batches|in|out|rejected|duplicate.
progress() { # RUN STAGE
    sql "SELECT count(*), coalesce(sum(docs_in), 0), coalesce(sum(docs_out), 0),
        coalesce(sum(rejected), 0), coalesce(sum(duplicate), 0)
        FROM stage_progress WHERE run_id = '$1' AND stage = '$2'"
}
batches_at_least() { # RUN STAGE N
    [ "$(progress "$1" "$2" | cut -d'|' -f1)" -ge "$3" ]
}
run_state_is() { # RUN STATE
    [ "$(sql "SELECT state FROM runs WHERE id = '$1'")" = "$2" ]
}

svc_stats() { # NAME: the counters logged at the last stop, as JSON
    sed -n 's/.* stopped: //p' "$TEST_DIR/$1.${_svc_starts[$1]}.log" | tail -n 1
}

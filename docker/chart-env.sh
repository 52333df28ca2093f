#!/usr/bin/env bash
# Usage: docker/chart-env.sh    (after `make` and `make images`; not part of make test)
# Runs the five service images under podman with exactly the environment and volume
# mounts the chart renders for them (helm template; PostgreSQL and the mock Kafka of
# tests/services/lib.sh stand in for the Secret's DSN and kafka.bootstrap; the tiny
# BERT fixture is the models volume): read-only root filesystem, UID 10001, the host
# network. Passes when all five answer grpc.health.v1 Check with SERVING on the chart's
# ports (0.0.0.0:7101-7105; dedup and the trainer serve health only), serve /metrics
# (on the chart's metrics port + 11..15: one host network here), and all exit 0 on
# SIGTERM. Ports 7101-7105 and 9111-9115 must be free on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
export REFINERY_ROOT=$PWD
export KAFKA_MOCK_BIN=$PWD/build/refinery-kafka-mock
PODMAN=${PODMAN:-podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc}
VERSION=${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/refinery/Chart.yaml)}
[ -x "$KAFKA_MOCK_BIN" ] || { echo "SKIP: run make first"; exit 77; }
helm=$(scripts/fetch-helm.sh)
venv=$(scripts/pyenv.sh deploy)
py_test=$(scripts/pyenv.sh test)/bin/python
. tests/services/lib.sh
chmod 1777 "$TEST_DIR"
env_start pg kafka
for t in docs.clean docs.rejected docs.unique docs.duplicates tokens.train tokens.eval checkpoints; do
    scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 2"
done
model=$REFINERY_ROOT/tests/fixtures/trainer/tiny-bert
printf 'kafka:\n  bootstrap: "%s"\ntokenizer:\n  tokenizerPath: /models/vocab.txt\ntrainer:\n  modelPath: /models\n' \
    "$KAFKA_BOOTSTRAP" >"$TEST_DIR/values.yaml"
"$helm" template rf charts/refinery -f "$TEST_DIR/values.yaml" >"$TEST_DIR/render.yaml"
mkdir -p "$TEST_DIR/args" "$TEST_DIR/vol"
"$venv/bin/python" docker/chart_env.py "$TEST_DIR/render.yaml" "$TEST_DIR/args" "$TEST_DIR/vol" "$model" "$REFINERY_PG"

declare -A PIDS
for s in ingest dedup tokenizer trainer evaluator; do
    mapfile -t args <"$TEST_DIR/args/$s.args"
    $PODMAN run --rm --label refinery-chart-env=$$ --network host --read-only \
        --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "${args[@]}" \
        "localhost/refinery-$s:$VERSION" 2>"$TEST_DIR/$s.log" &
    PIDS[$s]=$!
    env_track_pid "${PIDS[$s]}"
done

serving() { # PORT
    "$py_test" - "$1" <<'PY'
import grpc, sys
ch = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}")
check = ch.unary_unary("/grpc.health.v1.Health/Check",
                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
sys.exit(0 if check(b"", timeout=2) == b"\x08\x01" else 1)
PY
}
fail=0
declare -A port=([ingest]=7101 [dedup]=7102 [tokenizer]=7103 [trainer]=7104 [evaluator]=7105)
for s in ingest tokenizer evaluator dedup trainer; do
    ok=0
    for _ in $(seq 1 60); do serving "${port[$s]}" 2>/dev/null && { ok=1; break; }; sleep 0.25; done
    if [ $ok = 1 ]; then
        echo "PASS $s: SERVING on 0.0.0.0:${port[$s]} (grpc.health.v1)"
    else
        echo "FAIL $s: not serving on ${port[$s]}"; tail -n 5 "$TEST_DIR/$s.log"; fail=1
    fi
done
# /metrics: the chart's metrics port (+11..15 here, see chart_env.py) answers in the
# Prometheus text format with the service's families.
mbase=$(sed -n 's/^  port: \([0-9]*\)$/\1/p' <(sed -n '/^metrics:/,/^[a-z]/p' charts/refinery/values.yaml) | head -n 1)
i=10
for s in ingest dedup tokenizer trainer evaluator; do
    i=$((i + 1))
    if curl -sf "http://127.0.0.1:$((mbase + i))/metrics" | grep -q '^# TYPE refinery_'; then
        echo "PASS $s: /metrics on 0.0.0.0:$((mbase + i)) (chart port $mbase + $i)"
    else
        echo "FAIL $s: no Prometheus metrics on $((mbase + i))"; fail=1
    fi
done
for id in $($PODMAN ps -q --filter "label=refinery-chart-env=$$"); do
    $PODMAN top "$id" huser args | tail -n +2
done
for s in ingest dedup tokenizer trainer evaluator; do
    kill -TERM "${PIDS[$s]}"
    rc=0; wait "${PIDS[$s]}" || rc=$?
    [ $rc = 0 ] || { echo "FAIL $s exited $rc after SIGTERM"; tail -n 5 "$TEST_DIR/$s.log"; fail=1; }
done
[ $fail = 0 ] && echo "chart env: ok"
exit $fail

#!/usr/bin/env bash
# Usage: docker/e2e.sh    (after `make` and `make images`; not part of make test)
# The end-to-end run of tests/services/e2e.test.sh (its first part: `refinery submit
# --watch` of the Appliances reviews, then e2e_check.py's accounting from the topics
# and PostgreSQL: kept + rejected + duplicate = pushed, by id and per stage, token
# batches at trainer and evaluator, checkpoints to the last step, metrics, state
# succeeded; then status and classify) with the five services running from the
# images under podman instead of build/: read-only root filesystem, UID 10001, the
# host network (PostgreSQL and the mock Kafka cluster run as in e2e.test.sh), or with
# E2E_NETWORK="--pod NAME" in a podman pod (tests/deploy/containers.test.sh runs this
# script inside the pod's network namespace, so PostgreSQL and the mock join it). While
# they run, every process of every container must be non-root (podman top).
# Before the services start, the image's `refinery-ingest --migrate-only` (the chart's
# migration hook) migrates the empty database, twice (the second run changes nothing).
# Every service must then exit 0 on SIGTERM (forwarded by podman run).
set -euo pipefail
cd "$(dirname "$0")/.."
export REFINERY_ROOT=$PWD
export SHARED=${SHARED:-$(cd .. && pwd)/shared}
export REFINERY_BIN=$PWD/build/refinery
PODMAN=${PODMAN:-podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc}
E2E_NETWORK=${E2E_NETWORK:---network host}
VERSION=${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/refinery/Chart.yaml)}
export KAFKA_MOCK_BIN=$PWD/build/refinery-kafka-mock
[ -x "$REFINERY_BIN" ] && [ -x "$KAFKA_MOCK_BIN" ] || { echo "SKIP: run make first"; exit 77; }
for s in ingest dedup tokenizer trainer evaluator; do
    $PODMAN image exists "localhost/refinery-$s:$VERSION" || { echo "SKIP: no image refinery-$s:$VERSION (make images)"; exit 77; }
done

. tests/services/lib.sh
chmod 1777 "$TEST_DIR" # the services run as UID 10001 and write their state here
# e2e_lib's svc_start runs $REFINERY_BUILD/refinery-<name>: point it at wrappers that
# run the image with the same arguments and environment.
export REFINERY_BUILD=$TEST_DIR/bin
mkdir -p "$REFINERY_BUILD"
for s in ingest dedup tokenizer trainer evaluator; do
    cat >"$REFINERY_BUILD/refinery-$s" <<SH
#!/usr/bin/env bash
envs=()
for v in \$(env | grep -oE '^(REFINERY|KAFKA)_[A-Z0-9_]+'); do envs+=(-e "\$v"); done
exec $PODMAN run --rm --label refinery-e2e=$$ $E2E_NETWORK --read-only \\
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \\
    -v "$REFINERY_ROOT/tests/fixtures:$REFINERY_ROOT/tests/fixtures:ro" -v "$TEST_DIR:$TEST_DIR" \\
    "\${envs[@]}" localhost/refinery-$s:$VERSION "\$@"
SH
    chmod +x "$REFINERY_BUILD/refinery-$s"
done
. tests/services/e2e_lib.sh
reviews=$SHARED/data/amazon/Appliances_5.json.gz
e2e_env
e2e_spec "$TEST_DIR/cli.yaml" "$reviews"
# The chart's pre-install hook first: the ingest image with --migrate-only migrates the
# empty database (and a second run is a no-op), before any service starts.
for i in 1 2; do
    "$REFINERY_BUILD/refinery-ingest" --migrate-only 2>"$TEST_DIR/migrate$i.log" ||
        { cat "$TEST_DIR/migrate$i.log"; exit 1; }
    grep -o 'schema version [0-9]*' "$TEST_DIR/migrate$i.log"
done
[ "$(sql 'select count(*) from schema_migrations')" = "$(ls services/runtime/store/migrations/*.sql | wc -l)" ]
for s in ingest dedup tokenizer trainer evaluator; do svc_start $s; done
export REFINERY_SERVER=127.0.0.1:${PORT[ingest]} REFINERY_EVALUATOR=127.0.0.1:${PORT[evaluator]}

# Every process in the five containers runs as a non-root user.
ids=$($PODMAN ps -q --filter "label=refinery-e2e=$$")
[ "$(echo "$ids" | wc -w)" -eq 5 ] || { echo "expected 5 containers, got: $ids"; exit 1; }
if [[ $E2E_NETWORK == --pod\ * ]]; then # all five in the one pod, sharing its network namespace
    pods=$($PODMAN ps --pod --filter "label=refinery-e2e=$$" --format '{{.PodName}}' | sort -u)
    [ "$pods" = "${E2E_NETWORK#--pod }" ] || { echo "containers outside pod ${E2E_NETWORK#--pod }: $pods"; exit 1; }
    echo "five service containers in pod $pods"
fi
for id in $ids; do
    $PODMAN top "$id" huser user args | tail -n +2
    $PODMAN top "$id" huser | tail -n +2 | while read -r u; do
        [ "$u" != 0 ] && [ "$u" != root ] || { echo "container $id runs a process as root"; exit 1; }
    done
done

t0=$SECONDS
"$REFINERY_BIN" submit "$TEST_DIR/cli.yaml" --run-id e2e-containers --watch >"$TEST_DIR/submit.out" \
    2>"$TEST_DIR/submit.log" || { cat "$TEST_DIR/submit.out" "$TEST_DIR/submit.log"; exit 1; }
cat "$TEST_DIR/submit.out"
pushed=$(head -n 1 "$TEST_DIR/submit.out" | "$PY" -c 'import json,sys
s = json.load(sys.stdin)
assert s["records"] == s["pushed"] == s["accepted"] + s["rejected"] and s["sealed"], s
print(s["pushed"])')
[ "$pushed" = "$(zcat "$reviews" | wc -l)" ]
"$PY" tests/services/e2e_check.py --proto "$REFINERY_ROOT/proto" --kafka "$KAFKA_BOOTSTRAP" \
    --pg "$REFINERY_PG" --run e2e-containers --pushed "$pushed" --steps "$E2E_STEPS"
echo "run through the containers: $((SECONDS - t0)) s"
"$REFINERY_BIN" status e2e-containers | tee "$TEST_DIR/status.out"
grep -q succeeded "$TEST_DIR/status.out"
"$REFINERY_BIN" classify --run e2e-containers "Works great, easy to install." \
    "Broke after two days, returned it." | tee "$TEST_DIR/classify.out"
[ "$(grep -c . "$TEST_DIR/classify.out")" -ge 2 ]
for s in ingest dedup tokenizer trainer evaluator; do svc_stop $s; done
echo "containers e2e: ok"

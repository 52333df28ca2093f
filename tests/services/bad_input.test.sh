#!/usr/bin/env bash
# Bad input over the wire, for every service, with the five services running
# as processes on a real PostgreSQL and the mock Kafka cluster:
#   - gRPC (bad_input.py, a grpcio client from proto/): oversized messages,
#     invalid protobuf, text that is not UTF-8, unknown run ids, requests the
#     run's state forbids get their status codes on Control, Ingest,
#     Tokenizer and Evaluator, and each server's stats count them;
#   - Kafka (kafka_poison.py): every consumed topic gets bytes that are no
#     protobuf and a batch cut short, the document topics a document that is
#     not UTF-8, every topic a well-formed batch of a run that does not
#     exist, `checkpoints` an announcement of such a run; the consumers skip
#     and count them (a poison message must not stop a consumer for good).
# Then every service is still running, a real run still goes through
# end to end (e2e_client.py, checked by e2e_check.py), and every service
# exits 0 on SIGTERM.
. "$REFINERY_ROOT/tests/services/lib.sh"
. "$REFINERY_ROOT/tests/services/e2e_lib.sh"
MAX=65536
E2E_STEPS=2
reviews=$SHARED/data/amazon/Appliances_5.json.gz
e2e_env
e2e_spec "$TEST_DIR/spec.yaml" "$reviews"
svc_start ingest --max-message $MAX
svc_start dedup
svc_start tokenizer --max-message $MAX
svc_start trainer
svc_start evaluator --max-message $MAX
"$PY" tests/services/bad_input.py --proto proto --ingest 127.0.0.1:${PORT[ingest]} \
    --tokenizer 127.0.0.1:${PORT[tokenizer]} --evaluator 127.0.0.1:${PORT[evaluator]} \
    --spec "$TEST_DIR/spec.yaml" --max-message $MAX >"$TEST_DIR/expected.json"
echo "gRPC bad input, calls per server and status: $(cat "$TEST_DIR/expected.json")"
"$PY" tests/services/kafka_poison.py --proto proto --kafka "$KAFKA_BOOTSTRAP" --run bad-open \
    --unknown-run >"$TEST_DIR/poison.json"
echo "Kafka poison messages per topic: $(cat "$TEST_DIR/poison.json")"

# Still working: a small run of real reviews goes through every stage.
"$PY" tests/services/e2e_client.py --proto proto --server 127.0.0.1:${PORT[ingest]} \
    --evaluator 127.0.0.1:${PORT[evaluator]} --spec "$TEST_DIR/spec.yaml" --run-id bad-after \
    --limit 400 --timeout 300 --classify "works fine" "$reviews" >"$TEST_DIR/after.json"
"$PY" tests/services/e2e_check.py --proto proto --kafka "$KAFKA_BOOTSTRAP" \
    --pg "$REFINERY_PG" --run bad-after --pushed 400 --steps $E2E_STEPS
for s in ingest dedup tokenizer trainer evaluator; do
    kill -0 "${PID[$s]}" || { echo "refinery-$s died" >&2; exit 1; }
done
for s in ingest dedup tokenizer trainer evaluator; do svc_stop $s; done

# The servers counted every refused call, the consumers every bad message.
for s in ingest dedup tokenizer trainer evaluator; do svc_stats $s >"$TEST_DIR/$s.stats"; done
"$PY" - "$TEST_DIR" <<'PY'
import json, sys
d = sys.argv[1]
stats = {s: json.load(open(f"{d}/{s}.stats")) for s in
         ("ingest", "dedup", "tokenizer", "trainer", "evaluator")}
for server, calls in json.load(open(f"{d}/expected.json")).items():
    for name, n in calls.items():
        node = stats[server].get("rpc", {})
        for part in name.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        got = node if isinstance(node, int) else 0
        assert got >= n, f"{server}: rpc.{name} = {got}, expected at least {n}: {stats[server]}"
# Two undecodable messages (no protobuf, cut short) per consumed topic, one
# on checkpoints.
for stage in ("dedup", "tokenizer", "trainer", "evaluator"):
    bad = stats[stage].get(stage, {}).get("bad_messages", 0)
    assert bad >= 2, f"{stage}: bad_messages = {bad}: {stats[stage]}"
# A batch of a run that does not exist, on every consumed topic.
for stage in ("dedup", "tokenizer", "trainer", "evaluator"):
    unknown = stats[stage].get(stage, {}).get("unknown_run", 0)
    assert unknown >= 1, f"{stage}: unknown_run = {unknown}: {stats[stage]}"
# A DocumentBatch whose text is not UTF-8 is refused as a batch (proto3).
for stage in ("dedup", "tokenizer"):
    bad = stats[stage].get(stage, {}).get("bad_batches", 0)
    assert bad >= 1, f"{stage}: bad_batches = {bad}: {stats[stage]}"
bad = stats["evaluator"]["evaluator"].get("checkpoints", {}).get("bad", 0)
assert bad >= 1, f"evaluator: checkpoints.bad = {bad}: {stats['evaluator']}"
print("bad input: every refusal counted; consumers counted the bad messages")
PY
echo "bad input: ok"

#!/usr/bin/env bash
# GET /metrics of running services, parsed by prometheus_client's text parser
# (tests/services/metrics_scrape.py): refinery-ingest (with Control; real
# PostgreSQL, mock Kafka) and refinery-dedup consuming what ingest produced.
# `refinery submit` (Control Submit, Ingest PushLists, Control Seal) and status
# calls, one of them NOT_FOUND, must show up as gRPC counters by service,
# method and code with latency histograms; documents in/out/rejected by
# reason in both services; dedup's batch latency and Kafka consumer lag; the
# process gauges. A second scrape after more calls must show the counters
# grown. Also: HELP/TYPE for every family, 404 on another path, an explicit
# busy --metrics-listen address fails the start; PostgreSQL stopped: the
# status call's failed query is counted; and `refinery run
# --metrics-port` (embedded, all five stages with MiniLM-L6) agrees with the
# run's stats.json and trainer/metrics.jsonl.
. "$REFINERY_ROOT/tests/services/lib.sh"
venv=$(scripts/pyenv.sh test)
"$venv/bin/python" -c 'import prometheus_client' ||
    { echo "prometheus_client missing from $venv (scripts/deps/py-test.txt)" >&2; exit 1; }
env_start pg kafka
bin=$REFINERY_BIN
scrape() { "$venv/bin/python" tests/services/metrics_scrape.py "$@"; }
# The port a service logged for /metrics: metrics_port LOG
metrics_port() {
    local p=""
    for _ in $(seq 150); do
        p=$(sed -n 's/.*serving \/metrics on [^"]*:\([0-9][0-9]*\)".*/\1/p' "$1" | head -1)
        [ -n "$p" ] && break
        sleep 0.1
    done
    [ -n "$p" ] || { echo "no metrics port in $1" >&2; cat "$1" >&2; return 1; }
    echo "$p"
}

"$REFINERY_BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ingest.port" \
    --metrics-listen 127.0.0.1:0 --kafka "$KAFKA_BOOTSTRAP" --pg "$REFINERY_PG" \
    2>"$TEST_DIR/ingest.log" &
env_track_pid $!
for _ in $(seq 150); do [ -s "$TEST_DIR/ingest.port" ] && break; sleep 0.1; done
[ -s "$TEST_DIR/ingest.port" ] || { echo "refinery-ingest did not start" >&2; exit 1; }
export REFINERY_SERVER=127.0.0.1:$(cat "$TEST_DIR/ingest.port")
iport=$(metrics_port "$TEST_DIR/ingest.log")

REFINERY_DEDUP_INDEX=$TEST_DIR/index REFINERY_MAX_MESSAGES=1 "$REFINERY_BUILD/refinery-dedup" \
    --metrics-listen 127.0.0.1:0 --kafka "$KAFKA_BOOTSTRAP" --pg "$REFINERY_PG" \
    2>"$TEST_DIR/dedup.log" &
env_track_pid $!
dport=$(metrics_port "$TEST_DIR/dedup.log")

scrape "127.0.0.1:$iport" >"$TEST_DIR/ingest0.json"

# Five records: three good (two of them the same text), one that cleans to
# nothing (the server rejects it), one the client refuses (not JSON).
docs=$TEST_DIR/docs.jsonl
cat >"$docs" <<'EOF'
{"text": "The first document is about gardening and tomatoes in the summer.", "label": 1}
{"text": "The first document is about gardening and tomatoes in the summer.", "label": 1}
{"text": "   ", "label": 1}
not json at all
{"text": "A second one talks about rain in the mountains and the cold.", "label": 0}
EOF
cat >"$TEST_DIR/spec.yaml" <<EOF
run:
  name: metrics
ingest:
  format: jsonl
  inputs: [$docs]
  text_fields: text
  label_field: label
dedup:
  threshold: 0.8
EOF
"$bin" submit "$TEST_DIR/spec.yaml" --run-id m-1 >"$TEST_DIR/submit.out" 2>"$TEST_DIR/submit.err" ||
    { cat "$TEST_DIR/submit.err" >&2; exit 1; }
"$bin" status m-1 >/dev/null
"$bin" status no-such-run >/dev/null 2>&1 && { echo "status of an unknown run succeeded" >&2; exit 1; }

# dedup takes the batch from docs.clean (three documents, one duplicate).
for _ in $(seq 300); do
    scrape "127.0.0.1:$dport" >"$TEST_DIR/dedup.json"
    grep -q '"refinery_documents_in_total{stage=dedup}": 3' "$TEST_DIR/dedup.json" && break
    sleep 0.2
done
scrape "127.0.0.1:$iport" >"$TEST_DIR/ingest1.json"
"$bin" status m-1 >/dev/null
"$bin" status m-1 >/dev/null
scrape "127.0.0.1:$iport" >"$TEST_DIR/ingest2.json"

"$venv/bin/python" - "$TEST_DIR" <<'EOF'
import json, sys
d = sys.argv[1]
load = lambda n: json.load(open(f"{d}/{n}.json"))
i0, i1, i2, dd = load("ingest0"), load("ingest1"), load("ingest2"), load("dedup")
fails = []
def check(cond, what):
    if not cond:
        fails.append(what)
def val(m, k, default=None):
    return m["samples"].get(k, default)
ctl = "grpc_service=refinery.v1.Control"
hk = lambda meth, code: (f"refinery_grpc_server_handled_total{{grpc_code={code},"
                         f"grpc_method={meth},{ctl}}}")
# gRPC: Control methods by status code, with latency histograms
check(val(i1, hk("Submit", "OK")) == 1, "one Control.Submit OK")
check(val(i1, hk("Seal", "OK")) == 1, "one Control.Seal OK")
check(val(i1, hk("Get", "NOT_FOUND"), 0) >= 1, "Control.Get NOT_FOUND counted")
check(val(i1, hk("Get", "OK"), 0) >= 1, "Control.Get OK counted")
push = ("refinery_grpc_server_handled_total{grpc_code=OK,grpc_method=PushLists,"
        "grpc_service=refinery.v1.Ingest}")
check(val(i1, push) == 1, "one Ingest.PushLists OK")
cnt = f"refinery_grpc_server_handling_seconds_count{{grpc_method=Get,{ctl}}}"
inf = f"refinery_grpc_server_handling_seconds_bucket{{grpc_method=Get,{ctl},le=+Inf}}"
check(val(i1, cnt, 0) >= 2 and val(i1, inf) == val(i1, cnt), "Get latency histogram")
check(i1["types"].get("refinery_grpc_server_handling_seconds") == "histogram", "histogram type")
check(i1["types"].get("refinery_grpc_server_handled") == "counter", "counter type")
# ...and they grow: two more status calls, two more Get OK
check(val(i2, hk("Get", "OK")) == val(i1, hk("Get", "OK")) + 2, "Get OK grew by 2")
check(val(i2, cnt) == val(i1, cnt) + 2, "Get latency count grew by 2")
check(val(i0, hk("Get", "OK"), 0) == 0, "nothing counted before the calls")
# documents: ingest in/out/rejected by reason
check(val(i1, "refinery_documents_in_total{stage=ingest}") == 4, "ingest received 4")
check(val(i1, "refinery_documents_out_total{stage=ingest}") == 3, "ingest kept 3")
rej = [k for k in i1["samples"] if k.startswith("refinery_documents_rejected_total{reason=")
       and "stage=ingest" in k]
check(len(rej) == 1 and i1["samples"][rej[0]] == 1, f"one ingest reject with its reason: {rej}")
# dedup: in/out/duplicate, batch latency, Kafka lag of its input
check(val(dd, "refinery_documents_in_total{stage=dedup}") == 3, "dedup took 3")
check(val(dd, "refinery_documents_out_total{stage=dedup}") == 2, "dedup kept 2")
check(val(dd, "refinery_documents_rejected_total{reason=duplicate,stage=dedup}") == 1,
      "dedup dropped 1 duplicate")
check(val(dd, "refinery_batch_duration_seconds_count{stage=dedup}", 0) >= 1, "dedup batch latency")
lag = [k for k in dd["samples"] if k.startswith("refinery_kafka_consumer_lag_messages{")
       and "topic=docs.clean" in k]
check(lag and all(dd["samples"][k] == 0 for k in lag), f"dedup caught up on docs.clean: {lag}")
# process gauges, service info, and HELP text on every family
for m, svc in ((i1, "ingest"), (dd, "dedup")):
    check(val(m, "process_resident_memory_bytes{}", 0) > 1e6, f"{svc} RSS")
    check(val(m, f"refinery_service_info{{service={svc}}}") == 1, f"{svc} info")
    check(all(h for h in m["help"].values()), f"{svc}: every family has HELP")
    check(all(n.startswith(("refinery_", "process_")) for n in m["types"]), f"{svc}: names")
if fails:
    sys.exit("FAILED: " + "; ".join(fails))
print(f"ok: {len(i2['samples'])} ingest samples, {len(dd['samples'])} dedup samples")
EOF

# another path: 404
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$iport/")
[ "$code" = 404 ] || { echo "GET / gave $code" >&2; exit 1; }
# an explicit busy address fails the start, naming it
rc=0
REFINERY_DEDUP_INDEX=$TEST_DIR/index2 timeout 20 "$REFINERY_BUILD/refinery-dedup" \
    --metrics-listen "127.0.0.1:$dport" --kafka "$KAFKA_BOOTSTRAP" --pg "$REFINERY_PG" \
    2>"$TEST_DIR/busy.log" || rc=$?
[ $rc = 1 ] && grep -q "cannot listen on 127.0.0.1:$dport" "$TEST_DIR/busy.log" ||
    { echo "busy metrics address: exit $rc" >&2; cat "$TEST_DIR/busy.log" >&2; exit 1; }
# PostgreSQL errors: with the server gone, a status call's query fails.
before=$("$venv/bin/python" -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["samples"]["refinery_postgres_errors_total{kind=query}"]))' "$TEST_DIR/ingest2.json")
[ "$before" = 0 ] || { echo "PostgreSQL errors before any failure: $before" >&2; exit 1; }
scripts/test-env/pg.sh stop "$TEST_DIR" >/dev/null
timeout 5 "$bin" status m-1 >/dev/null 2>&1 || true
n=0
for _ in $(seq 100); do
    scrape "127.0.0.1:$iport" >"$TEST_DIR/ingest3.json"
    n=$("$venv/bin/python" -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["samples"]["refinery_postgres_errors_total{kind=query}"]))' "$TEST_DIR/ingest3.json")
    [ "$n" -ge 1 ] && break
    sleep 0.1
done
[ "$n" -ge 1 ] || { echo "no PostgreSQL query error counted with the server down" >&2; exit 1; }
echo "PostgreSQL down: $n query errors counted"

# Embedded mode: refinery run --metrics-port serves the same families; the
# scrape after the run (--metrics-linger) must agree with stats.json and the
# trainer's metrics.jsonl.
model=$REFINERY_ROOT/build/models/minilm-l6
scripts/fetch-minilm.sh "$model" >/dev/null ||
    { echo "cannot fetch MiniLM-L6 into $model (scripts/fetch-minilm.sh)" >&2; exit 1; }
cat >"$TEST_DIR/run.yaml" <<EOF
run:
  name: metrics-embedded
  threads: 2
ingest:
  preset: amazon
  inputs: [$SHARED/data/amazon/Appliances_5.json.gz]
dedup:
  ngram: 5
tokenizer:
  tokenizer: $SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
  max_length: 64
  eval_fraction: 0.2
trainer:
  model: $model
  num_labels: 2
  max_len: 32
  max_steps: 3
  batch_size: 8
evaluator:
  max_len: 32
EOF
REFINERY_PEAK_FLOPS=1e12 "$bin" run "$TEST_DIR/run.yaml" --out "$TEST_DIR/run" --no-progress \
    --metrics-port 0 --metrics-linger 120 >"$TEST_DIR/run.out" 2>"$TEST_DIR/run.log" &
runpid=$!
env_track_pid $runpid
for _ in $(seq 1200); do grep -q "run complete" "$TEST_DIR/run.out" && break; sleep 0.1; done
grep -q "run complete" "$TEST_DIR/run.out" || { tail "$TEST_DIR/run.log" >&2; exit 1; }
scrape "127.0.0.1:$(metrics_port "$TEST_DIR/run.log")" >"$TEST_DIR/embedded.json"
kill -TERM $runpid
wait $runpid
"$venv/bin/python" - "$TEST_DIR" <<'EOF'
import json, sys
d = sys.argv[1]
m = json.load(open(f"{d}/embedded.json"))["samples"]
st = json.load(open(f"{d}/run/stats.json"))
last = json.loads(open(f"{d}/run/trainer/metrics.jsonl").read().splitlines()[-1])
fails = []
def near(a, b, what, tol=1e-5):
    if a is None or abs(a - b) > tol * max(1, abs(b)):
        fails.append(f"{what}: /metrics {a} vs {b}")
near(m.get("refinery_documents_in_total{stage=ingest}"), st["ingest"]["records_in"], "ingest in")
near(m.get("refinery_documents_out_total{stage=ingest}"), st["ingest"]["docs_out"], "ingest out")
near(m.get("refinery_documents_in_total{stage=dedup}"), st["dedup"]["docs_in"], "dedup in")
near(m.get("refinery_documents_out_total{stage=dedup}"), st["dedup"]["docs_out"], "dedup out")
near(m.get("refinery_documents_rejected_total{reason=duplicate,stage=dedup}"),
     st["dedup"]["exact"] + st["dedup"]["near"], "dedup duplicates")
near(m.get("refinery_trainer_steps_total{}"), st["trainer"]["steps"], "trainer steps")
near(m.get("refinery_trainer_loss{}"), last["loss"], "last loss")
near(m.get("refinery_trainer_learning_rate{}"), last["lr"], "last lr")
near(m.get("refinery_trainer_grad_norm{}"), last["grad_norm"], "last grad norm")
near(m.get("refinery_evaluator_last_accuracy{}"), st["evaluator"]["accuracy"], "accuracy")
flops, mfu = m.get("refinery_trainer_model_flops{}", 0), m.get("refinery_trainer_mfu_ratio{}")
near(mfu, flops / 1e12, "MFU against REFINERY_PEAK_FLOPS")
if not flops > 0:
    fails.append("no model FLOP/s")
if not m.get("refinery_batch_duration_seconds_count{stage=tokenizer}", 0) > 0:
    fails.append("no tokenizer batch latency")
if not m.get("refinery_trainer_parameter_memory_bytes{}", 0) > 4 * 22e6 * 4:
    fails.append("trainer parameter memory below 4 x 22M floats")
if fails:
    sys.exit("embedded: " + "; ".join(fails))
print(f"embedded ok: MFU {mfu:.2e} at an assumed peak of 1e12 FLOP/s")
EOF
echo "PASS"

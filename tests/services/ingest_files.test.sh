#!/usr/bin/env bash
# The ingest service's file source (Ingest.Load, `refinery submit
# --server-inputs`), with the five services on a real PostgreSQL and the mock
# Kafka cluster. The input root holds copies of the shared Amazon reviews
# (Appliances and the first 2,500 of All_Beauty: 4,777 records), read in
# batches of 16 at a limited rate (--load-rate) so that a load can be
# interrupted mid-way:
#   a. an uninterrupted load: the run succeeds, e2e_check.py accounts for
#      every record in the topics and PostgreSQL, and the ingest counts equal
#      what `refinery run` counts on the same files with the same spec;
#   b. the same spec again, refinery-ingest stopped with SIGTERM mid-load
#      (exit 0), restarted (the load resumes), SIGKILLed mid-load,
#      restarted: the run succeeds with the same ingest and dedup totals,
#      batch for batch, as the uninterrupted run, each seq recorded once;
#   c. bad Load requests (an absolute path, ../, a symlink out of the root,
#      a missing file, a directory, an unknown run, an empty id, a run that
#      has ended) get their status codes naming the problem, and the service
#      keeps serving;
#   d. a corrupt gzip input fails its run with the reason;
#   e. a run cancelled mid-load stops its loader, unsealed.
. "$REFINERY_ROOT/tests/services/lib.sh"
. "$REFINERY_ROOT/tests/services/e2e_lib.sh"
amazon=$SHARED/data/amazon
root=$TEST_DIR/root
mkdir -p "$root/amazon" "$root/bad"
cp "$amazon/Appliances_5.json.gz" "$root/amazon/"
zcat "$amazon/All_Beauty_5.json.gz" | sed -n 1,2500p | gzip >"$root/amazon/All_Beauty_2500.json.gz"
# A gzip stream that turns to garbage after its first 40 kB.
{ head -c 40000 "$amazon/All_Beauty_5.json.gz"; head -c 4000 /dev/zero | tr '\0' 'x'; } \
    >"$root/bad/corrupt.json.gz"
ln -s /etc "$root/etc" # a way out of the root that only realpath sees
inputs=(amazon/All_Beauty_2500.json.gz amazon/Appliances_5.json.gz)
e2e_env
# The mock cluster keeps only the last 5 MB of a partition, and a run's
# batches share one: compressed, every run here stays well under that even
# while the consumers are still joining their groups.
export KAFKA_PROPERTIES=compression.type=lz4

files_spec() { # FILE INPUT...: e2e's spec, batches of 16 records
    e2e_spec "$@"
    sed -i 's/^  preset: amazon$/  preset: amazon\n  batch_docs: 16/' "$1"
}
files_spec "$TEST_DIR/spec.yaml" "${inputs[@]}"
grep -q 'batch_docs: 16' "$TEST_DIR/spec.yaml"

# The reference: `refinery run` on the same files with the same ingest section.
{
    echo "run:"
    echo "  name: reference"
    echo "  threads: 1"
    sed -n '/^ingest:/,/^dedup:/p' "$TEST_DIR/spec.yaml" | sed '$d' |
        sed "s|^    - amazon/|    - $root/amazon/|"
} >"$TEST_DIR/reference.yaml"
"$REFINERY_BIN" run "$TEST_DIR/reference.yaml" --out "$TEST_DIR/reference" \
    >"$TEST_DIR/reference.log" 2>&1 || { cat "$TEST_DIR/reference.log"; exit 1; }
read -r ref_in ref_kept ref_rejected < <("$PY" -c 'import json, sys
s = json.load(open(sys.argv[1]))["ingest"]
print(s["records_in"], s["kept"], s["rejected_total"])' "$TEST_DIR/reference/stats.json")
echo "refinery run: $ref_in records, $ref_kept kept, $ref_rejected rejected"
[ "$ref_in" -eq $(($(zcat "$root"/amazon/*.gz | wc -l))) ]

RATE=1500 # records/s: a load takes ~3 s, long enough to interrupt
svc_start ingest --input-root "$root" --load-rate $RATE
for s in dedup tokenizer trainer evaluator; do svc_start $s; done
export REFINERY_SERVER=127.0.0.1:${PORT[ingest]}
ingest_rows() { sql "SELECT count(*) FROM stage_progress WHERE run_id = '$1' AND stage = 'ingest'"; }
sealed() { [ "$(sql "SELECT sealed_at IS NOT NULL FROM runs WHERE id = '$1'")" = t ]; }
# Ingest rows are seqs 0..n-1, each once (the key makes "once" certain).
contiguous() { # RUN
    [ "$(sql "SELECT min(batch_seq) = 0 AND max(batch_seq) = count(*) - 1 FROM stage_progress
        WHERE run_id = '$1' AND stage = 'ingest'")" = t ]
}
check() { # RUN
    "$PY" tests/services/e2e_check.py --proto proto --kafka "$KAFKA_BOOTSTRAP" \
        --pg "$REFINERY_PG" --run "$1" --pushed "$ref_in" --steps "$E2E_STEPS"
}

# a. Uninterrupted.
t0=$SECONDS
"$REFINERY_BIN" submit "$TEST_DIR/spec.yaml" --run-id files-a --server-inputs --watch \
    >"$TEST_DIR/a.out" 2>"$TEST_DIR/a.err" || { cat "$TEST_DIR/a.out" "$TEST_DIR/a.err"; exit 1; }
head -n 1 "$TEST_DIR/a.out"
head -n 1 "$TEST_DIR/a.out" | "$PY" -c 'import json, sys
r = json.load(sys.stdin)
assert r == {"run_id": "files-a", "server_inputs": 2, "batch_docs": 16, "load_started": True}, r'
echo "a: run succeeded in $((SECONDS - t0)) s"
check files-a
contiguous files-a
total=$(ingest_rows files-a)
[ "$(progress files-a ingest)" = "$total|$ref_in|$ref_kept|$ref_rejected|0" ] || {
    echo "ingest totals $(progress files-a ingest), refinery run: $ref_in|$ref_kept|$ref_rejected" >&2
    exit 1
}
[ "$total" -eq $(((ref_in + 15) / 16)) ] # batches of 16 records, across the file boundary
echo "a: $total batches, ingest totals equal refinery run's"

# b. Interrupted twice: SIGTERM, then SIGKILL.
"$REFINERY_BIN" submit "$TEST_DIR/spec.yaml" --run-id files-b --server-inputs >/dev/null \
    2>"$TEST_DIR/b.err"
at_least() { [ "$(ingest_rows "$1")" -ge "$2" ]; }
wait_for "files-b to record 80 batches" 60 at_least files-b 80
svc_stop ingest # exit 0
n1=$(ingest_rows files-b)
sealed files-b && { echo "files-b sealed after SIGTERM" >&2; exit 1; }
[ "$n1" -lt "$total" ] || { echo "SIGTERM came after the load ($n1 of $total)" >&2; exit 1; }
contiguous files-b
grep -q "run files-b: load stopped for shutdown" "$TEST_DIR/ingest.1.log"
svc_start ingest --input-root "$root" --load-rate $RATE
wait_for "files-b to resume" 30 grep -q "run files-b: loading 2 file(s) from batch $n1\$" \
    "$TEST_DIR/ingest.2.log"
wait_for "files-b to record $((n1 + 80)) batches" 60 at_least files-b $((n1 + 80))
svc_kill ingest
n2=$(ingest_rows files-b)
sealed files-b && { echo "files-b sealed before the SIGKILL" >&2; exit 1; }
[ "$n2" -lt "$total" ] || { echo "SIGKILL came after the load ($n2 of $total)" >&2; exit 1; }
echo "b: stopped at batch $n1 (SIGTERM), killed at $n2 of $total"
svc_start ingest --input-root "$root" --load-rate $RATE
export REFINERY_SERVER=127.0.0.1:${PORT[ingest]}
grep -q "resumed loading 1 run" "$TEST_DIR/ingest.3.log"
wait_for "files-b to succeed" 300 run_state_is files-b succeeded
grep -o "run files-b: loading 2 file(s) from batch [0-9]*" "$TEST_DIR/ingest.3.log"
check files-b
contiguous files-b
for stage in ingest dedup tokenizer; do
    a=$(progress files-a $stage) b=$(progress files-b $stage)
    echo "b: $stage batches|in|out|rejected|duplicate: $b (uninterrupted: $a)"
    [ "$a" = "$b" ]
done
# Batch for batch: the same seqs with the same counts in ingest and dedup.
same=$(sql "SELECT count(*) FROM stage_progress a JOIN stage_progress b
    ON a.stage = b.stage AND a.batch_seq = b.batch_seq AND a.docs_in = b.docs_in
    AND a.docs_out = b.docs_out AND a.rejected = b.rejected AND a.duplicate = b.duplicate
    WHERE a.run_id = 'files-a' AND b.run_id = 'files-b' AND a.stage IN ('ingest', 'dedup')")
[ "$same" -eq "$(sql "SELECT count(*) FROM stage_progress WHERE run_id = 'files-a'
    AND stage IN ('ingest', 'dedup')")" ]

# c. Bad requests.
bad_submit() { # STATUS INPUT: --server-inputs with that input fails naming it
    local rc=0
    files_spec "$TEST_DIR/bad.yaml" "$2"
    "$REFINERY_BIN" submit "$TEST_DIR/bad.yaml" --server-inputs >/dev/null \
        2>"$TEST_DIR/bad.err" || rc=$?
    if [ $rc -eq 0 ] || ! grep -q "$1: .*'$2'" "$TEST_DIR/bad.err"; then
        echo "Load of $2: expected $1 naming it, got exit $rc:" >&2
        cat "$TEST_DIR/bad.err" >&2
        return 1
    fi
    grep "$1" "$TEST_DIR/bad.err"
}
bad_submit INVALID_ARGUMENT /etc/passwd
bad_submit INVALID_ARGUMENT ../../../../../../etc/passwd
bad_submit INVALID_ARGUMENT amazon/../../root/amazon/Appliances_5.json.gz
bad_submit INVALID_ARGUMENT etc/passwd
bad_submit NOT_FOUND amazon/missing.json.gz
bad_submit FAILED_PRECONDITION amazon
PYTHONPATH=tests/services "$PY" - "$REFINERY_SERVER" <<'PY'
import sys
import grpc
from rfproto import load
pb, pbg, _, _ = load("proto")
ingest = pbg.IngestStub(grpc.insecure_channel(sys.argv[1]))
for run, code in (("no-such-run", grpc.StatusCode.NOT_FOUND),
                  ("", grpc.StatusCode.INVALID_ARGUMENT),
                  ("files-a", grpc.StatusCode.FAILED_PRECONDITION)):
    try:
        ingest.Load(pb.LoadRequest(run_id=run), timeout=10)
        sys.exit(f"Load({run!r}) succeeded")
    except grpc.RpcError as e:
        assert e.code() == code, (run, e.code(), e.details())
        print(f"Load({run!r}): {e.code().name}: {e.details()}")
PY

# d. A corrupt input fails its run; the service goes on.
files_spec "$TEST_DIR/corrupt.yaml" amazon/Appliances_5.json.gz bad/corrupt.json.gz
"$REFINERY_BIN" submit "$TEST_DIR/corrupt.yaml" --run-id files-d --server-inputs >/dev/null \
    2>>"$TEST_DIR/bad.err"
wait_for "files-d to fail" 60 run_state_is files-d failed
error=$(sql "SELECT error FROM runs WHERE id = 'files-d'")
echo "d: files-d failed: $error"
[[ $error == ingest:*corrupt.json.gz* ]]
sealed files-d && exit 1

# e. Cancel mid-load.
"$REFINERY_BIN" submit "$TEST_DIR/spec.yaml" --run-id files-e --server-inputs >/dev/null \
    2>>"$TEST_DIR/bad.err"
wait_for "files-e to record 50 batches" 60 at_least files-e 50
"$REFINERY_BIN" cancel files-e >/dev/null
wait_for "the loader to stop files-e" 30 grep -q "run files-e: load stopped" "$TEST_DIR/ingest.3.log"
n=$(ingest_rows files-e)
sleep 1 # nothing more may come
[ "$(ingest_rows files-e)" -eq "$n" ] && [ "$n" -lt "$total" ]
sealed files-e && exit 1
run_state_is files-e cancelled
echo "e: files-e cancelled, its load stopped at $n of $total batches"

for s in ingest dedup tokenizer trainer evaluator; do svc_stop $s; done
echo "ingest files: ok"

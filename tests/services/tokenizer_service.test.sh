#!/usr/bin/env bash
# refinery-tokenizer with the mock Kafka cluster and a real PostgreSQL:
# - Tokenize through the C client and through a Python grpcio client
#   generated from proto/ gives, line for line, the ids of `refinery tokenize`
#   on SST-2 dev; invalid UTF-8 gets INVALID_ARGUMENT and the service goes on;
# - the consume path, with the service SIGKILLed mid-stream and restarted:
#   every document of the input batches is in exactly one of tokens.train /
#   tokens.eval (deduplicated by (topic, run, seq)), with the ids
#   `refinery tokenize` gives its text, and stage_progress counts each once.
. "$REFINERY_ROOT/tests/services/lib.sh"
[ -d "$SHARED/data" ] || { echo "SHARED ($SHARED) is missing: see /work/shared/README.md" >&2; exit 1; }
tool=$REFINERY_BUILD/tests/services/test_tokenizer_service
producer=$REFINERY_BUILD/tests/services/test_dedup_service
svc=$REFINERY_BUILD/refinery-tokenizer
tok=$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
BATCH=4
venv=$(scripts/pyenv.sh test)
env_start pg kafka
for t in docs.clean tokens.train tokens.eval; do
    scripts/test-env/kafka.sh cmd "$TEST_DIR" "topic $t 2"
done

tail -n +2 "$SHARED/data/sst2/dev.tsv" | cut -f1 >"$TEST_DIR/lines.txt"
awk '{printf "s%d\t%s\n", NR, $0}' "$TEST_DIR/lines.txt" >"$TEST_DIR/docs.tsv"
ndocs=$(wc -l <"$TEST_DIR/lines.txt")
nbatch=$(((ndocs + BATCH - 1) / BATCH))
"$REFINERY_BIN" tokenize --tokenizer "$tok" --input "$TEST_DIR/lines.txt" >"$TEST_DIR/ref.ids"

# The service consumes docs.clean here (no dedup in front: clusters are 0,
# so the split hashes document ids, as the embedded stage does then).
start() { # LOG: starts the service, sets pid and port
    rm -f "$TEST_DIR/port"
    REFINERY_MAX_MESSAGES=1 "$svc" --tokenizer "$tok" --listen 127.0.0.1:0 \
        --port-file "$TEST_DIR/port" --topic-in docs.clean 2>"$TEST_DIR/$1" &
    pid=$!
    env_track_pid $pid
    for _ in $(seq 300); do [ -s "$TEST_DIR/port" ] && break; sleep 0.1; done
    port=$(cat "$TEST_DIR/port")
}
progress() {
    psql "$REFINERY_PG" -Atc "SELECT count(*), coalesce(sum(docs_in), 0),
        coalesce(sum(docs_out), 0), coalesce(sum(rejected), 0)
        FROM stage_progress WHERE run_id = 'run-tok' AND stage = 'tokenizer'"
}
wait_batches() { # MIN SECONDS
    local n=0
    for _ in $(seq $(($2 * 10))); do
        n=$(progress | cut -d'|' -f1)
        [ "$n" -ge "$1" ] && return 0
        sleep 0.1
    done
    echo "only $n of $1 batches recorded after $2 s" >&2
    return 1
}
start tokenizer1.log

"$tool" --tokenize "$port" "$TEST_DIR/lines.txt" >"$TEST_DIR/c.ids"
cmp "$TEST_DIR/c.ids" "$TEST_DIR/ref.ids"
"$venv/bin/python" tests/services/tokenize_client.py proto "$port" "$TEST_DIR/lines.txt" \
    >"$TEST_DIR/py.ids"
cmp "$TEST_DIR/py.ids" "$TEST_DIR/ref.ids"
"$tool" --bad "$port"
echo "Tokenize: $ndocs lines, C and Python clients equal refinery tokenize"

for _ in $(seq 300); do # the consumer applies the schema when it opens the store
    psql "$REFINERY_PG" -Atc "SELECT 1 FROM runs LIMIT 1" >/dev/null 2>&1 && break
    sleep 0.1
done
psql "$REFINERY_PG" -qc "INSERT INTO runs (id, spec) VALUES ('run-tok', '{}')"
"$producer" --produce "$KAFKA_BOOTSTRAP" run-tok "$TEST_DIR/docs.tsv" $BATCH
wait_batches $((nbatch / 5)) 60
kill -KILL $pid
wait $pid 2>/dev/null || true
echo "killed at $(progress)"
start tokenizer2.log # the successor gets the partitions once the session ends
wait_batches $nbatch 120
"$tool" --bad "$port" # the restarted service serves too
"$tool" --collect "$KAFKA_BOOTSTRAP" run-tok $nbatch "$TEST_DIR/got.tsv"
paste "$TEST_DIR/docs.tsv" "$TEST_DIR/ref.ids" | awk -F'\t' '{print $1 "\t" $3}' |
    sort >"$TEST_DIR/want.tsv"
sort -o "$TEST_DIR/got.tsv" "$TEST_DIR/got.tsv"
cmp "$TEST_DIR/got.tsv" "$TEST_DIR/want.tsv"

row=$(progress)
echo "stage_progress (batches|in|out|rejected): $row"
[ "$row" = "$nbatch|$ndocs|$ndocs|0" ]
kill -TERM $pid
wait $pid # exit 0
echo "tokenizer service: ok"

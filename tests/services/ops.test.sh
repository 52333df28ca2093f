#!/usr/bin/env bash
# What an operator meets at startup (issue 15), with real service processes:
# - a second refinery-tokenizer on a port already in use exits non-zero with
#   an error naming the address (no SO_REUSEPORT sharing), and the first one
#   keeps serving; gRPC core's own error about it is a JSON log line, like
#   every line the service writes;
# - a PostgreSQL database that does not exist, or a malformed connection
#   string, ends refinery-ingest at once (exit 1, the reason logged), not
#   after the connection retries;
# - refinery-dedup and refinery-trainer serve grpc.health.v1: Check SERVING
#   for refinery.v1.Dedup / refinery.v1.Trainer and "" once their
#   dependencies are open, and a Watch sees SERVING, then NOT_SERVING when
#   the service is stopped, then the end of the stream (grpcio client);
# - readiness: refinery-dedup's refinery.v1.Dedup is NOT_SERVING while every
#   Kafka broker is down and while PostgreSQL is stopped, SERVING again when
#   they return ("" stays SERVING throughout), each change logged.
. "$REFINERY_ROOT/tests/services/lib.sh"
[ -d "$SHARED/data" ] || { echo "SHARED ($SHARED) is missing: see /work/shared/README.md" >&2; exit 1; }
tok=$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
tokenizer=$REFINERY_BUILD/refinery-tokenizer
tool=$REFINERY_BUILD/tests/services/test_tokenizer_service

wait_port() { # FILE: prints the port once the service wrote it
    for _ in $(seq 300); do [ -s "$1" ] && break; sleep 0.1; done
    cat "$1"
}

# --- a busy port is an error at startup ---
"$tokenizer" --tokenizer "$tok" --listen 127.0.0.1:0 --port-file "$TEST_DIR/port1" \
    2>"$TEST_DIR/tok1.log" &
pid1=$!
env_track_pid $pid1
port=$(wait_port "$TEST_DIR/port1")
rc=0
timeout 20 "$tokenizer" --tokenizer "$tok" --listen "127.0.0.1:$port" \
    --port-file "$TEST_DIR/port2" 2>"$TEST_DIR/tok2.log" || rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
    echo "a second tokenizer on busy port $port did not fail (rc $rc)" >&2
    exit 1
fi
grep -q "cannot listen on 127.0.0.1:$port" "$TEST_DIR/tok2.log" || {
    echo "the error does not name the address:" >&2; cat "$TEST_DIR/tok2.log" >&2; exit 1
}
# gRPC core's own line about the bind is a JSON log line too.
grep -q '^{"ts":.*"level":"error","comp":"grpc","msg":".*Address already in use' "$TEST_DIR/tok2.log" || {
    echo "no JSON line from gRPC core:" >&2; cat "$TEST_DIR/tok2.log" >&2; exit 1
}
if grep -qv '^{' "$TEST_DIR/tok2.log"; then
    echo "a log line that is not JSON:" >&2; grep -v '^{' "$TEST_DIR/tok2.log" >&2; exit 1
fi
[ ! -s "$TEST_DIR/port2" ] || { echo "the second tokenizer wrote a port file" >&2; exit 1; }
kill -0 $pid1
printf 'a busy port\n' >"$TEST_DIR/one.txt"
"$tool" --tokenize "$port" "$TEST_DIR/one.txt" >/dev/null
echo "busy port: second tokenizer exited $rc: $(grep -o 'cannot listen[^"]*' "$TEST_DIR/tok2.log")"

# --- configuration errors no retry can fix fail at once ---
env_start pg
ingest=$REFINERY_BUILD/refinery-ingest
for pg in "$REFINERY_PG dbname=rf_no_such_db|3D000" "host=127.0.0.1 port|invalid PostgreSQL connection string"; do
    rc=0
    start=$(date +%s%N)
    timeout 20 "$ingest" --listen 127.0.0.1:0 --kafka 127.0.0.1:1 --pg "${pg%|*}" \
        2>"$TEST_DIR/ingest-pg.log" || rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    [ $rc -eq 1 ] || { echo "ingest with --pg '${pg%|*}' exited $rc, not 1" >&2; exit 1; }
    grep -q "cannot start: store: .*${pg#*|}" "$TEST_DIR/ingest-pg.log" || {
        echo "no reason logged:" >&2; cat "$TEST_DIR/ingest-pg.log" >&2; exit 1
    }
    [ $ms -lt 3000 ] || { echo "ingest took $ms ms to give up on '${pg%|*}'" >&2; exit 1; }
    echo "pg '${pg%|*}': exit $rc after $ms ms: $(grep -o 'store: [^"]*' "$TEST_DIR/ingest-pg.log")"
done

# --- health on dedup and the trainer ---
env_start kafka
venv=$(scripts/pyenv.sh test)
health_case() { # NAME SERVICE ARGS...: Check, then Watch across a SIGTERM
    local name=$1 service=$2 pid port wpid
    shift 2
    "$REFINERY_BUILD/refinery-$name" --listen 127.0.0.1:0 --port-file "$TEST_DIR/$name.port" "$@" \
        2>"$TEST_DIR/$name.log" &
    pid=$!
    env_track_pid $pid
    port=$(wait_port "$TEST_DIR/$name.port")
    [ -n "$port" ] || { echo "refinery-$name wrote no port" >&2; exit 1; }
    "$venv/bin/python" tests/services/health_client.py proto "$port" "$service" check
    "$venv/bin/python" tests/services/health_client.py proto "$port" "$service" watch \
        >"$TEST_DIR/$name.watch" 2>&1 &
    wpid=$!
    for _ in $(seq 300); do grep -q watching "$TEST_DIR/$name.watch" && break; sleep 0.1; done
    grep -q watching "$TEST_DIR/$name.watch" || { cat "$TEST_DIR/$name.watch" >&2; exit 1; }
    kill -TERM $pid
    wait $pid
    wait $wpid || { echo "the Watch on $name failed:" >&2; cat "$TEST_DIR/$name.watch" >&2; exit 1; }
    tail -n 1 "$TEST_DIR/$name.watch"
}
health_case dedup refinery.v1.Dedup --index "$TEST_DIR/index"
health_case trainer refinery.v1.Trainer --state "$TEST_DIR/trainer" --checkpoints "$TEST_DIR/ck" \
    --threads 1

# --- readiness follows the dependencies ---
"$REFINERY_BUILD/refinery-dedup" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ready.port" \
    --index "$TEST_DIR/index2" --ready-interval 0.3 2>"$TEST_DIR/ready.log" &
pid=$!
env_track_pid $pid
port=$(wait_port "$TEST_DIR/ready.port")
hc() { "$venv/bin/python" tests/services/health_client.py proto "$port" refinery.v1.Dedup "$@"; }
hc wait SERVING 30
for b in 1 2 3; do scripts/test-env/kafka.sh cmd "$TEST_DIR" "down $b"; done
hc wait NOT_SERVING 15
grep -q '"refinery.v1.Dedup NOT_SERVING: Kafka unreachable: ' "$TEST_DIR/ready.log"
for b in 1 2 3; do scripts/test-env/kafka.sh cmd "$TEST_DIR" "up $b"; done
hc wait SERVING 30
scripts/test-env/pg.sh stop "$TEST_DIR"
hc wait NOT_SERVING 15
grep -q '"refinery.v1.Dedup NOT_SERVING: PostgreSQL unreachable: ' "$TEST_DIR/ready.log"
scripts/test-env/pg.sh restart "$TEST_DIR"
hc wait SERVING 15
kill -TERM $pid
wait $pid
grep -c '"comp":"ready"' "$TEST_DIR/ready.log"

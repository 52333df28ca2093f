#!/usr/bin/env bash
# A Python client generated from proto/ by grpcio-tools talks to the C gRPC
# server (the test server of test_rpc, run in --serve mode).
set -euo pipefail
cd "$REFINERY_ROOT"
server_bin=$REFINERY_BUILD/tests/services/test_rpc
[ -x "$server_bin" ] || { echo "missing $server_bin (make it first)" >&2; exit 1; }
venv=$(scripts/pyenv.sh test)

tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

"$server_bin" --serve "$tmp/port" >"$tmp/server.out" 2>"$tmp/server.err" &
pid=$!
for _ in $(seq 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
[ -s "$tmp/port" ] || { echo "server did not start" >&2; cat "$tmp/server.err" >&2; exit 1; }

"$venv/bin/python" tests/services/rpc_client.py proto "$(cat "$tmp/port")"

# SIGTERM: the server stops cleanly and reports what it counted.
kill -TERM "$pid"
wait "$pid"
pid=
cat "$tmp/server.out"
grep -q '"INVALID_ARGUMENT":1' "$tmp/server.out"
grep -q '"RESOURCE_EXHAUSTED":1' "$tmp/server.out"
grep -q '"DEADLINE_EXCEEDED":1' "$tmp/server.out"
echo "rpc_python: ok"

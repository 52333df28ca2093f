#!/usr/bin/env bash
# refinery-loadgen against refinery-tokenizer (gRPC side only): a 1 s run of
# 4 clients gets only successes, a fixed request budget sends exactly that
# many, and against a port where nothing listens every request is an error
# (so successes are not just counted sends).
. "$REFINERY_ROOT/tests/services/lib.sh"
[ -d "$SHARED/data" ] || { echo "SHARED ($SHARED) is missing: see /work/shared/README.md" >&2; exit 1; }
gen=$REFINERY_BUILD/refinery-loadgen
tail -n +2 "$SHARED/data/sst2/dev.tsv" | cut -f1 >"$TEST_DIR/texts.txt"
"$REFINERY_BUILD/refinery-tokenizer" --tokenizer "$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json" \
    --listen 127.0.0.1:0 --port-file "$TEST_DIR/port" 2>"$TEST_DIR/tokenizer.log" &
env_track_pid $!
for _ in $(seq 100); do [ -s "$TEST_DIR/port" ] && break; sleep 0.1; done
target=127.0.0.1:$(cat "$TEST_DIR/port")
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {}, d))' "$1"; }

out=$("$gen" --target "$target" --texts "$TEST_DIR/texts.txt" --clients 4 --duration 1 --warmup 0.2)
echo "$out"
[ "$(field 'ok > 0 and error_total == 0 and requests == ok' <<<"$out")" = True ]
[ "$(field 'latency_ms["p50"] <= latency_ms["p90"] <= latency_ms["p99"] <= latency_ms["max"]' <<<"$out")" = True ]

out=$("$gen" --target "$target" --texts "$TEST_DIR/texts.txt" --clients 3 --requests 50 --batch 8)
echo "$out"
[ "$(field 'requests == 50 and ok == 50 and error_total == 0 and texts_per_s > 0' <<<"$out")" = True ]

# Nothing listens on the tokenizer's port once it is stopped.
kill -TERM "${_env_pids[0]}"
wait "${_env_pids[0]}"
out=$("$gen" --target "$target" --texts "$TEST_DIR/texts.txt" --clients 2 --requests 4 --timeout 2)
echo "$out"
[ "$(field 'ok == 0 and error_total == 4' <<<"$out")" = True ]
echo "loadgen: ok"

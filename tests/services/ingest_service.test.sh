#!/usr/bin/env bash
# refinery-ingest as a process, against the standalone mock Kafka cluster:
# the shared Amazon reviews pushed over gRPC by a Python client generated from
# proto/ are all accounted for (accepted + rejected = pushed), the service
# reports the same counts when SIGTERM stops it, and it exits 0.
. "$REFINERY_ROOT/tests/services/lib.sh"
reviews=$SHARED/data/amazon/All_Beauty_5.json.gz
[ -f "$reviews" ] || { echo "missing $reviews (SHARED=$SHARED)" >&2; exit 1; }
venv=$(scripts/pyenv.sh test)
env_start kafka

"$REFINERY_BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ingest.port" \
    --kafka "$KAFKA_BOOTSTRAP" 2>"$TEST_DIR/ingest.log" &
pid=$!
env_track_pid $pid
for _ in $(seq 100); do [ -s "$TEST_DIR/ingest.port" ] && break; sleep 0.1; done
[ -s "$TEST_DIR/ingest.port" ] || { echo "refinery-ingest did not start" >&2; exit 1; }

summary=$("$venv/bin/python" tests/services/push_reviews.py proto "$(cat "$TEST_DIR/ingest.port")" \
    run-reviews "$reviews")
echo "summary: $summary"
read -r pushed received accepted rejected < <("$venv/bin/python" -c '
import json, sys; s = json.loads(sys.argv[1])
print(s["pushed"], s["received"], s["accepted"], s["rejected"])' "$summary")
[ "$pushed" -eq 5269 ]
[ "$received" -eq "$pushed" ]
[ $((accepted + rejected)) -eq "$received" ]
[ "$accepted" -gt 0 ]

kill -TERM $pid
wait $pid # exit status 0 or the script fails here
stats=$(grep '"stopped' "$TEST_DIR/ingest.log")
echo "$stats"
grep -q "\\\\\"received\\\\\":$received" <<<"$stats"
grep -q "\\\\\"kept\\\\\":$accepted" <<<"$stats"
echo "ingest service: ok"

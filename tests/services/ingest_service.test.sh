#!/usr/bin/env bash
# refinery-ingest as a process, against the standalone mock Kafka cluster and a
# real PostgreSQL: the shared Amazon reviews pushed over gRPC by a Python
# client generated from proto/ are all accounted for (accepted + rejected =
# pushed, in the summary and in stage_progress), unknown or missing run ids get
# NOT_FOUND / INVALID_ARGUMENT, the service reports the same counts when
# SIGTERM stops it, and it exits 0.
. "$REFINERY_ROOT/tests/services/lib.sh"
reviews=$SHARED/data/amazon/All_Beauty_5.json.gz
[ -f "$reviews" ] || { echo "missing $reviews (SHARED=$SHARED)" >&2; exit 1; }
venv=$(scripts/pyenv.sh test)
env_start pg kafka

"$REFINERY_BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$TEST_DIR/ingest.port" \
    --kafka "$KAFKA_BOOTSTRAP" --pg "$REFINERY_PG" 2>"$TEST_DIR/ingest.log" &
pid=$!
env_track_pid $pid
for _ in $(seq 150); do [ -s "$TEST_DIR/ingest.port" ] && break; sleep 0.1; done
[ -s "$TEST_DIR/ingest.port" ] || { echo "refinery-ingest did not start" >&2; exit 1; }
port=$(cat "$TEST_DIR/ingest.port")
psql "$REFINERY_PG" -qc "INSERT INTO runs (id, spec) VALUES ('run-reviews', '{}')"

push() { "$venv/bin/python" tests/services/push_reviews.py proto "$port" "$@"; }
field() { "$venv/bin/python" -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], ""))' "$1" "$2"; }

summary=$(push run-reviews "$reviews")
echo "summary: $summary"
pushed=$(field "$summary" pushed) received=$(field "$summary" received)
accepted=$(field "$summary" accepted) rejected=$(field "$summary" rejected)
[ "$pushed" -eq 5269 ]
[ "$received" -eq "$pushed" ]
[ $((accepted + rejected)) -eq "$received" ]
[ "$accepted" -gt 0 ]

# The same accounting in PostgreSQL, batch by batch.
row=$(psql "$REFINERY_PG" -Atc "SELECT sum(docs_in), sum(docs_out), sum(rejected), count(*)
    FROM stage_progress WHERE run_id = 'run-reviews' AND stage = 'ingest'")
echo "stage_progress: $row"
[ "${row%|*}" = "$pushed|$accepted|$rejected" ]

# Bad run ids: refused with their status, counted, and the service goes on.
[ "$(field "$(push no-such-run "$reviews" 10)" error)" = NOT_FOUND ]
[ "$(field "$(push - "$reviews" 10)" error)" = INVALID_ARGUMENT ]
[ "$(field "$(push run-reviews "$reviews" 10)" received)" = 10 ]

kill -TERM $pid
wait $pid # exit status 0 or the script fails here
stats=$(grep '"stopped' "$TEST_DIR/ingest.log")
echo "$stats"
grep -q "\\\\\"received\\\\\":$((received + 10))" <<<"$stats"
grep -q '\\"NOT_FOUND\\":1' <<<"$stats"
grep -q '\\"INVALID_ARGUMENT\\":1' <<<"$stats"
echo "ingest service: ok"

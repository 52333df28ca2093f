#!/usr/bin/env bash
# The services against the embedded runner, same data, same machine, one run:
#
# 1. Pipeline throughput. Input: the Amazon reviews of ../shared/data/amazon
#    (both 2018 JSON files and the 2014 CSV; the review text, label = rating
#    >= 3) as JSON Lines {"id","text","label"}, repeated BENCH_REPEAT times
#    (default 2) with distinct ids, so about 25k records (the copies are
#    exact duplicates: dedup keeps one of each, as the real data's own
#    repeats). More copies risk the mock cluster's 5 MB partition log (see
#    KAFKA_PROPERTIES below). The same file and the same ingest, dedup and
#    tokenizer settings (one spec, $work/spec.yaml) go to both sides:
#    - embedded: `refinery run spec.yaml` with the ingest, dedup and tokenizer
#      sections (threads: 2), timed as a whole process (start, tokenizer load,
#      reading and parsing the JSON, cleaning, filters, dedup, tokenizing,
#      writing shards);
#    - services: refinery-ingest (--spec, the same cleaning and filters),
#      refinery-dedup (--threads 2, as the embedded dedup) and
#      refinery-tokenizer on the mock Kafka cluster (one-partition topics: a
#      run is one partition anyway) and a throwaway PostgreSQL, fed by
#      refinery-push (C client on services/runtime/rpc:
#      reads and parses the same JSON Lines, one Document per line,
#      BENCH_STREAMS concurrent Push calls, default 2). Timed from the start
#      of the push until the tokenizer has recorded, in stage_progress, every
#      batch that ingest recorded (one psql session polling every 20 ms). The services are
#      started (and their tokenizer loaded, consumer groups joined by a small
#      warm-up run) before the clock starts;
#    - services fed through ingest's Kafka source instead of gRPC: the same
#      JSON Lines written to docs.raw (scripts/bench/kafka_feed.py, Python
#      confluent-kafka, BENCH_FEED_LINES lines per message, default 256, lz4),
#      the run's end marker last; timed from the start of the feed until the
#      run is sealed (ingest took the marker) and the tokenizer has every
#      batch ingest recorded.
#    docs/s = input records / wall seconds. CPU seconds are user+system: the
#    embedded process; for the services, the pushing (feeding) client plus the three
#    service processes (their /proc counters before and after), and apart
#    from that the Kafka mock and PostgreSQL (postmaster and its children).
#    BENCH_REPS (default 5) runs of each, interleaved (embedded, services,
#    embedded, ...) so both see the same machine load; the table shows the
#    best of each by wall time, the line below it the medians.
# 2. Latency under load: refinery-loadgen (C, services/runtime/rpc client, closed
#    loop, one call per client at a time) on SST-2 dev sentences, 1 and 8
#    texts per request, BENCH_SECONDS (default 3) per row after a warm-up:
#    - Tokenizer.Tokenize against refinery-tokenizer (gRPC only, 4 workers),
#      1/4/16 clients; beside it, `refinery tokenize --threads 2` on the same
#      sentences (repeated to 100k lines) in-process, as texts/s;
#    - Evaluator.Classify against refinery-evaluator (gRPC only, 4 workers)
#      with build/models/minilm-l6 (make demo fetches it; else the tiny
#      fixture model tests/fixtures/trainer/exported) recorded as the run's
#      checkpoint, 1/4 clients.
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-$(cd .. && pwd)/shared}
BUILD=${BUILD:-build}
export REFINERY_BUILD=$PWD/$BUILD
REPEAT=${BENCH_REPEAT:-2}
REPS=${BENCH_REPS:-5}
STREAMS=${BENCH_STREAMS:-2}
SECONDS_EACH=${BENCH_SECONDS:-3}
tok=$SHARED/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json
for f in amazon/All_Beauty_5.json.gz amazon/Appliances_5.json.gz \
         amazon/Musical_instruments_reviews.PARTIAL.csv sst2/dev.tsv; do
    [ -f "$SHARED/data/$f" ] || { echo "bench_services: missing $SHARED/data/$f" >&2; exit 1; }
done
for b in refinery refinery-ingest refinery-dedup refinery-tokenizer refinery-kafka-mock \
         refinery-push refinery-loadgen; do
    [ -x "$BUILD/$b" ] || { echo "bench_services: build $BUILD/$b first (make)" >&2; exit 1; }
done
PY_KAFKA=$(scripts/pyenv.sh test)/bin/python # confluent-kafka, for the Kafka-source feed
FEED_LINES=${BENCH_FEED_LINES:-256}

work=$(mktemp -d /tmp/rf-bench-svc.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    scripts/test-env/kafka.sh stop "$work" 2>/dev/null || true
    scripts/test-env/pg.sh stop "$work" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

python3 - "$SHARED" "$REPEAT" "$work/in.jsonl" "$work/warm.jsonl" <<'PY'
import csv, gzip, json, os, sys
shared, repeat, out, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
recs = []
for name in ("All_Beauty_5.json.gz", "Appliances_5.json.gz"):
    with gzip.open(os.path.join(shared, "data/amazon", name), "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            r = json.loads(line)
            if isinstance(r.get("reviewText"), str):
                recs.append((f"{name}:{n}", r["reviewText"], int(r.get("overall", 0) >= 3)))
csv.field_size_limit(1 << 30)
name = "Musical_instruments_reviews.PARTIAL.csv"
with open(os.path.join(shared, "data/amazon", name), newline="", encoding="utf-8") as f:
    for n, r in enumerate(csv.reader(f), 1):
        if len(r) > 5:
            recs.append((f"{name}:{n}", r[4], int(float(r[5] or 0) >= 3)))
with open(out, "w", encoding="utf-8") as f:
    for k in range(repeat):
        for id_, text, label in recs:
            f.write(json.dumps({"id": f"copy{k}/{id_}", "text": text, "label": label}) + "\n")
with open(warm, "w", encoding="utf-8") as f:
    for id_, text, label in recs[:200]:
        f.write(json.dumps({"id": f"warm/{id_}", "text": text, "label": label}) + "\n")
PY
records=$(wc -l <"$work/in.jsonl")
mb=$(awk -v b="$(stat -c %s "$work/in.jsonl")" 'BEGIN { printf "%.1f", b / 1e6 }')
cat >"$work/spec.yaml" <<EOF
run:
  name: bench-services
  threads: 2
ingest:
  inputs: [$work/in.jsonl]
  text_fields: text
  label_field: label
  id_field: id
dedup: {}
tokenizer:
  tokenizer: $tok
  max_length: 0           # as tokenizer.json says, like the tokenizer service
EOF

# ---- services ---------------------------------------------------------------
scripts/test-env/pg.sh start "$work" >/dev/null
scripts/test-env/kafka.sh start "$work" 2>/dev/null
set -a; . "$work/pg.env"; . "$work/kafka.env"; set +a
for t in docs.raw docs.clean docs.rejected docs.unique docs.duplicates tokens.train tokens.eval; do
    scripts/test-env/kafka.sh cmd "$work" "topic $t 1" # a run is one partition anyway
done
export REFINERY_LOG_LEVEL=warn
# Two settings for the mock cluster (librdkafka 2.0's rdkafka_mock):
# - it keeps only the last 5 MB of each partition (not configurable) and a
#   run's batches share one partition: ingest compresses its batches
#   (BENCH_INGEST_KAFKA_PROPS, lz4), so a consumer lagging behind it still
#   finds its input (a lost offset aborts the bench, see push_run); dedup's
#   and the tokenizer's outputs are small or not consumed here;
# - it answers a fetch that found no data only after fetch.wait.max.ms
#   (librdkafka's default 500 ms), even when data arrives meanwhile (a real
#   broker answers at once): 20 ms keeps an idle consumer from sleeping
#   through the upstream stage's output.
export KAFKA_PROPERTIES=${KAFKA_PROPERTIES:-fetch.wait.max.ms=20}
ingest_props=${BENCH_INGEST_KAFKA_PROPS:-$KAFKA_PROPERTIES;compression.type=lz4}
"$BUILD/refinery-ingest" --listen 127.0.0.1:0 --port-file "$work/ingest.port" --spec "$work/spec.yaml" \
    --kafka-props "$ingest_props" --source-topic docs.raw \
    2>"$work/ingest.log" &
pids+=($!); ingest_pid=$!
for _ in $(seq 300); do [ -s "$work/ingest.port" ] && break; sleep 0.1; done
[ -s "$work/ingest.port" ] || { echo "refinery-ingest did not start" >&2; cat "$work/ingest.log" >&2; exit 1; }
"$BUILD/refinery-dedup" --listen 127.0.0.1:0 --index "$work/index" --threads 2 2>"$work/dedup.log" &
pids+=($!); dedup_pid=$!
"$BUILD/refinery-tokenizer" --tokenizer "$tok" --listen 127.0.0.1:0 --port-file "$work/tok.port" \
    2>"$work/tokenizer.log" &
pids+=($!); tok_pid=$!
for _ in $(seq 300); do [ -s "$work/tok.port" ] && break; sleep 0.1; done
pg_pid=$(head -n 1 "$work/data/postmaster.pid")
kafka_pid=$(cat "$work/kafka.pid")

cpu_of() { # PID... -> CPU seconds (user+system) of those processes
    local ticks=0 p
    for p in "$@"; do
        [ -r "/proc/$p/stat" ] || continue
        ticks=$((ticks + $(sed 's/.*) //' "/proc/$p/stat" | awk '{ print $12 + $13 }')))
    done
    awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'
}
pg_procs() { echo "$pg_pid" $(pgrep -P "$pg_pid" || true); }
sql() { psql "$REFINERY_PG" -Atc "$1"; }
done_query() { # RUN FEED -> SQL: "batches ingest recorded with documents|batches the
    # tokenizer recorded"; fed through the Kafka source, the first is -1 until the run is
    # sealed (ingest took its end marker, so it has recorded every batch)
    local sealed=true
    [ "$2" = kafka ] && sealed="(SELECT sealed_at IS NOT NULL FROM runs WHERE id = '$1')"
    echo "SELECT CASE WHEN $sealed THEN (SELECT count(*) FROM stage_progress
                  WHERE run_id = '$1' AND stage = 'ingest' AND docs_out > 0) ELSE -1 END,
                 (SELECT count(*) FROM stage_progress WHERE run_id = '$1' AND stage = 'tokenizer')"
}
push_run() { # RUN INPUT [push|kafka] -> wall seconds, waits until the tokenizer has every batch
    local run=$1 input=$2 feed=${3:-push} t0 a b
    for _ in $(seq 300); do # the schema is applied by whichever service opens the store first
        sql "INSERT INTO runs (id, spec) VALUES ('$run', '{}')" >/dev/null 2>&1 && break
        sleep 0.1
    done
    t0=$(date +%s.%N)
    if [ "$feed" = kafka ]; then
        /usr/bin/time -f '%U %S' -o "$work/push.time" "$PY_KAFKA" scripts/bench/kafka_feed.py \
            "$KAFKA_BOOTSTRAP" docs.raw "$run" "$input" "$FEED_LINES" >"$work/feed.out"
        awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.3f", t1 - t0 }' >"$work/feed.wall"
    else
        /usr/bin/time -f '%U %S' -o "$work/push.time" "$BUILD/refinery-push" --target \
            "127.0.0.1:$(cat "$work/ingest.port")" --run "$run" --input "$input" \
            --streams "$STREAMS" >"$work/push.json"
    fi
    # One psql session asks every 20 ms (\watch) rather than a psql process
    # per poll, which would take CPU from the services being measured.
    local n=0 line lost=0
    a=1 b=0
    while read -r line; do
        [[ $line == *"|"* ]] || continue
        a=${line%%|*} b=${line#*|} n=$((n + 1))
        [ "$a" -ge 0 ] && [ "$b" -ge "$a" ] && break
        if [ $((n % 25)) -eq 0 ] && grep -q "Offset out of range" "$work/dedup.log" "$work/tokenizer.log"; then
            lost=1
            break
        fi
        [ $n -lt 15000 ] || break # 300 s
    done < <(psql "$REFINERY_PG" -At <<<"$(done_query "$run" "$feed") \watch 0.02")
    if [ $lost -eq 1 ]; then
        echo "bench_services: a consumer lost input to the mock's 5 MB partition limit" \
            "(Offset out of range, see below); use a smaller BENCH_REPEAT" >&2
        grep -h "Offset out of range" "$work/dedup.log" "$work/tokenizer.log" | head -3 >&2
        exit 1
    fi
    [ "$a" -ge 0 ] && [ "$b" -ge "$a" ] || {
        echo "bench_services: run $run: tokenizer has $b of $a batches" >&2
        exit 1
    }
    awk -v t0="$t0" -v t1="$(date +%s.%N)" 'BEGIN { printf "%.3f", t1 - t0 }'
}

# ---- embedded: one run, keeps the best by wall time ------------------------
emb_best=""
embedded_run() { # REP
    rm -rf "$work/emb"
    /usr/bin/time -f '%e %U %S' -o "$work/emb.time" "$BUILD/refinery" run "$work/spec.yaml" \
        --out "$work/emb" >/dev/null 2>"$work/emb.log"
    local w u s
    read -r w u s <"$work/emb.time"
    echo "embedded run $1: $w s wall, $(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }') CPU s; load $(cut -d' ' -f1 /proc/loadavg)"
    echo "$w" >>"$work/emb.walls"
    if [ -z "$emb_best" ] || awk -v a="$w" -v b="${emb_best%% *}" 'BEGIN { exit !(a < b) }'; then
        emb_best="$w $(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }')"
    fi
}

push_run warm "$work/warm.jsonl" >/dev/null
push_run warm-kafka "$work/warm.jsonl" kafka >/dev/null
declare -A best
services_run() { # FEED REP: one services run, keeps the best by wall time per feed
    local feed=$1 r=$2 run=bench-$1-$2
    local before=($(cpu_of "$ingest_pid") $(cpu_of "$dedup_pid") $(cpu_of "$tok_pid") $(cpu_of "$kafka_pid") $(cpu_of $(pg_procs)))
    local wall
    wall=$(push_run "$run" "$work/in.jsonl" "$feed")
    local after=($(cpu_of "$ingest_pid") $(cpu_of "$dedup_pid") $(cpu_of "$tok_pid") $(cpu_of "$kafka_pid") $(cpu_of $(pg_procs)))
    local parts i c_cl c_in c_dd c_tk c_kf c_pg cpu infra
    parts=$(awk '{ print $1 + $2 }' "$work/push.time") # client ingest dedup tokenizer kafka pg
    for i in 0 1 2 3 4; do
        parts="$parts $(awk -v a="${before[$i]}" -v b="${after[$i]}" 'BEGIN { printf "%.2f", b - a }')"
    done
    read -r c_cl c_in c_dd c_tk c_kf c_pg <<<"$parts"
    cpu=$(awk -v a="$c_cl" -v b="$c_in" -v c="$c_dd" -v d="$c_tk" 'BEGIN { printf "%.2f", a + b + c + d }')
    infra=$(awk -v a="$c_kf" -v b="$c_pg" 'BEGIN { printf "%.2f", a + b }')
    local fed=""
    [ "$feed" = kafka ] && fed=" (the feed itself $(cat "$work/feed.wall") s)"
    echo "services ($feed) run $r: $wall s wall$fed; CPU s: client $c_cl, ingest $c_in, dedup $c_dd," \
        "tokenizer $c_tk | kafka mock $c_kf, postgres $c_pg; load $(cut -d' ' -f1 /proc/loadavg)"
    echo "$wall" >>"$work/$feed.walls"
    if [ -z "${best[$feed]:-}" ] || awk -v a="$wall" -v b="${best[$feed]%% *}" 'BEGIN { exit !(a < b) }'; then
        best[$feed]="$wall $cpu $infra $c_cl $run"
    fi
}
for r in $(seq "$REPS"); do # interleaved, so every side sees the same machine load
    embedded_run "$r"
    services_run push "$r"
    services_run kafka "$r"
done
svc_best=${best[push]}
read -r k_wall k_cpu k_infra k_client k_run <<<"${best[kafka]}"
read -r s_wall s_cpu s_infra s_client s_run <<<"$svc_best"
read -r e_wall e_cpu <<<"$emb_best"
emb_kept=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dedup"]["kept"])' "$work/emb/stats.json")
counts=$(sql "SELECT stage, sum(docs_in), sum(docs_out), sum(rejected), sum(duplicate), count(*)
              FROM stage_progress WHERE run_id = '$s_run' GROUP BY stage ORDER BY stage")
svc_kept=$(sql "SELECT sum(docs_out) FROM stage_progress WHERE run_id = '$s_run' AND stage = 'dedup'")

echo "data: $records records, $mb MB JSON Lines (Amazon reviews x$REPEAT, distinct ids); 2 threads / $STREAMS push streams"
printf '%-34s %9s %9s %8s %10s\n' "" "wall s" "docs/s" "CPU s" "docs/CPU s"
awk -v n="$records" -v ew="$e_wall" -v ec="$e_cpu" -v sw="$s_wall" -v sc="$s_cpu" -v si="$s_infra" 'BEGIN {
    printf "%-34s %9.2f %9.0f %8.2f %10.0f\n", "embedded refinery run", ew, n / ew, ec, n / ec
    printf "%-34s %9.2f %9.0f %8.2f %10.0f\n", "services (client+3 services)", sw, n / sw, sc, n / sc
    printf "%-34s %9s %9s %8.2f %10.0f\n", "services + kafka mock + postgres", "", "", sc + si, n / (sc + si)
    printf "ratio services/embedded: %.0f%% of docs/s (wall), %.0f%% of docs per CPU s (%.0f%% with kafka+pg); target >= 70%% (wall)\n",
        100 * ew / sw, 100 * ec / sc, 100 * ec / (sc + si) }'
awk -v n="$records" -v ew="$e_wall" -v ec="$e_cpu" -v sw="$k_wall" -v sc="$k_cpu" -v si="$k_infra" 'BEGIN {
    printf "%-34s %9.2f %9.0f %8.2f %10.0f\n", "services, Kafka source feed", sw, n / sw, sc, n / sc
    printf "%-34s %9s %9s %8.2f %10.0f\n", "  + kafka mock + postgres", "", "", sc + si, n / (sc + si)
    printf "ratio Kafka-source services/embedded: %.0f%% of docs/s (wall), %.0f%% of docs per CPU s (%.0f%% with kafka+pg)\n",
        100 * ew / sw, 100 * ec / sc, 100 * ec / (sc + si) }'
python3 - "$work/emb.walls" "$work/push.walls" "$work/kafka.walls" "$records" <<'PY'
import statistics, sys
e = [float(x) for x in open(sys.argv[1])]
n = int(sys.argv[4])
for name, path in (("services (push)", sys.argv[2]), ("services (Kafka source)", sys.argv[3])):
    s = [float(x) for x in open(path)]
    r = [a / b for a, b in zip(e, s)]
    print(f"median of {len(e)} interleaved runs: embedded {statistics.median(e):.2f} s, {name} "
          f"{statistics.median(s):.2f} s ({n / statistics.median(s):.0f} docs/s); median per-pair "
          f"ratio {100 * statistics.median(r):.0f}%")
PY
echo "push client: $s_client CPU s of those; summary $(cat "$work/push.json")"
k_kept=$(sql "SELECT sum(docs_out) FROM stage_progress WHERE run_id = '$k_run' AND stage = 'dedup'")
echo "kafka feed client: $k_client CPU s; $(cat "$work/feed.out") messages of $FEED_LINES lines"
echo "kept after dedup: embedded $emb_kept, services $svc_kept (push), $k_kept (Kafka source)"
echo "load average: $(cut -d" " -f1-3 /proc/loadavg) on $(nproc) CPUs"
echo "stage_progress of $s_run (stage|in|out|rejected|duplicate|batches):"
echo "$counts" | sed 's/^/  /'
echo "stage_progress of $k_run:"
sql "SELECT stage, sum(docs_in), sum(docs_out), sum(rejected), sum(duplicate), count(*)
     FROM stage_progress WHERE run_id = '$k_run' GROUP BY stage ORDER BY stage" | sed 's/^/  /'

# ---- latency under load -------------------------------------------------------
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
pids=()
tail -n +2 "$SHARED/data/sst2/dev.tsv" | cut -f1 >"$work/sst2.txt"
"$BUILD/refinery-tokenizer" --tokenizer "$tok" --listen 127.0.0.1:0 --port-file "$work/tok2.port" \
    2>"$work/tokenizer2.log" &
pids+=($!)
model=$PWD/build/models/minilm-l6
[ -f "$model/model.safetensors" ] || model=$PWD/tests/fixtures/trainer/exported
sql "INSERT INTO runs (id, spec) VALUES ('classify', '{}')" >/dev/null
sql "INSERT INTO checkpoints (run_id, step, path, train_loss) VALUES ('classify', 1, '$model', 0)" >/dev/null
env -u KAFKA_BOOTSTRAP "$BUILD/refinery-evaluator" --listen 127.0.0.1:0 --port-file "$work/eval.port" \
    2>"$work/evaluator.log" &
pids+=($!)
for _ in $(seq 300); do [ -s "$work/tok2.port" ] && [ -s "$work/eval.port" ] && break; sleep 0.1; done
[ -s "$work/eval.port" ] || { echo "refinery-evaluator did not start" >&2; cat "$work/evaluator.log" >&2; exit 1; }

awk '{ a[NR] = $0 } END { for (i = 0; i < 100000; i++) print a[i % NR + 1] }' "$work/sst2.txt" >"$work/sst2x.txt"
/usr/bin/time -f '%e' -o "$work/tokref.time" "$BUILD/refinery" tokenize --tokenizer "$tok" \
    --input "$work/sst2x.txt" --threads 2 >/dev/null
echo
echo "latency under load: refinery-loadgen, SST-2 dev sentences, closed loop, ${SECONDS_EACH} s per row"
printf '%-9s %7s %5s | %9s %9s | %8s %8s %8s %8s %8s | %6s %8s\n' method clients batch "req/s" "texts/s" \
    "mean ms" "p50 ms" "p90 ms" "p99 ms" "max ms" errors "client CPU"
load() { # METHOD TARGET CLIENTS BATCH [extra flags]
    local m=$1 t=$2 c=$3 b=$4
    shift 4
    "$BUILD/refinery-loadgen" --method "$m" --target "$t" --texts "$work/sst2.txt" --clients "$c" \
        --batch "$b" --duration "$SECONDS_EACH" --warmup 0.5 "$@" | python3 -c '
import json, sys
d = json.load(sys.stdin)
l = d.get("latency_ms", {})
print("%-9s %7d %5d | %9.1f %9.1f | %8.2f %8.2f %8.2f %8.2f %8.2f | %6d %8.2f" % (
    d["method"], d["clients"], d["batch"], d.get("requests_per_s", 0), d.get("texts_per_s", 0),
    l.get("mean", 0), l.get("p50", 0), l.get("p90", 0), l.get("p99", 0), l.get("max", 0),
    d["error_total"], d["client_cpu_seconds"]))'
}
tok_target=127.0.0.1:$(cat "$work/tok2.port")
eval_target=127.0.0.1:$(cat "$work/eval.port")
for b in 1 8; do
    for c in 1 4 16; do load tokenize "$tok_target" $c $b; done
done
# The first Classify loads the model: one call before measuring.
"$BUILD/refinery-loadgen" --method classify --target "$eval_target" --run classify \
    --texts "$work/sst2.txt" --clients 1 --requests 1 --timeout 120 >/dev/null
for b in 1 8; do
    for c in 1 4; do load classify "$eval_target" $c $b --run classify --timeout 60; done
done
awk -v t="$(cat "$work/tokref.time")" 'BEGIN { printf "in-process reference: refinery tokenize --threads 2, 100000 SST-2 dev lines: %.0f texts/s (whole process, %.2f s)\n", 100000 / t, t }'
echo "Classify model: $model (a classifier head missing from the checkpoint is initialised: latency only)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"

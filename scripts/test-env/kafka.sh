#!/usr/bin/env bash
# A mock Kafka cluster for tests: build/refinery-kafka-mock (librdkafka's
# rdkafka_mock, 3 brokers on 127.0.0.1, real Kafka protocol) as a background
# process.
#
#   kafka.sh start DIR [BROKERS]   start it; writes DIR/kafka.env (exports KAFKA_BOOTSTRAP)
#   kafka.sh cmd DIR "down 2"      send a command (down N, up N, topic NAME PARTS)
#                                  and wait for its answer
#   kafka.sh stop DIR              SIGTERM it and wait
#
# KAFKA_MOCK_BIN overrides the helper's path (default $REFINERY_BUILD or build/).
set -euo pipefail
cmd=${1:?usage: kafka.sh start|cmd|stop DIR}
dir=${2:?usage: kafka.sh start|cmd|stop DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${KAFKA_MOCK_BIN:-${REFINERY_BUILD:-$root/build}/refinery-kafka-mock}

case $cmd in
start)
    [ -x "$bin" ] || { echo "kafka.sh: missing $bin (run make)" >&2; exit 1; }
    mkdir -p "$dir"
    rm -f "$dir/kafka.ctl" "$dir/kafka.bootstrap"
    "$bin" --brokers "${3:-3}" --control "$dir/kafka.ctl" --bootstrap-file "$dir/kafka.bootstrap" \
        </dev/null >"$dir/kafka.out" 2>"$dir/kafka.log" &
    echo $! >"$dir/kafka.pid"
    for _ in $(seq 100); do
        [ -s "$dir/kafka.bootstrap" ] && [ -p "$dir/kafka.ctl" ] && break
        kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null || break
        sleep 0.05
    done
    [ -s "$dir/kafka.bootstrap" ] || { echo "kafka.sh: mock did not start" >&2; cat "$dir/kafka.log" >&2; exit 1; }
    echo "export KAFKA_BOOTSTRAP=$(cat "$dir/kafka.bootstrap")" >"$dir/kafka.env"
    echo "kafka.sh: mock cluster at $(cat "$dir/kafka.bootstrap")" >&2
    ;;
cmd)
    line=${3:?kafka.sh cmd DIR "COMMAND"}
    before=$(wc -l <"$dir/kafka.out")
    echo "$line" >"$dir/kafka.ctl"
    for _ in $(seq 100); do
        [ "$(wc -l <"$dir/kafka.out")" -gt "$before" ] && break
        sleep 0.05
    done
    answer=$(tail -n +"$((before + 1))" "$dir/kafka.out" | head -n 1)
    [[ $answer == ok* ]] || { echo "kafka.sh: '$line': ${answer:-no answer}" >&2; exit 1; }
    ;;
stop)
    [ -f "$dir/kafka.pid" ] || exit 0
    pid=$(cat "$dir/kafka.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "kafka.sh: mock did not stop on SIGTERM, killing it" >&2
        kill -KILL "$pid"
    fi
    rm -f "$dir/kafka.pid"
    ;;
*)
    echo "kafka.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac

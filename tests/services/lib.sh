# Sourced by tests/services/*.test.sh: a private temporary directory, a real
# PostgreSQL and/or the mock Kafka cluster in it, everything stopped and
# removed when the script exits, whether it passed or not.
#
#   . "$REFINERY_ROOT/tests/services/lib.sh"
#   env_start pg kafka      # exports REFINERY_PG / KAFKA_BOOTSTRAP; sets $TEST_DIR
#   env_track_pid PID       # a background process to SIGTERM at exit
set -euo pipefail
cd "$REFINERY_ROOT"
# Every service serves gRPC (dedup and the trainer their health) on a fixed
# default port; tests take a free one unless they say --listen.
export REFINERY_LISTEN=127.0.0.1:0
# Likewise /metrics (a busy default port only warns, but a free one is quieter).
export REFINERY_METRICS_LISTEN=127.0.0.1:0
TEST_DIR=$(mktemp -d /tmp/rf-svc-test.XXXXXX)
_env_pids=()
_env_pg=0 _env_kafka=0

_env_cleanup() {
    local rc=$?
    for p in "${_env_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${_env_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    [ $_env_kafka -eq 1 ] && "$REFINERY_ROOT"/scripts/test-env/kafka.sh stop "$TEST_DIR" || true
    [ $_env_pg -eq 1 ] && "$REFINERY_ROOT"/scripts/test-env/pg.sh stop "$TEST_DIR" || true
    if [ $rc -ne 0 ]; then
        for f in "$TEST_DIR"/*.log; do
            [ -f "$f" ] && { echo "--- $f"; tail -n 30 "$f"; }
        done
    fi
    rm -rf "$TEST_DIR"
    exit $rc
}
trap _env_cleanup EXIT

env_start() {
    for what in "$@"; do
        case $what in
        pg)
            _env_pg=1
            scripts/test-env/pg.sh start "$TEST_DIR"
            set -a; . "$TEST_DIR/pg.env"; set +a
            ;;
        kafka)
            _env_kafka=1
            scripts/test-env/kafka.sh start "$TEST_DIR"
            set -a; . "$TEST_DIR/kafka.env"; set +a
            ;;
        *) echo "env_start: unknown $what" >&2; return 1 ;;
        esac
    done
}

env_track_pid() { _env_pids+=("$1"); }

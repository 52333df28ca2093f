#!/usr/bin/env bash
# A throwaway PostgreSQL server for tests: initdb into DIR/data, listen on a
# free port of 127.0.0.1 only, unix socket in DIR, no fsync (test data only).
#
#   pg.sh start DIR     start it; writes DIR/pg.env (exports PGHOST, PGPORT, PGUSER,
#                       PGDATABASE, REFINERY_PG = a libpq connection string:
#                       `. DIR/pg.env` makes them the services' environment)
#                       and DIR/pg.conninfo (the connection string alone).
#                       With PG_OWNER_PID set, a watchdog stops the server and
#                       removes DIR once that process is gone (even if killed).
#   pg.sh stop DIR      stop it (fast shutdown); DIR stays
#   pg.sh restart DIR   stop and start again on the same port and data
#
# initdb refuses to run as root, so as root (CI) the server runs as the
# `postgres` system user (created by Debian's postgresql package) and DIR is
# handed to it. PG_BIN overrides the binaries' directory.
set -euo pipefail
cmd=${1:?usage: pg.sh start|stop|restart DIR}
dir=${2:?usage: pg.sh start|stop|restart DIR}
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$PG_BIN/initdb" ] || { echo "pg.sh: no PostgreSQL binaries (install postgresql)" >&2; exit 1; }

as_owner() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start_on() {
    local port=$1
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/pg.log" -w -t 30 \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=50" \
        start >/dev/null
}

write_env() {
    local port=$1
    cat >"$dir/pg.env" <<ENV
export PGHOST=127.0.0.1
export PGPORT=$port
export PGUSER=postgres
export PGDATABASE=postgres
export REFINERY_PG="host=127.0.0.1 port=$port user=postgres dbname=postgres connect_timeout=5"
ENV
    echo "host=127.0.0.1 port=$port user=postgres dbname=postgres connect_timeout=5" >"$dir/pg.conninfo"
}

watchdog() {
    local owner=$1 self
    self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
    (
        while kill -0 "$owner" 2>/dev/null; do sleep 0.5; done
        "$self" stop "$dir" || true
        rm -rf "$dir"
    ) </dev/null >/dev/null 2>&1 &
}

case $cmd in
start)
    mkdir -p "$dir"
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres: "$dir"
        runuser -u postgres -- test -x "$dir" || {
            echo "pg.sh: the postgres user cannot reach $dir (a parent directory is private to root): use a directory of its own, e.g. \$(mktemp -d)" >&2
            exit 1
        }
    fi
    if [ ! -d "$dir/data" ]; then
        as_owner "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync \
            --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
            { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    for _ in 1 2 3 4 5 6 7 8; do
        port=$((20000 + RANDOM % 40000))
        port_free "$port" || continue
        if start_on "$port"; then
            echo "$port" >"$dir/pg.port"
            write_env "$port"
            [ -n "${PG_OWNER_PID:-}" ] && watchdog "$PG_OWNER_PID"
            echo "pg.sh: PostgreSQL on 127.0.0.1:$port (data $dir/data)" >&2
            exit 0
        fi
    done
    echo "pg.sh: could not start PostgreSQL:" >&2
    tail -n 20 "$dir/pg.log" >&2 || true
    exit 1
    ;;
stop)
    [ -f "$dir/data/postmaster.pid" ] || exit 0
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null
    ;;
restart)
    as_owner "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    start_on "$(cat "$dir/pg.port")"
    ;;
*)
    echo "pg.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac

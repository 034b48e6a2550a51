#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests: scripts/postgres.sh {start|stop|url|status}.
#
# start: installs Debian's `postgresql` package if it is missing (apt-get, needs root), creates a
#        cluster in $TUNER_PG_DIR (default /tmp/tuner-pg-$UID), owned by the `postgres` user when
#        run as root (root cannot run postgres), starts it on 127.0.0.1 only (port $TUNER_PG_PORT,
#        default: 55432 if free, else any free port), creates the database `tuner` and prints
#        its SQLAlchemy URL. Starting a cluster that is already running just prints the URL.
# url:   prints that URL.
# stop:  shuts the server down and removes $TUNER_PG_DIR.
# Trust authentication on loopback only: this cluster exists for tests and holds nothing else.
set -euo pipefail

DIR=${TUNER_PG_DIR:-/tmp/tuner-pg-$(id -u)}
DATA=$DIR/data
DB=tuner

log() { echo "postgres.sh: $*" >&2; }

pg_bindir() {
    local initdb
    initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$initdb" ] && command -v initdb >/dev/null 2>&1; then
        initdb=$(command -v initdb)
    fi
    [ -n "$initdb" ] && dirname "$initdb"
}

install_server() {
    if [ -n "$(pg_bindir || true)" ]; then
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        log "the PostgreSQL server is not installed and this is not root: apt-get install postgresql"
        exit 1
    fi
    log "installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
}

# Run a command as the cluster's owner: `postgres` when we are root, else ourselves.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

url() {
    [ -f "$DIR/port" ] || { log "no cluster in $DIR (run: scripts/postgres.sh start)"; exit 1; }
    echo "postgresql+psycopg://postgres@127.0.0.1:$(cat "$DIR/port")/$DB"
}

running() {
    [ -f "$DATA/postmaster.pid" ] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

free_port() {
    python3 - "$1" <<'EOF'
import socket, sys
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
preferred = int(sys.argv[1])
if free(preferred):
    print(preferred)
else:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])
EOF
}

start() {
    install_server
    BIN=$(pg_bindir)
    if running; then
        url
        return
    fi
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$DIR"
    fi
    if [ ! -f "$DATA/PG_VERSION" ]; then
        as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 \
            --no-instructions >"$DIR/initdb.log" 2>&1 \
            || { cat "$DIR/initdb.log" >&2; exit 1; }
    fi
    local port
    port=$(free_port "${TUNER_PG_PORT:-55432}")
    echo "$port" >"$DIR/port"
    # Loopback only, sockets in our own folder, no durability (a test cluster).
    as_owner "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 start -o \
        "-h 127.0.0.1 -p $port -k $DIR -c fsync=off -c synchronous_commit=off \
         -c full_page_writes=off -c max_connections=200" >/dev/null \
        || { tail -n 20 "$DIR/server.log" >&2; exit 1; }
    as_owner "$BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAt \
        -c "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1 \
        || as_owner "$BIN/createdb" -h 127.0.0.1 -p "$port" -U postgres "$DB"
    log "PostgreSQL running on 127.0.0.1:$port (data in $DATA)"
    url
}

stop() {
    BIN=$(pg_bindir || true)
    if [ -n "$BIN" ] && [ -d "$DATA" ] && running; then
        as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null
        log "PostgreSQL in $DATA stopped"
    fi
    case "$DIR" in
        /tmp/*) rm -rf "$DIR" ;;
        *) [ -d "$DATA" ] && rm -rf "$DATA" "$DIR/port" "$DIR/server.log" "$DIR/initdb.log" ;;
    esac
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) url ;;
    status) BIN=$(pg_bindir); running && url ;;
    *) echo "usage: $0 {start|stop|url|status}" >&2; exit 2 ;;
esac

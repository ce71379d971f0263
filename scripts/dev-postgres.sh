#!/usr/bin/env bash
# Throw-away PostgreSQL for tests and local runs (docs/plans.md, "Dev PostgreSQL").
#
#   scripts/dev-postgres.sh install   install PostgreSQL from Debian packages when missing
#   scripts/dev-postgres.sh start     create the cluster if needed and start it (no-op if running)
#   scripts/dev-postgres.sh stop      stop the server (no-op if stopped)
#   scripts/dev-postgres.sh status    exit 0 when running
#   scripts/dev-postgres.sh url       print the SQLAlchemy URL (postgresql+psycopg://...)
#
# Settings (environment):
#   SVC_PG_DATA   cluster directory      (default $HOME/.cache/svc-postgres)
#   SVC_PG_PORT   TCP port on 127.0.0.1  (default 25432)
#   SVC_PG_USER   server OS user when run as root (default postgres; PostgreSQL refuses root)
# The server listens on 127.0.0.1 only; database `svc_test`, role `svc` with password `svc`.
# The default port sits below Linux's ephemeral range (32768-60999), where a client connection's
# local end could already hold it.
# When run as root and the server user cannot reach the default directory (e.g. /root is 0700),
# the cluster goes to /var/tmp/svc-postgres-<user> instead, and the script says so; permissions
# of your home directory are never changed.
set -euo pipefail

PORT="${SVC_PG_PORT:-25432}"
DB=svc_test
ROLE=svc
PASSWORD=svc
SERVER_USER="${SVC_PG_USER:-postgres}"

die() { echo "dev-postgres: $*" >&2; exit 1; }
note() { echo "dev-postgres: $*" >&2; }

find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$d/pg_ctl" && -x "$d/initdb" && -x "$d/postgres" ]]; then echo "$d"; return 0; fi
    done
    if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"; return 0
    fi
    return 1
}

is_root() { [[ "$(id -u)" == 0 ]]; }

# Run a command as the server user (root) or as ourselves.
as_server() {
    if is_root; then runuser -u "$SERVER_USER" -- "$@"; else "$@"; fi
}

data_dir() {
    local dir="${SVC_PG_DATA:-}"
    if [[ -n "$dir" ]]; then echo "$dir"; return; fi
    dir="${HOME:-/tmp}/.cache/svc-postgres"
    if is_root && ! runuser -u "$SERVER_USER" -- test -x "$(dirname "$dir")" 2>/dev/null; then
        local fallback="/var/tmp/svc-postgres-$SERVER_USER"
        [[ -n "${QUIET:-}" ]] || note "$SERVER_USER cannot reach $(dirname "$dir"); using $fallback (set SVC_PG_DATA to choose)"
        dir="$fallback"
    fi
    echo "$dir"
}

cmd_install() {
    if find_bindir >/dev/null; then return 0; fi
    is_root || die "PostgreSQL is not installed and installing needs root: apt-get install -y postgresql"
    command -v apt-get >/dev/null || die "PostgreSQL is not installed and apt-get is not available"
    note "installing PostgreSQL from Debian packages"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
    find_bindir >/dev/null || die "PostgreSQL binaries not found after installing"
}

running() {
    local bindir dir
    bindir="$(find_bindir)" || return 1
    dir="$(QUIET=1 data_dir)"
    [[ -f "$dir/data/PG_VERSION" ]] || return 1
    as_server "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1
}

psql_admin() {
    local bindir="$1" dir="$2"; shift 2
    as_server "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/run" -p "$PORT" -U postgres -d postgres "$@"
}

cmd_start() {
    cmd_install
    local bindir dir
    bindir="$(find_bindir)"
    dir="$(data_dir)"
    if is_root; then id -u "$SERVER_USER" >/dev/null 2>&1 || die "no OS user $SERVER_USER (set SVC_PG_USER)"; fi
    mkdir -p "$dir"
    if is_root; then chown "$SERVER_USER": "$dir"; fi
    as_server mkdir -p "$dir/run"
    if [[ ! -f "$dir/data/PG_VERSION" ]]; then
        note "creating cluster in $dir/data"
        as_server "$bindir/initdb" -D "$dir/data" -U postgres --auth-local=trust \
            --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
    fi
    # A server left running on another port (SVC_PG_PORT changed, or an older default) is restarted
    # on this one: url must name where it listens. Line 4 of postmaster.pid is its port.
    if as_server "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1 \
        && [[ "$(sed -n 4p "$dir/data/postmaster.pid" 2>/dev/null)" != "$PORT" ]]; then
        note "server in $dir/data listens on another port; restarting it on $PORT"
        as_server "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
    if ! as_server "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $PORT -k $dir/run -c fsync=off" start >/dev/null \
            || { tail -n 20 "$dir/server.log" >&2; die "server did not start (log: $dir/server.log)"; }
    fi
    # After a crash (kill -9 of the server) the backends of the old server may still hold its
    # shared memory for a moment, and a server started then exits again: wait until one
    # accepts connections, starting it again while none runs (up to 60 s).
    local tries=0
    until psql_admin "$bindir" "$dir" -c "SELECT 1" >/dev/null 2>&1; do
        tries=$((tries + 1))
        if (( tries > 60 )); then
            tail -n 20 "$dir/server.log" >&2
            die "server does not accept connections (log: $dir/server.log)"
        fi
        if ! as_server "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
            as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
                -o "-c listen_addresses=127.0.0.1 -p $PORT -k $dir/run -c fsync=off" start \
                >/dev/null 2>&1 || true
        fi
        sleep 1
    done
    # Role and database (idempotent).
    psql_admin "$bindir" "$dir" <<SQL
SELECT 'CREATE ROLE $ROLE LOGIN PASSWORD ''$PASSWORD''' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE')\gexec
SELECT 'CREATE DATABASE $DB OWNER $ROLE' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB')\gexec
SQL
}

cmd_stop() {
    local bindir dir
    bindir="$(find_bindir)" || return 0
    dir="$(QUIET=1 data_dir)"
    [[ -f "$dir/data/PG_VERSION" ]] || return 0
    if as_server "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        as_server "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    fi
}

cmd_url() {
    echo "postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) running ;;
    url) cmd_url ;;
    *) echo "usage: $0 {install|start|stop|status|url}" >&2; exit 2 ;;
esac

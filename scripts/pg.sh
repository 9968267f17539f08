#!/usr/bin/env bash
# A throwaway PostgreSQL for tests and benchmarks: initdb into DIR, listening only on 127.0.0.1 on
# a free port (and a unix socket inside DIR), trust authentication. Installs Debian's
# `postgresql` when initdb/pg_ctl are missing.
#
#   scripts/pg.sh start DIR   prints the server's URL (postgres://postgres@127.0.0.1:PORT/postgres)
#   scripts/pg.sh stop DIR    pg_ctl stop -m fast, then removes DIR
#
# initdb and postgres refuse to run as root: as root they run as the `postgres` user (created by
# the Debian package), and DIR is made theirs.
set -euo pipefail
usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd="$1" dir="$2"

find_bindir() {
    local d
    if command -v pg_config >/dev/null; then
        d=$(pg_config --bindir 2>/dev/null || true)
        [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
    fi
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
    done
    d=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return; }
    return 1
}

# as_owner CMD...: runs CMD as the postgres user when we are root, else as ourselves.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        if command -v runuser >/dev/null; then runuser -u postgres -- "$@"; else setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; fi
    else
        "$@"
    fi
}

case "$cmd" in
start)
    bindir=$(find_bindir || true)
    if [ -z "$bindir" ]; then
        echo "pg.sh: installing postgresql" >&2
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
        bindir=$(find_bindir) || { echo "pg.sh: initdb/pg_ctl not found after installing postgresql" >&2; exit 1; }
    fi
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    chmod 700 "$dir"
    # A free port: bind to port 0 and read back what the kernel gave (released before postgres binds it).
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log" >&2; exit 1; }
    # fsync stays on (the default): durability tests kill opqd, not postgres, but the figures
    # measured on it should be those of a real server.
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir -c max_connections=200" start >/dev/null ||
        { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    [ -d "$dir" ] || exit 0
    bindir=$(find_bindir || true)
    if [ -n "$bindir" ] && [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
    fi
    rm -rf "$dir"
    ;;
*) usage ;;
esac

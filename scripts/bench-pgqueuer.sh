#!/usr/bin/env bash
# pgqueuer (PyPI) beside opqd `--store postgres://` on ONE PostgreSQL server, in one run (issue 24):
# 4 producer and 8 worker processes in Python for each, N no-op jobs, each system's own batch API,
# synchronous_commit=on (checked and printed), every completion committed. Prints jobs/s for
# each system in three phases, CPU per 1,000 jobs, a table, and a JSON object as the last line.
#
# What each side does per job (scripts/bench_pgqueuer.py has the details):
#   pgqueuer  producers: Queries.enqueue with lists, --enqueue-batch jobs per call (one statement,
#             one commit). Workers: PgQueuer's QueueManager.run(batch_size=--batch), an async
#             no-op entrypoint, pgqueuer's defaults otherwise: one dequeue statement picks up to
#             --batch jobs (one commit), completions are committed by its JobStatusLogBuffer in
#             one DELETE+INSERT-into-log statement per --batch jobs or per ~0.1 s. Its tables are
#             logged (durability `durable`, the default).
#   opqd      one instance, `--store postgres://...` (partitioned cluster mode, the default).
#             Producers: POST /v1/operations:batch with --enqueue-batch `external` operations
#             (201 after its commit). Workers: POST /v1/queues/{q}/claim?wait=1&max=--batch, then
#             one POST /v1/operations:finish for all of them (200 after its commit), on one
#             http.client keep-alive connection per process. The queue's
#             maxConcurrentOperationCount is workers x batch (as in `opqd-bench workers`).
# Phases, each with a timeout (--timeout, default 120 s), the systems alternating who goes first
# each round: enqueue (producers alone: from the start signal to the last producer's last
# answer), drain (workers alone on the N jobs the enqueue left: to the last completion), e2e
# (producers and workers together on N new jobs: from the start signal to the last completion).
# Every client connects before the clock starts. CPU: utime+stime of the opqd process and of
# PostgreSQL (postmaster + children, /proc) before/after each phase; the clients' own CPU too;
# PostgreSQL's xact_commit per database, WAL bytes and WAL syncs; opqd's store commits (/metrics).
#
# pgqueuer, asyncpg and psycopg are installed from PyPI into a venv in a scratch directory when
# the script runs (removed at exit, unless --venv DIR names one to keep and reuse).
# Usage: scripts/bench-pgqueuer.sh [--jobs 20000] [--producers 4] [--workers 8] [--batch 100]
#          [--enqueue-batch 1000] [--rounds 1] [--timeout 120] [--pgqueuer-version 1.6.0] [--venv DIR]
#          [--postgres URL]   (a server this script may create databases on; default: a throwaway
#                              one from scripts/pg.sh, stopped at exit)
#          [--statements]     (the throwaway server restarted with pg_stat_statements, and each
#                              phase's top statements printed: where PostgreSQL's time goes; it
#                              costs PostgreSQL some CPU, so the figures of such a run are not
#                              the ones to quote)
# OPQD_BIN=/path/to/opqd uses that binary instead of building .build/release/opqd.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
jobs=20000; producers=4; workers=8; batch=100; enqueue_batch=1000; rounds=1; timeout=120
pgq_version=1.6.0; venv=""; postgres=""; statements=""
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) jobs="$2"; shift 2 ;;
        --producers) producers="$2"; shift 2 ;;
        --workers) workers="$2"; shift 2 ;;
        --batch) batch="$2"; shift 2 ;;
        --enqueue-batch) enqueue_batch="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --timeout) timeout="$2"; shift 2 ;;
        --pgqueuer-version) pgq_version="$2"; shift 2 ;;
        --venv) venv="$2"; shift 2 ;;
        --postgres) postgres="$2"; shift 2 ;;
        --statements) statements=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
for v in "$jobs" "$producers" "$workers" "$batch" "$enqueue_batch" "$rounds" "$timeout"; do
    case "$v" in ''|*[!0-9]*) echo "not a positive integer: '$v'" >&2; exit 2 ;; esac
done
if [ "$batch" -lt 1 ] || [ "$batch" -gt 100 ]; then echo "--batch is 1..100 (opqd's claim max)" >&2; exit 2; fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/opqd-bench-pgqueuer.XXXXXX")
pids=()
pg_dir=""
databases=()
cleanup() {
    for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null || true; done
    if [ -n "$postgres" ] && [ -z "$pg_dir" ]; then
        for d in ${databases[@]+"${databases[@]}"}; do
            psql "$postgres" -qAtc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
        done
    fi
    if [ -n "$pg_dir" ]; then scripts/pg.sh stop "$pg_dir" >/dev/null 2>&1 || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# pgqueuer and its drivers, only now, only into a venv of this run (or the one --venv names).
if [ -z "$venv" ]; then venv="$tmp/venv"; fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import pgqueuer, asyncpg, psycopg, sys; sys.exit(pgqueuer.__version__ != '$pgq_version')" 2>/dev/null; then
    echo "installing pgqueuer==$pgq_version asyncpg psycopg into $venv" >&2
    timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check "pgqueuer==$pgq_version" asyncpg psycopg >&2
fi

if [ -n "${OPQD_BIN:-}" ]; then
    opqd="$OPQD_BIN"
else
    swift build -c release --product opqd >&2
    opqd=.build/release/opqd
fi

if [ -z "$postgres" ]; then
    # Beside $tmp, not in it: the postgres user must be able to reach it (pg.sh makes it theirs).
    pg_dir=$(mktemp -d "${TMPDIR:-/tmp}/opqd-bench-pgqueuer-pg.XXXXXX")
    server=$(scripts/pg.sh start "$pg_dir")
    if [ -n "$statements" ]; then
        bindir=$(psql "$server" -qAtc "SELECT setting FROM pg_config WHERE name = 'BINDIR'")
        psql "$server" -qAtc "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'" >/dev/null
        as_postgres=()
        if [ "$(id -u)" = 0 ]; then as_postgres=(runuser -u postgres --); fi  # as pg.sh runs it
        "${as_postgres[@]}" "$bindir/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 60 -m fast restart >/dev/null
        psql "$server" -qAtc "CREATE EXTENSION pg_stat_statements" >/dev/null
    fi
else
    [ -z "$statements" ] || { echo "--statements needs the throwaway server (no --postgres)" >&2; exit 2; }
    server="$postgres"
fi
# Databases of this run on the server (dropped at exit when the server is not ours; a throwaway
# server goes whole).
suffix="$$_$RANDOM"
pgq_db="pgq_bench_$suffix"; opqd_db="opqd_bench_$suffix"
for d in "$pgq_db" "$opqd_db"; do
    psql "$server" -qAtc "CREATE DATABASE $d" >/dev/null
    databases+=("$d")
done
db_url() { # the server's URL with another database
    python3 -c 'import sys, urllib.parse as u; s = u.urlsplit(sys.argv[1]); print(u.urlunsplit(s._replace(path="/" + sys.argv[2])))' "$1" "$2"
}

# (The URL is worked out first: a command substitution in a background command's words would run
# in the forked child, which could run the EXIT trap there.)
opqd_store=$(db_url "$server" "$opqd_db")
"$opqd" --host 127.0.0.1 --port 0 --store "$opqd_store" --data "$tmp/opqd-data" \
    --log-level error --max-unfinished 100000000 --max-unfinished-per-queue 100000000 \
    >"$tmp/opqd.out" 2>"$tmp/opqd.err" &
opqd_pid=$!
pids+=("$opqd_pid")
port=""
for _ in $(seq 1 600); do
    port=$(sed -n 's#.*listening on http://[^:]*:\([0-9]*\).*#\1#p' "$tmp/opqd.out" | head -1)
    [ -n "$port" ] && break
    kill -0 "$opqd_pid" 2>/dev/null || break
    sleep 0.05
done
[ -n "$port" ] || { echo "opqd did not start:" >&2; cat "$tmp/opqd.err" >&2; exit 1; }
for _ in $(seq 1 600); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.05
done
curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { echo "opqd not ready after 30 s:" >&2; tail -5 "$tmp/opqd.err" >&2; exit 1; }
echo "opqd: $opqd (pid $opqd_pid, port $port)" >&2

# Six phases a round, each bounded by --timeout inside; this bounds the whole of it too.
limit=$(( rounds * 6 * (timeout + 90) + 120 ))
timeout --signal=TERM --kill-after=10 "$limit" \
    "$venv/bin/python" scripts/bench_pgqueuer.py --pg-url "$server" --pgq-db "$pgq_db" --opqd-db "$opqd_db" \
    --opqd-url "http://127.0.0.1:$port" --opqd-pid "$opqd_pid" --jobs "$jobs" --producers "$producers" \
    --workers "$workers" --batch "$batch" --enqueue-batch "$enqueue_batch" --rounds "$rounds" --timeout "$timeout" ${statements:+--statements} &
pids+=("$!")
wait "$!"

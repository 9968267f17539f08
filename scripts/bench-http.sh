#!/usr/bin/env bash
# `opqd-bench http`: opqd over libmicrohttpd against a bare C libmicrohttpd server, measured
# with wrk on 127.0.0.1 in the same run, A/B alternated. Prints req/s and p99 for each, the
# ratios to the bare server, and a JSON object as the last line.
#
# opqd runs as shipped (`--store sqlite --sync full`) in a fresh temporary --data dir; the
# POST create row is measured against it, and again against a second opqd with
# `--store memory`, so the cost of durability is visible. Every 2xx create wrk saw must be
# held by the server afterwards (checked through GET /v1/queues/{name}). A last row creates with
# a fresh Idempotency-Key each (bench/post-idempotent.lua): the keyed path, sync full.
#
# Usage: scripts/bench-http.sh [--duration S] [--connections N] [--rounds N] [--quick]
# OPQD_BIN=/path/to/opqd uses that binary instead of building .build/release/opqd.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
duration=8; conns=50; rounds=2
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) duration="$2"; shift 2 ;;
        --connections) conns="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --quick) duration=2; rounds=1; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
scripts/deps.sh bench

tmp=$(mktemp -d "${TMPDIR:-/tmp}/opqd-bench-http.XXXXXX")
out="$tmp/wrk"; mkdir -p "$out"
pids=()
cleanup() {
    for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

gcc -O2 -o "$tmp/bare-mhd" bench/bare-mhd.c -lmicrohttpd -lpthread
if [ -n "${OPQD_BIN:-}" ]; then
    opqd="$OPQD_BIN"
else
    swift build -c release --product opqd >&2
    opqd=.build/release/opqd
fi
echo "opqd: $opqd; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# Starts opqd on port 0 with the given extra flags; sets $started_port.
start_opqd() {
    local name="$1"; shift
    # The create runs leave hundreds of thousands of operations in one suspended queue: lift the
    # unfinished-operation limits (defaults 100000 per queue, 1000000 in all), or they measure 429s.
    "$opqd" --host 127.0.0.1 --port 0 --threads 2 --log-level error --event-capacity 100000 \
        --max-unfinished-per-queue 100000000 --max-unfinished 100000000 "$@" \
        >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
    started_port=""
    for _ in $(seq 1 300); do
        started_port=$(sed -n 's#.*listening on http://[^:]*:\([0-9]*\).*#\1#p' "$tmp/$name.out" | head -1)
        [ -n "$started_port" ] && break
        sleep 0.05
    done
    [ -n "$started_port" ] || { echo "opqd ($name) did not start:" >&2; cat "$tmp/$name.err" >&2; exit 1; }
    curl -fs "http://127.0.0.1:$started_port/healthz" >/dev/null
}

bare_port=$(( 20000 + RANDOM % 10000 ))
"$tmp/bare-mhd" "$bare_port" >/dev/null &
pids+=($!)
# Room for every keyed create's kept answer (the defaults, 100,000 keys and 64 MiB, would
# refuse new keys with 429 within a few seconds of this load).
start_opqd sqlite --store sqlite --sync full --data "$tmp/data-sqlite" --max-idempotency-keys 10000000 --max-idempotency-bytes 17179869184
O="http://127.0.0.1:$started_port"
start_opqd memory --store memory --data "$tmp/data-memory"
M="http://127.0.0.1:$started_port"
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$bare_port/" >/dev/null 2>&1 && break; sleep 0.05; done

curl -fs -XPOST "$O/v1/queues" -d '{"name":"bench","isSuspended":true}' >/dev/null
curl -fs -XPOST "$O/v1/queues" -d '{"name":"creates","isSuspended":true}' >/dev/null
curl -fs -XPOST "$O/v1/queues" -d '{"name":"keyed","isSuspended":true}' >/dev/null
curl -fs -XPOST "$M/v1/queues" -d '{"name":"creates","isSuspended":true}' >/dev/null
id=$(curl -fs -XPOST "$O/v1/queues/bench/operations" -d '{"kind":"delay","spec":{"seconds":1},"name":"polled"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
etag=$(curl -fsI "$O/v1/operations/$id" | tr -d '\r' | awk -F': ' 'tolower($1)=="etag"{print $2}')

run() { # name, then wrk args
    local name="$1"; shift
    wrk -t2 -c"$conns" -d"${duration}s" --latency "$@" > "$out/$name.$r.txt" 2>&1
}
for r in $(seq 1 "$rounds"); do
    run bare "http://127.0.0.1:$bare_port/"
    run get "$O/v1/operations/$id"
    run bare "http://127.0.0.1:$bare_port/"
    run poll304 -H "If-None-Match: $etag" "$O/v1/operations/$id"
    run bare "http://127.0.0.1:$bare_port/"
    run create -s bench/post.lua "$O/v1/queues/creates/operations"
    run bare "http://127.0.0.1:$bare_port/"
    run create_memory -s bench/post.lua "$M/v1/queues/creates/operations"
    run bare "http://127.0.0.1:$bare_port/"
    run create_keyed -s bench/post-idempotent.lua "$O/v1/queues/keyed/operations"
done
sleep 0.3
# Every create wrk saw acknowledged (2xx) must be held by the server.
created=$(curl -fs "$O/v1/queues/creates" | python3 -c 'import json,sys; print(json.load(sys.stdin)["operationCount"])')
created_memory=$(curl -fs "$M/v1/queues/creates" | python3 -c 'import json,sys; print(json.load(sys.stdin)["operationCount"])')
created_keyed=$(curl -fs "$O/v1/queues/keyed" | python3 -c 'import json,sys; print(json.load(sys.stdin)["operationCount"])')
python3 scripts/bench_http_report.py "$out" "$created" "$created_memory" "$conns" "$created_keyed"

#!/usr/bin/env bash
# `opqd-bench http`: opqd over libmicrohttpd against a bare C libmicrohttpd server, measured
# with wrk on 127.0.0.1 in the same run, A/B alternated. Prints req/s and p99 for each, the
# ratios to the bare server, and a JSON object as the last line.
#
# opqd runs as shipped (`--store sqlite --sync full`) in a fresh temporary --data dir; the
# POST create row is measured against it, and again against a second opqd with
# `--store memory`, so the cost of durability is visible. Every 2xx create wrk saw must be
# held by the server afterwards (checked through GET /v1/queues/{name}).
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
start_opqd sqlite --store sqlite --sync full --data "$tmp/data-sqlite"
O="http://127.0.0.1:$started_port"
start_opqd memory --store memory --data "$tmp/data-memory"
M="http://127.0.0.1:$started_port"
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$bare_port/" >/dev/null 2>&1 && break; sleep 0.05; done

curl -fs -XPOST "$O/v1/queues" -d '{"name":"bench","isSuspended":true}' >/dev/null
curl -fs -XPOST "$O/v1/queues" -d '{"name":"creates","isSuspended":true}' >/dev/null
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
done
sleep 0.3
# Every create wrk saw acknowledged (2xx) must be held by the server.
created=$(curl -fs "$O/v1/queues/creates" | python3 -c 'import json,sys; print(json.load(sys.stdin)["operationCount"])')
created_memory=$(curl -fs "$M/v1/queues/creates" | python3 -c 'import json,sys; print(json.load(sys.stdin)["operationCount"])')
python3 - "$out" "$created" "$created_memory" "$conns" <<'PY'
import glob, json, re, sys, os
out, created, created_memory, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def parse(path):
    t = open(path).read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
    p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
    errs = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    total = int(re.search(r"(\d+) requests in", t).group(1))
    return rps, p99, int(errs.group(1)) if errs else 0, sock.group(1) if sock else "", total
names = ["bare", "get", "poll304", "create", "create_memory"]
res = {}
for name in names:
    runs = [parse(p) for p in sorted(glob.glob(f"{out}/{name}.*.txt"))]
    best = max(runs, key=lambda x: x[0])
    res[name] = {"rps": best[0], "p99_ms": best[1], "non2xx": sum(r[2] for r in runs), "socket": [r[3] for r in runs if r[3]],
                 "all_rps": [round(r[0]) for r in runs], "ok": sum(r[4] - r[2] for r in runs)}
bare = res["bare"]["rps"]
print(f"{'workload':<34}{'req/s (best)':>14}{'p99 ms':>10}{'ratio':>8}  runs")
labels = {"bare": "bare C libmicrohttpd", "get": "GET /v1/operations/{id}", "poll304": "If-None-Match -> 304",
          "create": "POST create (sqlite, sync full)", "create_memory": "POST create (--store memory)"}
for k in names:
    r = res[k]
    print(f"{labels[k]:<34}{r['rps']:>14,.0f}{r['p99_ms']:>10.2f}{r['rps']/bare:>8.2f}  {r['all_rps']}" + (f"  non-2xx/3xx: {r['non2xx']}" if r['non2xx'] else "") + (f"  socket errors: {r['socket']}" if r['socket'] else ""))
lost = max(0, res["create"]["ok"] - created)
lost_memory = max(0, res["create_memory"]["ok"] - created_memory)
print(f"creates acknowledged (2xx seen by wrk) / held by the server: sqlite {res['create']['ok']} / {created}, memory {res['create_memory']['ok']} / {created_memory}")
print(f"durable / memory create ratio: {res['create']['rps'] / res['create_memory']['rps']:.3f}")
if lost or lost_memory:
    print(f"!!!! LOST ACKNOWLEDGED CREATES: sqlite {lost}, memory {lost_memory}")
summary = {
    "bare_rps": round(bare), "get_rps": round(res["get"]["rps"]), "poll304_rps": round(res["poll304"]["rps"]), "create_rps": round(res["create"]["rps"]),
    "get_ratio": round(res["get"]["rps"] / bare, 3), "poll304_ratio": round(res["poll304"]["rps"] / bare, 3), "create_ratio": round(res["create"]["rps"] / bare, 3),
    "bare_p99_ms": res["bare"]["p99_ms"], "get_p99_ms": res["get"]["p99_ms"], "poll304_p99_ms": res["poll304"]["p99_ms"], "create_p99_ms": res["create"]["p99_ms"],
    "connections": conns, "created_operations": created,
    "create_memory_rps": round(res["create_memory"]["rps"]), "create_memory_ratio": round(res["create_memory"]["rps"] / bare, 3),
    "create_memory_p99_ms": res["create_memory"]["p99_ms"], "created_memory_operations": created_memory,
    "create_durable_to_memory_ratio": round(res["create"]["rps"] / res["create_memory"]["rps"], 3),
    "create_store": "sqlite-full", "lost_acknowledged": lost + lost_memory,
}
print(json.dumps(summary))
PY

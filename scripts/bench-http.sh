#!/usr/bin/env bash
# `opqd-bench http`: opqd over libmicrohttpd against a bare C libmicrohttpd server, measured
# with wrk on 127.0.0.1 in the same run, A/B alternated. Prints req/s and p99 for each, the
# ratios to the bare server, and a JSON object as the last line.
# Usage: scripts/bench-http.sh [--duration S] [--connections N] [--rounds N]
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
mkdir -p .build
gcc -O2 -o .build/bare-mhd bench/bare-mhd.c -lmicrohttpd -lpthread
swift build -c release --product opqd >&2

bare_port=$(( 20000 + RANDOM % 10000 )); opqd_port=$(( bare_port + 1 ))
.build/bare-mhd "$bare_port" >/dev/null &
bare_pid=$!
.build/release/opqd --port "$opqd_port" --threads 2 --log-level error --event-capacity 100000 >/dev/null 2>&1 &
opqd_pid=$!
trap 'kill $bare_pid $opqd_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$opqd_port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
O="http://127.0.0.1:$opqd_port"
curl -fs -XPOST "$O/v1/queues" -d '{"name":"bench","isSuspended":true}' >/dev/null
curl -fs -XPOST "$O/v1/queues" -d '{"name":"creates","isSuspended":true}' >/dev/null
id=$(curl -fs -XPOST "$O/v1/queues/bench/operations" -d '{"kind":"delay","spec":{"seconds":1},"name":"polled"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
etag=$(curl -fsI "$O/v1/operations/$id" | tr -d '\r' | awk -F': ' 'tolower($1)=="etag"{print $2}')

out=$(mktemp -d)
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
done
# Every create must have been acknowledged 201: count what the server holds.
created=$(curl -fs "$O/v1/queues/creates" | python3 -c 'import json,sys; print(json.load(sys.stdin)["operationCount"])')
python3 - "$out" "$created" <<'PY'
import glob, json, re, sys, os
out, created = sys.argv[1], int(sys.argv[2])
def parse(path):
    t = open(path).read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    m = re.search(r"99%\s+([\d.]+)(us|ms|s)\b", t)
    p99 = float(m.group(1)) * {"us": 0.001, "ms": 1, "s": 1000}[m.group(2)]
    errs = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", t)
    sock = re.search(r"Socket errors: (.*)", t)
    return rps, p99, int(errs.group(1)) if errs else 0, sock.group(1) if sock else ""
res = {}
for name in ["bare", "get", "poll304", "create"]:
    runs = [parse(p) for p in sorted(glob.glob(f"{out}/{name}.*.txt"))]
    best = max(runs, key=lambda x: x[0])
    res[name] = {"rps": best[0], "p99_ms": best[1], "non2xx": sum(r[2] for r in runs), "socket": [r[3] for r in runs if r[3]],
                 "all_rps": [round(r[0]) for r in runs]}
bare = res["bare"]["rps"]
print(f"{'workload':<28}{'req/s (best)':>14}{'p99 ms':>10}{'ratio':>8}  runs")
labels = {"bare": "bare C libmicrohttpd", "get": "GET /v1/operations/{id}", "poll304": "If-None-Match -> 304", "create": "POST create operation"}
for k in ["bare", "get", "poll304", "create"]:
    r = res[k]
    print(f"{labels[k]:<28}{r['rps']:>14,.0f}{r['p99_ms']:>10.2f}{r['rps']/bare:>8.2f}  {r['all_rps']}" + (f"  non-2xx/3xx: {r['non2xx']}" if r['non2xx'] else "") + (f"  socket errors: {r['socket']}" if r['socket'] else ""))
print(f"operations created and held by the server: {created}")
summary = {
    "bare_rps": round(bare), "get_rps": round(res["get"]["rps"]), "poll304_rps": round(res["poll304"]["rps"]), "create_rps": round(res["create"]["rps"]),
    "get_ratio": round(res["get"]["rps"] / bare, 3), "poll304_ratio": round(res["poll304"]["rps"] / bare, 3), "create_ratio": round(res["create"]["rps"] / bare, 3),
    "bare_p99_ms": res["bare"]["p99_ms"], "get_p99_ms": res["get"]["p99_ms"], "poll304_p99_ms": res["poll304"]["p99_ms"], "create_p99_ms": res["create"]["p99_ms"],
    "connections": int(os.environ.get("CONNS", "50")), "created_operations": created,
}
print(json.dumps(summary))
PY

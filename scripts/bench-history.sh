#!/usr/bin/env bash
# What recording the queues' history costs (issue 28: at most 2% of durable create throughput,
# no extra commit per operation). Builds a release `opqd` at REV (default: the commit before the
# history, cached under /tmp/opqd-bench-baseline/<hash>/opqd) and at the working tree, starts
# both with `--sync full` on their own --data, and runs wrk against each in turn (A/B
# alternated, ROUNDS rounds of SECONDS each, 50 connections) in two shapes:
#   suspended  creates into a suspended queue (only `created` is recorded)
#   running    creates of `delay 0` operations that start and finish (created, started, a wait,
#              a run and an end are recorded for each)
# Prints creates/s per round, the medians and after/before.
#
# usage: scripts/bench-history.sh [--commit REV] [--rounds N] [--seconds S]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
rev="0673aff"; rounds=3; seconds=8
while [ $# -gt 0 ]; do
    case "$1" in
        --commit) rev="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        *) echo "bench-history: unknown option $1" >&2; exit 2 ;;
    esac
done
command -v wrk >/dev/null || { echo "bench-history: needs wrk (apt-get install wrk)" >&2; exit 2; }
base=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "bench-history: no commit '$rev'" >&2; exit 2; }
cache="/tmp/opqd-bench-baseline/$base"
if [ ! -x "$cache/opqd" ]; then
    echo "bench-history: building the baseline opqd at $base (once)" >&2
    mkdir -p "$cache"
    wt=$(mktemp -d /tmp/opqd-baseline-wt.XXXXXX); rmdir "$wt"
    git worktree add --detach --quiet "$wt" "$base"
    if [ -f Package.resolved ]; then cp Package.resolved "$wt/"; fi
    (cd "$wt" && swift build -c release --product opqd >&2)
    cp "$wt/.build/release/opqd" "$cache/opqd"
    git worktree remove --force "$wt"; git worktree prune
fi
echo "bench-history: building this tree's opqd (release)" >&2
swift build -c release --product opqd >&2

tmp=$(mktemp -d /tmp/opqd-bench-history.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
start() { # label binary port
    mkdir -p "$tmp/$1"
    "$2" --port "$3" --data "$tmp/$1" --sync full --log-level warning > "$tmp/$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$3/healthz" >/dev/null && return; sleep 0.1; done
    echo "bench-history: $1 did not start" >&2; exit 1
}
start before "$cache/opqd" 18591
start after .build/release/opqd 18592
for port in 18591 18592; do
    curl -sf -XPOST "http://127.0.0.1:$port/v1/queues" -d '{"name":"s","isSuspended":true}' >/dev/null
    curl -sf -XPOST "http://127.0.0.1:$port/v1/queues" -d '{"name":"r","maxConcurrentOperationCount":64}' >/dev/null
done
cat > "$tmp/s.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"kind":"delay","spec":{"seconds":1}}'
wrk.headers["Content-Type"] = "application/json"
LUA
cat > "$tmp/r.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"kind":"delay","spec":{"seconds":0}}'
wrk.headers["Content-Type"] = "application/json"
LUA
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for shape in s r; do
    name=$([ "$shape" = s ] && echo suspended || echo running)
    b=(); a=()
    for r in $(seq 1 "$rounds"); do
        for side in before after; do
            port=$([ "$side" = before ] && echo 18591 || echo 18592)
            rps=$(wrk -t2 -c50 -d"${seconds}s" -s "$tmp/$shape.lua" "http://127.0.0.1:$port/v1/queues/$shape/operations" | awk '/Requests\/sec/ {print $2}')
            echo "$name round $r $side: $rps creates/s"
            if [ "$side" = before ]; then b+=("$rps"); else a+=("$rps"); fi
        done
    done
    python3 - "$name" "${b[*]}" "${a[*]}" <<'PY'
import statistics, sys
name, b, a = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
mb, ma = statistics.median(b), statistics.median(a)
print(f"{name}: median before {mb:.0f}/s, after {ma:.0f}/s, after/before {ma / mb:.3f}")
PY
done

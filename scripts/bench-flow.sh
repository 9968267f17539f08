#!/usr/bin/env bash
# `opqd-bench flow` with its "before": builds opqd-bench at an older commit (default: the parent
# of the flow-control commit f79a88b) and runs `opqd-bench flow --baseline-bin` with it, so the
# engine flat benchmark is measured before and after flow control in the same run.
#
# The baseline is built in a temporary detached `git worktree` under /tmp with its own build
# directory (several minutes the first time); only its binary is kept, cached by commit hash
# under $OPQD_BENCH_BASELINE_CACHE (default /tmp/opqd-bench-baseline/<hash>/opqd-bench).
#
# Usage: scripts/bench-flow.sh [--commit REV] [opqd-bench flow options, e.g. --quick]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
rev="f79a88b^"
pass=()
while [ $# -gt 0 ]; do
    case "$1" in
        --commit) rev="$2"; shift 2 ;;
        *) pass+=("$1"); shift ;;
    esac
done

base=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "bench-flow: no commit '$rev'" >&2; exit 2; }
cache="${OPQD_BENCH_BASELINE_CACHE:-/tmp/opqd-bench-baseline}/$base"
baseline="$cache/opqd-bench"

if [ ! -x "$baseline" ]; then
    echo "bench-flow: building the baseline opqd-bench at $base (once; cached in $cache)" >&2
    mkdir -p "$cache"
    wt=$(mktemp -d /tmp/opqd-baseline-wt.XXXXXX)
    rmdir "$wt"
    cleanup() {
        git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
        git worktree prune
    }
    trap cleanup EXIT
    git worktree add --detach --quiet "$wt" "$base"
    # The same swift-log as this checkout (Package.resolved is not tracked): the two binaries
    # then differ only by the commits between them, and no network is needed when it is cached.
    if [ -f Package.resolved ]; then cp Package.resolved "$wt/"; fi
    (cd "$wt" && OPQD_BENCH=1 swift build -c release --product opqd-bench >&2)
    cp "$wt/.build/release/opqd-bench" "$baseline.partial"
    mv "$baseline.partial" "$baseline"
    cleanup
    trap - EXIT
fi

OPQD_BENCH=1 swift build -c release --product opqd-bench >&2
echo "bench-flow: baseline $base ($baseline), current $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- Sources Package.swift || echo ' + uncommitted changes')" >&2
exec .build/release/opqd-bench flow --baseline-bin "$baseline" ${pass[@]+"${pass[@]}"}

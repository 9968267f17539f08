#!/usr/bin/env bash
# The whole test suite: swift-format lint, unit and end-to-end tests, the hostile-client suite against the real
# binary, the OpenAPI document (validated, in step with the served copy, and fuzzed by
# schemathesis against a live server, with and without a token), the Docker image's runtime stage
# (scripts/image-check.sh), the dashboard in headless Chromium (scripts/dashboard-check.sh),
# /metrics scraped by a real Prometheus (scripts/metrics-check.sh), libFuzzer on the request path,
# on the http kind's response handling and on the number and date grammars (against their
# oracles), and the suite again under ThreadSanitizer.
# Installs what is missing first. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
scripts/deps.sh test

step() { printf '\n=== %s\n' "$*"; }

# A throwaway PostgreSQL for the PostgreSQL store's tests (scripts/pg.sh installs Debian's
# postgresql when missing); each test makes its own database on it. Stopped and removed at exit.
pg_dir=$(mktemp -d /tmp/opqd-test-pg.XXXXXX)
trap 'scripts/pg.sh stop "$pg_dir"' EXIT
OPQD_TEST_POSTGRES_URL=$(scripts/pg.sh start "$pg_dir")
export OPQD_TEST_POSTGRES_URL

# logged NAME LOG COMMAND...: runs COMMAND with its output shown and kept in LOG; fails the
# suite naming NAME and the exit status. On failure the failing tests' lines are printed again
# last (CI keeps only the tail of a long run's output, and the failures are in its middle).
logged() {
    local name="$1" log="$2"; shift 2
    set +e
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] && return 0
    echo "--- $name: what failed (from $log)"
    grep -E -A3 '✘|error:|failed|Fatal error|fatal error|Segmentation|signal|ThreadSanitizer' "$log" \
        | grep -v -E '^✔|passed after|started\.$' | head -60 || true
    echo "$name failed (exit $rc)"
    exit 1
}

step "swift format lint (.swift-format; scripts/lint.sh --fix rewrites)"
scripts/lint.sh

step "build"
swift build --build-tests

step "dashboard in headless Chromium (scripts/dashboard-check.sh)"
# The page against the debug binary: queues and counts rendered, a change after load shown
# live, a suspend clicked on the page reaches the server, the token form and the read-only
# page, and 100 queues / 100,000 operations under 1 s to first render and 200 KB fetched.
# Installs chromium and websocket-client (into .build-py/) when missing. 1-2 min, most of it
# creating the 100,000 operations.
scripts/embed-dashboard.sh --check
logged "dashboard check" .build/dashboard-output.txt scripts/dashboard-check.sh --binary .build/debug/opqd

step "image (scripts/image-check.sh: the Dockerfile's runtime stage in a debootstrap root, no Docker engine)"
# hadolint, the release binary built as the build stage builds it, the runtime stage's RUN in a
# cached bookworm minbase root, and opqd there as the image's user: healthcheck, a round trip,
# data kept across a restart, exit 0 on SIGTERM. Cold ~1.5 min (debootstrap), warm seconds.
scripts/image-check.sh

step "swift test"
mkdir -p .build
logged "swift test" .build/test-output.txt swift test --skip-build --skip HostileTests --skip PostgresStoreTests --skip StoreConformanceTests \
    --skip PostgresEndToEndTests --skip FollowerReadsTests --skip PartitionOwnerTests --skip '^ClusterTests\.'

step "the PostgreSQL store's suites (a throwaway PostgreSQL from scripts/pg.sh)"
# On their own: they block their threads on a real server (a database per test, outages), and
# beside the timing bounds of the other end-to-end tests they starved them on 2 cores (a
# long poll answered after 12 s instead of 0.5 s in a CI run; FollowerReadsTests' two real
# servers made a 2 s delay miss its 5 s window). StoreConformanceTests runs here whole (its
# memory and SQLite legs with its PostgreSQL one): a test's stores are its arguments.
logged "PostgreSQL tests" .build/postgres-output.txt swift test --skip-build \
    --filter "PostgresStoreTests|StoreConformanceTests|PostgresEndToEndTests|FollowerReadsTests|PartitionOwnerTests"

step "a cluster of three opqd processes on the throwaway PostgreSQL (Tests/ClusterTests)"
# On its own, like the PostgreSQL suites: three real servers per test (one test at a time), with a
# 2 s ownership lease that a starved owner would lose for the wrong reason. `^ClusterTests\.` is the
# target (module), not APITests' ClusterTests suite of GET /v1/cluster. As root it also cuts the
# owner's link with the instances in network namespaces of their own (`ip netns`). About a minute.
logged "cluster tests" .build/cluster-output.txt swift test --skip-build --filter '^ClusterTests\.'

step "hostile clients and targets (Tests/HostileTests, the real binary)"
# On their own: their floods would otherwise load the machine under the timing bounds of the
# other end-to-end tests.
logged "hostile tests" .build/hostile-output.txt swift test --skip-build --filter HostileTests

step "/metrics scraped by a real Prometheus (scripts/metrics-check.sh)"
# Debian's prometheus scrapes a live opqd every second and is asked for series that must have
# changed; the exposition is also parsed strictly by prometheus-client. ~10 s warm.
logged "metrics check" .build/metrics-check-output.txt scripts/metrics-check.sh .build/debug/opqd

step "openapi.yaml"
python3 -m openapi_spec_validator openapi.yaml
scripts/embed-openapi.sh --check

step "schemathesis against a live server"
# Two runs, each on a fresh throwaway server: without a token (every check, stateful phase
# included), then with --token so `ignored_auth` probes every operation without and with a
# wrong token. Together under ~4 minutes.
run_schemathesis() {  # run_schemathesis NAME [opqd options...]; env for schemathesis.sh set by the caller
    local name="$1"; shift
    local log data pid base
    log=$(mktemp); data=$(mktemp -d)
    .build/debug/opqd --port 0 --data "$data" --log-level warning "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
    base=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
    local rc=0
    scripts/schemathesis.sh "$base" || rc=$?
    if ! curl -fsS "$base/healthz" >/dev/null; then echo "$name: server stopped answering after schemathesis"; cat "$log"; rc=1; fi
    kill -TERM $pid 2>/dev/null || true
    if ! wait $pid; then echo "$name: opqd did not exit 0 on SIGTERM"; rc=1; fi
    rm -rf "$data" "$log"
    return $rc
}
st_token="schemathesis-$RANDOM$RANDOM"
st_failed=0
run_schemathesis "schemathesis" || st_failed=1
ST_TOKEN="$st_token" ST_MAX_TIME="${ST_TOKEN_MAX_TIME:-75}" ST_MAX_EXAMPLES="${ST_TOKEN_MAX_EXAMPLES:-10}" \
    run_schemathesis "schemathesis with a token" --token "$st_token" || st_failed=1
[ "$st_failed" -eq 0 ] || { echo "schemathesis failed"; exit 1; }

step "libFuzzer: request path, http responses, number and date grammars (scripts/fuzz.sh, 60 s each)"
# Replays every past finding in Fuzz/regressions first, then fuzzes from the seed corpus;
# fails on any crash, sanitizer report, 500 or malformed answer.
scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

step "swift test under ThreadSanitizer"
# One test at a time: ThreadSanitizer slows everything 5-10x, and the end-to-end tests’
# timing bounds (a long poll answering within its wait, a delay still running) would
# measure the sanitizer's load instead of the server.
# HostileTests are left out: they drive the opqd binary as a separate process (its floods
# under the sanitizer would take many minutes), and what they exercise in-process is the
# same code the other suites run here. ClusterTests too (three opqd processes under the
# sanitizer would lose their 2 s leases to its slowness; they run once, above).
TSAN_OPTIONS="halt_on_error=1" logged "tests under ThreadSanitizer" .build/tsan-output.txt \
    swift test --sanitize=thread --scratch-path .build-tsan --no-parallel --skip HostileTests --skip '^ClusterTests\.'
if grep -q "WARNING: ThreadSanitizer" .build/tsan-output.txt; then echo "ThreadSanitizer reported a race"; exit 1; fi

step "all checks passed"

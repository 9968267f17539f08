#!/usr/bin/env bash
# The whole test suite: unit and end-to-end tests, the OpenAPI document (validated, in step
# with the served copy, and fuzzed by schemathesis against a live server), and the suite
# again under ThreadSanitizer. Installs what is missing first. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
scripts/deps.sh test

step() { printf '\n=== %s\n' "$*"; }

step "build"
swift build --build-tests

step "swift test"
set +e
swift test --skip-build 2>&1 | tee .build/test-output.txt
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || { echo "swift test failed (exit $rc)"; exit 1; }

step "openapi.yaml"
python3 -m openapi_spec_validator openapi.yaml
scripts/embed-openapi.sh --check

step "schemathesis against a live server"
log=$(mktemp)
data=$(mktemp -d)
.build/debug/opqd --port 0 --data "$data" --log-level warning >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
base=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
scripts/schemathesis.sh "$base"
curl -fsS "$base/healthz" >/dev/null || { echo "server stopped answering after schemathesis"; cat "$log"; exit 1; }
kill -TERM $pid; wait $pid || { echo "opqd did not exit 0 on SIGTERM"; exit 1; }
trap - EXIT
rm -rf "$data" "$log"

step "swift test under ThreadSanitizer"
set +e
# One test at a time: ThreadSanitizer slows everything 5-10x, and the end-to-end tests’
# timing bounds (a long poll answering within its wait, a delay still running) would
# measure the sanitizer's load instead of the server.
TSAN_OPTIONS="halt_on_error=1" swift test --sanitize=thread --scratch-path .build-tsan --no-parallel 2>&1 | tee .build/tsan-output.txt
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || { echo "tests under ThreadSanitizer failed (exit $rc)"; exit 1; }
if grep -q "WARNING: ThreadSanitizer" .build/tsan-output.txt; then echo "ThreadSanitizer reported a race"; exit 1; fi

step "all checks passed"

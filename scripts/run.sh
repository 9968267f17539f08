#!/usr/bin/env bash
# Starts opqd (release build) with the given flags, installing what is missing first.
# Usage: scripts/run.sh [--port 8080] [--data ./opqd-data] ...   (see --help)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
scripts/deps.sh build
swift build -c release --product opqd >&2
exec .build/release/opqd "$@"

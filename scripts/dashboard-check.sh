#!/usr/bin/env bash
# The dashboard in headless Chromium (scripts/dashboard_check.py): the page shows a live
# server's queues and counts, follows a change made after it loaded, and changes the server's
# state through its own buttons; with --token/--read-token it asks for a token and hides the
# actions from the read token; with 100 queues and 100,000 operations its first render stays
# under 1 s and its load under 200 KB. Installs Chromium (Debian) and websocket-client (PyPI,
# into .build-py/dashboard) when missing.
#
# usage: scripts/dashboard-check.sh [--binary PATH] [--screenshot] [--skip-scale] [--only basic|resume|panels|token|scale]
#   --binary PATH  the opqd to run (default .build/debug/opqd; build it first)
#   --screenshot   also save docs/dashboard-overview.png and docs/dashboard-queue.png (off by default,
#                  so a check run leaves the tree clean)
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --screenshot) args+=(--screenshot docs) ;;
        --binary) args+=(--binary "$2"); shift ;;
        --only) args+=(--only "$2"); shift ;;
        --skip-scale) args+=(--skip-scale) ;;
        *) echo "dashboard-check: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

if ! command -v chromium >/dev/null; then
    echo "dashboard-check: installing chromium" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

venv=.build-py/dashboard
if ! "$venv/bin/python" -c 'import websocket' 2>/dev/null; then
    echo "dashboard-check: installing websocket-client into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'websocket-client>=1.6,<2'
fi

# Bounded as a whole, whatever step hangs (each step has its own, shorter timeout too).
exec timeout --kill-after=10 600 "$venv/bin/python" scripts/dashboard_check.py "${args[@]}"

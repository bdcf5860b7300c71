#!/usr/bin/env bash
# Make sure `promtool` (alert rule checks and rule unit tests) is on PATH.
# Installs Debian's `prometheus` package when it is missing; the grafana tests need it and,
# under CI=true, fail rather than skip without it.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "promtool missing and not root (no sudo): install Debian's 'prometheus' package" >&2
        exit 1
    fi
fi

echo "promtool missing: installing Debian's prometheus package" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: promtool is all we need; the server itself is not started.
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package's postinst may start the server; the tests need only the binary.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $SUDO systemctl stop prometheus || true
fi
command -v promtool >/dev/null 2>&1 || { echo "promtool still missing after install" >&2; exit 1; }
promtool --version | head -1 >&2

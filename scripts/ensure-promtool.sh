#!/usr/bin/env bash
# Make sure `promtool` (alert rule checks and rule unit tests) and the `prometheus` server (the
# test that scrapes real relays and workers) are on PATH. Installs Debian's `prometheus` package
# when either is missing; the tests need them and, under CI=true, fail rather than skip.
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "promtool/prometheus missing and not root (no sudo): install Debian's 'prometheus' package" >&2
        exit 1
    fi
fi

echo "promtool/prometheus missing: installing Debian's prometheus package" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the two binaries are all we need; the tests start their own server.
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package's postinst may start the system's server; the tests run their own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $SUDO systemctl stop prometheus || true
fi
command -v promtool >/dev/null 2>&1 || { echo "promtool still missing after install" >&2; exit 1; }
command -v prometheus >/dev/null 2>&1 || { echo "prometheus still missing after install" >&2; exit 1; }
promtool --version | head -1 >&2

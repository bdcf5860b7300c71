#!/usr/bin/env bash
# Make sure Debian's `chromium` is installed: the operator page's browser test
# (tests/acceptance/test_ui_browser.py) drives it headless through Playwright, pointed at
# /usr/bin/chromium (Playwright never downloads a browser of its own here). Under CI=true
# the test fails rather than skips when the browser is missing.
set -euo pipefail

CHROMIUM=${OUTBOX_TEST_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "chromium missing and not root (no sudo): install Debian's 'chromium' package" >&2
        exit 1
    fi
fi

echo "chromium missing: installing Debian's chromium package" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the browser and its libraries; no fonts or extras beyond them.
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
[ -x "$CHROMIUM" ] || { echo "$CHROMIUM still missing after install" >&2; exit 1; }
"$CHROMIUM" --version >&2 || true

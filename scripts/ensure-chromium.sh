#!/usr/bin/env bash
# Make sure Debian's `chromium` is installed: the operator page's browser test
# (tests/acceptance/test_ui_browser.py) drives it headless through Playwright, pointed at
# /usr/bin/chromium (Playwright never downloads a browser of its own here). Under CI=true
# the test fails rather than skips when the browser is missing. Silent when it is there.
set -euo pipefail

CHROMIUM=${OUTBOX_TEST_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ]; then
    exit 0
fi

give_up() {
    echo "ensure-chromium: $1; install Debian's 'chromium' package by hand" \
        "(or point OUTBOX_TEST_CHROMIUM at a Chromium binary)" >&2
    exit 1
}

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || give_up "$CHROMIUM missing and not root (no sudo)"
    # -n: fail at once rather than wait for a password nobody will type (make, CI).
    SUDO="sudo -n"
fi
command -v apt-get >/dev/null 2>&1 || give_up "$CHROMIUM missing and no apt-get here"

echo "chromium missing: installing Debian's chromium package" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || give_up "apt-get update failed (see above)"
# --no-install-recommends: the browser and its libraries; no fonts or extras beyond them.
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null ||
    give_up "apt-get install chromium failed (see above)"
[ -x "$CHROMIUM" ] || give_up "$CHROMIUM still missing after installing chromium"
"$CHROMIUM" --version >&2 || true

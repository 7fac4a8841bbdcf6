#!/usr/bin/env bash
# Headless Chromium for the browser test (tests/test_browser.py), from Debian's packages.
#
# Idempotent: does nothing when /usr/bin/chromium exists. Installing needs root (CI runs as root);
# without root it prints what to do and exits 0, and the browser test then skips with a reason.
# Playwright drives this system Chromium (executable_path="/usr/bin/chromium"): nothing is
# downloaded by `playwright install`.
set -euo pipefail

CHROMIUM=/usr/bin/chromium
if [[ -x "$CHROMIUM" ]]; then
  echo "==> [browser] $("$CHROMIUM" --version 2>/dev/null || echo chromium) already installed"
  exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "==> [browser] NOTE: $CHROMIUM is missing and installing it needs root;" \
       "ask an admin for \`apt-get install chromium fonts-dejavu-core\`." \
       "The browser test (pytest -m browser) will skip until then."
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "==> [browser] NOTE: no apt-get on this machine; install Chromium so that $CHROMIUM exists" \
       "to run the browser test (it skips until then)."
  exit 0
fi
echo "==> [browser] installing chromium and fonts-dejavu-core with apt-get"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
echo "==> [browser] $("$CHROMIUM" --version 2>/dev/null || echo chromium) installed"

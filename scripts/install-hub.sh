#!/usr/bin/env bash
# configurable-http-proxy (JupyterHub's proxy) for the JupyterHub test (tests/slurm/test_hub.py),
# from npm into .cache/chp (nothing global, no root needed).
#
# Idempotent: a fast no-op when .cache/chp already holds configurable-http-proxy $CHP_VERSION.
# Needs node >= 20 and npm (CHP 5.x declares `engines: node >= 20`); without them it prints what
# to do and exits 0, and the hub test then skips (or fails in CI) with a reason.
# npm warns "EBADENGINE commander@15.0.0 requires node >= 22.12": CHP 5.3.0 itself pins
# commander ~15.0.0 (an ES module), which node >= 20.19 loads through require(esm); harmless here.
# Prints the proxy's path on its last line. JupyterHub itself and batchspawner are Python
# packages pinned in requirements/base.in + lock.txt (`make setup` installs them).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CHP_VERSION=5.3.0
PREFIX="$PWD/.cache/chp"
BIN="$PREFIX/node_modules/.bin/configurable-http-proxy"
PKG_JSON="$PREFIX/node_modules/configurable-http-proxy/package.json"

installed_version() {
  [[ -x "$BIN" && -f "$PKG_JSON" ]] || return 1
  sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$PKG_JSON" | head -n1
}

if [[ "$(installed_version || true)" == "$CHP_VERSION" ]]; then
  echo "==> [hub] configurable-http-proxy $CHP_VERSION already installed"
  echo "$BIN"
  exit 0
fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "==> [hub] NOTE: node/npm are missing; install Node.js >= 20 to run the JupyterHub test" \
       "(pytest -m hub), which skips until then."
  exit 0
fi
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
if (( NODE_MAJOR < 20 )); then
  echo "==> [hub] NOTE: node $(node --version) is too old for configurable-http-proxy" \
       "$CHP_VERSION (needs >= 20); the JupyterHub test (pytest -m hub) skips until then."
  exit 0
fi
echo "==> [hub] installing configurable-http-proxy@$CHP_VERSION with npm into $PREFIX"
mkdir -p "$PREFIX"
npm install --prefix "$PREFIX" --no-fund --no-audit --no-update-notifier \
  "configurable-http-proxy@$CHP_VERSION"
[[ "$(installed_version || true)" == "$CHP_VERSION" ]] \
  || { echo "install-hub: npm did not install configurable-http-proxy $CHP_VERSION" >&2; exit 1; }
echo "==> [hub] configurable-http-proxy $("$BIN" --version) installed"
echo "$BIN"

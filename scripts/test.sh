#!/usr/bin/env bash
# The test command: installs what the tests need that cargo does not (moto's S3 server and
# Azurite, Microsoft's Azure Storage emulator, which the tests start on loopback themselves;
# Chromium, which renders the HTML report), then runs every test of the workspace, then the
# Python package's tests in a fresh virtual environment (scripts/test-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
# Azurite, Microsoft's Azure Storage emulator, from npm: the Azure tests start it on loopback.
AZURITE_VERSION=3.37.0
AZURITE_DIR="${LAKEFILL_TOOLS:-$HOME/.cache/lakefill-tools}/azurite"
export LAKEFILL_AZURITE="$AZURITE_DIR/node_modules/.bin/azurite-blob"
if ! grep -qs "\"version\": \"$AZURITE_VERSION\"" "$AZURITE_DIR/node_modules/azurite/package.json"; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "scripts/test.sh: install Node.js and npm first (the Azure tests run Azurite)" >&2
    exit 1
  fi
  npm install --prefix "$AZURITE_DIR" --no-audit --no-fund --silent "azurite@$AZURITE_VERSION"
fi
# Debian's Chromium renders the HTML report in a test (headless, no display needed).
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
      || { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; }
  else
    echo "scripts/test.sh: install Chromium first (e.g. sudo apt-get install chromium)" >&2
    exit 1
  fi
fi
cargo test --workspace "$@"
echo "== the Python package (a fresh virtual environment: pip install ./python, then its tests)"
scripts/test-python.sh

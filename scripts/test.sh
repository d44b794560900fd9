#!/usr/bin/env bash
# The test command: installs what the tests need that cargo does not (moto's S3 server, which the
# S3 tests start on loopback themselves), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
cargo test --workspace "$@"

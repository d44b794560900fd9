#!/usr/bin/env bash
# The Python package's tests (a step of the test command of its own, see scripts/test.sh):
# `pip install ./python` into a fresh virtual environment, then its tests against real demo lakes.
# maturin builds the binary with the workspace's dev profile here, so the build `cargo test` just
# made is reused; `pip install ./python` without MATURIN_PEP517_ARGS builds the release profile.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lakefill-target}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
python="$work/venv/bin/python"
"$python" -m pip install --quiet --disable-pip-version-check --upgrade pip
MATURIN_PEP517_ARGS="--profile dev" "$python" -m pip install --quiet --disable-pip-version-check ./python
"$python" -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
cd tests/python
"$python" -m pytest -q -p no:cacheprovider

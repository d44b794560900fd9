#!/usr/bin/env bash
# The Python package's tests, a step of the test command of their own (see scripts/test.sh), in
# two parts so that the slow one shows:
# 1. `pip install ./python` into a fresh virtual environment, then the API against real demo lakes;
# 2. Dagster and Airflow from PyPI into the same environment, then their integrations
#    (in-process materializations, `dag.test()` runs) and `mypy --strict` over the whole package.
# maturin builds the binary with the workspace's dev profile here, reusing the build `cargo test`
# made; `pip install ./python` without MATURIN_PEP517_ARGS builds the release profile.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lakefill-target}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip=(--quiet --disable-pip-version-check)
started=$SECONDS
python3 -m venv "$work/venv"
python="$work/venv/bin/python"
"$python" -m pip install "${pip[@]}" --upgrade pip
MATURIN_PEP517_ARGS="--profile dev" "$python" -m pip install "${pip[@]}" ./python
"$python" -m pip install "${pip[@]}" -r tests/python/requirements.txt
cd tests/python
"$python" -m pytest -q -p no:cacheprovider test_api.py
echo "== the Python API: $((SECONDS - started)) s"
started=$SECONDS
"$python" -m pip install "${pip[@]}" -r orchestrators.txt
"$python" -m pytest -q -p no:cacheprovider test_dagster.py test_airflow.py test_types.py
echo "== Dagster, Airflow and mypy --strict: $((SECONDS - started)) s"

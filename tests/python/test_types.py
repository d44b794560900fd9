"""`mypy --strict` over the installed package (the Dagster and Airflow modules too, so this runs
where both are installed) and over a caller of its API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_package_and_a_caller_type_check_strictly() -> None:
    caller = Path(__file__).with_name("typed_caller.py")
    for target in (["-p", "lakefill"], [str(caller)]):
        out = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", *target],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr

"""Fixtures of the Python package's tests: a real demo lake built by the installed binary, with
new versions of the `events` model to backfill."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import lakefill
from lakefill._runner import binary

# A fix on top of the demo's: every amount one cent higher (keys stay in their partitions).
V3 = """/*
target = "events"
partition_by = "event_date"
reason = "amounts were one cent short"

[sources.raw_events]
window = "ingest_date"
lookahead = 1

[validate]
key = ["event_id"]
measures = ["amount_cents"]
*/
SELECT event_id, user_id, country, amount_cents + 1 AS amount_cents, event_ts,
       CAST(event_ts AS DATE) AS event_date
FROM raw_events
WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end
"""

# The same fix with a check that every row fails: validation blocks it.
BAD = V3.replace(
    'measures = ["amount_cents"]',
    'measures = ["amount_cents"]\n[[validate.checks]]\nname = "no positive amounts"\n'
    'sql = "SELECT * FROM output WHERE amount_cents > 0"',
)


def build_demo(directory: Path) -> Path:
    """`lakefill demo` (10 days x 300 events) in `directory`, plus `events` v3 and `bad`."""
    subprocess.run(
        [binary(), "demo", "--dir", str(directory), "--days", "10", "--events-per-day", "300"],
        check=True,
        capture_output=True,
    )
    (directory / "sql" / "events" / "v3.sql").write_text(V3)
    (directory / "sql" / "events" / "bad.sql").write_text(BAD)
    return directory


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return build_demo(tmp_path / "demo")


@pytest.fixture
def project(demo: Path) -> lakefill.Project:
    return lakefill.Project(demo)

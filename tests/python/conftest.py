"""Fixtures of the Python package's tests: a real demo lake built by the installed binary, with
new versions of the `events` model to backfill."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
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


def hold(demo: Path, table: str, run_id: str) -> Path:
    """A lease on `run_id` held by a process on another machine (judged by its time-to-live, two
    minutes): any other process is refused the run, exit 4. Returns the lease file."""
    now = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    lease = demo / "lake" / table / "_lakefill" / "leases" / run_id / f"{1:020}.json"
    lease.parent.mkdir(parents=True, exist_ok=True)
    lease.write_text(
        json.dumps(
            {
                "run_id": run_id,
                "generation": 1,
                "holder": {"host": "elsewhere", "boot_id": None, "pid": 1, "started": None},
                "command": "backfill",
                "acquired_at": now,
                "renewed_at": now,
                "ttl_seconds": 120,
                "released": False,
            }
        )
    )
    return lease


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return build_demo(tmp_path / "demo")


@pytest.fixture
def project(demo: Path) -> lakefill.Project:
    return lakefill.Project(demo)

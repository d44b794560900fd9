"""`lakefill.dagster` in-process against real demo lakes, read back with python `deltalake`."""

from __future__ import annotations

import subprocess
from datetime import date, datetime, timezone
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import lakefill
from lakefill._runner import binary
from lakefill.dagster import CHECK, lakefill_assets, range_tags

from conftest import build_demo, hold

FIRST, LAST = "2026-01-02", "2026-01-06"


def rows(demo: Path, table: str = "events") -> list[dict[str, object]]:
    data = DeltaTable(str(demo / "lake" / table)).to_pyarrow_table().sort_by("event_id")
    return data.to_pylist()


def by_key(assets: list[dg.AssetsDefinition | dg.AssetSpec]) -> dict[str, object]:
    out: dict[str, object] = {}
    for a in assets:
        key = a.key if isinstance(a, dg.AssetSpec) else a.key
        out[key.to_user_string()] = a
    return out


def materialize(
    assets: list[dg.AssetsDefinition | dg.AssetSpec], table: str, first: str, last: str
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        assets,
        selection=[table],
        tags=range_tags(first, last),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_one_asset_per_model_with_its_grain_and_sources(demo: Path) -> None:
    assets = by_key(lakefill_assets(demo))
    assert sorted(assets) == ["daily_revenue", "events", "raw_events", "revenue_7d"]
    assert isinstance(assets["raw_events"], dg.AssetSpec)  # no model writes it
    events = assets["events"]
    assert isinstance(events, dg.AssetsDefinition)
    partitions = events.partitions_def
    assert isinstance(partitions, dg.DailyPartitionsDefinition)
    assert partitions.get_first_partition_key() == "2026-01-01"
    assert events.backfill_policy == dg.BackfillPolicy.single_run()
    daily = assets["daily_revenue"]
    assert isinstance(daily, dg.AssetsDefinition)
    deps = {k.to_user_string() for k in daily.asset_deps[daily.key]}
    assert deps == {"events"}
    assert {k.to_user_string() for k in events.asset_deps[events.key]} == {"raw_events"}


def test_a_partition_range_is_one_backfill_with_the_rows_of_the_cli(
    tmp_path: Path, demo: Path
) -> None:
    before = DeltaTable(str(demo / "lake" / "events")).version()
    result = materialize(lakefill_assets(demo), "events", FIRST, LAST)
    assert result.success
    materializations = result.asset_materializations_for_node("events")
    # Dagster records each of the five partitions, all from one lakefill run.
    assert sorted(m.partition for m in materializations) == [f"2026-01-0{d}" for d in range(2, 7)]
    assert len({m.metadata["run_id"].value for m in materializations}) == 1
    metadata = materializations[0].metadata
    run_id = metadata["run_id"].value
    assert isinstance(run_id, str) and run_id.startswith("events-v3-")
    assert metadata["published_version"].value == before + 1
    assert isinstance(metadata["rows_changed"].value, int) and metadata["rows_changed"].value > 0
    report = metadata["report"].value
    assert isinstance(report, str) and Path(report).is_file()
    checks = result.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in checks] == [(CHECK, True)]
    # The runs say so, and the rows equal a direct `lakefill backfill` of the same range.
    runs = lakefill.Project(demo).runs("events")
    assert [r.range.start for r in runs if r.run_id == run_id] == [FIRST]
    twin = build_demo(tmp_path / "twin")
    subprocess.run(
        [binary(), "--project", str(twin), "backfill", "events", "--from", FIRST, "--to", LAST,
         "--reason", "direct"],
        check=True,
        capture_output=True,
    )
    assert rows(demo) == rows(twin)


def test_a_failed_validation_fails_the_step_with_the_summary(demo: Path) -> None:
    before = rows(demo)
    result = materialize(lakefill_assets(demo, model_version="bad"), "events", FIRST, LAST)
    assert not result.success
    data = result.get_step_failure_events()[0].step_failure_data
    described = data.user_failure_data.description if data.user_failure_data else None
    assert described and "validation failed: check: no positive amounts" in described
    checks = result.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in checks] == [(CHECK, False)]
    assert rows(demo) == before


def test_a_conflict_is_retried(demo: Path) -> None:
    # Another process holds the run: every attempt conflicts; the step is retried, then fails.
    plan = lakefill.Project(demo).plan("events", FIRST, LAST)
    lease = hold(demo, "events", plan.run_id)
    assets = lakefill_assets(demo, retries_on_conflict=1)
    result = materialize(assets, "events", FIRST, LAST)
    assert not result.success
    kinds = [e.event_type_value for e in result.all_events]
    assert "STEP_UP_FOR_RETRY" in kinds
    # Once the holder lets go, the same materialization publishes.
    lease.unlink()
    assert materialize(assets, "events", FIRST, LAST).success


def test_a_model_published_as_adjustments_is_an_asset_and_appends_them(demo: Path) -> None:
    # An append-only ledger holding the demo's events, and a model fixing it by adjustments.
    events = DeltaTable(str(demo / "lake" / "events")).to_pyarrow_table()
    write_deltalake(
        str(demo / "lake" / "ledger"),
        events,
        partition_by=["event_date"],
        configuration={"delta.appendOnly": "true"},
    )
    with (demo / "lakefill.toml").open("a") as toml:
        toml.write('\n[tables.ledger]\nuri = "lake/ledger"\n')
    model = demo / "sql" / "ledger" / "v1.sql"
    model.parent.mkdir(parents=True)
    model.write_text(
        '/*\ntarget = "ledger"\npartition_by = "event_date"\nschema = "add-columns"\n'
        'publish = "adjustments"\n[sources.events]\nwindow = "event_date"\n'
        '[validate]\nkey = ["event_id"]\nmeasures = ["amount_cents"]\n*/\n'
        "SELECT event_id, user_id, country, amount_cents + 1 AS amount_cents, event_ts, event_date "
        "FROM events WHERE event_date BETWEEN $start AND $end\n"
    )
    assets = by_key(lakefill_assets(demo))
    ledger = assets["ledger"]
    assert isinstance(ledger, dg.AssetsDefinition)
    assert {k.to_user_string() for k in ledger.asset_deps[ledger.key]} == {"events"}
    partitions = ledger.partitions_def
    assert isinstance(partitions, dg.DailyPartitionsDefinition)
    assert partitions.get_first_partition_key() == "2026-01-01"

    result = materialize(lakefill_assets(demo), "ledger", FIRST, LAST)
    assert result.success
    # Read back by python `deltalake`: the old rows stay, each row of the range is reversed once
    # and corrected once, a cent more; nothing outside the range is touched.
    after = DeltaTable(str(demo / "lake" / "ledger")).to_pyarrow_table().to_pylist()
    in_range = [
        r for r in events.to_pylist() if FIRST <= r["event_date"].isoformat() <= LAST
    ]
    assert in_range and len(in_range) < events.num_rows
    kinds = [r["_lakefill_kind"] for r in after]
    assert kinds.count(None) == events.num_rows
    assert kinds.count("reversal") == kinds.count("correction") == len(in_range)
    total = sum(r["amount_cents"] for r in after)
    assert total == sum(r["amount_cents"] for r in events.to_pylist()) + len(in_range)


# Each grain lakefill partitions by, with the table's partition values and a range of Dagster
# keys in the middle of them (the partitions before and after it must stay as they were).
GRAINS = {
    "hour": (
        pa.timestamp("us", tz="UTC"),
        [datetime(2026, 1, 1, h, tzinfo=timezone.utc) for h in range(8)],
        dg.HourlyPartitionsDefinition,
        ("2026-01-01-02:00", "2026-01-01-05:00"),
        ["2026-01-01-02:00", "2026-01-01-03:00", "2026-01-01-04:00", "2026-01-01-05:00"],
    ),
    "month": (
        pa.date32(),
        [date(2025, m, 1) for m in range(6, 13)] + [date(2026, 1, 1)],
        dg.MonthlyPartitionsDefinition,
        ("2025-08-01", "2025-10-01"),
        ["2025-08-01", "2025-09-01", "2025-10-01"],
    ),
    "year": (
        pa.date32(),
        [date(y, 1, 1) for y in range(2020, 2027)],
        dg.TimeWindowPartitionsDefinition,
        ("2022", "2024"),
        ["2022", "2023", "2024"],
    ),
}


def grain_project(root: Path, grain: str) -> Path:
    """A project whose model `fix` doubles the amounts of `raw` into `target`, both partitioned
    by `p` at `grain` (and holding the same rows before the fix)."""
    kind, values, _, _, _ = GRAINS[grain]
    root.mkdir()
    (root / "lakefill.toml").write_text(
        '[tables.raw]\nuri = "lake/raw"\n\n[tables.target]\nuri = "lake/target"\n'
    )
    model = root / "sql" / "fix" / "v1.sql"
    model.parent.mkdir(parents=True)
    model.write_text(
        '/*\ntarget = "target"\npartition_by = "p"\n[sources.raw]\nwindow = "p"\n'
        '[validate]\nkey = ["id"]\n*/\nSELECT id, amount * 2 AS amount, p FROM raw\n'
    )
    schema = pa.schema([("id", pa.int64()), ("amount", pa.int64()), ("p", kind)])
    data = pa.Table.from_pylist(
        [{"id": 10 * n + i, "amount": n + i, "p": v} for n, v in enumerate(values) for i in range(3)],
        schema=schema,
    )
    for table in ("raw", "target"):
        write_deltalake(str(root / "lake" / table), data, partition_by=["p"])
    return root


@pytest.mark.parametrize("grain", sorted(GRAINS))
def test_every_grain_gets_its_partitions_and_a_range_is_one_backfill(
    tmp_path: Path, grain: str
) -> None:
    _, values, definition, (first, last), keys = GRAINS[grain]
    project = grain_project(tmp_path / grain, grain)
    assets = by_key(lakefill_assets(project))
    assert sorted(assets) == ["raw", "target"]
    target = assets["target"]
    assert isinstance(target, dg.AssetsDefinition)
    partitions = target.partitions_def
    assert isinstance(partitions, definition), partitions
    # Dagster's keys start at the table's first partition; the range's keys are among them.
    all_keys = partitions.get_partition_keys(current_time=datetime(2027, 6, 1))
    assert all_keys[0] == {"hour": "2026-01-01-00:00", "month": "2025-06-01", "year": "2020"}[grain]
    assert all(k in all_keys for k in keys)
    before = DeltaTable(str(project / "lake" / "target")).to_pyarrow_table().to_pylist()

    result = materialize(lakefill_assets(project), "target", first, last)
    assert result.success
    materializations = result.asset_materializations_for_node("target")
    assert sorted(m.partition for m in materializations if m.partition) == keys
    assert len({m.metadata["run_id"].value for m in materializations}) == 1

    # Read back by python `deltalake`: the range's rows doubled, every other row as it was.
    in_range = {v for v in values if keys[0] <= dagster_key(grain, v) <= keys[-1]}
    assert len(in_range) == len(keys) < len(values)
    expected = [
        {**row, "amount": row["amount"] * 2} if row["p"] in in_range else row for row in before
    ]
    after = DeltaTable(str(project / "lake" / "target")).to_pyarrow_table().to_pylist()
    assert sorted(after, key=lambda r: r["id"]) == sorted(expected, key=lambda r: r["id"])


def dagster_key(grain: str, value: date) -> str:
    """The Dagster partition key of a partition value."""
    if grain == "hour":
        return value.strftime("%Y-%m-%d-%H:%M")
    if grain == "year":
        return value.strftime("%Y")
    return value.strftime("%Y-%m-%d")

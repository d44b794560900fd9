"""The Python API against a real demo lake, checked with python `deltalake` (not lakefill)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from deltalake import DeltaTable

import lakefill
from lakefill._runner import binary

from conftest import build_demo

FIRST, LAST = "2026-01-02", "2026-01-06"


def rows(demo: Path, table: str = "events") -> list[dict[str, object]]:
    data = DeltaTable(str(demo / "lake" / table)).to_pyarrow_table().sort_by("event_id")
    return data.to_pylist()


def version(demo: Path, table: str = "events") -> int:
    return DeltaTable(str(demo / "lake" / table)).version()


def test_a_backfill_through_the_api_publishes_what_the_cli_publishes(
    tmp_path: Path, demo: Path, project: lakefill.Project
) -> None:
    before = version(demo)
    plan = project.plan("events", FIRST, LAST, model_version="v3")
    assert isinstance(plan, lakefill.PlanReport)
    assert (plan.model_version, plan.target, plan.read_version) == ("v3", "events", before)
    assert [p.value for p in plan.partitions] == [f"2026-01-0{d}" for d in range(2, 7)]
    assert plan.range.start == FIRST and plan.range.end == LAST

    run = project.backfill("events", FIRST, LAST, model_version="v3", reason="one cent")
    assert run.state == "published" and run.outcome == "published"
    assert run.published_version == before + 1 == version(demo)
    assert run.validation.passed and run.validation.summary == "validation passed"
    assert run.rows_changed > 0
    assert sum(p.new_rows or 0 for p in run.partitions) == run.rows_written

    # The same backfill by the binary, on a twin lake: the same rows.
    twin = build_demo(tmp_path / "twin")
    subprocess.run(
        [binary(), "--project", str(twin), "backfill", "events", "--from", FIRST, "--to", LAST,
         "--model-version", "v3", "--reason", "one cent"],
        check=True,
        capture_output=True,
    )
    assert rows(demo) == rows(twin)
    # Running it again changes nothing.
    again = project.backfill("events", FIRST, LAST, model_version="v3", reason="one cent")
    assert again.outcome == "already_published" and version(demo) == before + 1


def test_stage_only_then_publish_or_discard(demo: Path, project: lakefill.Project) -> None:
    before = version(demo)
    staged = project.backfill("events", FIRST, FIRST, model_version="v3", stage_only=True)
    assert staged.state == "validated" and staged.published_version is None
    assert version(demo) == before
    published = project.publish(staged.run_id)
    assert published.published_version == before + 1 == version(demo)

    other = project.backfill("events", LAST, LAST, model_version="v3", stage_only=True)
    discarded = project.discard(other.run_id)
    assert discarded.outcome == "discarded" and version(demo) == before + 1
    states = {r.run_id: r.state for r in project.runs("events")}
    assert states[staged.run_id] == "published"
    assert states[other.run_id] == "discarded"


def test_history_diff_revert_and_stale(demo: Path, project: lakefill.Project) -> None:
    run = project.backfill("events", FIRST, LAST, model_version="v3")
    history = project.history("events", limit=2)
    assert history[0].version == run.published_version
    assert history[0].run_id == run.run_id
    diff = project.diff("events", from_version=run.read_version, to_version=run.published_version)
    assert diff["table"] == "events" and diff["changed_partitions"]
    # daily_revenue read events before the fix: stale now, with the command that refreshes it.
    stale = project.stale("daily_revenue")
    assert stale.stale
    assert any("lakefill backfill daily_revenue" in c for c in stale.commands)
    reverted = project.revert(run.run_id, reason="undo the cent")
    assert reverted.published_version == version(demo) == (run.published_version or 0) + 1
    old = DeltaTable(str(demo / "lake" / "events"), version=run.read_version)
    assert rows(demo) == old.to_pyarrow_table().sort_by("event_id").to_pylist()


def test_progress_events_arrive_before_the_report(project: lakefill.Project) -> None:
    items = list(project.backfill_progress("events", FIRST, LAST, model_version="v3"))
    events = [i for i in items if isinstance(i, lakefill.ProgressEvent)]
    assert isinstance(items[-1], lakefill.RunReport)
    assert items[-1].state == "published"
    kinds = [e.event for e in events]
    assert kinds[0] == "started" and "batch_finished" in kinds and kinds[-1] == "finished"
    assert all(e.run_id == items[-1].run_id for e in events)


def test_each_exit_code_is_its_exception(demo: Path, project: lakefill.Project) -> None:
    before = version(demo)
    with pytest.raises(lakefill.UsageError) as usage:
        project.plan("no_such_model", FIRST, LAST)
    assert usage.value.exit_code == 2 and usage.value.hint
    assert "no_such_model" in usage.value.message

    with pytest.raises(lakefill.ValidationFailed) as failed:
        project.backfill("events", FIRST, LAST, model_version="bad")
    report = failed.value.report
    assert failed.value.exit_code == 3 and not report.validation.passed
    assert [c.name for c in report.validation.failed_checks] == ["check: no positive amounts"]
    assert report.published_version is None and version(demo) == before

    # A staged run whose partitions another run then published: publishing it conflicts.
    staged = project.backfill("events", FIRST, LAST, model_version="v3", stage_only=True)
    project.backfill("events", LAST, LAST, model_version="v3")
    with pytest.raises(lakefill.Conflict) as conflict:
        project.publish(staged.run_id)
    assert conflict.value.exit_code == 4
    for error in (usage.value, failed.value, conflict.value):
        assert isinstance(error, lakefill.LakefillError)



def test_a_missing_binary_is_named(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    monkeypatch.setenv("LAKEFILL_BIN", str(demo / "nowhere"))
    with pytest.raises(lakefill.LakefillError) as missing:
        lakefill.Project(demo).runs()
    assert "LAKEFILL_BIN" in str(missing.value) and missing.value.hint

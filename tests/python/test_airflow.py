"""`lakefill.airflow` in DAG runs with `dag.test()` against real demo lakes, read back with python
`deltalake`. Airflow's home (its SQLite metadata database and DAGs folder) is the test's: the
DAGs are written to a file there, since `dag.test()` serializes a DAG from its file."""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from deltalake import DeltaTable

from conftest import build_demo, hold

FIRST, LAST = "2026-01-02", "2026-01-06"

DAGS = '''
import datetime as dt

from airflow.sdk import DAG

from lakefill.airflow import LakefillBackfillOperator, LakefillPublishOperator

# Write, audit, publish: stage a range whose end is templated from the run's data interval, then
# publish the staged run in a second task.
with DAG("lakefill_wap", schedule=None, start_date=dt.datetime(2026, 1, 1)) as wap:
    stage = LakefillBackfillOperator(
        task_id="stage",
        project={wap!r},
        model="events",
        start="{{{{ params.first }}}}",
        end="{{{{ data_interval_end | ds }}}}",
        stage_only=True,
        reason="airflow: {{{{ dag.dag_id }}}}",
        params={{"first": {first!r}}},
    )
    publish = LakefillPublishOperator(
        task_id="publish",
        project={wap!r},
        run_id="{{{{ ti.xcom_pull(task_ids='stage', key='run_id') }}}}",
    )
    stage >> publish

# A fix whose check fails: the task fails once, without retries.
with DAG("lakefill_bad", schedule=None, start_date=dt.datetime(2026, 1, 1)) as bad:
    LakefillBackfillOperator(
        task_id="fix",
        project={bad!r},
        model="events",
        start={first!r},
        end={last!r},
        model_version="bad",
    )

# A run another process holds: the conflict is retried (once here, at once).
with DAG("lakefill_held", schedule=None, start_date=dt.datetime(2026, 1, 1)) as held:
    LakefillBackfillOperator(
        task_id="fix",
        project={held!r},
        model="events",
        start={first!r},
        end={last!r},
        retries=1,
        retry_delay=dt.timedelta(0),
    )
'''


def version(demo: Path) -> int:
    return DeltaTable(str(demo / "lake" / "events")).version()


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path, Path, Path]:
    """Airflow's home with the DAGs file, and the demo lakes the DAGs fix."""
    home = tmp_path_factory.mktemp("airflow")
    lakes = tmp_path_factory.mktemp("lakes")
    wap, bad = build_demo(lakes / "wap"), build_demo(lakes / "bad")
    held = build_demo(lakes / "held")
    dags = home / "dags"
    dags.mkdir()
    path = dags / "lakefill_dags.py"
    path.write_text(
        DAGS.format(wap=str(wap), bad=str(bad), held=str(held), first=FIRST, last=LAST)
    )
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        }
    )
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True
    )
    spec = importlib.util.spec_from_file_location("lakefill_dags", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, wap, bad, held


def test_stage_then_publish_across_tasks_with_templated_dates(
    airflow: tuple[ModuleType, Path, Path, Path],
) -> None:
    module, demo, _, _ = airflow
    before = version(demo)
    run: Any = module.wap.test(logical_date=dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc))
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert states == {"stage": "success", "publish": "success"}, states
    assert version(demo) == before + 1
    # One run, over the templated range, published by the second task.
    history = DeltaTable(str(demo / "lake" / "events")).history(1)[0]
    assert "lakefill_wap" in str(history)
    import lakefill

    [published] = [r for r in lakefill.Project(demo).runs("events") if r.state == "published"
                   and r.model_version == "v3"]
    assert (published.range.start, published.range.end) == (FIRST, "2026-01-05")
    assert published.published_version == before + 1


def test_a_failed_validation_fails_the_task_without_retries(
    airflow: tuple[ModuleType, Path, Path, Path],
) -> None:
    module, _, demo, _ = airflow
    before = version(demo)
    run: Any = module.bad.test()
    [ti] = run.get_task_instances()
    assert str(ti.state) == "failed"
    assert ti.try_number == 1  # AirflowFailException: no retry
    assert version(demo) == before


def test_a_conflict_is_retried(airflow: tuple[ModuleType, Path, Path, Path]) -> None:
    import lakefill

    module, _, _, demo = airflow
    before = version(demo)
    plan = lakefill.Project(demo).plan("events", FIRST, LAST)
    hold(demo, "events", plan.run_id)
    run: Any = module.held.test()
    [ti] = run.get_task_instances()
    assert ti.try_number == 2, (ti.state, ti.try_number)  # tried, conflicted, retried
    assert str(ti.state) == "failed"
    assert version(demo) == before

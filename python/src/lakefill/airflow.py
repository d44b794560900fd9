"""lakefill in Airflow 3: `LakefillBackfillOperator` and `LakefillPublishOperator`.

`LakefillBackfillOperator(task_id=…, project=…, model=…, start=…, end=…, **options)` runs one
`lakefill backfill`; `start`, `end`, `reason`, `where` and `project` are templated, so
`start="{{ data_interval_start | ds }}"` works. Its return value (XCom `return_value`) is the run's
report document; XCom `run_id` is the run id.

- A validation failure fails the task without retries (`AirflowFailException`), with the
  report's summary; the report is pushed to XCom `report` first.
- A conflict (the table moved under the run) raises `AirflowException`, which Airflow retries
  (the operators default to 3 retries).
- With `stage_only=True`, a later `LakefillPublishOperator(run_id="{{ ti.xcom_pull(…,
  key='run_id') }}")` publishes it: write-audit-publish across tasks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from .documents import RunReport
from .errors import Conflict, ValidationFailed
from .project import Project

# `lakefill backfill`'s flags, in snake case: the operator's other keyword arguments are
# BaseOperator's (task_id, retries, …).
BACKFILL_OPTIONS = frozenset(
    {
        "where",
        "model_version",
        "source_version",
        "batch_partitions",
        "allow_spill",
        "allow_edge_moves",
        "max_partitions",
        "include_null",
        "reason",
        "publish_as",
        "max_parallel",
        "memory_limit",
        "throttle",
        "engine",
        "stage_only",
        "force_publish",
        "sample",
    }
)


def _defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("retries", 3)
    kwargs.setdefault("retry_delay", timedelta(seconds=5))
    return kwargs


class LakefillBackfillOperator(BaseOperator):
    """Runs `lakefill backfill MODEL --from START --to END` in the project at `project`."""

    template_fields = ("project", "model", "start", "end", "reason", "where")

    def __init__(
        self,
        *,
        project: str | os.PathLike[str],
        model: str,
        start: str | None = None,
        end: str | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in BACKFILL_OPTIONS}
        super().__init__(**_defaults(kwargs))
        self.project = str(project)
        self.model = model
        self.start = start
        self.end = end
        self.env = dict(env) if env else None
        self.reason = options.pop("reason", None)
        self.where = options.pop("where", None)
        self.options = options

    def execute(self, context: Any) -> dict[str, Any]:
        project = Project(self.project, self.env)
        ti = context["ti"]
        try:
            run = project.backfill(
                self.model,
                self.start or None,
                self.end or None,
                reason=self.reason or None,
                where=self.where or None,
                **self.options,
            )
        except ValidationFailed as failed:
            ti.xcom_push(key="report", value=failed.report.document)
            ti.xcom_push(key="run_id", value=failed.report.run_id)
            raise AirflowFailException(
                f"{failed.message}: {failed.report.validation.summary} "
                f"(run {failed.report.run_id}; nothing was published)"
            ) from failed
        except Conflict as conflict:
            raise AirflowException(f"{conflict.message} (retrying is safe)") from conflict
        return _pushed(ti, run)


class LakefillPublishOperator(BaseOperator):
    """Runs `lakefill publish RUN_ID`: the publish of a run staged by an earlier task."""

    template_fields = ("project", "run_id")

    def __init__(
        self,
        *,
        project: str | os.PathLike[str],
        run_id: str,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**_defaults(kwargs))
        self.project = str(project)
        self.run_id = run_id
        self.env = dict(env) if env else None

    def execute(self, context: Any) -> dict[str, Any]:
        project = Project(self.project, self.env)
        try:
            run = project.publish(self.run_id)
        except ValidationFailed as failed:
            raise AirflowFailException(
                f"{failed.message}: {failed.report.validation.summary}"
            ) from failed
        except Conflict as conflict:
            raise AirflowException(f"{conflict.message} (retrying is safe)") from conflict
        return _pushed(context["ti"], run)


def _pushed(ti: Any, run: RunReport) -> dict[str, Any]:
    ti.xcom_push(key="run_id", value=run.run_id)
    return run.document

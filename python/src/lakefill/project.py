"""`lakefill.Project`: every command of the `lakefill` binary as a method.

Keyword arguments are the command's flags in snake case (`model_version="v2"` is
`--model-version v2`, `stage_only=True` is `--stage-only`); see the repository's `docs/cli.md`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ._runner import Completed, Runner, error_line, flags, hint_of, raise_for
from .documents import (
    HistoryEntry,
    PlanReport,
    ProgressEvent,
    RunReport,
    RunSummary,
    StaleReport,
)
from .errors import LakefillError, ValidationFailed


def _range(start: str | None, end: str | None) -> list[str]:
    out: list[str] = []
    if start is not None:
        out.extend(["--from", str(start)])
    if end is not None:
        out.extend(["--to", str(end)])
    return out


def _report(completed: Completed) -> RunReport:
    """The run report of a command that prints one, or its exception."""
    document = completed.document
    if completed.exit_code == 3 and isinstance(document, dict) and "run_id" in document:
        report = RunReport.from_json(document)
        raise ValidationFailed(
            error_line(completed.stderr), report=report, hint=hint_of(completed.stderr)
        )
    raise_for(completed)
    if not isinstance(document, dict):
        raise LakefillError("lakefill printed no report", document={"stderr": completed.stderr})
    return RunReport.from_json(document)


def _list(completed: Completed) -> list[dict[str, Any]]:
    raise_for(completed)
    document = completed.document
    return [d for d in document if isinstance(d, dict)] if isinstance(document, list) else []


def _dict(completed: Completed, allowed: tuple[int, ...] = (0,)) -> dict[str, Any]:
    raise_for(completed, allowed)
    document = completed.document
    return document if isinstance(document, dict) else {}


class Project:
    """A lakefill project: the directory holding `lakefill.toml` and `sql/`.

    `env` adds environment variables for the commands (storage credentials, for example).
    """

    def __init__(self, path: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
        self.path = Path(path).resolve()
        self._runner = Runner(self.path, env)

    def run(self, *args: str) -> Completed:
        """Runs any command (`project.run("sql", "SELECT 1")`) and returns what it printed,
        without raising."""
        return self._runner.run(list(args))

    def plan(
        self,
        model: str,
        start: str | None = None,
        end: str | None = None,
        *,
        where: str | None = None,
        model_version: str | None = None,
        source_version: Sequence[str] | None = None,
        batch_partitions: int | None = None,
        max_partitions: int | None = None,
        include_null: bool = False,
        allow_edge_moves: bool = False,
        reason: str | None = None,
        **options: Any,
    ) -> PlanReport:
        """Scopes a backfill of `model` over `start..end` (inclusive) without writing."""
        args = ["plan", model, *_range(start, end)]
        args += flags(
            dict(
                where=where,
                model_version=model_version,
                source_version=source_version,
                batch_partitions=batch_partitions,
                max_partitions=max_partitions,
                include_null=include_null,
                allow_edge_moves=allow_edge_moves,
                reason=reason,
                **options,
            )
        )
        return PlanReport.from_json(_dict(self._runner.run(args)))

    def plan_cascade(
        self, model: str, start: str | None = None, end: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """`plan --cascade`: the backfill of `model` and of everything downstream of it."""
        args = ["plan", model, *_range(start, end), "--cascade", *flags(options)]
        return _dict(self._runner.run(args))

    def _backfill_args(
        self, model: str, start: str | None, end: str | None, options: dict[str, Any]
    ) -> list[str]:
        return ["backfill", model, *_range(start, end), *flags(options)]

    def backfill(
        self,
        model: str,
        start: str | None = None,
        end: str | None = None,
        *,
        where: str | None = None,
        model_version: str | None = None,
        stage_only: bool = False,
        reason: str | None = None,
        allow_edge_moves: bool = False,
        force_publish: bool = False,
        max_parallel: int | None = None,
        memory_limit: str | None = None,
        batch_partitions: int | None = None,
        source_version: Sequence[str] | None = None,
        **options: Any,
    ) -> RunReport:
        """Stages, validates and publishes a backfill of `model` over `start..end` (with
        `stage_only=True`, stops before publishing). Raises `ValidationFailed` (with the report)
        when validation blocks it, `Conflict` when the target moved."""
        merged = dict(
            where=where,
            model_version=model_version,
            stage_only=stage_only,
            reason=reason,
            allow_edge_moves=allow_edge_moves,
            force_publish=force_publish,
            max_parallel=max_parallel,
            memory_limit=memory_limit,
            batch_partitions=batch_partitions,
            source_version=source_version,
            **options,
        )
        if merged.get("cascade"):
            raise LakefillError(
                "backfill(cascade=True) prints a cascade, not a run: call backfill_cascade()",
                exit_code=2,
            )
        return _report(self._runner.run(self._backfill_args(model, start, end, merged)))

    def backfill_cascade(
        self, model: str, start: str | None = None, end: str | None = None, **options: Any
    ) -> dict[str, Any]:
        """`backfill --cascade`: `model` and everything downstream, published in order."""
        completed = self._runner.run(
            self._backfill_args(model, start, end, {**options, "cascade": True})
        )
        return _dict(completed)

    def backfill_progress(
        self, model: str, start: str | None = None, end: str | None = None, **options: Any
    ) -> Iterator[ProgressEvent | RunReport]:
        """`backfill`, yielding each progress event as the run reports it, then its report
        (the exceptions are those of `backfill`)."""
        for item in self._runner.stream(self._backfill_args(model, start, end, options)):
            if isinstance(item, Completed):
                yield _report(item)
            else:
                yield ProgressEvent.from_json(item)

    def publish(self, run_id: str, **options: Any) -> RunReport:
        """Publishes a staged, validated run."""
        return _report(self._runner.run(["publish", run_id, *flags(options)]))

    def discard(self, run_id: str) -> RunReport:
        """Deletes a run's staged files; its journal says it was discarded."""
        return _report(self._runner.run(["discard", run_id]))

    def revert(
        self, run_id: str, *, logical: bool = False, reason: str | None = None, **options: Any
    ) -> RunReport:
        """A new commit that puts back what the run replaced."""
        args = ["revert", run_id, *flags(dict(logical=logical, reason=reason, **options))]
        return _report(self._runner.run(args))

    def runs(self, table: str | None = None) -> list[RunSummary]:
        """Every run (of `table`), reconciled with the Delta log."""
        args = ["runs"] if table is None else ["runs", table]
        return [RunSummary.from_json(d) for d in _list(self._runner.run(args))]

    def history(self, table: str, *, limit: int | None = None) -> list[HistoryEntry]:
        """The table's versions, newest first, with the run behind each."""
        args = ["history", table, *flags(dict(limit=limit))]
        return [HistoryEntry.from_json(d) for d in _list(self._runner.run(args))]

    def diff(self, table: str, **options: Any) -> dict[str, Any]:
        """Old vs new of a table: `from_version=…, to_version=…` or `run=…`, `key=…`,
        `cdf=…`."""
        return _dict(self._runner.run(["diff", table, *flags(options)]))

    def stale(self, *tables: str, cascade: bool = False) -> StaleReport:
        """Which published partitions a source changed under since (exit 5 is an answer, not an
        error: `StaleReport.stale`)."""
        args = ["stale", *tables, *flags(dict(cascade=cascade))]
        return StaleReport.from_json(_dict(self._runner.run(args), allowed=(0, 5)))

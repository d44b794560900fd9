"""lakefill models as Dagster assets: `lakefill_assets(project_path)`.

One asset per model, keyed by the table it writes, partitioned by the table's time grain (daily,
hourly, monthly, yearly) from its first partition, depending on the tables the model reads (the
tables no model writes become external assets). Materializing a range of partitions, in one run
(the assets' backfill policy is a single run) or with `materialize(…, tags=range_tags(a, b))`,
runs one `lakefill backfill` over that range:

- the materialization carries the run id, the published version, the rows changed and the
  report's path; validation is the asset check `lakefill_validation`;
- a validation failure fails the step with the report's summary (nothing was published);
- a conflict (the table moved under the run) asks Dagster to retry.
"""


import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import AssetExecutionContext

from ._models import ModelInfo, models
from .errors import Conflict, ValidationFailed
from .project import Project

CHECK = "lakefill_validation"

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def range_tags(first: str, last: str) -> dict[str, str]:
    """Run tags that materialize partitions `first..last` (inclusive) in one run."""
    return {RANGE_START_TAG: first, RANGE_END_TAG: last}


def partitions_for(info: ModelInfo) -> dg.PartitionsDefinition[Any] | None:
    """The partitions of a model's table, at its grain, from its first partition."""
    if info.grain is None or info.first is None:
        return None
    first = info.first
    if info.grain == "day":
        return dg.DailyPartitionsDefinition(start_date=first[:10])
    if info.grain == "hour":
        return dg.HourlyPartitionsDefinition(
            start_date=first[:10] + "-" + first[11:13] + ":00"
        )
    if info.grain == "month":
        return dg.MonthlyPartitionsDefinition(start_date=first[:7] + "-01")
    if info.grain == "year":
        return dg.TimeWindowPartitionsDefinition(
            cron_schedule="0 0 1 1 *", start=first[:4], fmt="%Y"
        )
    return None


def partition_value(key: str, grain: str | None) -> str:
    """The lakefill partition value of a Dagster partition key."""
    if grain == "hour" and len(key) == 16:
        # Dagster writes hours as `2026-01-02-05:00`.
        return f"{key[:10]} {key[11:16]}:00"
    return key


def lakefill_assets(
    project_path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    reason: str | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    retries_on_conflict: int = 3,
    **backfill_options: Any,
) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    """One asset per model of the project at `project_path` (plus an external asset per table a
    model reads that no model writes). `backfill_options` are passed to every backfill (e.g.
    `allow_edge_moves=True`); `reason` defaults to the Dagster run that materialized it; reports
    go to `report_dir` (default: `<project>/reports`)."""
    project = Project(project_path, dict(env) if env else None)
    infos = models(project)
    written = {info.table for info in infos}
    out: list[dg.AssetsDefinition | dg.AssetSpec] = []
    external = sorted({s for info in infos for s in info.sources} - written)
    for table in external:
        out.append(dg.AssetSpec(key=table, group_name="lakefill", kinds={"delta"}))
    reports = Path(report_dir) if report_dir is not None else project.path / "reports"
    for info in infos:
        out.append(
            _asset(project, info, reason, reports, retries_on_conflict, backfill_options)
        )
    return out


def _asset(
    project: Project,
    info: ModelInfo,
    reason: str | None,
    reports: Path,
    retries: int,
    options: Mapping[str, Any],
) -> dg.AssetsDefinition:
    partitions = partitions_for(info)
    deps: Sequence[str] = [s for s in info.sources if s != info.table]

    @dg.asset(
        name=info.table,
        deps=deps,
        partitions_def=partitions,
        backfill_policy=dg.BackfillPolicy.single_run() if partitions else None,
        check_specs=[dg.AssetCheckSpec(CHECK, asset=info.table)],
        group_name="lakefill",
        kinds={"delta"},
        description=f"`{info.table}`, computed by the lakefill model `{info.model}`",
        metadata={"lakefill/model": info.model, "lakefill/project": str(project.path)},
    )
    def materialize(
        context: AssetExecutionContext,
    ) -> Iterator[dg.MaterializeResult[Any] | dg.AssetCheckResult]:
        start: str | None = None
        end: str | None = None
        if partitions is not None:
            keys = context.partition_key_range
            start = partition_value(keys.start, info.grain)
            end = partition_value(keys.end, info.grain)
        reports.mkdir(parents=True, exist_ok=True)
        report_path = reports / f"{info.model}-{context.run.run_id}.html"
        try:
            run = project.backfill(
                info.model,
                start,
                end,
                reason=reason or f"Dagster run {context.run.run_id}",
                report=str(report_path),
                **options,
            )
        except ValidationFailed as failed:
            report = failed.report
            yield dg.AssetCheckResult(
                check_name=CHECK,
                passed=False,
                metadata={
                    "summary": report.validation.summary,
                    "run_id": report.run_id,
                    "failed_checks": [c.name for c in report.validation.failed_checks],
                },
            )
            raise dg.Failure(
                description=f"{failed.message}: {report.validation.summary}",
                metadata={
                    "run_id": report.run_id,
                    "report": dg.MetadataValue.path(str(report_path)),
                },
            ) from failed
        except Conflict as conflict:
            raise dg.RetryRequested(max_retries=retries, seconds_to_wait=1) from conflict
        context.log.info(f"lakefill run {run.run_id}: {run.outcome}")
        yield dg.MaterializeResult(
            metadata={
                "run_id": run.run_id,
                "outcome": run.outcome,
                "published_version": run.published_version,
                "rows_written": run.rows_written,
                "rows_changed": run.rows_changed,
                "report": dg.MetadataValue.path(str(report_path)),
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name=CHECK,
                    passed=run.validation.passed,
                    metadata={"summary": run.validation.summary},
                )
            ],
        )

    return materialize

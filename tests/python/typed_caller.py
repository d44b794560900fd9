"""A caller of the API, for `mypy --strict`: what a scheduler's code does with the results."""

from __future__ import annotations

import lakefill


def fix(path: str) -> int | None:
    project = lakefill.Project(path)
    plan: lakefill.PlanReport = project.plan("events", "2026-01-02", "2026-01-06")
    if plan.already_published:
        return None
    try:
        run: lakefill.RunReport = project.backfill(
            "events", plan.range.start, plan.range.end, reason="UTC", stage_only=False
        )
    except lakefill.ValidationFailed as failed:
        print(failed.report.validation.summary)
        return None
    except lakefill.Conflict:
        return None
    for item in project.backfill_progress("events", "2026-01-02", "2026-01-06"):
        if isinstance(item, lakefill.ProgressEvent):
            print(item.event)
    return run.published_version

"""lakefill: safe backfills on Delta Lake tables, from Python.

`Project(path)` runs the `lakefill` binary installed with this package, one method per
command, and returns typed documents; exit codes become the exceptions below.
"""

from .documents import (
    Check,
    HistoryEntry,
    PartitionChange,
    PlanPartition,
    PlanReport,
    ProgressEvent,
    Range,
    RunReport,
    RunSummary,
    StaleReport,
    Validation,
)
from .errors import Conflict, LakefillError, UsageError, ValidationFailed
from .project import Project

__all__ = [
    "Check",
    "Conflict",
    "HistoryEntry",
    "LakefillError",
    "PartitionChange",
    "PlanPartition",
    "PlanReport",
    "ProgressEvent",
    "Project",
    "Range",
    "RunReport",
    "RunSummary",
    "StaleReport",
    "UsageError",
    "Validation",
    "ValidationFailed",
]

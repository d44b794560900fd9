"""The JSON documents of the `lakefill` binary, as dataclasses.

Each mirrors the fields of its document that a caller acts on, typed; `document` keeps the whole
document as the binary printed it (the contract is the repository's `docs/reference.md`), so a
field not lifted here is still one key away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Range:
    """A range of partitions, inclusive, at the time column's grain."""

    start: str | None
    end: str | None
    grain: str | None
    include_null: bool

    @classmethod
    def from_json(cls, value: Any) -> Range:
        value = value if isinstance(value, dict) else {}
        return cls(
            start=value.get("from"),
            end=value.get("to"),
            grain=value.get("grain"),
            include_null=bool(value.get("include_null", False)),
        )


@dataclass(frozen=True)
class PartitionChange:
    """One partition of a run: its value, and the rows and files before and after."""

    value: str
    old_rows: int | None
    new_rows: int | None
    old_files: int | None
    new_files: int | None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> PartitionChange:
        return cls(
            value=str(value.get("value")),
            old_rows=_int(value.get("old_rows")),
            new_rows=_int(value.get("new_rows")),
            old_files=_int(value.get("old_files")),
            new_files=_int(value.get("new_files")),
        )


@dataclass(frozen=True)
class Check:
    """One validation check: its name, whether it passed, and its failures."""

    name: str
    passed: bool
    failures: list[Any]
    document: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Check:
        return cls(
            name=str(value.get("name")),
            passed=bool(value.get("passed")),
            failures=list(value.get("failures") or []),
            document=value,
        )


@dataclass(frozen=True)
class Validation:
    """A run's validation: passed, each check, and the old-vs-new comparison."""

    passed: bool
    checks: list[Check]
    comparison: dict[str, Any]

    @classmethod
    def from_json(cls, value: Any) -> Validation:
        value = value if isinstance(value, dict) else {}
        return cls(
            passed=bool(value.get("passed")),
            checks=[Check.from_json(c) for c in value.get("checks") or []],
            comparison=dict(value.get("comparison") or {}),
        )

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    @property
    def summary(self) -> str:
        """One line: passed, or which checks failed."""
        failed = self.failed_checks
        if self.passed or not failed:
            return "validation passed" if self.passed else "validation failed"
        return "validation failed: " + ", ".join(c.name for c in failed)


@dataclass(frozen=True)
class RunReport:
    """A run's report: what `backfill`, `publish`, `discard` and `revert` print."""

    run_id: str
    table: str
    model: str
    model_version: str
    state: str
    outcome: str
    read_version: int | None
    published_version: int | None
    range: Range
    partitions: list[PartitionChange]
    rows_written: int | None
    files_written: int | None
    validation: Validation
    where: str | None
    document: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RunReport:
        return cls(
            run_id=str(value.get("run_id")),
            table=str(value.get("table")),
            model=str(value.get("model")),
            model_version=str(value.get("model_version")),
            state=str(value.get("state")),
            outcome=str(value.get("outcome")),
            read_version=_int(value.get("read_version")),
            published_version=_int(value.get("published_version")),
            range=Range.from_json(value.get("range")),
            partitions=[PartitionChange.from_json(p) for p in value.get("partitions") or []],
            rows_written=_int(value.get("rows_written")),
            files_written=_int(value.get("files_written")),
            validation=Validation.from_json(value.get("validation")),
            where=value.get("where"),
            document=value,
        )

    @property
    def rows_changed(self) -> int:
        """Rows the key diff found added, removed or changed (0 when it was not computed)."""
        totals = self.validation.comparison.get("totals")
        if not isinstance(totals, dict):
            return 0
        return sum(
            v
            for k, v in totals.items()
            if k in ("added", "removed", "changed") and isinstance(v, int)
        )


@dataclass(frozen=True)
class PlanPartition:
    """A partition the plan would replace, as the log has it now."""

    value: str
    rows: int | None
    files: int | None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> PlanPartition:
        return cls(
            value=str(value.get("value")),
            rows=_int(value.get("rows")),
            files=_int(value.get("files")),
        )


@dataclass(frozen=True)
class PlanReport:
    """What `plan` prints: the scope of a backfill, before anything is written."""

    run_id: str
    model: str
    model_version: str
    fingerprint: str
    target: str
    target_uri: str
    resolved_location: str | None
    read_version: int | None
    range: Range
    partitions: list[PlanPartition]
    already_published: bool
    document: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> PlanReport:
        return cls(
            run_id=str(value.get("run_id")),
            model=str(value.get("model")),
            model_version=str(value.get("model_version")),
            fingerprint=str(value.get("fingerprint")),
            target=str(value.get("target")),
            target_uri=str(value.get("target_uri")),
            resolved_location=value.get("resolved_location"),
            read_version=_int(value.get("read_version")),
            range=Range.from_json(value.get("range")),
            partitions=[PlanPartition.from_json(p) for p in value.get("partitions") or []],
            already_published=bool(value.get("already_published")),
            document=value,
        )


@dataclass(frozen=True)
class RunSummary:
    """One run as `runs` lists it, reconciled with the Delta log."""

    run_id: str
    table: str
    model: str
    model_version: str
    state: str
    range: Range
    read_version: int | None
    published_version: int | None
    validation_passed: bool | None
    error: str | None
    document: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> RunSummary:
        passed = value.get("validation_passed")
        return cls(
            run_id=str(value.get("run_id")),
            table=str(value.get("table")),
            model=str(value.get("model")),
            model_version=str(value.get("model_version")),
            state=str(value.get("state")),
            range=Range.from_json(value.get("range")),
            read_version=_int(value.get("read_version")),
            published_version=_int(value.get("published_version")),
            validation_passed=passed if isinstance(passed, bool) else None,
            error=value.get("error"),
            document=value,
        )


@dataclass(frozen=True)
class HistoryEntry:
    """One version of a table as `history` shows it."""

    version: int
    operation: str
    run_id: str | None
    model: str | None
    reason: str | None
    timestamp: Any
    document: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> HistoryEntry:
        return cls(
            version=int(value.get("version") or 0),
            operation=str(value.get("operation")),
            run_id=value.get("run_id"),
            model=value.get("model"),
            reason=value.get("reason"),
            timestamp=value.get("timestamp"),
            document=value,
        )


@dataclass(frozen=True)
class StaleReport:
    """What `stale` found: whether anything needs a refresh, per table."""

    stale: bool
    tables: list[dict[str, Any]]
    document: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> StaleReport:
        return cls(
            stale=bool(value.get("stale")),
            tables=list(value.get("tables") or []),
            document=value,
        )

    @property
    def commands(self) -> list[str]:
        """The commands that refresh every stale range."""
        out: list[str] = []
        for table in self.tables:
            for group in ("stale", "outdated"):
                for entry in table.get(group) or []:
                    command = entry.get("command") if isinstance(entry, dict) else None
                    if isinstance(command, str):
                        out.append(command)
        return out


@dataclass(frozen=True)
class ProgressEvent:
    """A run's progress: `started`, `batch_finished`, `phase`, `finished`, as the binary reports
    it; `fields` holds the rest of the event."""

    event: str
    run_id: str | None
    fields: dict[str, Any]

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ProgressEvent:
        return cls(event=str(value.get("event")), run_id=value.get("run_id"), fields=value)

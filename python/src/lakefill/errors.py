"""Exit codes of the `lakefill` binary, as exceptions.

| exit | exception |
|---|---|
| 1 | `LakefillError` (runtime error) |
| 2 | `UsageError` (usage or configuration) |
| 3 | `ValidationFailed` (nothing published; `.report` says why) |
| 4 | `Conflict` (the target moved, or another process holds the run; safe to retry) |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .documents import RunReport


class LakefillError(Exception):
    """A `lakefill` command failed; `exit_code`, `hint` and the JSON `document` say how."""

    exit_code: int
    hint: str | None
    document: dict[str, Any]

    def __init__(
        self,
        message: str,
        *,
        exit_code: int = 1,
        hint: str | None = None,
        document: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message if hint is None else f"{message}\nhint: {hint}")
        self.message = message
        self.exit_code = exit_code
        self.hint = hint
        self.document = document or {}

    @property
    def run_id(self) -> str | None:
        """The run the failure is about, if any."""
        value = self.document.get("run_id")
        return value if isinstance(value, str) else None


class UsageError(LakefillError):
    """Exit 2: a usage or configuration error (a flag, the project file, a model file)."""


class ValidationFailed(LakefillError):
    """Exit 3: validation failed and nothing was published; `report` is the run's report."""

    report: RunReport

    def __init__(self, message: str, *, report: RunReport, hint: str | None = None) -> None:
        super().__init__(message, exit_code=3, hint=hint, document=report.document)
        self.report = report


class Conflict(LakefillError):
    """Exit 4: the target changed under the run, or another process holds it. Nothing was
    published; running the same command again is safe."""

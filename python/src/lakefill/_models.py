"""The models of a project as an orchestrator needs them: each model's table, the tables it
reads, its time grain and the partitions its table has, from `lakefill plan MODEL --where TRUE`
(the whole table, written nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._runner import raise_for
from .errors import LakefillError
from .project import Project


@dataclass(frozen=True)
class ModelInfo:
    """One model: its table, the tables it reads, its grain, and its table's first and last
    partition (None for a table with no time column)."""

    model: str
    table: str
    sources: tuple[str, ...]
    grain: str | None
    first: str | None
    last: str | None


def models(project: Project) -> list[ModelInfo]:
    """Every model under `sql/`, as its newest version plans it over the whole table."""
    sql = Path(project.path) / "sql"
    names = sorted(p.name for p in sql.iterdir() if p.is_dir() and any(p.glob("*.sql")))
    out: list[ModelInfo] = []
    for name in names:
        completed = project.run("plan", name, "--where", "TRUE")
        try:
            raise_for(completed)
        except LakefillError as error:
            context = f"cannot plan model `{name}` over its whole table: "
            error.message = context + error.message
            error.args = (context + str(error.args[0]),)
            raise
        document = completed.document if isinstance(completed.document, dict) else {}
        layout = document.get("layout") or {}
        time = layout.get("time") if isinstance(layout, dict) else None
        grain = time.get("grain") if isinstance(time, dict) else None
        span = document.get("range") or {}
        out.append(
            ModelInfo(
                model=name,
                table=str(document.get("target")),
                sources=tuple(
                    str(s.get("table")) for s in document.get("sources") or [] if isinstance(s, dict)
                ),
                grain=grain if isinstance(grain, str) else None,
                first=span.get("from") if grain else None,
                last=span.get("to") if grain else None,
            )
        )
    return out

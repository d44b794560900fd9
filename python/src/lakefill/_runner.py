"""Runs the `lakefill` binary and turns its JSON contract into results and exceptions.

The Python API drives the binary rather than binding the engine through PyO3: the binary is
what `pip install` puts on the PATH anyway, so one build serves both; its JSON documents and exit
codes are the stable contract the tests hold it to; and a run keeps its process boundary (Ctrl-C,
memory limits, a crash that cannot take the caller's interpreter down). A PyO3 extension would
compile the whole engine (DataFusion, delta-rs) a second time as a library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Conflict, LakefillError, UsageError


def binary() -> str:
    """The `lakefill` binary: `LAKEFILL_BIN`, else the one installed with this package, else the
    one on the PATH."""
    explicit = os.environ.get("LAKEFILL_BIN")
    if explicit:
        if not Path(explicit).is_file():
            raise LakefillError(
                f"LAKEFILL_BIN names `{explicit}`, which is not a file",
                hint="point LAKEFILL_BIN at the `lakefill` binary, or unset it",
            )
        return explicit
    name = "lakefill.exe" if sys.platform == "win32" else "lakefill"
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise LakefillError(
            "the `lakefill` binary was not found",
            hint="install the package (`pip install ./python`), or set LAKEFILL_BIN to the binary",
        )
    return found


def flags(options: dict[str, Any]) -> list[str]:
    """`--kebab-case` flags from keyword arguments: `True` is a bare flag, `False` and `None` are
    left out, a list repeats the flag, anything else is its value."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.rstrip("_").replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                out.extend([flag, str(item)])
        else:
            out.extend([flag, str(value)])
    return out


@dataclass
class Completed:
    """One finished command: its exit code, its JSON document, and what it said on stderr."""

    exit_code: int
    document: Any
    stderr: str
    events: list[dict[str, Any]] = field(default_factory=list)


def error_line(stderr: str) -> str:
    """The `error: …` line of stderr (or its last line)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("error: "):
            return line[len("error: ") :]
    return lines[-1] if lines else "lakefill failed"


def hint_of(stderr: str) -> str | None:
    for line in stderr.splitlines():
        if line.startswith("hint: "):
            return line[len("hint: ") :]
    return None


def raise_for(completed: Completed, allowed: tuple[int, ...] = (0,)) -> None:
    """Raises the exception of a failed command's exit code (3 is left to the caller, which has
    the report)."""
    code = completed.exit_code
    if code in allowed:
        return
    document = completed.document if isinstance(completed.document, dict) else {}
    message = str(document.get("error") or error_line(completed.stderr))
    hint = document.get("hint") or hint_of(completed.stderr)
    kind: type[LakefillError] = LakefillError
    if code == 2:
        kind = UsageError
    elif code == 4:
        kind = Conflict
    raise kind(message, exit_code=code, hint=hint, document=document)


class Runner:
    """Runs commands of one project directory."""

    def __init__(self, project: Path, env: dict[str, str] | None = None) -> None:
        self.project = project
        self.env = env

    def command(self, args: list[str]) -> list[str]:
        return [binary(), "--project", str(self.project), "--output-format", "json", *args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        return env

    def run(self, args: list[str]) -> Completed:
        process = subprocess.run(
            self.command(args),
            capture_output=True,
            text=True,
            env=self.environment(),
            check=False,
        )
        return parse(process.returncode, process.stdout, process.stderr)

    def stream(self, args: list[str]) -> Iterator[dict[str, Any] | Completed]:
        """Runs a command, yielding each progress event (a dict with `event`) as it comes, then
        the finished command."""
        process = subprocess.Popen(
            self.command(args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.environment(),
        )
        assert process.stdout is not None and process.stderr is not None
        stdout_chunks: list[str] = []
        reader = threading.Thread(target=lambda: stdout_chunks.append(process.stdout.read()))  # type: ignore[union-attr]
        reader.start()
        other: list[str] = []
        events: list[dict[str, Any]] = []
        for line in process.stderr:
            event = progress_event(line)
            if event is None:
                other.append(line)
            else:
                events.append(event)
                yield event
        code = process.wait()
        reader.join()
        completed = parse(code, "".join(stdout_chunks), "".join(other))
        completed.events = events
        yield completed


def progress_event(line: str) -> dict[str, Any] | None:
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(value, dict) and "event" in value:
        return value
    return None


def parse(code: int, stdout: str, stderr: str) -> Completed:
    document: Any = None
    if stdout.strip():
        try:
            document = json.loads(stdout)
        except json.JSONDecodeError:
            document = None
    return Completed(exit_code=code, document=document, stderr=stderr)

"""The library's one error tree.

Library code raises these; only the CLI (``gpuctl.cli``) turns them into messages and exit codes.
Constructors never log or print.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an input file, located as precisely as the input allows."""

    message: str
    path: str = ""
    file: str | None = None
    line: int | None = None
    column: int | None = None

    def location(self) -> str:
        """``file:line:column`` (the parts that are known)."""
        parts = [self.file or "<input>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.location()}: {where}{self.message}"


class GpuctlError(Exception):
    """Base of every error gpuctl raises on purpose (an expected failure, not a bug)."""


class ConfigError(GpuctlError):
    """A cluster.yml (or another input file) is invalid; ``problems`` lists every finding."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid configuration")


class UsageError(GpuctlError):
    """A command was asked for something it cannot do (bad option combination, existing file)."""


class EnvironmentProblem(GpuctlError):
    """This machine cannot do what was asked: not root, a tool missing, a command failing."""


class RenderError(GpuctlError):
    """Writing rendered files failed (template error, unwritable directory)."""

"""Consoles and the rendering of errors. Human text goes to stderr, machine output to stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpuctl.errors import ConfigError, GpuctlError


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def out_console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # piped: do not crop tables to 80 columns
        console = Console(highlight=False, width=160)
    return console


def print_error(exc: GpuctlError) -> None:
    """One line per problem: ``file:line:col: path: message``."""
    console = err_console()
    if isinstance(exc, ConfigError) and exc.problems:
        for problem in exc.problems:
            console.print(f"[red]error[/red]: {escape(str(problem))}")
        n = len(exc.problems)
        console.print(f"{n} problem{'s' if n != 1 else ''} found")
    else:
        console.print(f"[red]error[/red]: {escape(str(exc))}")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")

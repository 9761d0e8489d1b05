"""`gpuctl report RESULTS.json`: render saved validation results into other formats."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import err_console
from gpuctl.errors import ConfigError, Problem, UsageError
from gpuctl.validation.reports import (
    drain_reasons,
    render_html,
    render_junit,
    render_prometheus,
)
from gpuctl.validation.results import ValidationReport
from gpuctl.validation.suite import fewer_gc_passes


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def _load(path: Path) -> ValidationReport:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ValidationReport.from_json(data)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError([Problem(f"not gpuctl results: {exc}", file=str(path))]) from None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # textfile collectors must never read a half-written file


def report(
    results: Annotated[Path, typer.Argument(help="results.json written by gpuctl validate.")],
    html: Annotated[Path | None, typer.Option("--html", help="Write one HTML file.")] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML.")] = None,
    prom: Annotated[
        Path | None,
        typer.Option(
            "--prom", help="Directory for gpuctl.prom (node_exporter textfile).", file_okay=False
        ),
    ] = None,
    drain: Annotated[
        bool, typer.Option("--drain-reasons", help="Print `NODE<TAB>reason` per failed node.")
    ] = False,
) -> None:
    """Render saved results as HTML, JUnit XML, Prometheus metrics or Slurm drain reasons.

    Exit 0 when no node failed, 1 when some did, 2 when the results cannot be read.
    """
    rep = _load(results)
    if not any((html, junit, prom, drain)):
        raise UsageError("name at least one of --html, --junit, --prom, --drain-reasons")
    console = err_console()
    with fewer_gc_passes():
        try:
            if html is not None:
                _write(html, render_html(rep))
                console.print(f"wrote {escape(str(html))}")
            if junit is not None:
                _write(junit, render_junit(rep))
                console.print(f"wrote {escape(str(junit))}")
            if prom is not None:
                _write(prom / "gpuctl.prom", render_prometheus(rep))
                console.print(f"wrote {escape(str(prom / 'gpuctl.prom'))}")
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename}: {exc.strerror}") from None
    if drain:
        for node, reason in drain_reasons(rep).items():
            typer.echo(f"{node}\t{reason}")
    s = rep.summary()
    console.print(f"{s['nodes']} nodes: {s['failed']} failed")
    if rep.failed:
        raise typer.Exit(ExitCode.CHECK_FAILED)

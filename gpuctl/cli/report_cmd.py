"""`gpuctl report RESULTS.json`: render saved validation results into other formats."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import err_console
from gpuctl.cli.validate_cmd import write_report_files
from gpuctl.errors import ConfigError, Problem, UsageError
from gpuctl.fileio import TooLarge, UnsafePath, read_regular
from gpuctl.validation.reports.drain import drain_reasons
from gpuctl.validation.results import NotResults, ValidationReport, loads_results

# a 1,024-node run writes ~20 MB of results.json; a device or a pipe is never read at all
MAX_RESULTS = 512 << 20


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def _load(path: Path) -> ValidationReport:
    try:
        raw = read_regular(path, limit=MAX_RESULTS)
    except (UnsafePath, TooLarge) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return loads_results(raw)
    except NotResults as exc:
        raise ConfigError([Problem(f"not gpuctl results: {exc}", file=str(path))]) from None


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
    write_report_files(rep, html, junit, prom)
    console = err_console()
    if drain:
        for node, reason in drain_reasons(rep).items():
            typer.echo(f"{node}\t{reason}")
    s = rep.summary()
    console.print(f"{s['nodes']} nodes: {s['failed']} failed")
    if rep.failed:
        raise typer.Exit(ExitCode.CHECK_FAILED)

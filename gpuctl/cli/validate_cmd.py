"""`gpuctl validate CLUSTER`: run the checks of a level on every node and judge them."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import err_console, literal, out_console, print_json
from gpuctl.config import load_cluster
from gpuctl.errors import UsageError
from gpuctl.provision.runner import state_dir_for
from gpuctl.validation.api import ValidateResult, drain_failed, judge_bundle, validate
from gpuctl.validation.bundle import check_bundle_dir
from gpuctl.validation.burn import check_asked, parse_duration, show_duration
from gpuctl.validation.collector import DEFAULT_PARALLEL, LOST_PREFIX, ProgressEvent
from gpuctl.validation.history import history_path
from gpuctl.validation.reports.write import write_reports
from gpuctl.validation.results import ValidationReport, Verdict
from gpuctl.validation.scope import select_nodes
from gpuctl.validation.slurm import DrainResult
from gpuctl.validation.suite import fewer_gc_passes, usable_cores

MAX_PROBLEMS_SHOWN = 4
_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "magenta"}


# text from a node or from Slurm, printed literally (gpuctl.cli.output.literal)
_say = literal


def default_out(cluster_path: Path) -> Path:
    """A new directory ``.gpuctl/validate/<UTC time>`` beside cluster.yml."""
    base = cluster_path.resolve().parent / ".gpuctl" / "validate"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = base / stamp, 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stamp}-{n}"
    return candidate


class LevelChoice(StrEnum):
    QUICK = "quick"
    STANDARD = "standard"
    LONG = "long"
    BURN = "burn"


def register(app: typer.Typer) -> None:
    app.command("validate")(validate_cmd)


def _table(report: ValidationReport) -> Table:
    table = Table()
    table.add_column("node")
    table.add_column("verdict")
    table.add_column("checks", justify="right")
    table.add_column("failed checks")
    for node in report.nodes:
        verdict = node.verdict.value
        style = _STYLE.get(verdict, "")
        problems = node.problems()
        shown = [
            f"{_say(p.check)}"
            + (f" {_say(p.subject)}" if p.subject else "")
            + f": {_say(p.message)}"
            + ("" if p.verdict is Verdict.FAIL else f" ({p.verdict.value})")
            for p in problems[:MAX_PROBLEMS_SHOWN]
        ]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"(+{len(problems) - MAX_PROBLEMS_SHOWN} more)")
        label = f"{verdict}" + (" (failed)" if node.failed and verdict != "fail" else "")
        table.add_row(
            _say(node.node),
            f"[{style}]{label}[/{style}]" if style else label,
            str(len(node.checks)),
            "\n".join(shown) or "-",
        )
    return table


class _Progress:
    """One line per unreachable node as it happens; a count every few nodes on big runs."""

    def __init__(self) -> None:
        self.console = err_console()

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "node" and event.status == "unreachable":
            self.console.print(f"  [red]unreachable[/red]: {_say(event.node)}")
        elif event.kind == "node" and event.total >= 50 and event.done % 50 == 0:
            self.console.print(f"  {event.done}/{event.total} nodes collected")
        elif event.kind == "pair" and event.status == "failed":
            self.console.print(f"  ib_write_bw pair with {_say(event.node)} failed")
        elif event.kind == "lost":
            what = "partner" if event.status == "partner" else "node"
            self.console.print(
                f"  [red]lost[/red]: {what} {_say(event.node)}: {_say(event.detail)}; "
                "its pairs are skipped, its peers paired again"
            )
        elif event.kind == "pair" and event.status == "partner lost":
            self.console.print(f"  ib_write_bw of {_say(event.node)}: partner lost, pairing again")
        elif event.kind == "loopback":
            self.console.print(
                f"  ib_write_bw of {_say(event.node)}: loopback between its own HCAs "
                f"({event.status})"
            )


def write_report_files(
    report: ValidationReport, html: Path | None, junit: Path | None, prom: Path | None
) -> None:
    """Write the reports asked for (side by side for a large report: reports/write.py), then
    name each file written; a file that cannot be written is a usage error."""
    files = [
        (fmt, path)
        for fmt, path in (("html", html), ("junit", junit), ("prom", prom and prom / "gpuctl.prom"))
        if path is not None
    ]
    with fewer_gc_passes():
        try:
            written = write_reports(report, files, jobs=usable_cores())
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename}: {exc.strerror}") from None
    console = err_console()
    for path in written:
        console.print(f"wrote {escape(str(path))}")


def _print_drain(result: DrainResult) -> None:
    console = err_console()
    if result.error is not None:
        console.print(f"[red]error[/red]: --drain-failed: {_say(result.error)}")
        return
    for a in result.actions:
        if a.error is not None:
            console.print(f"[red]error[/red]: {a.action} {_say(a.node)}: {_say(a.error)}")
        elif a.action == "drain":
            console.print(f"drained {_say(a.node)}: {_say(a.reason or '')}")
        elif a.action == "resume":
            console.print(f"resumed {_say(a.node)} (was: {_say(a.reason or '')})")
        else:
            console.print(f"{_say(a.node)}: {_say(a.detail)}")


def validate_cmd(
    cluster: Annotated[Path, typer.Argument(help="The cluster.yml to validate.")],
    level: Annotated[
        LevelChoice | None,
        typer.Option(
            "--level",
            help="quick (seconds), standard (minutes: + NCCL, DCGM, ib_write_bw), long "
            "(+ dcgmi diag -r 3, then multi-node nccl-tests through Slurm per node group) or "
            "burn (long with dcgmi diag -r 4, then DCGM stress and NCCL in a loop for "
            "--duration, sampled by nvidia-smi dmon). "
            "Default: each node group's level in cluster.yml.",
            case_sensitive=False,
        ),
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(
            "--duration",
            help="With --level burn: how long the burn loop runs on each node (4h, 90m, 1h30m).",
        ),
    ] = None,
    limit: Annotated[
        str | None,
        typer.Option("--limit", "-l", help="Only these nodes: gpu[001-004], a node group."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Bundle directory to write (new or empty; default: "
            ".gpuctl/validate/<time> beside cluster.yml).",
            file_okay=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the results (report JSON) to stdout.")
    ] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write one HTML file.")] = None,
    prom: Annotated[
        Path | None,
        typer.Option(
            "--prom", help="Directory for gpuctl.prom (node_exporter textfile).", file_okay=False
        ),
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain-failed",
            help="Drain failed nodes in Slurm (reason `gpuctl: ...`); resume nodes gpuctl "
            "drained that pass now. Never touches a node someone else drained.",
        ),
    ] = False,
    parallel: Annotated[
        int, typer.Option("--parallel", help="Nodes checked at once.", min=1)
    ] = DEFAULT_PARALLEL,
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            help="Judge this saved bundle again, offline (no SSH).",
            file_okay=False,
        ),
    ] = None,
) -> None:
    """Check every node: collect tool outputs over SSH, judge them, report, optionally drain.

    Exit 0 when every node passes, 1 when a node failed (or could not be reached, or a check
    could not tell: UNKNOWN fails unless validation.unknown_is_failure is false), 2 for a bad
    cluster.yml or options.
    """
    console = err_console()
    lvl = level.value if level is not None else None
    if bundle is not None:
        if duration is not None:
            raise UsageError("--bundle judges a saved bundle: --duration is the one it records")
        if out is not None:
            raise UsageError("--bundle judges a saved bundle: --out does not apply")
        if drain:
            raise UsageError("--bundle is offline: --drain-failed needs a fresh validation")
        check_bundle_dir(bundle)
        loaded = load_cluster(cluster)
        result: ValidateResult = judge_bundle(loaded, bundle, level=lvl, limit=limit)
        if not result.complete:
            console.print(
                "[yellow]warning[/yellow]: this bundle is from a collection that did not "
                "finish; what it lacks is judged unknown"
            )
        for line in result.warnings:
            console.print(f"[yellow]warning[/yellow]: {_say(line)}")
    else:
        check_asked(lvl, duration is not None)  # before anything is printed or read
        burn_s = parse_duration(duration) if duration is not None else None
        loaded = load_cluster(cluster)
        count = len(select_nodes(loaded, limit))  # the header says the real numbers
        burning = f" for {show_duration(burn_s)}" if burn_s is not None else ""
        console.print(
            f"validating {escape(str(cluster))} (level {lvl or 'from cluster.yml'}{burning}, "
            f"{count} node{'s' if count != 1 else ''}, {min(parallel, count)} at a time)"
        )
        out = out if out is not None else default_out(cluster)
        result = validate(loaded, level=lvl, limit=limit, out=out, parallel=parallel,
                          on_progress=_Progress(), burn_s=burn_s,
                          history=history_path(state_dir_for(cluster)))  # fmt: skip
    report = result.report
    write_report_files(report, html, junit, prom)
    drained: DrainResult | None = None
    if drain:
        drained = drain_failed(loaded, report)
    if as_json:
        print_json(report.to_json())
    else:
        out_console().print(_table(report))
    if drained is not None:
        _print_drain(drained)
    s = report.summary()
    where = f" in {result.seconds:.0f} s" if bundle is None else ""
    lost = sum(1 for why in result.unreachable.values() if why.startswith(LOST_PREFIX))
    console.print(
        f"{s['nodes']} nodes: {s['failed']} failed, {len(result.unreachable)} unreachable"
        f"{f' ({lost} lost during the run)' if lost else ''}"
        f"{where}; bundle: {escape(str(result.bundle))}"
    )
    if report.failed or (drained is not None and drained.failed):
        raise typer.Exit(ExitCode.CHECK_FAILED)

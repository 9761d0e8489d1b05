"""`gpuctl acceptance`: the acceptance suite (pytest + testinfra) against a provisioned cluster."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gpuctl.acceptance.runner import AcceptanceResult, Outcome, execute, prepare
from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import err_console, out_console, print_json
from gpuctl.config import load_cluster
from gpuctl.provision.runner import state_dir_for


def register(app: typer.Typer) -> None:
    app.command("acceptance")(acceptance_cmd)


def run_acceptance(
    cluster_path: Path,
    *,
    limit: str | None = None,
    junit: Path | None = None,
    test_dirs: Sequence[Path] = (),
    state_dir: Path | None = None,
    on_output: Callable[[str], None] | None = None,
) -> AcceptanceResult:
    """`gpuctl acceptance CLUSTER`: load cluster.yml, prepare a run directory (under the state
    directory, by default beside cluster.yml), run the suite, read the report."""
    run = prepare(
        load_cluster(cluster_path),
        state_dir=state_dir_for(cluster_path, state_dir),
        limit=limit,
        junit=junit,
        test_dirs=test_dirs,
    )
    return execute(run, on_output)


def _table(result: AcceptanceResult) -> Table:
    cols: tuple[Outcome, ...] = ("passed", "failed", "error", "skipped")
    table = Table()
    table.add_column("host")
    for col in cols:
        table.add_column(col, justify="right")
    for host in result.run.hosts:
        c = result.counts(host)
        style = "red" if c["failed"] or c["error"] else "green"
        table.add_row(f"[{style}]{escape(host)}[/{style}]", *(str(c[k]) for k in cols))
    other = [t for t in result.tests if t.host is None]
    if other:
        c = result.counts(None)
        per_host = [result.counts(h) for h in result.run.hosts]
        rest = {k: c[k] - sum(p[k] for p in per_host) for k in c}
        table.add_row("(no host)", *(str(rest[k]) for k in cols))
    return table


def acceptance_cmd(
    cluster: Annotated[Path, typer.Argument(help="The cluster.yml whose nodes to test.")],
    limit: Annotated[
        str | None,
        typer.Option("--limit", "-l", help="Only these hosts: gpu[001-004], a group, a pattern."),
    ] = None,
    junit: Annotated[
        Path | None,
        typer.Option("--junit", help="Write the JUnit XML report here (default: in the run dir)."),
    ] = None,
    tests: Annotated[
        list[Path] | None,
        typer.Option(
            "--tests",
            help="A folder of your own test_*.py files to run too (repeatable); they get the "
            "`host` and `node` fixtures.",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir", help="Where runs are kept (default: .gpuctl beside cluster.yml)."
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result, per test and host, as JSON.")
    ] = False,
) -> None:
    """Test the installed state of every node (packages, holds, services, files, devices)
    against the rendered configuration. Exit 0 all passed, 1 a test failed, 2 config error."""
    console = err_console()

    def show(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    result = run_acceptance(
        cluster,
        limit=limit,
        junit=junit,
        test_dirs=tuple(tests or ()),
        state_dir=state_dir,
        on_output=show,
    )
    if as_json:
        print_json(result.to_json())
    else:
        out_console().print(_table(result))
    c = result.counts()
    console.print(
        f"acceptance {result.status}: {c['passed']} passed, {c['failed']} failed, "
        f"{c['error']} errors, {c['skipped']} skipped (not applicable) in "
        f"{result.seconds:.0f} s; JUnit: {escape(str(result.run.junit))}; "
        f"log: {escape(str(result.run.run_dir / 'pytest.log'))}"
    )
    if result.message:
        console.print(escape(result.message))
    code = {"passed": ExitCode.OK, "failed": ExitCode.CHECK_FAILED}.get(
        result.status, ExitCode.CONFIG
    )
    raise typer.Exit(code)

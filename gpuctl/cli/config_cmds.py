"""Commands about cluster.yml itself: init, check, schema, render."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gpuctl.cli.output import err_console, out_console, print_json
from gpuctl.config import load_cluster
from gpuctl.config.derived import ClusterSummary, summarize
from gpuctl.config.schema import json_schema
from gpuctl.errors import ConfigError, Problem, UsageError
from gpuctl.fileio import write_atomic
from gpuctl.render import render_cluster
from gpuctl.starter import PROFILES, starter

ClusterArg = Annotated[
    Path,
    typer.Argument(help="The cluster.yml to read.", show_default=False),
]


def register(app: typer.Typer) -> None:
    app.command("init")(init)
    app.command("check")(check)
    app.command("schema")(schema)
    app.command("render")(render)


def _profile_names() -> list[str]:
    return list(PROFILES)


def init(
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            "-p",
            help=f"Cluster shape: {', '.join(PROFILES)}.",
            autocompletion=_profile_names,
        ),
    ] = "hgx-h100",
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", "-n", help="Compute nodes (default: the profile's).", min=1),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="Write here (`-`: stdout, the default).", dir_okay=False
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter cluster.yml for a common cluster shape."""
    text = starter(profile, nodes)
    if output is None or str(output) == "-":
        typer.echo(text, nl=False)
        return
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    try:
        if not output.parent.is_dir():  # never made: a typo in the path should not succeed
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(output))
        write_atomic(output, text)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror}") from None
    err_console().print(
        f"wrote {escape(str(output))} (profile {profile}); "
        f"check it with: gpuctl check {escape(str(output))}"
    )


def check(
    cluster: ClusterArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Validate a cluster.yml and summarize it (nodes, GPUs, fabrics, versions)."""
    try:
        summary = summarize(load_cluster(cluster))
    except ConfigError as exc:
        if as_json:  # machines get the problems on stdout too; the boundary prints them for people
            print_json({"valid": False, "problems": [_problem_json(p) for p in exc.problems]})
        raise
    if as_json:
        print_json({"valid": True, **summary.to_json()})
        return
    _print_summary(summary)


def _problem_json(problem: Problem) -> dict[str, object]:
    return {
        "file": problem.file,
        "line": problem.line,
        "column": problem.column,
        "path": problem.path,
        "message": problem.message,
    }


def _print_summary(s: ClusterSummary) -> None:
    console = out_console()
    roles = ", ".join(f"{n} {r}" for r, n in s.nodes_by_role.items())
    gpus = ", ".join(f"{n} x {m}" for m, n in s.gpus_by_model.items()) or "none"
    console.print(f"cluster {escape(s.name)}: valid")
    console.print(f"  nodes     {s.node_count} ({roles})")
    console.print(f"  gpus      {s.gpu_count} ({gpus})")
    console.print(
        f"  slurm     controller {escape(s.controller)}, partitions {', '.join(s.partitions)}"
    )
    table = Table(title=None, show_edge=False, pad_edge=False)
    for col in ("group", "roles", "nodes", "gpus/node", "interconnect", "nics", "level"):
        table.add_column(col)
    for g in s.groups:
        table.add_row(
            escape(g.name),
            ",".join(g.roles),
            f"{escape(g.nodes)} ({g.node_count})",
            f"{g.gpus_per_node} x {g.gpu_model}" if g.gpu_model else "-",
            g.interconnect or "-",
            escape(" ".join(g.nics)) or "-",
            g.validation_level,
        )
    console.print(table)
    if s.fabrics:
        ftable = Table(show_edge=False, pad_edge=False)
        for col in ("fabric", "kind", "rate", "nodes", "leaves", "spines"):
            ftable.add_column(col)
        for f in s.fabrics:
            kind = f"{f.kind} {f.generation.upper()}" if f.generation else f.kind
            ftable.add_row(
                escape(f.name),
                kind,
                f"{f.rate_gbps} Gb/s",
                str(f.nodes),
                str(f.leaves),
                str(f.spines),
            )
        console.print(ftable)
    versions = ", ".join(f"{k} {v}" for k, v in s.versions.items() if v is not None)
    console.print(f"  versions  {versions}")
    for warning in s.warnings:
        err_console().print(f"[yellow]warning[/yellow]: {escape(warning)}")


def schema(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of stdout.", dir_okay=False),
    ] = None,
) -> None:
    """Print the JSON Schema of cluster.yml (for yaml-language-server and other editors)."""
    text = json.dumps(json_schema(), indent=2) + "\n"
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        if not output.parent.is_dir():  # never made: a typo in the path should not succeed
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(output))
        write_atomic(output, text)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror}") from None


def render(
    cluster: ClusterArg,
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Directory to write into.", file_okay=False),
    ],
) -> None:
    """Render the Ansible inventory, ansible.cfg and Slurm configuration files."""
    result = render_cluster(load_cluster(cluster), output)
    console = err_console()
    console.print(
        f"rendered {len(result.written)} files into {escape(str(result.directory))} "
        "(mode 0600, folder 0700: they can hold proxy credentials)"
    )
    if result.removed:
        console.print(
            f"removed {len(result.removed)} files of an earlier render: "
            f"{escape(', '.join(result.removed[:10]))}"
            + (" ..." if len(result.removed) > 10 else "")
        )

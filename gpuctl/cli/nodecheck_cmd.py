"""`gpuctl node-check`: the validation suite on this node alone; drains it in Slurm on failure.

Also the whole of the light `gpuctl-node-check` entry point (:mod:`gpuctl.cli.nodecheck_main`)
that Slurm runs as HealthCheckProgram on every node every HealthCheckInterval, so this module
imports only what node-check needs: no rich, no provisioning, no Jinja.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.config import load_cluster
from gpuctl.validation.nodecheck import (
    DEFAULT_CLUSTER,
    NodeCheckResult,
    check_options,
    node_check,
)
from gpuctl.validation.results import Verdict, printable


class NodeLevel(StrEnum):
    QUICK = "quick"
    STANDARD = "standard"


def register(app: typer.Typer) -> None:
    app.command("node-check")(node_check_cmd)


def _err(line: str) -> None:
    # messages carry text from the node and from Slurm: control characters are escaped (an
    # ESC sequence from a kernel log line must not reach the terminal or slurmd's log)
    sys.stderr.write(printable(line) + "\n")


def _print_result(result: NodeCheckResult) -> None:
    node = result.node_report
    label = node.verdict.value + (
        " (failed)" if result.failed and node.verdict.value != "fail" else ""
    )
    lines = [
        f"{result.node}: {label} ({result.level}: {len(node.checks)} checks in "
        f"{result.seconds:.2f} s)"
    ]
    for c in node.checks:
        if c.verdict is Verdict.OK:
            continue
        subject = f" {c.subject}" if c.subject else ""
        lines.append(f"  {c.verdict.value:<7} {c.check}{subject}: {c.message}")
    sys.stdout.write("\n".join(printable(line) for line in lines) + "\n")


def _print_slurm(result: NodeCheckResult) -> None:
    a = result.slurm
    if result.slurm_error is not None:
        _err(f"error: Slurm: {result.slurm_error}")
    elif a is None:
        if result.slurm_note:
            _err(f"Slurm: {result.slurm_note}")
    elif a.error is not None:
        _err(f"error: {a.action} {a.node}: {a.error}")
    elif a.action == "drain":
        _err(f"drained {a.node}: {a.reason}")
    elif a.action == "resume":
        _err(f"resumed {a.node} (was: {a.reason})")
    else:
        _err(f"Slurm: {a.node}: {a.detail}")


def node_check_cmd(
    cluster: Annotated[
        Path,
        typer.Option(
            "--cluster", help="The cluster.yml (provisioning copies it here).", dir_okay=False
        ),
    ] = DEFAULT_CLUSTER,
    level: Annotated[
        NodeLevel,
        typer.Option(
            "--level",
            help="quick (seconds: GPUs, topology, Xid, Fabric Manager, IB ports) or standard "
            "(+ nccl-tests and dcgmi diag -r 2: minutes, loads the GPUs).",
            case_sensitive=False,
        ),
    ] = NodeLevel.QUICK,
    node: Annotated[
        str | None,
        typer.Option(
            "--node", help="This node's name in cluster.yml (default: the short host name)."
        ),
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain/--no-drain",
            help="Drain this node in Slurm when it fails (reason `gpuctl node-check: ...`), "
            "resume it when it passes and node-check had drained it. Never touches a node "
            "drained or down for another reason.",
        ),
    ] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as JSON to stdout.")
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Keep the raw outputs in this bundle directory (new or empty); `gpuctl "
            "validate --bundle` judges it again.",
            file_okay=False,
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            "--deadline",
            help="End every probe still running this many seconds after the start (it counts "
            "as timed out). slurmd kills a HealthCheckProgram after 60 s.",
            min=1,
        ),
    ] = None,
) -> None:
    """Check this node with the validation suite, alone; drain it in Slurm when it fails.

    Exit 0 when it passes (and Slurm was updated as needed), 1 when it failed (FAIL, or UNKNOWN
    unless validation.unknown_is_failure is false) or scontrol failed, 2 for a bad cluster.yml,
    options or a node not in it.
    """
    check_options(level.value, deadline)
    result = node_check(
        load_cluster(cluster),
        source=cluster,
        node=node,
        level=level.value,
        drain=drain,
        out=out,
        deadline_s=deadline,
    )
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _print_result(result)
    _print_slurm(result)
    if result.failed or result.slurm_failed:
        raise typer.Exit(ExitCode.CHECK_FAILED)

"""`gpuctl provision` and `gpuctl logs`."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import err_console, out_console, print_json
from gpuctl.config import load_cluster
from gpuctl.provision import (
    HostOutcome,
    ProgressEvent,
    ProvisionResult,
    find_run,
    provision,
    read_log,
    state_dir_for,
)

_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "red",
    "unreachable": "red",
    "incomplete": "magenta",
    "skipped": "cyan",
    "ignored": "cyan",
}


def register(app: typer.Typer) -> None:
    app.command("provision")(provision_cmd)
    app.command("logs")(logs_cmd)


class _Progress:
    """Live view: the current play and task, and per-host result counts so far."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.play = ""
        self.task = ""
        self.counts: dict[str, Counter[str]] = {}
        self.live: Live | None = None
        if console.is_terminal:
            self.live = Live(self._render(), console=console, refresh_per_second=8, transient=True)

    def _render(self) -> Group:
        table = Table(box=None, pad_edge=False)
        table.add_column("host")
        for col in ("ok", "changed", "failed", "unreachable", "skipped"):
            table.add_column(col, justify="right", style=_STYLE[col])
        for host, c in sorted(self.counts.items()):
            table.add_row(
                escape(host),
                *(str(c[k]) for k in ("ok", "changed", "failed", "unreachable", "skipped")),
            )
        head = Text.assemble(("play ", "bold"), self.play, ("  task ", "bold"), self.task)
        return Group(head, table)

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "play":
            self.play, self.task = event.play, ""
            if self.live is None:
                self.console.print(f"play: {escape(event.play)}")
        elif event.kind == "task":
            self.task = event.task
        else:
            self.counts.setdefault(event.host, Counter())[event.status] += 1
            if self.live is None and event.status in ("failed", "unreachable"):
                self.console.print(
                    f"  [red]{event.status}[/red]: {escape(event.host)}: {escape(event.task)}"
                )
        if self.live is not None:
            self.live.update(self._render())


def _host_table(hosts: dict[str, HostOutcome]) -> Table:
    table = Table(title=None)
    table.add_column("host")
    table.add_column("state")
    for col in ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored"):
        table.add_column(col, justify="right")
    for host, o in sorted(hosts.items()):
        style = _STYLE.get(o.state, "")
        table.add_row(
            escape(host),
            f"[{style}]{o.state}[/{style}]" if style else o.state,
            *(
                str(v)
                for v in (o.ok, o.changed, o.failed, o.unreachable, o.skipped, o.rescued, o.ignored)
            ),
        )
    return table


def _check_mode_note(hosts: dict[str, HostOutcome]) -> str:
    """What a --check run says beside its table: its ``changed`` counts are what a real run
    would change (nothing was applied)."""
    changes = sum(o.changed for o in hosts.values())
    if not changes:
        return " (check mode: nothing would change)"
    where = sum(1 for o in hosts.values() if o.changed)
    return (
        f" (check mode: would change {changes} task{'s' if changes != 1 else ''} on {where} "
        f"host{'s' if where != 1 else ''}; nothing was applied)"
    )


def _exit_code(result: ProvisionResult) -> ExitCode:
    status = result.record.status
    if status == "successful":
        return ExitCode.OK
    if status == "canceled":
        return ExitCode.INTERRUPTED
    return ExitCode.CHECK_FAILED


def provision_cmd(
    cluster: Annotated[Path, typer.Argument(help="The cluster.yml to provision.")],
    limit: Annotated[
        str | None,
        typer.Option("--limit", "-l", help="Only these hosts: gpu[001-004], a group, a pattern."),
    ] = None,
    tags: Annotated[
        str | None, typer.Option("--tags", "-t", help="Only these role tags (comma-separated).")
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Report what would change; change nothing.")
    ] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Re-run only the hosts that failed or were unreachable."),
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir", help="Where runs are kept (default: .gpuctl beside cluster.yml)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run record as JSON.")] = False,
) -> None:
    """Install and configure the cluster: driver, Fabric Manager, NCCL, RDMA, DCGM, Slurm."""
    loaded = load_cluster(cluster)
    console = err_console()
    cancel = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        console.print("cancelling: stopping Ansible (Ctrl-C again to abandon it)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    progress = _Progress(console)
    try:
        if progress.live is not None:
            progress.live.start()
        result = provision(
            loaded,
            cluster_file=cluster,
            state_dir=state_dir_for(cluster, state_dir),
            limit=limit,
            tags=tags,
            check=check,
            diff=diff,
            resume=resume,
            on_event=progress,
            cancel=cancel,
        )
    finally:
        if progress.live is not None:
            progress.live.stop()
        signal.signal(signal.SIGINT, previous)
    record = result.record
    if as_json:
        print_json(record.to_json())
    elif result.nothing_to_do:
        console.print(
            f"nothing to resume: run {record.run_id} {record.message.removeprefix('the ')}"
        )
    else:
        out_console().print(_host_table(record.hosts))
    if not result.nothing_to_do:
        where = escape(str(result.run_dir))
        mode = _check_mode_note(record.hosts) if record.check else ""
        console.print(
            f"run {record.run_id}: {record.status}{mode} in {result.seconds:.0f} s; "
            f"details: gpuctl logs {record.run_id} --state-dir {where.rsplit('/runs/', 1)[0]}"
        )
        if record.message:
            console.print(escape(record.message))
    raise typer.Exit(_exit_code(result))


def logs_cmd(
    run: Annotated[
        str | None, typer.Argument(help="Run id or a prefix of it (default: the latest).")
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="Every task result of this host.")
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option("--cluster", "-c", help="Runs of this cluster.yml (.gpuctl beside it)."),
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="Where runs are kept.")
    ] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Print Ansible's own output.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the run record as JSON.")] = False,
) -> None:
    """Show what a provisioning run did: per host, and every failure with its message."""
    if state_dir is None:
        if cluster is not None:
            state_dir = state_dir_for(cluster)
        elif os.environ.get("GPUCTL_STATE_DIR"):
            state_dir = Path(os.environ["GPUCTL_STATE_DIR"])
        else:
            state_dir = Path(".gpuctl")
    log = read_log(find_run(state_dir, run))
    record = log.record
    out = out_console()
    if as_json:
        print_json(record.to_json())
        return
    if raw:
        if log.stdout is None:
            err_console().print("this run has no Ansible output")
            raise typer.Exit(ExitCode.CHECK_FAILED)
        out.print(log.stdout.read_text(encoding="utf-8", errors="replace"), markup=False)
        return
    flags = " ".join(
        f
        for f in (
            f"--limit {record.limit}" if record.limit else "",
            f"--tags {record.tags}" if record.tags else "",
            "--check" if record.check else "",
            f"(resumes {record.resumed_from})" if record.resumed_from else "",
        )
        if f
    )
    out.print(
        f"run {record.run_id}: {record.status}, started {record.started}, "
        f"finished {record.finished or '-'} {escape(flags)}".rstrip()
    )
    if record.message:
        out.print(escape(record.message))
    if record.hosts:
        out.print(_host_table(record.hosts))
    shown = (
        log.for_host(host)
        if host
        else tuple(r for r in log.results if r.status in ("failed", "unreachable"))
    )
    if host and not shown:
        out.print(f"no task results for host {escape(host)} in this run")
    for r in shown:
        style = _STYLE.get(r.status, "")
        out.print(
            f"[{style}]{r.status:<11}[/{style}] {escape(r.host)}: {escape(r.play)} / "
            f"{escape(r.task)}"
        )
        if r.message:
            for line in r.message.splitlines():
                out.print(f"             {escape(line)}", markup=True)

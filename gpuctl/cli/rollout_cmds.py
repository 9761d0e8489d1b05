"""`gpuctl rollout plan|apply|status|resume|abort`: firmware and driver updates, node by node."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuctl.cli.exit_codes import ExitCode
from gpuctl.cli.output import err_console, literal, log_to, out_console, print_json
from gpuctl.config import load_cluster
from gpuctl.provision.runner import state_dir_for
from gpuctl.rollout.model import Action, Component, Plan, RolloutError, RolloutState, Status
from gpuctl.rollout.run import (
    PolicyOverrides,
    RunResult,
    abort,
    apply,
    make_plan,
    next_steps,
    resume,
    status,
)
from gpuctl.rollout.store import LIBRARY_LOG, RolloutStore

app = typer.Typer(
    help="Firmware and driver updates, node by node: drain in Slurm, wait for jobs, update, "
    "reboot, validate, resume. State survives a killed run (`gpuctl rollout resume`).",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="rollout")


ClusterArg = Annotated[Path, typer.Argument(help="cluster.yml", exists=True, dir_okay=False)]
ComponentOpt = Annotated[
    Component,
    typer.Option("--component", "-c", help="What to update.", case_sensitive=False),
]
ToOpt = Annotated[str, typer.Option("--to", help="Target version.")]
LimitOpt = Annotated[
    str | None, typer.Option("--limit", "-l", help="Only these nodes: gpu[001-004], a group.")
]
ImageOpt = Annotated[
    Path | None,
    typer.Option(
        "--image",
        help="Firmware image or package: nic-firmware (copied to each node and burned with "
        "mlxfwmanager), gpu-firmware and bmc-firmware (pushed to each node's BMC over Redfish).",
        dir_okay=False,
    ),
]
StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where rollouts are kept (default: $GPUCTL_STATE_DIR, else .gpuctl beside "
        "cluster.yml).",
        file_okay=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
CanaryOpt = Annotated[
    int | None, typer.Option("--canary", min=0, help="Nodes updated alone first (0: none).")
]
BatchOpt = Annotated[
    int | None,
    typer.Option("--batch-size", min=1, help="Nodes per batch (replaces max unavailable)."),
]
MaxUnavailOpt = Annotated[
    str | None,
    typer.Option("--max-unavailable", help='Most nodes out of service at once: 2 or "10%".'),
]
ThresholdOpt = Annotated[
    int | None,
    typer.Option("--failure-threshold", min=1, help="Halt once this many nodes failed."),
]
DrainTimeoutOpt = Annotated[
    float | None, typer.Option("--drain-timeout", min=1, help="Seconds to wait for jobs to end.")
]
RebootTimeoutOpt = Annotated[
    float | None,
    typer.Option("--reboot-timeout", min=1, help="Seconds to wait for a node to come back."),
]
LevelOpt = Annotated[
    str | None,
    typer.Option("--validate-level", help="Validation before resuming: quick|standard|long."),
]

_ACTION_STYLE = {"update": "yellow", "skip": "green", "leave": "cyan", "unknown": "red"}
_PHASE_STYLE = {
    "done": "green",
    "skipped": "green",
    "left": "cyan",
    "failed": "red",
    "pending": "dim",
}


def _plan_table(plan: Plan) -> Table:
    batch_of = {n: i for i, b in enumerate(plan.batches) for n in b}
    canary = plan.policy.canary > 0 and bool(plan.batches)
    table = Table(title=f"{plan.component} -> {plan.target}")
    for col in ("batch", "node", "action", "current", "note"):
        table.add_column(col)
    order = sorted(plan.nodes, key=lambda e: batch_of.get(e.node, len(plan.batches) + 1))
    for e in order:
        b = batch_of.get(e.node)
        label = "-" if b is None else ("canary" if b == 0 and canary else str(b + 1))
        style = _ACTION_STYLE.get(str(e.action), "")
        table.add_row(
            label,
            literal(e.node),
            f"[{style}]{e.action}[/{style}]",
            literal(e.current or "?"),
            literal(e.reason),
        )
    return table


_UPDATE_STEPS = {
    Component.NIC_FIRMWARE: "copy the image, mlxfwmanager burns it -> reboot",
    Component.GPU_FIRMWARE: "push the package to the BMC (Redfish), GPUs flashed -> power-cycle",
    Component.BMC_FIRMWARE: "push the package to the BMC (Redfish) -> the BMC resets itself "
    "(the host keeps running)",
    Component.DRIVER: "gpuctl provision (version gate, nvidia_driver, fabric_manager) -> reboot",
}


def _plan_summary(plan: Plan) -> str:
    updates = [e for e in plan.nodes if e.action is Action.UPDATE]
    p = plan.policy
    return (
        f"{len(updates)} of {plan.in_scope} nodes to update in {len(plan.batches)} batches; at "
        f"most {plan.max_unavailable} out of service at once; halt after "
        f"{p.failure_threshold} failed; validation: {p.validate_level}\n"
        f"each node: drain -> wait for its jobs (at most {p.drain_timeout_s:g} s) -> "
        f"{_UPDATE_STEPS[plan.component]} -> back and at {plan.target} (at most "
        f"{p.reboot_timeout_s:g} s) -> validate ({p.validate_level}) -> resume; on failure it "
        "stays drained"
    )


def _state_table(state: RolloutState) -> Table:
    table = Table(
        title=f"rollout {state.rollout_id}: {state.plan.component} -> {state.plan.target}"
    )
    for col in ("node", "phase", "from", "drained by gpuctl", "reason"):
        table.add_column(col)
    for node, s in state.nodes.items():
        style = _PHASE_STYLE.get(str(s.phase), "yellow")
        phase = str(s.phase) + (f" ({s.failed_phase})" if s.failed_phase else "")
        table.add_row(
            literal(node),
            f"[{style}]{literal(phase)}[/{style}]",
            literal(s.from_version or "?"),
            "yes" if s.drained else "",
            literal(s.reason),
        )
    return table


def _counts_text(counts: dict[str, Any]) -> str:
    """``{"done": 2, "failed": 1, "pending": 0}`` -> ``2 done, 1 failed``."""
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v)


def _state_line(state: RolloutState, shown: str | None = None) -> str:
    """``rollout ID STATUS[: reason] (counts)``; ``shown`` replaces the status (interrupted)."""
    why = f": {state.reason}" if state.reason else ""
    counts = _counts_text(state.counts())
    return f"rollout {state.rollout_id} {shown or state.status}{why} ({counts})"


def _value_text(key: str, value: Any) -> str:
    """An audit value as a person reads it: lists joined, counts as ``2 done``, mappings as
    ``key=value``; never a Python repr."""
    if isinstance(value, dict):
        if key == "counts":
            return _counts_text(value)
        return " ".join(
            f"{k}={_value_text(str(k), v)}" for k, v in value.items() if v not in ("", None)
        )
    if isinstance(value, list | tuple):
        return (" | " if any(isinstance(v, list | tuple) for v in value) else ", ").join(
            _value_text(key, v) for v in value
        )
    return str(value)


def _audit_line(line: dict[str, Any]) -> str:
    ts = str(line.get("ts", ""))[11:19]
    node = line.get("node") or "-"
    skip = {"ts", "rollout", "node", "event", "seq"}
    details = ", ".join(
        f"{k}={_value_text(k, v)}"
        for k, v in line.items()
        if k not in skip and v not in ("", None, [], {})
    )
    return f"{ts} {node:<10} {line.get('event')}" + (f"  {details}" if details else "")


class _Follow:
    """Prints audit.jsonl lines as the executor appends them (the executor itself never prints)."""

    def __init__(self) -> None:
        self.store: RolloutStore | None = None
        self.seen = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def started(self, store: RolloutStore) -> None:
        self.store = store
        self.seen = len(store.read_audit())
        log_to(store.directory / LIBRARY_LOG)  # paramiko's messages while nodes reboot, ...
        err_console().print(f"rollout {store.rollout_id}: {escape(str(store.directory))}")
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _flush(self) -> None:
        if self.store is None:
            return
        lines = self.store.read_audit()
        for line in lines[self.seen :]:
            err_console().print(literal(_audit_line(line)), highlight=False)
        self.seen = max(self.seen, len(lines))

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self._flush()
            except RolloutError:  # an unreadable audit log: close() reports it (exit 2)
                return

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self._flush()


def _flags(
    canary: int | None = None,
    batch_size: int | None = None,
    max_unavailable: str | None = None,
    failure_threshold: int | None = None,
    drain_timeout: float | None = None,
    reboot_timeout: float | None = None,
    validate_level: str | None = None,
) -> PolicyOverrides:
    return PolicyOverrides(
        canary=canary,
        batch_size=batch_size,
        max_unavailable=max_unavailable,
        failure_threshold=failure_threshold,
        drain_timeout_s=drain_timeout,
        reboot_timeout_s=reboot_timeout,
        validate_level=validate_level,
    )


def _print_next_steps(state: RolloutState, cluster: Path) -> None:
    steps = next_steps(state, str(cluster))
    console = err_console()
    if len(steps) == 1:
        console.print(f"continue with: {literal(steps[0])}")
    elif steps:
        console.print("to continue (a resume alone would halt again):")
        for i, step in enumerate(steps, 1):
            console.print(f"  {i}. {literal(step)}")


def _finish_run(result: RunResult, cluster: Path, as_json: bool) -> None:
    state = result.state
    if as_json:
        print_json(state.to_json())
    else:
        out_console().print(_state_table(state))
    colour = "green" if result.ok else "red"
    err_console().print(f"[{colour}]{literal(_state_line(state))}[/{colour}]")
    _print_next_steps(state, cluster)
    raise typer.Exit(ExitCode.OK if result.ok else ExitCode.CHECK_FAILED)


@app.command("plan")
def plan_cmd(
    cluster: ClusterArg,
    component: ComponentOpt,
    to: ToOpt,
    limit: LimitOpt = None,
    image: ImageOpt = None,
    canary: CanaryOpt = None,
    batch_size: BatchOpt = None,
    max_unavailable: MaxUnavailOpt = None,
    failure_threshold: ThresholdOpt = None,
    validate_level: LevelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the batches and what will happen to each node; changes nothing.

    Exit 0, or 1 when some node's Slurm state or version could not be read (apply refuses such
    a plan).
    """
    flags = _flags(
        canary, batch_size, max_unavailable, failure_threshold, None, None, validate_level
    )
    loaded = load_cluster(cluster)
    result = make_plan(loaded, cluster, component, to, limit=limit, flags=flags, image=image)
    if as_json:
        print_json(result.plan.to_json())
    else:
        out_console().print(_plan_table(result.plan))
        err_console().print(_plan_summary(result.plan))
    if result.problems:
        err_console().print("[red]some nodes could not be read: apply would refuse this plan[/red]")
        raise typer.Exit(ExitCode.CHECK_FAILED)


@app.command("apply")
def apply_cmd(
    cluster: ClusterArg,
    component: ComponentOpt,
    to: ToOpt,
    limit: LimitOpt = None,
    image: ImageOpt = None,
    state_dir: StateOpt = None,
    canary: CanaryOpt = None,
    batch_size: BatchOpt = None,
    max_unavailable: MaxUnavailOpt = None,
    failure_threshold: ThresholdOpt = None,
    drain_timeout: DrainTimeoutOpt = None,
    reboot_timeout: RebootTimeoutOpt = None,
    validate_level: LevelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan and run a rollout. Exit 0 when every node ended updated, skipped or left alone;
    1 when a node failed or the rollout halted (the state says why; `resume` continues)."""
    flags = _flags(
        canary,
        batch_size,
        max_unavailable,
        failure_threshold,
        drain_timeout,
        reboot_timeout,
        validate_level,
    )
    loaded = load_cluster(cluster)
    follow = _Follow()
    try:
        result = apply(
            loaded,
            cluster,
            component,
            to,
            state=state_dir_for(cluster, state_dir),
            limit=limit,
            flags=flags,
            image=image,
            on_started=follow.started,
        )
    finally:
        follow.close()
    _finish_run(result, cluster, as_json)


@app.command("resume")
def resume_cmd(
    cluster: ClusterArg,
    state_dir: StateOpt = None,
    failure_threshold: ThresholdOpt = None,
    drain_timeout: DrainTimeoutOpt = None,
    reboot_timeout: RebootTimeoutOpt = None,
    validate_level: LevelOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Continue the current rollout (killed, halted or aborted) where it stopped: nodes in
    flight are reconciled with what Slurm and the node say, never updated twice."""
    flags = _flags(
        None, None, None, failure_threshold, drain_timeout, reboot_timeout, validate_level
    )
    loaded = load_cluster(cluster)
    follow = _Follow()
    try:
        result = resume(
            loaded,
            cluster,
            state=state_dir_for(cluster, state_dir),
            flags=flags,
            on_started=follow.started,
        )
    finally:
        follow.close()
    _finish_run(result, cluster, as_json)


@app.command("status")
def status_cmd(
    cluster: ClusterArg,
    state_dir: StateOpt = None,
    audit: Annotated[int, typer.Option("--audit", min=0, help="Show the last N audit lines.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """The current rollout: its status, every node's phase and reason."""
    res = status(state_dir_for(cluster, state_dir))
    if as_json:
        data = res.state.to_json()
        data["running_pid"] = res.running_pid
        data["interrupted"] = res.interrupted
        print_json(data)
    else:
        out_console().print(_state_table(res.state))
        for line in res.audit[-audit:] if audit else []:
            out_console().print(literal(_audit_line(line)), highlight=False)
    running = f"; running in process {res.running_pid}" if res.running_pid else ""
    err_console().print(literal(_state_line(res.state, res.interrupted)) + running)
    if not res.running_pid:
        _print_next_steps(res.state, cluster)
    ok = res.state.status is Status.DONE and not res.state.failed
    raise typer.Exit(ExitCode.OK if ok or res.running_pid else ExitCode.CHECK_FAILED)


@app.command("abort")
def abort_cmd(
    cluster: ClusterArg,
    state_dir: StateOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Recorded in the audit log.")] = "",
) -> None:
    """Stop the current rollout: a running one starts no new node and stops once its nodes in
    flight are done. Nodes gpuctl holds drained stay drained (`resume` continues them)."""
    res = abort(state_dir_for(cluster, state_dir), reason=reason)
    if res.running_pid:
        err_console().print(
            f"rollout {res.rollout_id}: abort requested; process {res.running_pid} stops after "
            "its nodes in flight"
        )
    else:
        held = [n for n, s in res.state.nodes.items() if s.drained]
        err_console().print(
            f"rollout {res.rollout_id} aborted"
            + (f"; still drained by gpuctl: {', '.join(held)}" if held else "")
        )

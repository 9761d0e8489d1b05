"""`gpuctl node-check`: the validation suite on this node alone, for Slurm's HealthCheckProgram.

The same probes as `gpuctl validate` (:func:`gpuctl.validation.probes.probes_for`: the same
argv, timeouts and kinds), run here with :mod:`subprocess` (argv lists, never a shell), each
bounded by its timeout; what they print is written into a bundle directory in the format of
:mod:`gpuctl.validation.suite` (a temporary one unless ``out`` names one, which `gpuctl validate
--bundle` can judge again) and judged by the same core (:func:`gpuctl.validation.suite.
judge_node`). ib_write_bw needs a second node and is left to `gpuctl validate`.

Slurm, as LBNL's NHC does it: a failed node drains itself with ``gpuctl node-check: <check>
<detail>``, unless it is drained or down already (by anyone: a reason is never overwritten);
a node that passes is resumed only when its drain reason starts with ``gpuctl node-check:``.
Nodes drained by an operator, by `gpuctl validate --drain-failed` (``gpuctl:``) or by `gpuctl
rollout` (``gpuctl rollout:``) stay drained. scontrol missing or failing is an error, never
ignored. Fail closed: a probe that timed out or could not run is UNKNOWN, and UNKNOWN fails the
node unless cluster.yml says ``validation.unknown_is_failure: false``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuctl import __version__
from gpuctl.config import load_cluster
from gpuctl.config.model import Cluster
from gpuctl.errors import UsageError
from gpuctl.fileio import write_atomic
from gpuctl.validation.collect import (
    BUNDLE_FILE,
    RESULTS_FILE,
    ExecResult,
    Target,
    _check_out,
    _NodeState,
    with_level,
)
from gpuctl.validation.expect import expectations
from gpuctl.validation.probes import KILL_AFTER_S, Probe, probes_for
from gpuctl.validation.reports.drain import drain_reason
from gpuctl.validation.results import NodeReport, ValidationReport
from gpuctl.validation.slurm import (
    NotUnderstood,
    SlurmAction,
    failure_text,
    is_down,
    is_drained,
    slurm_nodes,
    update_argv,
)
from gpuctl.validation.suite import judge_node, load_node_bundle

DEFAULT_CLUSTER = Path("/etc/gpuctl/cluster.yml")
# The drain reasons node-check writes, and the only ones it clears. Not `gpuctl:` (that is
# `gpuctl validate --drain-failed`'s): each tool resumes only the nodes it drained itself.
PREFIX = "gpuctl node-check:"
LEVELS = ("quick", "standard")  # `long` (dcgmi diag -r 3, up to an hour) is validate's
# Each scontrol call; slurmd kills a HealthCheckProgram after 60 s, so keep these short.
SCONTROL_TIMEOUT_S = 10

Runner = Callable[[Sequence[str], float], ExecResult]
"""Runs ``argv`` bounded by ``timeout_s`` seconds: :func:`run_local`, or a fake in tests."""


# ------------------------------------------------------------------------------------------
# Running a command here


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def run_local(argv: Sequence[str], timeout_s: float) -> ExecResult:
    """Run ``argv`` (no shell) in its own process group with nothing on stdin. At ``timeout_s``
    the group gets SIGTERM, KILL_AFTER_S later SIGKILL (what ``timeout -k`` does on the node for
    `gpuctl validate`), and the result says ``timed_out``. A command that cannot be started is
    reported as a shell would (exit 127 not found, 126 not executable); every exit status is
    kept."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(  # noqa: S603 - an argv list from the probe table
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        return ExecResult(stderr=f"{argv[0]}: command not found\n".encode(), rc=127)
    except PermissionError:
        return ExecResult(stderr=f"{argv[0]}: Permission denied\n".encode(), rc=126)
    except OSError as exc:
        return ExecResult(error=f"{argv[0]}: cannot be started: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 0.001))
    except subprocess.TimeoutExpired:
        _killpg(proc, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            _killpg(proc, signal.SIGKILL)
            out, err = proc.communicate()
        return ExecResult(out, err, None, timed_out=True, seconds=time.monotonic() - started)
    seconds = time.monotonic() - started
    if proc.returncode < 0:
        return ExecResult(
            out,
            err,
            None,
            error=f"{argv[0]} was killed by signal {-proc.returncode}",
            seconds=seconds,
        )
    return ExecResult(out, err, proc.returncode, seconds=seconds)


# ------------------------------------------------------------------------------------------
# The result


@dataclass(frozen=True, slots=True)
class NodeCheckResult:
    """What one node-check found: the node's verdicts, and what it did in Slurm."""

    node: str
    level: str
    report: ValidationReport  # this node only (results.md's JSON, `gpuctl report` reads it)
    probes: Mapping[str, Mapping[str, Any]]  # kind -> its meta.json record (rc, timed_out, ...)
    collected_at: str
    seconds: float
    slurm: SlurmAction | None = None  # None: not drained/resumed (--no-drain, not a Slurm node)
    slurm_note: str | None = None  # why there is no Slurm action
    slurm_error: str | None = None  # scontrol could not be run or read
    bundle: Path | None = None  # the bundle directory kept (``out``), else None

    @property
    def node_report(self) -> NodeReport:
        return self.report.nodes[0]

    @property
    def failed(self) -> bool:
        """The node failed (FAIL, or UNKNOWN while unknown_is_failure)."""
        return self.node_report.failed

    @property
    def slurm_failed(self) -> bool:
        return self.slurm_error is not None or (
            self.slurm is not None and self.slurm.error is not None
        )

    def to_json(self) -> dict[str, Any]:
        node = self.node_report
        return {
            "node": self.node,
            "level": self.level,
            "verdict": node.verdict.value,
            "failed": self.failed,
            "collected_at": self.collected_at,
            "seconds": round(self.seconds, 3),
            "bundle": str(self.bundle) if self.bundle is not None else None,
            "slurm": self.slurm.to_json() if self.slurm is not None else None,
            "slurm_note": self.slurm_note,
            "slurm_error": self.slurm_error,
            "probes": {k: dict(v) for k, v in self.probes.items()},
            "report": self.report.to_json(),
        }


# ------------------------------------------------------------------------------------------
# Slurm: drain on failure, resume own drains on success (pure plan, then scontrol)


def slurm_plan(node: NodeReport, record: Mapping[str, Any]) -> SlurmAction:
    """What to do with this node in Slurm, given its `scontrol show node` record (parsed)."""
    current = record.get("reason")
    current = current if isinstance(current, str) and current else None
    ours = current is not None and current.startswith(PREFIX)
    drained, down = is_drained(record), is_down(record)
    state = "+".join([str(record.get("state") or "?"), *map(str, record.get("state_flags") or [])])
    if node.failed:
        if drained or down:
            return SlurmAction(
                node.node,
                "none",
                current,
                f"left as it is: already {state} ({current or 'no reason'})",
            )
        reason = drain_reason(node, PREFIX) or f"{PREFIX} node check failed"
        return SlurmAction(node.node, "drain", reason, f"drain: {reason}")
    if drained and ours:
        return SlurmAction(node.node, "resume", current, "resume: passes again")
    if drained or down:
        return SlurmAction(
            node.node,
            "none",
            current,
            f"left {state}: not drained by gpuctl node-check ({current or 'no reason'})",
        )
    return SlurmAction(node.node, "none", current, "in service")


def _scontrol_failed(res: ExecResult) -> bool:
    return res.rc != 0 or res.error is not None or res.timed_out


def _slurm(node: NodeReport, runner: Runner) -> tuple[SlurmAction | None, str | None]:
    """Read the node's Slurm state, then drain or resume it: (action, error)."""
    show = ("scontrol", "show", "node", node.node)
    res = runner(show, SCONTROL_TIMEOUT_S)
    if _scontrol_failed(res):
        why = "timed out" if res.timed_out else res.error
        return None, failure_text(" ".join(show), res.rc, res.stderr, why)
    try:
        records = slurm_nodes(res.stdout.decode("utf-8", errors="replace"))
    except NotUnderstood as exc:
        return None, f"{' '.join(show)}: output not understood ({exc})"
    record = records.get(node.node)
    if record is None:
        return None, f"{' '.join(show)}: Slurm does not list {node.node}"
    action = slurm_plan(node, record)
    if action.action == "none":
        return action, None
    try:
        argv = update_argv(action)
    except ValueError as exc:  # a node name that is not a host name: never handed to scontrol
        return (
            SlurmAction(node.node, action.action, action.reason, action.detail, error=str(exc)),
            None,
        )
    done = runner(argv, SCONTROL_TIMEOUT_S)
    if _scontrol_failed(done):
        why = "timed out" if done.timed_out else done.error
        error = failure_text("scontrol update", done.rc, done.stderr, why)
        return (
            SlurmAction(node.node, action.action, action.reason, action.detail, error=error),
            None,
        )
    return SlurmAction(node.node, action.action, action.reason, action.detail, done=True), None


# ------------------------------------------------------------------------------------------
# The check


def local_node_name() -> str:
    """This machine's short host name (what Slurm and cluster.yml call it)."""
    return socket.gethostname().split(".", 1)[0]


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


@contextlib.contextmanager
def _bundle_dir(out: Path | None) -> Iterator[Path]:
    if out is not None:
        _check_out(out)
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="gpuctl-node-check-") as tmp:
        yield Path(tmp)


def _run_probes(
    state: _NodeState,
    plan: list[tuple[Probe, tuple[str, ...]]],
    runner: Runner,
    deadline_s: float | None,
) -> None:
    """Light probes all at once, then the exclusive ones (they load the GPUs) one by one, as
    `gpuctl validate` orders them; each bounded by its timeout and by ``deadline_s``."""
    start = time.monotonic()

    def one(item: tuple[Probe, tuple[str, ...]]) -> None:
        probe, argv = item
        timeout: float = probe.timeout_s
        extra: dict[str, Any] = {}
        if deadline_s is not None:
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                result = ExecResult(
                    error=f"not run: the node-check deadline of {deadline_s:g} s had passed"
                )
                state.record(probe.kind, result, argv, probe.timeout_s, deadline_s=deadline_s)
                return
            if left < timeout:
                timeout, extra = max(1, int(left)), {"deadline_s": deadline_s}
        try:
            result = runner(argv, timeout)
        except Exception as exc:  # a runner bug must not lose the probe: UNKNOWN, not OK
            result = ExecResult(error=f"could not run: {exc or type(exc).__name__}")
        state.record(probe.kind, result, argv, timeout, **extra)

    light = [item for item in plan if not item[0].exclusive]
    heavy = [item for item in plan if item[0].exclusive]
    if light:
        with ThreadPoolExecutor(max_workers=len(light)) as pool:
            list(pool.map(one, light))
    for item in heavy:
        one(item)


def _cluster_node(cluster: Cluster, cluster_path: Path, name: str) -> None:
    names = [n for g in cluster.node_groups for n in g.node_names()]
    if name not in names:
        from ClusterShell.NodeSet import NodeSet

        raise UsageError(
            f"node {name!r} is not in {cluster_path} (its nodes: {NodeSet.fromlist(names)}); "
            "pass --node NAME"
        )


def _is_compute(cluster: Cluster, name: str) -> bool:
    return any(
        name in g.node_names() and any(r.value == "compute" for r in g.roles)
        for g in cluster.node_groups
    )


def node_check(
    cluster_path: Path = DEFAULT_CLUSTER,
    *,
    node: str | None = None,
    level: str = "quick",
    drain: bool = True,
    out: Path | None = None,
    deadline_s: float | None = None,
    runner: Runner = run_local,
) -> NodeCheckResult:
    """Check this node (``node``, default the short host name) at ``level`` and, with
    ``drain``, drain it in Slurm when it fails / resume it when it passes and node-check had
    drained it. ``out``: keep the bundle there (a new or empty directory); ``deadline_s``:
    end every probe still running that many seconds after the start (timed out: UNKNOWN)."""
    started = time.monotonic()
    if level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    if deadline_s is not None and deadline_s <= 0:
        raise UsageError("--deadline must be more than 0 seconds")
    cluster = load_cluster(cluster_path)
    name = node or local_node_name()
    _cluster_node(cluster, cluster_path, name)
    exp = expectations(with_level(cluster, level))[name]
    plan = [(p, p.command(exp)) for p in probes_for(exp, level)]
    collected = datetime.now(UTC)
    collected_at = _iso(collected)
    with _bundle_dir(out) as folder:
        header = {
            "gpuctl": __version__,
            "collected_at": collected_at,
            "level": level,
            "nodes": [name],
            "complete": False,
            "node_check": True,
        }
        write_atomic(folder / BUNDLE_FILE, _json_bytes(header))
        state = _NodeState(Target(name, "localhost"), folder / name)
        state.folder.mkdir(parents=True, exist_ok=True)
        _run_probes(state, plan, runner, deadline_s)
        state.write_meta()
        write_atomic(
            folder / BUNDLE_FILE,
            _json_bytes({**header, "complete": True, "unreachable": {}, "pairs": []}),
        )
        bundle = load_node_bundle(name, state.folder)
        results = judge_node(exp, bundle, datetime.fromisoformat(collected_at), pairs=False)
        report = ValidationReport(
            cluster=cluster.name,
            level=level,
            nodes=(NodeReport(name, tuple(results), cluster.validation.unknown_is_failure),),
            generated_at=collected_at,
        )
        write_atomic(folder / RESULTS_FILE, report.dumps().encode("utf-8"))
        probes = {k: dict(v) for k, v in state.probes.items()}
    action: SlurmAction | None = None
    note: str | None = None
    error: str | None = None
    if not drain:
        note = "--no-drain: Slurm left as it is"
    elif not _is_compute(cluster, name):
        note = f"{name} is not a Slurm compute node (no compute role in cluster.yml)"
    else:
        action, error = _slurm(report.nodes[0], runner)
    return NodeCheckResult(
        node=name,
        level=level,
        report=report,
        probes=probes,
        collected_at=collected_at,
        seconds=time.monotonic() - started,
        slurm=action,
        slurm_note=note,
        slurm_error=error,
        bundle=out,
    )

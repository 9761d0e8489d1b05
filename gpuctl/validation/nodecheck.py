"""`gpuctl node-check`: the validation suite on this node alone, for Slurm's HealthCheckProgram.

The same probes as `gpuctl validate` (:func:`gpuctl.validation.probes.probes_for`: the same
argv, timeouts and kinds), run here through :mod:`gpuctl.remote.local` (argv lists, never a
shell), each bounded by its timeout; what they print is written into a bundle directory
(:mod:`gpuctl.validation.bundle`: a temporary one unless ``out`` names one, which `gpuctl validate
--bundle` can judge again) and judged by the same core (:func:`gpuctl.validation.suite.
judge_node`). ib_write_bw needs a second node and is left to `gpuctl validate`, as is the
GPUDirect RDMA loopback (a server and a client at once).

Slurm, as LBNL's NHC does it: a failed node drains itself with ``gpuctl node-check: <check>
<detail>; <check> <detail>`` (every failed check by its id), unless it is drained or down
already (by anyone else: their reason is never overwritten; its own drain gains the checks
this run adds, :func:`gpuctl.slurm.merged_reason`); a node that passes is resumed only when
its drain reason starts with ``gpuctl node-check:`` and every check it names was judged in this
run and passed (:func:`gpuctl.slurm.resume_rule`: a quick check keeps a node drained for
``nccl.busbw``, which runs at standard). Nodes drained by an operator, by `gpuctl validate
--drain-failed` (``gpuctl:``) or by `gpuctl rollout` (``gpuctl rollout:``) stay drained.
scontrol missing or failing is an error, never ignored. Fail closed: a probe that timed out or
could not run is UNKNOWN, and UNKNOWN fails the node unless cluster.yml says
``validation.unknown_is_failure: false``.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuctl.config.model import Cluster, Level
from gpuctl.errors import UsageError
from gpuctl.remote import ExecResult, Runner
from gpuctl.remote.local import LocalSession
from gpuctl.slurm import (
    NotUnderstood,
    Owner,
    SlurmNode,
    drain_reason_for,
    merged_reason,
    read_nodes,
    resume_rule,
    show_argv,
)
from gpuctl.validation.bundle import (
    NodeFolder,
    check_out,
    iso,
    load_node_bundle,
    new_header,
    sent_received,
    write_header,
    write_results,
)
from gpuctl.validation.expect import expectations
from gpuctl.validation.probes import Probe, phases, probes_for
from gpuctl.validation.results import NodeReport, ValidationReport
from gpuctl.validation.scope import with_level
from gpuctl.validation.slurm import SlurmAction, failed, update_argv, why_failed
from gpuctl.validation.suite import judge_node

DEFAULT_CLUSTER = Path("/etc/gpuctl/cluster.yml")
# The drain reasons node-check writes, and the only ones it clears. Not `gpuctl:` (that is
# `gpuctl validate --drain-failed`'s): each tool resumes only the nodes it drained itself.
PREFIX = "gpuctl node-check:"
OWNER = Owner(PREFIX)
# `long` (dcgmi diag -r 3, up to an hour) is validate's
LEVELS = (Level.QUICK.value, Level.STANDARD.value)
# Each scontrol call; slurmd kills a HealthCheckProgram after 60 s, so keep these short.
SCONTROL_TIMEOUT_S = 10


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


def slurm_plan(node: NodeReport, record: Mapping[str, Any], level: str = LEVELS[0]) -> SlurmAction:
    """What to do with this node in Slurm, given its `scontrol show node` record (parsed) and
    the ``level`` it was checked at (the checks a resume needs are those its reason names)."""
    slurm = SlurmNode.from_record(record)
    current = slurm.reason
    state = slurm.text
    ours = slurm.drained_by(OWNER)
    if node.failed:
        if ours:
            merged = merged_reason(node, current, PREFIX, level, LEVELS[-1])
            if merged is not None:
                return SlurmAction(node.node, "drain", merged, f"drain: {merged}")
            return SlurmAction(
                node.node, "none", current, f"left as it is: already {state} ({current})"
            )
        if slurm.is_drained or slurm.is_down:
            return SlurmAction(
                node.node,
                "none",
                current,
                f"left as it is: already {state} ({current or 'no reason'})",
            )
        reason = drain_reason_for(node, PREFIX, level) or f"{PREFIX} node check failed"
        return SlurmAction(node.node, "drain", reason, f"drain: {reason}")
    if ours:
        rule = resume_rule(current, PREFIX, node, level, LEVELS[-1])
        return SlurmAction(node.node, "resume" if rule.resume else "none", current, rule.detail)
    if slurm.is_drained or slurm.is_down:
        return SlurmAction(
            node.node,
            "none",
            current,
            f"left {state}: not drained by gpuctl node-check ({current or 'no reason'})",
        )
    return SlurmAction(node.node, "none", current, "in service")


def _slurm(node: NodeReport, runner: Runner, level: str) -> tuple[SlurmAction | None, str | None]:
    """Read the node's Slurm state, then drain or resume it: (action, error)."""
    show = show_argv(node.node)
    res = runner(show, SCONTROL_TIMEOUT_S)
    if failed(res):
        return None, why_failed(" ".join(show), res)
    try:
        records = read_nodes(res.stdout.decode("utf-8", errors="replace"))
    except NotUnderstood as exc:
        return None, f"{' '.join(show)}: output not understood ({exc})"
    record = records.get(node.node)
    if record is None:
        return None, f"{' '.join(show)}: Slurm does not list {node.node}"
    action = slurm_plan(node, record, level)
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
    if failed(done):
        return action.ended(error=why_failed("scontrol update", done)), None
    return action.ended(), None


# ------------------------------------------------------------------------------------------
# The check


def local_node_name() -> str:
    """This machine's short host name (what Slurm and cluster.yml call it)."""
    return socket.gethostname().split(".", 1)[0]


@contextlib.contextmanager
def _bundle_dir(out: Path | None) -> Iterator[Path]:
    if out is not None:
        check_out(out)
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    with tempfile.TemporaryDirectory(prefix="gpuctl-node-check-") as tmp:
        yield Path(tmp)


def _run_probes(
    state: NodeFolder,
    plan: list[tuple[Probe, tuple[str, ...]]],
    runner: Runner,
    deadline_s: float | None,
) -> None:
    """Light probes all at once, then the exclusive ones (they load the GPUs) one by one, then
    the second reads of counters, as `gpuctl validate` orders them; each bounded by its timeout
    and by ``deadline_s``."""
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
        sent = time.time()
        try:
            result = runner(argv, timeout)
        except Exception as exc:  # a runner bug must not lose the probe: UNKNOWN, not OK
            result = ExecResult(error=f"could not run: {exc or type(exc).__name__}")
        state.record(probe.kind, result, argv, timeout, **extra, **sent_received(sent))

    light, heavy, after_gpu, after_pairs = phases(plan)
    if light:
        with ThreadPoolExecutor(max_workers=len(light)) as pool:
            list(pool.map(one, light))
    for item in heavy:
        one(item)
    for item in after_gpu + after_pairs:  # the second reads of counters, after the tests
        one(item)


def _cluster_node(cluster: Cluster, source: Path | str, name: str) -> None:
    names = [n for g in cluster.node_groups for n in g.node_names()]
    if name not in names:
        from ClusterShell.NodeSet import NodeSet

        raise UsageError(
            f"node {name!r} is not in {source} (its nodes: {NodeSet.fromlist(names)}); "
            "pass --node NAME"
        )


def _is_compute(cluster: Cluster, name: str) -> bool:
    return any(
        name in g.node_names() and any(r.value == "compute" for r in g.roles)
        for g in cluster.node_groups
    )


def check_options(level: str, deadline_s: float | None) -> None:
    """The options of :func:`node_check`, checked before cluster.yml is read."""
    if level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    if deadline_s is not None and deadline_s <= 0:
        raise UsageError("--deadline must be more than 0 seconds")


def node_check(
    cluster: Cluster,
    *,
    source: Path | str = DEFAULT_CLUSTER,
    node: str | None = None,
    level: str = "quick",
    drain: bool = True,
    out: Path | None = None,
    deadline_s: float | None = None,
    runner: Runner | None = None,
) -> NodeCheckResult:
    """Check this node (``node``, default the short host name) at ``level`` and, with
    ``drain``, drain it in Slurm when it fails / resume it when it passes and node-check had
    drained it. ``source``: where ``cluster`` was read (for messages); ``out``: keep the bundle
    there (a new or empty directory); ``deadline_s``: end every probe still running that many
    seconds after the start (timed out: UNKNOWN); ``runner`` runs each command (here; a fake in
    tests)."""
    started = time.monotonic()
    check_options(level, deadline_s)
    if runner is None:
        runner = LocalSession().run
    name = node or local_node_name()
    _cluster_node(cluster, source, name)
    exp = expectations(with_level(cluster, level))[name]
    # GPUDirect RDMA runs a server and a client at once: left to `gpuctl validate`, as
    # ib_write_bw between nodes is
    plan = [(p, p.command(exp)) for p in probes_for(exp, level) if not p.per_gpu]
    collected = datetime.now(UTC)
    collected_at = iso(collected)
    with _bundle_dir(out) as folder:
        header = {**new_header(collected_at, level, [name]), "node_check": True}
        write_header(folder, header)
        state = NodeFolder(folder / name)
        state.folder.mkdir(parents=True, exist_ok=True)
        _run_probes(state, plan, runner, deadline_s)
        state.write_meta()
        write_header(folder, {**header, "complete": True, "unreachable": {}, "pairs": []})
        bundle = load_node_bundle(name, state.folder)
        results = judge_node(exp, bundle, datetime.fromisoformat(collected_at), pairs=False)
        report = ValidationReport(
            cluster=cluster.name,
            level=level,
            nodes=(NodeReport(name, tuple(results), cluster.validation.unknown_is_failure),),
            generated_at=collected_at,
        )
        write_results(folder, report)
        probes = {k: dict(v) for k, v in state.probes.items()}
    action: SlurmAction | None = None
    note: str | None = None
    error: str | None = None
    if not drain:
        note = "--no-drain: Slurm left as it is"
    elif not _is_compute(cluster, name):
        note = f"{name} is not a Slurm compute node (no compute role in cluster.yml)"
    else:
        action, error = _slurm(report.nodes[0], runner, level)
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

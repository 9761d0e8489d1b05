"""The library entry points of validation: :func:`validate` (collect over SSH, then judge),
:func:`judge_bundle` (judge a saved bundle again, offline) and :func:`drain_failed` (drain in
Slurm what a report fails, over SSH to the controller; the plan is
:mod:`gpuctl.validation.slurm`'s). They take a loaded
:class:`gpuctl.config.model.Cluster` and explicit paths; the CLI (:mod:`gpuctl.cli.validate_cmd`)
reads cluster.yml and picks the defaults. The nodes' own verdicts
(:func:`gpuctl.validation.suite.judge_directory`) are merged here with the multi-node runs'
(:mod:`gpuctl.validation.multinode`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.model import LEVELS, Cluster
from gpuctl.errors import UsageError
from gpuctl.remote import Connector, Target, Unreachable, connect
from gpuctl.remote.ssh import ParamikoConnector, ssh_settings
from gpuctl.slurm import NotUnderstood, read_nodes, show_argv
from gpuctl.validation import multinode, multinode_collect
from gpuctl.validation.bundle import (
    PairRun,
    bundle_folders,
    check_bundle_dir,
    check_out,
    collection_time,
    header_level,
    header_pairs,
    read_bundle_header,
    short,
    unreachable_in,
    write_results,
)
from gpuctl.validation.collector import (
    DEFAULT_PARALLEL,
    Collector,
    ProgressEvent,
    multinode_plan,
)
from gpuctl.validation.expect import expectations
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict
from gpuctl.validation.scope import select_nodes, with_level
from gpuctl.validation.slurm import (
    SCONTROL_TIMEOUT_S,
    DrainResult,
    apply,
    failed,
    plan,
    why_failed,
)
from gpuctl.validation.suite import judge_directory, not_judged


@dataclass(frozen=True, slots=True)
class ValidateResult:
    """What one `gpuctl validate` found: the bundle it wrote (or read) and its verdicts."""

    bundle: Path
    report: ValidationReport
    unreachable: dict[str, str]
    level: str | None  # the level asked for; None = each node's level from cluster.yml
    nodes: tuple[str, ...]
    collected_at: str | None
    seconds: float = 0.0
    pairs: tuple[PairRun, ...] = ()
    complete: bool = True  # False: the bundle is from a collection that did not finish
    ignored: tuple[str, ...] = ()  # node folders of the bundle cluster.yml does not know
    warnings: tuple[str, ...] = ()  # what the CLI shows as warnings (ignored folders)

    @property
    def failed(self) -> bool:
        return self.report.failed

    @property
    def failed_nodes(self) -> list[str]:
        return [n.node for n in self.report.nodes if n.failed]


def _judge(
    cluster: Cluster,
    bundle: Path,
    nodes: Sequence[str],
    level: str | None,
    now: datetime | None,
    clock_problem: str | None,
    generated_at: str | None,
) -> ValidationReport:
    """The report of ``nodes`` (every other node of cluster.yml is left out) from ``bundle``;
    ``now`` ends the Xid window, ``clock_problem`` says why there is no trusted time."""
    leveled = with_level(cluster, level)
    report = judge_directory(
        leveled,
        bundle,
        level=level,
        now=now,
        clock_problem=clock_problem,
        generated_at=generated_at,
    )
    keep = set(nodes)
    extra = {
        k: ({n: v for n, v in val.items() if n in keep} if isinstance(val, dict) else val)
        for k, val in report.extra.items()
    }
    # multi-node nccl-tests (level long): the locator replayed over the recorded runs
    mn = multinode_plan(cluster).options
    exps = expectations(leveled)
    try:
        mn_results, mn_summary = multinode.judge_bundle_dir(bundle, exps, mn)
    except Exception as exc:  # never lose the nodes' own verdicts to it
        mn_results = [not_judged(n, exc, multinode.CHECK) for n in nodes if exps[n].gpu_count]
        mn_summary = {}
    more: dict[str, list[CheckResult]] = {}
    for r in mn_results:
        more.setdefault(r.node, []).append(r)
    reached = [n.node for n in report.nodes if n.node in keep and not _lost(n)]
    for group, members in multinode_collect.participants(exps, reached, level).items():
        for node in members:
            if node not in more:  # a run was due and the bundle does not hold it
                more[node] = [
                    CheckResult(
                        check=multinode.CHECK,
                        node=node,
                        verdict=Verdict.UNKNOWN,
                        message=f"not measured: the bundle holds no multi-node run of group "
                        f"{group} with {node} (level long)",
                    )
                ]
    if mn_summary:
        extra["nccl_multinode"] = mn_summary
    return ValidationReport(
        cluster=report.cluster,
        level=report.level,
        nodes=tuple(
            NodeReport(n.node, n.checks + tuple(more.get(n.node, ())), n.unknown_fails)
            for n in report.nodes
            if n.node in keep
        ),
        generated_at=report.generated_at,
        extra=extra,
    )


def _lost(node: NodeReport) -> bool:
    """Not reached, or its folder not judged: no multi-node run is due for it."""
    return any(
        c.check in ("node.reachable", "node.bundle", "node.judged") and c.verdict is not Verdict.OK
        for c in node.checks
    )


def validate(
    cluster: Cluster,
    *,
    out: Path,
    level: str | None = None,
    limit: str | None = None,
    parallel: int = DEFAULT_PARALLEL,
    pair_rounds: int | None = None,
    connector: Connector | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> ValidateResult:
    """Collect every selected node's probe outputs over SSH into ``out`` (a new or empty
    directory) and judge them.

    ``level`` overrides every node's level from cluster.yml; ``limit`` selects nodes (see
    :func:`select_nodes`); ``connector`` replaces SSH (tests). The bundle also gets
    ``results.json`` (the report, for `gpuctl report`).
    """
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    nodes = select_nodes(cluster, limit)
    check_out(out)
    become = False
    if connector is None:
        settings = ssh_settings(cluster)
        become = settings.become
        connector = ParamikoConnector(settings)
    leveled = with_level(cluster, level)
    exps = expectations(leveled)
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    targets = [Target(n, address[n]) for n in nodes]
    collector = Collector(
        connector,
        exps,
        level=level,
        parallel=parallel,
        become=become,
        pair_rounds=pair_rounds,
        on_progress=on_progress,
        multinode=multinode_plan(cluster),
    )
    got = collector.collect(targets, out)
    now, clock_problem = collection_time({"collected_at": got.collected_at})
    report = _judge(cluster, out, nodes, level, now, clock_problem, got.collected_at)
    write_results(out, report)
    return ValidateResult(
        bundle=out,
        report=report,
        unreachable=got.unreachable,
        level=level,
        nodes=tuple(nodes),
        collected_at=got.collected_at,
        seconds=got.seconds,
        pairs=got.pairs,
    )


def judge_bundle(
    cluster: Cluster,
    bundle: Path,
    *,
    level: str | None = None,
    limit: str | None = None,
) -> ValidateResult:
    """Judge a saved bundle again, offline (no SSH): every node of the cluster (``limit``
    narrows them), at the level it was collected at unless ``level`` says otherwise; the Xid
    window ends at its collection time.

    The bundle may come from someone else: a selected node it lacks fails (``missing from the
    bundle``), folders of nodes cluster.yml does not know are ignored (``ignored``, with a
    warning), and a collection time that is missing or implausible is not trusted (the Xid
    check cannot pass). A bundle.json that cannot be read is a UsageError."""
    check_bundle_dir(bundle)
    header = read_bundle_header(bundle)
    if level is None:
        level = header_level(bundle, header)
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    nodes = select_nodes(cluster, limit)
    known = {n.name for n in cluster_nodes(cluster)}
    ignored = tuple(name for name in bundle_folders(bundle) if name not in known)
    warnings: tuple[str, ...] = ()
    if ignored:
        warnings = (
            "the bundle holds folders of nodes that cluster.yml does not know, not judged: "
            + ", ".join(short(n, 100) for n in ignored),
        )
    now, clock_problem = collection_time(header)
    stamp = header.get("collected_at") if now is not None else None
    collected_at = stamp if isinstance(stamp, str) else None
    report = _judge(cluster, bundle, nodes, level, now, clock_problem, collected_at)
    unreachable = dict(unreachable_in(bundle, nodes))
    return ValidateResult(
        bundle=bundle,
        report=report,
        unreachable=unreachable,
        level=level,
        nodes=tuple(nodes),
        collected_at=collected_at,
        complete=header.get("complete", True) is True,
        pairs=header_pairs(header),
        ignored=ignored,
        warnings=warnings,
    )


def drain_failed(
    cluster: Cluster,
    report: ValidationReport,
    *,
    resume: bool = True,
    connector: Connector | None = None,
) -> DrainResult:
    """Drain the nodes ``report`` fails and resume those gpuctl drained that pass now."""
    controller = cluster.slurm.controller
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    become = False
    if connector is None:
        settings = ssh_settings(cluster)
        become = settings.become
        connector = ParamikoConnector(settings)
    try:
        try:
            session = connect(
                connector, Target(controller, address.get(controller, controller)), become=become
            )
        except Unreachable as exc:
            return DrainResult(controller, error=f"cannot reach {controller}: {exc.reason}")
        try:
            res = session.run(show_argv(), SCONTROL_TIMEOUT_S)
            if failed(res):
                return DrainResult(
                    controller, error=why_failed(f"scontrol show node on {controller}", res)
                )
            try:
                slurm = read_nodes(res.stdout.decode("utf-8", errors="replace"))
            except NotUnderstood as exc:
                return DrainResult(
                    controller,
                    error=f"scontrol show node on {controller}: output not understood ({exc})",
                )
            actions = apply(plan(report, slurm, resume=resume), controller, session)
            return DrainResult(controller, tuple(actions))
        finally:
            with contextlib.suppress(Exception):
                session.close()
    finally:
        with contextlib.suppress(Exception):
            connector.close()

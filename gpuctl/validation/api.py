"""The library entry points of validation: :func:`validate` (collect over SSH, then judge),
:func:`judge_bundle` (judge a saved bundle again, offline) and :func:`drain_failed` (drain in
Slurm what a report fails, over SSH to the controller; the plan is
:mod:`gpuctl.validation.slurm`'s). They take a loaded
:class:`gpuctl.config.model.Cluster` and explicit paths; the CLI (:mod:`gpuctl.cli.validate_cmd`)
reads cluster.yml and picks the defaults. The nodes' own verdicts
(:func:`gpuctl.validation.suite.judge_directory`) are merged here with the multi-node runs'
(:mod:`gpuctl.validation.multinode`).

Partners for ``--limit`` (:func:`choose_partners`): a node under test at standard or long that
has no other node of its fabric in the run is measured with ib_write_bw against a node outside
the limit, read once from ``scontrol show node`` on the controller and checked by
:func:`gpuctl.validation.pairs.partner_refusal` (in service, not drained by anyone, not in
``exclude``, not failed its last validation in the history of :mod:`gpuctl.validation.history`);
idle ones first. Without one, the node is measured against itself (loopback), and its
ib.write_bw verdicts say so, as they name the partner.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.model import LEVELS, Cluster
from gpuctl.errors import UsageError
from gpuctl.remote import Connector, Target, Unreachable, connect
from gpuctl.remote.ssh import ParamikoConnector, ssh_settings
from gpuctl.slurm import NotUnderstood, SlurmNode, read_nodes, show_argv
from gpuctl.validation import multinode, multinode_bundle, multinode_collect, rails
from gpuctl.validation import pairs as pairing
from gpuctl.validation.bundle import (
    BundleFileError,
    PairRun,
    bundle_folders,
    check_bundle_dir,
    check_out,
    collection_time,
    header_burn,
    header_level,
    header_pairs,
    read_bundle_header,
    read_node_meta,
    short,
    unreachable_in,
    write_results,
)
from gpuctl.validation.burn import check_asked, with_burn
from gpuctl.validation.collector import (
    DEFAULT_PARALLEL,
    Collector,
    ProgressEvent,
    multinode_plan,
)
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.history import read_history, record_history
from gpuctl.validation.probes import BURN, latency_kind, perftest_kind, wants_ib_write_bw
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
from gpuctl.validation.suite import judge_directory, not_judged, usable_cores


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
    burn_s: int | None = None,
) -> ValidationReport:
    """The report of ``nodes`` (every other node of cluster.yml is left out) from ``bundle``;
    ``now`` ends the Xid window, ``clock_problem`` says why there is no trusted time,
    ``burn_s`` is the burn loop's duration (level burn)."""
    leveled = with_level(cluster, level)
    report = judge_directory(
        leveled,
        bundle,
        level=level,
        now=now,
        clock_problem=clock_problem,
        generated_at=generated_at,
        jobs=usable_cores(),
        burn_s=burn_s,
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
        mn_results, mn_summary = multinode_bundle.judge_bundle_dir(bundle, exps, mn)
    except Exception as exc:  # never lose the nodes' own verdicts to it
        mn_results = [not_judged(n, exc, multinode.CHECK) for n in nodes if exps[n].gpu_count]
        mn_summary = {}
    more: dict[str, list[CheckResult]] = {}
    for r in mn_results:
        more.setdefault(r.node, []).append(r)
    reached = [n.node for n in report.nodes if n.node in keep and not _lost(n)]
    for group, members in multinode_collect.participants(exps, reached, level).items():
        for node in members:
            # runs that were due and that the bundle does not hold: the group's, each rail's
            mine = more.setdefault(node, [])
            due: list[tuple[str, str | None, str]] = [
                (multinode.CHECK, None, f"multi-node run of group {group} with {node}")
            ]
            due += [
                (rails.RAIL_CHECK, hca, f"run of rail {hca} of group {group}")
                for hca in rails.rail_gpus(exps[node])
            ]
            held = {(r.check, r.subject) for r in mine}
            mine += [
                CheckResult(
                    check=check,
                    node=node,
                    verdict=Verdict.UNKNOWN,
                    message=f"not measured: the bundle holds no {what} (level {level or 'long'})",
                    subject=subject,
                )
                for check, subject, what in due
                if (check, subject) not in held
            ]
    if mn_summary:
        extra["nccl_multinode"] = mn_summary
    return ValidationReport(
        cluster=report.cluster,
        level=report.level,
        nodes=tuple(
            NodeReport(
                n.node,
                _with_pairing(bundle, n.node, n.checks) + tuple(more.get(n.node, ())),
                n.unknown_fails,
            )
            for n in report.nodes
            if n.node in keep
        ),
        generated_at=report.generated_at,
        extra=extra,
    )


def _with_pairing(
    bundle: Path, node: str, checks: tuple[CheckResult, ...]
) -> tuple[CheckResult, ...]:
    """Each ib.write_bw and ib.write_lat verdict with how its pair was chosen where it was not
    another node of the run (``with partner gpu003 (outside --limit)``, ``loopback: ...``),
    from the perftest record of its HCA in the node's meta.json."""
    kinds = {"ib.write_bw": perftest_kind, "ib.write_lat": latency_kind}
    if not any(c.check in kinds for c in checks):
        return checks
    try:
        meta, _ = read_node_meta(bundle, node)
    except (BundleFileError, OSError):
        return checks
    probes = meta.get("probes") if isinstance(meta, dict) else None
    if not isinstance(probes, dict):
        return checks
    out: list[CheckResult] = []
    for c in checks:
        kind = kinds.get(c.check)
        record = probes.get(kind(c.subject)) if kind and c.subject else None
        note = record.get("pairing") if isinstance(record, dict) else None
        if isinstance(note, str) and note and note not in c.message:
            c = dataclasses.replace(c, message=f"{c.message} ({short(note, 300)})")
        out.append(c)
    return tuple(out)


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
    exclude: Collection[str] = (),
    history: Path | None = None,
    burn_s: int | None = None,
) -> ValidateResult:
    """Collect every selected node's probe outputs over SSH into ``out`` (a new or empty
    directory) and judge them.

    ``level`` overrides every node's level from cluster.yml; ``limit`` selects nodes (see
    :func:`select_nodes`); ``connector`` replaces SSH (tests). The bundle also gets
    ``results.json`` (the report, for `gpuctl report`). With ``limit``, ib_write_bw partners
    are chosen outside it (:func:`choose_partners`), never one of ``exclude`` (a rollout's
    batch); ``history``: the validation history file (read for partners, then updated with
    this run's verdicts). ``burn_s``: the burn loop's duration, seconds (level burn, and only
    there: :mod:`gpuctl.validation.burn`).
    """
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    check_asked(level, burn_s is not None)
    nodes = select_nodes(cluster, limit)
    check_out(out)
    become = False
    if connector is None:
        settings = ssh_settings(cluster)
        become = settings.become
        connector = ParamikoConnector(settings)
    leveled = with_level(cluster, level)
    exps = with_burn(expectations(leveled), burn_s)
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    targets = [Target(n, address[n]) for n in nodes]
    partners: list[Target] = []
    no_partner = ""
    if limit is not None:
        chosen, no_partner = choose_partners(
            cluster, connector, exps, nodes, level, exclude, history, become=become
        )
        partners = [Target(n, address[n]) for n in chosen]
    collector = Collector(
        connector,
        exps,
        level=level,
        parallel=parallel,
        become=become,
        pair_rounds=pair_rounds,
        on_progress=on_progress,
        multinode=multinode_plan(cluster),
        partners=partners,
        no_partner=no_partner,
    )
    got = collector.collect(targets, out)
    now, clock_problem = collection_time({"collected_at": got.collected_at})
    report = _judge(cluster, out, nodes, level, now, clock_problem, got.collected_at, burn_s)
    write_results(out, report)
    if history is not None:
        with contextlib.suppress(OSError):  # the run's verdicts stand without it
            record_history(history, report, level=level, at=got.collected_at, bundle=out)
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


def _slurm_nodes(
    cluster: Cluster, connector: Connector, *, become: bool
) -> tuple[dict[str, SlurmNode] | None, str]:
    """``scontrol show node`` on the controller, once: node -> its state; or (None, why)."""
    controller = cluster.slurm.controller
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    try:
        session = connect(
            connector, Target(controller, address.get(controller, controller)), become=become
        )
    except Unreachable as exc:
        return None, f"{controller} cannot be reached to read Slurm's node states: {exc.reason}"
    try:
        res = session.run(show_argv(), SCONTROL_TIMEOUT_S)
        if failed(res):
            return None, why_failed(f"scontrol show node on {controller}", res)
        try:
            records = read_nodes(res.stdout.decode("utf-8", errors="replace"))
        except NotUnderstood as exc:
            return None, f"scontrol show node on {controller}: output not understood ({exc})"
        return {n: SlurmNode.from_record(r) for n, r in records.items()}, ""
    finally:
        with contextlib.suppress(Exception):
            session.close()


def choose_partners(
    cluster: Cluster,
    connector: Connector,
    exps: Mapping[str, NodeExpectation],
    nodes: Sequence[str],
    level: str | None,
    exclude: Collection[str] = (),
    history: Path | None = None,
    *,
    become: bool = False,
) -> tuple[list[str], str]:
    """The ib_write_bw partners outside ``nodes`` (best first) for the nodes under test that
    run ib_write_bw at ``level``, and, when there are none, why (the loopback's verdicts say
    it). A candidate shares a fabric with a node under test and passes
    :func:`gpuctl.validation.pairs.partner_refusal`; Slurm is read only when there is one."""
    under = [n for n in nodes if wants_ib_write_bw(exps[n], level)]
    fabrics = {nic.fabric for n in under for nic in exps[n].nics}
    inside = set(nodes)
    candidates = [
        n
        for n, exp in exps.items()
        if n not in inside and any(nic.fabric in fabrics for nic in exp.nics)
    ]
    if not under or not candidates:
        return [], "no node outside --limit shares its fabric" if under else ""
    slurm, why = _slurm_nodes(cluster, connector, become=become)
    if slurm is None:
        return [], f"no partner outside --limit: {why}"
    passed: dict[str, bool] = {}
    if history is not None:
        passed, problem = read_history(history)
        if problem is not None:
            return [], f"no partner outside --limit: the validation history is unusable: {problem}"
    refused: dict[str, str] = {}
    good: list[str] = []
    for node in candidates:
        why_not = pairing.partner_refusal(
            node, slurm.get(node), passed.get(node), frozenset(exclude)
        )
        if why_not is None:
            good.append(node)
        else:
            refused[node] = why_not
    if good:
        return pairing.rank_partners(good, slurm, passed), ""
    said = "; ".join(f"{n} {w}" for n, w in sorted(refused.items())[:5])
    more = f" and {len(refused) - 5} more" if len(refused) > 5 else ""
    return [], f"no partner outside --limit: {said}{more}"


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
    burn_s = header_burn(header) if level == BURN else None
    report = _judge(cluster, bundle, nodes, level, now, clock_problem, collected_at, burn_s)
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

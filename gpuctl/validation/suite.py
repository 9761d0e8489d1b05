"""Judge a whole cluster: per-node raw outputs (a bundle, :mod:`gpuctl.validation.bundle`
describes and reads it) -> ValidationReport.

What cannot be read, or is not the shape gpuctl writes, is UNKNOWN with the reason, never taken
as a success: a node folder or meta.json that cannot be read makes the node UNKNOWN
(``node.bundle``), a refused output or probe record makes that probe UNKNOWN. A node whose
judging raises anyway fails alone (``node.judged``); the other nodes are judged.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuctl.config.model import Cluster
from gpuctl.validation.bundle import MISSING, NodeBundle, load_node_bundle, short
from gpuctl.validation.burn import with_burn
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges import NODE_JUDGES
from gpuctl.validation.judges.base import Evidence
from gpuctl.validation.judges.blame import assign_blame, pair_peers
from gpuctl.validation.judges.consistency import NodeFacts, judge_consistency, node_facts
from gpuctl.validation.judges.fleet import judge_fleet
from gpuctl.validation.probes import LAT_PREFIX
from gpuctl.validation.reports.charts import chart_marks, ib_write_bw_bars, node_charts
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

# Worker processes judge a cluster only when it has more nodes than this.
POOL_MIN_NODES = 64


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, as a container or cgroup sets it): how
    many worker processes judge a large cluster or write its reports."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def judge_node(
    exp: NodeExpectation,
    bundle: NodeBundle,
    now: datetime | None = None,
    *,
    pairs: bool = True,
    clock_problem: str | None = None,
) -> list[CheckResult]:
    """Every check of one node: each judge of the registry (:data:`NODE_JUDGES`) on the
    node's :class:`Evidence`. ``pairs=False`` leaves out ib_write_bw, which needs a second
    node (`gpuctl node-check` checks a node alone). ``now`` ends the Xid window;
    ``clock_problem`` says why no collection time can be trusted (the Xid check is then judged
    over the whole log and cannot be OK)."""
    if bundle.problem is not None:
        return [
            CheckResult(
                check="node.bundle",
                node=exp.node,
                verdict=Verdict.UNKNOWN,
                message=f"not judged: {bundle.problem}",
            )
        ]
    if bundle.unreachable is not None:
        return [
            CheckResult(
                check="node.reachable",
                node=exp.node,
                verdict=Verdict.FAIL,
                message=f"not checked: {bundle.unreachable}",
            )
        ]
    results: list[CheckResult] = [
        CheckResult(
            check="node.reachable", node=exp.node, verdict=Verdict.OK, message="outputs collected"
        )
    ]
    evidence = Evidence(bundle.outputs, bundle.ib_write_bw, now, clock_problem, pairs)
    for judge in NODE_JUDGES:
        results += judge(exp, evidence)
    return results


def not_judged(node: str, exc: BaseException, check: str = "node.judged") -> CheckResult:
    """The result of a node whose judging raised: it fails (never passes by a crash)."""
    return CheckResult(
        check=check,
        node=node,
        verdict=Verdict.FAIL,
        message=f"could not be judged: {type(exc).__name__}: {short(str(exc), 300)}",
    )


@dataclass(frozen=True, slots=True)
class _Item:
    """One node to judge (picklable: sent to a worker process)."""

    exp: NodeExpectation
    source: NodeBundle | Path
    charts: bool
    now: datetime | None
    clock_problem: str | None = None


Judged = tuple[list[CheckResult], dict[str, Any], NodeFacts | None]


def _judge_one(item: _Item) -> Judged:
    try:
        return _judge_item(item)
    except Exception as exc:  # one node's bad output never stops the others
        return [not_judged(item.exp.node, exc)], {}, None


def _judge_item(item: _Item) -> Judged:
    exp, source = item.exp, item.source
    # a worker reads its node's folder itself: no bundle text crosses process boundaries
    bundle = load_node_bundle(exp.node, source) if isinstance(source, Path) else source
    results = judge_node(exp, bundle, item.now, clock_problem=item.clock_problem)
    judged = bundle.unreachable is None and bundle.problem is None
    extra = node_charts(bundle.outputs) if item.charts and judged else {}
    bw = ib_write_bw_bars(results)
    if bw:
        extra["ib_write_bw"] = bw
    # what the golden-config comparison needs of the node, from the outputs parsed above
    facts = node_facts(exp, bundle.outputs) if judged else None
    return results, extra, facts


# Parsing allocates many small, short-lived objects and almost no cycles: the default
# generation-0 threshold (700) makes the collector run thousands of times for nothing.
_GC_THRESHOLD = 50_000


@contextmanager
def fewer_gc_passes() -> Iterator[None]:
    """Raise the generation-0 GC threshold for allocation-heavy work (judging, reports)."""
    saved = gc.get_threshold()
    gc.set_threshold(_GC_THRESHOLD, saved[1], saved[2])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _worker_init() -> None:
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
    # what the worker inherited (modules, caches, the expectations) is never garbage: the
    # collector skips it instead of walking it in every full pass
    gc.freeze()


def judge_directory(cluster: Cluster, directory: Path, **kwargs: Any) -> ValidationReport:
    """Judge a bundle directory (one folder per node); workers read the folders themselves."""
    return judge_cluster(cluster, directory, **kwargs)


def judge_cluster(
    cluster: Cluster,
    bundles: Mapping[str, NodeBundle] | Path,
    *,
    level: str | None = None,
    unknown_fails: bool | None = None,
    now: datetime | None = None,
    clock_problem: str | None = None,
    generated_at: str | None = None,
    charts: bool = True,
    jobs: int = 1,
    burn_s: int | None = None,
) -> ValidationReport:
    """Judge every node (``jobs`` worker processes for large clusters) and the fleet. A node
    whose judging raises fails with the reason; the others are judged as usual. ``burn_s``:
    the burn loop's duration (level burn), what its samples must cover."""
    exps = with_burn(expectations(cluster), burn_s)
    items = [
        _Item(
            exp,
            bundles / node
            if isinstance(bundles, Path)
            else bundles.get(node) or NodeBundle(node, unreachable=MISSING),
            charts,
            now,
            clock_problem,
        )
        for node, exp in exps.items()
    ]
    with fewer_gc_passes():
        judged: list[Judged] | None = None
        if jobs > 1 and len(items) > POOL_MIN_NODES:
            chunk = max(1, len(items) // (jobs * 8))
            try:
                with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init) as pool:
                    judged = list(pool.map(_judge_one, items, chunksize=chunk))
            except BrokenProcessPool:
                judged = None  # a worker died: judge here, node by node
        if judged is None:
            judged = [_judge_one(item) for item in items]
    per_node: dict[str, list[CheckResult]] = {}
    extra: dict[str, Any] = {}
    facts: dict[str, NodeFacts] = {}
    for item, (results, parts, found) in zip(items, judged, strict=True):
        per_node[item.exp.node] = results
        for key, value in parts.items():
            extra.setdefault(key, {})[item.exp.node] = value
        if found is not None:
            facts[item.exp.node] = found
    if unknown_fails is None:
        unknown_fails = cluster.validation.unknown_is_failure
    # the fleet: each measurement against the median of its peers (node group and GPU model;
    # fabric and port rate), at the node's group's fleet_relative_min (judges/fleet.py)
    for r in judge_fleet(per_node, exps):
        per_node[r.node].append(r)
    # golden config: firmware, software and GPU settings against the node group's majority
    # or cluster.yml's pin (judges/consistency.py)
    with fewer_gc_passes():
        for r in judge_consistency(facts, exps):
            per_node[r.node].append(r)
    # which side of a failed ib_write_bw pair is to blame, and the causes a node shows
    # (judges/blame.py); the partners are recorded in the bundle's meta.json files
    peers = pair_peers(bundles, list(per_node)) if isinstance(bundles, Path) else {}
    lat = pair_peers(bundles, list(per_node), LAT_PREFIX) if isinstance(bundles, Path) else {}
    assign_blame(per_node, peers, lat)
    extra.update(chart_marks(exps.values()))
    return ValidationReport(
        cluster=cluster.name,
        level=level or cluster.validation.level.value,
        nodes=tuple(NodeReport(n, tuple(rs), unknown_fails) for n, rs in per_node.items()),
        generated_at=generated_at,
        extra=extra,
    )

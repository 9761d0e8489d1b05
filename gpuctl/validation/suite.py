"""Judge a whole cluster: per-node raw outputs (a bundle) -> ValidationReport.

A bundle directory holds one folder per node with one file per probe (``<kind>.txt``) and a
``meta.json`` saying how each probe ended: ``{"probes": {"<kind>": {"rc": 0, "timed_out":
false, "error": null}}}``. ib_write_bw client outputs are ``perftest-<hca>.txt``. A node whose
folder is missing, or that could not be reached (``"unreachable": "reason"`` in meta.json), is a
failed node with that reason, never skipped.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuctl.config.model import Cluster
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges import (
    NODE_JUDGES,
    ProbeOutput,
    judge_fleet_relative,
    judge_ib_write_bw,
    judge_xid,
    threshold_value,
)
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict


@dataclass(frozen=True, slots=True)
class NodeBundle:
    node: str
    outputs: dict[str, ProbeOutput] = field(default_factory=dict)
    ib_write_bw: dict[str, ProbeOutput] = field(default_factory=dict)
    unreachable: str | None = None


def load_node_bundle(node: str, folder: Path) -> NodeBundle:
    if not folder.is_dir():
        return NodeBundle(node, unreachable="no outputs were collected")
    meta: dict[str, Any] = {}
    meta_file = folder / "meta.json"
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return NodeBundle(node, unreachable=f"unreadable meta.json: {exc}")
    if meta.get("unreachable"):
        return NodeBundle(node, unreachable=str(meta["unreachable"]))
    probes: dict[str, Any] = meta.get("probes") or {}
    outputs: dict[str, ProbeOutput] = {}
    per_hca: dict[str, ProbeOutput] = {}
    for name in sorted({p.stem for p in folder.glob("*.txt")} | set(probes)):
        info = probes.get(name) or {}
        path = folder / f"{name}.txt"
        text = path.read_bytes().decode("utf-8", errors="replace") if path.is_file() else None
        hca = name.removeprefix("perftest-") if name.startswith("perftest-") else None
        out = ProbeOutput(
            kind="perftest" if hca else name,
            text=text,
            rc=info.get("rc", 0),
            timed_out=bool(info.get("timed_out", False)),
            error=info.get("error"),
        )
        if hca:
            per_hca[hca] = out
        else:
            outputs[name] = out
    return NodeBundle(node, outputs, per_hca)


def load_bundle(directory: Path, node_names: list[str]) -> dict[str, NodeBundle]:
    return {n: load_node_bundle(n, directory / n) for n in node_names}


def judge_node(
    exp: NodeExpectation, bundle: NodeBundle, now: datetime | None = None, *, pairs: bool = True
) -> list[CheckResult]:
    """Every check of one node. ``pairs=False`` leaves out ib_write_bw, which needs a second
    node (`gpuctl node-check` checks a node alone)."""
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
    for judge in NODE_JUDGES:
        if judge is judge_xid:
            results += judge_xid(exp, bundle.outputs, now)
        else:
            results += judge(exp, bundle.outputs)
    if pairs and exp.nics and exp.level != "quick":
        results += judge_ib_write_bw(exp, bundle.ib_write_bw)
    return results


def _chart_data(exp: NodeExpectation, bundle: NodeBundle) -> dict[str, Any]:
    """What the HTML report draws for one node (topology matrix, busbw curve)."""
    extra: dict[str, Any] = {}
    topo = bundle.outputs.get("topo")
    if topo is not None and topo.failure() is None:
        data = topo.parse_as("topo").data
        devices = list(data.get("gpus") or []) + list(data.get("nics") or [])
        if devices:
            extra["topology"] = {"devices": devices, "links": data.get("links") or {}}
    nccl = bundle.outputs.get("nccl")
    if nccl is not None and nccl.failure() is None:
        rows = nccl.parse_as("nccl").data.get("rows") or []
        curve = [
            [float(r["size"]), float(r["out_of_place"]["busbw"])]
            for r in rows
            if isinstance(r.get("size"), int | float)
            and isinstance((r.get("out_of_place") or {}).get("busbw"), int | float)
        ]
        if curve:
            extra["nccl"] = curve
    return extra


def _judge_one(
    item: tuple[NodeExpectation, NodeBundle | Path, bool, datetime | None],
) -> tuple[list[CheckResult], dict[str, Any]]:
    exp, source, charts, now = item
    # a worker reads its node's folder itself: no bundle text crosses process boundaries
    bundle = load_node_bundle(exp.node, source) if isinstance(source, Path) else source
    results = judge_node(exp, bundle, now)
    extra = _chart_data(exp, bundle) if charts and bundle.unreachable is None else {}
    bw = {
        r.subject: float(r.measured)
        for r in results
        if r.check == "ib.write_bw" and r.subject and isinstance(r.measured, int | float)
    }
    if bw:
        extra["ib_write_bw"] = bw
    return results, extra


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
    generated_at: str | None = None,
    charts: bool = True,
    jobs: int = 1,
) -> ValidationReport:
    """Judge every node (``jobs`` worker processes for large clusters) and the fleet."""
    exps = expectations(cluster)
    items: list[tuple[NodeExpectation, NodeBundle | Path, bool, datetime | None]] = [
        (
            exp,
            bundles / node
            if isinstance(bundles, Path)
            else bundles.get(node) or NodeBundle(node, unreachable="no outputs were collected"),
            charts,
            now,
        )
        for node, exp in exps.items()
    ]
    with fewer_gc_passes():
        if jobs > 1 and len(items) > 64:
            chunk = max(1, len(items) // (jobs * 8))
            with ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init) as pool:
                judged = list(pool.map(_judge_one, items, chunksize=chunk))
        else:
            judged = [_judge_one(item) for item in items]
    per_node: dict[str, list[CheckResult]] = {}
    extra: dict[str, Any] = {}
    for (exp, _, _, _), (results, parts) in zip(items, judged, strict=True):
        per_node[exp.node] = results
        for key, value in parts.items():
            extra.setdefault(key, {})[exp.node] = value
    if unknown_fails is None:
        unknown_fails = cluster.validation.unknown_is_failure
    fraction = cluster.validation.thresholds.fleet_relative_min or 0.95
    everything = [r for rs in per_node.values() for r in rs]
    for check in ("nccl.busbw", "ib.write_bw"):
        for r in judge_fleet_relative(everything, check, fraction):
            per_node[r.node].append(r)
    any_exp = next((e for e in exps.values() if e.gpu_count), None)
    if any_exp is not None:
        extra["nccl_threshold"] = any_exp.thresholds.get("nccl_all_reduce_busbw_gbs")
        rate = any_exp.nics[0].rate_gbps if any_exp.nics else None
        extra["ib_write_bw_threshold"] = threshold_value(
            any_exp.thresholds.get("ib_write_bw_gbps"), rate
        )
        extra["ib_line_rate"] = rate
    return ValidationReport(
        cluster=cluster.name,
        level=level or cluster.validation.level.value,
        nodes=tuple(NodeReport(n, tuple(rs), unknown_fails) for n, rs in per_node.items()),
        generated_at=generated_at,
        extra=extra,
    )

"""Judge a whole cluster: per-node raw outputs (a bundle) -> ValidationReport.

A bundle directory holds one folder per node with one file per probe (``<kind>.txt``) and a
``meta.json`` saying how each probe ended: ``{"probes": {"<kind>": {"rc": 0, "timed_out":
false, "error": null}}}``. ib_write_bw client outputs are ``perftest-<hca>.txt``. A node whose
folder is missing, or that could not be reached (``"unreachable": "reason"`` in meta.json), is a
failed node with that reason, never skipped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuctl.config.model import Cluster
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges import (
    NODE_JUDGES,
    ProbeOutput,
    judge_fleet_relative,
    judge_ib_write_bw,
)
from gpuctl.validation.parsing import parse
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


def judge_node(exp: NodeExpectation, bundle: NodeBundle) -> list[CheckResult]:
    if bundle.unreachable is not None:
        return [
            CheckResult(
                check="node.reachable",
                node=exp.node,
                verdict=Verdict.FAIL,
                message=f"not checked: {bundle.unreachable}",
            )
        ]
    results: list[CheckResult] = []
    for judge in NODE_JUDGES:
        results += judge(exp, bundle.outputs)
    if exp.nics and exp.level != "quick":
        results += judge_ib_write_bw(exp, bundle.ib_write_bw)
    return results


def _chart_data(exp: NodeExpectation, bundle: NodeBundle, extra: dict[str, Any]) -> None:
    """Collect what the HTML report draws (topology matrix, busbw curve, per-HCA bars)."""
    topo = bundle.outputs.get("topo")
    if topo is not None and topo.failure() is None and topo.text is not None:
        data = parse("topo", topo.text).data
        devices = list(data.get("gpus") or []) + list(data.get("nics") or [])
        if devices:
            extra.setdefault("topology", {})[exp.node] = {
                "devices": devices,
                "links": data.get("links") or {},
            }
    nccl = bundle.outputs.get("nccl")
    if nccl is not None and nccl.failure() is None and nccl.text is not None:
        rows = parse("nccl", nccl.text).data.get("rows") or []
        curve = [
            [float(r["size"]), float(r["out_of_place"]["busbw"])]
            for r in rows
            if isinstance(r.get("size"), int | float)
            and isinstance((r.get("out_of_place") or {}).get("busbw"), int | float)
        ]
        if curve:
            extra.setdefault("nccl", {})[exp.node] = curve


def judge_cluster(
    cluster: Cluster,
    bundles: Mapping[str, NodeBundle],
    *,
    level: str | None = None,
    unknown_fails: bool = True,
    generated_at: str | None = None,
    charts: bool = True,
) -> ValidationReport:
    exps = expectations(cluster)
    per_node: dict[str, list[CheckResult]] = {}
    extra: dict[str, Any] = {}
    for node, exp in exps.items():
        bundle = bundles.get(node) or NodeBundle(node, unreachable="no outputs were collected")
        per_node[node] = judge_node(exp, bundle)
        if charts and bundle.unreachable is None:
            _chart_data(exp, bundle, extra)
        bw = {
            r.subject: float(r.measured)
            for r in per_node[node]
            if r.check == "ib.write_bw" and r.subject and isinstance(r.measured, int | float)
        }
        if bw:
            extra.setdefault("ib_write_bw", {})[node] = bw
    fraction = cluster.validation.thresholds.fleet_relative_min or 0.95
    everything = [r for rs in per_node.values() for r in rs]
    for check in ("nccl.busbw", "ib.write_bw"):
        for r in judge_fleet_relative(everything, check, fraction):
            per_node[r.node].append(r)
    any_exp = next((e for e in exps.values() if e.gpu_count), None)
    if any_exp is not None:
        extra["nccl_threshold"] = any_exp.thresholds.get("nccl_all_reduce_busbw_gbs")
        extra["ib_write_bw_threshold"] = any_exp.thresholds.get("ib_write_bw_gbps")
    return ValidationReport(
        cluster=cluster.name,
        level=level or cluster.validation.level.value,
        nodes=tuple(NodeReport(n, tuple(rs), unknown_fails) for n, rs in per_node.items()),
        generated_at=generated_at,
        extra=extra,
    )

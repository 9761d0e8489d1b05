"""The data the HTML report draws (``ValidationReport.extra``), built from a node's parsed
outputs and its results; the judges return results only.

Per node: ``topology`` (the ``topo -m`` matrix), ``nccl`` (the busbw curve), ``ib_write_bw``
(HCA -> Gb/s as judged). For the cluster: the lines the charts mark (``nccl_threshold``,
``ib_write_bw_threshold``, ``ib_line_rate``), from one GPU node's expectation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, threshold_value
from gpuctl.validation.parsers.nccl import nccl_rows_of
from gpuctl.validation.parsers.topo import topology_of
from gpuctl.validation.results import CheckResult


def node_charts(outputs: Outputs) -> dict[str, Any]:
    """What the HTML report draws for one node from its outputs (topology matrix, busbw
    curve); nothing for an output that failed."""
    extra: dict[str, Any] = {}
    topo = outputs.get("topo")
    if topo is not None and topo.failure() is None:
        matrix = topology_of(topo.parse_as("topo").data)
        devices = [*matrix.gpus, *matrix.nics]
        if devices:
            extra["topology"] = {"devices": devices, "links": matrix.links}
    nccl = outputs.get("nccl")
    if nccl is not None and nccl.failure() is None:
        sizes_busbw = [
            (r.size, r.out_of_place.busbw if r.out_of_place is not None else None)
            for r in nccl_rows_of(nccl.parse_as("nccl").data)
        ]
        curve = [
            [float(size), float(busbw)]
            for size, busbw in sizes_busbw
            if isinstance(size, int | float)
            and isinstance(busbw, int | float)
            and math.isfinite(size)
            and math.isfinite(busbw)
        ]
        if curve:
            extra["nccl"] = curve
    return extra


def ib_write_bw_bars(results: Sequence[CheckResult]) -> dict[str, float]:
    """HCA -> the ib_write_bw bandwidth its judged result measured."""
    return {
        r.subject: float(r.measured)
        for r in results
        if r.check == "ib.write_bw" and r.subject and isinstance(r.measured, int | float)
    }


def chart_marks(exps: Iterable[NodeExpectation]) -> dict[str, Any]:
    """The thresholds and line rate the charts mark, from the first node with GPUs (none
    without one)."""
    any_exp = next((e for e in exps if e.gpu_count), None)
    if any_exp is None:
        return {}
    rate = any_exp.nics[0].rate_gbps if any_exp.nics else None
    return {
        "nccl_threshold": any_exp.thresholds.get("nccl_all_reduce_busbw_gbs"),
        "ib_write_bw_threshold": threshold_value(any_exp.thresholds.get("ib_write_bw_gbps"), rate),
        "ib_line_rate": rate,
    }

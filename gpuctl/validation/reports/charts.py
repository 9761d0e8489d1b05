"""The data the HTML report draws (``ValidationReport.extra``), built from a node's parsed
outputs and its results; the judges return results only.

Per node: ``topology`` (the ``topo -m`` matrix), ``nccl`` (the busbw curve), ``ib_write_bw``
(HCA -> Gb/s as judged), ``burn`` (level burn: dmon's temperature, SM clock and power per GPU
over the loop's seconds, and the busbw of each all_reduce run of the loop). For the cluster:
the lines the charts mark (``nccl_threshold``,
``ib_write_bw_threshold``, ``ib_line_rate``), from one GPU node's expectation.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Sequence
from typing import Any

from gpuctl.validation import burn
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, threshold_value
from gpuctl.validation.judges.burn import loop_busbw
from gpuctl.validation.parsers.dmon import Dmon, dmon_of, merge_dmon
from gpuctl.validation.parsers.nccl import nccl_rows_of
from gpuctl.validation.parsers.topo import topology_of
from gpuctl.validation.probes import parser_of
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
    series = burn_series(outputs)
    if series:
        extra["burn"] = series
    return extra


# dmon's columns drawn over time (the older drivers' one ``temp`` stands for ``gtemp``)
BURN_COLUMNS = (("gtemp", "temp"), ("pclk",), ("pwr",))
MAX_POINTS = 360  # per GPU and column: a week at 10 s is 60,480 samples, drawn in buckets


def _seconds(date: str | None, clock: str | None) -> float | None:
    """dmon's ``-o DT`` stamp as seconds (a day boundary counted through the date)."""
    if clock is None:
        return None
    h, m, sec = (int(p) for p in clock.split(":"))
    day = 0.0
    if date is not None:
        day = datetime.date(int(date[:4]), int(date[4:6]), int(date[6:])).toordinal() * 86400.0
    return day + h * 3600 + m * 60 + sec


def _over_time(dmon: Dmon, names: tuple[str, ...], interval: float) -> dict[str, list[list[float]]]:
    column = next((n for n in names if n in dmon.columns), None)
    if column is None:
        return {}
    out: dict[str, list[list[float]]] = {}
    first: float | None = None
    for gpu in dmon.gpus():
        points: list[list[float]] = []
        for i, sample in enumerate(dmon.of_gpu(gpu)):
            value = sample.values.get(column)
            at = _seconds(sample.date, sample.time)
            if at is None:
                at = i * interval
            first = at if first is None else min(first, at)
            if isinstance(value, int | float) and math.isfinite(value):
                points.append([at, float(value)])
        out[f"GPU{gpu}"] = points
    base = first or 0.0
    # buckets keep the extreme of each stretch: the peak temperature or power, the lowest clock
    keep = min if column == "pclk" else max
    return {
        gpu: [[round(t - base, 1), v] for t, v in _bucketed(points, keep)]
        for gpu, points in out.items()
        if points
    }


def _bucketed(points: Sequence[list[float]], keep: Any) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return [(t, v) for t, v in points]
    size = math.ceil(len(points) / MAX_POINTS)
    return [
        (points[i][0], keep(v for _, v in points[i : i + size]))
        for i in range(0, len(points), size)
    ]


def burn_series(outputs: Outputs) -> dict[str, Any]:
    """The burn loop's time series: dmon's columns per GPU, the busbw of each all_reduce run."""
    out: dict[str, Any] = {}
    if burn.DMON_KIND not in outputs:  # not a burn: nothing of the loop to look for
        return out
    parts = []
    for kind, got in outputs.items():  # dmon, dmon.1, ...: one per four GPUs
        if parser_of(kind) == burn.DMON_KIND and got.failure() is None:
            parsed = got.parse_as(kind)
            if parsed.recognised:
                parts.append(dmon_of(parsed.data))
    if parts:
        dmon = merge_dmon(parts)
        interval = float(burn.rules().dmon_interval_s)
        for names in BURN_COLUMNS:
            drawn = _over_time(dmon, names, interval)
            if drawn:
                out[names[0]] = drawn
    runs = [[float(cycle), busbw] for cycle, busbw in loop_busbw(outputs)]
    if runs:
        out["nccl"] = runs
    return out


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

"""Fleet-relative: a node far below the fleet median of a measurement fails."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from gpuctl.validation.plausible import (
    finite,
)
from gpuctl.validation.results import CheckResult, Verdict


def judge_fleet_relative(
    results: Iterable[CheckResult], check: str, fraction: float
) -> list[CheckResult]:
    """Flag nodes whose ``check`` measurement is below ``fraction`` x the fleet median."""
    values: dict[tuple[str, str | None], float] = {}
    for r in results:
        v = finite(r.measured)
        if r.check == check and v is not None:
            values[(r.node, r.subject)] = v
    if len(values) < 3:
        return []
    median = statistics.median(values.values())
    floor = fraction * median
    out: list[CheckResult] = []
    for (node, subject), v in sorted(values.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if v < floor:
            out.append(
                CheckResult(
                    check=f"{check}.fleet",
                    node=node,
                    subject=subject,
                    verdict=Verdict.FAIL,
                    message=f"{v:g} is below {fraction:g} x fleet median {median:g}",
                    measured=v,
                    expected=round(floor, 3),
                    source="validation.thresholds.fleet_relative_min",
                )
            )
    return out

"""Single-node nccl-tests all_reduce_perf: errors, wrong results, ranks, bus bandwidth.

The busbw threshold is the bandwidth of a full-size run: every GPU of the node, up to the
message size the threshold is defined at. data/gpu_models.yml records no size with its
numbers, so that size is what the probe asks for (``-e`` of the ``nccl`` probe in
:mod:`gpuctl.validation.probes`). A run on fewer GPUs, or one that stopped below that size
(nccl-tests lowers -e to what fits in memory), is not judged against it: UNKNOWN, saying why.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuctl.config.catalog import (
    busbw_ceiling,
)
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.nccl import NcclRank, NcclRun, nccl_run_of, nccl_size
from gpuctl.validation.plausible import (
    finite,
    nccl_table_lie,
    not_finite,
    show_number,
)
from gpuctl.validation.probes import option
from gpuctl.validation.results import CheckResult, Verdict


def threshold_size() -> int | None:
    """The message size (bytes) the busbw threshold is defined at: the ``-e`` the nccl probe
    passes to all_reduce_perf (8G = 8589934592 B)."""
    size = option("nccl", "-e")
    return nccl_size(size) if size is not None else None


@node_judge("nccl")
def judge_nccl(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["nccl"], "nccl.busbw")
    if result is None:
        return unknown
    run = nccl_run_of(result.data)
    out = list(unknown)
    errors, rows = run.errors, run.rows
    if errors:
        out.append(
            finding(
                exp,
                "nccl.errors",
                Verdict.FAIL,
                f"nccl-tests reported {len(errors)} failure lines",
                evidence=tuple(errors[:5]),
            )
        )
    wrong = [
        (row.size, name, side.wrong if side is not None else None)
        for row in rows
        for name, side in row.sides()
    ]
    bad = [(s, side, w) for s, side, w in wrong if not_finite(w) or finite(w) not in (None, 0.0)]
    raw_oob = run.out_of_bounds
    oob = finite(raw_oob)
    if bad or not_finite(raw_oob) or (oob is not None and oob > 0):
        out.append(
            finding(
                exp,
                "nccl.wrong",
                Verdict.FAIL,
                f"wrong results: {len(bad)} rows with #wrong > 0 or not a number, out of bounds "
                f"{show_number(raw_oob)}",
                measured=len(bad) or oob,
                expected=0,
            )
        )
    elif rows and any(finite(w) is not None for _, _, w in wrong):
        out.append(
            finding(exp, "nccl.wrong", Verdict.OK, "no wrong results", measured=0, expected=0)
        )
    out += _nccl_ranks(exp, run.ranks)
    ceiling = busbw_ceiling(exp.gpu_model)
    probe = outputs.get("nccl")
    lie = nccl_table_lie(run.table(), ceiling, probe.text if probe is not None else None)
    if lie is None and not rows:
        out.append(finding(exp, "nccl.busbw", Verdict.UNKNOWN, "no bandwidth rows in the output"))
        return out
    if lie is not None:
        out.append(
            finding(
                exp,
                "nccl.busbw",
                Verdict.FAIL,
                lie,
                unit="GB/s",
                limit=ceiling.value if ceiling is not None else None,
                source=ceiling.source if ceiling is not None else None,
            )
        )
        return out
    threshold = finite(exp.thresholds.get("nccl_all_reduce_busbw_gbs"))
    largest = max(rows, key=lambda r: finite(r.size) or 0.0)
    busbw = finite(largest.out_of_place.busbw if largest.out_of_place is not None else None)
    size = largest.size
    if threshold is None:
        out.append(
            finding(
                exp,
                "nccl.busbw",
                Verdict.UNKNOWN,
                f"busbw {busbw} GB/s at {size} B, but no threshold is set for "
                f"{exp.gpu_model}: set validation.thresholds.nccl_all_reduce_busbw_gbs",
                measured=busbw,
                unit="GB/s",
            )
        )
    elif busbw is not None and (smaller := _smaller_than_asked(exp, run, size)) is not None:
        out.append(
            finding(
                exp,
                "nccl.busbw",
                Verdict.UNKNOWN,
                f"busbw {busbw:g} GB/s at {size} B not judged against {threshold:g}: {smaller}",
                measured=busbw,
                expected=threshold,
                unit="GB/s",
                source=exp.sources.get("nccl_all_reduce_busbw_gbs"),
            )
        )
    elif busbw is not None:
        ok = busbw >= threshold
        out.append(
            finding(
                exp,
                "nccl.busbw",
                Verdict.OK if ok else Verdict.FAIL,
                f"busbw {busbw:g} GB/s at {size} B " + (">=" if ok else "<") + f" {threshold:g}",
                measured=busbw,
                expected=threshold,
                unit="GB/s",
                source=exp.sources.get("nccl_all_reduce_busbw_gbs"),
            )
        )
    return out


def _smaller_than_asked(exp: NodeExpectation, run: NcclRun, size: object) -> str | None:
    """Why the run is smaller than the one the threshold is defined for, or None."""
    used = run.gpus_used
    if used is None:
        return (
            "the output lists no devices ('#  Rank' lines): on how many of the node's "
            f"{exp.gpu_count} GPUs it ran is unknown"
        )
    if used < exp.gpu_count:
        return f"ran on {used} of {exp.gpu_count} GPUs"
    wanted = threshold_size()
    largest = finite(size)
    if wanted is not None and (largest is None or largest < wanted):
        return (
            f"the largest message measured is {size} B, below the {wanted} B the threshold "
            "is defined at (the probe's -e)"
        )
    return None


def _nccl_ranks(exp: NodeExpectation, ranks: Sequence[NcclRank]) -> list[CheckResult]:
    """nccl-tests cannot run on more GPUs of one host than it has."""
    per_host: dict[str, set[int | str]] = {}
    for i, rank in enumerate(ranks):
        key = rank.device if rank.device is not None else rank.busid or f"rank {i}"
        per_host.setdefault(str(rank.host), set()).add(key)
    out: list[CheckResult] = []
    for host, devices in sorted(per_host.items()):
        if len(devices) > exp.gpu_count:
            out.append(
                finding(
                    exp,
                    "nccl.ranks",
                    Verdict.FAIL,
                    f"nccl-tests used {len(devices)} GPUs on {host}; the node has "
                    f"{exp.gpu_count}: the output is not from this node",
                    measured=len(devices),
                    expected=exp.gpu_count,
                )
            )
    return out

"""Single-node nccl-tests: errors, wrong results, ranks, bus bandwidth, per collective.

all_reduce_perf (checks ``nccl.busbw``, ``nccl.wrong``, ``nccl.errors``, ``nccl.ranks``) and
all_gather_perf, reduce_scatter_perf, alltoall_perf and sendrecv_perf (the same checks under
``nccl.<collective>.``), each against its own floor (``nccl_<collective>_busbw_gbs``). The
busbw threshold is the bandwidth of a full-size run: every GPU of the node, up to the message
size the threshold is defined at. data/gpu_models.yml records no size with its numbers, so
that size is what the probe asks for (``-e`` of the probe in :mod:`gpuctl.validation.probes`).
A run on fewer GPUs, one that stopped below that size (nccl-tests lowers -e to what fits in
memory), or the output of another collective than the one asked for, is not judged against
it: UNKNOWN, saying why.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuctl.config.catalog import (
    busbw_ceiling,
)
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.nccl import NcclRank, NcclRow, NcclRun, nccl_run_of, nccl_size
from gpuctl.validation.plausible import (
    finite,
    nccl_busbw_lie,
    not_finite,
    show_number,
)
from gpuctl.validation.probes import NCCL_COLLECTIVES, Collective, collective, collects, option
from gpuctl.validation.results import CheckResult, Verdict

ALL_REDUCE = collective("nccl")
OTHERS = tuple(c for c in NCCL_COLLECTIVES if c is not ALL_REDUCE)


def threshold_size(kind: str = "nccl") -> int | None:
    """The message size (bytes) the busbw threshold of the collective whose output is ``kind``
    is defined at: the ``-e`` its probe passes to nccl-tests (8G = 8589934592 B)."""
    size = option(kind, "-e")
    return nccl_size(size) if size is not None else None


@node_judge("nccl")
def judge_nccl(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    return _judge_run(exp, outputs, ALL_REDUCE)


@node_judge(*(c.kind for c in OTHERS))
def judge_nccl_collectives(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """all_gather, reduce_scatter, alltoall and sendrecv, each where its probe runs."""
    out: list[CheckResult] = []
    for coll in OTHERS:
        if collects(exp, coll.kind):
            out += _judge_run(exp, outputs, coll)
    return out


def _judge_run(exp: NodeExpectation, outputs: Outputs, coll: Collective) -> list[CheckResult]:
    busbw_check = f"{coll.check}.busbw"
    result, unknown = usable_parse(exp, outputs, [coll.kind], busbw_check)
    if result is None:
        return unknown
    run = nccl_run_of(result.data)
    out = list(unknown)
    errors, rows = run.errors, run.rows
    if errors:
        out.append(
            finding(
                exp,
                f"{coll.check}.errors",
                Verdict.FAIL,
                f"nccl-tests reported {len(errors)} failure lines",
                evidence=tuple(errors[:5]),
            )
        )
    table = _Table(rows)
    bad = table.bad_wrong
    raw_oob = run.out_of_bounds
    oob = finite(raw_oob)
    if bad or not_finite(raw_oob) or (oob is not None and oob > 0):
        out.append(
            finding(
                exp,
                f"{coll.check}.wrong",
                Verdict.FAIL,
                f"wrong results: {bad} rows with #wrong > 0 or not a number, out of bounds "
                f"{show_number(raw_oob)}",
                measured=bad or oob,
                expected=0,
            )
        )
    elif table.shows_wrong:
        out.append(
            finding(
                exp, f"{coll.check}.wrong", Verdict.OK, "no wrong results", measured=0, expected=0
            )
        )
    out += _nccl_ranks(exp, run.ranks, f"{coll.check}.ranks")
    if run.test is not None and run.test != coll.binary:
        out.append(
            finding(
                exp,
                busbw_check,
                Verdict.UNKNOWN,
                f"the output is {run.test}'s, not {coll.binary}'s: not judged against the "
                f"{coll.name} floor",
            )
        )
        return out
    ceiling = busbw_ceiling(exp.gpu_model)
    probe = outputs.get(coll.kind)
    lie = nccl_busbw_lie(
        table.busbws, len(rows), ceiling, probe.text if probe is not None else None
    )
    if lie is None and not rows:
        out.append(finding(exp, busbw_check, Verdict.UNKNOWN, "no bandwidth rows in the output"))
        return out
    if lie is not None:
        out.append(
            finding(
                exp,
                busbw_check,
                Verdict.FAIL,
                lie,
                unit="GB/s",
                limit=ceiling.value if ceiling is not None else None,
                source=ceiling.source if ceiling is not None else None,
            )
        )
        return out
    threshold = finite(exp.thresholds.get(coll.threshold))
    largest = table.largest or rows[0]
    busbw = finite(largest.out_of_place.busbw if largest.out_of_place is not None else None)
    size = largest.size
    if threshold is None:
        out.append(
            finding(
                exp,
                busbw_check,
                Verdict.UNKNOWN,
                f"busbw {busbw} GB/s at {size} B, but no threshold is set for "
                f"{exp.gpu_model}: set validation.thresholds.{coll.threshold}",
                measured=busbw,
                unit="GB/s",
            )
        )
    elif (
        busbw is not None
        and (smaller := _smaller_than_asked(exp, run, size, coll.kind)) is not None
    ):
        out.append(
            finding(
                exp,
                busbw_check,
                Verdict.UNKNOWN,
                f"busbw {busbw:g} GB/s at {size} B not judged against {threshold:g}: {smaller}",
                measured=busbw,
                expected=threshold,
                unit="GB/s",
                source=exp.sources.get(coll.threshold),
            )
        )
    elif busbw is not None:
        ok = busbw >= threshold
        out.append(
            finding(
                exp,
                busbw_check,
                Verdict.OK if ok else Verdict.FAIL,
                f"busbw {busbw:g} GB/s at {size} B " + (">=" if ok else "<") + f" {threshold:g}",
                measured=busbw,
                expected=threshold,
                unit="GB/s",
                source=exp.sources.get(coll.threshold),
            )
        )
    return out


_EXACT = 1 << 53  # an int up to this size orders as its float does


class _Table:
    """What the judge reads of the result rows, in one pass over them: how many sides show a
    #wrong that is not zero or not a finite number, whether any shows a finite one, the busbw
    of every side shown (for :func:`nccl_busbw_lie`), and the first row of the largest size
    (a size that is not a finite number counts as 0)."""

    __slots__ = ("bad_wrong", "busbws", "largest", "shows_wrong")

    def __init__(self, rows: Sequence[NcclRow]) -> None:
        bad = 0
        shows = False
        busbws: list[tuple[object, str, object]] = []
        largest: NcclRow | None = None
        top: float = 0.0
        for row in rows:
            size = row.size
            # finite(size) or 0.0, told without finite() where the size is a plain int
            key = size if type(size) is int and -_EXACT <= size <= _EXACT else finite(size) or 0.0
            if largest is None or key > top:
                largest, top = row, key
            for name, side in (("out_of_place", row.out_of_place), ("in_place", row.in_place)):
                if side is None:
                    continue
                busbws.append((size, name, side.busbw))
                wrong = side.wrong
                if wrong is None:
                    continue
                if (type(wrong) is int or type(wrong) is float) and wrong == 0:
                    shows = True  # the common case, told without finite()
                elif not_finite(wrong) or finite(wrong) not in (None, 0.0):
                    bad += 1
                elif finite(wrong) is not None:
                    shows = True
        self.bad_wrong = bad
        self.shows_wrong = shows
        self.busbws = busbws
        self.largest = largest


def _smaller_than_asked(
    exp: NodeExpectation, run: NcclRun, size: object, kind: str = "nccl"
) -> str | None:
    """Why the run is smaller than the one the threshold is defined for, or None."""
    used = run.gpus_used
    if used is None:
        return (
            "the output lists no devices ('#  Rank' lines): on how many of the node's "
            f"{exp.gpu_count} GPUs it ran is unknown"
        )
    if used < exp.gpu_count:
        return f"ran on {used} of {exp.gpu_count} GPUs"
    wanted = threshold_size(kind)
    largest = finite(size)
    # all_gather, reduce_scatter and alltoall round each rank's share down to 16 bytes
    # (nccl-tests src/<collective>.cu GetCollByteCount): 6 GPUs reach 8 GiB less 32 B
    if wanted is not None and (largest is None or largest <= wanted - 16 * used):
        return (
            f"the largest message measured is {size} B, below the {wanted} B the threshold "
            "is defined at (the probe's -e)"
        )
    return None


def _nccl_ranks(
    exp: NodeExpectation, ranks: Sequence[NcclRank], check: str = "nccl.ranks"
) -> list[CheckResult]:
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
                    check,
                    Verdict.FAIL,
                    f"nccl-tests used {len(devices)} GPUs on {host}; the node has "
                    f"{exp.gpu_count}: the output is not from this node",
                    measured=len(devices),
                    expected=exp.gpu_count,
                )
            )
    return out

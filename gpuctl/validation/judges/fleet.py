"""Fleet-relative: a node far below the median of its peers fails.

Peers are like with like: a GPU figure (``nccl.busbw``, ``nccl.<collective>.busbw``) is
compared within the node's group and GPU model, a network figure (``ib.write_bw``, per HCA)
within the HCA's fabric and port rate.
A class with fewer than :data:`MIN_PEERS` measured nodes is not judged: each of its nodes gets
one WARN, "not enough peers". Each node is held to its own group's ``fleet_relative_min``
(data/health.yml, ``validation.thresholds``, ``node_groups[].validation.thresholds``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.plausible import finite
from gpuctl.validation.results import CheckResult, Verdict

# The fewest measured nodes a class needs to be judged against its median. With two, a slow
# node pulls the median halfway towards itself and the two cannot be told apart; from three on,
# one slow node cannot move the median (the middle value) and stands out alone.
MIN_PEERS = 3

# The measurements judged against their peers, and what makes two nodes peers for each:
# "gpu" = same node group and GPU model, "fabric" = the HCA's fabric and port rate.
FLEET_CHECKS: dict[str, str] = {
    "nccl.busbw": "gpu",
    **{f"nccl.{c}.busbw": "gpu" for c in ("all_gather", "reduce_scatter", "alltoall", "sendrecv")},
    "ib.write_bw": "fabric",
}

THRESHOLD_KEY = "fleet_relative_min"

Values = dict[tuple[str, str | None], float]  # (node, subject) -> measurement


def peer_class(kind: str, exp: NodeExpectation, subject: str | None) -> str | None:
    """The class a measurement of ``exp``'s node is compared in (a label for messages), or
    None when it has none (an HCA cluster.yml does not list)."""
    if kind == "gpu":
        return f"node group {exp.group} ({exp.gpu_model or 'no GPU model'})"
    nic = next((n for n in exp.nics if n.name == subject), None)
    if nic is None:
        return None
    rate = f"{nic.rate_gbps} Gb/s" if nic.rate_gbps is not None else "an unknown rate"
    return f"fabric {nic.fabric} at {rate}"


def judge_fleet(
    per_node: Mapping[str, Sequence[CheckResult]], exps: Mapping[str, NodeExpectation]
) -> list[CheckResult]:
    """The ``<check>.fleet`` results of every node: each measurement of :data:`FLEET_CHECKS`
    against ``fleet_relative_min`` x the median of its class."""

    def fraction_of(node: str) -> float | None:
        return finite(exps[node].thresholds.get(THRESHOLD_KEY))

    def source_of(node: str) -> str | None:
        return exps[node].sources.get(THRESHOLD_KEY)

    out: list[CheckResult] = []
    for check, kind in FLEET_CHECKS.items():
        classes: dict[str, Values] = {}
        for node, results in per_node.items():
            exp = exps.get(node)
            if exp is None:
                continue
            for r in results:
                value = finite(r.measured) if r.check == check else None
                label = peer_class(kind, exp, r.subject) if value is not None else None
                if value is not None and label is not None:
                    classes.setdefault(label, {})[(node, r.subject)] = value
        for label, values in sorted(classes.items()):
            out += _judge_class(check, label, values, fraction_of, source_of)
    return out


def judge_fleet_relative(
    results: Iterable[CheckResult], check: str, fraction: float
) -> list[CheckResult]:
    """Every result of ``check`` in ``results`` taken as one class, at one fraction: the nodes
    that fail (none when the class is too small to judge). :func:`judge_fleet` is what judges
    a cluster, class by class."""
    values: Values = {}
    for r in results:
        v = finite(r.measured)
        if r.check == check and v is not None:
            values[(r.node, r.subject)] = v
    found = _judge_class(check, "the fleet", values, lambda _: fraction, lambda _: None)
    return [r for r in found if r.verdict is Verdict.FAIL]


def _judge_class(
    check: str,
    label: str,
    values: Values,
    fraction_of: Callable[[str], float | None],
    source_of: Callable[[str], str | None],
) -> list[CheckResult]:
    nodes = sorted({node for node, _ in values})
    if len(nodes) < MIN_PEERS:
        return [
            CheckResult(
                check=f"{check}.fleet",
                node=node,
                verdict=Verdict.WARN,
                message=f"not enough peers: {len(nodes)} node{'s' if len(nodes) != 1 else ''} "
                f"in {label} (at least {MIN_PEERS} needed)",
            )
            for node in nodes
        ]
    median = statistics.median(values.values())
    out: list[CheckResult] = []
    for (node, subject), v in sorted(values.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        fraction = fraction_of(node)
        if fraction is None:
            continue
        floor = fraction * median
        ok = v >= floor
        said = ">=" if ok else "is below"
        out.append(
            CheckResult(
                check=f"{check}.fleet",
                node=node,
                subject=subject,
                verdict=Verdict.OK if ok else Verdict.FAIL,
                message=f"{v:g} {said} {fraction:g} x median {median:g} of {label} "
                f"({len(nodes)} nodes)",
                measured=v,
                expected=round(floor, 3),
                source=source_of(node) or f"validation.thresholds.{THRESHOLD_KEY}",
            )
        )
    return out

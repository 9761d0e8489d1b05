"""Error counters read twice around the tests: growth, never totals (data/counters.yml).

:func:`growth` compares two reads of one device's counters (a GPU's NVLinks, an HCA port) by
the rules of their family; :func:`growth_results` turns that into the check's results. The
InfiniBand port judge is here (``perfquery -x``, ``ib.port.errors``); the NVLink one is in
:mod:`gpuctl.validation.judges.nvlink`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpuctl.config.catalog import CounterRules, counter_rules
from gpuctl.validation.expect import ExpectedNic, NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, node_judge, usable_parse
from gpuctl.validation.parsers.ib_counters import port_counters_of
from gpuctl.validation.parsers.rdma_stat import link_counters_of
from gpuctl.validation.probes import collects
from gpuctl.validation.results import CheckResult, Verdict

K = TypeVar("K", bound=Hashable)


@dataclass(slots=True)
class Growth:
    """What two reads show: per verdict the counters that grew (text), the counters that
    cannot be compared (text), and how many were compared."""

    grew: dict[Verdict, list[str]] = field(
        default_factory=lambda: {Verdict.FAIL: [], Verdict.WARN: []}
    )
    cannot: list[str] = field(default_factory=list)
    compared: int = 0


def growth(
    before: Mapping[K, int | None],
    after: Mapping[K, int | None],
    rules: CounterRules,
    counter: Callable[[K], str],
    label: Callable[[K], str],
    allowed: Mapping[str, tuple[int, str]] | None = None,
) -> Growth:
    """Each counter of ``after`` against ``before``: ``counter(key)`` names its rule,
    ``label(key)`` is how a message names it. Counters the rules do not judge are skipped.
    ``allowed``: counter -> (the most growth that is no failure, the threshold's name): more
    FAILs, up to it WARNs."""
    out = Growth()
    verdicts = _verdicts(rules)
    for key, now in after.items():
        which = counter(key)
        rule = verdicts[which] if which in verdicts else _verdict(rules, verdicts, which)
        if rule is None:
            continue
        was = before.get(key)
        if now is None or was is None:
            out.cannot.append(f"{label(key)}: not read {'before' if was is None else 'after'}")
        elif rules.is_saturated(which, was):
            out.cannot.append(f"{label(key)}: at {was} before, a counter that cannot grow")
        elif now < was:
            out.cannot.append(f"{label(key)}: went down from {was} to {now} (reset between reads?)")
        else:
            out.compared += 1
            if now > was:
                verdict = Verdict.FAIL if rule == "fail" else Verdict.WARN
                text = f"{label(key)} +{now - was} ({was} -> {now})"
                limit = (allowed or {}).get(which)
                if limit is not None:
                    most, what = limit
                    verdict = Verdict.FAIL if now - was > most else Verdict.WARN
                    text += f", {what} {most}"
                out.grew[verdict].append(text)
    for key in [k for k in before if k not in after]:  # in the first read's order
        which = counter(key)
        rule = verdicts[which] if which in verdicts else _verdict(rules, verdicts, which)
        if rule is not None:
            out.cannot.append(f"{label(key)}: not read after")
    return out


# What CounterRules.verdict_of says of each counter name, remembered per rule set (its fail and
# warn words: all that verdict_of reads): every HCA and GPU of a fleet shows the same few dozen
# names. Bounded: a full table is emptied, never consulted stale.
_VERDICTS: dict[tuple[tuple[str, ...], tuple[str, ...] | None], dict[str, str | None]] = {}
_VERDICTS_MAX = 2048


def _verdicts(rules: CounterRules) -> dict[str, str | None]:
    words = (rules.fail, rules.warn)
    table = _VERDICTS.get(words)
    if table is None:
        if len(_VERDICTS) >= 16:
            _VERDICTS.clear()
        table = _VERDICTS[words] = {}
    return table


def _verdict(rules: CounterRules, table: dict[str, str | None], which: str) -> str | None:
    if len(table) >= _VERDICTS_MAX:
        table.clear()
    rule = table[which] = rules.verdict_of(which)
    return rule


def growth_results(
    exp: NodeExpectation, check: str, subject: str, found: Growth, during: str
) -> list[CheckResult]:
    """FAIL / WARN naming what grew ``during`` the tests, UNKNOWN for what cannot be compared;
    nothing when all is well (the caller says OK once)."""
    out = [
        finding(exp, check, verdict, f"grew during {during}: " + "; ".join(items), subject=subject)
        for verdict, items in found.grew.items()
        if items
    ]
    if found.cannot:
        more = f" (and {len(found.cannot) - 8} more)" if len(found.cannot) > 8 else ""
        message = "; ".join(found.cannot[:8]) + more
        out.append(finding(exp, check, Verdict.UNKNOWN, message, subject=subject))
    return out


# ------------------------------------------------------------------------------------------
# InfiniBand port counters (``perfquery -x -C <hca> -P <port>``), read before and after every test

PORT_ERRORS = "ib.port.errors"
FLAPS = "LinkDownedCounter"
DURING = "the tests (ib_write_bw between nodes included)"


def _reads_counters(exp: NodeExpectation) -> bool:
    return any(
        collects(exp, f"perfquery.start.{n.name}") for n in exp.nics if n.kind == "infiniband"
    )


@node_judge("perfquery.start", "perfquery.end", applies=_reads_counters)
def judge_ib_port_errors(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """Growth of each InfiniBand HCA's port error counters between the two reads: LinkDowned
    (above ``ib_link_flaps_max``), ExcessiveBufferOverrun and LocalLinkIntegrity FAIL, the
    other error counters WARN."""
    # link-downs during the run: more than ib_link_flaps_max fail, fewer warn (default 0)
    flaps = int(exp.thresholds.get("ib_link_flaps_max") or 0)
    return _port_errors(
        exp,
        outputs,
        PortReads(PORT_ERRORS, "perfquery", "infiniband", "InfiniBand", _perfquery_counts),
        counter_rules("infiniband"),
        {FLAPS: (flaps, "ib_link_flaps_max")},
    )


PortCounts = dict[tuple[int | None, str], int | None]  # (port, counter) -> count


@dataclass(frozen=True, slots=True)
class PortReads:
    """One family of adapter port counters read twice: its check, the kind of its reads
    (``<kind>.start.<hca>``, ``<kind>.end.<hca>``), the adapters it reads, and how one read's
    data gives (port, counter) -> count of one adapter."""

    check: str
    kind: str
    nic_kind: str
    what: str
    counts: Callable[[Mapping[str, Any], ExpectedNic], PortCounts]


def _perfquery_counts(data: Mapping[str, Any], nic: ExpectedNic) -> PortCounts:
    return {(b.port, k): v for b in port_counters_of(data) for k, v in b.counts.items()}


def _port_errors(
    exp: NodeExpectation,
    outputs: Outputs,
    reads: PortReads,
    rules: CounterRules,
    allowed: Mapping[str, tuple[int, str]] | None = None,
) -> list[CheckResult]:
    """Each adapter's counters of one family: growth between its two reads, by ``rules``;
    an adapter whose read shows none of its counters is UNKNOWN, as is a node with none."""
    check = reads.check
    out: list[CheckResult] = []
    compared = 0
    for nic in exp.nics:
        if nic.kind != reads.nic_kind:
            continue
        hca = nic.name  # its outputs' kinds and subject (``mlx5_0``, ``mlx4_0:2``)
        first, unknown_first = usable_parse(exp, outputs, [f"{reads.kind}.start.{hca}"], check)
        last, unknown_last = usable_parse(exp, outputs, [f"{reads.kind}.end.{hca}"], check)
        out += [replace(r, subject=hca) for r in unknown_first + unknown_last]
        if first is None or last is None:
            continue
        before, after = reads.counts(first.data, nic), reads.counts(last.data, nic)
        if not before or not after:
            which = "first" if not before else "second"
            message = f"{reads.kind} shows no counters of {hca} in the {which} read"
            out.append(finding(exp, check, Verdict.UNKNOWN, message, subject=hca))
            continue
        found = growth(
            before, after, rules, lambda key: key[1], lambda key: f"port {key[0]} {key[1]}", allowed
        )
        compared += found.compared
        out += growth_results(exp, check, hca, found, DURING)
    if not out and compared:
        message = f"none of {compared} {reads.what} port error counters grew during {DURING}"
        out.append(finding(exp, check, Verdict.OK, message))
    elif not out:
        out.append(finding(exp, check, Verdict.UNKNOWN, f"{reads.kind} shows no error counters"))
    return out


# ------------------------------------------------------------------------------------------
# RoCE port counters (``rdma statistic show link <hca>/<port>``: the kernel's hw_counters), read
# before and after every test

ROCE_ERRORS = "roce.port.errors"


def _reads_roce_counters(exp: NodeExpectation) -> bool:
    return any(collects(exp, f"rdma-stat.start.{n.name}") for n in exp.nics if n.kind == "roce")


@node_judge("rdma-stat.start", "rdma-stat.end", applies=_reads_roce_counters)
def judge_roce_port_errors(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """Growth of each RoCE adapter's error counters between the two reads, by the rules of
    data/counters.yml ``roce``; the congestion and traffic counters are not judged."""
    return _port_errors(
        exp,
        outputs,
        PortReads(ROCE_ERRORS, "rdma-stat", "roce", "RoCE", _roce_counts),
        counter_rules("roce"),
    )


def _roce_counts(data: Mapping[str, Any], nic: ExpectedNic) -> PortCounts:
    """(port, counter) -> count of adapter port ``nic`` in one read (another device's or
    port's lines, which the command does not print, are left out)."""
    return {
        (link.port, name): value
        for link in link_counters_of(data)
        if link.device == nic.device and link.port in (nic.port, None)
        for name, value in link.counts.items()
    }

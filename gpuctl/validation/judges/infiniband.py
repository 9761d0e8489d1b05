"""InfiniBand / RoCE: HCA ports (``ibstat``) and ib_write_bw between nodes (perftest)."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpuctl.config.catalog import (
    Ceiling,
    ceiling_tolerance,
    fastest_rate,
    port_ceiling,
)
from gpuctl.validation.expect import ExpectedNic, NodeExpectation
from gpuctl.validation.judges.base import (
    Evidence,
    Outputs,
    ProbeOutput,
    finding,
    node_judge,
    record,
    threshold_value,
    usable_parse,
    with_subject,
)
from gpuctl.validation.parsers.infiniband import Ibstat, IbstatPort, ibstat_of
from gpuctl.validation.parsers.perftest import Perftest, perftest_of
from gpuctl.validation.parsing import clean
from gpuctl.validation.plausible import (
    PERFTEST_LINE,
    finite,
    first_seen,
    id_value,
    implausible,
    show_number,
    unread_lines,
)
from gpuctl.validation.probes import wants_ib_write_bw
from gpuctl.validation.results import CheckResult, Verdict


@node_judge("ibstat")
def judge_ib_ports(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = usable_parse(exp, outputs, ["ibstat"], "ib.port")
    if result is None:
        return unknown
    ibstat = record(result, ibstat_of)
    out = list(unknown)
    probe = outputs.get("ibstat")
    out += _hcas_listed_twice(exp, ibstat, probe.text if probe is not None else None)
    for nic in exp.nics:
        ca = ibstat.cas.get(nic.device)
        if ca is None:
            out.append(
                finding(
                    exp,
                    "ib.port",
                    Verdict.FAIL,
                    f"{nic.device} is missing from ibstat",
                    subject=nic.name,
                    evidence=ibstat.errors,
                )
            )
            continue
        port = ca.port(str(nic.port))
        if port is None:
            out.append(
                finding(
                    exp,
                    "ib.port",
                    Verdict.UNKNOWN,
                    f"{nic.device} shows no port {nic.port}",
                    subject=nic.name,
                )
            )
            continue
        subject = nic.port_subject
        state, phys = port.state, port.physical_state
        if state != "Active" or phys != "LinkUp":
            out.append(
                finding(
                    exp,
                    "ib.port.state",
                    Verdict.FAIL,
                    f"state {state}, physical state {phys}; expected Active, LinkUp",
                    subject=subject,
                    measured=f"{state}/{phys}",
                    expected="Active/LinkUp",
                )
            )
        else:
            out.append(finding(exp, "ib.port.state", Verdict.OK, "Active, LinkUp", subject=subject))
        out += _judge_port_rate(exp, nic, port.rate, subject)
        layer = port.link_layer
        if layer != nic.link_layer:
            out.append(
                finding(
                    exp,
                    "ib.port.link_layer",
                    Verdict.FAIL,
                    f"link layer {layer}, expected {nic.link_layer} ({nic.kind})",
                    subject=subject,
                    measured=layer,
                    expected=nic.link_layer,
                )
            )
    return out


def _judge_port_rate(
    exp: NodeExpectation, nic: ExpectedNic, raw: float | None, subject: str
) -> list[CheckResult]:
    """The port's rate against cluster.yml; a rate no port of its kind runs at is FAIL."""
    kind = _KIND_NAMES.get(nic.kind, nic.kind)
    fastest = port_ceiling(fastest_rate(nic.kind), f"the fastest {kind} port gpuctl knows")
    lie = implausible(raw, fastest, "rate", "Gb/s") if raw is not None else None
    if lie is not None:
        return [
            finding(
                exp,
                "ib.port.rate",
                Verdict.FAIL,
                lie,
                subject=subject,
                expected=nic.rate_gbps,
                unit="Gb/s",
                limit=fastest.value,
                source="data/fabrics.yml",
            )
        ]
    if nic.rate_gbps is None:
        return []
    rate = finite(raw)
    if rate is None:
        return [
            finding(
                exp,
                "ib.port.rate",
                Verdict.UNKNOWN,
                "rate not shown",
                subject=subject,
                expected=nic.rate_gbps,
                unit="Gb/s",
            )
        ]
    ok = rate == nic.rate_gbps
    return [
        finding(
            exp,
            "ib.port.rate",
            Verdict.OK if ok else Verdict.FAIL,
            f"rate {rate:g} Gb/s, expected {nic.rate_gbps}",
            subject=subject,
            measured=rate,
            expected=nic.rate_gbps,
            unit="Gb/s",
            limit=float(nic.rate_gbps),
        )
    ]


_KIND_NAMES = {"infiniband": "InfiniBand", "roce": "RoCE"}


def _guid(value: Any) -> str | None:
    """A GUID to compare; None for none shown or all zeros (Ethernet ports show zeros)."""
    text = id_value(value)
    if not isinstance(text, str):
        return None
    try:
        return None if int(text, 16) == 0 else text
    except ValueError:
        return text


_CA_HEADER = re.compile(r"^[ \t]*CA[ \t]+'([^']*)'[ \t]*$", re.MULTILINE)


def _hcas_listed_twice(exp: NodeExpectation, ibstat: Ibstat, text: str | None) -> list[CheckResult]:
    """An HCA whose name ibstat prints twice (the parser keeps one block), or one of the
    expected HCAs with the node or port GUID of another: the same HCA listed twice."""
    out: list[CheckResult] = []
    cas = ibstat.cas
    if text is not None and text.count("CA '") > len(cas):
        names = Counter(_CA_HEADER.findall(clean(text)))
        for name in sorted(n for n, k in names.items() if k > 1):
            out.append(
                finding(
                    exp,
                    "ib.duplicate",
                    Verdict.FAIL,
                    f"{name} is listed twice in ibstat ({names[name]} blocks); counted once",
                    subject=name,
                    expected="each HCA once",
                )
            )
    first_port = {n.device: str(n.port) for n in reversed(exp.nics) if n.device in cas}
    expected = [d for d in dict.fromkeys(n.device for n in exp.nics) if d in cas]
    items = [
        {"node_guid": cas[d].node_guid, "port_guid": _port_guid(cas[d].port(first_port[d]))}
        for d in expected
    ]
    keys = (("node_guid", "node GUID", _guid), ("port_guid", "port GUID", _guid))
    for i, (first, label, value) in sorted(first_seen(items, keys).items()):
        out.append(
            finding(
                exp,
                "ib.duplicate",
                Verdict.FAIL,
                f"{expected[i]} is listed twice: same {label} {value} as {expected[first]}",
                subject=expected[i],
                expected="each HCA once",
            )
        )
    return out


def _port_guid(port: IbstatPort | None) -> str | None:
    return port.port_guid if port is not None else None


def port_rates(outputs: Outputs) -> dict[str, float]:
    """Each port's rate as ibstat reports it (Gb/s), by its :attr:`ExpectedNic.port_subject`
    (``mlx5_0/1``), for the ceiling of ib_write_bw; rates no port runs at are left out (the
    port judge fails them)."""
    probe = outputs.get("ibstat")
    if probe is None or probe.failure() is not None:
        return {}
    result = probe.parse_as("ibstat")
    if not result.recognised:
        return {}
    top = fastest_rate(None) * (1.0 + ceiling_tolerance())
    rates: dict[str, float] = {}
    for name, ca in record(result, ibstat_of).cas.items():
        for number, port in ca.ports.items():
            rate = finite(port.rate)
            if rate is not None and 0 < rate <= top:
                rates[f"{name}/{number}"] = rate
    return rates


def _bw_ceiling(nic: ExpectedNic, port_rates: Mapping[str, float] | None, run: Perftest) -> Ceiling:
    """What one ib_write_bw run can reach: the rate ibstat reports for the port, else the
    configured rate, else the fastest port of its kind; twice that both ways or on two ports."""
    reported = finite((port_rates or {}).get(nic.port_subject))
    if reported is not None and reported > 0:
        ceiling = port_ceiling(reported, "the rate ibstat reports for the port")
    elif nic.rate_gbps:
        ceiling = port_ceiling(nic.rate_gbps, "the port's line rate")
    else:
        kind = _KIND_NAMES.get(nic.kind, nic.kind)
        ceiling = port_ceiling(fastest_rate(nic.kind), f"the fastest {kind} port gpuctl knows")
    both_ways = run.bidirectional
    if both_ways or run.two_ports:
        how = "both directions" if both_ways else "two ports"
        return dataclasses.replace(
            ceiling, value=2 * ceiling.value, what=f"{ceiling.what}, x2 ({how})"
        )
    return ceiling


MB_PER_SEC_TO_GBPS = 1_048_576 * 8 / 1e9  # perftest's MB is 2^20 bytes


def judge_ib_write_bw(
    exp: NodeExpectation,
    per_hca: Mapping[str, ProbeOutput],
    port_rates: Mapping[str, float] | None = None,
) -> list[CheckResult]:
    """``per_hca``: HCA -> the client-side ib_write_bw output for it (collected by validate).
    ``port_rates``: HCA -> the rate ibstat reports (:func:`port_rates`), the ceiling where
    given; else the configured rate is."""
    out: list[CheckResult] = []
    configured = exp.thresholds.get("ib_write_bw_gbps")
    for nic in exp.nics:
        threshold = threshold_value(configured, nic.rate_gbps)
        probe = per_hca.get(nic.name)
        subject = nic.name
        if probe is None:
            out.append(
                finding(exp, "ib.write_bw", Verdict.UNKNOWN, "not measured", subject=subject)
            )
            continue
        result, unknown = usable_parse(exp, {"perftest": probe}, ["perftest"], "ib.write_bw")
        if result is None:
            out += [with_subject(u, subject) for u in unknown]
            continue
        run = perftest_of(result.data)
        if (
            nic.gid_index is not None
            and run.link_type == "Ethernet"  # perftest prints a GID index on Ethernet only
            and run.gid_index != nic.gid_index
        ):
            # another GID is another path (RoCE v1 or a link-local address): not the one jobs use
            used = "no GID index" if run.gid_index is None else f"GID index {run.gid_index}"
            out.append(
                finding(
                    exp,
                    "ib.write_bw",
                    Verdict.UNKNOWN,
                    f"ib_write_bw ran with {used}, not fabrics[].gid_index {nic.gid_index} "
                    "(-x): its bandwidth is not of the path NCCL uses; not judged",
                    subject=subject,
                    expected=threshold,
                    unit="Gb/s",
                )
            )
            out += [with_subject(u, subject) for u in unknown]
            continue
        unread = unread_lines(probe.text, PERFTEST_LINE, run.rows_read, "#bytes")
        if unread:
            out.append(
                finding(
                    exp,
                    "ib.write_bw",
                    Verdict.FAIL,
                    f"{unread} result line(s) of ib_write_bw hold a bandwidth that is not a "
                    "finite number (nan, inf, too large or unreadable); no other row is judged "
                    "in their place",
                    subject=subject,
                    expected=threshold,
                    unit="Gb/s",
                )
            )
            out += [with_subject(u, subject) for u in unknown]
            continue
        rows = run.bw_rows
        if not rows:
            out.append(
                finding(exp, "ib.write_bw", Verdict.UNKNOWN, "no result row", subject=subject)
            )
            continue
        # the largest message size, whatever its bandwidth reads: never another row instead
        row = max(rows, key=lambda r: finite(r.bytes) or 0.0)
        unit = run.bw_unit
        if unit not in ("MB/sec", "Gb/sec"):
            out.append(
                finding(
                    exp, "ib.write_bw", Verdict.UNKNOWN, f"unknown unit {unit!r}", subject=subject
                )
            )
            continue
        raw = row.bw_average
        bw = finite(raw)
        if bw is not None and unit == "MB/sec":
            bw = round(bw * MB_PER_SEC_TO_GBPS, 2)
        ceiling = _bw_ceiling(nic, port_rates, run)
        lie = implausible(bw if bw is not None else raw, ceiling, "ib_write_bw", "Gb/s")
        if lie is not None:
            out.append(
                finding(
                    exp,
                    "ib.write_bw",
                    Verdict.FAIL,
                    f"{lie} (at {show_number(row.bytes)} B)",
                    subject=subject,
                    expected=threshold,
                    unit="Gb/s",
                    limit=ceiling.value,
                    source=ceiling.source,
                )
            )
            out += [with_subject(u, subject) for u in unknown]
            continue
        assert bw is not None  # noqa: S101 - implausible() refuses None
        if threshold is None:
            out.append(
                finding(
                    exp,
                    "ib.write_bw",
                    Verdict.UNKNOWN,
                    f"{bw:g} Gb/s; no threshold set",
                    subject=subject,
                    measured=bw,
                    unit="Gb/s",
                )
            )
            continue
        ok = bw >= threshold
        out.append(
            finding(
                exp,
                "ib.write_bw",
                Verdict.OK if ok else Verdict.FAIL,
                f"{bw:g} Gb/s " + (">=" if ok else "<") + f" {threshold:g} Gb/s",
                subject=subject,
                measured=bw,
                expected=threshold,
                unit="Gb/s",
                limit=float(nic.rate_gbps) if nic.rate_gbps else None,
                source=exp.sources.get("ib_write_bw_gbps"),
            )
        )
        out += [with_subject(u, subject) for u in unknown]
    return out


@node_judge("perftest", applies=wants_ib_write_bw)
def judge_ib_write_bw_pairs(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """ib_write_bw between nodes, unless the node is judged alone (``evidence.pairs=False``,
    as `gpuctl node-check` does); the ceiling is the rate ibstat reports, where it does."""
    if not evidence.pairs:
        return []
    return judge_ib_write_bw(exp, evidence.ib_write_bw, port_rates(evidence))


def with_partner(result: CheckResult, node: str, hca: str) -> CheckResult:
    """An ib_write_bw result that says which node and HCA it was measured with (the partner
    the collector recorded; :mod:`gpuctl.validation.judges.blame` decides whose fault a failed
    pair is): ``... (with gpu002 mlx5_0)`` in the message, ``partner: gpu002 mlx5_0`` in the
    evidence. Idempotent."""
    line = f"partner: {node} {hca}"
    if line in result.evidence:
        return result
    return dataclasses.replace(
        result,
        message=f"{result.message} (with {node} {hca})",
        evidence=(*result.evidence, line),
    )

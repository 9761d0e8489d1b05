"""Judges: parsed tool output + what cluster.yml expects -> CheckResults.

Fail closed everywhere: a probe that did not run, timed out, exited with an error, or whose
output was not recognised gives UNKNOWN for what it should have shown, never OK. A value the
output does not show is never taken as zero.

Numbers no hardware produces never pass (a bundle is text anyone can write): a measurement above
the physical limit of its link (gpuctl/data/limits.yml, gpu_models.yml, fabrics.yml; plus a
small tolerance) is FAIL, and so is one that is not a finite number; no other row is judged in
its place. A GPU or HCA listed twice in one node's evidence is FAIL and counted once. Nothing a
judge returns holds NaN or infinity.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from gpuctl.config.catalog import (
    Ceiling,
    busbw_ceiling,
    ceiling_tolerance,
    fastest_rate,
    port_ceiling,
)
from gpuctl.resources import load_data
from gpuctl.validation.expect import ExpectedNic, NodeExpectation
from gpuctl.validation.parsing import ParseResult, clean, parse
from gpuctl.validation.plausible import (
    PERFTEST_LINE,
    finite,
    first_seen,
    id_value,
    implausible,
    nccl_table_lie,
    not_finite,
    show_number,
    unread_lines,
)
from gpuctl.validation.results import CheckResult, Verdict


@dataclass(frozen=True, slots=True)
class ProbeOutput:
    """What running one probe on one node gave: its output, or why there is none."""

    kind: str
    text: str | None
    rc: int | None = 0
    timed_out: bool = False
    error: str | None = None  # could not run (unreachable, command missing, ...)
    _parsed: dict[str, ParseResult] = field(default_factory=dict, repr=False, compare=False)

    def parse_as(self, kind: str) -> ParseResult:
        """Parse the text once per kind (several judges read the same output)."""
        if kind not in self._parsed:
            self._parsed[kind] = parse(kind, self.text or "")
        return self._parsed[kind]

    def failure(self) -> str | None:
        """Why this output cannot be trusted, or None."""
        if self.error:
            return self.error
        if self.timed_out:
            return "timed out"
        if self.text is None:
            return "no output"
        return None


Outputs = Mapping[str, ProbeOutput]


def _r(exp: NodeExpectation, check: str, verdict: Verdict, message: str, **kw: Any) -> CheckResult:
    if kw:
        verdict, message = _finite_fields(kw, verdict, message)
    return CheckResult(check=check, node=exp.node, verdict=verdict, message=message, **kw)


def _finite_fields(kw: dict[str, Any], verdict: Verdict, message: str) -> tuple[Verdict, str]:
    """The last guard before a result: a non-finite measured/expected/limit becomes None (the
    verdict no better than UNKNOWN), and so does a measurement whose percentage of the limit
    would overflow. The judges check their numbers first; this catches what they missed."""
    for key in _NUMERIC_FIELDS:
        if key in kw and not_finite(kw[key]):
            kw[key] = None
            message += f"; {key} is not a finite number"
            if verdict in (Verdict.OK, Verdict.WARN):
                verdict = Verdict.UNKNOWN
    if kw.get("limit"):
        limit, measured = finite(kw["limit"]), finite(kw.get("measured"))
        if limit and measured is not None and not math.isfinite(100.0 * measured / limit):
            kw["measured"] = None
    return verdict, message


_NUMERIC_FIELDS = ("measured", "expected", "limit")


def _parsed(
    exp: NodeExpectation, outputs: Outputs, kinds: Sequence[str], check: str
) -> tuple[ParseResult | None, list[CheckResult]]:
    """The first usable parse among ``kinds`` (preferred first), or an UNKNOWN saying why not."""
    reasons: list[str] = []
    for kind in kinds:
        out = outputs.get(kind)
        if out is None:
            continue
        why = out.failure()
        if why is not None:
            reasons.append(f"{kind}: {why}")
            continue
        result = out.parse_as(kind)
        if not result.recognised:
            reasons.append(f"{kind}: output not recognised ({'; '.join(result.problems)[:200]})")
            continue
        if out.rc not in (0, None):
            reasons.append(f"{kind}: exit code {out.rc}")
            # keep going: partial output with an error exit is judged, but never OK alone
            return result, [
                _r(exp, check, Verdict.UNKNOWN, f"{kind} exited with {out.rc}; output incomplete")
            ]
        return result, []
    if not reasons:
        reasons.append(f"not collected ({' or '.join(kinds)})")
    return None, [_r(exp, check, Verdict.UNKNOWN, "; ".join(reasons))]


def _listed_twice(
    exp: NodeExpectation,
    gpus: Sequence[Mapping[str, Any]],
    repeats: Mapping[int, tuple[int, str, Any]],
    *,
    where: str = "",
    tail: str = "",
    by_position: bool = False,
) -> list[CheckResult]:
    """A ``gpu.duplicate`` FAIL for each GPU that repeats an earlier one (:func:`first_seen`);
    ``by_position``: a GPU without an index is named by its position in the listing."""

    def name(i: int) -> str:
        return f"GPU{gpus[i].get('index', i) if by_position else gpus[i].get('index')}"

    return [
        _r(
            exp,
            "gpu.duplicate",
            Verdict.FAIL,
            f"{name(i)} is listed twice{where}: same {label} {value} as {name(first)}{tail}",
            subject=name(i),
            expected="each GPU once",
        )
        for i, (first, label, value) in sorted(repeats.items())
    ]


# ------------------------------------------------------------------------------------------
# GPUs: inventory, driver, ECC and row remapping, PCIe link, clocks, fabric state

# Clock event reasons that are normal (Azure's health checks warn on the others).
_BENIGN_CLOCK_REASONS = {
    "idle",
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "display_clock_setting",
    "display_clocks_setting",
}


def judge_gpus(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if exp.gpu_count == 0:
        return []
    result, unknown = _parsed(exp, outputs, ["smi-xml", "smi-q"], "gpu")
    if result is None:
        return unknown
    data = result.data
    out = list(unknown)
    gpus: list[dict[str, Any]] = list(data.get("gpus") or [])
    repeats = first_seen(gpus, _GPU_IDS)
    out += _listed_twice(exp, gpus, repeats, tail="; counted once", by_position=True)
    distinct = [g for i, g in enumerate(gpus) if i not in repeats]
    twice = f" ({len(repeats)} listed twice, not counted)" if repeats else ""
    if len(distinct) != exp.gpu_count:
        lost = _lost_gpus(distinct, outputs) if len(distinct) < exp.gpu_count else []
        out.append(
            _r(
                exp,
                "gpu.count",
                Verdict.FAIL,
                f"{len(distinct)} GPUs visible, expected {exp.gpu_count}{twice}"
                + (f"; missing: {', '.join(lost)} (fallen off the bus)" if lost else ""),
                measured=len(distinct),
                expected=exp.gpu_count,
            )
        )
    else:
        out.append(
            _r(
                exp,
                "gpu.count",
                Verdict.OK,
                f"{len(distinct)} GPUs",
                measured=len(distinct),
                expected=exp.gpu_count,
            )
        )
    driver = data.get("driver_version")
    if exp.driver_version is not None:
        if driver is None:
            out.append(_r(exp, "gpu.driver", Verdict.UNKNOWN, "driver version not shown"))
        else:
            ok = driver == exp.driver_version
            out.append(
                _r(
                    exp,
                    "gpu.driver",
                    Verdict.OK if ok else Verdict.FAIL,
                    f"driver {driver}" + ("" if ok else f", expected {exp.driver_version}"),
                    measured=driver,
                    expected=exp.driver_version,
                )
            )
    th = exp.thresholds
    for i, gpu in enumerate(gpus):
        subject = f"GPU{gpu.get('index', i)}"
        out += _judge_one_gpu(exp, gpu, subject, th)
    return out


def _pci_key(address: Any) -> str | None:
    """``00000000:5D:00.0`` and ``0000:5d:00`` -> ``0:5d:00`` (domain, bus, device)."""
    parts = str(address or "").lower().split(".")[0].split(":")
    if len(parts) != 3:
        return None
    try:
        return f"{int(parts[0], 16):x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return None


# What tells two GPUs in one node's nvidia-smi output apart: a second GPU with any of these
# equal to an earlier one's is the same GPU listed twice.
_GPU_IDS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("uuid", "UUID", id_value),
    ("pci_bus_id", "PCI bus id", _pci_key),
    ("minor_number", "minor number", id_value),
    ("index", "index", id_value),
)


def _lost_gpus(gpus: Sequence[dict[str, Any]], outputs: Outputs) -> list[str]:
    """PCI addresses of GPUs the kernel log says fell off the bus and nvidia-smi no longer
    lists: the GPUs a short count is missing (names them, when the log does)."""
    xid = outputs.get("xid")
    if xid is None or xid.failure() is not None or not xid.parse_as("xid").recognised:
        return []
    visible = {_pci_key(g.get("pci_bus_id")) for g in gpus}
    lost = [str(f.get("pci")) for f in xid.parse_as("xid").data.get("fallen_off_bus") or []]
    return [pci for pci in lost if _pci_key(pci) is not None and _pci_key(pci) not in visible]


def _judge_one_gpu(
    exp: NodeExpectation, gpu: dict[str, Any], subject: str, th: dict[str, Any]
) -> list[CheckResult]:
    out: list[CheckResult] = []
    name = gpu.get("name")
    if exp.product_name is not None and name != exp.product_name:
        out.append(
            _r(
                exp,
                "gpu.model",
                Verdict.FAIL,
                f"{name}, expected {exp.product_name}",
                subject=subject,
                measured=name,
                expected=exp.product_name,
            )
        )
    # row remapping (Ampere and later)
    remap = gpu.get("remapped_rows") or {}
    if remap:
        if remap.get("failure") is True:
            out.append(
                _r(
                    exp,
                    "gpu.remap",
                    Verdict.FAIL,
                    "row remapping failed: replace the GPU",
                    subject=subject,
                    measured="failure",
                    expected="none",
                )
            )
        elif remap.get("pending") is True and (th.get("remapped_rows_pending_max") or 0) == 0:
            out.append(
                _r(
                    exp,
                    "gpu.remap",
                    Verdict.FAIL,
                    "row remapping pending: reset the GPU",
                    subject=subject,
                    measured="pending",
                    expected="none",
                )
            )
        elif remap.get("pending") is None and remap.get("failure") is None:
            out.append(
                _r(exp, "gpu.remap", Verdict.UNKNOWN, "remapped rows not readable", subject=subject)
            )
    # ECC counters, aggregate where the driver keeps them
    ecc = gpu.get("ecc") or {}
    counters = ecc.get("aggregate") or ecc.get("volatile") or {}
    for key, limit_key in (
        ("sram_uncorrectable", "sram_uncorrectable_max"),
        ("sram_correctable", "sram_correctable_max"),
        ("dram_correctable", "dram_correctable_max"),
    ):
        raw = counters.get(key)
        if not_finite(raw):
            out.append(
                _r(
                    exp,
                    f"gpu.ecc.{key}",
                    Verdict.FAIL,
                    f"{key} ({show_number(raw)}) is not a finite number: no counter reads that",
                    subject=subject,
                    expected=finite(th.get(limit_key)),
                )
            )
            continue
        value = finite(raw)
        limit = finite(th.get(limit_key))
        if value is None or limit is None:
            continue
        if value > limit:
            out.append(
                _r(
                    exp,
                    f"gpu.ecc.{key}",
                    Verdict.FAIL,
                    f"{key} {value:g} > {limit:g}",
                    subject=subject,
                    measured=value,
                    expected=limit,
                    source=exp.sources.get(limit_key),
                )
            )
    # PCIe link: judged against what the link can negotiate, not the spec sheet; the current
    # generation drops at idle (power saving), so only the width and the max generation count
    pcie = gpu.get("pcie") or {}
    for key, check in (
        ("width_current", "gpu.pcie.width"),
        ("width_max", "gpu.pcie.width"),
        ("gen_max", "gpu.pcie.gen"),
    ):
        if not_finite(pcie.get(key)):
            out.append(
                _r(
                    exp,
                    check,
                    Verdict.FAIL,
                    f"PCIe {key} ({show_number(pcie.get(key))}) is not a finite number",
                    subject=subject,
                )
            )
    width, width_max = (
        finite(pcie.get("width_current")),
        finite(pcie.get("width_max")),
    )
    if width is not None and width_max is not None and width < width_max:
        out.append(
            _r(
                exp,
                "gpu.pcie.width",
                Verdict.FAIL,
                f"PCIe link trained at x{width:g} of x{width_max:g}",
                subject=subject,
                measured=width,
                expected=width_max,
            )
        )
    gen_max = finite(pcie.get("gen_max"))
    if gen_max is not None and exp.pcie_gen is not None and gen_max < exp.pcie_gen:
        out.append(
            _r(
                exp,
                "gpu.pcie.gen",
                Verdict.FAIL,
                f"PCIe link can reach Gen{gen_max:g} only; {exp.gpu_model} is Gen{exp.pcie_gen}",
                subject=subject,
                measured=gen_max,
                expected=exp.pcie_gen,
            )
        )
    # clocks held down by something other than idle or the software power cap
    reasons = gpu.get("clocks_event_reasons") or {}
    active = sorted(k for k, v in reasons.items() if v is True and k not in _BENIGN_CLOCK_REASONS)
    if active:
        out.append(
            _r(
                exp,
                "gpu.clocks",
                Verdict.WARN,
                f"clocks held down: {', '.join(active)}",
                subject=subject,
                measured=active,
            )
        )
    # NVSwitch fabric registration (Hopper and later print it)
    fabric = gpu.get("fabric") or {}
    if exp.fabric_manager and fabric.get("state") is not None:
        state, status = fabric.get("state"), fabric.get("status")
        ok = state == "Completed" and status == "Success"
        out.append(
            _r(
                exp,
                "gpu.fabric",
                Verdict.OK if ok else Verdict.FAIL,
                f"fabric state {state}, status {status}",
                subject=subject,
                measured=f"{state}/{status}",
                expected="Completed/Success",
            )
        )
    return out


# ------------------------------------------------------------------------------------------
# Topology


_NV = re.compile(r"NV(\d+)$")


def judge_topology(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if exp.gpu_count < 2 and not exp.nics:
        return []
    result, unknown = _parsed(exp, outputs, ["topo"], "topology")
    if result is None:
        return unknown
    data = result.data
    listed: list[str] = list(data.get("gpus") or [])
    links: dict[str, dict[str, str]] = data.get("links") or {}
    out = list(unknown)
    gpus = list(dict.fromkeys(listed))  # a GPU listed twice counts once
    twice_listed = Counter(listed) if len(gpus) != len(listed) else {}
    for name in sorted(g for g, n in twice_listed.items() if n > 1):
        out.append(
            _r(
                exp,
                "gpu.duplicate",
                Verdict.FAIL,
                f"{name} is listed twice in nvidia-smi topo -m; counted once",
                subject=name,
                expected="each GPU once",
            )
        )
    if len(gpus) != exp.gpu_count:
        twice = (
            f" ({len(listed) - len(gpus)} listed twice, not counted)"
            if len(listed) > len(gpus)
            else ""
        )
        out.append(
            _r(
                exp,
                "topology.gpus",
                Verdict.FAIL,
                f"topo -m shows {len(gpus)} GPUs, expected {exp.gpu_count}{twice}",
                measured=len(gpus),
                expected=exp.gpu_count,
            )
        )
    if exp.nvlink_token is not None:
        wanted = _NV.match(exp.nvlink_token)
        want = int(wanted.group(1)) if wanted else None
        bad = []
        for a in gpus:
            for b in gpus:
                if a == b:
                    continue
                token = (links.get(a) or {}).get(b)
                m = _NV.match(token or "")
                if token is None or m is None or (want is not None and int(m.group(1)) < want):
                    bad.append((a, b, token))
        for a, b, token in bad:
            if a < b:
                out.append(
                    _r(
                        exp,
                        "topology.nvlink",
                        Verdict.FAIL,
                        f"{a}-{b} is {token or 'missing'}, expected {exp.nvlink_token}",
                        subject=f"{a}-{b}",
                        measured=token,
                        expected=exp.nvlink_token,
                        source="gpu model (data/gpu_models.yml)",
                    )
                )
        if not bad:
            out.append(
                _r(
                    exp,
                    "topology.nvlink",
                    Verdict.OK,
                    f"every GPU pair is {exp.nvlink_token} or better",
                    measured=exp.nvlink_token,
                    expected=exp.nvlink_token,
                )
            )
    if exp.nics and data.get("nics"):
        # GPUDirect RDMA wants each GPU to have a NIC behind the same PCIe switch (PIX/PXB)
        nics: list[str] = list(data.get("nics") or [])
        for g in gpus:
            best = [(links.get(g) or {}).get(n) for n in nics]
            if any(t in ("PIX", "PXB") for t in best):
                continue
            out.append(
                _r(
                    exp,
                    "topology.gpu_nic_affinity",
                    Verdict.WARN,
                    f"{g} has no NIC behind its PCIe switch (best: "
                    f"{', '.join(sorted({t or '?' for t in best}))}); GPUDirect RDMA slows",
                    subject=g,
                    expected="PIX or PXB",
                )
            )
    return out


# ------------------------------------------------------------------------------------------
# NCCL


def judge_nccl(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if exp.gpu_count < 2 or exp.level == "quick":  # quick runs no nccl-tests (probes.py)
        return []
    result, unknown = _parsed(exp, outputs, ["nccl"], "nccl.busbw")
    if result is None:
        return unknown
    data = result.data
    out = list(unknown)
    errors: list[str] = list(data.get("errors") or [])
    rows: list[dict[str, Any]] = list(data.get("rows") or [])
    if errors:
        out.append(
            _r(
                exp,
                "nccl.errors",
                Verdict.FAIL,
                f"nccl-tests reported {len(errors)} failure lines",
                evidence=tuple(errors[:5]),
            )
        )
    wrong = [
        (row.get("size"), side, (row.get(side) or {}).get("wrong"))
        for row in rows
        for side in ("out_of_place", "in_place")
    ]
    bad = [(s, side, w) for s, side, w in wrong if not_finite(w) or finite(w) not in (None, 0.0)]
    raw_oob = data.get("out_of_bounds")
    oob = finite(raw_oob)
    if bad or not_finite(raw_oob) or (oob is not None and oob > 0):
        out.append(
            _r(
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
        out.append(_r(exp, "nccl.wrong", Verdict.OK, "no wrong results", measured=0, expected=0))
    out += _nccl_ranks(exp, data.get("ranks") or [])
    ceiling = busbw_ceiling(exp.gpu_model)
    probe = outputs.get("nccl")
    lie = nccl_table_lie(rows, ceiling, probe.text if probe is not None else None)
    if lie is None and not rows:
        out.append(_r(exp, "nccl.busbw", Verdict.UNKNOWN, "no bandwidth rows in the output"))
        return out
    if lie is not None:
        out.append(
            _r(
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
    largest = max(rows, key=lambda r: finite(r.get("size")) or 0.0)
    busbw = finite((largest.get("out_of_place") or {}).get("busbw"))
    size = largest.get("size")
    if threshold is None:
        out.append(
            _r(
                exp,
                "nccl.busbw",
                Verdict.UNKNOWN,
                f"busbw {busbw} GB/s at {size} B, but no threshold is set for "
                f"{exp.gpu_model}: set validation.thresholds.nccl_all_reduce_busbw_gbs",
                measured=busbw,
                unit="GB/s",
            )
        )
    elif busbw is not None:
        ok = busbw >= threshold
        out.append(
            _r(
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


def _nccl_ranks(exp: NodeExpectation, ranks: Sequence[Mapping[str, Any]]) -> list[CheckResult]:
    """nccl-tests cannot run on more GPUs of one host than it has."""
    per_host: dict[str, set[Any]] = {}
    for i, rank in enumerate(ranks):
        device = rank.get("device")
        key = device if device is not None else rank.get("busid") or f"rank {i}"
        per_host.setdefault(str(rank.get("host")), set()).add(key)
    out: list[CheckResult] = []
    for host, devices in sorted(per_host.items()):
        if len(devices) > exp.gpu_count:
            out.append(
                _r(
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


# ------------------------------------------------------------------------------------------
# InfiniBand / RoCE ports and bandwidth


def judge_ib_ports(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if not exp.nics:
        return []
    result, unknown = _parsed(exp, outputs, ["ibstat"], "ib.port")
    if result is None:
        return unknown
    cas: dict[str, Any] = result.data.get("cas") or {}
    out = list(unknown)
    probe = outputs.get("ibstat")
    out += _hcas_listed_twice(exp, cas, probe.text if probe is not None else None)
    for nic in exp.nics:
        ca = cas.get(nic.device)
        if ca is None:
            out.append(
                _r(
                    exp,
                    "ib.port",
                    Verdict.FAIL,
                    f"{nic.device} is missing from ibstat",
                    subject=nic.device,
                    evidence=tuple(result.data.get("errors") or ()),
                )
            )
            continue
        ports: dict[str, Any] = ca.get("ports") or {}
        port = ports.get("1")
        if port is None:
            out.append(
                _r(
                    exp,
                    "ib.port",
                    Verdict.UNKNOWN,
                    f"{nic.device} shows no port 1",
                    subject=nic.device,
                )
            )
            continue
        subject = f"{nic.device}/1"
        state, phys = port.get("state"), port.get("physical_state")
        if state != "Active" or phys != "LinkUp":
            out.append(
                _r(
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
            out.append(_r(exp, "ib.port.state", Verdict.OK, "Active, LinkUp", subject=subject))
        out += _judge_port_rate(exp, nic, port.get("rate"), subject)
        layer = port.get("link_layer")
        if layer != nic.link_layer:
            out.append(
                _r(
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
    exp: NodeExpectation, nic: ExpectedNic, raw: Any, subject: str
) -> list[CheckResult]:
    """The port's rate against cluster.yml; a rate no port of its kind runs at is FAIL."""
    kind = _KIND_NAMES.get(nic.kind, nic.kind)
    fastest = port_ceiling(fastest_rate(nic.kind), f"the fastest {kind} port gpuctl knows")
    lie = implausible(raw, fastest, "rate", "Gb/s") if raw is not None else None
    if lie is not None:
        return [
            _r(
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
            _r(
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
        _r(
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


def _hcas_listed_twice(
    exp: NodeExpectation, cas: Mapping[str, Any], text: str | None
) -> list[CheckResult]:
    """An HCA whose name ibstat prints twice (the parser keeps one block), or one of the
    expected HCAs with the node or port GUID of another: the same HCA listed twice."""
    out: list[CheckResult] = []
    if text is not None and text.count("CA '") > len(cas):
        names = Counter(_CA_HEADER.findall(clean(text)))
        for name in sorted(n for n, k in names.items() if k > 1):
            out.append(
                _r(
                    exp,
                    "ib.duplicate",
                    Verdict.FAIL,
                    f"{name} is listed twice in ibstat ({names[name]} blocks); counted once",
                    subject=name,
                    expected="each HCA once",
                )
            )
    expected = [n.device for n in exp.nics if isinstance(cas.get(n.device), Mapping)]
    items = [
        {
            "node_guid": cas[d].get("node_guid"),
            "port_guid": ((cas[d].get("ports") or {}).get("1") or {}).get("port_guid"),
        }
        for d in expected
    ]
    keys = (("node_guid", "node GUID", _guid), ("port_guid", "port GUID", _guid))
    for i, (first, label, value) in sorted(first_seen(items, keys).items()):
        out.append(
            _r(
                exp,
                "ib.duplicate",
                Verdict.FAIL,
                f"{expected[i]} is listed twice: same {label} {value} as {expected[first]}",
                subject=expected[i],
                expected="each HCA once",
            )
        )
    return out


def port_rates(outputs: Outputs) -> dict[str, float]:
    """Port 1's rate per HCA as ibstat reports it (Gb/s), for the ceiling of ib_write_bw;
    rates no port runs at are left out (the port judge fails them)."""
    probe = outputs.get("ibstat")
    if probe is None or probe.failure() is not None:
        return {}
    result = probe.parse_as("ibstat")
    if not result.recognised:
        return {}
    top = fastest_rate(None) * (1.0 + ceiling_tolerance())
    rates: dict[str, float] = {}
    for name, ca in (result.data.get("cas") or {}).items():
        port = ((ca or {}).get("ports") or {}).get("1") or {}
        rate = finite(port.get("rate"))
        if rate is not None and 0 < rate <= top:
            rates[name] = rate
    return rates


def _bw_ceiling(
    nic: ExpectedNic, port_rates: Mapping[str, float] | None, data: Mapping[str, Any]
) -> Ceiling:
    """What one ib_write_bw run can reach: the rate ibstat reports for the port, else the
    configured rate, else the fastest port of its kind; twice that both ways or on two ports."""
    reported = finite((port_rates or {}).get(nic.device))
    if reported is not None and reported > 0:
        ceiling = port_ceiling(reported, "the rate ibstat reports for the port")
    elif nic.rate_gbps:
        ceiling = port_ceiling(nic.rate_gbps, "the port's line rate")
    else:
        kind = _KIND_NAMES.get(nic.kind, nic.kind)
        ceiling = port_ceiling(fastest_rate(nic.kind), f"the fastest {kind} port gpuctl knows")
    settings = data.get("settings") or {}
    both_ways = "bidirectional" in str(data.get("test") or "").lower()
    two_ports = str(settings.get("Dual-port") or "").strip().upper() == "ON"
    if both_ways or two_ports:
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
        probe = per_hca.get(nic.device)
        subject = nic.device
        if probe is None:
            out.append(_r(exp, "ib.write_bw", Verdict.UNKNOWN, "not measured", subject=subject))
            continue
        result, unknown = _parsed(exp, {"perftest": probe}, ["perftest"], "ib.write_bw")
        if result is None:
            out += [_with_subject(u, subject) for u in unknown]
            continue
        data = result.data
        blocks = data.get("blocks") or [data]
        read = sum(len(b.get("rows") or []) for b in blocks if isinstance(b, Mapping))
        unread = unread_lines(probe.text, PERFTEST_LINE, read, "#bytes")
        if unread:
            out.append(
                _r(
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
            out += [_with_subject(u, subject) for u in unknown]
            continue
        rows = [r for r in data.get("rows") or [] if "bw_average" in r]
        if not rows:
            out.append(_r(exp, "ib.write_bw", Verdict.UNKNOWN, "no result row", subject=subject))
            continue
        # the largest message size, whatever its bandwidth reads: never another row instead
        row = max(rows, key=lambda r: finite(r.get("bytes")) or 0.0)
        unit = data.get("bw_unit")
        if unit not in ("MB/sec", "Gb/sec"):
            out.append(
                _r(exp, "ib.write_bw", Verdict.UNKNOWN, f"unknown unit {unit!r}", subject=subject)
            )
            continue
        raw = row.get("bw_average")
        bw = finite(raw)
        if bw is not None and unit == "MB/sec":
            bw = round(bw * MB_PER_SEC_TO_GBPS, 2)
        ceiling = _bw_ceiling(nic, port_rates, data)
        lie = implausible(bw if bw is not None else raw, ceiling, "ib_write_bw", "Gb/s")
        if lie is not None:
            out.append(
                _r(
                    exp,
                    "ib.write_bw",
                    Verdict.FAIL,
                    f"{lie} (at {show_number(row.get('bytes'))} B)",
                    subject=subject,
                    expected=threshold,
                    unit="Gb/s",
                    limit=ceiling.value,
                    source=ceiling.source,
                )
            )
            out += [_with_subject(u, subject) for u in unknown]
            continue
        assert bw is not None  # noqa: S101 - implausible() refuses None
        if threshold is None:
            out.append(
                _r(
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
            _r(
                exp,
                "ib.write_bw",
                Verdict.OK if ok else Verdict.FAIL,
                f"{bw:g} Gb/s " + (">=" if ok else "<") + f" {threshold:g}",
                subject=subject,
                measured=bw,
                expected=threshold,
                unit="Gb/s",
                limit=float(nic.rate_gbps) if nic.rate_gbps else None,
                source=exp.sources.get("ib_write_bw_gbps"),
            )
        )
        out += [_with_subject(u, subject) for u in unknown]
    return out


def threshold_value(value: Any, limit: float | None) -> float | None:
    """A threshold as a number: given directly, or as a share of the physical limit ("90%")."""
    if isinstance(value, str) and value.endswith("%"):
        share = finite(float(value[:-1])) if value[:-1].replace(".", "", 1).isdigit() else None
        return round(share / 100.0 * limit, 3) if share is not None and limit else None
    return finite(value)


def _with_subject(result: CheckResult, subject: str) -> CheckResult:
    return dataclasses.replace(result, subject=subject)


# ------------------------------------------------------------------------------------------
# Kernel log: Xid / fallen off the bus / SXid


@cache
def xid_actions() -> dict[int, str]:
    data = load_data("xid.yml")
    return {int(x): action for action, xids in data["actions"].items() for x in xids}


def _event_time(stamp: Any) -> datetime | None:
    """ISO (`dmesg --time-format iso`) or ctime (`dmesg -T`) timestamps; None for others."""
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.fromisoformat(stamp.replace(",", "."))
    except ValueError:
        try:
            when = datetime.strptime(stamp, "%a %b %d %H:%M:%S %Y")
        except ValueError:
            return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def judge_xid(
    exp: NodeExpectation, outputs: Outputs, now: datetime | None = None
) -> list[CheckResult]:
    """Xid events in the window (data/xid.yml). Events whose time cannot be read count: a log
    the collector bounded to the window (journalctl --since) is judged whole."""
    if exp.gpu_count == 0:
        return []
    result, unknown = _parsed(exp, outputs, ["xid"], "xid")
    if result is None:
        return unknown
    out = list(unknown)
    actions = xid_actions()
    default = str(load_data("xid.yml")["default_action"])
    events: list[dict[str, Any]] = list(result.data.get("events") or [])
    if now is not None:
        since = now - timedelta(hours=float(load_data("xid.yml")["window_hours"]))
        events = [
            e for e in events if (when := _event_time(e.get("timestamp"))) is None or when >= since
        ]
    for ev in result.data.get("fallen_off_bus") or []:
        out.append(
            _r(
                exp,
                "xid.fallen_off_bus",
                Verdict.FAIL,
                f"GPU {ev.get('pci')} has fallen off the bus: reboot",
                subject=ev.get("pci"),
                measured=79,
            )
        )
    seen: dict[tuple[Any, int], list[dict[str, Any]]] = {}
    for ev in events:
        xid = ev.get("xid")
        if isinstance(xid, int):
            seen.setdefault((ev.get("pci"), xid), []).append(ev)
    for (pci, xid), evs in sorted(seen.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        action = actions.get(xid, default)
        verdict = Verdict.WARN if action == "monitor" else Verdict.FAIL
        out.append(
            _r(
                exp,
                "xid",
                verdict,
                f"Xid {xid} x{len(evs)}: {action}",
                subject=str(pci),
                measured=xid,
                source="data/xid.yml (AWS ladder, Azure fatal list)",
                evidence=tuple(str(e.get("message", ""))[:200] for e in evs[:3]),
            )
        )
    if not out:
        out.append(_r(exp, "xid", Verdict.OK, "no Xid events in the window"))
    return out


# ------------------------------------------------------------------------------------------
# Fabric Manager


def judge_fabric_manager(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if not exp.fabric_manager:
        return []
    result, unknown = _parsed(exp, outputs, ["fabricmanager"], "fabricmanager")
    if result is None:
        return unknown
    data = result.data
    out = list(unknown)
    active = data.get("active")
    if active is True:
        out.append(_r(exp, "fabricmanager.active", Verdict.OK, "nvidia-fabricmanager is active"))
    elif active is False:
        out.append(
            _r(
                exp,
                "fabricmanager.active",
                Verdict.FAIL,
                f"nvidia-fabricmanager is {data.get('state') or 'not active'}",
                evidence=tuple(str(e) for e in (data.get("errors") or [])[:5]),
            )
        )
    else:
        out.append(
            _r(
                exp,
                "fabricmanager.active",
                Verdict.UNKNOWN,
                "the output does not say whether Fabric Manager runs",
            )
        )
    version = data.get("version")
    if version is not None and exp.driver_version is not None and version != exp.driver_version:
        out.append(
            _r(
                exp,
                "fabricmanager.version",
                Verdict.FAIL,
                f"Fabric Manager {version} differs from the driver {exp.driver_version}",
                measured=version,
                expected=exp.driver_version,
            )
        )
    return out


# ------------------------------------------------------------------------------------------
# DCGM diag


def judge_dcgm(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    if exp.gpu_count == 0 or exp.level == "quick":
        return []
    result, unknown = _parsed(exp, outputs, ["dcgm-diag"], "dcgm")
    if result is None:
        return unknown
    out = list(unknown)
    for test in result.data.get("tests") or []:
        res = str(test.get("result") or "")
        verdict = {
            "pass": Verdict.OK,
            "fail": Verdict.FAIL,
            "warn": Verdict.WARN,
            "skip": Verdict.OK,
        }.get(res.lower(), Verdict.UNKNOWN)
        if verdict is Verdict.OK and res.lower() == "skip":
            continue
        messages = tuple(str(m) for m in test.get("messages") or [])
        out.append(
            _r(
                exp,
                "dcgm.diag",
                verdict,
                f"{test.get('name')}: {res or 'no result'}",
                subject=str(test.get("name")),
                evidence=messages[:3],
            )
        )
    overall = result.data.get("overall")
    if overall is None:
        out.append(_r(exp, "dcgm.diag", Verdict.UNKNOWN, "dcgmi diag output is incomplete"))
    return out


# ------------------------------------------------------------------------------------------
# Slurm node state


_BAD_STATES = {"down", "fail", "failing", "not_responding", "no_respond"}


def judge_nvlink_status(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """Inactive NVLinks (`nvidia-smi nvlink -s`) on NVLink-connected GPUs."""
    if exp.interconnect not in ("nvswitch", "nvlink", "nvlink-bridge"):
        return []
    result, unknown = _parsed(exp, outputs, ["nvlink"], "gpu.nvlink")
    if result is None:
        return unknown
    out = list(unknown)
    listed: list[dict[str, Any]] = list(result.data.get("gpus") or [])
    repeats = first_seen(listed, (("index", "index", id_value), ("uuid", "UUID", id_value)))
    out += _listed_twice(exp, listed, repeats, where=" in nvidia-smi nvlink -s")
    for gpu in listed:
        links = gpu.get("links") or []
        down = [str(link.get("link")) for link in links if link.get("active") is False]
        subject = f"GPU{gpu.get('index')}"
        if down:
            out.append(
                _r(
                    exp,
                    "gpu.nvlink",
                    Verdict.FAIL,
                    f"{len(down)} of {len(links)} NVLinks inactive: {', '.join(down)}",
                    subject=subject,
                    measured=len(links) - len(down),
                    expected=len(links),
                )
            )
    total = sum(len(g.get("links") or []) for i, g in enumerate(listed) if i not in repeats)
    if total == 0:
        out.append(_r(exp, "gpu.nvlink", Verdict.UNKNOWN, "nvlink -s lists no links"))
    elif not out:
        out.append(_r(exp, "gpu.nvlink", Verdict.OK, f"all {total} NVLinks active"))
    return out


def judge_slurm_node(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    result, unknown = _parsed(exp, outputs, ["scontrol-node"], "slurm.state")
    if result is None:
        return unknown
    out = list(unknown)
    nodes = [n for n in result.data.get("nodes") or [] if n.get("NodeName") == exp.node]
    if not nodes:
        return [*out, _r(exp, "slurm.state", Verdict.UNKNOWN, "node not in scontrol output")]
    node = nodes[0]
    state = str(node.get("state") or "").lower()
    flags = [str(f).lower() for f in node.get("state_flags") or []]
    reason = node.get("reason")
    if state in _BAD_STATES or any(f in _BAD_STATES for f in flags):
        out.append(
            _r(
                exp,
                "slurm.state",
                Verdict.FAIL,
                f"Slurm state {state}+{'+'.join(flags)}",
                measured=state,
                evidence=(str(reason),) if reason else (),
            )
        )
    elif "drain" in flags or state in ("drain", "drained", "draining"):
        ours = isinstance(reason, str) and reason.startswith("gpuctl:")
        out.append(
            _r(
                exp,
                "slurm.state",
                Verdict.WARN,
                f"drained ({'by gpuctl' if ours else 'by someone else'}): {reason}",
                measured=state,
            )
        )
    else:
        out.append(_r(exp, "slurm.state", Verdict.OK, f"Slurm state {state}", measured=state))
    return out


# ------------------------------------------------------------------------------------------
# Fleet-relative


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


NodeJudge = Callable[[NodeExpectation, Outputs], list[CheckResult]]
NODE_JUDGES: tuple[NodeJudge, ...] = (
    judge_gpus,
    judge_topology,
    judge_nccl,
    judge_ib_ports,
    judge_xid,
    judge_fabric_manager,
    judge_dcgm,
    judge_nvlink_status,
)

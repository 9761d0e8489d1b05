"""PCIe: host <-> GPU copy bandwidth over each GPU's link (nvbandwidth), and the AER errors
every device's link reported (the kernel log).

``pcie.h2d`` and ``pcie.d2h``, one result per GPU (subject ``GPU<i>``): nvbandwidth's
host_to_device_memcpy_ce and device_to_host_memcpy_ce, the copy engines between the host and
each GPU, against ``pcie_h2d_gbs`` / ``pcie_d2h_gbs`` (per GPU model, data/gpu_models.yml). A
link trained down (x8: half the bandwidth), a GPU behind a bad switch port or IOMMU translation
in the way fails here even where the link state looks right. A value above what the model's x16
link can carry at all is not a measurement (FAIL, as a lie); a GPU the run did not measure
(N/A, a column missing, fewer GPUs than the node has) or a testcase that did not finish is
UNKNOWN; a testcase nvbandwidth reported as an error, or whose copies did not match their data
pattern, is FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuctl.config.catalog import pcie_ceiling
from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import (
    Evidence,
    Outputs,
    finding,
    node_judge,
    record,
    usable_parse,
)
from gpuctl.validation.judges.xid import in_window, window_start
from gpuctl.validation.parsers.kernel import kernel_log_of
from gpuctl.validation.parsers.nvbandwidth import (
    NVBANDWIDTH,
    NvbandwidthCase,
    NvbandwidthRun,
    nvbandwidth_run_of,
)
from gpuctl.validation.plausible import finite, show_number
from gpuctl.validation.probes import NVBANDWIDTH_D2H, NVBANDWIDTH_H2D
from gpuctl.validation.results import CheckResult, Verdict

# (check, nvbandwidth testcase, threshold key, what it copies)
DIRECTIONS = (
    ("pcie.h2d", NVBANDWIDTH_H2D, "pcie_h2d_gbs", "host -> GPU"),
    ("pcie.d2h", NVBANDWIDTH_D2H, "pcie_d2h_gbs", "GPU -> host"),
)
# a measurement may exceed the nominal link rate by rounding and clock skew, never by more
_CEILING_SLACK = 1.05


@node_judge(NVBANDWIDTH)
def judge_pcie_copies(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    out: list[CheckResult] = []
    for check, testcase, key, what in DIRECTIONS:
        result, unknown = usable_parse(exp, outputs, [NVBANDWIDTH], check)
        if result is None:
            out += unknown
            continue
        out += unknown
        out += _direction(exp, record(result, nvbandwidth_run_of), check, testcase, key, what)
    return out


def _direction(
    exp: NodeExpectation, run: NvbandwidthRun, check: str, testcase: str, key: str, what: str
) -> list[CheckResult]:
    case = run.case(testcase)
    if case is None or case.status != "passed":
        return [_not_measured(exp, run, case, check, testcase)]
    values = case.per_gpu()
    threshold = finite(exp.thresholds.get(key))
    ceiling = pcie_ceiling(exp.pcie_gen, 16) if exp.pcie_gen else None
    source = exp.sources.get(key)
    out: list[CheckResult] = []
    extra = sorted(set(values) - set(range(exp.gpu_count)))
    if extra:
        out.append(
            finding(
                exp,
                check,
                Verdict.UNKNOWN,
                f"{testcase} measured GPU {', '.join(map(str, extra))}, but the node has "
                f"{exp.gpu_count} GPUs (0-{exp.gpu_count - 1})",
            )
        )
    for gpu in range(exp.gpu_count):
        subject = f"GPU{gpu}"
        bus = run.bus_id(gpu)
        at = f" ({bus})" if bus else ""
        raw = values.get(gpu)
        value = finite(raw)
        if value is None:
            shown = "no value" if gpu not in values else f"{show_number(raw)}"
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.UNKNOWN,
                    f"{what}{at}: {testcase} shows {shown} for this GPU: not measured",
                    subject=subject,
                    expected=threshold,
                    unit="GB/s",
                    source=source,
                )
            )
            continue
        if ceiling is not None and value > ceiling.value * _CEILING_SLACK:
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.FAIL,
                    f"{what}{at}: {value:g} GB/s is more than {ceiling.what} carries "
                    f"({ceiling.value:g} GB/s): not a real measurement",
                    subject=subject,
                    measured=value,
                    unit="GB/s",
                    limit=ceiling.value,
                    source=ceiling.source,
                )
            )
            continue
        if threshold is None:
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.UNKNOWN,
                    f"{what}{at}: {value:g} GB/s, but no threshold is set for {exp.gpu_model}: "
                    f"set validation.thresholds.{key}",
                    subject=subject,
                    measured=value,
                    unit="GB/s",
                )
            )
            continue
        ok = value >= threshold
        out.append(
            finding(
                exp,
                check,
                Verdict.OK if ok else Verdict.FAIL,
                f"{what}{at}: {value:g} GB/s " + (">=" if ok else "<") + f" {threshold:g}",
                subject=subject,
                measured=value,
                expected=threshold,
                unit="GB/s",
                limit=ceiling.value if ceiling is not None else None,
                source=source,
            )
        )
    return out


def _not_measured(
    exp: NodeExpectation,
    run: NvbandwidthRun,
    case: NvbandwidthCase | None,
    check: str,
    testcase: str,
) -> CheckResult:
    errors = tuple(run.errors[:5])
    if case is not None and case.status == "error":
        return finding(
            exp,
            check,
            Verdict.FAIL,
            f"nvbandwidth {testcase} failed: {case.message or 'error'}",
            evidence=errors,
        )
    if case is not None and any(e.startswith("Invalid value when checking") for e in errors):
        return finding(
            exp,
            check,
            Verdict.FAIL,
            f"nvbandwidth {testcase}: the copied data did not match its pattern (corrupted)",
            evidence=errors,
        )
    if case is None:
        why = "not in the output"
        if run.waived:
            why += f" ({run.waived} testcase(s) waived)"
    else:
        why = f"did not finish ({case.status}" + (f": {case.message})" if case.message else ")")
    return finding(
        exp,
        check,
        Verdict.UNKNOWN,
        f"nvbandwidth {testcase} {why}: no copy bandwidth measured",
        evidence=errors,
    )


# ------------------------------------------------------------------------------------------
# PCIe Advanced Error Reporting: the errors each device's link reported, from the kernel log


AER_CHECK = "pcie.aer"
_SEVERITY_RANK = {"corrected": 1, "nonfatal": 2, "fatal": 3}
_AER_WORDS = {
    "corrected": "corrected",
    "nonfatal": "uncorrectable (non-fatal)",
    "fatal": "uncorrectable (fatal)",
}


@dataclass
class _Device:
    """The AER errors of one device in the window."""

    pci: str
    label: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "Physical Layer: RxErr", in order

    def add(self, severity: str | None, text: str) -> None:
        if severity is None:
            self.unreadable.append(text)
        else:
            self.counts[severity] = self.counts.get(severity, 0) + 1

    def worst(self) -> str | None:
        return max(self.counts, key=_SEVERITY_RANK.__getitem__, default=None)


@node_judge("xid")
def judge_pcie_aer(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """``pcie.aer``, one result per device that reported PCIe AER errors in the Xid window
    (data/xid.yml, ending at ``evidence.now``; the whole log where no collection time can be
    trusted, and then never OK): an uncorrectable error (Non-Fatal or Fatal) FAILs the device
    (a transaction was lost; the driver may have reset the link), corrected errors WARN (the
    link retries: a bad riser, seating or signal integrity, and bandwidth lost to replays).
    Errors are counted per device from its ``PCIe Bus Error`` lines, or from the port's
    ``error received`` lines where the device printed none (the kernel rate-limits details).
    An error whose severity cannot be read is UNKNOWN for its device."""
    result, unknown = usable_parse(exp, evidence, ["xid"], AER_CHECK)
    if result is None:
        return unknown
    log = record(result, kernel_log_of)
    problem = evidence.clock_problem
    since = window_start(None if problem else evidence.now)
    devices: dict[str, _Device] = {}
    for ev in log.aer:
        if not in_window(ev.timestamp, since):
            continue
        dev = devices.setdefault(ev.pci, _Device(ev.pci))
        ids = f" [{ev.device}]" if ev.device else ""
        dev.label = f"{ev.driver} {ev.pci}{ids}"
        dev.add(ev.severity, ev.severity_text)
        kind = ev.type + (f": {', '.join(ev.errors)}" if ev.errors else "")
        if kind not in dev.kinds:
            dev.kinds.append(kind)
    # a port's "error received" lines for a device that printed no details of its own
    reported: dict[str, _Device] = {}
    for rec in log.aer_received:
        if not in_window(rec.timestamp, since):
            continue
        pci = rec.source or rec.port
        if pci in devices:
            continue
        dev = reported.setdefault(pci, _Device(pci, label=pci))
        if rec.source is None:
            dev.label = f"a device below port {rec.port}"
        dev.add(rec.severity, "error received" + (" (multiple)" if rec.multiple else ""))
    devices.update(reported)

    out = list(unknown)
    for pci in sorted(devices):
        out.append(_aer_result(exp, devices[pci]))
    if problem is not None:
        out.append(
            finding(
                exp,
                f"{AER_CHECK}.window",
                Verdict.UNKNOWN,
                f"the AER window cannot be placed: {problem}; every AER error in the log counts",
            )
        )
    elif not devices:
        out.append(finding(exp, AER_CHECK, Verdict.OK, "no PCIe AER errors in the window"))
    return out


def _aer_result(exp: NodeExpectation, dev: _Device) -> CheckResult:
    counts = ", ".join(
        f"{n} {_AER_WORDS[s]}"
        for s, n in sorted(dev.counts.items(), key=lambda kv: -_SEVERITY_RANK[kv[0]])
    )
    kinds = f" ({'; '.join(dev.kinds[:3])})" if dev.kinds else ""
    worst = dev.worst()
    total = sum(dev.counts.values())
    if dev.unreadable and (worst is None or worst == "corrected"):
        return finding(
            exp,
            AER_CHECK,
            Verdict.UNKNOWN,
            f"{dev.label}: PCIe AER error(s) of a severity not understood "
            f"({', '.join(sorted(set(dev.unreadable)))[:120]})"
            + (f"; also {counts}" if counts else ""),
            subject=dev.pci,
        )
    if worst in ("nonfatal", "fatal"):
        return finding(
            exp,
            AER_CHECK,
            Verdict.FAIL,
            f"{dev.label}: {counts} PCIe error(s){kinds}: transactions were lost on this link; "
            "reset or reseat the device, check its slot, riser and cable",
            subject=dev.pci,
            measured=total,
            expected=0,
            unit="errors",
        )
    return finding(
        exp,
        AER_CHECK,
        Verdict.WARN,
        f"{dev.label}: {counts} PCIe error(s){kinds}: the link retries (replays cost "
        "bandwidth); check seating, riser and cable if they keep growing",
        subject=dev.pci,
        measured=total,
        unit="errors",
    )


# ------------------------------------------------------------------------------------------
# The IOMMU mode the node booted with (the kernel log)

IOMMU_CHECK = "pcie.iommu"


@node_judge("xid")
def judge_iommu(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    """``pcie.iommu`` on nodes where GPUs talk to each other or to NICs directly (2+ GPUs, or an
    adapter): devices in IOMMU groups under the ``Translated`` default domain put every DMA of
    GPUDirect RDMA and peer traffic through the IOMMU's page tables (slower, and peer mappings
    can fail): WARN, with the fix (``iommu=pt``, NVIDIA's GPUDirect RDMA and NCCL guides).
    ``Passthrough`` (or ``identity``), or no device in an IOMMU group (no IOMMU active): OK. A
    kernel log that does not show the boot's ``iommu: Default domain type`` line (kernels before
    5.2, a journal that lost the boot's first lines) gives no result: the mode is not known,
    and nothing else depends on it."""
    if exp.gpu_count < 2 and not exp.nics:
        return []
    result, unknown = usable_parse(exp, evidence, ["xid"], IOMMU_CHECK)
    if result is None:
        return []  # the kernel log itself is judged (and UNKNOWN) by xid and pcie.aer
    mode = record(result, kernel_log_of).iommu
    if mode is None:
        return []
    by = f" (set via {mode.set_by})" if mode.set_by else ""
    what = f"IOMMU default domain {mode.default_domain}{by}"
    if mode.default_domain.lower() in ("passthrough", "identity"):
        verdict, message = Verdict.OK, what
    elif mode.groups == 0:
        verdict = Verdict.OK
        message = f"{what}, but no device joined an IOMMU group: no IOMMU translates DMA"
    else:
        verdict = Verdict.WARN
        message = (
            f"{what} with {mode.groups} device(s) in IOMMU groups: GPUDirect RDMA and GPU peer "
            "traffic are translated by the IOMMU; boot with iommu=pt (NVIDIA GPUDirect RDMA, "
            "NCCL troubleshooting)"
        )
    measured = mode.groups if verdict is Verdict.WARN else None
    unit = "devices" if measured is not None else None
    return [*unknown, finding(exp, IOMMU_CHECK, verdict, message, measured=measured, unit=unit)]

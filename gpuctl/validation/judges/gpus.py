"""GPUs (``nvidia-smi -q -x``): inventory, driver, ECC and row remapping, PCIe link, clocks,
fabric state, persistence mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Outputs, finding, listed_twice, node_judge, usable_parse
from gpuctl.validation.parsers.kernel import kernel_log_of
from gpuctl.validation.parsers.nvsmi_gpu import (
    EccCounters,
    GpuRecord,
    PcieLink,
    RemappedRows,
    smi_of,
)
from gpuctl.validation.plausible import (
    finite,
    first_seen,
    id_value,
    not_finite,
    show_number,
)
from gpuctl.validation.results import CheckResult, Verdict

# Clock event reasons that are normal (Azure's health checks warn on the others).
_BENIGN_CLOCK_REASONS = {
    "idle",
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "display_clock_setting",
    "display_clocks_setting",
}


@node_judge("smi-xml", "smi-q")
def judge_gpus(exp: NodeExpectation, outputs: Outputs) -> list[CheckResult]:
    """Every GPU of the node (nvidia-smi XML, else its text form); the kernel log names the
    GPUs a short count is missing."""
    result, unknown = usable_parse(exp, outputs, ["smi-xml", "smi-q"], "gpu")
    if result is None:
        return unknown
    smi = smi_of(result.data)
    out = list(unknown)
    gpus = smi.gpus
    ids = [g.ids() for g in gpus]
    repeats = first_seen(ids, _GPU_IDS)
    out += listed_twice(exp, ids, repeats, tail="; counted once", by_position=True)
    distinct = [g for i, g in enumerate(gpus) if i not in repeats]
    twice = f" ({len(repeats)} listed twice, not counted)" if repeats else ""
    if len(distinct) != exp.gpu_count:
        lost = _lost_gpus(distinct, outputs) if len(distinct) < exp.gpu_count else []
        out.append(
            finding(
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
            finding(
                exp,
                "gpu.count",
                Verdict.OK,
                f"{len(distinct)} GPUs",
                measured=len(distinct),
                expected=exp.gpu_count,
            )
        )
    driver = smi.driver_version
    if exp.driver_version is not None:
        if driver is None:
            out.append(finding(exp, "gpu.driver", Verdict.UNKNOWN, "driver version not shown"))
        else:
            ok = driver == exp.driver_version
            out.append(
                finding(
                    exp,
                    "gpu.driver",
                    Verdict.OK if ok else Verdict.FAIL,
                    f"driver {driver}" + ("" if ok else f", expected {exp.driver_version}"),
                    measured=driver,
                    expected=exp.driver_version,
                )
            )
    th = exp.thresholds
    for gpu in gpus:
        out += _judge_one_gpu(exp, gpu, th)
    out += _judge_persistence(exp, distinct)
    return out


def _judge_persistence(exp: NodeExpectation, gpus: Sequence[GpuRecord]) -> list[CheckResult]:
    """Persistence mode, one result for the node. Without it the driver tears a GPU's state
    down whenever no process holds the device, and every CUDA job start pays seconds to set it
    up again (NVIDIA, Driver Persistence, "Background":
    https://docs.nvidia.com/deploy/driver-persistence/background.html); the nvidia_driver role
    runs nvidia-persistenced with persistence mode on. Off is WARN (jobs run, slower to
    start); a GPU whose mode is not shown leaves it UNKNOWN."""
    if not gpus:
        return []
    modes = {g.subject: g.persistence_mode for g in gpus}
    off = [s for s, mode in modes.items() if mode == "Disabled"]
    unread = [s for s, mode in modes.items() if mode not in ("Enabled", "Disabled")]
    if off:
        return [
            finding(
                exp,
                "gpu.persistence",
                Verdict.WARN,
                f"persistence mode off on {', '.join(off)}: each CUDA job start initialises the "
                "GPU again (nvidia-persistenced not running, or run with --no-persistence-mode)",
                measured=len(off),
                expected=0,
            )
        ]
    if unread:
        return [
            finding(
                exp,
                "gpu.persistence",
                Verdict.UNKNOWN,
                f"persistence mode not shown for {', '.join(unread)}",
            )
        ]
    return [
        finding(
            exp,
            "gpu.persistence",
            Verdict.OK,
            f"persistence mode on, {len(modes)} GPUs",
            measured=0,
            expected=0,
        )
    ]


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


def _lost_gpus(gpus: Sequence[GpuRecord], outputs: Outputs) -> list[str]:
    """PCI addresses of GPUs the kernel log says fell off the bus and nvidia-smi no longer
    lists: the GPUs a short count is missing (names them, when the log does)."""
    xid = outputs.get("xid")
    if xid is None or xid.failure() is not None or not xid.parse_as("xid").recognised:
        return []
    visible = {_pci_key(g.pci_bus_id) for g in gpus}
    lost = [str(f.pci) for f in kernel_log_of(xid.parse_as("xid").data).fallen_off_bus]
    return [pci for pci in lost if _pci_key(pci) is not None and _pci_key(pci) not in visible]


def _judge_one_gpu(exp: NodeExpectation, gpu: GpuRecord, th: dict[str, Any]) -> list[CheckResult]:
    out: list[CheckResult] = []
    subject = gpu.subject
    if exp.product_name is not None and gpu.name != exp.product_name:
        out.append(
            finding(
                exp,
                "gpu.model",
                Verdict.FAIL,
                f"{gpu.name}, expected {exp.product_name}",
                subject=subject,
                measured=gpu.name,
                expected=exp.product_name,
            )
        )
    if gpu.remapped_rows is not None:  # row remapping (Ampere and later)
        out += _judge_remap(exp, gpu.remapped_rows, subject, th)
    # ECC counters, aggregate where the driver keeps them
    counters = gpu.ecc_aggregate or gpu.ecc_volatile
    if counters is not None:
        out += _judge_ecc(exp, counters, subject, th)
    if gpu.pcie is not None:
        out += _judge_pcie(exp, gpu.pcie, subject)
    # clocks held down by something other than idle or the software power cap
    active = sorted(r for r in gpu.clocks_active if r not in _BENIGN_CLOCK_REASONS)
    if active:
        out.append(
            finding(
                exp,
                "gpu.clocks",
                Verdict.WARN,
                f"clocks held down: {', '.join(active)}",
                subject=subject,
                measured=active,
            )
        )
    # NVSwitch fabric registration (Hopper and later print it)
    fabric = gpu.fabric
    if exp.fabric_manager and fabric is not None and fabric.state is not None:
        state, status = fabric.state, fabric.status
        ok = state == "Completed" and status == "Success"
        out.append(
            finding(
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


def _judge_remap(
    exp: NodeExpectation, remap: RemappedRows, subject: str, th: dict[str, Any]
) -> list[CheckResult]:
    if remap.failure is True:
        return [
            finding(
                exp,
                "gpu.remap",
                Verdict.FAIL,
                "row remapping failed: replace the GPU",
                subject=subject,
                measured="failure",
                expected="none",
            )
        ]
    if remap.pending is True and (th.get("remapped_rows_pending_max") or 0) == 0:
        return [
            finding(
                exp,
                "gpu.remap",
                Verdict.FAIL,
                "row remapping pending: reset the GPU",
                subject=subject,
                measured="pending",
                expected="none",
            )
        ]
    if remap.pending is None and remap.failure is None:
        why = "remapped rows not readable"
        return [finding(exp, "gpu.remap", Verdict.UNKNOWN, why, subject=subject)]
    return []


def _judge_ecc(
    exp: NodeExpectation, counters: EccCounters, subject: str, th: dict[str, Any]
) -> list[CheckResult]:
    out: list[CheckResult] = []
    for key, raw, limit_key in (
        ("sram_uncorrectable", counters.sram_uncorrectable, "sram_uncorrectable_max"),
        ("sram_correctable", counters.sram_correctable, "sram_correctable_max"),
        ("dram_correctable", counters.dram_correctable, "dram_correctable_max"),
    ):
        if not_finite(raw):
            out.append(
                finding(
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
                finding(
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
    return out


def _judge_pcie(exp: NodeExpectation, pcie: PcieLink, subject: str) -> list[CheckResult]:
    """Judged against what the link can negotiate, not the spec sheet; the current generation
    drops at idle (power saving), so only the width and the max generation count."""
    out: list[CheckResult] = []
    for key, raw, check in (
        ("width_current", pcie.width_current, "gpu.pcie.width"),
        ("width_max", pcie.width_max, "gpu.pcie.width"),
        ("gen_max", pcie.gen_max, "gpu.pcie.gen"),
    ):
        if not_finite(raw):
            out.append(
                finding(
                    exp,
                    check,
                    Verdict.FAIL,
                    f"PCIe {key} ({show_number(raw)}) is not a finite number",
                    subject=subject,
                )
            )
    width, width_max = finite(pcie.width_current), finite(pcie.width_max)
    if width is not None and width_max is not None and width < width_max:
        out.append(
            finding(
                exp,
                "gpu.pcie.width",
                Verdict.FAIL,
                f"PCIe link trained at x{width:g} of x{width_max:g}",
                subject=subject,
                measured=width,
                expected=width_max,
            )
        )
    gen_max = finite(pcie.gen_max)
    if gen_max is not None and exp.pcie_gen is not None and gen_max < exp.pcie_gen:
        out.append(
            finding(
                exp,
                "gpu.pcie.gen",
                Verdict.FAIL,
                f"PCIe link can reach Gen{gen_max:g} only; {exp.gpu_model} is Gen{exp.pcie_gen}",
                subject=subject,
                measured=gen_max,
                expected=exp.pcie_gen,
            )
        )
    return out

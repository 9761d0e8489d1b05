"""GPUs (``nvidia-smi -q -x``): inventory, driver, ECC and row remapping, PCIe link, clocks,
fabric state, persistence mode."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import (
    Outputs,
    finding,
    listed_twice,
    node_judge,
    record,
    usable_parse,
)
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
    smi = record(result, smi_of)
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
    per_gpu: list[CheckResult] = []
    for gpu in gpus:
        per_gpu += _judge_one_gpu(exp, gpu, th)
    out += _fold_counter_oks(exp, per_gpu)
    out += _judge_persistence(exp, distinct)
    return out


# Counter checks that give a result for every GPU: the GPUs within their limit are one OK for
# the node (what was measured, the highest value and the limit), the others keep a result of
# their own. Eight OKs per counter would say nothing more and weigh on every report of a fleet.
def _folded(check: str) -> bool:
    return check == "gpu.remap" or check.startswith("gpu.ecc.")


def _fold_counter_oks(exp: NodeExpectation, results: list[CheckResult]) -> list[CheckResult]:
    kept: list[CheckResult] = []
    oks: dict[str, list[CheckResult]] = {}
    for r in results:
        if _folded(r.check) and r.verdict is Verdict.OK:
            oks.setdefault(r.check, []).append(r)
        else:
            kept.append(r)
    for check, group in oks.items():
        if len(group) == 1:
            kept.append(group[0])
            continue
        gpus = ", ".join(r.subject or "?" for r in group)
        values = [r.measured for r in group if isinstance(r.measured, int | float)]
        first = group[0]
        if values:
            most = max(values)
            message = (
                f"{len(group)} GPUs ({gpus}): at most {most:g}, limit {first.expected:g}"
                if isinstance(first.expected, int | float)
                else f"{len(group)} GPUs ({gpus}): at most {most:g}"
            )
        else:
            message = f"{len(group)} GPUs ({gpus}): {first.message}"
        kept.append(
            finding(
                exp,
                check,
                Verdict.OK,
                message,
                measured=max(values) if values else None,
                expected=first.expected,
                source=first.source,
            )
        )
    return kept


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
    lost = [str(f.pci) for f in record(xid.parse_as("xid"), kernel_log_of).fallen_off_bus]
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


# Row remapping (Ampere and later): nvidia-smi shows two flags per GPU, "Pending" and
# "Remapping Failure Occurred" (remapped_rows.pending / remapped_rows.failure). A flag shown as
# Yes counts as 1 and fails the GPU above its maximum (data/health.yml: 0, Azure's limits).
_REMAP_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("failure", "remapped_rows_failure_max", "row remapping failed: replace the GPU"),
    ("pending", "remapped_rows_pending_max", "row remapping pending: reset the GPU"),
)


def _judge_remap(
    exp: NodeExpectation, remap: RemappedRows, subject: str, th: dict[str, Any]
) -> list[CheckResult]:
    """One ``gpu.remap`` result per GPU: FAIL when a flag's count is above its maximum, OK
    otherwise; UNKNOWN when neither flag is shown."""
    if remap.pending is None and remap.failure is None:
        why = "remapped rows not readable"
        return [finding(exp, "gpu.remap", Verdict.UNKNOWN, why, subject=subject)]
    shown: list[str] = []
    for flag, key, what in _REMAP_FLAGS:
        raw = getattr(remap, flag)
        if raw is None:
            continue
        count = 1 if raw else 0
        limit = finite(th.get(key))
        most = 0 if limit is None else limit  # a bare expectation (no thresholds): none allowed
        if count > most:
            return [
                finding(
                    exp,
                    "gpu.remap",
                    Verdict.FAIL,
                    f"{what} ({count} {flag}, at most {most:g}: {key})",
                    subject=subject,
                    measured=count,
                    expected=most,
                    source=exp.sources.get(key),
                )
            ]
        if count:
            shown.append(f"{count} {flag} (at most {most:g}: {key})")
    message = "row remapping: " + ", ".join(shown) if shown else "no row remap failed or pending"
    return [finding(exp, "gpu.remap", Verdict.OK, message, subject=subject)]


def _judge_ecc(
    exp: NodeExpectation, counters: EccCounters, subject: str, th: dict[str, Any]
) -> list[CheckResult]:
    """One ``gpu.ecc.<counter>`` result per counter shown and per GPU: FAIL above its maximum
    (or not a finite number), OK at or below it."""
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
        ok = value <= limit
        out.append(
            finding(
                exp,
                f"gpu.ecc.{key}",
                Verdict.OK if ok else Verdict.FAIL,
                f"{key} {value:g} " + ("<=" if ok else ">") + f" {limit:g}",
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

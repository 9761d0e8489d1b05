"""One extractor for ``smi-q`` and ``smi-xml``: the documented per-GPU keys (docs/parse.md)
pulled out of the tree of :mod:`gpuctl.validation.parsers.nvsmi_tree`, naming each spelling of a
field (text label or XML tag, older or newer driver), and the read errors that matter for
health; then what the judges read of that data (:func:`smi_of`, a :class:`SmiRecord`). No parser
is registered here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from gpuctl.validation.parsers.nvsmi_tree import (
    ERROR_VALUES,
    Node,
    Path,
    find_section,
    read_active,
    read_int,
    read_num,
    read_raw,
    read_text,
    read_yes_no,
)

# ------------------------------------------------------------------------------------------
# Extraction (shared by smi-q and smi-xml)

_ECC_COUNTERS: dict[str, tuple[Path, ...]] = {
    "sram_correctable": (("sram_correctable",),),
    "sram_uncorrectable": (("sram_uncorrectable",),),
    "sram_uncorrectable_parity": (("sram_uncorrectable_parity",),),
    "sram_uncorrectable_secded": (("sram_uncorrectable_sec_ded",), ("sram_uncorrectable_secded",)),
    "dram_correctable": (("dram_correctable",),),
    "dram_uncorrectable": (("dram_uncorrectable",),),
}
_OLD_ECC_LOCATIONS = (
    "device_memory",
    "dram",
    "sram",
    "register_file",
    "l1_cache",
    "l2_cache",
    "texture_memory",
    "texture_shared",
    "cbu",
    "total",
)
_SRAM_SOURCES = ("sram_l2", "sram_sm", "sram_microcontroller", "sram_pcie", "sram_other")
_REASON_NAMES = {"gpu_idle": "idle", "display_clocks_setting": "display_clock_setting"}
_TEMPERATURES: dict[str, tuple[Path, ...]] = {
    "gpu_c": (("gpu_current_temp",), ("gpu_temp",)),
    "tlimit_c": (("gpu_t_limit_temp",), ("gpu_current_t_limit_temp",), ("gpu_temp_tlimit",)),
    "shutdown_c": (("gpu_shutdown_temp",), ("gpu_temp_max_threshold",)),
    "slowdown_c": (("gpu_slowdown_temp",), ("gpu_temp_slow_threshold",)),
    "max_operating_c": (("gpu_max_operating_temp",), ("gpu_temp_max_gpu_threshold",)),
    "shutdown_tlimit_c": (("gpu_shutdown_t_limit_temp",), ("gpu_temp_max_tlimit_threshold",)),
    "slowdown_tlimit_c": (("gpu_slowdown_t_limit_temp",), ("gpu_temp_slow_tlimit_threshold",)),
    "max_operating_tlimit_c": (
        ("gpu_max_operating_t_limit_temp",),
        ("gpu_temp_max_gpu_tlimit_threshold",),
    ),
    "target_c": (("gpu_target_temperature",), ("gpu_target_temperature_specification",)),
    "memory_c": (("memory_current_temp",), ("memory_temp",)),
    "memory_max_operating_c": (("memory_max_operating_temp",), ("gpu_temp_max_mem_threshold",)),
    "memory_max_operating_tlimit_c": (
        ("memory_max_operating_t_limit_temp",),
        ("gpu_temp_max_mem_tlimit_threshold",),
    ),
}
_CEILING = "gpu_ceiling_power_limit"
_POWER: dict[str, tuple[Path, ...]] = {
    "draw_w": (("power_draw",), ("average_power_draw",)),
    "average_draw_w": (("average_power_draw",),),
    "instant_draw_w": (("instantaneous_power_draw",), ("instant_power_draw",)),
    # 610 and later: the limits moved into a "GPU Ceiling Power Limit" sub-section
    "limit_w": (
        ("current_power_limit",),
        (_CEILING, "current_power_limit"),
        ("enforced_power_limit",),
        ("power_limit",),
    ),
    "requested_limit_w": (
        ("requested_power_limit",),
        (_CEILING, "requested_power_limit"),
        ("power_limit",),
    ),
    "default_limit_w": (("default_power_limit",), (_CEILING, "default_power_limit")),
    "min_limit_w": (("min_power_limit",),),
    "max_limit_w": (("max_power_limit",),),
}
_CLOCKS: dict[str, tuple[Path, ...]] = {
    "graphics": (("graphics",), ("graphics_clock",)),
    "sm": (("sm",), ("sm_clock",)),
    "memory": (("memory",), ("mem_clock",)),
    "video": (("video",), ("video_clock",)),
}
_APP_CLOCKS = ("graphics", "memory")


def _ecc_counters(node: Node | None) -> dict[str, Any] | None:
    if node is None:
        return None
    out: dict[str, Any] = {
        key: read_int(read_raw(node, *paths)) for key, paths in _ECC_COUNTERS.items()
    }
    if out["sram_uncorrectable"] is None:
        parity, secded = out["sram_uncorrectable_parity"], out["sram_uncorrectable_secded"]
        if parity is not None and secded is not None:
            out["sram_uncorrectable"] = parity + secded  # newer drivers print the two parts
    threshold = read_raw(node, ("sram_threshold_exceeded",))
    out["sram_threshold_exceeded"] = None if threshold is None else read_yes_no(threshold)
    for bits in ("single_bit", "double_bit"):
        sec = node.child(bits)
        out[bits] = (
            None
            if sec is None
            else {
                loc: read_int(read_raw(sec, (loc,))) for loc in _OLD_ECC_LOCATIONS if sec.child(loc)
            }
        )
    return out


def _ecc(gpu: Node) -> dict[str, Any] | None:
    mode = find_section(gpu, ("ecc_mode",))
    errors = find_section(gpu, ("ecc_errors",))
    if mode is None and errors is None:
        return None
    sources = find_section(errors, ("aggregate_uncorrectable_sram_sources",))
    return {
        "mode_current": read_text(read_raw(mode, ("current",), ("current_ecc",))),
        "mode_pending": read_text(read_raw(mode, ("pending",), ("pending_ecc",))),
        "volatile": _ecc_counters(find_section(errors, ("volatile",))),
        "aggregate": _ecc_counters(find_section(errors, ("aggregate",))),
        "aggregate_uncorrectable_sram_sources": (
            None
            if sources is None
            else {k[5:]: read_int(read_raw(sources, (k,))) for k in _SRAM_SOURCES}
        ),
        "channel_repair_pending": read_yes_no(read_raw(errors, ("channel_repair_pending",))),
        "tpc_repair_pending": read_yes_no(read_raw(errors, ("tpc_repair_pending",))),
        "unrepairable_memory": read_yes_no(read_raw(errors, ("unrepairable_memory",))),
    }


def _retired_pages(gpu: Node) -> dict[str, Any] | None:
    sec = find_section(gpu, ("retired_pages",))
    if sec is None:
        return None
    pending = read_raw(
        sec,
        ("pending_page_blacklist",),
        ("pending_page_retirement",),
        ("pending",),
        ("pending_blacklist",),
        ("pending_retirement",),
    )
    return {
        "single_bit_ecc": read_int(
            read_raw(sec, ("single_bit_ecc",), ("multiple_single_bit_retirement", "retired_count"))
        ),
        "double_bit_ecc": read_int(
            read_raw(sec, ("double_bit_ecc",), ("double_bit_retirement", "retired_count"))
        ),
        "pending": read_yes_no(pending),
    }


def _remapped_rows(gpu: Node) -> dict[str, Any] | None:
    sec = find_section(gpu, ("remapped_rows",))
    if sec is None or not sec.children:  # absent, or "N/A" (not supported / MIG enabled)
        return None
    hist = find_section(sec, ("bank_remap_availability_histogram",), ("row_remapper_histogram",))
    histogram = None
    if hist is not None:
        histogram = {
            level: read_int(read_raw(hist, (level,), (f"row_remapper_histogram_{level}",)))
            for level in ("max", "high", "partial", "low", "none")
        }
    return {
        "correctable": read_int(read_raw(sec, ("correctable_error",), ("remapped_row_corr",))),
        "uncorrectable": read_int(read_raw(sec, ("uncorrectable_error",), ("remapped_row_unc",))),
        "pending": read_yes_no(read_raw(sec, ("pending",), ("remapped_row_pending",))),
        "failure": read_yes_no(
            read_raw(sec, ("remapping_failure_occurred",), ("remapped_row_failure",))
        ),
        "histogram": histogram,
    }


def _pcie(gpu: Node) -> dict[str, Any] | None:
    pci = find_section(gpu, ("pci",))
    if pci is None:
        return None
    gen = find_section(pci, ("gpu_link_info", "pcie_generation"), ("pci_gpu_link_info", "pcie_gen"))
    width = find_section(pci, ("gpu_link_info", "link_width"), ("pci_gpu_link_info", "link_widths"))
    return {
        "gen_current": read_int(read_raw(gen, ("current",), ("current_link_gen",))),
        "gen_max": read_int(read_raw(gen, ("max",), ("max_link_gen",))),
        "gen_device_current": read_int(
            read_raw(gen, ("device_current",), ("device_current_link_gen",))
        ),
        "gen_device_max": read_int(read_raw(gen, ("device_max",), ("max_device_link_gen",))),
        "gen_host_max": read_int(read_raw(gen, ("host_max",), ("max_host_link_gen",))),
        "width_current": read_int(read_raw(width, ("current",), ("current_link_width",))),
        "width_max": read_int(read_raw(width, ("max",), ("max_link_width",))),
        "replays_since_reset": read_int(
            read_raw(pci, ("replays_since_reset",), ("replay_counter",))
        ),
        "replay_rollovers": read_int(
            read_raw(pci, ("replay_number_rollovers",), ("replay_rollover_counter",))
        ),
        "tx_kb_s": read_num(read_raw(pci, ("tx_throughput",), ("tx_util",))),
        "rx_kb_s": read_num(read_raw(pci, ("rx_throughput",), ("rx_util",))),
        "device_id": read_text(read_raw(pci, ("device_id",), ("pci_device_id",))),
    }


_REASON_PREFIX = re.compile(r"^clocks_(?:event|throttle)_reason_")


@lru_cache(maxsize=1024)
def _reason_name(key: str) -> str:
    """The name in data of the reason with ``key`` (keys repeat for every GPU)."""
    key = _REASON_PREFIX.sub("", key)
    return _REASON_NAMES.get(key, key)


def _clocks_event_reasons(gpu: Node) -> tuple[str | None, dict[str, bool | None] | None]:
    sec = find_section(gpu, ("clocks_event_reasons",), ("clocks_throttle_reasons",))
    if sec is None:
        return None, None
    out: dict[str, bool | None] = {}
    for _, node in sec.walk():
        if node.value is None:
            continue
        out[_reason_name(node.key)] = read_active(node.value)
    # which name the driver used: "Clocks Throttle Reasons" (older), "Clocks Event Reasons"
    name = "Clocks Throttle Reasons" if "throttle" in sec.key else "Clocks Event Reasons"
    return name, out


# the clock event counters (microseconds each reason held the clocks down since the driver
# loaded; R535 and later): the text layout's names and the XML's keys, read as one name each
_COUNTER_NAMES = {
    "sw_power_capping": "sw_power_cap",
    "sw_power_cap": "sw_power_cap",
    "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal_slowdown",
    "sw_therm_slowdown": "sw_thermal_slowdown",
    "hw_thermal_slowdown": "hw_thermal_slowdown",
    "hw_therm_slowdown": "hw_thermal_slowdown",
    "hw_power_braking": "hw_power_brake",
    "hw_power_brake": "hw_power_brake",
}
_COUNTER_PREFIX = re.compile(r"^clocks_(?:event|throttle)_reasons_counters_")


def _clocks_event_counters(gpu: Node) -> dict[str, int | float | None] | None:
    sec = find_section(
        gpu, ("clocks_event_reasons_counters",), ("clocks_throttle_reasons_counters",)
    )
    if sec is None:
        return None
    out: dict[str, int | float | None] = {}
    for child in sec.children:
        if child.value is None:
            continue
        key = _COUNTER_PREFIX.sub("", child.key)
        out[_COUNTER_NAMES.get(key, key)] = read_num(child.value)
    return out


def _fabric(gpu: Node) -> dict[str, Any] | None:
    sec = find_section(gpu, ("fabric",))
    if sec is None:
        return None
    health = find_section(sec, ("health",))
    return {
        "state": read_text(read_raw(sec, ("state",))),
        "status": read_text(read_raw(sec, ("status",))),
        "clique_id": read_int(read_raw(sec, ("cliqueid",))),
        "cluster_uuid": read_text(read_raw(sec, ("clusteruuid",))),
        "health": (
            None
            if health is None
            else {c.key: read_text(c.value) for c in health.children if c.value is not None}
        ),
    }


def _processes(gpu: Node) -> list[dict[str, Any]] | None:
    sec = find_section(gpu, ("processes",))
    if sec is None:
        return None
    out: list[dict[str, Any]] = []
    if any(c.key == "process_info" for c in sec.children):  # XML
        for info in sec.children:
            if info.key == "process_info":
                out.append(
                    {
                        "pid": read_int(read_raw(info, ("pid",))),
                        "type": read_text(read_raw(info, ("type",))),
                        "name": read_text(read_raw(info, ("process_name",))),
                        "used_memory_mib": read_num(read_raw(info, ("used_memory",))),
                        "gpu_instance_id": read_int(read_raw(info, ("gpu_instance_id",))),
                        "compute_instance_id": read_int(read_raw(info, ("compute_instance_id",))),
                    }
                )
        return out
    pending: dict[str, Any] = {}
    current: dict[str, Any] | None = None
    for c in sec.children:
        if c.key in ("gpu_instance_id", "compute_instance_id"):
            pending[c.key] = read_int(c.value)  # printed before the "Process ID" it belongs to
        elif c.key == "process_id":
            current = {
                "pid": read_int(c.value),
                "type": read_text(read_raw(c, ("type",))),
                "name": read_text(read_raw(c, ("name",))),
                "used_memory_mib": read_num(read_raw(c, ("used_gpu_memory",))),
                "gpu_instance_id": pending.get("gpu_instance_id"),
                "compute_instance_id": pending.get("compute_instance_id"),
            }
            pending = {}
            out.append(current)
        elif current is not None and c.key in ("type", "name", "used_gpu_memory"):
            # older drivers print these as siblings of "Process ID", not under it
            if c.key == "used_gpu_memory":
                current["used_memory_mib"] = read_num(c.value)
            else:
                current[c.key] = read_text(c.value)
    return out


def _gpu(node: Node, index: int, bus_id: str | None) -> dict[str, Any]:
    mig = find_section(node, ("mig_mode",))
    memory = find_section(node, ("fb_memory_usage",))
    util = find_section(node, ("utilization",))
    power = find_section(node, ("gpu_power_readings",), ("power_readings",))
    temp = find_section(node, ("temperature",))
    reset = find_section(node, ("gpu_reset_status",))
    clocks = find_section(node, ("clocks",))
    max_clocks = find_section(node, ("max_clocks",))
    app_clocks = find_section(node, ("applications_clocks",))
    reasons_name, reasons = _clocks_event_reasons(node)
    pci_bus_id = read_text(read_raw(node, ("pci", "bus_id"), ("pci", "pci_bus_id"))) or bus_id
    return {
        "index": index,
        "pci_bus_id": pci_bus_id,
        "name": read_text(read_raw(node, ("product_name",))),
        "brand": read_text(read_raw(node, ("product_brand",))),
        "architecture": read_text(read_raw(node, ("product_architecture",))),
        "serial": read_text(read_raw(node, ("serial_number",), ("serial",))),
        "uuid": read_text(read_raw(node, ("gpu_uuid",), ("uuid",))),
        "minor_number": read_int(read_raw(node, ("minor_number",))),
        "vbios_version": read_text(read_raw(node, ("vbios_version",))),
        "board_part_number": read_text(read_raw(node, ("board_part_number",))),
        "module_id": read_int(
            read_raw(
                node,
                ("module_id",),
                ("platform_info", "module_id"),
                ("platforminfo", "module_id"),
                ("gpu_module_id",),
            )
        ),
        "persistence_mode": read_text(read_raw(node, ("persistence_mode",))),
        "mig_mode": (
            None
            if mig is None
            else {
                "current": read_text(read_raw(mig, ("current",), ("current_mig",))),
                "pending": read_text(read_raw(mig, ("pending",), ("pending_mig",))),
            }
        ),
        "compute_mode": read_text(read_raw(node, ("compute_mode",))),
        "performance_state": read_text(read_raw(node, ("performance_state",))),
        "fan_speed_pct": read_num(read_raw(node, ("fan_speed",))),
        "gpu_recovery_action": read_text(read_raw(node, ("gpu_recovery_action",))),
        "gpu_reset_status": (
            None
            if reset is None
            else {
                "reset_required": read_yes_no(read_raw(reset, ("reset_required",))),
                "drain_and_reset_recommended": read_yes_no(
                    read_raw(reset, ("drain_and_reset_recommended",))
                ),
            }
        ),
        "pcie": _pcie(node),
        "clocks_event_reasons_name": reasons_name,
        "clocks_event_reasons": reasons,
        "clocks_event_counters_us": _clocks_event_counters(node),
        "memory_mib": (
            None
            if memory is None
            else {
                k: read_num(read_raw(memory, (k,))) for k in ("total", "reserved", "used", "free")
            }
        ),
        "utilization_pct": (
            None
            if util is None
            else {
                "gpu": read_num(read_raw(util, ("gpu",), ("gpu_util",))),
                "memory": read_num(read_raw(util, ("memory",), ("memory_util",))),
            }
        ),
        "ecc": _ecc(node),
        "retired_pages": _retired_pages(node),
        "remapped_rows": _remapped_rows(node),
        "temperature": (
            None
            if temp is None
            else {key: read_num(read_raw(temp, *paths)) for key, paths in _TEMPERATURES.items()}
        ),
        "power": (
            None
            if power is None
            else {key: read_num(read_raw(power, *paths)) for key, paths in _POWER.items()}
        ),
        "clocks_mhz": (
            None
            if clocks is None
            else {key: read_num(read_raw(clocks, *paths)) for key, paths in _CLOCKS.items()}
        ),
        "max_clocks_mhz": (
            None
            if max_clocks is None
            else {key: read_num(read_raw(max_clocks, *paths)) for key, paths in _CLOCKS.items()}
        ),
        # the clocks set with `nvidia-smi -ac` (graphics and memory only)
        "applications_clocks_mhz": (
            None
            if app_clocks is None
            else {key: read_num(read_raw(app_clocks, *_CLOCKS[key])) for key in _APP_CLOCKS}
        ),
        "fabric": _fabric(node),
        "processes": _processes(node),
    }


# Where a read failure matters for a health verdict (a problem, not only a flag in data):
# normalised key paths, each matching itself and everything below it.
_HEALTH_PATHS = (
    "product_name",
    "gpu_uuid",
    "uuid",
    "persistence_mode",
    "mig_mode",
    "fb_memory_usage",
    "ecc_mode",
    "ecc_errors",
    "retired_pages",
    "remapped_rows",
    "temperature",
    "power_readings",
    "gpu_power_readings",
    "clocks_event_reasons",
    "clocks_throttle_reasons",
    "fabric",
    "gpu_reset_status",
    "gpu_recovery_action",
    "pci/bus_id",
    "pci/pci_bus_id",
    "pci/gpu_link_info/pcie_generation/current",
    "pci/gpu_link_info/pcie_generation/max",
    "pci/gpu_link_info/link_width",
    "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    "pci/pci_gpu_link_info/link_widths",
    "pci/replays_since_reset",
    "pci/replay_counter",
)


def _any_read_error(gpu: Node) -> bool:
    stack = list(gpu.children)
    while stack:
        node = stack.pop()
        value = node.value
        if value is not None and _is_error_value(value):
            return True
        stack.extend(node.children)
    return False


@lru_cache(maxsize=16384)
def _is_error_value(value: str) -> bool:
    return value.strip().lower() in ERROR_VALUES


def _read_errors(gpu: Node) -> list[tuple[str, str, str]]:
    """(label path, key path, value) of each read failure (``Unknown Error``, ``ERR!``...)."""
    out: list[tuple[str, str, str]] = []
    if not _any_read_error(gpu):  # nearly every GPU: no path strings built
        return out

    def visit(node: Node, labels: str, keys: str) -> None:
        if node.value is not None and node.value.strip().lower() in ERROR_VALUES:
            out.append((labels, keys, node.value.strip()))
        for c in node.children:
            visit(c, f"{labels}/{c.label}", f"{keys}/{c.key}")

    for top in gpu.children:
        visit(top, top.label, top.key)
    return out


def _read_error_problem(errors: list[tuple[str, str, str]], label: str) -> list[str]:
    bad = [
        f"{labels}: {value!r}"
        for labels, keys, value in errors
        if any(keys == p or keys.startswith(p + "/") for p in _HEALTH_PATHS)
    ]
    if not bad:
        return []
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return [f"{label}: read errors: {'; '.join(bad[:3])}{more}"]


def extract(
    top: Node, gpus: list[tuple[Node, str | None]], problems: list[str], *, read_errors: bool = True
) -> dict[str, Any]:
    """The data of ``top`` and its GPU sections; ``read_errors=False``: the caller knows that no
    value in the tree is a read failure (no GPU section is searched for one)."""
    data: dict[str, Any] = {
        "timestamp": read_text(read_raw(top, ("timestamp",))),
        # 610 and later: "KMD Version" and "CUDA UMD Version"; the old labels stay, with a
        # deprecation note after the value (read_text drops it)
        "driver_version": read_text(read_raw(top, ("kmd_version",), ("driver_version",))),
        "cuda_version": read_text(read_raw(top, ("cuda_umd_version",), ("cuda_version",))),
        "attached_gpus": read_int(read_raw(top, ("attached_gpus",))),
        "gpus": [],
    }
    for index, (node, bus_id) in enumerate(gpus):
        gpu = _gpu(node, index, bus_id)
        errors = _read_errors(node) if read_errors else []
        gpu["read_errors"] = [f"{labels}: {value}" for labels, _, value in errors]
        data["gpus"].append(gpu)
        problems += _read_error_problem(errors, f"GPU {index} ({gpu['pci_bus_id'] or 'no bus id'})")
    if not gpus:
        problems.append("no GPU section in the output")
    attached = data["attached_gpus"]
    if attached is not None and attached != len(gpus):
        problems.append(
            f"Attached GPUs says {attached} but {len(gpus)} GPU section(s) are shown"
            " (filtered with -i, elided or truncated)"
        )
    with_procs = [g["processes"] is not None for g in data["gpus"]]
    if any(with_procs) and not all(with_procs):
        cut = [str(g["index"]) for g in data["gpus"] if g["processes"] is None]
        problems.append(
            f"GPU section(s) {', '.join(cut)} end before 'Processes' (output truncated?)"
        )
    return data


# ------------------------------------------------------------------------------------------
# Records: what the judges read (gpuctl.validation.judges.gpus), built from the data above in
# one place. A number the output did not show is None, never 0; a number is kept as it is,
# also one that is not finite (a NaN a parser let through is judged "not a finite number").
# A section that is absent, empty or not a mapping is None.


@dataclass(frozen=True, slots=True)
class EccCounters:
    """One set of ECC error counters (``aggregate`` or ``volatile``)."""

    sram_uncorrectable: int | float | None
    sram_correctable: int | float | None
    dram_correctable: int | float | None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Row remapping: True/False as shown (any other value shown is False), None: not shown."""

    pending: bool | None
    failure: bool | None


@dataclass(frozen=True, slots=True)
class PcieLink:
    width_current: int | float | None
    width_max: int | float | None
    gen_max: int | float | None


@dataclass(frozen=True, slots=True)
class Fabric:
    """NVSwitch fabric registration (Hopper and later)."""

    state: str | None
    status: str | None


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU of ``smi-q``/``smi-xml`` data."""

    index: int | None
    uuid: str | None
    pci_bus_id: str | None
    minor_number: int | str | None  # text: what stood where the number belongs
    name: str | None
    persistence_mode: str | None
    ecc_aggregate: EccCounters | None
    ecc_volatile: EccCounters | None
    remapped_rows: RemappedRows | None
    pcie: PcieLink | None
    clocks_active: tuple[str, ...]  # clock event reasons shown Active, in output order
    fabric: Fabric | None
    # the settings the golden-config comparison reads (judges/consistency.py)
    vbios_version: str | None = None
    ecc_mode: str | None = None  # ECC Mode, Current ("Enabled")
    mig_mode: str | None = None  # MIG Mode, Current ("Disabled")
    power_limit_w: int | float | None = None  # the enforced power limit
    applications_clocks_mhz: tuple[int | float | None, int | float | None] | None = None
    # the burn level's reads (judges/burn.py): microseconds per clock event reason (None: the
    # driver prints no counters), the temperature at which the GPU slows itself down
    clocks_event_counters_us: Mapping[str, int | float | None] | None = None
    slowdown_c: int | float | None = None

    @property
    def subject(self) -> str:
        return f"GPU{self.index}"

    def ids(self) -> dict[str, Any]:
        """What tells two GPUs apart, by the data's keys (for :func:`plausible.first_seen`)."""
        return {
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "minor_number": self.minor_number,
            "index": self.index,
        }


@dataclass(frozen=True, slots=True)
class SmiRecord:
    """``smi-q``/``smi-xml`` data as the judges read it: the driver and every GPU listed."""

    driver_version: str | None
    gpus: tuple[GpuRecord, ...]
    cuda_version: str | None = None  # the driver's CUDA API version ("12.7")


def _number(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def _ident(value: Any) -> str | None:
    """An identifier as text; a flag is no identifier."""
    return None if isinstance(value, bool) else _text(value)


def _flag(value: Any) -> bool | None:
    return None if value is None else value is True


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = data.get(key)
    return value if isinstance(value, Mapping) and value else None


def _counters(ecc: Mapping[str, Any] | None, key: str) -> EccCounters | None:
    sec = None if ecc is None else _section(ecc, key)
    if sec is None:
        return None
    return EccCounters(
        _number(sec.get("sram_uncorrectable")),
        _number(sec.get("sram_correctable")),
        _number(sec.get("dram_correctable")),
    )


def _gpu_record(gpu: Mapping[str, Any], position: int) -> GpuRecord:
    ecc, remap = _section(gpu, "ecc"), _section(gpu, "remapped_rows")
    pcie, fabric = _section(gpu, "pcie"), _section(gpu, "fabric")
    mig, power = _section(gpu, "mig_mode"), _section(gpu, "power")
    clocks = _section(gpu, "applications_clocks_mhz")
    reasons = _section(gpu, "clocks_event_reasons") or {}
    counters, temperature = _section(gpu, "clocks_event_counters_us"), _section(gpu, "temperature")
    minor = gpu.get("minor_number")
    return GpuRecord(
        index=_whole(gpu.get("index", position)),
        uuid=_ident(gpu.get("uuid")),
        pci_bus_id=_ident(gpu.get("pci_bus_id")),
        minor_number=_whole(minor) if isinstance(minor, int) else _ident(minor),
        name=_text(gpu.get("name")),
        persistence_mode=_text(gpu.get("persistence_mode")),
        ecc_aggregate=_counters(ecc, "aggregate"),
        ecc_volatile=_counters(ecc, "volatile"),
        remapped_rows=(
            None
            if remap is None
            else RemappedRows(_flag(remap.get("pending")), _flag(remap.get("failure")))
        ),
        pcie=(
            None
            if pcie is None
            else PcieLink(
                _number(pcie.get("width_current")),
                _number(pcie.get("width_max")),
                _number(pcie.get("gen_max")),
            )
        ),
        clocks_active=tuple(str(k) for k, v in reasons.items() if v is True),
        fabric=(
            None
            if fabric is None
            else Fabric(_text(fabric.get("state")), _text(fabric.get("status")))
        ),
        vbios_version=_text(gpu.get("vbios_version")),
        ecc_mode=None if ecc is None else _text(ecc.get("mode_current")),
        mig_mode=None if mig is None else _text(mig.get("current")),
        power_limit_w=None if power is None else _number(power.get("limit_w")),
        applications_clocks_mhz=(
            None
            if clocks is None
            else (_number(clocks.get("graphics")), _number(clocks.get("memory")))
        ),
        clocks_event_counters_us=(
            None if counters is None else {str(k): _number(v) for k, v in counters.items()}
        ),
        slowdown_c=None if temperature is None else _number(temperature.get("slowdown_c")),
    )


def smi_of(data: Mapping[str, Any]) -> SmiRecord:
    """The record of ``smi-q``/``smi-xml`` data (:func:`extract`'s shape)."""
    gpus = data.get("gpus")
    listed = gpus if isinstance(gpus, list | tuple) else []
    return SmiRecord(
        driver_version=_text(data.get("driver_version")),
        cuda_version=_text(data.get("cuda_version")),
        gpus=tuple(_gpu_record(gpu, i) for i, gpu in enumerate(listed) if isinstance(gpu, Mapping)),
    )

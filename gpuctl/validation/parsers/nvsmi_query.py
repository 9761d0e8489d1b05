"""``nvidia-smi`` structured outputs: ``-q`` text, ``-q -x`` XML and ``--query-gpu`` CSV.

Three kinds (documented in docs/parse.md):

- ``smi-q``: the text of ``nvidia-smi -q`` / ``-a``, also filtered (``-q -d ECC,...``) and
  fragments of it (one section pasted without its GPU header).
- ``smi-xml``: ``nvidia-smi -q -x``, the same facts as XML; same data shape as ``smi-q``.
- ``smi-csv``: ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

``smi-q`` and ``smi-xml`` are both read into one tree of ``_Node`` (key normalised to
``snake_case``; XML tag names mostly equal the normalised text labels), then one extractor pulls
the documented keys out of either tree, naming each alternative spelling of a field.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gpuctl.validation.numbers import looks_numeric, number
from gpuctl.validation.parsing import ParseResult, clean, parser, unrecognised

KIND_Q = "smi-q"
KIND_XML = "smi-xml"
KIND_CSV = "smi-csv"

# Values nvidia-smi prints when it has nothing to show: they become None.
_PLACEHOLDERS = frozenset(
    {
        "n/a",
        "[n/a]",
        "not supported",
        "[not supported]",
        "requested functionality has been deprecated",
        "[requested functionality has been deprecated]",
        "insufficient permissions",
        "[insufficient permissions]",
        "not available",
        "[not available]",
    }
)
# Values that say the read failed: None in data, listed in the GPU's read_errors, and a problem
# where the field matters for health (see _HEALTH_PATHS).
_ERROR_VALUES = frozenset(
    {
        "unknown error",
        "[unknown error]",
        "err!",
        "[err!]",
        "gpu is lost",
        "[gpu is lost]",
        "gpu requires reset",
        "[gpu requires reset]",
    }
)
_ERROR_BANNERS = (
    re.compile(r"NVIDIA-SMI has failed", re.IGNORECASE),
    re.compile(r"No devices were found", re.IGNORECASE),
    re.compile(r"Failed to initialize NVML", re.IGNORECASE),
    re.compile(r"Unable to determine the device handle", re.IGNORECASE),
    re.compile(r"couldn't communicate with the NVIDIA driver", re.IGNORECASE),
    re.compile(r"^Field \".*\" is not a valid field to query", re.IGNORECASE),
    re.compile(r"^Invalid combination of input arguments", re.IGNORECASE),
)
_NUM_UNIT = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%/()]*)")


# Real -q / -q -x output nests 6 levels deep; deeper input is refused line by line (it would
# otherwise recurse without bound). Over-long numbers are refused by gpuctl.validation.numbers.
_MAX_DEPTH = 24


_ANY_ERROR_BANNER = re.compile("|".join(f"(?:{p.pattern})" for p in _ERROR_BANNERS), re.IGNORECASE)


_BANNER_WORDS = (
    "failed",
    "no devices",
    "unable to determine",
    "communicate",
    "not a valid field",
    "invalid combination",
)


def _may_have_banner(text: str) -> bool:
    """Cheap whole-text test before the per-line search (most outputs have no banner)."""
    low = text.lower()
    return any(word in low for word in _BANNER_WORDS)


def _is_error_banner(line: str) -> bool:
    return _ANY_ERROR_BANNER.search(line) is not None  # one pass instead of one per banner


# ------------------------------------------------------------------------------------------
# The tree both smi-q and smi-xml are read into


@dataclass(slots=True)
class _Node:
    key: str  # normalised: lower case, runs of other characters -> "_"
    label: str  # as printed (text label or XML tag)
    value: str | None  # stripped; None for a section header
    children: list[_Node] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)

    def child(self, key: str) -> _Node | None:
        for c in self.children:
            if c.key == key:
                return c
        return None

    def find(self, path: Sequence[str]) -> _Node | None:
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            node = node.child(key)
        return node

    def walk(self) -> Iterable[tuple[str, _Node]]:
        """Every descendant with its path of labels ("ECC Errors/Volatile/...")."""
        for c in self.children:
            yield c.label, c
            for sub, node in c.walk():
                yield f"{c.label}/{sub}", node


_NON_ALNUM = re.compile(r"[^a-z0-9]+")


@lru_cache(maxsize=4096)
def _norm(label: str) -> str:
    return _NON_ALNUM.sub("_", label.strip().lower()).strip("_")


Path = tuple[str, ...]


def _raw(node: _Node | None, *paths: Path) -> str | None:
    """The value of the first path that exists with a value (as printed), else None."""
    if node is None:
        return None
    for path in paths:
        hit = node.find(path)
        if hit is not None and hit.value is not None:
            return hit.value
    return None


def _section(node: _Node | None, *paths: Path) -> _Node | None:
    if node is None:
        return None
    for path in paths:
        hit = node.find(path)
        if hit is not None:
            return hit
    return None


def _placeholder(value: str | None) -> bool:
    if value is None:
        return True
    low = value.strip().lower()
    return low == "" or low in _PLACEHOLDERS or low in _ERROR_VALUES


def _text(value: str | None) -> str | None:
    return None if _placeholder(value) else (value or "").strip()


def _num(value: str | None) -> int | float | None:
    """``"143771 MiB"`` -> 143771, ``"16x"`` -> 16, ``"-8 C"`` -> -8; placeholders -> None."""
    if _placeholder(value):
        return None
    m = _NUM_UNIT.fullmatch((value or "").strip())
    return number(m.group(1)) if m else None


def _int(value: str | None) -> int | None:
    n = _num(value)
    return n if isinstance(n, int) else None


def _yes_no(value: str | None) -> bool | None:
    low = (value or "").strip().lower()
    if low in ("yes", "true", "enabled"):
        return True
    if low in ("no", "false", "disabled"):
        return False
    return None


def _active(value: str | None) -> bool | None:
    low = (value or "").strip().lower()
    if low == "active":
        return True
    if low == "not active":
        return False
    return None


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
    "tlimit_c": (("gpu_t_limit_temp",), ("gpu_temp_tlimit",)),
    "shutdown_c": (("gpu_shutdown_temp",), ("gpu_temp_max_threshold",)),
    "slowdown_c": (("gpu_slowdown_temp",), ("gpu_temp_slow_threshold",)),
    "max_operating_c": (("gpu_max_operating_temp",), ("gpu_temp_max_gpu_threshold",)),
    "shutdown_tlimit_c": (("gpu_shutdown_t_limit_temp",), ("gpu_temp_max_tlimit_threshold",)),
    "slowdown_tlimit_c": (("gpu_slowdown_t_limit_temp",), ("gpu_temp_slow_tlimit_threshold",)),
    "max_operating_tlimit_c": (
        ("gpu_max_operating_t_limit_temp",),
        ("gpu_temp_max_gpu_tlimit_threshold",),
    ),
    "target_c": (("gpu_target_temperature",),),
    "memory_c": (("memory_current_temp",), ("memory_temp",)),
    "memory_max_operating_c": (("memory_max_operating_temp",), ("gpu_temp_max_mem_threshold",)),
    "memory_max_operating_tlimit_c": (
        ("memory_max_operating_t_limit_temp",),
        ("gpu_temp_max_mem_tlimit_threshold",),
    ),
}
_POWER: dict[str, tuple[Path, ...]] = {
    "draw_w": (("power_draw",), ("average_power_draw",)),
    "average_draw_w": (("average_power_draw",),),
    "instant_draw_w": (("instantaneous_power_draw",), ("instant_power_draw",)),
    "limit_w": (("current_power_limit",), ("enforced_power_limit",), ("power_limit",)),
    "requested_limit_w": (("requested_power_limit",), ("power_limit",)),
    "default_limit_w": (("default_power_limit",),),
    "min_limit_w": (("min_power_limit",),),
    "max_limit_w": (("max_power_limit",),),
}
_CLOCKS: dict[str, tuple[Path, ...]] = {
    "graphics": (("graphics",), ("graphics_clock",)),
    "sm": (("sm",), ("sm_clock",)),
    "memory": (("memory",), ("mem_clock",)),
    "video": (("video",), ("video_clock",)),
}


def _ecc_counters(node: _Node | None) -> dict[str, Any] | None:
    if node is None:
        return None
    out: dict[str, Any] = {key: _int(_raw(node, *paths)) for key, paths in _ECC_COUNTERS.items()}
    if out["sram_uncorrectable"] is None:
        parity, secded = out["sram_uncorrectable_parity"], out["sram_uncorrectable_secded"]
        if parity is not None and secded is not None:
            out["sram_uncorrectable"] = parity + secded  # newer drivers print the two parts
    threshold = _raw(node, ("sram_threshold_exceeded",))
    out["sram_threshold_exceeded"] = None if threshold is None else _yes_no(threshold)
    for bits in ("single_bit", "double_bit"):
        sec = node.child(bits)
        out[bits] = (
            None
            if sec is None
            else {loc: _int(_raw(sec, (loc,))) for loc in _OLD_ECC_LOCATIONS if sec.child(loc)}
        )
    return out


def _ecc(gpu: _Node) -> dict[str, Any] | None:
    mode = _section(gpu, ("ecc_mode",))
    errors = _section(gpu, ("ecc_errors",))
    if mode is None and errors is None:
        return None
    sources = _section(errors, ("aggregate_uncorrectable_sram_sources",))
    return {
        "mode_current": _text(_raw(mode, ("current",), ("current_ecc",))),
        "mode_pending": _text(_raw(mode, ("pending",), ("pending_ecc",))),
        "volatile": _ecc_counters(_section(errors, ("volatile",))),
        "aggregate": _ecc_counters(_section(errors, ("aggregate",))),
        "aggregate_uncorrectable_sram_sources": (
            None if sources is None else {k[5:]: _int(_raw(sources, (k,))) for k in _SRAM_SOURCES}
        ),
        "channel_repair_pending": _yes_no(_raw(errors, ("channel_repair_pending",))),
        "tpc_repair_pending": _yes_no(_raw(errors, ("tpc_repair_pending",))),
        "unrepairable_memory": _yes_no(_raw(errors, ("unrepairable_memory",))),
    }


def _retired_pages(gpu: _Node) -> dict[str, Any] | None:
    sec = _section(gpu, ("retired_pages",))
    if sec is None:
        return None
    pending = _raw(
        sec,
        ("pending_page_blacklist",),
        ("pending_page_retirement",),
        ("pending",),
        ("pending_blacklist",),
        ("pending_retirement",),
    )
    return {
        "single_bit_ecc": _int(
            _raw(sec, ("single_bit_ecc",), ("multiple_single_bit_retirement", "retired_count"))
        ),
        "double_bit_ecc": _int(
            _raw(sec, ("double_bit_ecc",), ("double_bit_retirement", "retired_count"))
        ),
        "pending": _yes_no(pending),
    }


def _remapped_rows(gpu: _Node) -> dict[str, Any] | None:
    sec = _section(gpu, ("remapped_rows",))
    if sec is None or not sec.children:  # absent, or "N/A" (not supported / MIG enabled)
        return None
    hist = _section(sec, ("bank_remap_availability_histogram",), ("row_remapper_histogram",))
    histogram = None
    if hist is not None:
        histogram = {
            level: _int(_raw(hist, (level,), (f"row_remapper_histogram_{level}",)))
            for level in ("max", "high", "partial", "low", "none")
        }
    return {
        "correctable": _int(_raw(sec, ("correctable_error",), ("remapped_row_corr",))),
        "uncorrectable": _int(_raw(sec, ("uncorrectable_error",), ("remapped_row_unc",))),
        "pending": _yes_no(_raw(sec, ("pending",), ("remapped_row_pending",))),
        "failure": _yes_no(_raw(sec, ("remapping_failure_occurred",), ("remapped_row_failure",))),
        "histogram": histogram,
    }


def _pcie(gpu: _Node) -> dict[str, Any] | None:
    pci = _section(gpu, ("pci",))
    if pci is None:
        return None
    gen = _section(pci, ("gpu_link_info", "pcie_generation"), ("pci_gpu_link_info", "pcie_gen"))
    width = _section(pci, ("gpu_link_info", "link_width"), ("pci_gpu_link_info", "link_widths"))
    return {
        "gen_current": _int(_raw(gen, ("current",), ("current_link_gen",))),
        "gen_max": _int(_raw(gen, ("max",), ("max_link_gen",))),
        "gen_device_current": _int(_raw(gen, ("device_current",), ("device_current_link_gen",))),
        "gen_device_max": _int(_raw(gen, ("device_max",), ("max_device_link_gen",))),
        "gen_host_max": _int(_raw(gen, ("host_max",), ("max_host_link_gen",))),
        "width_current": _int(_raw(width, ("current",), ("current_link_width",))),
        "width_max": _int(_raw(width, ("max",), ("max_link_width",))),
        "replays_since_reset": _int(_raw(pci, ("replays_since_reset",), ("replay_counter",))),
        "replay_rollovers": _int(
            _raw(pci, ("replay_number_rollovers",), ("replay_rollover_counter",))
        ),
        "tx_kb_s": _num(_raw(pci, ("tx_throughput",), ("tx_util",))),
        "rx_kb_s": _num(_raw(pci, ("rx_throughput",), ("rx_util",))),
        "device_id": _text(_raw(pci, ("device_id",), ("pci_device_id",))),
    }


def _clocks_event_reasons(gpu: _Node) -> tuple[str | None, dict[str, bool | None] | None]:
    sec = _section(gpu, ("clocks_event_reasons",), ("clocks_throttle_reasons",))
    if sec is None:
        return None, None
    out: dict[str, bool | None] = {}
    for _, node in sec.walk():
        if node.value is None:
            continue
        key = re.sub(r"^clocks_(?:event|throttle)_reason_", "", node.key)
        out[_REASON_NAMES.get(key, key)] = _active(node.value)
    # which name the driver used: "Clocks Throttle Reasons" (older), "Clocks Event Reasons"
    name = "Clocks Throttle Reasons" if "throttle" in sec.key else "Clocks Event Reasons"
    return name, out


def _fabric(gpu: _Node) -> dict[str, Any] | None:
    sec = _section(gpu, ("fabric",))
    if sec is None:
        return None
    health = _section(sec, ("health",))
    return {
        "state": _text(_raw(sec, ("state",))),
        "status": _text(_raw(sec, ("status",))),
        "clique_id": _int(_raw(sec, ("cliqueid",))),
        "cluster_uuid": _text(_raw(sec, ("clusteruuid",))),
        "health": (
            None
            if health is None
            else {c.key: _text(c.value) for c in health.children if c.value is not None}
        ),
    }


def _processes(gpu: _Node) -> list[dict[str, Any]] | None:
    sec = _section(gpu, ("processes",))
    if sec is None:
        return None
    out: list[dict[str, Any]] = []
    if any(c.key == "process_info" for c in sec.children):  # XML
        for info in sec.children:
            if info.key == "process_info":
                out.append(
                    {
                        "pid": _int(_raw(info, ("pid",))),
                        "type": _text(_raw(info, ("type",))),
                        "name": _text(_raw(info, ("process_name",))),
                        "used_memory_mib": _num(_raw(info, ("used_memory",))),
                        "gpu_instance_id": _int(_raw(info, ("gpu_instance_id",))),
                        "compute_instance_id": _int(_raw(info, ("compute_instance_id",))),
                    }
                )
        return out
    pending: dict[str, Any] = {}
    current: dict[str, Any] | None = None
    for c in sec.children:
        if c.key in ("gpu_instance_id", "compute_instance_id"):
            pending[c.key] = _int(c.value)  # printed before the "Process ID" it belongs to
        elif c.key == "process_id":
            current = {
                "pid": _int(c.value),
                "type": _text(_raw(c, ("type",))),
                "name": _text(_raw(c, ("name",))),
                "used_memory_mib": _num(_raw(c, ("used_gpu_memory",))),
                "gpu_instance_id": pending.get("gpu_instance_id"),
                "compute_instance_id": pending.get("compute_instance_id"),
            }
            pending = {}
            out.append(current)
        elif current is not None and c.key in ("type", "name", "used_gpu_memory"):
            # older drivers print these as siblings of "Process ID", not under it
            if c.key == "used_gpu_memory":
                current["used_memory_mib"] = _num(c.value)
            else:
                current[c.key] = _text(c.value)
    return out


def _gpu(node: _Node, index: int, bus_id: str | None) -> dict[str, Any]:
    mig = _section(node, ("mig_mode",))
    memory = _section(node, ("fb_memory_usage",))
    util = _section(node, ("utilization",))
    power = _section(node, ("gpu_power_readings",), ("power_readings",))
    temp = _section(node, ("temperature",))
    reset = _section(node, ("gpu_reset_status",))
    clocks = _section(node, ("clocks",))
    max_clocks = _section(node, ("max_clocks",))
    reasons_name, reasons = _clocks_event_reasons(node)
    pci_bus_id = _text(_raw(node, ("pci", "bus_id"), ("pci", "pci_bus_id"))) or bus_id
    return {
        "index": index,
        "pci_bus_id": pci_bus_id,
        "name": _text(_raw(node, ("product_name",))),
        "brand": _text(_raw(node, ("product_brand",))),
        "architecture": _text(_raw(node, ("product_architecture",))),
        "serial": _text(_raw(node, ("serial_number",), ("serial",))),
        "uuid": _text(_raw(node, ("gpu_uuid",), ("uuid",))),
        "minor_number": _int(_raw(node, ("minor_number",))),
        "vbios_version": _text(_raw(node, ("vbios_version",))),
        "board_part_number": _text(_raw(node, ("board_part_number",))),
        "module_id": _int(
            _raw(
                node,
                ("module_id",),
                ("platform_info", "module_id"),
                ("platforminfo", "module_id"),
                ("gpu_module_id",),
            )
        ),
        "persistence_mode": _text(_raw(node, ("persistence_mode",))),
        "mig_mode": (
            None
            if mig is None
            else {
                "current": _text(_raw(mig, ("current",), ("current_mig",))),
                "pending": _text(_raw(mig, ("pending",), ("pending_mig",))),
            }
        ),
        "compute_mode": _text(_raw(node, ("compute_mode",))),
        "performance_state": _text(_raw(node, ("performance_state",))),
        "fan_speed_pct": _num(_raw(node, ("fan_speed",))),
        "gpu_recovery_action": _text(_raw(node, ("gpu_recovery_action",))),
        "gpu_reset_status": (
            None
            if reset is None
            else {
                "reset_required": _yes_no(_raw(reset, ("reset_required",))),
                "drain_and_reset_recommended": _yes_no(
                    _raw(reset, ("drain_and_reset_recommended",))
                ),
            }
        ),
        "pcie": _pcie(node),
        "clocks_event_reasons_name": reasons_name,
        "clocks_event_reasons": reasons,
        "memory_mib": (
            None
            if memory is None
            else {k: _num(_raw(memory, (k,))) for k in ("total", "reserved", "used", "free")}
        ),
        "utilization_pct": (
            None
            if util is None
            else {
                "gpu": _num(_raw(util, ("gpu",), ("gpu_util",))),
                "memory": _num(_raw(util, ("memory",), ("memory_util",))),
            }
        ),
        "ecc": _ecc(node),
        "retired_pages": _retired_pages(node),
        "remapped_rows": _remapped_rows(node),
        "temperature": (
            None
            if temp is None
            else {key: _num(_raw(temp, *paths)) for key, paths in _TEMPERATURES.items()}
        ),
        "power": (
            None
            if power is None
            else {key: _num(_raw(power, *paths)) for key, paths in _POWER.items()}
        ),
        "clocks_mhz": (
            None
            if clocks is None
            else {key: _num(_raw(clocks, *paths)) for key, paths in _CLOCKS.items()}
        ),
        "max_clocks_mhz": (
            None
            if max_clocks is None
            else {key: _num(_raw(max_clocks, *paths)) for key, paths in _CLOCKS.items()}
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


def _read_errors(gpu: _Node) -> list[tuple[str, str, str]]:
    """(label path, key path, value) of each read failure (``Unknown Error``, ``ERR!``...)."""
    out: list[tuple[str, str, str]] = []

    def visit(node: _Node, labels: str, keys: str) -> None:
        if node.value is not None and node.value.strip().lower() in _ERROR_VALUES:
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


def _extract(
    top: _Node, gpus: list[tuple[_Node, str | None]], problems: list[str]
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "timestamp": _text(_raw(top, ("timestamp",))),
        "driver_version": _text(_raw(top, ("driver_version",))),
        "cuda_version": _text(_raw(top, ("cuda_version",))),
        "attached_gpus": _int(_raw(top, ("attached_gpus",))),
        "gpus": [],
    }
    for index, (node, bus_id) in enumerate(gpus):
        gpu = _gpu(node, index, bus_id)
        errors = _read_errors(node)
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
# smi-q: the text form

_KV = re.compile(r"(\S.*?)\s+:(?:\s(.*))?")
_GPU_HEADER = re.compile(r"GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_BANNER = re.compile(r"=+\s*NVSMI LOG\s*=+")
# What a -q label looks like ("GPU T.Limit Temp", "Clocks Event Reasons", "SRAM Uncorrectable
# SEC-DED", "Bank Remap Availability Histogram"): no table characters such as "|" or "+---".
_LABEL = re.compile(r"[A-Za-z][A-Za-z0-9 ._()/-]*")
_ELISION = re.compile(r"\[?(?:\.\.\.|…)\]?")
_TOP_KEYS = frozenset({"timestamp", "driver_version", "cuda_version", "attached_gpus"})
# Section/field names that identify a fragment of one GPU's -q section.
_GPU_KEYS = frozenset(
    {
        "product_name",
        "product_brand",
        "gpu_uuid",
        "serial_number",
        "persistence_mode",
        "mig_mode",
        "pci",
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
        "processes",
    }
)


@lru_cache(maxsize=8192)
def _is_label(text: str) -> bool:
    return _LABEL.fullmatch(text) is not None  # labels repeat for every GPU and every node


@lru_cache(maxsize=8192)
def _is_section(text: str) -> bool:
    return _GPU_HEADER.fullmatch(text) is not None or _LABEL.fullmatch(text) is not None


def _split_kv(stripped: str) -> tuple[str, str] | None:
    """``Label   : value`` -> (label, value); what ``_KV`` matches, without the regex for the
    common case (a space before the colon, then a space or the end of the line)."""
    at = stripped.find(" :")
    if at > 0:
        after = stripped[at + 2 : at + 3]
        if after in ("", " ") and not stripped[:at].rstrip().endswith(("\t",)):
            head = stripped[:at].rstrip()
            if "\t" not in head and head[:1].strip():
                return head, stripped[at + 2 :].strip()
    m = _KV.fullmatch(stripped)
    if m is None:
        return None
    return m.group(1).strip(), (m.group(2) or "").strip()


_ELIDED = ("", "", None)


@lru_cache(maxsize=65536)
def _classify_line(stripped: str) -> tuple[str, str, str | None] | None:
    """(key, label, value) of a -q line, ``_ELIDED`` for an elision mark, None when it is not
    a -q line. Cached: the lines of one GPU repeat for every GPU (and across a fleet)."""
    if stripped[0] in "[.…" and _ELISION.fullmatch(stripped):
        return _ELIDED
    kv = _split_kv(stripped)
    if kv is not None and _is_label(kv[0]):
        label, value = kv
        key = _norm(label)
    elif _is_section(stripped):
        label, value, key = stripped, None, _norm(stripped)
    else:
        return None
    return (key, label, value) if key else None


def _text_tree(lines: list[str]) -> tuple[_Node, int, int]:
    """Indentation -> tree. Returns (root, elided line count, lines not understood)."""
    root = _Node("", "", None)
    stack: list[tuple[int, _Node]] = []
    elided = odd = 0
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        width = len(line) - len(line.lstrip(" \t"))
        indent = len(line[:width].expandtabs(4)) if "\t" in line[:width] else width
        kind = _classify_line(stripped)
        if kind is None:  # table borders, prose, anything that is not a -q line
            odd += 1
            continue
        if kind is _ELIDED:
            elided += 1
            continue
        node = _Node(*kind)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if len(stack) >= _MAX_DEPTH:
            odd += 1
            continue
        parent = stack[-1][1] if stack else root
        parent.children.append(node)
        stack.append((indent, node))
    return root, elided, odd


@parser(
    KIND_Q,
    description="nvidia-smi -q / -a text (also -q -d ECC,PAGE_RETIREMENT,... and fragments)",
    command=("nvidia-smi", "-q"),
)
def parse_smi_q(text: str) -> ParseResult:
    lines = clean(text).split("\n")
    if not any(line.strip() for line in lines):
        return unrecognised(KIND_Q, "empty input")
    if any(line.lstrip().startswith("<") and "nvidia_smi_log" in line for line in lines[:5]):
        return unrecognised(KIND_Q, "this is the XML form (nvidia-smi -q -x): parse as smi-xml")
    problems: list[str] = []
    flags = [_is_error_banner(line) for line in lines] if _may_have_banner(text) else []
    banners = [line.strip() for line, bad in zip(lines, flags, strict=False) if bad]
    body = [line for line, bad in zip(lines, flags, strict=False) if not bad] if banners else lines
    has_banner = any(_BANNER.fullmatch(line.strip()) for line in body)
    body = [line for line in body if not _BANNER.fullmatch(line.strip())]
    warnings = [line.strip() for line in body if line.strip().upper().startswith("WARNING")]
    body = [line for line in body if not line.strip().upper().startswith("WARNING")]
    root, elided, odd = _text_tree(body)

    gpus: list[tuple[_Node, str | None]] = []
    loose: list[_Node] = []
    for node in root.children:
        header = _GPU_HEADER.fullmatch(node.label) if node.value is None else None
        if header:
            gpus.append((node, header.group(1)))
        elif node.key not in _TOP_KEYS:
            loose.append(node)
    fragment = not gpus and any(n.key in _GPU_KEYS for n in loose)
    top_seen = [n.key for n in root.children if n.key in _TOP_KEYS]
    if not (has_banner or gpus or fragment or top_seen):
        reason = "not nvidia-smi -q output (no NVSMI LOG banner, no 'GPU <bus id>' section)"
        return unrecognised(KIND_Q, f"{reason}: {banners[0]}" if banners else reason)
    if fragment:
        gpus = [(_Node("gpu", "GPU", None, loose), None)]
        problems.append("fragment: no 'GPU <bus id>' line, read as one GPU's section(s)")
    elif loose:
        labels = ", ".join(repr(n.label) for n in loose[:3])
        problems.append(f"{len(loose)} line(s) outside any GPU section not understood: {labels}")
    missing = [
        label
        for key, label in (
            ("driver_version", "Driver Version"),
            ("cuda_version", "CUDA Version"),
            ("attached_gpus", "Attached GPUs"),
        )
        if key not in top_seen
    ]
    if missing:
        problems.append(f"header line(s) missing: {', '.join(missing)}")
    if elided:
        problems.append(f"output elided: {elided} '[...]' line(s), sections may be missing")
    if odd:
        problems.append(f"{odd} line(s) not understood")
    problems += [f"error message in output: {b}" for b in banners]
    problems += [f"warning in output: {w}" for w in warnings]
    data = _extract(root, gpus, problems)
    data["warnings"] = warnings
    return ParseResult(KIND_Q, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# smi-xml

# The one DOCTYPE nvidia-smi prints: an external DTD by file name, never read, no internal subset.
_DOCTYPE_OK = re.compile(
    r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"nvsmi_device(?:_v\d+)?\.dtd\"\s*>"
)
_DECL = re.compile(r"<\?xml[^>]*\?>")


def _depth(root: ET.Element) -> int:
    deepest, todo = 0, [(root, 0)]
    while todo:
        elem, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((c, depth + 1) for c in elem)
    return deepest


def _xml_node(elem: ET.Element, depth: int = 0) -> _Node:
    children = [_xml_node(c, depth + 1) for c in elem] if depth < _MAX_DEPTH else []
    value = None if children else (elem.text or "").strip()
    tag = elem.tag if isinstance(elem.tag, str) else ""
    return _Node(tag.lower(), tag, value, children, dict(elem.attrib))


@parser(
    KIND_XML,
    description="nvidia-smi -q -x (XML); same data as smi-q",
    command=("nvidia-smi", "-q", "-x"),
)
def parse_smi_xml(text: str) -> ParseResult:
    body = clean(text)
    if not body.strip():
        return unrecognised(KIND_XML, "empty input")
    problems: list[str] = []
    if re.search(r"<!ENTITY", body, re.IGNORECASE):
        return unrecognised(KIND_XML, "refused: the XML declares entities (<!ENTITY>)")
    doctypes = list(re.finditer(r"<!DOCTYPE", body, re.IGNORECASE))
    if doctypes:
        ok = _DOCTYPE_OK.search(body)
        if len(doctypes) > 1 or ok is None or ok.start() != doctypes[0].start():
            return unrecognised(
                KIND_XML, "refused: DOCTYPE other than nvidia-smi's external nvsmi_device DTD"
            )
        body = body[: ok.start()] + body[ok.end() :]  # the DTD is never read
    start = body.find("<nvidia_smi_log")
    if start < 0:
        reason = "no <nvidia_smi_log> element: not nvidia-smi -q -x output"
        banners = [ln.strip() for ln in body.split("\n") if _is_error_banner(ln)]
        return unrecognised(KIND_XML, f"{reason}: {banners[0]}" if banners else reason)
    before = _DECL.sub("", body[:start]).strip()
    if before:
        problems.append(f"text before the XML document ignored: {before.splitlines()[0][:80]!r}")
    # No DTD is read and no entity can be declared (refused above): expat sees plain XML.
    pull: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start",))
    pull.feed(body[start:])
    try:
        pull.close()
    except ET.ParseError as exc:  # truncated or damaged: keep what was read before
        problems.append(f"XML not well-formed ({exc}): parsed what came before")
    root: ET.Element | None = None
    try:
        for event in pull.read_events():
            elem = event[1] if isinstance(event, tuple) and len(event) == 2 else None
            if isinstance(elem, ET.Element):
                root = elem
                break
    except ET.ParseError:
        pass  # the same error close() reported; the elements started before it are kept
    if root is None or root.tag != "nvidia_smi_log":
        return unrecognised(KIND_XML, "no <nvidia_smi_log> root element could be read")
    if _depth(root) > _MAX_DEPTH:
        problems.append(f"XML nested deeper than {_MAX_DEPTH} levels: the deeper elements ignored")
    top = _xml_node(root)
    gpus = [(n, n.attrs.get("id")) for n in top.children if n.key == "gpu"]
    if not any(c.key in _TOP_KEYS for c in top.children):
        problems.append("no <driver_version>/<attached_gpus> in <nvidia_smi_log>")
    data = _extract(top, gpus, problems)
    data["warnings"] = []
    return ParseResult(KIND_XML, True, data, tuple(problems))


# ------------------------------------------------------------------------------------------
# smi-csv

_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:\s*\[([^\]]*)\])?")
# Query fields whose values are identifiers or versions: kept as strings, never numbers.
_TEXT_FIELDS = re.compile(
    r"(^|\.)(name|serial|uuid|timestamp|hostname|driver_version|vbios_version|compute_cap)$"
    r"|^(pci|inforom|gpu_name|gpu_bus_id|gpu_serial|gpu_uuid)(\.|$)|guid|uuid|serial|version",
    re.IGNORECASE,
)
_DOTLESS_FIELDS = frozenset(
    {"timestamp", "count", "name", "serial", "uuid", "index", "pstate", "hostname"}
)


def _field_name(cell: str) -> tuple[str, str | None] | None:
    m = _FIELD.fullmatch(cell.strip())
    return (m.group(1), m.group(2)) if m else None


def _looks_like_header(cells: list[str]) -> bool:
    names = [_field_name(c) for c in cells]
    if not names or any(n is None for n in names):
        return False
    return any(
        n is not None and ("." in n[0] or "_" in n[0] or n[0].lower() in _DOTLESS_FIELDS)
        for n in names
    )


def _csv_value(name: str, unit: str | None, cell: str | None) -> tuple[Any, bool]:
    """(value, read_error) for one cell."""
    if cell is None:
        return None, False
    low = cell.strip().lower()
    if low in _ERROR_VALUES:
        return None, True
    if low == "" or low in _PLACEHOLDERS or (low.startswith("[") and low.endswith("]")):
        return None, False
    if _TEXT_FIELDS.search(name):
        return cell, False
    m = _NUM_UNIT.fullmatch(cell.strip())
    if m and (m.group(2) == "" or (unit is not None and m.group(2) == unit.strip())):
        n = number(m.group(1))
        return (None, True) if n is None else (n, False)  # None: 5,000 digits
    bare = cell.strip()
    if unit is not None and unit.strip() and bare.endswith(unit.strip()):
        bare = bare[: -len(unit.strip())]
    if looks_numeric(bare) and number(bare) is None:
        return None, True  # nan, inf, 1e400, 1e308: no reading, not a number to keep as text
    return cell, False


@parser(
    KIND_CSV,
    description="nvidia-smi --query-gpu=... --format=csv (noheader: pass fields)",
    command=("nvidia-smi", "--query-gpu=...", "--format=csv"),
    options=("fields",),
)
def parse_smi_csv(text: str, fields: Sequence[str] | str | None = None) -> ParseResult:
    lines = [line.strip() for line in clean(text).split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        return unrecognised(KIND_CSV, "empty input")
    banners = [line for line in lines if _is_error_banner(line)]
    lines = [line for line in lines if not _is_error_banner(line)]
    problems = [f"error message in output: {b}" for b in banners]
    if isinstance(fields, str):
        fields = fields.split(",")
    given = [f.strip() for f in fields or () if f.strip()]

    first = [c.strip() for c in lines[0].split(",")] if lines else []
    header_in_text = True
    if given:
        header, header_in_text = given, False
        want = [(_field_name(f) or (f, None))[0].lower() for f in given]
        got = [(_field_name(c) or (c, None))[0].lower() for c in first]
        if first and got == want:
            header, lines, header_in_text = first, lines[1:], True
    elif lines and _looks_like_header(first):
        header, lines = first, lines[1:]
    else:
        reason = "no CSV header line (for --format=csv,noheader pass the fields option)"
        return unrecognised(KIND_CSV, f"{reason}: {banners[0]}" if banners else reason)
    split = [[c.strip() for c in line.split(",")] for line in lines]
    if not header_in_text and not any(len(cells) == len(header) for cells in split):
        return unrecognised(
            KIND_CSV, f"no line has the {len(header)} comma-separated cell(s) the fields name"
        )

    parsed = [_field_name(h) or (h, None) for h in header]
    rows: list[dict[str, Any]] = []
    values: list[dict[str, Any]] = []
    read_errors: list[str] = []
    for row_number, cells in enumerate(split, start=1):
        if cells == header:
            continue  # the header printed again (pasted twice, or several runs)
        if len(cells) != len(header):
            problems.append(f"row {row_number} has {len(cells)} cell(s), the header {len(header)}")
        row: dict[str, Any] = {}
        value_row: dict[str, Any] = {}
        for i, (label, (name, unit)) in enumerate(zip(header, parsed, strict=True)):
            cell = cells[i] if i < len(cells) else None
            row[label] = cell
            value, failed = _csv_value(name, unit, cell)
            value_row[label] = value
            if failed:
                read_errors.append(f"row {row_number} {label}: {cell!r}")
        rows.append(row)
        values.append(value_row)
    if not rows:
        problems.append("header but no data rows")
    if read_errors:
        more = f" (and {len(read_errors) - 3} more)" if len(read_errors) > 3 else ""
        problems.append(f"read errors: {'; '.join(read_errors[:3])}{more}")
    data = {
        "header": header,
        "fields": [name for name, _ in parsed],
        "units": [unit for _, unit in parsed],
        "rows": rows,
        "values": values,
    }
    return ParseResult(KIND_CSV, True, data, tuple(problems))

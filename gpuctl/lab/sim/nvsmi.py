"""`nvidia-smi` outputs for a simulated node: the default table, ``-q``, ``--query-gpu``,
``topo -m``, ``nvlink -s`` and ``-L``. Layouts are copied from real captures in tests/fixtures.
Standard library only (runs inside lab nodes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .common import (
    Faults,
    Gpu,
    Profile,
    digest,
    ecc_uncorrectable,
    fabric_ok,
    gpu_vbios,
    hcas,
    nvlink_down,
    pcie_link,
    read_state_file,
    throttled,
    visible_gpus,
    write_state_file,
)
from .mft import state_dir
from .smi_q_template import GPU_BLOCK

_RULE = (
    "+-----------------------------------------------------------------------------------------+"
)
_SPLIT = (
    "+-----------------------------------------+------------------------+----------------------+"
)
_HEAD = """\
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|"""
_PROCESSES = """\
+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+"""


def _temp(profile: Profile, gpu: Gpu, node: str) -> int:
    base = int(profile["gpus"]["idle_temp_c"])
    return base + digest(node, "temp", gpu.physical) % 4 - 1


def _power(profile: Profile, gpu: Gpu, node: str) -> float:
    base = float(profile["gpus"]["idle_power_w"])
    return round(base + (digest(node, "power", gpu.physical) % 1600) / 100.0 - 8.0, 2)


def _used_mib(profile: Profile) -> int:
    return 1 if profile["gpus"]["nvlink"]["links"] else 4


# ------------------------------------------------------------------------------------------
# nvidia-smi (the default table, 555+ layout)


def table(profile: Profile, faults: Faults, node: str) -> str:
    driver, cuda = profile["driver_version"], profile["cuda_version"]
    lines = [
        _RULE,
        f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|",
        _SPLIT.replace("+", "|", 1)[:-1] + "+",
        _HEAD,
    ]
    spec = profile["gpus"]
    total = int(spec["memory_mib"])
    for gpu in visible_gpus(profile, faults, node):
        name = gpu.name if len(gpu.name) <= 28 else gpu.name[:25] + "..."
        left = f" {gpu.index:>3}  {name}"
        cell1 = left + " " * max(1, 41 - len(left) - 4) + "On  "
        ecc = str(ecc_uncorrectable(faults, gpu))
        lines.append(f"|{cell1}|{gpu.bus_id:>19} Off |{ecc:>21} |")
        perf = "P0"
        power = f"{round(_power(profile, gpu, node))}W"
        cap = f"{spec['power_limit_w']}W"
        used = _used_mib(profile)
        lines.append(
            f"| N/A {str(_temp(profile, gpu, node)) + 'C':>5}    {perf:<2}{power:>16} / {cap:>5} |"
            f"{str(used) + 'MiB':>11} / {str(total) + 'MiB':>9} |{'0%':>8}{'Default':>13} |"
        )
        mig = "Disabled" if spec["nvlink"]["links"] else "N/A"
        lines.append(f"|{'':41}|{'':24}|{mig:>21} |")
        lines.append(_SPLIT)
    lines.append(" " * 89)
    lines.append(_PROCESSES)
    return "\n".join(lines) + "\n"


def listing(profile: Profile, faults: Faults, node: str) -> str:
    """``nvidia-smi -L``."""
    return "".join(
        f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in visible_gpus(profile, faults, node)
    )


# ------------------------------------------------------------------------------------------
# nvidia-smi -q


def _fabric(profile: Profile, faults: Faults) -> tuple[str, str, str, str]:
    if not profile["gpus"].get("nvswitch"):
        return "N/A", "N/A", "N/A", "N/A"
    if not fabric_ok(profile, faults):
        return "In Progress", "N/A", "N/A", "N/A"
    return "Completed", "Success", "0", "00000000-0000-0000-0000-000000000000"


def selected_gpus(
    profile: Profile, faults: Faults, node: str, only: int | None, timestamp: str | None
) -> tuple[list[Gpu], str]:
    """The GPUs a query shows (``-i INDEX``: that one) and its timestamp line's time."""
    gpus = visible_gpus(profile, faults, node)
    if only is not None:
        gpus = [gpu for gpu in gpus if gpu.index == only]
    return gpus, timestamp or time.strftime("%a %b %d %H:%M:%S %Y")


def query(
    profile: Profile,
    faults: Faults,
    node: str,
    timestamp: str | None = None,
    only: int | None = None,
) -> str:
    """``nvidia-smi -q`` (``only``: ``-i INDEX``, that GPU alone)."""
    gpus, stamp = selected_gpus(profile, faults, node, only, timestamp)
    head = (
        "\n==============NVSMI LOG==============\n\n"
        f"{'Timestamp':<42}: {stamp}\n"
        f"{'Driver Version':<42}: {profile['driver_version']}\n"
        f"{'CUDA Version':<42}: {profile['cuda_version']}\n\n"
        f"{'Attached GPUs':<42}: {len(gpus)}\n"
    )
    blocks = [_gpu_block(profile, faults, node, gpu) for gpu in gpus]
    return head + "\n".join(blocks) + "\n"


def _gpu_block(profile: Profile, faults: Faults, node: str, gpu: Gpu) -> str:
    return GPU_BLOCK.format(**gpu_values(profile, faults, node, gpu))


def gpu_values(profile: Profile, faults: Faults, node: str, gpu: Gpu) -> dict[str, object]:
    """The per-GPU values of ``-q`` (text and XML fill their templates from these)."""
    spec = profile["gpus"]
    clocks = spec["clocks_mhz"]
    gen_cur, gen_max, width_cur, width_max = pcie_link(profile, faults, gpu)
    unc = ecc_uncorrectable(faults, gpu)
    slow = throttled(faults, gpu)
    total, reserved = int(spec["memory_mib"]), int(spec["memory_reserved_mib"])
    used = _used_mib(profile)
    state, status, clique, cluster = _fabric(profile, faults)
    bus = gpu.bus_id.split(":")[1]
    return {
        "sp": " ",
        "atomic": "FETCHADD_32 FETCHADD_64 SWAP_32 SWAP_64 CAS_32 CAS_64 ",
        "bus_id": gpu.bus_id,
        "name": gpu.name,
        "arch": spec["architecture"],
        "serial": gpu.serial,
        "uuid": gpu.uuid,
        "minor": gpu.physical,
        "vbios": gpu_vbios(profile, faults, gpu),
        "board_id": f"0x{bus.lower()}00",
        "board_part": spec["board_part_number"],
        "module_id": gpu.module_id,
        "inforom": spec["inforom_image"],
        "gsp_fw": profile["driver_version"],
        "pci_bus": f"0x{bus}",
        "device_id": spec["device_id"],
        "subsys_id": spec["sub_system_id"],
        "gen_max": gen_max,
        "gen_cur": gen_cur,
        "width_max": width_max,
        "width_cur": width_cur,
        "pstate": "P0",
        "cer_idle": "Not Active" if slow else "Active",
        "cer_hw": "Active" if slow else "Not Active",
        "cer_hw_thermal": "Active" if slow else "Not Active",
        "fb_total": total,
        "fb_reserved": reserved,
        "fb_used": used,
        "fb_free": total - reserved - used,
        "ecc_vol_dram_unc": unc,
        "ecc_agg_dram_unc": unc,
        "remap_unc": min(unc, 1) if unc else 0,
        "remap_pending": "Yes" if unc else "No",
        "hist_max": int(spec["row_remap_banks"]) - (1 if unc else 0),
        "hist_high": 1 if unc else 0,
        "temp": _temp(profile, gpu, node),
        "mem_temp": _temp(profile, gpu, node) + 6,
        "power_draw": f"{_power(profile, gpu, node):.2f}",
        "power_limit": f"{float(spec['power_limit_w']):.2f}",
        "power_min": f"{float(spec['power_min_w']):.2f}",
        "clk_gr": clocks["graphics_idle"],
        "clk_mem": clocks["memory"],
        "max_gr": clocks["graphics_max"],
        "max_video": clocks["video_max"],
        "fabric_state": state,
        "fabric_status": status,
        "clique": clique,
        "cluster_uuid": cluster,
    }


# ------------------------------------------------------------------------------------------
# nvidia-smi --query-gpu=... --format=csv


def _reasons(faults: Faults, gpu: Gpu) -> str:
    return "0x0000000000000008" if throttled(faults, gpu) else "0x0000000000000001"


_Field = Callable[[Profile, Faults, str, Gpu], str]

FIELDS: dict[str, tuple[str, _Field]] = {
    # field -> (unit shown in the header, value)
    "timestamp": ("", lambda p, f, n, g: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": ("", lambda p, f, n, g: str(p["driver_version"])),
    "count": ("", lambda p, f, n, g: str(len(visible_gpus(p, f, n)))),
    "index": ("", lambda p, f, n, g: str(g.index)),
    "name": ("", lambda p, f, n, g: g.name),
    "serial": ("", lambda p, f, n, g: g.serial),
    "uuid": ("", lambda p, f, n, g: g.uuid),
    "pci.bus_id": ("", lambda p, f, n, g: g.bus_id),
    "vbios_version": ("", lambda p, f, n, g: gpu_vbios(p, f, g)),
    "pstate": ("", lambda p, f, n, g: "P0"),
    "temperature.gpu": ("", lambda p, f, n, g: str(_temp(p, g, n))),
    "memory.total": ("MiB", lambda p, f, n, g: f"{p['gpus']['memory_mib']} MiB"),
    "memory.used": ("MiB", lambda p, f, n, g: f"{_used_mib(p)} MiB"),
    "utilization.gpu": ("%", lambda p, f, n, g: "0 %"),
    "power.draw": ("W", lambda p, f, n, g: f"{_power(p, g, n):.2f} W"),
    "power.limit": ("W", lambda p, f, n, g: f"{float(p['gpus']['power_limit_w']):.2f} W"),
    "ecc.errors.uncorrected.volatile.total": ("", lambda p, f, n, g: str(ecc_uncorrectable(f, g))),
    "ecc.errors.uncorrected.aggregate.total": (
        "",
        lambda p, f, n, g: str(ecc_uncorrectable(f, g)),
    ),
    "retired_pages.pending": ("", lambda p, f, n, g: "[N/A]"),
    "remapped_rows.pending": (
        "",
        lambda p, f, n, g: "Yes" if ecc_uncorrectable(f, g) else "No",
    ),
    "pcie.link.gen.current": ("", lambda p, f, n, g: str(pcie_link(p, f, g)[0])),
    "pcie.link.gen.max": ("", lambda p, f, n, g: str(pcie_link(p, f, g)[1])),
    "pcie.link.width.current": ("", lambda p, f, n, g: str(pcie_link(p, f, g)[2])),
    "pcie.link.width.max": ("", lambda p, f, n, g: str(pcie_link(p, f, g)[3])),
    "clocks_event_reasons.active": ("", lambda p, f, n, g: _reasons(f, g)),
    "clocks_throttle_reasons.active": ("", lambda p, f, n, g: _reasons(f, g)),
    "clocks_event_reasons.hw_slowdown": (
        "",
        lambda p, f, n, g: "Active" if throttled(f, g) else "Not Active",
    ),
    "clocks.sm": ("MHz", lambda p, f, n, g: f"{p['gpus']['clocks_mhz']['graphics_idle']} MHz"),
    "clocks.max.sm": ("MHz", lambda p, f, n, g: f"{p['gpus']['clocks_mhz']['graphics_max']} MHz"),
    "persistence_mode": ("", lambda p, f, n, g: "Enabled"),
    "mig.mode.current": (
        "",
        lambda p, f, n, g: "Disabled" if p["gpus"]["nvlink"]["links"] else "[N/A]",
    ),
}


class QueryError(ValueError):
    """A --query-gpu field this simulator (or nvidia-smi) does not know."""


def query_csv(
    profile: Profile,
    faults: Faults,
    node: str,
    fields: list[str],
    *,
    header: bool = True,
    units: bool = True,
) -> str:
    unknown = [field for field in fields if field not in FIELDS]
    if unknown:
        raise QueryError(f'Field "{unknown[0]}" is not a valid field to query.')
    lines = []
    if header:
        lines.append(
            ", ".join(
                f"{field} [{FIELDS[field][0]}]" if FIELDS[field][0] and units else field
                for field in fields
            )
        )
    for gpu in visible_gpus(profile, faults, node):
        cells = []
        for field in fields:
            unit, value = FIELDS[field]
            cell = value(profile, faults, node, gpu)
            if unit and not units:
                cell = cell.removesuffix(f" {unit}")
            cells.append(cell)
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# nvidia-smi topo -m

_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""  # noqa: E501


def _pcie_token(profile: Profile, a: tuple[int, int], b: tuple[int, int], nic: bool) -> str:
    """Token between two devices given (numa, pcie switch) of each."""
    if a[1] == b[1]:
        return "PIX"
    if a[0] == b[0]:
        return "NODE" if nic else str(profile["topology"]["same_numa"])
    return "SYS"


def gpu_pair_token(profile: Profile, faults: Faults, a: Gpu, b: Gpu) -> str:
    rule = str(profile["topology"]["gpu_gpu"])
    if rule.startswith("NV"):
        links = int(rule[2:])
        fault = faults.get("nvlink_degraded")
        if fault and sorted([a.physical, b.physical]) == fault["gpus"]:
            links = max(0, links - int(fault["links_down"]))
        if links:
            return f"NV{links}"
    return _pcie_token(profile, (a.numa, a.switch), (b.numa, b.switch), nic=False)


def _cpus(profile: Profile, numa: int) -> str:
    nodes = sorted(set(profile["gpus"]["numa"]))
    per = 112 // max(1, len(nodes)) // 2
    slot = nodes.index(numa) if numa in nodes else 0
    first = slot * per
    return f"{first}-{first + per - 1},{first + 112 // 2}-{first + 112 // 2 + per - 1}"


# `nvidia-smi topo -p2p <cap>`: r(ead), w(rite), n(vlink), a(tomics), p(rop), and rw
P2P_CAPS = ("r", "w", "rw", "n", "a", "p")
# its legend as driver 570-580 print it (tests/fixtures/topo/nvsmi-topo-p2p-rw-2gpu-gns.txt)
_P2P_LEGEND = (
    "Legend:\n\n"
    "  X    = Self\n"
    "  OK   = Status Ok\n"
    "  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n"
    "  TNS  = Topology not supported\n"
    "  NS   = Not supported\n"
    "  DR   = Disabled by regkey\n"
    "  U    = Unknown\n"
)


def topo_p2p(profile: Profile, faults: Faults, node: str) -> str:
    """The peer-access matrix: a leading blank and a trailing tab on every row, as the real
    tool prints; OK between every pair but those of a ``p2p_disabled`` GPU."""
    gpus = visible_gpus(profile, faults, node)
    disabled: dict[str, Any] = faults.get("p2p_disabled") or {}
    lines = [" \t" + "".join(f"GPU{g.index}\t" for g in gpus)]
    for gpu in gpus:
        cells = []
        for other in gpus:
            if other is gpu:
                cells.append("X")
            elif disabled and int(disabled["gpu"]) in (gpu.physical, other.physical):
                cells.append(str(disabled["status"]))
            else:
                cells.append("OK")
        lines.append(f" GPU{gpu.index}\t" + "".join(f"{c}\t" for c in cells))
    return "\n".join(lines) + "\n\n" + _P2P_LEGEND


def topo(profile: Profile, faults: Faults, node: str) -> str:
    gpus = visible_gpus(profile, faults, node)
    nics = hcas(profile, faults, node)
    names = [f"GPU{g.index}" for g in gpus] + [f"NIC{n.index}" for n in nics]
    lines = ["\t" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for gpu in gpus:
        cells = [
            " X " if other is gpu else gpu_pair_token(profile, faults, gpu, other) for other in gpus
        ]
        cells += [
            _pcie_token(profile, (gpu.numa, gpu.switch), (n.numa, n.switch), True) for n in nics
        ]
        cells += [_cpus(profile, gpu.numa), str(gpu.numa), "N/A"]
        lines.append(f"GPU{gpu.index}\t" + "\t".join(cells))
    for nic in nics:
        cells = [
            _pcie_token(profile, (nic.numa, nic.switch), (g.numa, g.switch), True) for g in gpus
        ]
        cells += [
            " X "
            if other is nic
            else _pcie_token(profile, (nic.numa, nic.switch), (other.numa, other.switch), True)
            for other in nics
        ]
        lines.append(f"NIC{nic.index}\t" + "\t".join(cells) + "\t\t\t")
    text = "\n".join(lines) + "\n" + _LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{n.index}: {n.name}\n" for n in nics)
    return text


# ------------------------------------------------------------------------------------------
# nvidia-smi nvlink -s


def _nvlink_gpu(profile: Profile, faults: Faults, gpu: Gpu) -> list[str]:
    spec = profile["gpus"]["nvlink"]
    links = int(spec["links"])
    down = nvlink_down(profile, faults, gpu)
    lines = [f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})"]
    for link in range(links):
        if link >= links - down:
            lines.append(f"\t Link {link}: <inactive>")
        else:
            lines.append(f"\t Link {link}: {float(spec['speed_gbs']):.3f} GB/s")
    return lines


def nvlink_status(profile: Profile, faults: Faults, node: str, gpu_index: int | None = None) -> str:
    lines: list[str] = []
    for gpu in visible_gpus(profile, faults, node):
        if gpu_index is None or gpu.index == gpu_index:
            lines += _nvlink_gpu(profile, faults, gpu)
    return "\n".join(lines) + "\n" if lines else ""


# ------------------------------------------------------------------------------------------
# nvidia-smi nvlink -e: the error counters, as driver 535 prints them (three per link, TAB +
# space indent, a blank line after each link: tests/fixtures/nvidia-smi/nvlink-e-*.txt). They
# live in the node's state dir (nvlink-errors.json, node -> GPU -> link -> counts): under the
# `nvlink_errors` fault every all_reduce_perf run adds to one link's, as a marginal link errs
# under load.

NVLINK_ERRORS_FILE = "nvlink-errors.json"
NVLINK_COUNTERS = (
    ("replay", "Replay Errors"),
    ("recovery", "Recovery Errors"),
    ("crc", "CRC Errors"),
)


def nvlink_errors(profile: Profile, faults: Faults, node: str, gpu_index: int | None = None) -> str:
    counts = read_state_file(state_dir(), NVLINK_ERRORS_FILE).get(node) or {}
    links = int(profile["gpus"]["nvlink"]["links"])
    lines: list[str] = []
    for gpu in visible_gpus(profile, faults, node):
        if gpu_index is not None and gpu.index != gpu_index:
            continue
        lines.append(f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})")
        mine = counts.get(str(gpu.physical)) or {}
        for link in range(links):
            here = mine.get(str(link)) or {}
            for key, name in NVLINK_COUNTERS:
                lines.append(f"\t Link {link}: {name}: {int(here.get(key, 0))}")
            lines.append("")
    return "\n".join(lines) + "\n" if lines else ""


def nvlink_traffic(faults: Faults, node: str) -> None:
    """An all_reduce_perf run loaded the NVLinks: the `nvlink_errors` fault's link gains its
    errors (COUNT replay and CRC errors, one recovery); without the fault nothing is written."""
    fault = faults.get("nvlink_errors")
    if not fault:
        return
    directory = state_dir()
    counts = read_state_file(directory, NVLINK_ERRORS_FILE)
    mine = counts.setdefault(node, {})  # by node: tests run several nodes on one state dir
    link = mine.setdefault(str(fault["gpu"]), {}).setdefault(str(fault["link"]), {})
    for key, grow in (("replay", fault["count"]), ("crc", fault["count"]), ("recovery", 1)):
        link[key] = int(link.get(key, 0)) + int(grow)
    write_state_file(directory, NVLINK_ERRORS_FILE, counts)

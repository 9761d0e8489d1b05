"""Injected hardware faults: their names, how a VALUE is written, and the stored form.

A node's faults are one JSON object (``/var/lib/gpuctl-lab-sim/faults.json`` inside the node),
fault name -> stored value. :func:`apply` parses ``NAME=VALUE`` text (what a person types) into
that form; the generators only read it. Standard library only: this module runs inside lab nodes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import pci as sim_pci

Faults = dict[str, Any]


class FaultError(ValueError):
    """An unknown fault name or a VALUE that does not fit the fault (a usage error)."""


def _int(text: str, what: str, low: int = 0, high: int = 1 << 20) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise FaultError(f"{what}: expected a whole number, got {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise FaultError(f"{what}: {value} is outside {low}..{high}")
    return value


def _factor(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FaultError(f"{what}: expected a factor such as 0.5, got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise FaultError(f"{what}: factor {value} is outside (0, 1]")
    return value


def _gpu_list(text: str) -> list[int]:
    items = [part for part in text.split(",") if part.strip()]
    if not items:
        raise FaultError("gpu_lost: expected GPU indexes such as 3 or 3,5")
    return sorted({_int(part, "gpu_lost GPU", 0, 63) for part in items})


def _xid(text: str) -> list[dict[str, int]]:
    events = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*[:@]\s*(\d+)\s*", part)
        if not match:
            raise FaultError(f"xid: expected XID:GPU such as 13:2, got {part!r}")
        events.append(
            {
                "xid": _int(match.group(1), "xid number", 1, 1000),
                "gpu": _int(match.group(2), "xid GPU", 0, 63),
            }
        )
    return events


def _ecc(text: str) -> dict[str, int]:
    parts = text.split(":")
    if len(parts) > 2:
        raise FaultError(f"ecc: expected GPU[:COUNT], got {text!r}")
    count = _int(parts[1], "ecc count", 1, 1_000_000) if len(parts) == 2 else 2
    return {"gpu": _int(parts[0], "ecc GPU", 0, 63), "uncorrectable": count}


def _nvlink(text: str) -> dict[str, Any]:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise FaultError(
            f"nvlink_degraded: expected GPU-GPU[:LINKS_DOWN] such as 0-1:4, got {text!r}"
        )
    first = _int(match.group(1), "nvlink_degraded GPU", 0, 63)
    second = _int(match.group(2), "nvlink_degraded GPU", 0, 63)
    if first == second:
        raise FaultError("nvlink_degraded: the two GPUs must differ")
    down = _int(match.group(3), "nvlink_degraded links", 1, 18) if match.group(3) else 2
    return {"gpus": sorted([first, second]), "links_down": down}


def _nvlink_errors(text: str) -> dict[str, int]:
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise FaultError(f"nvlink_errors: expected GPU:LINK[:COUNT] such as 3:5, got {text!r}")
    return {
        "gpu": _int(match.group(1), "nvlink_errors GPU", 0, 63),
        "link": _int(match.group(2), "nvlink_errors link", 0, 17),
        "count": _int(match.group(3), "nvlink_errors count", 1, 1 << 16) if match.group(3) else 40,
    }


def _flaps(text: str) -> dict[str, int]:
    match = re.fullmatch(r"\s*(mlx5_\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise FaultError(f"ib_link_flaps: expected HCA[:COUNT] such as mlx5_2:1, got {text!r}")
    count = _int(match.group(2), "ib_link_flaps count", 1, 255) if match.group(2) else 1
    return {match.group(1): count}


_BER = re.compile(r"\s*(mlx5_\d+)\s*(?::\s*([0-9](?:\.[0-9])?E-[0-9]{1,3})\s*)?", re.IGNORECASE)


def _latency(text: str) -> dict[str, float]:
    hca, _, extra = text.strip().partition(":")
    if not re.fullmatch(r"mlx5_\w+", hca):
        raise FaultError(f"ib_latency: expected HCA[:US] such as mlx5_2:5, got {text!r}")
    try:
        us = float(extra) if extra else 5.0
    except ValueError:
        raise FaultError(f"ib_latency: expected microseconds such as 5, got {extra!r}") from None
    if not 0.0 < us <= 1000.0:
        raise FaultError(f"ib_latency: {us} us is outside (0, 1000]")
    return {hca: us}


def _ber(text: str) -> dict[str, str]:
    match = _BER.fullmatch(text)
    if not match:
        raise FaultError(f"ib_ber: expected HCA[:BER] such as mlx5_2:1E-9, got {text!r}")
    ber = (match.group(2) or "1E-9").upper()
    if not 1e-300 < float(ber) < 1e-3:
        raise FaultError(f"ib_ber: a bit error rate between 1E-300 and 1E-3, not {ber}")
    return {match.group(1): ber}


def _pcie(text: str) -> dict[str, int | None]:
    parts = text.split(":")
    if len(parts) > 3:
        raise FaultError(f"pcie_degraded: expected GPU[:WIDTH[:GEN]], got {text!r}")
    width = _int(parts[1], "pcie_degraded width", 1, 16) if len(parts) > 1 else 8
    if width not in (1, 2, 4, 8, 16):
        raise FaultError(f"pcie_degraded: width {width} is not 1, 2, 4, 8 or 16")
    gen = _int(parts[2], "pcie_degraded gen", 1, 6) if len(parts) > 2 else None
    return {"gpu": _int(parts[0], "pcie_degraded GPU", 0, 63), "width": width, "gen": gen}


AER_SEVERITIES = ("corrected", "nonfatal", "fatal")


def _aer(text: str) -> dict[str, Any]:
    gpu, _, severity = text.partition(":")
    severity = severity or "corrected"
    if severity not in AER_SEVERITIES:
        raise FaultError(
            f"pcie_aer: severity {severity!r} is not one of {', '.join(AER_SEVERITIES)}"
        )
    return {"gpu": _int(gpu, "pcie_aer GPU", 0, 63), "severity": severity}


def _acs(text: str) -> list[int]:
    return [_int(part, "pcie_acs GPU", 0, 63) for part in text.split(",")]


def _nic_pcie(text: str) -> dict[str, dict[str, int | None]]:
    parts = text.split(":")
    if len(parts) > 3 or not _HCA.fullmatch(parts[0]):
        raise FaultError(f"nic_pcie_degraded: expected HCA[:WIDTH[:GEN]], got {text!r}")
    width = _int(parts[1], "nic_pcie_degraded width", 1, 16) if len(parts) > 1 else 8
    if width not in (1, 2, 4, 8, 16):
        raise FaultError(f"nic_pcie_degraded: width {width} is not 1, 2, 4, 8 or 16")
    gen = _int(parts[2], "nic_pcie_degraded gen", 1, 6) if len(parts) > 2 else None
    return {parts[0]: {"width": width, "gen": gen}}


_P2P_STATUS = ("CNS", "GNS", "TNS", "NS", "DR", "U")


def _p2p_disabled(text: str) -> dict[str, Any]:
    gpu, _, status = text.partition(":")
    status = status or "CNS"
    if status not in _P2P_STATUS:
        raise FaultError(f"p2p_disabled: status {status!r} is not one of {', '.join(_P2P_STATUS)}")
    return {"gpu": _int(gpu, "p2p_disabled GPU", 0, 63), "status": status}


def _p2p_slow(text: str) -> dict[str, Any]:
    gpu, _, factor = text.partition(":")
    return {
        "gpu": _int(gpu, "p2p_slow GPU", 0, 63),
        "factor": _factor(factor, "p2p_slow") if factor else 0.5,
    }


def _copy_slow(text: str) -> dict[str, Any]:
    gpu, _, factor = text.partition(":")
    return {
        "gpu": _int(gpu, "pcie_copy_slow GPU", 0, 63),
        "factor": _factor(factor, "pcie_copy_slow") if factor else 0.5,
    }


_HCA = re.compile(r"[A-Za-z0-9_]+")


def _port_down(text: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for part in text.split(","):
        name, _, state = part.strip().partition(":")
        state = state or "Down"
        if not _HCA.fullmatch(name):
            raise FaultError(f"ib_port_down: expected HCA[:Down|Disabled], got {part!r}")
        if state not in ("Down", "Disabled"):
            raise FaultError(f"ib_port_down: state must be Down or Disabled, got {state!r}")
        result[name] = state
    return result


_ROCE_COUNTERS = re.compile(r"[a-z][a-z0-9_]{1,40}")


def _roce_errors(text: str) -> dict[str, dict[str, int]]:
    """``HCA[:COUNTER[:COUNT]]``: COUNTER (default out_of_sequence) grows by COUNT (default 100)
    with every ib_write_bw run over HCA."""
    result: dict[str, dict[str, int]] = {}
    for part in text.split(","):
        name, _, rest = part.strip().partition(":")
        counter, _, count = rest.partition(":")
        counter = counter or "out_of_sequence"
        if not _HCA.fullmatch(name) or not _ROCE_COUNTERS.fullmatch(counter):
            raise FaultError(f"roce_errors: expected HCA[:COUNTER[:COUNT]], got {part!r}")
        result[name] = {counter: _int(count, "roce_errors count", 1) if count else 100}
    return result


def _nic_slots(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if len(names) != 2 or names[0] == names[1] or not all(_HCA.fullmatch(n) for n in names):
        raise FaultError(f"nic_slots_swapped: expected HCA,HCA such as mlx5_2,mlx5_5, got {text!r}")
    return names


_RATES = (10, 14, 25, 40, 50, 56, 100, 200, 400, 800)


def _ib_rate(text: str) -> dict[str, int]:
    result: dict[str, int] = {}
    for part in text.split(","):
        name, sep, rate = part.strip().partition(":")
        if not sep or not _HCA.fullmatch(name):
            raise FaultError(f"ib_rate: expected HCA:RATE such as mlx5_2:200, got {part!r}")
        value = _int(rate, "ib_rate rate", 1, 800)
        if value not in _RATES:
            raise FaultError(f"ib_rate: {value} is not a link rate ({', '.join(map(str, _RATES))})")
        result[name] = value
    return result


_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


def _collective_slow(text: str) -> dict[str, float]:
    result: dict[str, float] = {}
    for part in text.split(","):
        name, sep, factor = part.strip().partition(":")
        if not sep or name not in _COLLECTIVES:
            raise FaultError(
                "nccl_collective_slow: expected COLLECTIVE:FACTOR such as alltoall:0.5 "
                f"(COLLECTIVE one of {', '.join(_COLLECTIVES)}), got {part!r}"
            )
        result[name] = _factor(factor, "nccl_collective_slow")
    return result


def _wrong(text: str) -> int:
    return _int(text or "1", "nccl_wrong count", 1, 1 << 40)


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("", "1", "true", "yes", "on"):
        return True
    raise FaultError(f"expected no value or true, got {text!r} (use clear to remove a fault)")


def _version(text: str) -> str:
    if not re.fullmatch(r"\d+(\.\d+){1,3}", text.strip()):
        raise FaultError(
            f"fabricmanager_version: expected a version such as 535.104.05, got {text!r}"
        )
    return text.strip()


def _throttle(text: str) -> list[int] | str:
    if text.strip().lower() in ("", "all"):
        return "all"
    return sorted({_int(part, "clocks_throttled GPU", 0, 63) for part in text.split(",")})


def _hot(text: str) -> list[int]:
    return sorted({_int(part, "thermal_throttle GPU", 0, 63) for part in text.split(",")})


def _drift(text: str) -> dict[str, float]:
    """PCT, and when the fault was set: only the stress runs after it count (lab.sim.load)."""
    value = 8.0
    if text.strip():
        try:
            value = float(text)
        except ValueError:
            raise FaultError(f"nccl_drift: expected a percentage such as 8, got {text!r}") from None
    if not 0.0 < value < 100.0:
        raise FaultError(f"nccl_drift: {value} is outside (0, 100)")
    return {"pct": value, "since": round(time.time(), 3)}


def _gdr(text: str) -> list[int] | str:
    if text.strip().lower() in ("", "all"):
        return "all"
    return sorted({_int(part, "gpudirect_broken GPU", 0, 63) for part in text.split(",")})


_TARGET = re.compile(r"gpu|gpu\d+|hca|mlx5_\w+|fabricmanager")


def _firmware(text: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for part in text.split(","):
        target, sep, version = part.strip().partition("=")
        if not sep or not _TARGET.fullmatch(target) or not re.fullmatch(r"[0-9A-Fa-f.]+", version):
            raise FaultError(
                "firmware: expected TARGET=VERSION (TARGET gpu, gpuN, hca, mlx5_N or "
                f"fabricmanager), got {part!r}"
            )
        result[target] = version
    return result


@dataclass(frozen=True, slots=True)
class FaultSpec:
    name: str
    value_help: str
    description: str
    parse: Callable[[str], Any]
    merge: bool = False  # apply merges a mapping into the stored one instead of replacing it


SPECS: dict[str, FaultSpec] = {
    spec.name: spec
    for spec in (
        FaultSpec("gpu_lost", "GPU[,GPU...]", "GPU fell off the bus (Xid 79)", _gpu_list),
        FaultSpec("xid", "XID:GPU[,XID:GPU...]", "Xid events in the kernel log", _xid),
        FaultSpec("ecc", "GPU[:COUNT]", "uncorrectable DRAM ECC errors, row remap pending", _ecc),
        FaultSpec("nvlink_degraded", "GPU-GPU[:LINKS]", "NVLinks down between two GPUs", _nvlink),
        FaultSpec(
            "nvlink_errors",
            "GPU:LINK[:COUNT]",
            "an NVLink whose error counters grow under load",
            _nvlink_errors,
        ),
        FaultSpec("pcie_degraded", "GPU[:WIDTH[:GEN]]", "PCIe link below its maximum", _pcie),
        FaultSpec(
            "pcie_aer",
            "GPU[:corrected|nonfatal|fatal]",
            "PCIe AER errors on one GPU's link in the kernel log",
            _aer,
        ),
        FaultSpec(
            "p2p_slow",
            "GPU[:FACTOR]",
            "nvbandwidth's copies between one GPU and each peer at FACTOR (default 0.5)",
            _p2p_slow,
        ),
        FaultSpec(
            "p2p_disabled",
            "GPU[:CNS|GNS|TNS|NS|DR|U]",
            "peer access refused between one GPU and every peer (topo -p2p; nvbandwidth N/A)",
            _p2p_disabled,
        ),
        FaultSpec(
            "pcie_acs",
            "GPU[,GPU...]",
            "ACS redirection on the PCIe switch port above a GPU (lspci)",
            _acs,
        ),
        FaultSpec(
            "nic_pcie_degraded",
            "HCA[:WIDTH[:GEN]]",
            "an adapter's PCIe link below its maximum (lspci; default x8)",
            _nic_pcie,
            True,
        ),
        FaultSpec(
            "pcie_copy_slow",
            "GPU[:FACTOR]",
            "host-GPU copies of one GPU at FACTOR (default 0.5), its link at full width",
            _copy_slow,
        ),
        FaultSpec(
            "ib_port_down", "HCA[:Down|Disabled]", "an HCA port not Active", _port_down, True
        ),
        FaultSpec("ib_rate", "HCA:RATE", "an HCA port at a lower rate", _ib_rate, True),
        FaultSpec(
            "nic_slots_swapped",
            "HCA,HCA",
            "two adapters in each other's PCIe slots: each name sits where the other's rail is "
            "(topo -m)",
            _nic_slots,
        ),
        FaultSpec(
            "ib_link_flaps", "HCA[:COUNT]", "an HCA port that goes down under load", _flaps, True
        ),
        FaultSpec(
            "ib_ber", "HCA[:BER]", "an HCA port with bit errors after FEC (mlxlink)", _ber, True
        ),
        FaultSpec(
            "roce_errors",
            "HCA[:COUNTER[:COUNT]]",
            "a RoCE port's error counter (rdma statistic; default out_of_sequence) that grows by "
            "COUNT (100) with every ib_write_bw over it",
            _roce_errors,
            True,
        ),
        FaultSpec(
            "ib_latency",
            "HCA[:US]",
            "RDMA writes through an HCA US microseconds slower (ib_write_lat; default 5)",
            _latency,
            True,
        ),
        FaultSpec(
            "nccl_slow", "FACTOR", "NCCL busbw times FACTOR", lambda v: _factor(v, "nccl_slow")
        ),
        FaultSpec(
            "nccl_collective_slow",
            "COLLECTIVE:FACTOR",
            "one nccl-tests collective's busbw times FACTOR",
            _collective_slow,
            True,
        ),
        FaultSpec("nccl_wrong", "[COUNT]", "NCCL results with wrong elements", _wrong),
        FaultSpec(
            "gpudirect_broken",
            "[all|GPU,...]",
            "the adapters cannot register these GPUs' memory (GPUDirect RDMA, as without "
            "nvidia-peermem)",
            _gdr,
        ),
        FaultSpec("fabricmanager_failed", "", "nvidia-fabricmanager not running", _flag),
        FaultSpec("fabricmanager_version", "VERSION", "fabric manager version differs", _version),
        FaultSpec("clocks_throttled", "[all|GPU,...]", "HW Slowdown clock event active", _throttle),
        FaultSpec(
            "thermal_throttle",
            "GPU[,GPU...]",
            "under sustained load (DCGM stress) the GPU reaches its slowdown temperature: dmon "
            "shows it hot with clocks down, its HW thermal slowdown counter grows",
            _hot,
        ),
        FaultSpec(
            "nccl_drift",
            "[PCT]",
            "every DCGM stress run takes PCT % (default 8) off the next all_reduce runs' busbw",
            _drift,
        ),
        FaultSpec(
            "slow_node", "FACTOR", "every bandwidth times FACTOR", lambda v: _factor(v, "slow_node")
        ),
        FaultSpec("firmware", "TARGET=VERSION", "a firmware version overridden", _firmware, True),
        FaultSpec("no_reboot", "", "the node does not come back after its next reboot", _flag),
        FaultSpec("fw_update_fails", "", "the node's BMC fails every firmware update task", _flag),
    )
}

NAMES: tuple[str, ...] = tuple(SPECS)


def spec(name: str) -> FaultSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise FaultError(f"unknown fault {name!r}; known faults: {', '.join(NAMES)}") from None


def parse_value(name: str, value: str) -> Any:
    """The stored form of ``VALUE`` for fault ``name`` (raises FaultError when it does not fit)."""
    return spec(name).parse(value)


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"ib_port_down=mlx5_3"`` -> ``("ib_port_down", {"mlx5_3": "Down"})``."""
    name, _, value = text.partition("=")
    return name.strip(), parse_value(name.strip(), value)


def apply(faults: Mapping[str, Any], name: str, value: str = "") -> Faults:
    """A copy of ``faults`` with fault ``name`` set to the parsed ``value``."""
    fault = spec(name)
    parsed = fault.parse(value)
    result = dict(faults)
    previous = result.get(name)
    if fault.merge and isinstance(previous, dict) and isinstance(parsed, dict):
        result[name] = {**previous, **parsed}
    else:
        result[name] = parsed
    return result


def clear(faults: Mapping[str, Any], name: str | None = None) -> Faults:
    """A copy of ``faults`` without fault ``name`` (without any fault when ``name`` is None)."""
    if name is None:
        return {}
    spec(name)
    return {key: value for key, value in faults.items() if key != name}


# --- a fault against the node's hardware --------------------------------------------------
# A fault that names a GPU or an HCA the node's profile does not have would change nothing
# (the stand-in tools only look up what exists), so the next validation would pass: refused.


def _gpus_named(name: str, value: Any) -> list[int]:
    if name in ("gpu_lost", "clocks_throttled", "gpudirect_broken"):
        return [] if value == "all" else [int(v) for v in value]
    if name in ("pcie_acs", "thermal_throttle"):
        return [int(v) for v in value]
    if name == "xid":
        return [int(event["gpu"]) for event in value]
    if name in (
        "ecc",
        "pcie_degraded",
        "pcie_copy_slow",
        "pcie_aer",
        "p2p_slow",
        "p2p_disabled",
        "nvlink_errors",
    ):
        return [int(value["gpu"])]
    if name == "nvlink_degraded":
        return [int(v) for v in value["gpus"]]
    if name == "firmware":
        return [int(t[3:]) for t in value if re.fullmatch(r"gpu\d+", t)]
    return []


def _hcas_named(name: str, value: Any) -> list[str] | None:
    """The HCAs a fault names ([] for "every HCA"), or None when it names none."""
    if name in (
        "ib_port_down",
        "ib_rate",
        "ib_link_flaps",
        "ib_ber",
        "ib_latency",
        "nic_pcie_degraded",
        "nic_slots_swapped",
        "roce_errors",
    ):
        return list(value)
    if name == "firmware":
        named = [t for t in value if t == "hca" or t.startswith("mlx5_")]
        return [t for t in named if t != "hca"] if named else None
    return None


def _gpu_range(count: int) -> str:
    return "0" if count == 1 else f"0-{count - 1}"


def hardware_problem(name: str, value: Any, profile: Mapping[str, Any], node: str) -> str | None:
    """Why the parsed ``value`` of fault ``name`` names hardware that ``node`` (of hardware
    ``profile``) does not have, in one line naming what it has; None when it fits."""
    gpus = profile.get("gpus") or {}
    count = int(gpus.get("count", 0))
    model = f"{count}x {gpus.get('name', profile.get('model', '?'))}"
    missing = sorted({g for g in _gpus_named(name, value) if not 0 <= g < count})
    if missing:
        which = ", ".join(map(str, missing))
        return (
            f"{name}: {node} has no GPU {which}; its GPUs are {_gpu_range(count)} ({model}, "
            f"profile {profile.get('name', '?')})"
        )
    if name == "pcie_acs":
        alone = [g for g in value if not sim_pci.has_switch_port(dict(profile), int(g))]
        if alone:
            return (
                f"{name}: GPU {', '.join(map(str, alone))} of {node} sits on a root port, no PCIe "
                f"switch port above it ({model}, profile {profile.get('name', '?')})"
            )
    if name == "nvlink_errors":
        links = int((gpus.get("nvlink") or {}).get("links", 0))
        if int(value["link"]) >= links:
            return f"{name}: {node}'s GPUs have {links} NVLinks, no link {value['link']} ({model})"
    if name == "nvlink_degraded":
        links = int((gpus.get("nvlink") or {}).get("links", 0))
        if links == 0:
            return f"{name}: {node} has no NVLink ({model}, profile {profile.get('name', '?')})"
        if int(value["links_down"]) > links:
            return (
                f"{name}: {node}'s GPUs have {links} NVLinks each, not {value['links_down']} "
                f"({model})"
            )
    named = _hcas_named(name, value)
    if named is None:
        return None
    nics = profile.get("nics") or {}
    ports = [str(p["name"]) for p in nics.get("ports") or []]
    if not ports:
        return f"{name}: {node} has no HCA (profile {profile.get('name', '?')})"
    unknown = [h for h in named if h not in ports]
    if unknown:
        return f"{name}: {node} has no HCA {', '.join(unknown)}; its HCAs are {', '.join(ports)}"
    return None


def names_hardware(name: str, value: Any) -> bool:
    """Whether fault ``name`` (parsed ``value``) names GPUs, NVLinks or HCAs at all."""
    every_gpu = name in ("clocks_throttled", "gpudirect_broken") or (
        name == "firmware" and "gpu" in value
    )
    return bool(_gpus_named(name, value)) or every_gpu or _hcas_named(name, value) is not None


def validate(faults: Mapping[str, Any]) -> Faults:
    """Check a stored faults object (read back from JSON): known names only."""
    for name in faults:
        spec(name)
    return dict(faults)

"""What every generator shares: the GPUs and HCAs a node shows once faults apply, stable
per-node identifiers, and bandwidth factors. Standard library only (runs inside lab nodes).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

Profile = dict[str, Any]
Faults = dict[str, Any]


def digest(*parts: object) -> int:
    """A stable number from ``parts`` (same node name, same serials and GUIDs on every run)."""
    text = "\x1f".join(str(part) for part in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def jitter(base: float, spread: float, *parts: object) -> float:
    """``base`` moved by at most ``spread`` (relative), the same for the same ``parts``."""
    unit = (digest(*parts) % 10_000) / 10_000.0  # 0..1
    return base * (1.0 + spread * (2.0 * unit - 1.0))


@dataclass(frozen=True, slots=True)
class Gpu:
    physical: int  # index in the profile (what faults name)
    index: int  # index nvidia-smi prints (the lost GPUs leave no gap)
    bus_id: str  # 00000000:18:00.0
    name: str
    serial: str
    uuid: str
    module_id: int
    numa: int
    switch: int

    @property
    def short_pci(self) -> str:
        """``0000:18:00`` as the kernel's Xid lines print it."""
        domain, bus, rest = self.bus_id.split(":")
        return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}"


def all_gpus(profile: Profile, node: str) -> list[Gpu]:
    spec = profile["gpus"]
    result = []
    for i in range(int(spec["count"])):
        h = digest(node, "gpu", i)
        uuid_hex = f"{digest(node, 'uuid', i):016x}{digest(node, 'uuid2', i):016x}"
        uuid = (
            f"GPU-{uuid_hex[0:8]}-{uuid_hex[8:12]}-{uuid_hex[12:16]}-{uuid_hex[16:20]}-"
            f"{uuid_hex[20:32]}"
        )
        result.append(
            Gpu(
                physical=i,
                index=i,
                bus_id=spec["bus_ids"][i],
                name=spec["name"],
                serial=f"16{h % 10**11:011d}",
                uuid=uuid,
                module_id=int(spec["module_ids"][i]),
                numa=int(spec["numa"][i]),
                switch=int(spec["pcie_switch"][i]),
            )
        )
    return result


def visible_gpus(profile: Profile, faults: Faults, node: str) -> list[Gpu]:
    """The GPUs the driver still sees: lost ones removed, the rest numbered from 0."""
    lost = set(faults.get("gpu_lost") or ())
    kept = [gpu for gpu in all_gpus(profile, node) if gpu.physical not in lost]
    return [
        Gpu(g.physical, i, g.bus_id, g.name, g.serial, g.uuid, g.module_id, g.numa, g.switch)
        for i, g in enumerate(kept)
    ]


@dataclass(frozen=True, slots=True)
class Hca:
    index: int
    name: str
    netdev: str
    ca_type: str
    link_layer: str
    rate: int  # the rate the port runs at now
    max_rate: int
    state: str  # Active | Down | Init
    physical_state: str  # LinkUp | Disabled | Polling
    firmware: str
    node_guid: str  # 0x58a2e10300a7820e
    port_guid: str
    lid: int
    numa: int
    switch: int

    @property
    def active(self) -> bool:
        return self.state == "Active"


def hcas(profile: Profile, faults: Faults, node: str) -> list[Hca]:
    nics = profile.get("nics")
    if not nics:
        return []
    down: dict[str, str] = faults.get("ib_port_down") or {}
    rates: dict[str, int] = faults.get("ib_rate") or {}
    swapped: list[str] = list(faults.get("nic_slots_swapped") or ())
    slots = {str(p["name"]): p for p in nics["ports"]}
    result = []
    for i, port in enumerate(nics["ports"]):
        name = port["name"]
        slot = port  # where the adapter sits: the other's slot under nic_slots_swapped
        if name in swapped and all(n in slots for n in swapped):
            slot = slots[swapped[1 - swapped.index(name)]]
        tail = digest(node, "guid", name) & 0xFFFFFF
        guid = f"{nics['guid_prefix']}{tail:06x}"
        ethernet = nics["link_layer"] == "Ethernet"
        # RoCE ports have a MAC-derived port GUID (fffe in the middle); IB ports reuse the node GUID
        port_guid = f"0x{(tail ^ 0x020000):06x}fffe{tail:06x}" if ethernet else guid
        state, physical = "Active", "LinkUp"
        if name in down:
            state = "Down"
            physical = "Disabled" if down[name] == "Disabled" else "Polling"
        fw = hca_firmware_fault(faults, name) or profile["firmware"]["hca"]
        result.append(
            Hca(
                index=i,
                name=name,
                netdev=port["netdev"],
                ca_type=nics["ca_type"],
                link_layer=nics["link_layer"],
                rate=int(rates.get(name, nics["rate"])) if state == "Active" else 10,
                max_rate=int(nics["rate"]),
                state=state,
                physical_state=physical,
                firmware=str(fw),
                node_guid=guid,
                port_guid=port_guid,
                lid=0 if ethernet else 100 + digest(node, "lid", name) % 1900,
                numa=int(slot["numa"]),
                switch=int(slot["pcie_switch"]),
            )
        )
    return result


def hca_firmware_fault(faults: Faults, name: str) -> str | None:
    """The HCA firmware version the ``firmware`` fault sets for HCA ``name`` (``mlx5_N=``, else
    ``hca=``), or None. The fault wins over everything else that names a version: the profile's,
    and the one a simulated burn made run (gpuctl/lab/sim/mft.py)."""
    firmware: dict[str, str] = faults.get("firmware") or {}
    version = firmware.get(name) or firmware.get("hca")
    return str(version) if version else None


def gpu_vbios(profile: Profile, faults: Faults, gpu: Gpu, state_dir: str | None = None) -> str:
    """The VBIOS version GPU ``gpu`` runs: the ``firmware`` fault's (``gpuN=``, else ``gpu=``),
    else the one the lab's simulated BMC made run at the last power cycle (``gpu-firmware.json``
    in the state dir, ``{"gpus": {"<physical index>": "<version>"}}``, written by
    gpuctl/lab/sim/bmc/), else the profile's. ``state_dir``: the directory of that file (default:
    ``GPUCTL_SIM_STATE_DIR``, else faults.json's directory, /var/lib/gpuctl-lab-sim)."""
    import json
    import os

    firmware: dict[str, str] = faults.get("firmware") or {}
    override = firmware.get(f"gpu{gpu.physical}") or firmware.get("gpu")
    if override:
        return str(override)
    directory = (
        state_dir
        or os.environ.get("GPUCTL_SIM_STATE_DIR")
        or os.path.dirname(os.environ.get("GPUCTL_SIM_FAULTS") or "/var/lib/gpuctl-lab-sim/x")
    )
    try:
        with open(os.path.join(directory, "gpu-firmware.json"), encoding="utf-8") as handle:
            running = json.load(handle)["gpus"][str(gpu.physical)]
    except (OSError, ValueError, KeyError, TypeError):
        running = None
    if isinstance(running, str) and running:
        return running
    return str(profile["firmware"]["gpu_vbios"])


def throttled(faults: Faults, gpu: Gpu) -> bool:
    value = faults.get("clocks_throttled")
    if value is None:
        return False
    return value == "all" or gpu.physical in value


def nvlink_down(profile: Profile, faults: Faults, gpu: Gpu) -> int:
    """How many of this GPU's NVLinks are down."""
    fault = faults.get("nvlink_degraded")
    if not fault or gpu.physical not in fault["gpus"]:
        return 0
    return min(int(fault["links_down"]), int(profile["gpus"]["nvlink"]["links"]))


def nccl_factor(profile: Profile, faults: Faults) -> float:
    """How much of the profile's NCCL busbw a node reaches with these faults."""
    factor = float(faults.get("nccl_slow") or 1.0) * float(faults.get("slow_node") or 1.0)
    fault = faults.get("nvlink_degraded")
    links = int(profile["gpus"]["nvlink"]["links"])
    if fault and links:
        factor *= max(0.05, 1.0 - min(int(fault["links_down"]), links) / links)
    if faults.get("clocks_throttled"):
        factor *= 0.72
    if faults.get("pcie_degraded") and not links:  # PCIe-only GPUs: the slow link is the ring
        factor *= int(faults["pcie_degraded"]["width"]) / int(profile["gpus"]["pcie"]["width"])
    return factor


def pcie_link(profile: Profile, faults: Faults, gpu: Gpu) -> tuple[int, int, int, int]:
    """(gen current, gen max, width current, width max)."""
    pcie = profile["gpus"]["pcie"]
    gen_max, width_max = int(pcie["gen"]), int(pcie["width"])
    fault = faults.get("pcie_degraded")
    if fault and fault["gpu"] == gpu.physical:
        gen = int(fault["gen"]) if fault.get("gen") is not None else gen_max
        return min(gen, gen_max), gen_max, min(int(fault["width"]), width_max), width_max
    return gen_max, gen_max, width_max, width_max


def ecc_uncorrectable(faults: Faults, gpu: Gpu) -> int:
    fault = faults.get("ecc")
    if fault and fault["gpu"] == gpu.physical:
        return int(fault["uncorrectable"])
    return 0


def fabric_manager_version(profile: Profile, faults: Faults) -> str | None:
    firmware: dict[str, str] = faults.get("firmware") or {}
    version = (
        faults.get("fabricmanager_version")
        or firmware.get("fabricmanager")
        or profile["firmware"].get("fabricmanager")
    )
    return str(version) if version else None


def fabric_ok(profile: Profile, faults: Faults) -> bool:
    """Whether NVSwitch GPUs joined the fabric (fabric manager up and matching the driver)."""
    if not profile["gpus"].get("nvswitch"):
        return True
    if faults.get("fabricmanager_failed"):
        return False
    return fabric_manager_version(profile, faults) == str(profile["driver_version"])


def read_state_file(directory: str, name: str) -> dict[str, Any]:
    """A simulator's JSON state ``directory/name``: {} when there is none yet (a fresh node);
    ValueError naming the file when it cannot be read or parsed (never a silent fresh state)."""
    path = os.path.join(directory, name)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def write_state_file(directory: str, name: str, data: dict[str, Any]) -> None:
    """Write a simulator's JSON state ``directory/name`` atomically (a reader never sees half a
    file): the simulator's one writer. The stand-ins run on the lab nodes, where only this
    package is installed (the lab copies gpuctl/lab/sim into them, not gpuctl), so they cannot
    use gpuctl.fileio.write_atomic, the writer of everything else."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)


def recv_line(conn: socket.socket, size: int) -> bytes:
    """What the other side sends up to and including its first newline (or until it closes),
    read ``size`` bytes at a time."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(size)
        if not chunk:
            break
        data += chunk
    return data

"""SIMULATED PCIe tree of a lab node and its ``lspci -vvv`` (pciutils 3.9, Debian 12's).

The tree is invented, consistent with the profile's GPU bus ids and PCIe switches: each switch
of the profile (``gpus.pcie_switch``, ``nics.ports[].pcie_switch``) is a root port on bus 00,
an upstream port and one downstream port per device, the adapters on the buses after the
switch's GPUs (as on a real HGX H100: GPU 19:00.0, ConnectX-7 1a:00.0 under one PEX890xx,
tests/fixtures/pci/). A device with no room for a switch above its bus sits on a root port of
its own. Each block prints the lines the real tool prints for a device, in its order and
wording (tests/fixtures/pci/lspci-vvv-hgx-h100-8gpu-*), but only some of the capabilities: the
header, Control/Status, bus range, the Express capability's link lines, ACS and the driver.

Faults: ``pcie_acs GPU`` turns ACS redirection on on the downstream port above that GPU;
``nic_pcie_degraded HCA[:WIDTH[:GEN]]`` trains that adapter's link down. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .common import Faults, Profile

# PCIe generation -> GT/s as lspci prints it
GTS = {1: "2.5", 2: "5", 3: "8", 4: "16", 5: "32", 6: "64"}
# ConnectX by the ca_type ibstat shows: lspci's name (pci.ids) and the card's PCIe generation
# and its PCI device id
ADAPTERS = {
    "MT4129": ("MT2910 Family [ConnectX-7]", 5, "1021"),
    "MT4125": ("MT2892 Family [ConnectX-6 Dx]", 4, "101d"),
    "MT4123": ("MT28908 Family [ConnectX-6]", 4, "101b"),
    "MT4119": ("MT27800 Family [ConnectX-5]", 3, "1017"),
}
_SWITCH = {
    5: "Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)",
    4: "Broadcom / LSI PEX880xx PCIe Gen 4 Switch (rev b0)",
}
_ROOT = "Intel Corporation Device 352a (rev 04)"
ACS_CAP = "SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+"
ACS_OFF = "SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
# what a port with ACS on shows (the Switchtec ports of the real HGX capture)
ACS_ON = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


@dataclass
class Dev:
    """One PCI function of the simulated tree."""

    bus: int
    slot: int
    kind: str  # root, upstream, downstream, gpu, nic
    gen: int
    width: int = 16
    secondary: int | None = None
    subordinate: int | None = None
    numa: int = 0
    name: str = ""
    label: str = ""  # GPU<i> or the HCA's name
    acs: bool = False
    status: tuple[int, int] | None = None  # (gen, width) trained, when below the maximum
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"0000:{self.bus:02x}:{self.slot:02x}.0"


def _bus(bus_id: str) -> int:
    return int(bus_id.split(":")[1], 16)


def tree(profile: Profile, faults: Faults | None = None) -> list[Dev]:
    """Every function of the node's simulated PCIe tree, in address order."""
    faults = faults or {}
    gpus = profile.get("gpus") or {}
    gen = int((gpus.get("pcie") or {}).get("gen", 4))
    nics = profile.get("nics") or {}
    card, nic_gen, device_id = ADAPTERS.get(str(nics.get("ca_type")), ADAPTERS["MT4129"])
    nic_class = (
        "Infiniband controller" if nics.get("link_layer") == "InfiniBand" else "Ethernet controller"
    )
    switches: dict[int, list[Dev]] = {}
    bus_ids = list(gpus.get("bus_ids") or [])
    for i, bus_id in enumerate(bus_ids):
        switch = int((gpus.get("pcie_switch") or list(range(len(bus_ids))))[i])
        numa = int((gpus.get("numa") or [0] * len(bus_ids))[i])
        dev = Dev(_bus(bus_id), 0, "gpu", gen, numa=numa, label=f"GPU{i}")
        dev.extra["device"] = str(gpus.get("device_id", "0x0000")).lower()[2:6]
        switches.setdefault(switch, []).append(dev)
    used = {d.bus for devs in switches.values() for d in devs}
    degraded = faults.get("nic_pcie_degraded") or {}
    for port in nics.get("ports") or []:
        devs = switches.setdefault(int(port.get("pcie_switch", 0)), [])
        bus = max((d.bus for d in devs), default=0x20 + 0x10 * len(switches)) + 1
        while bus in used:
            bus += 1
        used.add(bus)
        nic = Dev(bus, 0, "nic", nic_gen, numa=int(port.get("numa", 0)), name=card)
        nic.label = str(port["name"])
        nic.extra["class"] = nic_class
        nic.extra["device"] = device_id
        if nic.label in degraded:
            width, down = degraded[nic.label]["width"], degraded[nic.label]["gen"]
            nic.status = (down or nic_gen, width)
        devs.append(nic)
    acs_gpus = set(faults.get("pcie_acs") or ())
    out: list[Dev] = []
    root_slot = 1
    for switch in sorted(switches):
        devs = sorted(switches[switch], key=lambda d: d.bus)
        low, high = devs[0].bus, devs[-1].bus
        if low < 3:  # no room for a switch: each device on a root port of its own
            for dev in devs:
                out.append(
                    Dev(0, root_slot, "root", gen, secondary=dev.bus, subordinate=dev.bus,
                        numa=dev.numa, name=_ROOT)
                )  # fmt: skip
                root_slot += 1
                out.append(dev)
            continue
        upstream_bus, internal = low - 2, low - 1
        out.append(
            Dev(0, root_slot, "root", gen, secondary=upstream_bus, subordinate=high,
                numa=devs[0].numa, name=_ROOT)
        )  # fmt: skip
        root_slot += 1
        name = _SWITCH.get(gen, _SWITCH[4])
        out.append(
            Dev(upstream_bus, 0, "upstream", gen, secondary=internal, subordinate=high,
                numa=devs[0].numa, name=name)
        )  # fmt: skip
        for slot, dev in enumerate(devs):
            port = Dev(internal, slot, "downstream", gen, secondary=dev.bus, subordinate=dev.bus,
                       numa=dev.numa, name=name)  # fmt: skip
            port.acs = dev.kind == "gpu" and int(dev.label[3:]) in acs_gpus
            if dev.status is not None:
                port.status = dev.status
            out += [port, dev]
    return sorted(out, key=lambda d: (d.bus, d.slot))


def _port_of(profile: Profile, gpu: int) -> Dev | None:
    """The port (root or switch downstream) the profile's GPU ``gpu`` is plugged into."""
    devs = tree(profile)
    target = next((d for d in devs if d.kind == "gpu" and d.label == f"GPU{gpu}"), None)
    if target is None:
        return None
    return next(
        (d for d in devs if d.kind in ("root", "downstream") and d.secondary == target.bus), None
    )


def port_above(profile: Profile, gpu: int) -> str:
    """The address of the port the profile's GPU ``gpu`` is plugged into."""
    port = _port_of(profile, gpu)
    if port is None:
        raise KeyError(f"no GPU {gpu} in the profile")
    return port.address


def has_switch_port(profile: Profile, gpu: int) -> bool:
    """Whether a PCIe switch's downstream port sits above the profile's GPU ``gpu``."""
    port = _port_of(profile, gpu)
    return port is not None and port.kind == "downstream"


# ------------------------------------------------------------------------------------------
# lspci -vvv


def _header(dev: Dev, domain: bool) -> str:
    address = dev.address if domain else dev.address[5:]
    if dev.kind in ("root", "upstream", "downstream"):
        return f"{address} PCI bridge: {dev.name} (prog-if 00 [Normal decode])"
    if dev.kind == "gpu":
        return f"{address} 3D controller: NVIDIA Corporation Device {dev.extra['device']} (rev a1)"
    return f"{address} {dev.extra['class']}: Mellanox Technologies {dev.name}"


def _block(dev: Dev, domain: bool, verbose: int) -> list[str]:
    lines = [_header(dev, domain)]
    if verbose == 0:
        return lines
    bridge = dev.kind in ("root", "upstream", "downstream")
    control = "I/O+ Mem+ BusMaster+" if bridge else "I/O- Mem+ BusMaster+"
    lines += [
        f"\tControl: {control} SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- "
        "DisINTx+",
        "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- "
        ">SERR- <PERR- INTx-",
        "\tLatency: 0",
    ]
    if not bridge:
        lines.append("\tInterrupt: pin A routed to IRQ 18")
    lines.append(f"\tNUMA node: {dev.numa}")
    if bridge:
        lines.append(
            f"\tBus: primary={dev.bus:02x}, secondary={dev.secondary:02x}, "
            f"subordinate={dev.subordinate:02x}, sec-latency=0"
        )
    if verbose < 2:
        return lines
    kind = {
        "root": "Root Port (Slot-)",
        "upstream": "Upstream Port",
        "downstream": "Downstream Port (Slot+)",
    }.get(dev.kind, "Endpoint")
    at = "40" if dev.kind == "root" else ("68" if bridge else "60")
    cap_gen, cap_width = dev.gen, dev.width
    sta_gen, sta_width = dev.status if dev.status is not None else (cap_gen, cap_width)
    speed_flag = "downgraded" if sta_gen < cap_gen else "ok"
    width_flag = "downgraded" if sta_width < cap_width else "ok"
    port = "#0" if dev.kind in ("gpu", "nic") else f"#{dev.slot}"
    aspm = "ASPM not supported" if dev.kind in ("root", "nic") else (
        "ASPM L0s L1, Exit Latency L0s <4us, L1 <32us"
    )  # fmt: skip
    lines += [
        f"\tCapabilities: [{at}] Express (v2) {kind}, MSI 00",
        f"\t\tLnkCap:\tPort {port}, Speed {GTS[cap_gen]}GT/s, Width x{cap_width}, {aspm}",
        "\t\t\tClockPM- Surprise- LLActRep- BwNot- ASPMOptComp+",
        f"\t\tLnkSta:\tSpeed {GTS[sta_gen]}GT/s ({speed_flag}), Width x{sta_width} ({width_flag})",
        "\t\t\tTrErr- Train- SlotClk+ DLActive+ BWMgmt- ABWMgmt-",
    ]
    if bridge:
        lines += [
            "\tCapabilities: [170 v1] Access Control Services",
            f"\t\tACSCap:\t{ACS_CAP}",
            f"\t\tACSCtl:\t{ACS_ON if dev.acs else ACS_OFF}",
        ]
    driver = {"gpu": "nvidia", "nic": "mlx5_core"}.get(dev.kind, "pcieport")
    lines.append(f"\tKernel driver in use: {driver}")
    if dev.kind in ("gpu", "nic"):
        lines.append(f"\tKernel modules: {driver}")
    return lines


def _ids(dev: Dev) -> tuple[str, str, str]:
    """(vendor, device, class) as lspci -d compares them."""
    if dev.kind == "gpu":
        return "10de", dev.extra["device"], "0302"
    if dev.kind == "nic":
        return "15b3", dev.extra["device"], "0207" if "Infiniband" in dev.extra["class"] else "0200"
    return ("8086", "352a", "0604") if dev.kind == "root" else ("1000", "c030", "0604")


def _matches(spec: str, ids: tuple[str, str, str]) -> bool:
    parts = spec.lower().split(":")
    return all(not want or want == have for want, have in zip(parts, ids, strict=False))


def lspci(profile: Profile, faults: Faults, args: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``lspci ARGS`` on a node of ``profile``."""
    verbose, domain, select = 0, False, ""
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-v", "-vv", "-vvv"):
            verbose = len(arg) - 1
        elif arg == "-D":
            domain = True
        elif arg == "-d" and rest:
            select = rest.pop(0)
        else:
            return 2, "", f"lspci: invalid option -- '{arg.lstrip('-')[:1]}'\n"
    blocks = []
    for dev in tree(profile, faults):
        if select and not _matches(select, _ids(dev)):
            continue
        lines = _block(dev, domain, verbose)
        blocks.append("\n".join(lines) + ("\n\n" if verbose else "\n"))
    return 0, "".join(blocks), ""

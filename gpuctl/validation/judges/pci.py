"""The PCIe tree between GPUs and NICs (``lspci -vvv``): ACS on the switch ports above them,
and each adapter's negotiated link against what it and its slot can do.

``pcie.acs``, one result per PCIe switch port (subject its address) above a GPU or an adapter
whose Access Control Services redirect peer-to-peer requests or completions (``ACSCtl:``
``ReqRedir+`` or ``CmpltRedir+``): FAIL. With redirection on, a GPU's reads of a peer GPU or a
NIC's GPUDirect RDMA to a GPU under the same switch go up to the root complex instead of across
the switch: bandwidth drops, or transfers hang where the IOMMU refuses them (NCCL's
troubleshooting guide, "PCI Access Control Services (ACS)": on bare metal, disable ACS). Root
ports are not judged (traffic between root ports crosses the root complex anyway). Where every
port is clean: one OK. Capabilities lspci could not read (not root): UNKNOWN.

``pcie.nic.link``, one result per adapter (function 0; subject its address): the negotiated
speed and width (``LnkSta``) against the lower of the adapter's own maximum (``LnkCap``) and
that of the port it is plugged into, so that a Gen4 card in a Gen5 slot is not called
degraded: below FAIL (an x8 link halves what a 400 Gb/s adapter can move), not shown UNKNOWN.
The GPUs' own links are judged from nvidia-smi (``gpu.pcie.width``, ``gpu.pcie.gen``).
"""

from __future__ import annotations

from gpuctl.validation.expect import NodeExpectation
from gpuctl.validation.judges.base import Evidence, finding, node_judge, record, usable_parse
from gpuctl.validation.numbers import to_int
from gpuctl.validation.parsers.nvsmi_gpu import smi_of
from gpuctl.validation.parsers.pci import Link, PciDevice, pci_devices_of
from gpuctl.validation.results import CheckResult, Verdict

BRIDGES, NICS = "lspci.bridges", "lspci.nics"
ACS_CHECK, NIC_LINK_CHECK = "pcie.acs", "pcie.nic.link"
SWITCH_PORTS = frozenset({"Upstream Port", "Downstream Port"})
REDIRECTS = ("ReqRedir", "CmpltRedir")
NIC_CLASSES = ("Ethernet controller", "Infiniband controller", "Network controller")


def bus_address(bus_id: str) -> str:
    """nvidia-smi's ``00000000:18:00.0`` as lspci -D prints it: ``0000:18:00.0``."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:]:0>4}:{rest}"


def adapters(devices: tuple[PciDevice, ...]) -> list[PciDevice]:
    """The network adapters' physical functions (virtual functions left out)."""
    return [
        d for d in devices if d.device_class in NIC_CLASSES and "Virtual Function" not in d.name
    ]


def _other(evidence: Evidence, kind: str) -> tuple[PciDevice, ...]:
    """The devices of the other lspci output, where it is usable (its own judge says why not)."""
    found = evidence.get(kind)
    parsed = found.parse_as(kind) if found is not None and found.failure() is None else None
    return record(parsed, pci_devices_of) if parsed is not None and parsed.recognised else ()


def _short(name: str) -> str:
    """A device's name without lspci's ``(prog-if ...)`` and ``(rev ..)`` tails."""
    return name.split(" (prog-if", 1)[0].split(" (rev ", 1)[0][:80]


def acs_findings(
    bridges: tuple[PciDevice, ...], endpoints: dict[str, str]
) -> tuple[list[tuple[PciDevice, list[str]]], int]:
    """The switch ports above ``endpoints`` (address -> label) that redirect peer-to-peer
    traffic, each with the endpoints below it; and how many switch ports are above any."""
    above: dict[str, list[str]] = {}
    by_address = {b.address: b for b in bridges}
    # PciDevice.below of each switch port with a bus range, the endpoint's address read once
    # per endpoint (not once per port) as below() reads it
    ranges = [
        (b.address, b.domain, b.secondary, b.subordinate)
        for b in bridges
        if b.port_type in SWITCH_PORTS and b.secondary is not None and b.subordinate is not None
    ]
    for address, label in endpoints.items():
        if not ranges:
            break
        domain, bus = address.split(":")[:2]
        number = to_int(f"0x{bus}", hex_prefix=True)
        if number is None:
            continue
        for at, bridge_domain, secondary, subordinate in ranges:
            if domain == bridge_domain and secondary <= number <= subordinate:
                above.setdefault(at, []).append(label)
    bad = [
        (by_address[a], labels)
        for a, labels in sorted(above.items())
        if any((by_address[a].acs_ctl or {}).get(flag) for flag in REDIRECTS)
    ]
    return bad, len(above)


@node_judge(BRIDGES)
def judge_pcie_acs(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    found = evidence.get(BRIDGES)
    if (
        found is not None
        and found.failure() is None
        and found.rc in (0, None)
        and not (found.text or "").strip()
    ):
        # lspci -d ::0604 ran and matched nothing: GPUs and adapters on the root bus (a VM)
        return [
            finding(
                exp,
                ACS_CHECK,
                Verdict.OK,
                "lspci lists no PCI bridge (-d ::0604 matched nothing): no switch port between "
                "the GPUs and NICs",
            )
        ]
    result, unknown = usable_parse(exp, evidence, [BRIDGES], ACS_CHECK)
    if result is None:
        return unknown
    out = list(unknown)
    bridges = record(result, pci_devices_of)
    if any(b.access_denied for b in bridges):
        return [
            *out,
            finding(
                exp,
                ACS_CHECK,
                Verdict.UNKNOWN,
                "lspci could not read the bridges' capabilities (<access denied>): run as root",
            ),
        ]
    endpoints: dict[str, str] = {}
    smi_result = None
    for kind in ("smi-xml", "smi-q"):  # what validation runs; what the benchmark carries
        smi = evidence.get(kind)
        if smi is not None and smi.failure() is None and smi_result is None:
            parsed = smi.parse_as(kind)
            smi_result = parsed if parsed.recognised else None
    if smi_result is not None:
        for index, gpu in enumerate(record(smi_result, smi_of).gpus):
            if gpu.pci_bus_id:
                endpoints[bus_address(gpu.pci_bus_id)] = f"GPU{index}"
    elif exp.gpu_count:
        out.append(
            finding(
                exp,
                ACS_CHECK,
                Verdict.UNKNOWN,
                "the GPUs' PCI addresses are not known (nvidia-smi -q -x not usable): the ports "
                "above them cannot be found",
            )
        )
    for nic in adapters(_other(evidence, NICS)):
        endpoints[nic.address] = f"NIC {nic.address}"
    bad, ports = acs_findings(bridges, endpoints)
    for bridge, labels in bad:
        on = " ".join(f"{flag}+" for flag in REDIRECTS if (bridge.acs_ctl or {}).get(flag))
        out.append(
            finding(
                exp,
                ACS_CHECK,
                Verdict.FAIL,
                f"{bridge.port_type} {bridge.address} ({_short(bridge.name)}) redirects "
                f"peer-to-peer traffic (ACSCtl {on}) above {', '.join(labels)}: GPU peer access "
                "and GPUDirect RDMA go through the root complex; disable ACS on bare metal "
                "(NCCL troubleshooting, PCI ACS)",
                subject=bridge.address,
            )
        )
    if not bad and not any(r.verdict is Verdict.UNKNOWN for r in out):
        what = f"{len(endpoints)} GPU(s) and NIC(s)"
        message = (
            f"no PCIe switch port above the {what}"
            if ports == 0
            else f"ACS redirection off on the {ports} PCIe switch port(s) above the {what}"
        )
        out.append(finding(exp, ACS_CHECK, Verdict.OK, message))
    return out


def _parent(bridges: tuple[PciDevice, ...], device: PciDevice) -> PciDevice | None:
    """The port ``device`` is plugged into: the bridge whose secondary bus is its bus."""
    for bridge in bridges:
        if bridge.secondary is not None and bridge.below(device.address):
            bus = device.address.split(":")[1]
            if f"{bridge.secondary:02x}" == bus:
                return bridge
    return None


def _lowest(*values: float | int | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _show(link: Link | None) -> str:
    if link is None:
        return "not shown"
    speed = f"{link.speed_gts:g} GT/s" if link.speed_gts is not None else "? GT/s"
    return f"x{link.width if link.width is not None else '?'} at {speed}"


@node_judge(NICS)
def judge_nic_links(exp: NodeExpectation, evidence: Evidence) -> list[CheckResult]:
    result, unknown = usable_parse(exp, evidence, [NICS], NIC_LINK_CHECK)
    if result is None:
        return unknown
    out = list(unknown)
    nics = [n for n in adapters(record(result, pci_devices_of)) if n.address.endswith(".0")]
    if not nics:
        return [
            *out,
            finding(
                exp,
                NIC_LINK_CHECK,
                Verdict.UNKNOWN,
                f"lspci shows no NVIDIA/Mellanox adapter; cluster.yml expects {len(exp.nics)}",
            ),
        ]
    bridges = _other(evidence, BRIDGES)
    for nic in nics:
        out.append(_nic_link(exp, nic, _parent(bridges, nic)))
    return out


def _nic_link(exp: NodeExpectation, nic: PciDevice, port: PciDevice | None) -> CheckResult:
    label = f"{nic.address} ({_short(nic.name)})"
    status, cap = nic.link_status, nic.link_cap
    if nic.access_denied or status is None or status.speed_gts is None or status.width is None:
        return finding(
            exp,
            NIC_LINK_CHECK,
            Verdict.UNKNOWN,
            f"{label}: lspci shows no negotiated link"
            + (" (not root?)" if nic.access_denied else ""),
            subject=nic.address,
        )
    port_cap = port.link_cap if port is not None else None
    speed = _lowest(cap.speed_gts if cap else None, port_cap.speed_gts if port_cap else None)
    width = _lowest(cap.width if cap else None, port_cap.width if port_cap else None)
    if speed is None or width is None:
        return finding(
            exp,
            NIC_LINK_CHECK,
            Verdict.UNKNOWN,
            f"{label}: link {_show(status)}, but its maximum is not shown",
            subject=nic.address,
        )
    most = Link(speed_gts=float(speed), width=int(width))
    whose = "the adapter's and its port's" if port_cap is not None else "the adapter's"
    ok = status.speed_gts >= speed and status.width >= width
    return finding(
        exp,
        NIC_LINK_CHECK,
        Verdict.OK if ok else Verdict.FAIL,
        f"{label}: link {_show(status)}"
        + (" = " if ok else ", below ")
        + f"{_show(most)} ({whose} maximum)"
        + ("" if ok else ": reseat the card or check the slot and riser"),
        subject=nic.address,
        measured=float(status.width),
        expected=float(width),
        unit="lanes",
    )

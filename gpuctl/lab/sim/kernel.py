"""Kernel log lines (``NVRM: Xid ...``) the faults leave behind, and ``dmesg`` around them.
Line formats follow tests/fixtures/kernel-xid. Standard library only.
"""

from __future__ import annotations

import time

from . import pci as sim_pci
from .common import Faults, Gpu, Profile, all_gpus, digest

_NODE = "lab"  # kernel lines carry no node name; only the pid numbers depend on it

_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3c_00000000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at physAddr 0x12bac1c3e0 partition 2, subpartition 1.",
    61: "Internal micro-controller breakpoint/warning (GPU-side issue)",
    62: "Internal micro-controller halt (GPU-side issue)",
    63: "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000012bac1c3e0)",
    74: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20802a02 0x8).",
}


def _line(gpu: Gpu, xid: int, pid: str = "'<unknown>'", name: str = "<unknown>") -> str:
    message = _MESSAGES.get(xid, "Unknown Xid")
    return f"NVRM: Xid (PCI:{gpu.short_pci.lower()}): {xid}, pid={pid}, name={name}, {message}"


# PCIe AER lines as Linux 5.x-6.8 prints them (drivers/pci/pcie/aer.c; the lab's Debian kernels
# are 6.1 and 6.12): the root port's "error received" line, then the device's event and its
# details, as in tests/fixtures/kernel-xid/dmesg-aer-mlx5-cx5-corrected-multiple-5.16.txt (each
# error name padded to 22 characters). Per severity: (the port's word, the event's words, the
# layer and agent, status, the error bit and name).
_AER = {
    "corrected": (
        "Corrected",
        "Corrected",
        "Physical Layer, (Receiver ID)",
        "00000001/0000e000",
        " 0",
        "RxErr",
    ),
    "nonfatal": (
        "Uncorrected (Non-Fatal)",
        "Uncorrected (Non-Fatal)",
        "Transaction Layer, (Requester ID)",
        "00004000/00000000",
        "14",
        "CmpltTO",
    ),
    "fatal": (
        "Uncorrected (Fatal)",
        "Uncorrected (Fatal)",
        "Transaction Layer, (Receiver ID)",
        "00040000/00000000",
        "18",
        "MalfTLP",
    ),
}


def _aer_lines(profile: Profile, gpu: Gpu, severity: str) -> list[str]:
    received, words, where, status, bit, name = _AER[severity]
    domain, bus, rest = gpu.bus_id.split(":")
    device = f"{domain[-4:]}:{bus}:{rest}".lower()
    port = sim_pci.port_above(profile, gpu.physical)  # the switch or root port above it
    ids = f"10de:{str(profile['gpus']['device_id']).lower()[2:6]}"
    return [
        f"pcieport {port}: AER: {received} error received: {device}",
        f"nvidia {device}: PCIe Bus Error: severity={words}, type={where}",
        f"nvidia {device}:   device [{ids}] error status/mask={status}",
        f"nvidia {device}:    [{bit}] {name:<22} (First)",
    ]


def kernel_log_lines(profile: Profile, faults: Faults, node: str = _NODE) -> list[str]:
    """The ``NVRM: Xid`` lines these faults put in the kernel log, oldest first."""
    gpus = {gpu.physical: gpu for gpu in all_gpus(profile, node)}
    lines: list[str] = []
    ecc = faults.get("ecc")
    if ecc and ecc["gpu"] in gpus:
        lines.append(_line(gpus[ecc["gpu"]], 48))
        lines.append(_line(gpus[ecc["gpu"]], 63))
    nvlink = faults.get("nvlink_degraded")
    if nvlink:
        for index in nvlink["gpus"]:
            if index in gpus:
                lines.append(_line(gpus[index], 74))
    for event in faults.get("xid") or ():
        if event["gpu"] in gpus:
            pid = str(1000 + digest(node, "xid-pid", event["xid"]) % 3_000_000)
            lines.append(_line(gpus[event["gpu"]], int(event["xid"]), pid, "python3"))
    for index in faults.get("gpu_lost") or ():
        if index in gpus:
            lines.append(_line(gpus[index], 79))
    aer = faults.get("pcie_aer")
    if aer and aer["gpu"] in gpus:
        lines += _aer_lines(profile, gpus[aer["gpu"]], aer["severity"])
    return lines


def dmesg(
    profile: Profile, faults: Faults, node: str, *, iso: bool = False, now: float | None = None
) -> str:
    """A short boot log, the fault lines last (``dmesg``, ``dmesg --time-format iso``)."""
    boot = [
        "Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14)"
        " 12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1",
        f"nvidia-nvlink: Nvlink Core is being initialized, major device number {237}",
        f"NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  {profile['driver_version']}  "
        "Release Build  (dvs-builder@U16-I3-B13-4-1)  Tue Feb 25 00:00:00 UTC 2025",
        "nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64  "
        f"{profile['driver_version']}  Release Build  (dvs-builder@U16-I3-B13-4-1)",
    ]
    messages = boot + kernel_log_lines(profile, faults, node)
    started = (now if now is not None else time.time()) - 3600.0
    out = []
    for i, message in enumerate(messages):
        offset = 1.5 + i * 7.25 if i < len(boot) else 1800.0 + i * 0.01
        if iso:
            stamp = started + offset
            whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp))
            out.append(f"{whole},{int((stamp % 1) * 1e6):06d}+00:00 {message}")
        else:
            out.append(f"[{offset:12.6f}] {message}")
    return "\n".join(out) + "\n"

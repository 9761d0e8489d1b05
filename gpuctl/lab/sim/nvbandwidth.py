"""SIMULATED nvbandwidth: the copy bandwidth between the host and each simulated GPU.

The stand-in of the nvbandwidth that DCGM 4 installs with its CUDA package
(/usr/libexec/datacenter-gpu-manager-4/plugins/cuda<major>/nvbandwidth), printing
NVIDIA/nvbandwidth v0.8's plain-text layout (output.cpp, inline_common.h; real captures in
tests/fixtures/nvbandwidth/): the version block, the host name, ``Device N: NAME
(dddddddd:bb:dd)``, then per testcase ``Running <name>.``, the description, a header of
``setw(10)`` GPU columns after two blanks, the CPU row (``setw(2)`` label, ``setw(10)`` values
with two decimals), a blank line, ``SUM <name> <total>`` and a blank line; the NOTE block last.
Only ``-t host_to_device_memcpy_ce``, ``-t device_to_host_memcpy_ce``,
``-t device_to_device_memcpy_read_ce`` and ``-t device_to_device_memcpy_write_ce`` (what gpuctl
runs) are simulated; the device-to-device ones only on profiles with NVLink numbers.

What a GPU copies: what a real x16 link of its generation copied in a real capture, scaled by
the link width it trained to (the ``pcie_degraded`` fault lowers width and generation, as
nvidia-smi shows it), times ``pcie_copy_slow`` (a GPU whose copies are slow with its link at
full width) and ``slow_node``:

- Gen3 x16: 12.33 (H2D), 13.14 (D2H) GB/s: 4x Tesla T4 (sadcup/nvbandwidth results/, v0.8),
- Gen4 x16: 25.13 (H2D, A100-SXM4-40GB, NVIDIA/nvbandwidth#42), 26.77 (D2H, RTX 4090,
  NVIDIA/nvbandwidth#15),
- Gen5 x16: 56.35, 57.33 GB/s: 8x RTX 5090 (tinygrad/open-gpu-kernel-modules#29).

GPU <-> GPU copies (device_to_device_*_ce, v0.8's matrix: N/A on the diagonal): the profile's
``expected`` read and write figures from a real 8-GPU matrix of the model (H100: 395.1 / 397.5
GB/s, an 8x H100 v0.10 run; A100: 276.3, the 8-GPU write_ce of NVIDIA/nvbandwidth's README, its
model not stated), times ``p2p_slow`` for every pair of that GPU, the share of links
``nvlink_degraded`` leaves up between its two GPUs, and ``slow_node``.

Standard library only, relative imports only (runs inside lab nodes).
"""

from __future__ import annotations

from typing import Any

from .common import Faults, Gpu, Profile, pcie_link, visible_gpus

H2D, D2H = "host_to_device_memcpy_ce", "device_to_host_memcpy_ce"
D2D_READ, D2D_WRITE = "device_to_device_memcpy_read_ce", "device_to_device_memcpy_write_ce"
_DESCRIPTION = {
    H2D: "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
    D2H: "memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)",
    D2D_READ: "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)",
    D2D_WRITE: "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)",
}
# GPU <-> GPU copies over NVSwitch: the profile's expected nvbandwidth_d2d_read_gbs /
# nvbandwidth_d2d_write_gbs (a real 8-GPU matrix of the model), per pair
_D2D_KEY = {D2D_READ: "nvbandwidth_d2d_read_gbs", D2D_WRITE: "nvbandwidth_d2d_write_gbs"}
# the few hundredths real pairs differ by (the H100 v0.10 matrix: 395.05 to 395.25)
_PAIR_SPREAD = (0.0, 0.04, 0.1, -0.03, 0.06, 0.11, 0.0, 0.1, 0.15)
# GB/s of a x16 link per generation and direction, from the real captures named above
_X16_GBS: dict[int, dict[str, float]] = {
    3: {H2D: 12.33, D2H: 13.14},
    4: {H2D: 25.13, D2H: 26.77},
    5: {H2D: 56.35, D2H: 57.33},
}
# the few hundredths real GPUs of one node differ by (the T4 capture: 12.30 to 12.35)
_SPREAD = (0.0, 0.02, -0.03, 0.01, -0.01, 0.03, -0.02, 0.0)
VERSION = "v0.8"
_USAGE = "nvbandwidth CLI:\n  -t [ --testcase ] arg  Testcase(s) to run (by name or index)\n"


class NvbandwidthError(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _gbs(profile: Profile, faults: Faults, gpu: Gpu, testcase: str) -> float:
    gen, _gen_max, width, _width_max = pcie_link(profile, faults, gpu)
    per_gen = _X16_GBS.get(gen) or _X16_GBS[max(_X16_GBS)]
    value = per_gen[testcase] * width / 16
    slow: dict[str, Any] = faults.get("pcie_copy_slow") or {}
    if slow and int(slow["gpu"]) == gpu.physical:
        value *= float(slow["factor"])
    value *= float(faults.get("slow_node") or 1.0)
    return max(0.01, value + _SPREAD[gpu.physical % len(_SPREAD)])


def _pair_gbs(profile: Profile, faults: Faults, row: Gpu, peer: Gpu, testcase: str) -> float:
    value = float(profile["expected"][_D2D_KEY[testcase]])
    slow: dict[str, Any] = faults.get("p2p_slow") or {}
    if slow and int(slow["gpu"]) in (row.physical, peer.physical):
        value *= float(slow["factor"])
    degraded: dict[str, Any] = faults.get("nvlink_degraded") or {}
    if degraded and {row.physical, peer.physical} == set(degraded["gpus"]):
        links = int((profile["gpus"].get("nvlink") or {}).get("links") or 1)
        value *= max(0, links - int(degraded["links_down"])) / links
    value *= float(faults.get("slow_node") or 1.0)
    return max(0.01, value + _PAIR_SPREAD[(row.physical * 3 + peer.physical) % len(_PAIR_SPREAD)])


def _cuda_version(profile: Profile) -> str:
    major, _, minor = str(profile.get("cuda_version") or "12.8").partition(".")
    return f"{int(major) * 1000 + int(minor or 0) * 10}"


def output(profile: Profile, faults: Faults, node: str, testcases: list[str]) -> str:
    gpus = visible_gpus(profile, faults, node)
    cuda = _cuda_version(profile)
    lines = [
        f"nvbandwidth Version: {VERSION}",
        f"Built from Git version: {VERSION}",
        "",
        f"CUDA Runtime Version: {cuda}",
        f"CUDA Driver Version: {cuda}",
        f"Driver Version: {profile['driver_version']}",
        "",
        node,  # v0.8 prints the host name; a lab node's is its name
    ]
    for gpu in gpus:
        domain, bus, dev = gpu.bus_id.split(".", 1)[0].split(":")
        lines.append(
            f"Device {gpu.index}: {gpu.name} ({int(domain, 16):08x}:{int(bus, 16):02x}:"
            f"{int(dev, 16):02x})"
        )
    lines.append("")
    for testcase in testcases:
        if testcase in _D2D_KEY:
            # no NVLink figure (a PCIe profile): v0.8 waives it, naming nothing
            known = _D2D_KEY[testcase] in profile["expected"] and len(gpus) > 1
            lines += _matrix(profile, faults, gpus, testcase) if known else ["Waived: "]
            continue
        values = [_gbs(profile, faults, gpu, testcase) for gpu in gpus]
        lines += [
            f"Running {testcase}.",
            _DESCRIPTION[testcase],
            "  " + "".join(f"{gpu.index:>10}" for gpu in gpus),
            f"{0:>2}" + "".join(f"{v:>10.2f}" for v in values),
            "",
            f"SUM {testcase} {sum(values):.2f}",
            "",
        ]
    lines += [
        "NOTE: The reported results may not reflect the full capabilities of the platform.",
        "Performance can vary with software drivers, hardware clocks, and system topology.",
        "",
    ]
    return "\n".join(lines) + "\n"


def _matrix(profile: Profile, faults: Faults, gpus: list[Gpu], testcase: str) -> list[str]:
    """A GPU x GPU testcase: v0.8 prints N/A on the diagonal and every row label setw(2)."""
    rows = []
    total = 0.0
    refused = int((faults.get("p2p_disabled") or {}).get("gpu", -1))  # no peer access
    for row in gpus:
        cells = []
        for peer in gpus:
            if peer.index == row.index or refused in (row.physical, peer.physical):
                cells.append(f"{'N/A':>10}")
                continue
            value = _pair_gbs(profile, faults, row, peer, testcase)
            total += round(value, 2)
            cells.append(f"{value:>10.2f}")
        rows.append(f"{row.index:>2}" + "".join(cells))
    return [
        f"Running {testcase}.",
        _DESCRIPTION[testcase],
        "  " + "".join(f"{gpu.index:>10}" for gpu in gpus),
        *rows,
        "",
        f"SUM {testcase} {total:.2f}",
        "",
    ]


def main(profile: Profile, faults: Faults, node: str, args: list[str]) -> str:
    """The output of ``nvbandwidth ARGS`` (raises NvbandwidthError for what is not simulated)."""
    testcases: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-t", "--testcase") and i + 1 < len(args):
            for name in args[i + 1].split(","):
                if name not in _DESCRIPTION:
                    raise NvbandwidthError(
                        f"gpuctl-lab-sim: nvbandwidth testcase {name!r} is not simulated "
                        f"(only {', '.join(_DESCRIPTION)})\n"
                    )
                testcases.append(name)
            i += 2
            continue
        raise NvbandwidthError(f"Error: unrecognised option '{arg}'\n{_USAGE}")
    if not testcases:
        raise NvbandwidthError(
            f"gpuctl-lab-sim: a full nvbandwidth run is not simulated; give -t {H2D} and/or "
            f"-t {D2H}\n"
        )
    return output(profile, faults, node, testcases)

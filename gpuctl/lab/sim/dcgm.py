"""``dcgmi diag -r N`` output for a simulated node (DCGM 3.3 text layout, as in
tests/fixtures/dcgm/dcgmi-diag-r2-pass-p4de-a100-dcgm333.txt and the r4 capture).
Standard library only.
"""

from __future__ import annotations

from .common import (
    Faults,
    Gpu,
    Profile,
    ecc_uncorrectable,
    fabric_ok,
    pcie_link,
    throttled,
    visible_gpus,
)

DCGM_VERSION = "3.3.9"
_TOP = "+---------------------------+------------------------------------------------+"
_WIDTH = 46  # text per row of the Result column; longer messages wrap mid-word as dcgmi does
_DEPLOYMENT = (
    "Denylist",
    "NVML Library",
    "CUDA Main Library",
    "Permissions and OS Blocks",
    "Persistence Mode",
    "Environment Variables",
    "Page Retirement/Row Remap",
    "Graphics Processes",
    "Inforom",
)
_LEVELS: dict[int, tuple[tuple[str, tuple[str, ...]], ...]] = {
    1: (),
    2: (("Integration", ("PCIe",)), ("Hardware", ("GPU Memory",))),
    3: (
        ("Integration", ("PCIe",)),
        ("Hardware", ("GPU Memory", "Diagnostic")),
        ("Stress", ("Targeted Stress", "Targeted Power", "Memory Bandwidth")),
    ),
    4: (
        ("Integration", ("PCIe",)),
        ("Hardware", ("GPU Memory", "Diagnostic", "Pulse Test")),
        ("Stress", ("Targeted Stress", "Targeted Power", "Memory Bandwidth", "Memtest")),
    ),
}


def _section(name: str, closed: bool) -> str:
    left = f"-----  {name}  "
    return f"{'+' if closed else '|'}{left:-<27}+{'-' * 48}{'+' if closed else '|'}"


def _row(name: str, text: str) -> list[str]:
    chunks = [text[i : i + _WIDTH - 1] for i in range(0, len(text), _WIDTH - 1)] or [""]
    first = f"| {name:<25} | {chunks[0]:<{_WIDTH}} |"
    return [first] + [f"| {'':<25} | {chunk:<{_WIDTH}} |" for chunk in chunks[1:]]


def _pcie_degraded(profile: Profile, faults: Faults, gpu: Gpu) -> bool:
    gen, gen_max, width, width_max = pcie_link(profile, faults, gpu)
    return gen < gen_max or width < width_max


def _gpus_text(indexes: list[int]) -> str:
    label = "GPU" if len(indexes) == 1 else "GPUs"
    return f"{label}: {', '.join(str(i) for i in indexes)}"


def diag(profile: Profile, faults: Faults, node: str, level: int) -> tuple[str, int]:
    """(output, exit status) of ``dcgmi diag -r level``."""
    gpus = visible_gpus(profile, faults, node)
    device_id = profile["gpus"]["device_id"].lower()[2:6]
    lines = [
        "Successfully ran diagnostic for group.",
        _TOP,
        "| Diagnostic                | Result                                         |",
        "+===========================+================================================+",
        _section("Metadata", closed=False),
        *_row("DCGM Version", DCGM_VERSION),
        *_row("Driver Version Detected", str(profile["driver_version"])),
        *_row("GPU Device IDs Detected", ",".join(device_id for _ in gpus)),
        _section("Deployment", closed=False),
    ]
    failed = False
    ecc_gpus = [g.index for g in gpus if ecc_uncorrectable(faults, g)]
    for test in _DEPLOYMENT:
        if test == "CUDA Main Library" and not fabric_ok(profile, faults):
            lines += _row(test, "Fail")
            lines += _row("Error", "CUDA initialization failed: system not yet initialized")
            lines.append(_TOP)
            return "\n".join(lines) + "\n", 226
        if test == "Page Retirement/Row Remap" and ecc_gpus:
            lines += _row(
                "Error",
                f"GPU {ecc_gpus[0]} has uncorrectable memory errors and row remappings are pending",
            )
            lines.append(_TOP)
            return "\n".join(lines) + "\n", 226
        lines += _row(test, "Pass")
    for category, tests in _LEVELS.get(level, _LEVELS[4]):
        lines.append(_section(category, closed=True))
        for test in tests:
            bad: list[int] = []
            if test == "PCIe":
                bad = [g.index for g in gpus if _pcie_degraded(profile, faults, g)]
            elif test in ("Targeted Power", "Diagnostic"):
                bad = [g.index for g in gpus if throttled(faults, g)]
            if not bad:
                lines += _row(test, "Pass - All")
                continue
            failed = True
            good = [g.index for g in gpus if g.index not in bad]
            if good:
                lines += _row(test, f"Pass - {_gpus_text(good)}")
                lines += _row("", f"Fail - {_gpus_text(bad)}")
            else:
                lines += _row(test, "Fail - All")
            if test == "PCIe":
                message = (
                    f"GPU {bad[0]} PCIe link is running below its maximum generation or width: "
                    "check the slot and the riser."
                )
            else:
                message = (
                    f"GPU {bad[0]} Clocks are being throttled for HW Slowdown. Verify that the "
                    "cooling and the power supply of this machine are functional."
                )
            lines += _row("Warning", message)
    lines.append(_TOP)
    return "\n".join(lines) + "\n", 226 if failed else 0

"""``dcgmi diag -r N`` output for a simulated node, in the layout of the DCGM the lab installs
(4.4.1, gpuctl/lab/repo_packages.yml). Standard library only.

The layout is DCGM 4's (NVIDIA/DCGM dcgmi/Diag.cpp at v4.4.1, HelperDisplayAsCli), as real
4.x captures in tests/fixtures/dcgm show it (dcgmi-diag-r2-pcie-fail-internal-error-b200-
dcgm441, dcgmi-diag-r2-pass-1gpu-2237-dcgm442, dcgmi-diag-r3-pass-4gpu-25b6-dcgm400-docs):
lower-case test names, one ``GPUn: Pass|Fail|Skip`` row per GPU under each test, a per-GPU
error as a ``Warning: GPUn`` row after that GPU's row, a test-wide error as a ``Warning`` row
after the test's own row. Messages are DCGM's format strings (dcgmlib/dcgm_errors.h) followed
by their next steps, cut every 45 characters. After a failed test DCGM skips the rest (nvvs
TestFramework: the skipped tests show ``Skip`` and no GPU rows). Exit status: 0, or 226
(DCGM_ST_NVVS_ERROR, -30) when a test reported an error.
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

DCGM_VERSION = "4.4.1"
NVVS_ERROR_RC = 226  # DCGM_ST_NVVS_ERROR (-30) as an exit status
_TOP = "+---------------------------+------------------------------------------------+"
_WIDTH = 46  # the Result cell; messages wrap every 45 characters, as dcgmi's DisplayVerboseInfo
_CHUNK = 45
_SYSTEM_TRIAGE = (
    "Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
)
_CONFIG = (
    "Check DCGM and system configuration. This error may be eliminated with an updated "
    "configuration."
)
# (category, section line, tests) in dcgmi's order; the tests of each run level as
# nvvs/src/NvidiaValidationSuite.cpp (FillTestVectors, v4.4.1) lists them for a non-root nvvs
# (the nvidia-dcgm service account: no eud/cpu_eud).
_SECTIONS = ("Deployment", "Hardware", "Integration", "Stress")  # dcgmi's order
_TESTS: dict[str, tuple[tuple[int, str], ...]] = {
    "Deployment": ((1, "software"),),
    "Hardware": (
        (2, "memory"),
        (3, "diagnostic"),
        (3, "nvbandwidth"),
        (4, "memtest"),
        (4, "pulse_test"),
    ),
    "Integration": ((2, "pcie"),),
    "Stress": ((3, "memory_bandwidth"), (3, "targeted_stress"), (3, "targeted_power")),
}


def _section(name: str) -> str:
    """``|-----  Deployment  ---...|`` (Metadata, Deployment) or ``+-----  Hardware  ---...+``."""
    edge = "|" if name in ("Metadata", "Deployment") else "+"
    return f"{edge}{f'-----  {name}  ':-<27}+{'-' * 48}{edge}"


def _row(name: str, text: str) -> list[str]:
    """One row of the stencil (``| <name, 25> | <text, 46> |``)."""
    return [f"| {name:<25} | {text:<{_WIDTH}} |"]


def _message(name: str, text: str) -> list[str]:
    """A Warning/Info row: dcgmi cuts the text every 45 characters (DisplayVerboseInfo), the
    name only on the first line."""
    chunks = [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK)] or [""]
    return [line for i, chunk in enumerate(chunks) for line in _row("" if i else name, chunk)]


def _gpu_errors(profile: Profile, faults: Faults, gpus: list[Gpu], test: str) -> dict[int, str]:
    """DCGM's message per failing GPU (by the index dcgmi prints) for one test."""
    out: dict[int, str] = {}
    for gpu in gpus:
        message: str | None = None
        if test == "software" and ecc_uncorrectable(faults, gpu):
            # Software::checkRowRemapping -> DCGM_FR_PENDING_ROW_REMAP
            message = (
                f"GPU {gpu.index} had memory errors and row remappings are pending {_SYSTEM_TRIAGE}"
            )
        elif test == "pcie":
            gen, gen_max, width, width_max = pcie_link(profile, faults, gpu)
            if width < width_max:  # PcieMain.cpp -> DCGM_FR_PCIE_WIDTH (its wording)
                message = (
                    f"GPU {gpu.index} is running at PCI link width {width}X, which is below the "
                    f"minimum allowed link generation of {width_max} (parameter "
                    f"'min_pci_width') {_CONFIG}"
                )
            elif gen < gen_max:  # DCGM_FR_PCIE_GENERATION
                message = (
                    f"GPU {gpu.index} is running at PCI link generation {gen}, which is below "
                    f"the minimum allowed link generation of {gen_max} (parameter "
                    f"'min_pci_generation') {_CONFIG}"
                )
        elif test in ("diagnostic", "targeted_power") and throttled(faults, gpu):
            # DCGM_FR_CLOCKS_EVENT_VIOLATION with no details
            message = (
                f"Clocks event for GPU {gpu.index} because of clocks event starting 2.0 seconds "
                f"into the test.  {_SYSTEM_TRIAGE}"
            )
        if message is not None:
            out[gpu.index] = message
    return out


def _global_errors(profile: Profile, faults: Faults, gpus: list[Gpu], test: str) -> list[str]:
    """Test-wide errors (no GPU of their own): Fabric Manager not done training, one per GPU
    (Software::LogAndSetFMError -> DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR)."""
    if test != "software" or fabric_ok(profile, faults):
        return []
    return [
        "Fabric Manager (Cluster UUID: 00000000-0000-0000-0000-000000000000, Clique ID: 0): "
        "training in progress."
    ] * len(gpus)


# the tests ``dcgmi diag -r <name>`` runs on its own (the burn loop's); DCGM's default
# test_duration of targeted_power (DCGM user guide; targeted_stress's own default is shorter)
STRESS_TESTS = ("targeted_stress", "targeted_power")
DEFAULT_DURATION_S = 120


def diag(
    profile: Profile, faults: Faults, node: str, level: int, only: str | None = None
) -> tuple[str, int]:
    """(output, exit status) of ``dcgmi diag -r level``, or of ``-r <only>`` (that test alone)."""
    gpus = visible_gpus(profile, faults, node)
    device_id = profile["gpus"]["device_id"].lower()[2:6]
    lines = [
        "Successfully ran diagnostic for group.",
        _TOP,
        "| Diagnostic                | Result                                         |",
        "+===========================+================================================+",
        _section("Metadata"),
        *_row("DCGM Version", DCGM_VERSION),
        *_row("Driver Version Detected", str(profile["driver_version"])),
        *_row("GPU Device IDs Detected", ", ".join(device_id for _ in gpus)),
    ]
    failed = False
    for category in _SECTIONS:
        tests = [name for lvl, name in _TESTS[category] if (name == only if only else lvl <= level)]
        if not tests:
            continue
        lines.append(_section(category))
        for test in tests:
            if failed:  # nvvs skips the remaining tests after a failure
                lines += _row(test, "Skip")
                continue
            per_gpu = _gpu_errors(profile, faults, gpus, test)
            wide = _global_errors(profile, faults, gpus, test)
            fail = bool(per_gpu or wide)
            lines += _row(test, "Fail" if fail else "Pass")
            for message in wide:
                lines += _message("Warning", message)
            for gpu in gpus:
                bad = bool(wide) or gpu.index in per_gpu
                lines += _row("", f"GPU{gpu.index}: {'Fail' if bad else 'Pass'}")
                if gpu.index in per_gpu:
                    lines += _message(f"Warning: GPU{gpu.index}", per_gpu[gpu.index])
            failed = failed or fail
    lines.append(_TOP)
    return "\n".join(lines) + "\n", NVVS_ERROR_RC if failed else 0

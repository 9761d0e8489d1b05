"""nvidia-smi across driver branches, R470 to R610: the versions, power limits and judged
fields read from every layout, and the lab's stand-in printing the layout of its branch.

From the 610 branch on (610.43.02, 610.57.04, 610.62 captured; 595.80 is the last 59x seen
with the old labels) nvidia-smi prints ``KMD Version`` and ``CUDA UMD Version``; ``-q`` keeps
``Driver Version``/``CUDA Version`` with a ``[Deprecated; will be removed in CUDA 14.0. Use
... instead]`` note after the value, the table header shows only the new labels, and the GPU
power limits move into a ``GPU Ceiling Power Limit`` sub-section.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from helpers import ROOT

from gpuctl.config.loader import load_cluster
from gpuctl.lab.sim import nvsmi_xml, profiles
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.gpus import judge_gpus
from gpuctl.validation.parsers.nvsmi_tree import read_num, read_text
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import Verdict

FIX = ROOT / "tests" / "fixtures" / "nvidia-smi"
Q610 = "nvsmi-q-full-rtx2080s-1gpu-610-idle.txt"
NOTE = "[Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]"


def text(name: str) -> str:
    return capture_output(FIX / name)


# (fixture, kind, driver, CUDA, the GPU power limit shown in W or None)
GENERATIONS = [
    ("nvsmi-q-full-gtx680-1gpu-470.txt", "smi-q", "470.256.02", "11.4", None),
    ("nvsmi-q-x-quadro-p2000-1gpu-525.txt", "smi-xml", "525.125.06", "12.0", 75.0),
    ("nvsmi-q-full-h100-8gpu-535.txt", "smi-q", "535.161.08", "12.2", 700.0),
    ("nvsmi-q-full-h100-nvl-2gpu.txt", "smi-q", "550.54.14", "12.4", 310.0),
    ("nvsmi-q-full-rtx3090-2gpu-560.txt", "smi-q", "560.35.03", "12.6", 350.0),
    ("nvsmi-q-full-h100-sxm-8gpu-565.txt", "smi-q", "565.57.01", "12.7", 700.0),
    ("nvsmi-q-full-rtx5090-1gpu-570.txt", "smi-q", "570.124.06", "12.8", 575.0),
    ("nvsmi-q-x-rtx3060-1gpu-570.txt", "smi-xml", "570.124.04", "12.8", 170.0),
    ("nvsmi-q-x-rtx-a5000-2gpu-590.txt", "smi-xml", "590.44.01", "13.1", 230.0),
    ("nvsmi-q-full-h200-1gpu-590.txt", "smi-q", "590.48.01", "13.1", 700.0),
    ("nvsmi-q-x-rtx3080-1gpu-595.txt", "smi-xml", "595.58.03", "13.2", 320.0),
    ("nvsmi-q-full-rtx2080s-1gpu-595-idle.txt", "smi-q", "595.71.05", "13.2", 250.0),
    (Q610, "smi-q", "610.57.04", "13.3", 250.0),
    ("nvsmi-q-full-rtx2080s-windows-610-wddm-idle.txt", "smi-q", "610.62", "13.3", 250.0),
]


@pytest.mark.parametrize(("name", "kind", "driver", "cuda", "limit"), GENERATIONS)
def test_every_branch_reads_its_versions_and_power_limit(
    name: str, kind: str, driver: str, cuda: str, limit: float | None
) -> None:
    result = parse(kind, text(name))
    assert result.recognised
    assert (result.data["driver_version"], result.data["cuda_version"]) == (driver, cuda)
    assert result.data["gpus"][0]["power"]["limit_w"] == limit
    assert not any("not understood" in p or "missing" in p for p in result.problems)


def test_610_q_reads_the_kmd_version_not_the_deprecation_note() -> None:
    """The old parser returned '610.57.04 [Deprecated; ...]' as the driver version and
    called the KMD Version / CUDA UMD Version lines 'not understood'."""
    result = parse("smi-q", text(Q610))
    assert result.problems == ()
    assert result.data["driver_version"] == "610.57.04"
    assert result.data["cuda_version"] == "13.3"


def test_610_power_limits_and_renamed_temperatures() -> None:
    """'Current/Requested/Default Power Limit' under 'GPU Ceiling Power Limit' and 'GPU Target
    Temperature Specification': the old parser read None for all four."""
    gpu = parse("smi-q", text(Q610)).data["gpus"][0]
    assert {k: gpu["power"][k] for k in ("limit_w", "requested_limit_w", "default_limit_w")} == {
        "limit_w": 250.0,
        "requested_limit_w": 250.0,
        "default_limit_w": 250.0,
    }
    assert (gpu["power"]["min_limit_w"], gpu["power"]["max_limit_w"]) == (105.0, 350.0)
    assert gpu["temperature"]["target_c"] == 84


def test_610_table_header_reads_kmd_and_cuda_umd_versions() -> None:
    """The old parser saw no header line (driver and CUDA None, two problems)."""
    result = parse("smi-table", text("nvsmi-default-rtx2080s-1gpu-610-idle.txt"))
    assert result.problems == ()
    data = result.data
    assert (data["smi_version"], data["driver_version"], data["cuda_version"]) == (
        "610.57.04",
        "610.57.04",
        "13.3",
    )


def test_a_deprecation_note_is_never_the_value_nor_a_number() -> None:
    assert read_text(f"610.57.04 {NOTE}") == "610.57.04"
    assert read_num(f"250.00 W {NOTE}") == 250.0
    assert read_num(NOTE) is None  # a note alone: no number is made up
    assert read_text("N/A [Deprecated; will be removed]") is None
    assert read_text("Requested functionality has been deprecated") is None
    # the same note inside the XML form (the 595 capture's driver_version given one)
    xml = text("nvsmi-q-x-rtx3080-1gpu-595.txt").replace(
        "<driver_version>595.58.03</driver_version>",
        f"<driver_version>595.58.03 {NOTE}</driver_version>",
    )
    assert parse("smi-xml", xml).data["driver_version"] == "595.58.03"


def test_the_driver_check_passes_a_610_node_at_its_version() -> None:
    """gpu.driver compared '610.57.04 [Deprecated; ...]' with '610.57.04' and failed."""
    base = expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]
    exp = dataclasses.replace(base, driver_version="610.57.04", gpu_count=1)
    results = judge_gpus(exp, {"smi-q": ProbeOutput("smi-q", text(Q610))})
    [driver] = [r for r in results if r.check == "gpu.driver"]
    assert (driver.verdict, driver.measured) == (Verdict.OK, "610.57.04")


def _children(xml: str) -> list[str]:
    first = xml[xml.index("\t<gpu id=") : xml.index("\t</gpu>")]
    return re.findall(r"^\t\t<([A-Za-z_]+)>", first, re.MULTILINE)


def test_the_lab_prints_the_xml_layout_of_its_r570_driver() -> None:
    """The lab installs 570.172.08: its nvidia-smi -q -x is the R570 (DTD v12) layout of the
    real 570.124.04 capture, not the 590 (v13) one it printed before."""
    profile = profiles.load("hgx-h100-ndr")
    assert profile["driver_version"] == "570.172.08"
    xml = nvsmi_xml.query_xml(profile, {}, "gpu001")
    real = text("nvsmi-q-x-rtx3060-1gpu-570.txt")
    assert xml.splitlines()[1] == real.splitlines()[1]  # nvsmi_device_v12.dtd
    assert _children(xml) == _children(real)
    for newer in ("<display_attached>", "<pdi>", "<channel_repair_pending>", "<edpp_multiplier>"):
        assert newer not in xml
    assert "<voltage>" in xml
    assert parse("smi-xml", xml).problems == ()


def test_a_590_profile_keeps_the_v13_layout() -> None:
    profile = profiles.load("hgx-h100-ndr")
    profile["driver_version"] = "590.48.01"
    xml = nvsmi_xml.query_xml(profile, {}, "gpu001")
    real = text("nvsmi-q-x-rtx-a5000-2gpu-590.txt")
    assert xml.splitlines()[:3] == real.splitlines()[:3]
    assert [t for t in _children(xml) if t != "gpu_reset_status"] == _children(real)

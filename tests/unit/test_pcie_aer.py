"""PCIe AER errors from the kernel log (issue 18, point 7): the parser reads every kernel's
wording on real captures, the judge fails uncorrectable errors and warns on corrected ones per
device, in the Xid window, and the lab's fault prints lines the parser reads back."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import kernel as sim_kernel
from gpuctl.lab.sim import profiles
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges.base import Evidence, ProbeOutput
from gpuctl.validation.judges.pcie import judge_pcie_aer
from gpuctl.validation.parsers.kernel import aer_severity, parse_xid
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "kernel-xid"


def h100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]


def judge(text: str, **kw: object) -> list[CheckResult]:
    return judge_pcie_aer(h100(), Evidence({"xid": ProbeOutput("xid", text)}, **kw))  # type: ignore[arg-type]


def fixture(name: str) -> str:
    return capture_output(FIX / name)


def aer(results: list[CheckResult]) -> dict[str | None, Verdict]:
    return {r.subject: r.verdict for r in results if r.check == "pcie.aer"}


@pytest.mark.parametrize(
    ("words", "severity"),
    [
        ("Corrected", "corrected"),
        ("Correctable", "corrected"),
        ("Uncorrected (Non-Fatal)", "nonfatal"),
        ("Uncorrectable (Non-Fatal)", "nonfatal"),
        ("Uncorrected (Fatal)", "fatal"),
        ("Uncorrectable (Fatal)", "fatal"),
        ("Informational", None),
    ],
)
def test_every_kernels_severity_words(words: str, severity: str | None) -> None:
    assert aer_severity(words) == severity


def test_a_fatal_error_on_a_gpus_root_port_fails_that_port() -> None:
    res = judge(fixture("dmesg-reltime-aer-fatal-cmpltto-sdes-rootport-nvidia.txt"))
    assert aer(res) == {"0000:00:03.0": Verdict.FAIL}
    [r] = res
    assert "uncorrectable (fatal)" in r.message
    assert "[8086:6f08]" in r.message
    assert "SDES, CmpltTO" in r.message


def test_a_non_fatal_error_fails_and_the_corrected_ones_beside_it_do_not_soften_it() -> None:
    res = judge(fixture("journal-aer-6x-uncorrectable-nonfatal-acsviol.txt"))
    assert aer(res) == {"0000:80:1b.4": Verdict.FAIL}
    assert "ACSViol" in res[0].message


def test_corrected_errors_warn_per_device_function() -> None:
    res = judge(fixture("dmesg-aer-mlx5-cx5-corrected-multiple-5.16.txt"))
    assert aer(res) == {"0000:01:00.0": Verdict.WARN, "0000:01:00.1": Verdict.WARN}
    assert all("mlx5_core" in r.message and "NonFatalErr" in r.message for r in res)


def test_a_corrected_then_a_fatal_error_on_one_port_is_one_failure_counting_both() -> None:
    res = judge(fixture("dmesg-aer-4x-id-corrected-then-fatal-surprise-down-xid79.txt"))
    [r] = [r for r in res if r.check == "pcie.aer"]
    assert (r.subject, r.verdict, r.measured) == ("0000:00:02.0", Verdict.FAIL, 2)
    assert "1 uncorrectable (fatal), 1 corrected" in r.message


def test_a_log_without_aer_lines_is_ok_and_a_log_that_is_none_is_unknown() -> None:
    clean = fixture("dmesg-iso-xid-48-63-94-dbe-row-remap.txt")
    assert [(r.check, r.verdict) for r in judge(clean)] == [("pcie.aer", Verdict.OK)]
    [r] = judge("dmesg: read kernel buffer failed: Operation not permitted\n")
    assert r.verdict is Verdict.UNKNOWN


def test_the_port_line_alone_counts_where_the_device_printed_no_details() -> None:
    # the kernel rate-limits the details; the root port's line still names the source
    text = (
        "2025-01-21T02:21:33+0000 gpu001 kernel: pcieport 0000:17:01.0: AER: Uncorrected "
        "(Non-Fatal) error received: 0000:18:00.0\n"
    )
    res = judge(text)
    assert aer(res) == {"0000:18:00.0": Verdict.FAIL}


def test_an_error_whose_severity_cannot_be_read_is_unknown_never_ok() -> None:
    text = (
        "kernel: nvidia 0000:18:00.0: PCIe Bus Error: severity=Informational, type=Physical "
        "Layer, (Receiver ID)\n"
    )
    assert parse_xid(text).problems
    assert aer(judge(text)) == {"0000:18:00.0": Verdict.UNKNOWN}


def test_errors_before_the_window_do_not_count_and_undated_ones_always_do() -> None:
    line = (
        "{} gpu001 kernel: nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, "
        "type=Physical Layer, (Receiver ID)\n"
    )
    old = line.format("2024-11-15T12:00:00+00:00")
    later = datetime(2024, 11, 20, tzinfo=UTC)
    assert aer(judge(old, now=later)) == {None: Verdict.OK}
    assert aer(judge(old, now=datetime(2024, 11, 15, 13, tzinfo=UTC))) == {
        "0000:18:00.0": Verdict.WARN
    }
    undated = fixture("dmesg-reltime-aer-fatal-cmpltto-sdes-rootport-nvidia.txt")
    assert aer(judge(undated, now=later)) == {"0000:00:03.0": Verdict.FAIL}


def test_without_a_trusted_clock_every_error_counts_and_nothing_is_ok() -> None:
    line = (
        "2024-11-15T12:00:00+00:00 gpu001 kernel: nvidia 0000:18:00.0: PCIe Bus Error: "
        "severity=Corrected, type=Physical Layer, (Receiver ID)\n"
    )
    later = datetime(2024, 11, 20, tzinfo=UTC)
    res = judge(line, now=later, clock_problem="the node's clock is 3 h off")
    assert aer(res) == {"0000:18:00.0": Verdict.WARN}
    assert [r.verdict for r in res if r.check == "pcie.aer.window"] == [Verdict.UNKNOWN]
    clean = judge("kernel: Linux version 6.1.0\n", now=later, clock_problem="clock")
    assert Verdict.OK not in [r.verdict for r in clean]


@pytest.mark.parametrize(
    ("severity", "verdict"),
    [("corrected", Verdict.WARN), ("nonfatal", Verdict.FAIL), ("fatal", Verdict.FAIL)],
)
def test_the_lab_fault_prints_lines_that_fail_the_named_gpu(
    severity: str, verdict: Verdict
) -> None:
    profile = profiles.load("hgx-h100-ndr")
    fault = sim_faults.apply({}, "pcie_aer", f"2:{severity}")
    lines = sim_kernel.kernel_log_lines(profile, fault, "gpu002")
    text = "".join(f"2026-12-07T02:00:00+0000 gpu002 kernel[41]: {line}\n" for line in lines)
    assert not parse_xid(text).problems
    gpu2 = str(profile["gpus"]["bus_ids"][2])[4:].lower()  # 00000000:3A:00.0 -> 0000:3a:00.0
    assert aer(judge(text)) == {gpu2: verdict}


def test_the_lab_fault_refuses_a_gpu_the_profile_lacks_and_an_unknown_severity() -> None:
    profile = profiles.load("hgx-h100-ndr")
    value = sim_faults.parse_value("pcie_aer", "9")
    assert "no GPU 9" in str(sim_faults.hardware_problem("pcie_aer", value, profile, "gpu002"))
    with pytest.raises(sim_faults.FaultError, match="severity"):
        sim_faults.parse_value("pcie_aer", "1:bad")


# ------------------------------------------------------------------------------------------
# The IOMMU mode the node booted with


def iommu(text: str, exp: NodeExpectation | None = None) -> list[CheckResult]:
    from gpuctl.validation.judges.pcie import judge_iommu

    return judge_iommu(exp or h100(), Evidence({"xid": ProbeOutput("xid", text)}))


def test_translated_dma_with_devices_in_iommu_groups_warns() -> None:
    [r] = iommu(fixture("dmesg-grep-iommu-translated-amd-vi-groups-5.4.txt"))
    assert (r.check, r.verdict, r.measured) == ("pcie.iommu", Verdict.WARN, 47)
    assert "iommu=pt" in r.message


def test_passthrough_and_no_active_iommu_are_ok() -> None:
    [r] = iommu(fixture("dmesg-grep-iommu-passthrough-cmdline-amd-vi-5.4.txt"))
    assert r.verdict is Verdict.OK
    assert "Passthrough (set via kernel command line)" in r.message
    [r] = iommu(fixture("dmesg-grep-iommu-translated-arm-smmu-no-groups.txt"))
    assert r.verdict is Verdict.OK
    assert "no device joined an IOMMU group" in r.message


def test_no_iommu_line_gives_no_result_and_a_lone_gpu_is_not_asked() -> None:
    assert iommu(fixture("dmesg-iso-xid-48-63-94-dbe-row-remap.txt")) == []
    lone = dataclasses.replace(h100(), gpu_count=1, nics=())
    assert iommu(fixture("dmesg-grep-iommu-translated-amd-vi-groups-5.4.txt"), lone) == []

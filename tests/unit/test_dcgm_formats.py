"""dcgmi diag in DCGM 3 and DCGM 4 layouts: per-GPU results, Skip rows, dcgmi's exit status.

The judge on every real capture of tests/fixtures/dcgm (verdicts written by reading each one),
per-GPU failures (DCGM 4's ``GPUn: Fail`` + ``Warning: GPUn``), skipped tests (required ->
UNKNOWN, not applicable -> listed in the summary), dcgmi's exit codes (226 with DCGM's own
sentence), and the lab's dcgmi stand-in at every fault, parsed and judged.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.lab.sim import dcgm as sim
from gpuctl.lab.sim import profiles
from gpuctl.lab.sim.faults import apply
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.dcgm import DCGMI_EXIT, REQUIRED, canonical, judge_dcgm
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "dcgm"
STANDARD, LONG = "standard", "long"  # dcgmi diag -r 2 / -r 3 (gpuctl/validation/probes.py)


def node(level: str = STANDARD) -> NodeExpectation:
    exp = expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]
    return dataclasses.replace(exp, level=level)


def judge(text: str | None, level: str = STANDARD, **kw: object) -> list[CheckResult]:
    output = ProbeOutput("dcgm-diag", text, **kw)  # type: ignore[arg-type]
    return judge_dcgm(node(level), {"dcgm-diag": output})


def fixture(name: str, level: str = STANDARD, **kw: object) -> list[CheckResult]:
    return judge(capture_output(FIX / name), level, **kw)


def by_subject(results: list[CheckResult]) -> dict[str | None, list[CheckResult]]:
    out: dict[str | None, list[CheckResult]] = {}
    for r in results:
        out.setdefault(r.subject, []).append(r)
    return out


def summary(results: list[CheckResult]) -> CheckResult:
    [one] = [
        r for r in results if r.check == "dcgm.diag" and r.subject is None and "-r " in r.message
    ]
    return one


def not_ok(results: list[CheckResult]) -> list[tuple[str, str | None]]:
    return [(r.verdict.name, r.subject) for r in results if r.verdict is not Verdict.OK]


# ------------------------------------------------------------------------------------------
# every capture, judged


def test_dcgm441_b200_pcie_fail_is_a_fail_with_dcgms_warning_and_not_incomplete() -> None:
    results = fixture("dcgmi-diag-r2-pcie-fail-internal-error-b200-dcgm441.txt", rc=226)
    assert not_ok(results) == [("FAIL", "pcie"), ("FAIL", None)]
    [pcie] = by_subject(results)["pcie"]
    assert pcie.message.startswith("pcie: Fail: There was an internal error during the test:")
    assert summary(results).message == "DCGM 4.4.1 dcgmi diag -r 2: 2 passed, 1 failed"
    # a complete table with a Fail row and exit 226 is judged, never "output incomplete"
    assert not any("incomplete" in r.message for r in results)


def test_dcgm423_cut_table_fails_on_pcie_and_says_it_is_incomplete() -> None:
    results = fixture("dcgmi-diag-r2-pcie-fail-4-warnings-26b9-dcgm423-cut.txt")
    assert ("FAIL", "pcie") in not_ok(results)
    incomplete = [r for r in results if "incomplete" in r.message]
    assert [r.verdict for r in incomplete] == [Verdict.UNKNOWN]
    assert "no closing border" in incomplete[0].message


def test_dcgm442_one_gpu_pass_is_ok_with_a_summary() -> None:
    results = fixture("dcgmi-diag-r2-pass-1gpu-2237-dcgm442.txt")
    assert {r.verdict for r in results} == {Verdict.OK}
    assert sorted(s for s in by_subject(results) if s) == ["memory", "pcie", "software"]
    assert summary(results).message == "DCGM 4.4.2 dcgmi diag -r 2: 3 passed"


def test_dcgm400_docs_r3_all_pass() -> None:
    results = fixture("dcgmi-diag-r3-pass-4gpu-25b6-dcgm400-docs.txt", LONG)
    assert {r.verdict for r in results} == {Verdict.OK}
    assert summary(results).message == "DCGM 4.0.0 dcgmi diag -r 3: 7 passed"


def test_dcgm339_eud_skip_is_listed_not_passed() -> None:
    results = fixture("dcgmi-diag-r3-pass-eud-skip-8gpu-2335-dcgm339.txt", LONG)
    assert {r.verdict for r in results} == {Verdict.OK}
    assert "EUD Test" not in by_subject(results)  # no OK of its own
    assert summary(results).message == (
        "DCGM 3.3.9 dcgmi diag -r 3: 15 passed; skipped, not required at -r 3: EUD Test"
    )


def test_dcgm339_blackwell_every_skip_of_a_required_test_is_unknown() -> None:
    results = fixture("dcgmi-diag-r3-all-skip-2bb5-dcgm339-two-tables.txt", LONG)
    unknown = {r.subject for r in results if r.verdict is Verdict.UNKNOWN}
    required = {"PCIe", "GPU Memory", "Targeted Stress", "Targeted Power", "Memory Bandwidth"}
    assert unknown == required | {"diagnostic"}  # -r 3's Diagnostic is not in the table at all
    skipped = [r for r in results if r.subject == "GPU Memory"]
    assert {r.message for r in skipped} == {
        "GPU Memory: skipped by DCGM (DCGM printed no reason; -v shows it); required at -r 3"
    }
    assert not any(r.verdict is Verdict.OK and r.subject in required for r in results)


def test_dcgm338_fail_early_cuinit_fails_every_gpu_and_the_rest_is_unknown() -> None:
    results = fixture("dcgmi-diag-r3-fail-early-gpu-memory-cuinit-h100-dcgm338.txt", LONG)
    fails = [r for r in results if r.verdict is Verdict.FAIL and r.subject]
    assert [r.subject for r in fails] == [f"GPU{i}/GPU Memory" for i in range(8)]
    assert "Unable to initialize CUDA library: 'system not yet initialized'" in fails[5].message
    assert fails[5].message.startswith("GPU Memory Fail on GPU5: GPU 5 Error using CUDA API")
    unknown = {r.subject for r in results if r.verdict is Verdict.UNKNOWN}
    assert unknown == {
        "PCIe", "Memory Bandwidth", "diagnostic", "targeted_stress", "targeted_power"
    }  # fmt: skip
    [bandwidth] = by_subject(results)["Memory Bandwidth"]
    assert "DCGM skips the remaining tests after a failure" in bandwidth.message
    assert summary(results).verdict is Verdict.FAIL


def test_dcgm3_deployment_error_is_a_fail_on_the_gpu_it_names() -> None:
    results = fixture("dcgmi-diag-r3-deployment-error-row-remap-pending-fragment.txt", LONG)
    [fail] = [r for r in results if r.verdict is Verdict.FAIL]
    assert fail.subject == "GPU3/software"
    assert fail.message == "GPU 3 has uncorrectable memory errors and row remappings are pending"


def test_an_error_under_a_passed_check_is_not_that_checks() -> None:
    """dcgmi 3.x prints a check's Error rows under its own failed row; an Error after a row
    that passed (as the lab's old stand-in printed) names its GPU, not the row above it."""
    text = (
        "+---------------------------+------------------------------------------------+\n"
        "| Diagnostic                | Result                                         |\n"
        "+===========================+================================================+\n"
        "|-----  Deployment  --------+------------------------------------------------|\n"
        "| Environment Variables     | Pass                                           |\n"
        "| Error                     | GPU 1 has uncorrectable memory errors and row  |\n"
        "|                           |  remappings are pending                        |\n"
        "+---------------------------+------------------------------------------------+\n"
    )
    results = judge(text, rc=226)
    assert ("FAIL", "GPU1/software") in not_ok(results)
    [env] = by_subject(results)["Environment Variables"]
    assert env.verdict is Verdict.OK
    assert "remappings" not in env.message


# ------------------------------------------------------------------------------------------
# skipped tests


def _dcgm4(*rows: tuple[str, str]) -> str:
    """A DCGM 4 table of ``(name, value)`` rows, as dcgmi's stencil prints them."""
    body = "".join(f"| {name:<25} | {value:<46} |\n" for name, value in rows)
    line = "+---------------------------+------------------------------------------------+\n"
    return (
        f"Successfully ran diagnostic for group.\n{line}"
        "| Diagnostic                | Result                                         |\n"
        "+===========================+================================================+\n"
        "|-----  Deployment  --------+------------------------------------------------|\n"
        "| software                  | Pass                                           |\n"
        "|                           | GPU0: Pass                                     |\n"
        "+-----  Hardware  ----------+------------------------------------------------+\n"
        f"{body}"
        "+-----  Integration  -------+------------------------------------------------+\n"
        "| pcie                      | Pass                                           |\n"
        f"|                           | GPU0: Pass                                     |\n{line}"
    )


def test_required_skip_is_unknown_with_dcgms_reason() -> None:
    # -v: DCGM's reason as an Info row (DCGM_FR_TEST_DISABLED "The %s test is skipped.")
    text = _dcgm4(("memory", "Skip"), ("Info", "The memory test is skipped."), ("", "GPU0: Skip"))
    results = judge(text)
    [memory] = by_subject(results)["memory"]
    assert memory.verdict is Verdict.UNKNOWN
    assert memory.message == (
        "memory: skipped by DCGM (The memory test is skipped.); required at -r 2"
    )
    assert summary(results).verdict is Verdict.OK  # the worst of the tests that ran


def test_skip_not_applicable_to_the_gpu_is_listed_in_the_summary_only() -> None:
    reason = "ECC Memory is not turned on or is unsupported. Skipping test."
    text = _dcgm4(("memory", "Skip"), ("", "GPU0: Skip"), ("Info: GPU0", reason))
    results = judge(text)
    assert "memory" not in by_subject(results)
    assert summary(results).message == (
        f"dcgmi diag -r 2: 2 passed; skipped, not applicable to this GPU: memory (DCGM: {reason})"
    )
    assert summary(results).verdict is Verdict.OK


def test_a_gpu_skipped_in_a_required_test_that_passed_elsewhere_is_unknown() -> None:
    text = _dcgm4(("memory", "Pass"), ("", "GPU0: Pass"), ("", "GPU1: Skip"))
    results = judge(text)
    assert ("UNKNOWN", "GPU1/memory") in not_ok(results)


def test_required_tests_per_level_follow_dcgms_run_levels() -> None:
    assert REQUIRED[1] == {"software"}
    assert REQUIRED[2] == {"software", "memory", "pcie"}
    assert REQUIRED[3] - REQUIRED[2] == {
        "diagnostic", "memory_bandwidth", "targeted_stress", "targeted_power"
    }  # fmt: skip
    assert canonical("GPU Memory", "Hardware") == "memory"
    assert canonical("Page Retirement/Row Remap", "Deployment") == "software"
    assert canonical("Fabric Manager", "Deployment") == "fabric_manager"
    assert canonical("Memory Bandwidth", "Stress") == "memory_bandwidth"


# ------------------------------------------------------------------------------------------
# dcgmi's exit status


def test_exit_226_with_dcgms_sentence_is_a_fail_on_that_gpu() -> None:
    sentence = "GPU 5 has uncorrectable memory errors and row remappings are pending"
    results = judge(f"Error: {sentence}\n", rc=226)
    [fail] = results
    assert (fail.verdict, fail.subject, fail.check) == (Verdict.FAIL, "GPU5", "dcgm.diag")
    assert fail.message.startswith(sentence)
    assert "DCGM_ST_NVVS_ERROR" in fail.message
    assert "output incomplete" not in fail.message


def test_exit_226_unable_to_complete_takes_dcgms_system_error_as_the_message() -> None:
    text = (
        "Error: Unable to complete diagnostic for group 2147483647. Return: (-30) DCGM GPU "
        "Diagnostic returned an error\nGPU 2 had memory errors and row remappings are pending\n"
    )
    [fail] = judge(text, rc=226)
    assert (fail.verdict, fail.subject) == (Verdict.FAIL, "GPU2")
    assert fail.message.startswith("GPU 2 had memory errors and row remappings are pending")


def test_exit_226_on_a_table_where_nothing_failed_is_still_dcgms_fail() -> None:
    results = fixture("dcgmi-diag-r2-pass-1gpu-2237-dcgm442.txt", rc=226)
    fails = [r for r in results if r.verdict is Verdict.FAIL]
    assert [f.message for f in fails] == [
        "dcgmi diag exit 226, DCGM_ST_NVVS_ERROR: the diagnostic ran and reported an error, "
        "though no test failed in its table"
    ]


def test_unknown_exit_without_a_table_stays_unknown_with_the_status_and_stderr() -> None:
    error = "dcgmi exited with 235 and printed nothing: Error: unable to connect to host engine"
    [res] = judge(None, rc=235, error=error)
    assert (res.verdict, res.check) == (Verdict.UNKNOWN, "dcgm")
    assert "235" in res.message
    assert "unable to connect to host engine" in res.message
    [res] = judge("Error: Unable to complete diagnostic. Return: (-21) : Host engine\n", rc=235)
    assert res.verdict is Verdict.UNKNOWN
    assert "DCGM_ST_CONNECTION_NOT_VALID" in res.message
    [res] = judge("something else entirely\n", rc=1)
    assert res.verdict is Verdict.UNKNOWN
    assert "exit 1, not a DCGM return code" in res.message


def test_exit_codes_are_256_plus_dcgms_negative_return_codes() -> None:
    # dcgmlib/dcgm_structs.h: DCGM_ST_NVVS_ERROR = -30, DCGM_ST_NVVS_ISOLATE_ERROR = -51,
    # DCGM_ST_CONNECTION_NOT_VALID = -21, DCGM_ST_GPU_IS_LOST = -18
    assert DCGMI_EXIT[256 - 30][0] == "DCGM_ST_NVVS_ERROR"
    assert DCGMI_EXIT[256 - 51][0] == "DCGM_ST_NVVS_ISOLATE_ERROR"
    assert DCGMI_EXIT[256 - 21][0] == "DCGM_ST_CONNECTION_NOT_VALID"
    assert DCGMI_EXIT[256 - 18][0] == "DCGM_ST_GPU_IS_LOST"
    assert {code for code, (_, _, fault) in DCGMI_EXIT.items() if fault} == {
        226, 205, 238, 237, 213
    }  # fmt: skip


# ------------------------------------------------------------------------------------------
# the lab's dcgmi (DCGM 4.4.1, the version the lab installs)

H100 = "hgx-h100-ndr"
# fault -> (the lowest -r level whose tests see it, the finding's subject)
FAULTS: dict[str, tuple[int, str] | None] = {
    "": None,
    "ecc=1:4": (1, "GPU1/software"),  # software's row-remap check runs at every level
    "pcie_degraded=2:8:4": (2, "GPU2/pcie"),
    "clocks_throttled=6": (3, "GPU6/diagnostic"),
    "fabricmanager_failed": (1, "GPU0/software"),
    "gpu_lost=3": None,
    "nvlink_degraded=0-1:4": None,
}


@pytest.mark.parametrize("level", [1, 2, 3, 4])
@pytest.mark.parametrize("assignment", list(FAULTS))
def test_lab_dcgmi_output_is_parsed_and_judged_at_every_fault(assignment: str, level: int) -> None:
    profile = profiles.load(H100)
    faults = apply({}, *assignment.split("=", 1)) if assignment else {}
    text, status = sim.diag(profile, faults, "gpu001", level)
    result = parse("dcgm-diag", text)
    assert result.recognised
    assert not result.problems
    data = result.data
    assert (data["version"], data["complete"]) == ("4.4.1", True)
    gpus = 7 if assignment == "gpu_lost=3" else 8
    assert len(data["gpu_device_ids"]) == gpus
    ran = [t for t in data["tests"] if t["result"] != "Skip"]
    assert all(len(t["gpus"]) == gpus for t in ran)  # one GPUn row per GPU
    assert all(line.startswith(("|", "+", "Successfully")) for line in text.splitlines())
    assert all(len(line) == 78 for line in text.splitlines()[1:])
    fault = FAULTS[assignment]
    expected = fault[1] if fault and level >= fault[0] else None
    assert status == (226 if expected else 0)
    if level in (2, 3):
        results = judge(text, STANDARD if level == 2 else LONG, rc=status)
        fails = {r.subject for r in results if r.verdict is Verdict.FAIL and r.subject}
        assert (expected in fails) if expected else not fails, fails
        assert not any("incomplete" in r.message for r in results)


def test_lab_dcgmi_prints_dcgm4_per_gpu_fail_rows() -> None:
    text, status = sim.diag(profiles.load(H100), apply({}, "ecc", "1:4"), "gpu001", 2)
    lines = text.splitlines()
    at = lines.index(
        "|                           | GPU1: Fail                                     |"
    )
    assert (
        lines[at + 1]
        == "| Warning: GPU1             | GPU 1 had memory errors and row remappings ar  |"
    )
    assert (
        lines[at - 2]
        == "| software                  | Fail                                           |"
    )
    assert "| memory                    | Skip                                           |" in lines
    [fail] = [r for r in judge(text, rc=status) if r.subject == "GPU1/software"]
    assert fail.message == (
        "software Fail on GPU1: GPU 1 had memory errors and row remappings are pending Check "
        "DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
    )

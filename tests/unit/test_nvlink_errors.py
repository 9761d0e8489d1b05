"""NVLink error counters (gpuctl issue 18, point 4): `nvidia-smi nvlink -e` read before and
after the GPU tests, growth judged (gpuctl/validation/judges/nvlink.py, data/counters.yml).

The readings are the real A100 capture (driver 535, every counter 0) and the same capture with
one count raised, as the second read of a link that erred under load would show it; then the
lab's simulator with the `nvlink_errors` fault on one node of three."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from test_collect import FakeConnector, Sim, fails_only, fault

from gpuctl.config import load_cluster
from gpuctl.validation.api import validate
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.nvlink import END, ERRORS, START, judge_nvlink_errors
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import CheckResult, Verdict

A100 = (
    ROOT / "tests/fixtures/nvidia-smi/nvlink-e-a100-sxm4-40gb-gpu0-12links-535-tabs-blank-lines.txt"
)
FIRST = capture_output(A100)


def _raised(text: str, link: int, counter: str, value: int) -> str:
    """``text`` with link ``link``'s ``counter`` line showing ``value``."""
    line = re.compile(rf"(Link {link}: {re.escape(counter)}: )\d+")
    changed, n = line.subn(rf"\g<1>{value}", text, count=1)
    assert n == 1, (link, counter)
    return changed


def _judge(cluster_yml: Path, start: str | None, end: str | None) -> list[CheckResult]:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    outputs = {
        kind: ProbeOutput(kind, text)
        for kind, text in ((START, start), (END, end))
        if text is not None
    }
    return [r for r in judge_nvlink_errors(exp, outputs) if r.check == ERRORS]


def test_no_growth_is_ok_counting_every_counter(cluster_yml: Path) -> None:
    [ok] = _judge(cluster_yml, FIRST, FIRST)
    assert (ok.verdict, ok.message) == (
        Verdict.OK,
        "none of 36 NVLink error counters grew during the GPU tests",
    )


@pytest.mark.parametrize(
    ("counter", "verdict"),
    [
        ("Replay Errors", Verdict.FAIL),
        ("Recovery Errors", Verdict.FAIL),
        ("CRC Errors", Verdict.WARN),
    ],
)
def test_growth_fails_replay_and_recovery_and_warns_crc(
    cluster_yml: Path, counter: str, verdict: Verdict
) -> None:
    [found] = _judge(cluster_yml, FIRST, _raised(FIRST, 5, counter, 40))
    assert found.verdict is verdict
    assert found.subject == "GPU0"
    assert found.message == f"grew during the GPU tests: link 5 {counter} +40 (0 -> 40)"


def test_lifetime_totals_are_not_judged_only_growth(cluster_yml: Path) -> None:
    old = _raised(FIRST, 2, "Replay Errors", 2353)  # errors from before this run
    [ok] = _judge(cluster_yml, old, old)
    assert ok.verdict is Verdict.OK


def test_what_cannot_be_compared_is_unknown_never_ok(cluster_yml: Path) -> None:
    saturated = _raised(FIRST, 0, "CRC Errors", 65535)
    [stuck] = _judge(cluster_yml, saturated, saturated)
    assert stuck.verdict is Verdict.UNKNOWN
    assert "at 65535 before, a counter that cannot grow" in stuck.message
    [down] = _judge(cluster_yml, _raised(FIRST, 1, "Replay Errors", 9), FIRST)
    assert down.verdict is Verdict.UNKNOWN
    assert "went down from 9 to 0" in down.message
    [missing] = _judge(cluster_yml, FIRST, None)
    assert (missing.verdict, missing.message) == (
        Verdict.UNKNOWN,
        "not collected (nvlink-errors.end)",
    )
    unreadable = _judge(cluster_yml, FIRST, "Failed to initialize NVML: Unknown Error\n")
    assert [r.verdict for r in unreadable] == [Verdict.UNKNOWN]
    other_gpu = FIRST.replace(
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-fde0a018",
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaaaaaa",
    )
    assert {r.verdict for r in _judge(cluster_yml, FIRST, other_gpu)} == {Verdict.UNKNOWN}


def test_the_parser_keeps_every_counter_name_and_refuses_what_is_no_count() -> None:
    data = parse("nvlink-errors", FIRST).data
    assert data["names"] == {
        "replay_errors": "Replay Errors",
        "recovery_errors": "Recovery Errors",
        "crc_errors": "CRC Errors",
    }
    na = parse("nvlink-errors", FIRST.replace("Link 3: CRC Errors: 0", "Link 3: CRC Errors: N/A"))
    assert na.recognised
    assert na.problems == ("GPU 0 link 3: CRC Errors: not a count: 'N/A'",)
    assert not parse("nvlink-errors", "").recognised
    assert not parse("nvlink-errors", "GPU 0: NVIDIA A100 (UUID: GPU-1)\n").recognised


# ------------------------------------------------------------------------------------------
# The lab's simulator: the `nvlink_errors` fault on gpu002 of three


def test_the_lab_fault_fails_exactly_that_node_on_nvlink_errors(
    cluster_yml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path / "state"))
    sim = Sim({"gpu002": fault("nvlink_errors", "3:5")})
    report = fails_only(cluster_yml, tmp_path / "b", sim.faults["gpu002"], ERRORS, "standard")
    node = next(n for n in report.nodes if n.node == "gpu002")
    fails = [c for c in node.checks if c.check == ERRORS and c.verdict is Verdict.FAIL]
    assert [c.subject for c in fails] == ["GPU3"]
    # 40 and 1 with each of the five nccl-tests runs (all_reduce, all_gather, reduce_scatter,
    # alltoall, sendrecv): every one loads the NVLinks
    assert "link 5 Replay Errors +200 (0 -> 200)" in fails[0].message
    assert "link 5 Recovery Errors +5 (0 -> 5)" in fails[0].message
    # quick reads no error counters: growth needs the GPU tests between two reads
    quick = validate(
        load_cluster(cluster_yml), level="quick", out=tmp_path / "q", connector=FakeConnector(sim)
    )
    assert not quick.failed


def test_crc_errors_at_dcgms_rate_or_faster_fail(cluster_yml: Path) -> None:
    """With the times gpuctl recorded for both reads, CRC growth of 100 per second or more over
    the longest the reads can be apart FAILs (DCGM's NVLink health watch); slower WARNs."""
    exp = expectations(load_cluster(cluster_yml))["gpu001"]

    def judged(grew: int) -> CheckResult:
        outputs = {
            START: ProbeOutput(START, FIRST, ran=(1_800_000_000.0, 1_800_000_000.5)),
            END: ProbeOutput(
                END, _raised(FIRST, 5, "CRC Errors", grew), ran=(1_800_000_009.5, 1_800_000_010.0)
            ),
        }
        [found] = [r for r in judge_nvlink_errors(exp, outputs) if r.check == ERRORS]
        return found

    fast = judged(1001)  # 10 s apart at most: 1,000 is 100 per second
    assert fast.verdict is Verdict.FAIL
    assert fast.message == (
        "grew during the GPU tests: link 5 CRC Errors +1001 (0 -> 1001), the most in 10.0 s "
        "below DCGM's 100 per second: 1000"
    )
    assert judged(1000).verdict is Verdict.WARN
    assert judged(40).verdict is Verdict.WARN


def test_errors_during_the_multinode_runs_of_long_are_seen(
    cluster_yml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second read comes last, after the multi-node runs (NCCL across nodes loads the
    NVLinks too): errors that grow only while srun runs fail the node at long."""
    from test_multinode import SlurmSim, per_gpu, run_long

    from gpuctl.lab.sim import nvsmi as sim_nvsmi
    from gpuctl.lab.sim import ranks as sim_ranks

    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path / "state"))
    per_gpu(cluster_yml)
    grows = fault("nvlink_errors", "3:5")

    class LoadsNvlinkAcrossNodes(SlurmSim):
        def __call__(self, node: str, argv: list[str]) -> Any:
            if argv[:1] == ["srun"]:  # the multi-node run loads gpu002's links
                opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
                if "gpu002" in sim_ranks.expand(opts["nodelist"]):
                    sim_nvsmi.nvlink_traffic(grows, "gpu002")
            return super().__call__(node, argv)

    res, _ = run_long(cluster_yml, LoadsNvlinkAcrossNodes())
    failed = {n.node: sorted({c.check for c in n.problems()}) for n in res.report.nodes if n.failed}
    assert failed == {"gpu002": [ERRORS]}
    meta = json.loads((res.bundle / "gpu002" / "meta.json").read_text())["probes"]
    assert meta[END]["sent_at"] > meta["nccl"]["received_at"]

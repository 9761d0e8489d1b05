"""InfiniBand port error counters (gpuctl issue 18, point 1): `perfquery -x -C <hca> -P 1`
read before the tests and after ib_write_bw between nodes, growth judged
(gpuctl/validation/judges/counters.py, data/counters.yml).

The readings are the real RHEL 7.5 `perfquery -x` capture (every counter 0) and the same
capture with one count raised, as the second read of a port that flapped would show it; then
the lab's simulator with the `ib_link_flaps` fault on one HCA of one node of three."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import ROOT
from test_collect import fails_only, fault

from gpuctl.config import load_cluster
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.counters import PORT_ERRORS, judge_ib_port_errors
from gpuctl.validation.results import CheckResult, Verdict

ZERO = capture_output(
    ROOT / "tests/fixtures/ib/counters/perfquery-x-rhel75-lid10-port1-all-zero.txt"
)


def _raised(text: str, counter: str, value: int) -> str:
    changed, n = re.subn(rf"^({counter}:\.+)\d+$", rf"\g<1>{value}", text, count=1, flags=re.M)
    assert n == 1, counter
    return changed


def _judge(
    cluster_yml: Path, odd: str | None, start: str = ZERO, end: str = ZERO
) -> list[CheckResult]:
    """Every HCA of gpu001 reads ``start`` then ``end`` except ``odd`` (``end`` given for it
    only when it differs)."""
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    outputs: dict[str, ProbeOutput] = {}
    for nic in exp.nics:
        first, last = (start, end) if nic.device == odd else (ZERO, ZERO)
        outputs[f"perfquery.start.{nic.device}"] = ProbeOutput("perfquery", first)
        outputs[f"perfquery.end.{nic.device}"] = ProbeOutput("perfquery", last)
    return [r for r in judge_ib_port_errors(exp, outputs) if r.check == PORT_ERRORS]


def test_no_growth_is_ok(cluster_yml: Path) -> None:
    [ok] = _judge(cluster_yml, None)
    assert ok.verdict is Verdict.OK
    # 12 error counters per port; the data counters are not judged
    assert ok.message.startswith("none of 96 InfiniBand port error counters grew during")


@pytest.mark.parametrize(
    ("counter", "verdict"),
    [
        ("LinkDownedCounter", Verdict.FAIL),
        ("ExcessiveBufferOverrunErrors", Verdict.FAIL),
        ("LocalLinkIntegrityErrors", Verdict.FAIL),
        ("SymbolErrorCounter", Verdict.WARN),
        ("PortXmitDiscards", Verdict.WARN),
    ],
)
def test_growth_of_an_error_counter(cluster_yml: Path, counter: str, verdict: Verdict) -> None:
    [found] = _judge(cluster_yml, "mlx5_2", end=_raised(ZERO, counter, 3))
    assert (found.verdict, found.subject) == (verdict, "mlx5_2")
    assert f"port 1 {counter} +3 (0 -> 3)" in found.message


def test_data_counters_and_old_totals_are_not_judged(cluster_yml: Path) -> None:
    busy = _raised(ZERO, "PortXmitData", 36298026860928)
    [ok] = _judge(cluster_yml, "mlx5_0", end=busy)
    assert ok.verdict is Verdict.OK
    flapped_before = _raised(ZERO, "LinkDownedCounter", 1)
    [ok] = _judge(cluster_yml, "mlx5_0", start=flapped_before, end=flapped_before)
    assert ok.verdict is Verdict.OK


def test_what_cannot_be_compared_is_unknown(cluster_yml: Path) -> None:
    stuck = _raised(ZERO, "LinkDownedCounter", 255)  # 8 bits: saturated, it cannot grow
    [found] = _judge(cluster_yml, "mlx5_1", start=stuck, end=stuck)
    assert found.verdict is Verdict.UNKNOWN
    assert "LinkDownedCounter: at 255 before, a counter that cannot grow" in found.message
    [down] = _judge(cluster_yml, "mlx5_1", start=_raised(ZERO, "PortRcvErrors", 4))
    assert down.verdict is Verdict.UNKNOWN
    assert "went down from 4 to 0" in down.message
    failed = _judge(
        cluster_yml, "mlx5_1", end="ibwarn: [1] mad_rpc_open_port: can't open UMAD port\n"
    )
    assert [(r.verdict, r.subject) for r in failed] == [(Verdict.UNKNOWN, "mlx5_1")]


def test_the_lab_fault_fails_exactly_that_node_and_hca(
    cluster_yml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path / "state"))
    report = fails_only(
        cluster_yml, tmp_path / "b", fault("ib_link_flaps", "mlx5_2"), PORT_ERRORS, "standard"
    )
    node = next(n for n in report.nodes if n.node == "gpu002")
    [fail] = [c for c in node.checks if c.check == PORT_ERRORS and c.verdict is Verdict.FAIL]
    assert fail.subject == "mlx5_2"
    assert "port 1 LinkDownedCounter +" in fail.message

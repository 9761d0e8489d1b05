"""RoCE port error counters (issue 18, point 1): ``rdma statistic show link <hca>/1`` read before
and after the level's tests on every RoCE adapter, the growth judged by data/counters.yml's
``roce`` rules (``roce.port.errors``); the parser on real captures (tests/fixtures/ib/counters/
rdma-statistic-*), the lab's stand-in and its ``roce_errors`` fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import ROOT

from gpuctl.config.catalog import counter_rules
from gpuctl.lab.sim import ib as sim_ib
from gpuctl.lab.sim import profiles
from gpuctl.lab.sim.faults import FaultError, apply
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.counters import ROCE_ERRORS, judge_roce_port_errors
from gpuctl.validation.parsers.rdma_stat import link_counters_of
from gpuctl.validation.parsing import parse
from gpuctl.validation.probes import probes_for
from gpuctl.validation.results import CheckResult, Verdict

COUNTERS = ROOT / "tests" / "fixtures" / "ib" / "counters"
L40S = "l40s-pcie"


def _exp(level: str = "standard") -> NodeExpectation:
    nics = (
        ExpectedNic("mlx5_0", "roce", "roce", 100),
        ExpectedNic("mlx5_1", "roce", "roce", 100),
    )
    return NodeExpectation(node="gpu003", group="l40s", gpu_count=8, nics=nics, level=level)


def _line(device: str, **counts: int) -> str:
    """One port's line in the layout of rdma statistic (the stand-in's counter set)."""
    pairs = " ".join(f"{n} {counts.get(n, 0)}" for n in sim_ib.HW_COUNTERS)
    return f"link {device}/1 {pairs}\n"


def _judge(before: dict[str, str], after: dict[str, str]) -> list[CheckResult]:
    outputs = {f"rdma-stat.start.{h}": ProbeOutput("rdma-stat", t) for h, t in before.items()}
    outputs |= {f"rdma-stat.end.{h}": ProbeOutput("rdma-stat", t) for h, t in after.items()}
    return judge_roce_port_errors(_exp(), outputs)


def _of(results: list[CheckResult]) -> list[tuple[str, Verdict]]:
    return [(r.subject or "", r.verdict) for r in results if r.check == ROCE_ERRORS]


def test_every_roce_adapter_is_read_twice_at_standard_and_long_only() -> None:
    kinds = {p.kind: p.command(_exp()) for p in probes_for(_exp(), "standard")}
    assert kinds["rdma-stat.start.mlx5_1"] == ("rdma", "statistic", "show", "link", "mlx5_1/1")
    assert "rdma-stat.end.mlx5_0" in kinds
    assert not [k for k in (p.kind for p in probes_for(_exp(), "quick")) if "rdma" in k]
    ib = NodeExpectation("n", "g", nics=(ExpectedNic("mlx5_0", "ib", "infiniband", 400),))
    assert not [p for p in probes_for(ib, "standard") if p.kind.startswith("rdma-stat")]


def test_growth_is_judged_by_the_rules_both_ways() -> None:
    quiet = {h: _line(h) for h in ("mlx5_0", "mlx5_1")}
    assert _of(_judge(quiet, quiet)) == [("", Verdict.OK)]
    # traffic and congestion counters are no errors: not judged
    busy = dict(quiet, mlx5_1=_line("mlx5_1", rx_write_requests=9, np_cnp_sent=40))
    assert _of(_judge(quiet, busy)) == [("", Verdict.OK)]
    rules = counter_rules("roce")
    for counter in sim_ib.HW_COUNTERS:
        rule = rules.verdict_of(counter)
        grown = dict(quiet, mlx5_1=_line("mlx5_1", **{counter: 3}))
        got = _of(_judge(quiet, grown))
        want = {"fail": Verdict.FAIL, "warn": Verdict.WARN, None: Verdict.OK}[rule]
        assert got == [("" if rule is None else "mlx5_1", want)], counter
    [result] = list(_judge(quiet, dict(quiet, mlx5_1=_line("mlx5_1", out_of_sequence=7))))
    assert "port 1 out_of_sequence +7 (0 -> 7)" in result.message


def test_what_cannot_be_compared_is_unknown_never_a_pass() -> None:
    quiet = {h: _line(h) for h in ("mlx5_0", "mlx5_1")}
    # the second read missing for one adapter
    res = _judge(quiet, {"mlx5_0": quiet["mlx5_0"]})
    assert ("mlx5_1", Verdict.UNKNOWN) in _of(res)
    assert Verdict.OK not in {v for _, v in _of(res)}
    # a counter that went down (reset between the reads)
    down = dict(quiet, mlx5_0=_line("mlx5_0", out_of_sequence=5))
    res = _judge(down, quiet)
    assert _of(res) == [("mlx5_0", Verdict.UNKNOWN)]
    assert "went down from 5 to 0" in res[0].message
    # the tool's error instead of counters (no such device)
    res = _judge(dict(quiet, mlx5_1="Wrong device name\n"), quiet)
    assert ("mlx5_1", Verdict.UNKNOWN) in _of(res)
    # another device's line only
    res = _judge(quiet, dict(quiet, mlx5_1=_line("mlx5_0")))
    assert ("mlx5_1", Verdict.UNKNOWN) in _of(res)


def test_the_lab_standin_prints_the_counters_and_the_fault_grows_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCTL_SIM_STATE_DIR", str(tmp_path))
    hardware = profiles.load(L40S)
    text = sim_ib.rdma_statistic(hardware, {}, "gpu003", "mlx5_1", "1")
    result = parse("rdma-stat", text)
    assert result.recognised
    assert not result.problems
    [link] = link_counters_of(result.data)
    assert (link.device, link.port) == ("mlx5_1", 1)
    assert set(link.counts) == set(sim_ib.HW_COUNTERS)
    assert set(link.counts.values()) == {0}
    faults = dict(apply({}, "roce_errors", "mlx5_1:local_ack_timeout_err:4"))
    sim_ib.port_traffic(faults, "gpu003", "mlx5_1")
    sim_ib.port_traffic(faults, "gpu003", "mlx5_0")  # not the faulty adapter
    after = sim_ib.rdma_statistic(hardware, faults, "gpu003", "mlx5_1", "1")
    assert " local_ack_timeout_err 4 " in after
    assert " out_of_sequence 0 " in sim_ib.rdma_statistic(hardware, faults, "gpu003", "mlx5_0", "1")
    res = _judge({"mlx5_0": _line("mlx5_0"), "mlx5_1": text}, {"mlx5_0": _line("mlx5_0"),
                                                               "mlx5_1": after})  # fmt: skip
    assert [s for s, v in _of(res) if v is not Verdict.OK] == ["mlx5_1"]
    with pytest.raises(sim_ib.IbError):
        sim_ib.rdma_statistic(profiles.load("hgx-h100-ndr"), {}, "gpu001", "mlx5_0", "1")
    with pytest.raises(FaultError, match="roce_errors"):
        apply({}, "roce_errors", "mlx5_1:Bad Counter")


@pytest.mark.parametrize(
    "path", sorted(COUNTERS.glob("rdma-statistic-*.txt")), ids=lambda p: p.name
)
def test_real_captures_read_as_counters(path: Path) -> None:
    result = parse("rdma-stat", capture_output(path))
    assert result.recognised, result.problems
    links = link_counters_of(result.data)
    assert links
    assert all(link.counts for link in links)

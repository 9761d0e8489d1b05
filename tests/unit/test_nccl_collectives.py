"""nccl-tests beyond all_reduce (gpuctl issue 18, point 9): all_gather, reduce_scatter,
alltoall and sendrecv on every GPU of a node at standard and long, each against its own busbw
floor (``nccl_<collective>_busbw_gbs``, data/gpu_models.yml), checks ``nccl.<collective>.*``.

Real captures: superbenchmark's 8x A100 all_gather, reduce_scatter and alltoall runs, an 8x A100
sendrecv table (tests/fixtures/nccl-tests/, ADDED.md). The lab's stand-ins print the layout of
nccl-tests v2.17.9 (the release the lab installs): checked here against that release's format
strings and the real 2.17.9 capture, and against each collective's sizing in its source.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from test_collect import FakeConnector, Sim, fault

from gpuctl.config import load_cluster, load_cluster_text
from gpuctl.config.catalog import gpu_spec
from gpuctl.lab.sim import perf
from gpuctl.lab.sim import profiles as sim_profiles
from gpuctl.validation.api import validate
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.nccl import judge_nccl, judge_nccl_collectives
from gpuctl.validation.parsing import parse
from gpuctl.validation.probes import NCCL_COLLECTIVES, collective, probes_for
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "nccl-tests"
ALL_GATHER = FIX / "all-gather-perf-a100-sxm4-40gb-8gpu-validation0.txt"  # 223.39 at 8 GiB
REDUCE_SCATTER = FIX / "reduce-scatter-perf-a100-sxm4-40gb-8gpu-validation0.txt"  # 231.52
ALLTOALL = FIX / "alltoall-perf-a100-sxm4-40gb-8gpu-validation0.txt"  # 224.31
SENDRECV = FIX / "sendrecv-perf-a100-8gpu-table-only-excerpt.txt"  # 195.10 at 1 GiB
V2179 = FIX / "all-reduce-perf-gh200-4node-16rank-nccl-tests2.17.9-wrong-nonzero.txt"
A100_CLUSTER = ROOT / "inventories" / "a100-roce.yml"  # gpu[001-004]: 8x A100-SXM4-80GB
H100 = "hgx-h100-ndr"
GIB8 = 8 << 30
NAMES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


def _a100(thresholds: dict[str, Any] | None = None) -> Any:
    text = A100_CLUSTER.read_text(encoding="utf-8")
    cluster = load_cluster_text(text, "cluster.yml")
    exp = expectations(cluster)["gpu001"]
    if thresholds:
        exp = dataclasses.replace(exp, thresholds={**exp.thresholds, **thresholds})
    return exp


def _checks(results: list[CheckResult], check: str) -> list[CheckResult]:
    return [r for r in results if r.check == check]


# ------------------------------------------------------------------------------------------
# The probes and the floors


def test_every_collective_runs_on_every_multi_gpu_node_at_standard_and_long() -> None:
    exp = _a100()
    for level in ("standard", "long"):
        kinds = [p.kind for p in probes_for(exp, level)]
        heavy = [k for k in kinds if k.startswith("nccl")]
        assert heavy == ["nccl", *(f"nccl.{n}" for n in NAMES[1:])], level
    assert not [p for p in probes_for(exp, "quick") if p.kind.startswith("nccl")]
    assert [c.binary for c in NCCL_COLLECTIVES] == [f"{n}_perf" for n in NAMES]


def test_the_a100_and_h100_floors_are_below_what_real_runs_measured() -> None:
    """The catalog's floors are 0.9 x the real runs (data/gpu_models.yml says where from)."""
    a100 = gpu_spec("a100-sxm4-40gb").thresholds
    measured = {"all_gather": 223.39, "reduce_scatter": 231.52, "alltoall": 224.31}
    measured["sendrecv"] = 195.10  # at 1 GiB
    for name, value in measured.items():
        floor = a100[f"nccl_{name}_busbw_gbs"]
        assert floor is not None, name
        assert 0.9 * value - 1 < floor <= 0.9 * value, name  # rounded down to a whole GB/s
    for model in ("h100-sxm", "h200-sxm"):
        floors = gpu_spec(model).thresholds
        assert {floors[f"nccl_{n}_busbw_gbs"] for n in NAMES[1:]} == {324}, model
    assert gpu_spec("l40s").thresholds.get("nccl_alltoall_busbw_gbs") is None


# ------------------------------------------------------------------------------------------
# The judge on real captures


@pytest.mark.parametrize(
    ("kind", "path", "busbw"),
    [
        ("nccl.all_gather", ALL_GATHER, 223.39),
        ("nccl.reduce_scatter", REDUCE_SCATTER, 231.52),
        ("nccl.alltoall", ALLTOALL, 224.31),
    ],
)
def test_each_collective_is_judged_against_its_own_floor(
    kind: str, path: Path, busbw: float
) -> None:
    coll = collective(kind)
    outputs = {kind: ProbeOutput(kind, capture_output(path))}
    passing = judge_nccl_collectives(_a100({coll.threshold: busbw - 0.5}), outputs)
    failing = judge_nccl_collectives(_a100({coll.threshold: busbw + 0.5}), outputs)
    [ok] = _checks(passing, f"{coll.check}.busbw")
    [bad] = _checks(failing, f"{coll.check}.busbw")
    assert (ok.verdict, bad.verdict) == (Verdict.OK, Verdict.FAIL)
    assert ok.measured == busbw
    assert bad.message == f"busbw {busbw:g} GB/s at 8589934592 B < {busbw + 0.5:g}"
    # the other collectives were not run: each says so, none passes
    for other in NCCL_COLLECTIVES[1:]:
        if other.kind != kind:
            [missing] = _checks(passing, f"{other.check}.busbw")
            assert missing.verdict is Verdict.UNKNOWN, other.name
    # and all_reduce's checks are not touched by another collective's output
    assert judge_nccl(_a100(), outputs)[0].check == "nccl.busbw"
    assert judge_nccl(_a100(), outputs)[0].verdict is Verdict.UNKNOWN


def test_the_output_of_another_collective_is_not_judged_against_this_floor() -> None:
    """all_gather_perf's real output where alltoall_perf's was expected (a wrong launcher):
    UNKNOWN, not a pass against alltoall's floor; nccl-tests 2.17 names the test."""
    text = perf.nccl_perf(
        sim_profiles.load("a100-hdr"), {}, "gpu001", perf.NcclArgs(8, GIB8, 2, 8), "all_gather"
    )
    outputs = {"nccl.alltoall": ProbeOutput("nccl.alltoall", text)}
    [result] = _checks(judge_nccl_collectives(_a100(), outputs), "nccl.alltoall.busbw")
    assert result.verdict is Verdict.UNKNOWN
    assert "all_gather_perf's, not alltoall_perf's" in result.message


def test_a_sendrecv_table_without_devices_or_the_full_size_is_unknown() -> None:
    """The real sendrecv excerpt: no device list, 1 GiB at most: not judged at 8 GiB."""
    outputs = {"nccl.sendrecv": ProbeOutput("nccl.sendrecv", capture_output(SENDRECV))}
    [result] = _checks(judge_nccl_collectives(_a100(), outputs), "nccl.sendrecv.busbw")
    assert result.verdict is Verdict.UNKNOWN
    assert "lists no devices" in result.message
    [wrong] = _checks(judge_nccl_collectives(_a100(), outputs), "nccl.sendrecv.wrong")
    assert wrong.verdict is Verdict.OK  # its #wrong column says 0 out of place


def test_six_gpus_reach_the_full_size_less_the_16_byte_rounding() -> None:
    """all_gather on 6 GPUs: each rank's share is rounded down to 16 bytes, so the largest row
    is 8 GiB less 32 B; that is the full size, judged (not UNKNOWN)."""
    profile = sim_profiles.load("a100-hdr")
    text = perf.nccl_perf(profile, {}, "gpu001", perf.NcclArgs(8, GIB8, 2, 6), "all_gather")
    assert parse("nccl", text).data["rows"][-1]["size"] == GIB8 - 32
    exp = _a100()
    exp = dataclasses.replace(exp, gpu_count=6)
    outputs = {"nccl.all_gather": ProbeOutput("nccl.all_gather", text)}
    [result] = _checks(judge_nccl_collectives(exp, outputs), "nccl.all_gather.busbw")
    assert result.verdict is Verdict.OK, result.message


# ------------------------------------------------------------------------------------------
# The stand-ins: nccl-tests v2.17.9's layout and each collective's sizes


def _c(fmt: str, *args: Any) -> str:
    """A C printf format of src/util.cu applied to ``args`` (%s, %d, %ld, %i, %g, widths)."""
    out = re.sub(r"%(-?)(\d*)l?([sdig])", "{}", fmt)
    specs = re.findall(r"%(-?)(\d*)l?([sdig])", fmt)
    values = []
    for (left, width, conv), arg in zip(specs, args, strict=True):
        text = f"{arg:g}" if conv == "g" else str(arg)
        values.append(text.ljust(int(width)) if left else text.rjust(int(width or 0)))
    return out.format(*values)


def test_the_stand_in_header_and_trailer_are_nccl_tests_2_17_9s() -> None:
    """src/util.cu of v2.17.9 (writeResultHeader, writeResultFooter) and the real 2.17.9
    capture: the table head is the same three lines, the trailer its two formats."""
    text = perf.nccl_perf(
        sim_profiles.load(H100), {}, "gpu001", perf.NcclArgs(8, GIB8, 2, 8), "alltoall"
    )
    lines = text.splitlines()
    real = capture_output(V2179).splitlines()

    def head(text: list[str]) -> list[str]:  # the "#" line, then the three lines of the head
        at = next(i for i, line in enumerate(text) if line.startswith("#       size"))
        return text[at - 2 : at + 2]

    assert head(lines) == head(real)
    assert lines[0] == "# nccl-tests version 2.17.9 nccl-headers=22602 nccl-library=22602"
    assert lines[1] == "# Collective test starting: alltoall_perf"
    avg = parse("nccl", text).data["avg_busbw"]
    assert lines[-4:] == [
        _c("# %-20s : %d %s", "Out of bounds values", 0, "OK"),
        _c("# %-20s : %g %s", "Avg bus bandwidth", avg, ""),
        "#",
        "# Collective test concluded: alltoall_perf",
    ]
    assert lines[-3].endswith(" ")  # "%g %s" with an empty check result leaves the blank
    # the device lines: "%04x:%02x:%02x" is lower-case hex
    assert re.search(r"device  7 \[0000:[0-9a-f]{2}:00\] NVIDIA H100 80GB HBM3$", lines[12])


@pytest.mark.parametrize("name", NAMES)
def test_each_stand_in_sizes_and_scores_its_collective_as_the_source_does(name: str) -> None:
    """src/<collective>.cu of v2.17.9: GetCollByteCount (the size and count columns), GetBw
    (algbw = bytes moved / time; busbw x 2(n-1)/n, (n-1)/n or 1) and the redop the test
    passes; sendrecv checks no in-place result (N/A, as the real sendrecv table shows)."""
    n = 8
    data = parse(
        "nccl",
        perf.nccl_perf(sim_profiles.load(H100), {}, "gpu001", perf.NcclArgs(8, GIB8, 2, n), name),
    ).data
    assert data["test"] == f"{name}_perf"
    factor = {"all_reduce": 2 * (n - 1) / n, "sendrecv": 1.0}.get(name, (n - 1) / n)
    split = name in ("all_gather", "reduce_scatter", "alltoall")
    for row, size in zip(data["rows"], (8 << i for i in range(31)), strict=True):
        count = size // 4
        param = (count // n) & -4 if split else count
        assert (row["size"], row["count"]) == (param * n * 4 if split else count * 4, param)
        assert row["redop"] == ("none" if name in ("all_gather", "alltoall") else "sum")
        assert row["root"] == -1
        side = row["out_of_place"]
        if row["size"] >= 1 << 20:
            assert side["algbw"] == pytest.approx(row["size"] / side["time_us"] / 1e3, rel=0.01)
            assert side["busbw"] == pytest.approx(side["algbw"] * factor, rel=0.01)
        assert side["wrong"] == 0
        assert row["in_place"]["wrong"] == (None if name == "sendrecv" else 0)
    real = parse("nccl", capture_output(SENDRECV)).data["rows"][0]
    if name == "sendrecv":
        assert (real["redop"], real["root"], real["in_place"]["wrong"]) == ("sum", -1, None)


def test_a_slow_collective_slows_that_collective_alone() -> None:
    profile = sim_profiles.load(H100)
    faults = fault("nccl_collective_slow", "alltoall:0.5")

    def busbw(name: str) -> float:
        text = perf.nccl_perf(profile, faults, "gpu001", perf.NcclArgs(8, GIB8, 2, 8), name)
        return float(parse("nccl", text).data["rows"][-1]["out_of_place"]["busbw"])

    expected = profile["expected"]
    assert busbw("alltoall") == pytest.approx(expected["nccl_alltoall_busbw_gbs"] / 2, rel=0.02)
    for name in ("all_reduce", "all_gather", "reduce_scatter", "sendrecv"):
        assert busbw(name) == pytest.approx(expected[f"nccl_{name}_busbw_gbs"], rel=0.02), name


# ------------------------------------------------------------------------------------------
# The simulated cluster: three H100 nodes, the fault on gpu002


def test_a_healthy_standard_run_passes_every_collective(cluster_yml: Path, tmp_path: Path) -> None:
    res = validate(
        load_cluster(cluster_yml),
        level="standard",
        out=tmp_path / "b",
        connector=FakeConnector(Sim()),
    )
    assert not res.failed, {n.node: [c.message for c in n.problems()] for n in res.report.nodes}
    for node in ("gpu001", "gpu002", "gpu003"):
        report = next(n for n in res.report.nodes if n.node == node)
        for coll in NCCL_COLLECTIVES:
            [busbw] = [c for c in report.checks if c.check == f"{coll.check}.busbw"]
            assert busbw.verdict is Verdict.OK, (node, busbw.message)
        assert (res.bundle / node / "nccl.alltoall.txt").is_file()


def test_an_alltoall_slow_node_fails_alone_on_alltoall(cluster_yml: Path, tmp_path: Path) -> None:
    """Below the floor and far below its two peers: nccl.alltoall.busbw and its fleet check,
    nothing else (all_reduce and the other collectives ran at full speed)."""
    sim = Sim({"gpu002": fault("nccl_collective_slow", "alltoall:0.6")})
    res = validate(
        load_cluster(cluster_yml),
        level="standard",
        out=tmp_path / "b",
        connector=FakeConnector(sim),
    )
    failed = {n.node: sorted({c.check for c in n.problems()}) for n in res.report.nodes if n.failed}
    assert failed == {"gpu002": ["nccl.alltoall.busbw", "nccl.alltoall.busbw.fleet"]}
    node = next(n for n in res.report.nodes if n.node == "gpu002")
    [bad] = [c for c in node.checks if c.check == "nccl.alltoall.busbw"]
    assert bad.message.endswith("< 324")  # H100's floor, from data/gpu_models.yml
    assert bad.source == "gpu model h100-sxm (data/gpu_models.yml)"
    [fleet] = [c for c in node.checks if c.check == "nccl.alltoall.busbw.fleet"]
    assert "is below 0.95 x median" in fleet.message

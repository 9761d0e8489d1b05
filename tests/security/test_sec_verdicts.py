"""Security issue 14: verdicts a bundle can forge.

A results bundle is text anyone can write. Numbers no hardware can produce (a NaN busbw, 1e300
GB/s over NVLink, 1e308 Gb/s on a 400 Gb/s port) and GPUs or HCAs listed twice to make up a
count must never pass: above the physical limit of the link is FAIL, a non-finite number is
FAIL, a duplicate is FAIL "listed twice" and never counted. Nothing a judge returns holds NaN or
infinity (``results.json`` is written with ``allow_nan=False``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import pytest
from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.config.catalog import busbw_ceiling, gpu_specs, multinode_busbw_ceiling, pcie_ceiling
from gpuctl.lab.sim import ib, nvsmi, nvsmi_xml, perf, profiles
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.gpus import judge_gpus
from gpuctl.validation.judges.infiniband import judge_ib_ports, judge_ib_write_bw, port_rates
from gpuctl.validation.judges.nccl import judge_nccl
from gpuctl.validation.judges.nvlink import judge_nvlink_status
from gpuctl.validation.judges.topology import judge_topology
from gpuctl.validation.parsing import parse
from gpuctl.validation.plausible import implausible
from gpuctl.validation.results import CheckResult, Verdict

NODE = "gpu-node-01"
FIX = ROOT / "tests" / "fixtures"
NCCL_A100 = "nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"
PERF_ROCE = "perftest/ib-write-bw-roce-100g-rdma-cm-cpu-freq-warning-client.txt"
SMI_H100 = "nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt"
IBSTAT_NDR = "ib/ibstat-h100-ib-ndr400-all-active-space-indent.txt"
# the 8 GiB row of the A100 capture: out-of-place busbw 235.26, in-place 235.03
LAST_ROW = "  8589934592    2147483648   float     sum    63896  134.44  235.26"


def body(rel: str) -> str:
    return capture_output(FIX / rel)


def h100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]


def a100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "a100-roce.yml"))["gpu001"]


def h100_565() -> NodeExpectation:
    return dataclasses.replace(h100(), driver_version="565.57.01")


def only(results: list[CheckResult], check: str) -> list[CheckResult]:
    return [r for r in results if r.check == check]


def assert_json_safe(results: list[CheckResult]) -> None:
    """What results.json would hold: finite numbers only (the writer refuses NaN/inf)."""
    for r in results:
        json.dumps(r.to_json(), allow_nan=False)
        for value in (r.measured, r.expected, r.limit, r.percent_of_limit):
            if isinstance(value, float):
                assert math.isfinite(value), r


def nccl_with_last_busbw(token: str) -> dict[str, ProbeOutput]:
    text = body(NCCL_A100)
    assert LAST_ROW in text
    return {"nccl": ProbeOutput("nccl", text.replace(LAST_ROW, LAST_ROW[:-6] + token.rjust(6)))}


def injected(kind: str, text: str, edit: Any) -> ProbeOutput:
    """The output as a parser that let a number through would hand it to the judge."""
    parsed = parse(kind, text)
    data = json.loads(json.dumps(parsed.data))
    edit(data)
    return ProbeOutput(kind, text, _parsed={kind: dataclasses.replace(parsed, data=data)})


# ------------------------------------------------------------------------------------------
# nccl-tests


@pytest.mark.parametrize("token", ["nan", "-nan", "inf", "-inf"])
def test_non_finite_busbw_in_the_judged_row_is_never_replaced_by_another_row(token: str) -> None:
    res = judge_nccl(a100(), nccl_with_last_busbw(token))
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert "not a finite number" in busbw.message
    assert "8589934592" in busbw.message  # the row it is about
    assert busbw.measured is None
    assert_json_safe(res)


def test_non_finite_busbw_in_a_smaller_row_is_named() -> None:
    text = body(NCCL_A100).replace("16215  132.44  231.76", "16215  132.44     nan")
    res = judge_nccl(a100(), {"nccl": ProbeOutput("nccl", text)})
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert "not a finite number" in busbw.message
    assert "2147483648" in busbw.message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_parser_that_lets_nan_through_is_still_caught(value: float) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["rows"][-1]["out_of_place"]["busbw"] = value

    res = judge_nccl(a100(), {"nccl": injected("nccl", body(NCCL_A100), edit)})
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert "not a finite number" in busbw.message
    assert_json_safe(res)


# A parser may refuse a number that large (then it reads as no number): either way it is FAIL.
FORGED = ("above the physical limit", "not a finite number")


def test_busbw_of_1e300_is_above_the_physical_limit() -> None:
    res = judge_nccl(a100(), nccl_with_last_busbw("1e300"))
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert any(m in busbw.message for m in FORGED), busbw.message
    assert_json_safe(res)

    def edit(data: dict[str, Any]) -> None:
        data["rows"][-1]["out_of_place"]["busbw"] = 1e300

    res = judge_nccl(a100(), {"nccl": injected("nccl", body(NCCL_A100), edit)})
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert "above the physical limit" in busbw.message
    assert "NVLink" in busbw.message
    assert "lying" in busbw.message
    assert busbw.limit == 600  # A100: NVLink 600 GB/s
    assert_json_safe(res)


def test_busbw_a_little_above_what_nvlink_carries_fails_and_a_real_one_passes() -> None:
    # H100 SXM: NVLink 900 GB/s (both directions); +5% tolerance = 945
    lie = judge_nccl(h100(), nccl_with_last_busbw("990.00"))
    [busbw] = only(lie, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert "above the physical limit" in busbw.message
    real = judge_nccl(h100(), nccl_with_last_busbw("482.50"))  # the lab's H100 (NVLS)
    assert [r.verdict for r in only(real, "nccl.busbw")] == [Verdict.OK]


def test_in_place_busbw_above_the_limit_fails_too() -> None:
    text = body(NCCL_A100).replace("63959  134.30  235.03", "63959  134.30  9999.0")
    res = judge_nccl(a100(), {"nccl": ProbeOutput("nccl", text)})
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is Verdict.FAIL
    assert "above the physical limit" in busbw.message


def test_nan_in_the_wrong_column_is_not_taken_for_zero_wrong() -> None:
    def edit(data: dict[str, Any]) -> None:
        for row in data["rows"]:
            row["out_of_place"]["wrong"] = 0
            row["in_place"]["wrong"] = 0
        data["rows"][3]["in_place"]["wrong"] = math.nan

    res = judge_nccl(a100(), {"nccl": injected("nccl", body(NCCL_A100), edit)})
    assert [r.verdict for r in only(res, "nccl.wrong")] == [Verdict.FAIL]
    assert_json_safe(res)


def test_more_nccl_ranks_on_one_host_than_the_node_has_gpus_fails() -> None:
    exp = dataclasses.replace(a100(), gpu_count=4)  # the capture ran 8 ranks on one host
    res = judge_nccl(exp, {"nccl": ProbeOutput("nccl", body(NCCL_A100))})
    [ranks] = only(res, "nccl.ranks")
    assert ranks.verdict is Verdict.FAIL
    assert "8 GPUs" in ranks.message


# ------------------------------------------------------------------------------------------
# ib_write_bw and ibstat


def roce_400() -> NodeExpectation:
    return dataclasses.replace(
        a100(),
        nics=(ExpectedNic("mlx5_0", "roce", "roce", 400),),
        thresholds={**a100().thresholds, "ib_write_bw_gbps": 360.0},
    )


def perftest_with(bw: str) -> dict[str, ProbeOutput]:
    text = body(PERF_ROCE)
    row = " 65536      5000             92.42              92.40              0.176230"
    assert row in text
    forged = f" 65536      5000             {bw}              {bw}              0.176230"
    return {"mlx5_0": ProbeOutput("perftest", text.replace(row, forged))}


def test_ib_write_bw_of_1e308_on_a_400g_port_is_above_the_line_rate() -> None:
    res = judge_ib_write_bw(roce_400(), perftest_with("1e308"))
    [bw] = res
    assert bw.verdict is Verdict.FAIL
    assert any(m in bw.message for m in FORGED), bw.message
    assert bw.percent_of_limit is None or math.isfinite(bw.percent_of_limit)
    assert_json_safe(res)

    def edit(data: dict[str, Any]) -> None:
        data["rows"][-1]["bw_average"] = 1e308

    [bw] = judge_ib_write_bw(roce_400(), {"mlx5_0": injected("perftest", body(PERF_ROCE), edit)})
    assert bw.verdict is Verdict.FAIL
    assert "above the physical limit" in bw.message
    assert "400 Gb/s" in bw.message
    assert bw.measured is None
    assert bw.percent_of_limit is None or math.isfinite(bw.percent_of_limit)
    assert_json_safe([bw])


def test_ib_write_bw_just_above_the_line_rate_fails_and_below_passes() -> None:
    [lie] = judge_ib_write_bw(roce_400(), perftest_with("430.00"))
    assert lie.verdict is Verdict.FAIL
    assert "above the physical limit" in lie.message
    [real] = judge_ib_write_bw(roce_400(), perftest_with("391.80"))  # the lab's NDR
    assert real.verdict is Verdict.OK
    assert real.percent_of_limit == pytest.approx(98.0)


def test_ib_write_bw_ceiling_is_the_rate_ibstat_reports_when_given() -> None:
    # configured for 400, but the port trained at 200: 390 Gb/s cannot be real
    [r] = judge_ib_write_bw(roce_400(), perftest_with("391.80"), port_rates={"mlx5_0/1": 200.0})
    assert r.verdict is Verdict.FAIL
    assert "above the physical limit" in r.message
    assert "200 Gb/s" in r.message


def test_ib_write_bw_without_a_configured_rate_is_held_to_the_fastest_known_port() -> None:
    exp = dataclasses.replace(roce_400(), nics=(ExpectedNic("mlx5_0", "roce", "roce", None),))
    [r] = judge_ib_write_bw(exp, perftest_with("9999.00"))
    assert r.verdict is Verdict.FAIL
    assert "above the physical limit" in r.message
    assert "the fastest RoCE port" in r.message
    assert_json_safe([r])


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_ib_write_bw_nan_from_a_parser_is_not_a_finite_number(value: float) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["rows"][-1]["bw_average"] = value

    probe = injected("perftest", body(PERF_ROCE), edit)
    [r] = judge_ib_write_bw(roce_400(), {"mlx5_0": probe})
    assert r.verdict is Verdict.FAIL
    assert "not a finite number" in r.message
    assert_json_safe([r])


def test_ib_write_bw_unreadable_average_in_the_largest_row_is_not_skipped() -> None:
    [r] = judge_ib_write_bw(roce_400(), perftest_with("  nan"))
    assert r.verdict is Verdict.FAIL
    assert "not a finite number" in r.message


def test_infinite_percent_of_limit_cannot_be_produced() -> None:
    # 100 x 1e308 overflows: the percentage of a 400 Gb/s link would be Infinity
    exp = dataclasses.replace(h100(), nics=(ExpectedNic("mlx5_0", "ndr", "infiniband", 400),))
    text = body(IBSTAT_NDR).replace("Rate: 400", "Rate: 1e308", 1)
    res = judge_ib_ports(exp, {"ibstat": ProbeOutput("ibstat", text)})
    [rate] = only(res, "ib.port.rate")
    assert rate.verdict in (Verdict.FAIL, Verdict.UNKNOWN)  # a parser may refuse 1e308
    assert_json_safe(res)

    def edit(data: dict[str, Any]) -> None:
        data["cas"]["mlx5_0"]["ports"]["1"]["rate"] = 1e308

    probe = injected("ibstat", body(IBSTAT_NDR), edit)
    res = judge_ib_ports(exp, {"ibstat": probe})
    [rate] = only(res, "ib.port.rate")
    assert rate.verdict is Verdict.FAIL
    assert "above the physical limit" in rate.message
    assert_json_safe(res)
    res = judge_ib_write_bw(roce_400(), perftest_with("1e308"))
    assert all(r.percent_of_limit is None or math.isfinite(r.percent_of_limit) for r in res)


def test_rates_ibstat_reports_are_read_for_the_ceiling() -> None:
    rates = port_rates({"ibstat": ProbeOutput("ibstat", body(IBSTAT_NDR))})
    assert rates["mlx5_0/1"] == 400.0
    forged = injected(
        "ibstat",
        body(IBSTAT_NDR),
        lambda d: d["cas"]["mlx5_0"]["ports"]["1"].__setitem__("rate", 1e308),
    )
    assert "mlx5_0/1" not in port_rates({"ibstat": forged})


# ------------------------------------------------------------------------------------------
# GPUs and HCAs listed twice


def _gpu_blocks(text: str) -> tuple[str, list[str]]:
    starts = [m.start() for m in re.finditer(r"^GPU [0-9A-Fa-f]{8}:", text, re.MULTILINE)]
    head = text[: starts[0]]
    blocks = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    return head, blocks


def smi_with_gpu7_replaced(make: Any) -> dict[str, ProbeOutput]:
    head, blocks = _gpu_blocks(body(SMI_H100))
    assert len(blocks) == 8
    blocks[7] = make(blocks[0], blocks[7])
    return {"smi-q": ProbeOutput("smi-q", head + "".join(blocks))}


def _uuid(block: str) -> str:
    m = re.search(r"GPU UUID\s+:\s+(\S+)", block)
    assert m is not None
    return m.group(1)


def test_the_same_gpu_twice_by_uuid_is_listed_twice_and_counted_once() -> None:
    def same_uuid(gpu0: str, gpu7: str) -> str:
        return gpu7.replace(_uuid(gpu7), _uuid(gpu0))  # GPU7's bus id, GPU0's UUID

    res = judge_gpus(h100_565(), smi_with_gpu7_replaced(same_uuid))
    [dup] = only(res, "gpu.duplicate")
    assert dup.verdict is Verdict.FAIL
    assert "listed twice" in dup.message
    assert "UUID" in dup.message
    [count] = only(res, "gpu.count")
    assert (count.verdict, count.measured, count.expected) == (Verdict.FAIL, 7, 8)


def test_the_same_gpu_twice_by_pci_bus_id_is_listed_twice() -> None:
    def same_bus(gpu0: str, gpu7: str) -> str:
        return gpu7.replace("00000000:DB:00.0", "00000000:18:00.0")  # GPU7's UUID, GPU0's bus

    res = judge_gpus(h100_565(), smi_with_gpu7_replaced(same_bus))
    [dup] = only(res, "gpu.duplicate")
    assert dup.verdict is Verdict.FAIL
    assert "listed twice" in dup.message
    assert "bus id" in dup.message
    assert [r.verdict for r in only(res, "gpu.count")] == [Verdict.FAIL]


def test_a_whole_gpu_block_copied_is_listed_twice() -> None:
    res = judge_gpus(h100_565(), smi_with_gpu7_replaced(lambda gpu0, _gpu7: gpu0))
    [dup] = only(res, "gpu.duplicate")
    assert dup.verdict is Verdict.FAIL
    assert "listed twice" in dup.message
    [count] = only(res, "gpu.count")
    assert (count.verdict, count.measured) == (Verdict.FAIL, 7)


def test_the_same_minor_number_twice_is_listed_twice() -> None:
    def same_minor(_gpu0: str, gpu7: str) -> str:
        return re.sub(r"(Minor Number\s+:\s+)7", r"\g<1>0", gpu7)

    res = judge_gpus(h100_565(), smi_with_gpu7_replaced(same_minor))
    [dup] = only(res, "gpu.duplicate")
    assert "listed twice" in dup.message
    assert "minor number" in dup.message


def test_healthy_gpus_have_no_duplicate_finding() -> None:
    res = judge_gpus(h100_565(), {"smi-q": ProbeOutput("smi-q", body(SMI_H100))})
    assert only(res, "gpu.duplicate") == []
    assert [r.verdict for r in only(res, "gpu.count")] == [Verdict.OK]


def ndr_exp() -> NodeExpectation:
    devices = ("mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")
    return dataclasses.replace(
        h100(), nics=tuple(ExpectedNic(d, "ndr", "infiniband", 400) for d in devices)
    )


def _ca_blocks(text: str) -> tuple[str, list[str]]:
    starts = [m.start() for m in re.finditer(r"^CA '", text, re.MULTILINE)]
    head = text[: starts[0]]
    blocks = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    return head, blocks


def test_an_hca_name_listed_twice_fails() -> None:
    head, blocks = _ca_blocks(body(IBSTAT_NDR))
    text = head + "".join(blocks) + blocks[0]  # mlx5_0 again at the end
    res = judge_ib_ports(ndr_exp(), {"ibstat": ProbeOutput("ibstat", text)})
    dup = only(res, "ib.duplicate")
    assert [r.verdict for r in dup] == [Verdict.FAIL]
    assert "mlx5_0" in dup[0].message
    assert "listed twice" in dup[0].message


def test_an_hca_copied_under_another_name_fails() -> None:
    head, blocks = _ca_blocks(body(IBSTAT_NDR))
    assert blocks[5].startswith("CA 'mlx5_7'")
    blocks[5] = blocks[0].replace("CA 'mlx5_0'", "CA 'mlx5_7'")  # same GUIDs as mlx5_0
    res = judge_ib_ports(ndr_exp(), {"ibstat": ProbeOutput("ibstat", head + "".join(blocks))})
    dup = only(res, "ib.duplicate")
    assert [r.verdict for r in dup] == [Verdict.FAIL]
    assert "listed twice" in dup[0].message
    assert "GUID" in dup[0].message


def test_healthy_ibstat_has_no_duplicate_finding() -> None:
    res = judge_ib_ports(ndr_exp(), {"ibstat": ProbeOutput("ibstat", body(IBSTAT_NDR))})
    assert only(res, "ib.duplicate") == []
    assert {r.verdict for r in res} == {Verdict.OK}


def test_a_gpu_twice_in_nvlink_status_fails() -> None:
    text = body("nvidia-smi/nvlink-status-a100-8gpu-space-indent.txt")
    first = text.index("GPU 1:")
    gpu0 = text[text.index("GPU 0:") : first]
    res = judge_nvlink_status(a100(), {"nvlink": ProbeOutput("nvlink", text + gpu0)})
    dup = only(res, "gpu.duplicate")
    assert [r.verdict for r in dup] == [Verdict.FAIL]
    assert "listed twice" in dup[0].message


def test_a_gpu_twice_in_topo_is_never_counted_twice() -> None:
    rel = "topo/nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt"
    probe = injected(
        "topo", body(rel), lambda d: d.__setitem__("gpus", [*d["gpus"][:7], d["gpus"][0]])
    )
    res = judge_topology(h100(), {"topo": probe})
    dup = only(res, "gpu.duplicate")
    assert [r.verdict for r in dup] == [Verdict.FAIL]
    assert "listed twice" in dup[0].message
    [count] = only(res, "topology.gpus")
    assert (count.verdict, count.measured) == (Verdict.FAIL, 7)


# ------------------------------------------------------------------------------------------
# Other numbers: ECC counters, PCIe width, thresholds


def test_nan_ecc_counter_is_not_skipped() -> None:
    def edit(data: dict[str, Any]) -> None:
        data["gpus"][2]["ecc"]["aggregate"]["sram_uncorrectable"] = math.nan

    res = judge_gpus(h100_565(), {"smi-q": injected("smi-q", body(SMI_H100), edit)})
    bad = [
        r for r in res if r.check == "gpu.ecc.sram_uncorrectable" and r.verdict is not Verdict.OK
    ]
    assert [r.verdict for r in bad] == [Verdict.FAIL]
    assert "not a finite number" in bad[0].message
    assert bad[0].subject == "GPU2"
    assert_json_safe(res)


def test_infinite_pcie_width_is_not_skipped() -> None:
    def edit(data: dict[str, Any]) -> None:
        data["gpus"][1]["pcie"]["width_max"] = math.inf

    res = judge_gpus(h100_565(), {"smi-q": injected("smi-q", body(SMI_H100), edit)})
    bad = only(res, "gpu.pcie.width")
    assert [r.verdict for r in bad] == [Verdict.FAIL]
    assert "not a finite number" in bad[0].message
    assert_json_safe(res)


@pytest.mark.parametrize("threshold", [math.nan, math.inf])
def test_a_non_finite_threshold_never_passes_and_never_reaches_the_result(
    threshold: float,
) -> None:
    exp = dataclasses.replace(
        a100(), thresholds={**a100().thresholds, "nccl_all_reduce_busbw_gbs": threshold}
    )
    res = judge_nccl(exp, {"nccl": ProbeOutput("nccl", body(NCCL_A100))})
    [busbw] = only(res, "nccl.busbw")
    assert busbw.verdict is not Verdict.OK
    assert_json_safe(res)


# ------------------------------------------------------------------------------------------
# The ceilings: from data, with a source, above what the lab's simulated hardware prints


def test_every_gpu_model_has_a_busbw_ceiling_with_a_source() -> None:
    for key in gpu_specs():
        ceiling = busbw_ceiling(key)
        assert ceiling is not None, key
        assert ceiling.value > 0
        assert ceiling.source
    h100_sxm, l40s = busbw_ceiling("h100-sxm"), busbw_ceiling("l40s")
    assert h100_sxm is not None
    assert h100_sxm.value == 900
    assert l40s is not None
    assert l40s.value == pytest.approx(63.0, abs=0.1)  # PCIe Gen4 x16, both directions
    fastest = busbw_ceiling(None)  # a model gpuctl does not know: the fastest it knows
    assert fastest is not None
    assert fastest.value == 1800


def test_pcie_and_multinode_ceilings() -> None:
    gen4 = pcie_ceiling(4, 16)
    assert gen4 is not None
    assert gen4.value == pytest.approx(31.5, abs=0.1)  # per direction
    gen5_x8 = pcie_ceiling(5, 8)
    assert gen5_x8 is not None
    assert gen5_x8.value == pytest.approx(31.5, abs=0.1)
    assert pcie_ceiling(9, 16) is None  # a generation gpuctl has no number for
    eight_ndr = multinode_busbw_ceiling([400] * 8)
    assert eight_ndr is not None
    assert eight_ndr.value == 800  # 2 x 8 x 400 Gb/s / 8
    assert multinode_busbw_ceiling([]) is None
    nvlink = multinode_busbw_ceiling([400] * 8, "h100-sxm")  # never below the GPU's NVLink
    assert nvlink is not None
    assert nvlink.value == 900
    slow_nics = multinode_busbw_ceiling([100, 100], "l40s")
    assert slow_nics is not None
    assert slow_nics.value == pytest.approx(63.0, abs=0.1)


def test_implausible_names_what_is_wrong() -> None:
    ceiling = busbw_ceiling("h100-sxm")
    assert implausible(480.0, ceiling, "busbw", "GB/s") is None
    assert "not a finite number" in str(implausible(math.nan, ceiling, "busbw", "GB/s"))
    assert "not a finite number" in str(implausible(None, ceiling, "busbw", "GB/s"))
    assert "above the physical limit" in str(implausible(1e300, ceiling, "busbw", "GB/s"))
    assert "above the physical limit" in str(implausible(10**400, ceiling, "busbw", "GB/s"))


@pytest.mark.parametrize("name", profiles.names())
def test_the_lab_simulated_hardware_stays_below_the_ceilings(name: str) -> None:
    """What gpuctl.lab.sim prints for each profile passes the judges with the ceilings on."""
    profile = profiles.load(name)
    count = profile["gpus"]["count"]
    nics = profile.get("nics") or {}
    kind = "infiniband" if nics.get("link_layer") == "InfiniBand" else "roce"
    expected_nics = tuple(
        ExpectedNic(p["name"], "fabric", kind, nics["rate"]) for p in nics.get("ports") or []
    )
    exp = NodeExpectation(
        node=NODE,
        group="lab",
        gpu_model=profile["model"],
        gpu_count=count,
        nics=expected_nics,
        thresholds={"nccl_all_reduce_busbw_gbs": 0.0, "ib_write_bw_gbps": 1.0},
    )
    if count >= 2:
        nccl = perf.all_reduce_perf(profile, {}, NODE, perf.NcclArgs(8, 8 << 30, 2, count))
        res = judge_nccl(exp, {"nccl": ProbeOutput("nccl", nccl)})
        assert [r.verdict for r in only(res, "nccl.busbw")] == [Verdict.OK], res
        assert only(res, "nccl.ranks") == []
    if expected_nics:
        first = expected_nics[0].device
        for args in (
            perf.PerftestArgs(server="peer", device=first, size=8 << 20, gbits=True),
            perf.PerftestArgs(server="peer", device=first, all_sizes=True, gbits=True),
            perf.PerftestArgs(server="peer", device=first, size=8 << 20),  # MB/sec
        ):
            text = perf.ib_write_bw(profile, {}, NODE, args)
            res = judge_ib_write_bw(
                dataclasses.replace(exp, nics=expected_nics[:1]),
                {first: ProbeOutput("perftest", text)},
            )
            assert [r.verdict for r in res] == [Verdict.OK], res
        rates = [n.rate_gbps or 0 for n in expected_nics]
        multi = profile["expected"].get("nccl_multinode_busbw_gbs")
        if multi is not None:
            assert (
                implausible(float(multi), multinode_busbw_ceiling(rates), "busbw", "GB/s") is None
            )


@pytest.mark.parametrize("name", profiles.names())
def test_the_lab_simulated_hardware_lists_every_gpu_and_hca_once(name: str) -> None:
    profile = profiles.load(name)
    count = profile["gpus"]["count"]
    nics = profile.get("nics") or {}
    kind = "infiniband" if nics.get("link_layer") == "InfiniBand" else "roce"
    exp = NodeExpectation(
        node=NODE,
        group="lab",
        gpu_model=profile["model"],
        gpu_count=count,
        interconnect="nvswitch" if profile["gpus"].get("nvswitch") else "pcie",
        nics=tuple(
            ExpectedNic(p["name"], "f", kind, nics["rate"]) for p in nics.get("ports") or []
        ),
    )
    res = [
        *judge_gpus(exp, {"smi-q": ProbeOutput("smi-q", nvsmi.query(profile, {}, NODE))}),
        *judge_gpus(
            exp, {"smi-xml": ProbeOutput("smi-xml", nvsmi_xml.query_xml(profile, {}, NODE))}
        ),
        *judge_topology(exp, {"topo": ProbeOutput("topo", nvsmi.topo(profile, {}, NODE))}),
        *judge_nvlink_status(
            exp, {"nvlink": ProbeOutput("nvlink", nvsmi.nvlink_status(profile, {}, NODE))}
        ),
    ]
    if exp.nics:
        res += judge_ib_ports(exp, {"ibstat": ProbeOutput("ibstat", ib.ibstat(profile, {}, NODE))})
    assert [r for r in res if r.check.endswith(".duplicate")] == []
    assert {r.verdict for r in res if r.check in ("gpu.count", "ib.port.rate")} <= {Verdict.OK}
    assert_json_safe(res)


# ------------------------------------------------------------------------------------------
# Multi-node runs: the same rules as the single-node table (one row never stands in for another)

P5_RUN = "all-reduce-perf-2node-p5-h100-srun-prefix-table-only.txt"
P5_LAST = "66132  259.78  487.09      0    66109  259.87  487.26"


def _p5_text() -> str:
    text = (ROOT / "tests" / "fixtures" / "nccl-tests" / P5_RUN).read_text(encoding="utf-8")
    body = text.split("# ---\n", 1)[1]
    assert P5_LAST in body
    return body


def _ndr_h100_ceiling() -> Any:
    from gpuctl.config.catalog import multinode_busbw_ceiling

    return multinode_busbw_ceiling([400.0] * 8, "h100-sxm")


def test_a_multinode_busbw_above_what_the_nics_carry_fails_the_run() -> None:
    from gpuctl.validation.multinode import outcome

    forged = _p5_text().replace(P5_LAST, "66132  259.78  9999999.0      0    66109  259.87  487.26")
    got = outcome(("a", "b"), forged, ceiling=_ndr_h100_ceiling())
    assert got.busbw is None
    assert got.failure is not None
    assert "above the physical limit" in got.failure


def test_a_multinode_nan_busbw_in_the_largest_row_is_never_replaced_by_another_row() -> None:
    from gpuctl.validation.multinode import outcome

    forged = _p5_text().replace(P5_LAST, "66132  259.78  nan      0    66109  259.87  487.26")
    got = outcome(("a", "b"), forged, ceiling=_ndr_h100_ceiling())
    assert got.busbw is None
    assert got.failure is not None


def test_the_real_multinode_run_is_below_the_ceiling() -> None:
    from gpuctl.validation.multinode import outcome

    got = outcome(("a", "b"), _p5_text(), ceiling=_ndr_h100_ceiling())
    assert got.busbw == 487.09

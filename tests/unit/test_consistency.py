"""Golden config (gpuctl issue 18, point 5): VBIOS, HCA firmware, CUDA, kernel, OFED, GPU
settings equal across a node group, NCCL as pinned (gpuctl/validation/judges/consistency.py).

Real captures put into small fake clusters (the cluster of tests/unit/test_fleet_classes.py): the
odd node out is named with both values, a tie is WARN on every node, a value not shown is
UNKNOWN, a pin mismatch fails; then the lab's simulator with a `firmware` fault on one node."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from test_collect import fails_only, fault
from test_fleet_classes import MIXED, _cluster

from gpuctl.validation.bundle import NodeBundle
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.consistency import NodeFacts, judge_consistency, node_facts
from gpuctl.validation.parsing import parse
from gpuctl.validation.results import CheckResult, ValidationReport, Verdict
from gpuctl.validation.suite import judge_cluster

FIX = ROOT / "tests" / "fixtures"
H100_535 = "nvidia-smi/nvsmi-q-full-h100-8gpu-535.txt"  # VBIOS 96.00.74.00.0D on all 8
H100_565 = "nvidia-smi/nvsmi-q-full-h100-sxm-8gpu-565.txt"  # VBIOS 96.00.74.00.01 on all 8
V100_MIXED = "nvidia-smi/nvsmi-q-full-v100-sxm2-8gpu-550-single-double-bit.txt"  # two VBIOSes
IB_22_39 = "ib/ibstat-h100-2-ports-down-disabled.txt"  # MT4125 22.39.1002, MT4129 28.39.1002
IB_22_38 = "ib/ibstat-h100-some-ports-down-disabled.txt"  # MT4125 22.38.1002, MT4129 28.39.1002
UNAME = "kernel/uname-r-firecracker-guest-6.18.txt"
NCCL_2_16 = "nccl-tests/all-reduce-perf-a100-sxm4-80gb-8gpu-mpi-nccl2.16-hostname-placeholder.txt"
OFED = (
    "ib/ofed-info-s-mlnx-ofed-23.07-cx5.txt",
    "ib/ofed-info-s-mlnx-ofed-5.4-dgx.txt",
)


def _doc(nodes: str = "h[01-05]") -> dict[str, Any]:
    doc = copy.deepcopy(MIXED)
    doc["node_groups"] = [g for g in doc["node_groups"] if g["name"] in ("ctl", "h100")]
    doc["node_groups"][1]["nodes"] = nodes
    doc["slurm"]["partitions"][0]["node_groups"] = ["h100"]
    return doc


def _outputs(**files: str) -> dict[str, ProbeOutput]:
    return {kind: ProbeOutput(kind, capture_output(FIX / rel)) for kind, rel in files.items()}


def _report(doc: dict[str, Any], per_node: dict[str, dict[str, ProbeOutput]]) -> ValidationReport:
    cluster = _cluster(doc)
    bundles = {node: NodeBundle(node, outputs) for node, outputs in per_node.items()}
    return judge_cluster(cluster, bundles, charts=False)


def _config(report: ValidationReport, check: str) -> dict[str, list[CheckResult]]:
    return {
        n.node: [r for r in n.checks if r.check == check]
        for n in report.nodes
        if any(r.check == check for r in n.checks)
    }


def _verdicts(found: dict[str, list[CheckResult]]) -> dict[str, list[Verdict]]:
    return {node: [r.verdict for r in rs] for node, rs in found.items()}


def test_one_odd_node_out_of_five_fails_naming_its_value_and_the_others() -> None:
    per_node = {f"h0{i}": _outputs(**{"smi-q": H100_535}) for i in range(1, 5)}
    per_node["h05"] = _outputs(**{"smi-q": H100_565})
    vbios = _config(_report(_doc(), per_node), "config.vbios")
    assert _verdicts(vbios) == {
        **{f"h0{i}": [Verdict.OK] for i in range(1, 5)},
        "h05": [Verdict.FAIL],
    }
    [odd] = vbios["h05"]
    assert odd.message == (
        "VBIOS 96.00.74.00.01 on all 8 GPUs; the other 4 nodes of group h100 (h100-sxm) have "
        "96.00.74.00.0D"
    )
    assert odd.expected == "96.00.74.00.0D"
    [ok] = vbios["h01"]  # one OK per node and item, not one per GPU
    assert ok.message == (
        "VBIOS 96.00.74.00.0D on all 8 GPUs, as on the other 3 nodes of group h100 (h100-sxm)"
    )


def test_a_tie_is_warn_on_every_node_never_a_fail() -> None:
    per_node = {n: _outputs(**{"smi-q": H100_535}) for n in ("h01", "h02")}
    per_node |= {n: _outputs(**{"smi-q": H100_565}) for n in ("h03", "h04")}
    vbios = _config(_report(_doc("h[01-04]"), per_node), "config.vbios")
    assert _verdicts(vbios) == {n: [Verdict.WARN] for n in ("h01", "h02", "h03", "h04")}
    assert vbios["h03"][0].message == (
        "VBIOS differs, cannot tell which is right: 96.00.74.00.01 here; group h100 (h100-sxm) "
        "has 96.00.74.00.01 on 2 nodes, 96.00.74.00.0D on 2 nodes"
    )


def test_two_nodes_that_differ_cannot_be_told_apart() -> None:
    per_node = {"h01": _outputs(**{"smi-q": H100_535}), "h02": _outputs(**{"smi-q": H100_565})}
    vbios = _config(_report(_doc("h[01-02]"), per_node), "config.vbios")
    assert _verdicts(vbios) == {"h01": [Verdict.WARN], "h02": [Verdict.WARN]}


def test_a_value_not_shown_is_unknown_and_no_vote() -> None:
    per_node = {f"h0{i}": _outputs(**{"smi-q": H100_535}) for i in range(1, 3)}
    per_node["h03"] = _outputs(**{"smi-q": H100_565})
    per_node["h04"] = {}  # nvidia-smi gave nothing
    per_node["h05"] = _outputs(**{"smi-q": "nvidia-smi/nvsmi-q-d-page-retirement-8gpu-535.txt"})
    report = _report(_doc(), per_node)
    vbios = _config(report, "config.vbios")
    # 16 votes for 96.00.74.00.0D, 8 for the other: h04 and h05 count for neither
    assert _verdicts(vbios) == {
        "h01": [Verdict.OK],
        "h02": [Verdict.OK],
        "h03": [Verdict.FAIL],
        "h05": [Verdict.UNKNOWN],  # a -q -d fragment: no VBIOS line
    }
    assert "the other 2 nodes" in vbios["h03"][0].message
    assert vbios["h05"][0].message == (
        "VBIOS not shown for GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7"
    )
    # no output at all: UNKNOWN from the GPU judge, which says why; no vote here
    h04 = next(n for n in report.nodes if n.node == "h04")
    assert any(r.verdict is Verdict.UNKNOWN and "not collected" in r.message for r in h04.checks)
    # the kernel was not collected anywhere: UNKNOWN, from the node judge of `uname -r`
    kernel = _config(report, "config.kernel")
    assert {v for vs in _verdicts(kernel).values() for v in vs} == {Verdict.UNKNOWN}
    assert kernel["h01"][0].message == "not collected (uname)"


def test_gpus_of_one_node_are_compared_too() -> None:
    """The V100 capture has 88.00.4F.00.09 on GPU0, 4, 6, 7 and 88.00.13.00.02 on GPU1-3, 5:
    two such nodes and a third with the H100 capture's VBIOS on every GPU."""
    per_node = {n: _outputs(**{"smi-q": V100_MIXED}) for n in ("h01", "h02")}
    per_node["h03"] = _outputs(**{"smi-q": H100_535})
    vbios = _config(_report(_doc("h[01-03]"), per_node), "config.vbios")
    # 8 + 8 + 8 votes for three values: none has more than half
    assert _verdicts(vbios) == {n: [Verdict.WARN] for n in ("h01", "h02", "h03")}
    # four nodes, one GPU of each off: the GPUs of one node outvote each other too
    facts = {
        f"h0{i}": _facts_of(_outputs(**{"smi-q": V100_MIXED}), f"h0{i}", "h[01-04]")
        for i in range(1, 5)
    }
    found = _judged(facts, "h[01-04]", "vbios")
    # 16 votes 88.00.4F.00.09 (GPU0, 4, 6, 7 of 4 nodes), 16 the other: a tie, WARN
    assert {r.verdict for r in found} == {Verdict.WARN}
    assert len(found) == 4  # one per node


def test_one_gpu_off_among_its_own_node_fails_that_gpu() -> None:
    """Three nodes: two with the H100 capture, one whose facts are the same capture's with the
    V100 capture's GPU0 in place of its GPU3 (real values, one node's GPUs disagreeing)."""
    good = _facts_of(_outputs(**{"smi-q": H100_535}), "h01", "h[01-03]")
    other = _facts_of(_outputs(**{"smi-q": V100_MIXED}), "h01", "h[01-03]")
    odd_value = next(f for f in other.facts if f.item == "vbios" and f.subject == "GPU0").value
    mixed = NodeFacts(
        tuple(
            type(f)(f.item, f.subject, odd_value, f.peers)
            if (f.item, f.subject) == ("vbios", "GPU3")
            else f
            for f in good.facts
        )
    )
    found = _judged({"h01": good, "h02": good, "h03": mixed}, "h[01-03]", "vbios")
    [fail] = [r for r in found if r.verdict is Verdict.FAIL]
    assert fail.node == "h03"
    assert fail.message == (
        "VBIOS 88.00.4F.00.09 on GPU3; the other 2 nodes of group h100 (h100-sxm) and GPU0, "
        "GPU1, GPU2, GPU4, GPU5, GPU6, GPU7 of this node have 96.00.74.00.0D"
    )


def test_applications_clocks_set_apart_on_one_node_warn_with_the_others_value() -> None:
    """Three nodes with the H100 capture (1980/2619 MHz); the third's GPUs carry the L40S
    capture's applications clocks (2520/9001 MHz) instead: a setting, so WARN, not FAIL."""
    good = _facts_of(_outputs(**{"smi-q": H100_535}), "h01", "h[01-03]")
    l40s = _facts_of(
        _outputs(**{"smi-q": "nvidia-smi/nvsmi-q-full-l40s-1gpu.txt"}), "h01", "h[01-03]"
    )
    odd_value = next(f for f in l40s.facts if f.item == "app_clocks").value
    assert odd_value == "graphics 2520 MHz, memory 9001 MHz"
    odd = NodeFacts(
        tuple(
            type(f)(f.item, f.subject, odd_value, f.peers) if f.item == "app_clocks" else f
            for f in good.facts
        )
    )
    found = _judged({"h01": good, "h02": good, "h03": odd}, "h[01-03]", "app_clocks")
    assert {r.node: r.verdict for r in found} == {
        "h01": Verdict.OK,
        "h02": Verdict.OK,
        "h03": Verdict.WARN,
    }
    [warn] = [r for r in found if r.node == "h03"]
    assert warn.message == (
        "applications clocks graphics 2520 MHz, memory 9001 MHz on all 8 GPUs; the other 2 nodes "
        "of group h100 (h100-sxm) have graphics 1980 MHz, memory 2619 MHz"
    )


def test_hca_firmware_odd_node_out_and_adapter_families_kept_apart() -> None:
    """The ConnectX-7 (MT4129, 28.x) and ConnectX-6 Dx (MT4125, 22.x) HCAs of one node are
    two classes; the one node whose MT4125s run 22.38.1002 fails, its MT4129s are fine."""
    per_node = {f"h0{i}": _outputs(ibstat=IB_22_39) for i in range(1, 4)}
    per_node["h04"] = _outputs(ibstat=IB_22_38)
    fw = _config(_report(_doc("h[01-04]"), per_node), "config.hca_firmware")
    assert _verdicts(fw) == {
        "h01": [Verdict.OK],
        "h02": [Verdict.OK],
        "h03": [Verdict.OK],
        "h04": [Verdict.FAIL],
    }
    assert fw["h04"][0].message == (
        "firmware 22.38.1002 on all 4 HCAs; the other 3 nodes of group h100, MT4125 "
        "(firmware 22.x) HCAs have 22.39.1002"
    )


def test_kernel_and_ofed_compared_and_unknown_when_unreadable() -> None:
    doc = _doc("h[01-03]")
    doc["software"]["rdma"] = {"stack": "doca-ofed", "doca_version": "2.9.1"}
    good = {"uname": UNAME, "ofed-info": OFED[0]}
    per_node = {n: _outputs(**good) for n in ("h01", "h02")}
    per_node["h03"] = _outputs(uname=UNAME, **{"ofed-info": OFED[1]})
    report = _report(doc, per_node)
    assert _verdicts(_config(report, "config.kernel")) == {
        n: [Verdict.OK] for n in ("h01", "h02", "h03")
    }
    doca = _config(report, "config.doca")
    assert _verdicts(doca) == {"h01": [Verdict.OK], "h02": [Verdict.OK], "h03": [Verdict.FAIL]}
    assert doca["h03"][0].message == (
        "OFED MLNX_OFED_LINUX-5.4-3.5.8.0; the other 2 nodes of group h100 have "
        "MLNX_OFED_LINUX-23.07-0.5.1.2"
    )
    per_node["h03"] = {"uname": ProbeOutput("uname", "", rc=127, error="command not found")}
    report = _report(doc, per_node)
    [kernel] = _config(report, "config.kernel")["h03"]
    assert (kernel.verdict, kernel.message) == (Verdict.UNKNOWN, "uname: command not found")
    assert _verdicts(_config(report, "config.doca"))["h03"] == [Verdict.UNKNOWN]


def test_ofed_is_read_only_where_cluster_yml_installs_doca() -> None:
    exps = expectations(_cluster(_doc()))
    assert exps["h01"].doca_version is None
    doc = _doc()
    doc["software"]["rdma"] = {"stack": "doca-ofed", "doca_version": "2.9.1"}
    exps = expectations(_cluster(doc))
    assert exps["h01"].doca_version == "2.9.1"
    assert exps["ctl01"].doca_version is None  # no NIC, no RDMA stack


def test_nccl_is_judged_against_its_pin_where_the_output_shows_it() -> None:
    per_node = {n: _outputs(nccl=NCCL_2_16) for n in ("h01", "h02")}
    per_node["h03"] = _outputs(
        nccl="nccl-tests/all-reduce-perf-a100-sxm4-40gb-8gpu-with-nccl-info-line.txt"
    )
    nccl = _config(_report(_doc("h[01-03]"), per_node), "config.nccl")
    # h03's run does not print "NCCL version": no value, no result (most runs do not)
    assert _verdicts(nccl) == {"h01": [Verdict.FAIL], "h02": [Verdict.FAIL]}
    assert nccl["h01"][0].message == (
        "NCCL 2.16.2+cuda11.6, expected 2.26.2-1+cuda12.8 (software.nccl)"
    )
    doc = _doc("h[01-02]")
    doc["software"] |= {"nccl": "2.16.2-1+cuda11.6", "cuda": "11.6"}
    nccl = _config(
        _report(doc, {n: _outputs(nccl=NCCL_2_16) for n in ("h01", "h02")}), "config.nccl"
    )
    assert _verdicts(nccl) == {"h01": [Verdict.OK], "h02": [Verdict.OK]}
    doc["software"] |= {"nccl": "2.16.2-1+cuda12.8", "cuda": "12.8"}  # the release, not its CUDA
    nccl = _config(_report(doc, {"h01": _outputs(nccl=NCCL_2_16)}), "config.nccl")
    assert _verdicts(nccl) == {"h01": [Verdict.FAIL]}


def test_a_setting_no_gpu_of_the_class_shows_is_not_judged() -> None:
    """The L40S capture shows MIG Mode N/A: not a setting of that GPU, no config.mig at all."""
    per_node = {
        n: _outputs(**{"smi-q": "nvidia-smi/nvsmi-q-full-l40s-1gpu.txt"}) for n in ("h01", "h02")
    }
    report = _report(_doc("h[01-02]"), per_node)
    assert _config(report, "config.mig") == {}
    assert _verdicts(_config(report, "config.ecc")) == {"h01": [Verdict.OK], "h02": [Verdict.OK]}


def test_the_parsers_read_real_captures() -> None:
    assert parse("uname", capture_output(FIX / UNAME)).data == {"release": "6.18.44-fc-v1045"}
    ofed = parse("ofed-info", capture_output(FIX / OFED[0]))
    assert ofed.recognised
    assert ofed.data == {
        "name": "MLNX_OFED_LINUX",
        "version": "23.07-0.5.1.2",
        "release": "MLNX_OFED_LINUX-23.07-0.5.1.2",
    }
    assert not parse("uname", "Linux\n").recognised
    assert not parse("ofed-info", "").recognised


def _facts_of(outputs: dict[str, ProbeOutput], node: str, nodes: str) -> NodeFacts:
    return node_facts(expectations(_cluster(_doc(nodes)))[node], outputs)


def _judged(facts: dict[str, NodeFacts], nodes: str, item: str) -> list[CheckResult]:
    exps = expectations(_cluster(_doc(nodes)))
    return [r for r in judge_consistency(facts, exps) if r.check == f"config.{item}"]


# ------------------------------------------------------------------------------------------
# The lab's simulator: `firmware gpu=...` / `firmware hca=...` on one node of three


@pytest.mark.parametrize(
    ("value", "check", "reason"),
    [
        ("gpu=96.00.99.00.01", "config.vbios", "VBIOS 96.00.99.00.01 on all 8 GPUs"),
        ("gpu3=96.00.99.00.01", "config.vbios", "VBIOS 96.00.99.00.01 on GPU3"),
        ("mlx5_2=28.39.1002", "config.hca_firmware", "firmware 28.39.1002 on mlx5_2"),
    ],
)
def test_the_lab_firmware_fault_fails_exactly_that_node(
    cluster_yml: Path, value: str, check: str, reason: str
) -> None:
    report = fails_only(cluster_yml, cluster_yml.parent / "b", fault("firmware", value), check)
    found = _config(report, check)
    assert _verdicts(found) == {
        "gpu001": [Verdict.OK],
        "gpu002": [Verdict.FAIL],
        "gpu003": [Verdict.OK],
    }
    assert reason in found["gpu002"][0].message
    assert "the other 2 nodes of group" in found["gpu002"][0].message
    assert _verdicts(_config(report, "config.kernel")) == {
        n: [Verdict.OK] for n in ("gpu001", "gpu002", "gpu003")
    }


def test_a_node_booted_into_another_kernel_fails_config_kernel(cluster_yml: Path) -> None:
    # what `uname -r` prints there (test_collect.Sim)
    report = fails_only(
        cluster_yml, cluster_yml.parent / "b", {"kernel": "6.1.0-30-amd64"}, "config.kernel"
    )
    [odd] = _config(report, "config.kernel")["gpu002"]
    assert odd.message.startswith("kernel 6.1.0-30-amd64; the other 2 nodes of group")
    assert odd.expected == "6.1.0-31-amd64"

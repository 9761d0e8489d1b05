"""Which GPU pairs may read each other's memory (issue 18, point 7): `nvidia-smi topo -p2p r` on
real captures, judged against what the node's interconnect promises, and the lab's stand-in
under the p2p_disabled fault."""

from __future__ import annotations

import dataclasses

from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.lab.sim import faults as sim_faults
from gpuctl.lab.sim import nvbandwidth as sim_nvbandwidth
from gpuctl.lab.sim import nvsmi, profiles
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.p2p import judge_p2p_copies
from gpuctl.validation.judges.topology import judge_p2p_capability
from gpuctl.validation.probes import NVBANDWIDTH_D2D_READ, probes_for
from gpuctl.validation.results import CheckResult, Verdict

FIX = ROOT / "tests" / "fixtures" / "topo"
H100_OK = FIX / "nvsmi-topo-p2p-r-h100-8gpu-all-ok-spaces.txt"
L4_CNS = FIX / "nvsmi-topo-p2p-r-l4-2gpu-cns-no-legend-spaces.txt"
GNS = FIX / "nvsmi-topo-p2p-rw-2gpu-gns.txt"


def h100() -> NodeExpectation:
    return expectations(load_cluster(ROOT / "inventories" / "hgx-h100-ndr.yml"))["gpu001"]


def two_gpus(interconnect: str) -> NodeExpectation:
    return dataclasses.replace(h100(), gpu_count=2, interconnect=interconnect)


def judge(exp: NodeExpectation, text: str) -> list[CheckResult]:
    return judge_p2p_capability(exp, {"topo-p2p": ProbeOutput("topo-p2p", text)})


def test_every_pair_of_a_real_hgx_h100_is_ok() -> None:
    [r] = judge(h100(), capture_output(H100_OK))
    assert (r.check, r.verdict) == ("topology.p2p", Verdict.OK)
    assert "all 56 GPU pairs" in r.message


def test_pcie_gpus_without_peer_access_warn_with_the_legends_meaning() -> None:
    [r] = judge(two_gpus("pcie"), capture_output(L4_CNS))
    assert r.verdict is Verdict.WARN
    assert "peer reads CNS (Chipset not supported) for 2 GPU pair(s)" in r.message
    assert "through host memory" in r.message


def test_where_nvlink_promises_peer_access_a_refused_pair_fails() -> None:
    [r] = judge(two_gpus("nvswitch"), capture_output(GNS))
    assert r.verdict is Verdict.FAIL
    assert "GNS (GPU not supported)" in r.message
    assert "GPU0->GPU1, GPU1->GPU0" in r.message


def test_a_gpu_missing_from_the_matrix_is_unknown_never_ok() -> None:
    # a 2-GPU matrix on a node cluster.yml gives 8 GPUs
    res = judge(h100(), capture_output(L4_CNS))
    unknown = [r for r in res if r.verdict is Verdict.UNKNOWN]
    assert unknown
    assert "GPU2, GPU3" in unknown[0].message
    assert Verdict.OK not in {r.verdict for r in res}


def test_multi_gpu_nodes_run_it_at_standard() -> None:
    kinds = {p.kind for p in probes_for(h100(), "standard")}
    assert "topo-p2p" in kinds
    assert "topo-p2p" not in {p.kind for p in probes_for(h100(), "quick")}


def test_the_stand_in_and_its_fault() -> None:
    hw = profiles.load("hgx-h100-ndr")
    assert [r.verdict for r in judge(h100(), nvsmi.topo_p2p(hw, {}, "gpu002"))] == [Verdict.OK]
    fault = sim_faults.apply({}, "p2p_disabled", "5")
    [r] = judge(h100(), nvsmi.topo_p2p(hw, fault, "gpu002"))
    assert r.verdict is Verdict.FAIL
    assert "for 14 GPU pair(s)" in r.message
    # nvbandwidth cannot copy between those pairs: N/A, never a number
    text = sim_nvbandwidth.main(hw, fault, "gpu002", ["-t", NVBANDWIDTH_D2D_READ])
    read = {
        r.subject: r.verdict
        for r in judge_p2p_copies(h100(), {"nvbandwidth.d2d": ProbeOutput("nvbandwidth.d2d", text)})
        if r.check == "p2p.read"
    }
    assert set(read.values()) == {Verdict.UNKNOWN}

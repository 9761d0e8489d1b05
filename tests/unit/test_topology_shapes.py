"""GPU topologies of every shape (issue 18, point 8): the NVLink pairs each shape promises and
each GPU's rail adapter, judged on real ``nvidia-smi topo -m`` captures (tests/fixtures/topo/)
and on the lab stand-in with the ``nic_slots_swapped`` fault.

Shapes: an NVSwitch board (every pair), the model's 4-GPU NVLink board (A100 NV4), bridged
pairs (H100 NVL NV12), a mesh cluster.yml describes (the DGX-1 hybrid cube mesh); rails
(``nics[].rails``): GPU i's adapter is ``devices``' adapter ``i x adapters // GPUs``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ROOT

from gpuctl.config.loader import load_cluster_text
from gpuctl.errors import ConfigError
from gpuctl.lab import lab
from gpuctl.lab.sim import nvsmi, profiles
from gpuctl.lab.sim.faults import apply
from gpuctl.validation.capture import capture_output
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges.base import ProbeOutput
from gpuctl.validation.judges.topology import judge_topology
from gpuctl.validation.results import CheckResult, Verdict

TOPO = ROOT / "tests" / "fixtures" / "topo"
DELLA_A100_4GPU = "nvsmi-topo-m-a100-sxm4-80gb-4gpu-nv4-1nic-della.txt"
H100_NVL_PAIRS = "nvsmi-topo-m-h100-nvl-8gpu-nv12-pairs-2nic-spaces.txt"
DGX1 = "nvsmi-topo-m-v100-dgx1-8gpu-hybrid-cube-mesh-4nic.txt"
DGX_A100_10NIC = "nvsmi-topo-m-a100-sxm4-40gb-8gpu-10nic-nic-legend-525.txt"
AZURE_NDV4 = "nvsmi-topo-m-a100-40gb-8gpu-azure-ndv4-blank-nic-names-ansi.txt"

# the DGX-1's hybrid cube mesh as its topo -m shows it (read off DGX1): (a, b, links)
DGX1_MESH = [
    (0, 1, 1), (0, 2, 1), (0, 3, 2), (0, 4, 2), (1, 2, 2), (1, 3, 1), (1, 5, 2), (2, 3, 2),
    (2, 6, 1), (3, 7, 1), (4, 5, 1), (4, 6, 1), (4, 7, 2), (5, 6, 2), (5, 7, 1), (6, 7, 2),
]  # fmt: skip


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (ROOT / "inventories" / "a100-roce.yml").read_text(encoding="utf-8")
    )
    return doc


def _gpu_group(doc: dict[str, Any]) -> dict[str, Any]:
    group: dict[str, Any] = next(g for g in doc["node_groups"] if g.get("gpus"))
    return group


def _cluster(gpus: dict[str, Any], nics: list[dict[str, Any]] | None = None) -> str:
    doc = _doc()
    group = _gpu_group(doc)
    count = int(gpus["count"])  # the group's 2 sockets: half the GPUs on each
    group["gpus"] = {"cpu_affinity": [0] * (count // 2) + [1] * (count - count // 2), **gpus}
    if nics is not None:
        group["nics"] = nics
    return yaml.safe_dump(doc)


def _exp(gpus: dict[str, Any], nics: list[dict[str, Any]] | None = None) -> NodeExpectation:
    cluster = load_cluster_text(_cluster(gpus, nics), "cluster.yml")
    exp = expectations(cluster)
    node = next(n for n, e in exp.items() if e.gpu_count)
    return exp[node]


def _problems(gpus: dict[str, Any], nics: list[dict[str, Any]] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_cluster_text(_cluster(gpus, nics), "cluster.yml")
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


def _judge(exp: NodeExpectation, text: str) -> list[CheckResult]:
    return judge_topology(exp, {"topo": ProbeOutput("topo", text)})


def _fixture(name: str) -> str:
    return capture_output(TOPO / name)


def _of(results: list[CheckResult], check: str) -> list[tuple[str, Verdict]]:
    return [(r.subject or "", r.verdict) for r in results if r.check == check]


def _mesh(pairs: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    return [{"gpus": [a, b], "links": n} for a, b, n in pairs]


# ------------------------------------------------------------------------------------------
# NVLink pairs


def test_the_a100_4gpu_board_is_nv4_on_every_pair_as_a_real_one_shows() -> None:
    # no interconnect given: 4 A100 SXM4 are the model's NVLink board (data/gpu_models.yml)
    exp = _exp({"model": "a100-sxm4-80gb", "count": 4})
    assert exp.interconnect == "nvlink"
    assert exp.nvlink_pairs == tuple((a, b, 4) for a in range(4) for b in range(a + 1, 4))
    res = _judge(exp, _fixture(DELLA_A100_4GPU))
    assert _of(res, "topology.nvlink") == [("", Verdict.OK)]
    # one pair down to NV2 (a bad bridge of the board): that pair alone fails
    lines = _fixture(DELLA_A100_4GPU).splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(("GPU1\t", "GPU3\t")):
            cells = line.split("\t")
            other = 4 if line.startswith("GPU1") else 2  # GPU3 in GPU1's row, GPU1 in GPU3's
            cells[other] = "NV2"
            lines[i] = "\t".join(cells)
    res = _judge(exp, "".join(lines))
    assert _of(res, "topology.nvlink") == [("GPU1-GPU3", Verdict.FAIL)]
    [bad] = [r for r in res if r.check == "topology.nvlink"]
    assert (bad.measured, bad.expected) == ("NV2", "NV4")
    assert "GPU1-GPU3 is NV2, expected NV4" in bad.message


def test_bridged_pairs_are_judged_pair_by_pair_and_nothing_else_between_gpus() -> None:
    exp = _exp({"model": "h100-nvl", "count": 8, "interconnect": "nvlink-bridge"})
    assert exp.nvlink_pairs == ((0, 1, 12), (2, 3, 12), (4, 5, 12), (6, 7, 12))
    text = _fixture(H100_NVL_PAIRS)
    assert _of(_judge(exp, text), "topology.nvlink") == [("", Verdict.OK)]
    # a bridge pulled off GPU4-GPU5: the pair shows PCIe (NODE) both ways
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(("GPU4 ", "GPU5 ")):
            lines[i] = line.replace("NV12", "NODE", 1)
    res = _judge(exp, "".join(lines))
    assert _of(res, "topology.nvlink") == [("GPU4-GPU5", Verdict.FAIL)]
    # the same capture against a mesh that wants more: the model's own bridge count is NV12
    two_bridges = _exp(
        {
            "model": "h100-nvl",
            "count": 8,
            "interconnect": "nvlink-bridge",
            "nvlink_mesh": _mesh([(0, 1, 12), (2, 3, 18)]),
        }
    )
    assert _of(_judge(two_bridges, text), "topology.nvlink") == [("GPU2-GPU3", Verdict.FAIL)]


def test_a_mesh_from_cluster_yml_the_dgx1_hybrid_cube_mesh() -> None:
    gpus = {
        "model": "a100-sxm4-80gb",
        "count": 8,
        "interconnect": "nvlink",
        "nvlink_mesh": _mesh(DGX1_MESH),
    }
    exp = _exp(gpus)
    assert exp.nvlink_source == "cluster.yml (gpus.nvlink_mesh)"
    res = _judge(exp, _fixture(DGX1))
    assert _of(res, "topology.nvlink") == [("", Verdict.OK)]
    assert "all 16 NVLink pairs" in next(r.message for r in res if r.check == "topology.nvlink")
    # a mesh that wants two links where the DGX-1 has one: only that pair fails
    wrong = [(0, 1, 2) if p[:2] == (0, 1) else p for p in DGX1_MESH]
    res = _judge(_exp({**gpus, "nvlink_mesh": _mesh(wrong)}), _fixture(DGX1))
    assert _of(res, "topology.nvlink") == [("GPU0-GPU1", Verdict.FAIL)]
    # a pair the mesh lists that topo -m shows as PCIe
    extra = [*DGX1_MESH, (0, 5, 1)]
    res = _judge(_exp({**gpus, "nvlink_mesh": _mesh(extra)}), _fixture(DGX1))
    assert _of(res, "topology.nvlink") == [("GPU0-GPU5", Verdict.FAIL)]
    assert "GPU0-GPU5 is SYS, expected NV1" in next(
        r.message for r in res if r.check == "topology.nvlink"
    )


def test_a_gpu_missing_from_topo_leaves_its_pairs_and_rails_to_the_gpu_count_check() -> None:
    # the GPUs after a missing one are renumbered: GPU3 of topo -m is another GPU than
    # cluster.yml's GPU3, so no pair or rail is judged by index; topology.gpus fails the node
    exp = _exp({"model": "a100-sxm4-80gb", "count": 4})
    three = "\n".join(
        line for line in _fixture(DELLA_A100_4GPU).splitlines() if not line.startswith("GPU3")
    ).replace("\tGPU3", "", 1)
    res = _judge(exp, three)
    assert [r.verdict for r in res if r.check == "topology.gpus"] == [Verdict.FAIL]
    assert _of(res, "topology.nvlink") == []
    lost = "\n".join(
        line for line in _fixture(DGX1).splitlines() if not line.startswith("GPU7")
    ).replace("\tGPU7", "", 1)
    res = _judge(_rails("mlx5_[0-3]"), lost)
    assert _of(res, "topology.rail") == []
    assert [r.verdict for r in res if r.check == "topology.gpus"] == [Verdict.FAIL]
    # on an NVSwitch board every pair is alike: the pairs left are still judged
    h100 = NodeExpectation(
        "n", "g", gpu_count=8, interconnect="nvswitch",
        nvlink_pairs=tuple((a, b, 18) for a in range(8) for b in range(a + 1, 8)),
    )  # fmt: skip
    princeton = _fixture("nvsmi-topo-m-h100-8gpu-6nic-blank-cpuaffinity.txt")
    seven = "\n".join(ln for ln in princeton.splitlines() if not ln.startswith("GPU7"))
    res = _judge(h100, seven.replace("\tGPU7", "", 1))
    assert _of(res, "topology.nvlink") == [("", Verdict.OK)]


def test_pcie_gpus_expect_no_nvlink_and_warn_without_an_adapter_behind_their_switch() -> None:
    # 8 RTX 4090 on PCIe (every pair SYS; the two adapters on GPU6's host bridge, PHB)
    exp = _exp({"model": "l40s", "count": 8, "interconnect": "pcie"})
    assert exp.nvlink_pairs == ()
    res = _judge(exp, _fixture("nvsmi-topo-m-rtx4090-8gpu-all-sys-2nic-no-legend.txt"))
    assert _of(res, "topology.nvlink") == []
    assert _of(res, "topology.gpus") == []
    assert _of(res, "topology.gpu_nic_affinity") == [(f"GPU{g}", Verdict.WARN) for g in range(8)]


@pytest.mark.parametrize(
    ("gpus", "says"),
    [
        (
            {"model": "a100-sxm4-80gb", "count": 8, "interconnect": "nvswitch",
             "nvlink_mesh": _mesh([(0, 1, 12)])},
            "nvlink_mesh: nvlink_mesh describes nvlink and nvlink-bridge GPUs, not nvswitch",
        ),
        (
            {"model": "l40s", "count": 2, "interconnect": "pcie",
             "nvlink_mesh": _mesh([(0, 1, 1)])},
            "nvlink_mesh: nvlink_mesh describes nvlink and nvlink-bridge GPUs, not pcie",
        ),
        (
            {"model": "a100-sxm4-80gb", "count": 4, "nvlink_mesh": _mesh([(1, 1, 4)])},
            "nvlink_mesh[0].gpus: GPU 1 paired with itself",
        ),
        (
            {"model": "a100-sxm4-80gb", "count": 4, "nvlink_mesh": _mesh([(0, 4, 4)])},
            "nvlink_mesh[0].gpus: GPU 4 is not one of the 4 GPUs",
        ),
        (
            {"model": "a100-sxm4-80gb", "count": 4,
             "nvlink_mesh": _mesh([(0, 1, 4), (1, 0, 2)])},
            "nvlink_mesh[1].gpus: the pair 0-1 is listed twice",
        ),
        (
            {"model": "a100-sxm4-80gb", "count": 2, "interconnect": "nvlink"},
            "gpus: gpuctl knows no nvlink board of 2 a100-sxm4-80gb GPUs (its NVLink board "
            "has 4 GPUs): list the NVLink pairs in nvlink_mesh",
        ),
    ],
)  # fmt: skip
def test_a_mesh_that_cannot_be_is_refused_with_its_path(gpus: dict[str, Any], says: str) -> None:
    problems = _problems(gpus)
    assert any(says in p for p in problems), problems


# ------------------------------------------------------------------------------------------
# Rails


def _rails(devices: str, gpus: int = 8, model: str = "a100-sxm4-80gb") -> NodeExpectation:
    return _exp(
        {"model": model, "count": gpus},
        nics=[{"devices": devices, "fabric": "roce", "rails": True}],
    )


def test_each_gpus_rail_adapter_must_be_its_nearest_dgx1() -> None:
    # the DGX-1: GPU0-1 behind mlx5_0, GPU2-3 mlx5_1, GPU4-5 mlx5_2, GPU6-7 mlx5_3 (the column
    # headers of the old driver name them, in PCI order mlx5_0, mlx5_2, mlx5_1, mlx5_3)
    exp = _rails("mlx5_[0-3]")
    assert exp.rails == tuple((g, f"mlx5_{g // 2}") for g in range(8))
    res = _judge(exp, _fixture(DGX1))
    assert _of(res, "topology.rail") == [("", Verdict.OK)]
    # the rails written in PCI order: GPU2-5 get an adapter across the CPUs
    res = _judge(_rails("mlx5_0,mlx5_2,mlx5_1,mlx5_3"), _fixture(DGX1))
    assert _of(res, "topology.rail") == [
        ("GPU2", Verdict.FAIL), ("GPU3", Verdict.FAIL), ("GPU4", Verdict.FAIL),
        ("GPU5", Verdict.FAIL),
    ]  # fmt: skip
    gpu2 = next(r for r in res if r.subject == "GPU2")
    assert "GPU2's rail adapter mlx5_2 is SYS from it, mlx5_1 PIX" in gpu2.message
    assert gpu2.source == "cluster.yml (nics[].rails)"


def test_rails_on_a_dgx_a100_with_its_nic_legend() -> None:
    # eight compute adapters mlx5_0-7 in pairs behind each GPU pair's switch (PXB), mlx5_8-9
    # (storage) elsewhere: rail i is mlx5_i
    res = _judge(_rails("mlx5_[0-7]"), _fixture(DGX_A100_10NIC))
    assert _of(res, "topology.rail") == [("", Verdict.OK)]
    # a shifted naming (mlx5_1 missing at boot: every later adapter one name lower) as
    # cluster.yml still lists them
    res = _judge(_rails("mlx5_0,mlx5_[2-8]"), _fixture(DGX_A100_10NIC))
    failed = [s for s, v in _of(res, "topology.rail") if v is Verdict.FAIL]
    assert failed == ["GPU1", "GPU3", "GPU5", "GPU7"]


def test_no_adapter_names_in_topo_is_unknown_never_a_pass() -> None:
    # Azure NDv4: the NIC columns have no names
    res = _judge(_rails("mlx5_[0-7]"), _fixture(AZURE_NDV4))
    assert [v for _, v in _of(res, "topology.rail")] == [Verdict.UNKNOWN]
    # a rail adapter topo -m does not show
    res = _judge(_rails("mlx5_[0-3]", gpus=4), _fixture(DELLA_A100_4GPU))
    verdicts = _of(res, "topology.rail")
    assert ("GPU1", Verdict.UNKNOWN) in verdicts
    assert Verdict.OK not in {v for _, v in verdicts}


def test_rails_that_cannot_be_shared_evenly_or_without_gpus_are_refused() -> None:
    problems = _problems(
        {"model": "a100-sxm4-80gb", "count": 8},
        nics=[{"devices": "mlx5_[0-2]", "fabric": "roce", "rails": True}],
    )
    assert any(
        p.endswith("nics[0].rails: 3 on roce rail adapters cannot be shared evenly by 8 GPUs "
                   "(give as many adapters, a divisor or a multiple of the GPU count)")
        for p in problems
    ), problems  # fmt: skip
    doc = _doc()
    head = next(g for g in doc["node_groups"] if not g.get("gpus"))
    head["nics"] = [{"devices": "mlx5_0", "fabric": "roce", "rails": True}]
    with pytest.raises(ConfigError) as caught:
        load_cluster_text(yaml.safe_dump(doc), "cluster.yml")
    assert any(
        "rails pair adapters with GPUs; this group has no GPUs" in p.message
        for p in caught.value.problems
    )


# ------------------------------------------------------------------------------------------
# The lab: each profile's stand-in passes its own cluster.yml; the fault fails its two GPUs


def _lab_exp(profile: str, tmp_path: Path) -> NodeExpectation:
    text = lab.lab_cluster_text(2, profile)
    cluster = load_cluster_text(text, "lab")
    return expectations(cluster)["gpu002"]


@pytest.mark.parametrize("profile", profiles.names())
def test_every_lab_profile_passes_its_own_topology(profile: str, tmp_path: Path) -> None:
    exp = _lab_exp(profile, tmp_path)
    hardware = profiles.load(profile)
    res = _judge(exp, nvsmi.topo(hardware, {}, "gpu002"))
    assert [
        r for r in res if r.verdict is not Verdict.OK and r.check != "topology.gpu_nic_affinity"
    ] == []
    if hardware.get("nics") and exp.gpu_count > 1:
        assert exp.rails, "the lab's cluster.yml declares its adapters as rails"
        assert _of(res, "topology.rail") == [("", Verdict.OK)]


def test_nic_slots_swapped_fails_the_two_gpus_whose_rails_moved(tmp_path: Path) -> None:
    exp = _lab_exp("hgx-h100-ndr", tmp_path)
    hardware = profiles.load("hgx-h100-ndr")
    faults = apply({}, "nic_slots_swapped", "mlx5_1,mlx5_6")
    res = _judge(exp, nvsmi.topo(copy.deepcopy(hardware), dict(faults), "gpu002"))
    assert _of(res, "topology.rail") == [("GPU1", Verdict.FAIL), ("GPU6", Verdict.FAIL)]
    gpu1 = next(r for r in res if r.subject == "GPU1" and r.check == "topology.rail")
    assert "GPU1's rail adapter mlx5_1 is SYS from it, mlx5_6 PIX" in gpu1.message
    assert [r.check for r in res if r.verdict is Verdict.FAIL] == ["topology.rail"] * 2

"""Per-rail multi-node nccl-tests (gpuctl/validation/rails.py; issue 18, point 9): the srun
command of one rail, its floor, and the collector's rail runs over a fake transport that answers
srun with the lab's simulator (whose all_reduce_perf honours NCCL_IB_HCA): a port slow on one
adapter of one node hides in the group's run and fails that rail on that node alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from test_collect import FakeRunning, done, fault
from test_multinode import SlurmSim, run_long

from gpuctl.config import load_cluster
from gpuctl.lab.sim import ranks as sim_ranks
from gpuctl.lab.sim.faults import apply
from gpuctl.validation.api import judge_bundle
from gpuctl.validation.bundle import META_FILE, MULTINODE_DIR
from gpuctl.validation.expect import ExpectedNic, NodeExpectation, expectations
from gpuctl.validation.multinode import SrunOptions
from gpuctl.validation.rails import (
    RAIL_CHECK,
    folder_name,
    rail_argv,
    rail_gpus,
    rail_limits,
    split_folder,
)
from gpuctl.validation.results import ValidationReport, Verdict


def _rails(report: ValidationReport) -> dict[tuple[str, str], tuple[Verdict, str]]:
    return {
        (n.node, c.subject or ""): (c.verdict, c.message)
        for n in report.nodes
        for c in n.checks
        if c.check == RAIL_CHECK
    }


def _group(report: ValidationReport) -> dict[str, Verdict]:
    return {
        n.node: c.verdict for n in report.nodes for c in n.checks if c.check == "nccl.multinode"
    }


def test_one_rails_command_holds_nccl_to_its_adapter_and_gpus() -> None:
    argv = rail_argv(
        ["gpu001", "gpu002", "gpu003"], "mlx5_3", (6, 7), 8, SrunOptions(partition="gpu")
    )
    assert argv == (
        "srun", "--nodes=3", "--ntasks-per-node=1", "--gpus-per-node=8",
        "--nodelist=gpu[001-003]", "--mpi=pmix", "--time=10", "--immediate=60", "--exclusive",
        "--label", "--job-name=gpuctl-nccl-rail", "--partition=gpu",
        "env", "NCCL_IB_HCA==mlx5_3", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES=6,7", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "2",
    )  # fmt: skip
    assert split_folder(folder_name("hgx", "mlx5_3")) == ("hgx", "mlx5_3")
    assert split_folder("hgx") == ("hgx", None)


def _exp(thresholds: dict[str, float] | None = None) -> NodeExpectation:
    nics = tuple(ExpectedNic(f"mlx5_{i}", "ib", "infiniband", 400) for i in range(4))
    return NodeExpectation(
        node="gpu001",
        group="hgx",
        gpu_model="h100-sxm",
        gpu_count=8,
        nics=nics,
        rails=tuple((g, f"mlx5_{g // 2}") for g in range(8)),
        thresholds=thresholds or {},
        sources={"nccl_multinode_busbw_gbs": "cluster.yml"},
    )


def test_a_rails_floor_is_its_adapters_share_or_the_groups_floor_shared() -> None:
    exp = _exp()
    assert rail_gpus(exp) == {f"mlx5_{i}": (2 * i, 2 * i + 1) for i in range(4)}
    value, source, ceiling = rail_limits(exp, "mlx5_1")
    assert value == 37.5  # 0.75 x 400 Gb/s / 8
    assert "mlx5_1's line rate (400 Gb/s = 50 GB/s)" in source
    assert ceiling is not None
    value, source, _ = rail_limits(_exp({"nccl_multinode_busbw_gbs": 160.0}), "mlx5_1")
    assert value == 40.0
    assert source == "nccl_multinode_busbw_gbs 160 (cluster.yml) shared by 4 rails"


def test_the_lab_standin_runs_through_the_named_adapter_alone() -> None:
    from test_collect import PROFILE

    faults = dict(apply({}, "ib_rate", "mlx5_2:200"))
    whole = sim_ranks.capacity(PROFILE, faults, "gpu002")
    slow = sim_ranks.capacity(PROFILE, faults, "gpu002", "=mlx5_2")
    fine = sim_ranks.capacity(PROFILE, faults, "gpu002", "=mlx5_3")
    assert slow * 2 == fine  # the port at 200 of 400
    assert whole > 7 * fine  # the group's run loses only 1/16 of its bandwidth
    assert sim_ranks.capacity(PROFILE, {}, "gpu002", "=mlx5_99") == sim_ranks.SOCKET_GBS


def test_a_slow_rail_hidden_in_the_groups_run_is_found_on_its_node(cluster_yml: Path) -> None:
    sim = SlurmSim({"gpu002": fault("ib_rate", "mlx5_2:200")})
    res, _ = run_long(cluster_yml, sim)
    # the group's run passes: one port of eight at half rate costs it 1/16
    assert set(_group(res.report).values()) == {Verdict.OK}
    rails = _rails(res.report)
    assert len(rails) == 3 * 8
    failed = {k: v for k, v in rails.items() if v[0] is not Verdict.OK}
    assert list(failed) == [("gpu002", "mlx5_2")]
    verdict, message = failed["gpu002", "mlx5_2"]
    assert verdict is Verdict.FAIL
    assert message.startswith("rail mlx5_2: gpu002: multi-node all_reduce runs with gpu002")
    folder = res.bundle / MULTINODE_DIR / "gpu@mlx5_2"
    meta = json.loads((folder / META_FILE).read_text())
    assert (meta["rail"], meta["gpus"]) == ("mlx5_2", [2])
    assert meta["threshold"] == 37.5
    assert "NCCL_IB_HCA==mlx5_2" in meta["runs"][0]["command"]
    # offline: the same verdicts from the bundle alone
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    assert _rails(again.report) == rails


def test_a_rail_the_bundle_does_not_hold_is_unknown_never_passed(cluster_yml: Path) -> None:
    res, _ = run_long(cluster_yml, SlurmSim())
    shutil.rmtree(res.bundle / MULTINODE_DIR / "gpu@mlx5_5")
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    rails = _rails(again.report)
    assert {v for (_, hca), (v, _) in rails.items() if hca == "mlx5_5"} == {Verdict.UNKNOWN}
    assert {v for (_, hca), (v, _) in rails.items() if hca != "mlx5_5"} == {Verdict.OK}
    assert set(again.failed_nodes) == {"gpu001", "gpu002", "gpu003"}


def test_rails_are_not_run_where_srun_refused_the_groups_run(cluster_yml: Path) -> None:
    sruns: list[list[str]] = []

    def answer(node: str, argv: list[str]) -> FakeRunning:
        if argv[:1] == ["srun"]:
            sruns.append(argv)
            return done("", 1, "srun: error: Invalid MPI type 'pmix', --mpi=list for acceptable "
                        "types\n")  # fmt: skip
        return SlurmSim()(node, argv)

    res, _ = run_long(cluster_yml, answer)
    assert len(sruns) == 1
    rails = _rails(res.report)
    assert len(rails) == 3 * 8
    assert {v for v, _ in rails.values()} == {Verdict.UNKNOWN}
    assert all("srun refused the group's run" in m for _, m in rails.values())


def test_groups_without_rails_run_no_rail_runs(cluster_yml: Path) -> None:
    text = cluster_yml.read_text(encoding="utf-8")
    cluster_yml.write_text(text.replace("        rails: true", "        rails: false"))
    assert not any(e.rails for e in expectations(load_cluster(cluster_yml)).values())
    sim = SlurmSim()
    res, _ = run_long(cluster_yml, sim)
    assert len(sim.sruns) == 1
    assert _rails(res.report) == {}


def test_a_rail_folder_judges_only_that_rails_nodes_of_its_group(cluster_yml: Path) -> None:
    res, _ = run_long(cluster_yml, SlurmSim())
    root = res.bundle / MULTINODE_DIR
    # a folder for an adapter that is no rail of the group: not gpuctl's, nothing judged from it
    shutil.copytree(root / "gpu@mlx5_1", root / "gpu@mlx5_99")
    # a rail folder whose meta.json lists a node of another group (ctl01): left out
    meta = json.loads((root / "gpu@mlx5_1" / META_FILE).read_text())
    meta["nodes"] = [*meta["nodes"], "ctl01"]
    (root / "gpu@mlx5_1" / META_FILE).write_text(json.dumps(meta))
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    rails = _rails(again.report)
    assert {hca for _, hca in rails} == {f"mlx5_{i}" for i in range(8)}
    assert {node for node, _ in rails} == {"gpu001", "gpu002", "gpu003"}


def test_rails_not_measured_say_why_as_the_groups_run(cluster_yml: Path) -> None:
    def answer(node: str, argv: list[str]) -> FakeRunning:
        if argv[:3] == ["scontrol", "show", "node"]:
            return done("", 1, "slurm_load_node error: Unable to contact slurm controller\n")
        return SlurmSim()(node, argv)

    res, _ = run_long(cluster_yml, answer)
    rails = _rails(res.report)
    assert len(rails) == 3 * 8
    assert {v for v, _ in rails.values()} == {Verdict.UNKNOWN}
    assert all("bundle holds no run" not in m for _, m in rails.values()), rails

"""Multi-node nccl-tests (gpuctl/validation/multinode.py): the srun command, reading runs with
srun's rank prefixes (real fixtures), the locator over scripted run functions (budget, two
slow nodes, a slow link, failed runs), and the collector's phase 3 over a fake transport that
answers srun with the lab's simulator."""

from __future__ import annotations

import json
import math
import shlex
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from test_collect import PROFILE, FakeConnector, FakeRunning, Sim, done, fault

from gpuctl.config import load_cluster
from gpuctl.lab.sim import perf as sim_perf
from gpuctl.lab.sim import ranks as sim_ranks
from gpuctl.validation import multinode as mn
from gpuctl.validation import multinode_bundle, multinode_collect
from gpuctl.validation.api import judge_bundle, validate
from gpuctl.validation.bundle import META_FILE, MULTINODE_DIR
from gpuctl.validation.expect import expectations
from gpuctl.validation.multinode import RunOutcome, SrunOptions, locate, outcome, srun_argv
from gpuctl.validation.results import Verdict

FIXTURES = ROOT / "tests" / "fixtures" / "nccl-tests"


def per_gpu(cluster_yml: Path) -> Path:
    """The lab starter without its `validation.multinode.rank_per: node` (the lab's 2-CPU nodes
    need it): the default, one rank per GPU."""
    text = cluster_yml.read_text(encoding="utf-8")
    block = text[text.index("validation:\n  multinode:") : text.index("rollout:")]
    cluster_yml.write_text(text.replace(block, ""), encoding="utf-8")
    return cluster_yml


def fixture_text(name: str) -> str:
    """A fixture's output: everything after its provenance header (up to the first '# ---')."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return text.split("# ---\n", 1)[1]


# ------------------------------------------------------------------------------------------
# The command


def test_srun_command_one_rank_per_gpu() -> None:
    argv = srun_argv(["gpu001", "gpu002", "gpu003"], 8)
    assert shlex.join(argv) == (
        "srun --nodes=3 --ntasks-per-node=8 --gpus-per-node=8 '--nodelist=gpu[001-003]' "
        "--mpi=pmix --time=10 --immediate=60 --exclusive --label "
        "--job-name=gpuctl-nccl-multinode all_reduce_perf -b 8 -e 8G -f 2 -g 1"
    )


def test_srun_command_with_partition_reservation_and_mpi() -> None:
    options = SrunOptions(mpi="pmi2", partition="gpu", reservation="maint.1")
    argv = srun_argv(["a1", "b7"], 4, options)
    assert "--mpi=pmi2" in argv
    assert "--nodelist=a1,b7" in argv
    assert argv.index("--partition=gpu") < argv.index("all_reduce_perf")
    assert "--reservation=maint.1" in argv
    assert argv[-8:] == ("all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1")[-8:]


def test_srun_command_one_rank_per_node() -> None:
    argv = srun_argv(["gpu001", "gpu002"], 8, SrunOptions(rank_per="node"))
    assert "--ntasks-per-node=1" in argv
    assert "--gpus-per-node=8" in argv
    assert argv[-2:] == ("-g", "8")


@pytest.mark.parametrize(("nodes", "gpus"), [(["gpu001"], 8), (["gpu001", "gpu002"], 0)])
def test_srun_command_needs_two_nodes_with_gpus(nodes: list[str], gpus: int) -> None:
    with pytest.raises(ValueError, match="multi-node run needs"):
        srun_argv(nodes, gpus)


def test_the_run_timeout_outlasts_srun_time_limit() -> None:
    assert mn.RUN_TIMEOUT_S > mn.RUN_TIME_LIMIT_MIN * 60


# ------------------------------------------------------------------------------------------
# Reading a run: srun --label prefixes (real outputs)


@pytest.mark.parametrize(
    ("name", "busbw", "size"),
    [
        ("all-reduce-perf-2node-p5-h100-srun-prefix-table-only.txt", 487.09, 17179869184),
        ("all-reduce-perf-2node-p4de-a100-srun-prefix-table-only.txt", 78.33, 2147483648),
    ],
)
def test_outcome_reads_srun_prefixed_tables(name: str, busbw: float, size: int) -> None:
    got = outcome(("a", "b"), fixture_text(name))
    assert got == RunOutcome(("a", "b"), busbw=busbw, size=size)
    assert got.passes(busbw)
    assert not got.passes(busbw + 0.01)


def test_outcome_of_a_real_16_rank_run_without_prefixes() -> None:
    text = fixture_text("all-reduce-perf-a100-2node-16rank-nccl2.12-host-placeholders.txt")
    assert outcome(("a", "b"), text).busbw == 182.80


def test_an_error_line_of_another_rank_fails_the_run() -> None:
    text = fixture_text("all-reduce-perf-2node-p5-h100-srun-prefix-table-only.txt")
    text += "9: gpu002: Test NCCL failure common.cu:1005 'unhandled system error'\n"
    got = outcome(("a", "b"), text, rc=1)
    assert got.busbw is None
    assert got.failure is not None
    assert "Test NCCL failure" in got.failure


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"timed_out": True}, "timed out"),
        ({"error": "ssh: the connection was lost"}, "ssh: the connection was lost"),
        (
            {
                "rc": 1,
                "stderr": "srun: error: mpi/pmix_v4: init: (null) [0]: mpi_pmix.c:195: pmi/pmix: "
                "can not load PMIx library\nsrun: error: Invalid MPI type 'pmix', --mpi=list "
                "for acceptable types\n",
            },
            "pmi/pmix: can not load PMIx library",
        ),
    ],
)
def test_a_run_without_output_is_a_failure_not_zero(kwargs: dict[str, Any], why: str) -> None:
    got = outcome(("a", "b"), "", **kwargs)
    assert got.busbw is None
    assert got.failure is not None
    assert why in got.failure
    assert not got.passes(0.0)  # never read as 0 GB/s
    assert got.refused is ("PMIx" in why)  # srun refused the request itself


def test_wrong_results_fail_the_run() -> None:
    states = [sim_ranks.node_state(PROFILE, {"nccl_wrong": 3}, "n1", 8)]
    states.append(sim_ranks.node_state(PROFILE, {}, "n2", 8))
    text = sim_perf.all_reduce_perf_ranks(sim_perf.NcclArgs(8, 8 << 30, 2, 1), states, 8)
    got = outcome(("n1", "n2"), text, rc=1)
    assert got.failure is not None
    assert got.busbw is None


# ------------------------------------------------------------------------------------------
# The locator


class Cluster:
    """A scripted run function: a run reaches the lowest capacity of its nodes (400 GB/s
    unless given); ``fails`` are nodes whose runs fail outright; ``link`` a pair whose runs
    reach 50 GB/s; ``scale`` a node count from which every run reaches 50 GB/s."""

    def __init__(
        self,
        capacity: Mapping[str, float] | None = None,
        *,
        fails: frozenset[str] = frozenset(),
        link: tuple[str, str] | None = None,
        scale: int | None = None,
    ) -> None:
        self.capacity = dict(capacity or {})
        self.fails = fails
        self.link = link
        self.scale = scale
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, nodes: tuple[str, ...]) -> RunOutcome:
        self.calls.append(nodes)
        if self.fails & set(nodes):
            return RunOutcome(nodes, failure="srun: error: gpu: task 9: Exited with exit code 1")
        bw = min(self.capacity.get(n, 400.0) for n in nodes)
        if self.link is not None and set(self.link) <= set(nodes):
            bw = min(bw, 50.0)
        if self.scale is not None and len(nodes) >= self.scale:
            bw = min(bw, 50.0)
        return RunOutcome(nodes, busbw=bw, size=8 << 30)


def names(n: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(1, n + 1)]


def test_a_healthy_group_takes_one_run() -> None:
    run = Cluster()
    loc = locate(names(8), run, 300.0)
    assert loc.passed
    assert len(run.calls) == 1
    assert set(loc.cleared) == set(names(8))
    assert loc.slow == ()
    assert loc.unresolved == ()
    found = mn.findings(loc)
    assert {r.verdict for r in found.values()} == {Verdict.OK}
    assert found["gpu001"].message == "all_reduce over 8 nodes: busbw 400 GB/s >= 300"


@pytest.mark.parametrize("n", [3, 4, 5, 8, 16, 33])
def test_one_slow_node_is_located_in_logarithmic_runs(n: int) -> None:
    bound = math.ceil(math.log2(n)) + 5  # full run, bisection, two confirmations, the rest
    for slow in names(n):
        run = Cluster({slow: 41.0})
        loc = locate(names(n), run, 300.0)
        assert loc.slow == (slow,), (slow, run.calls)
        assert set(loc.cleared) == set(names(n)) - {slow}
        assert loc.unresolved == ()
        assert loc.links == ()
        assert len(run.calls) <= bound, (slow, run.calls)
        assert len(run.calls) == len(set(map(frozenset, run.calls)))  # no run twice
        assert not loc.exhausted


def test_the_finding_names_both_bandwidths_and_the_threshold() -> None:
    loc = locate(names(3), Cluster({"gpu003": 41.0}, link=None), 150.0)
    found = mn.findings(loc, "test")
    slow = found["gpu003"]
    assert slow.verdict is Verdict.FAIL
    assert slow.message == (
        "gpu003: multi-node all_reduce runs with gpu003 reach 41 GB/s, runs without it "
        "400 GB/s; threshold 150 GB/s"
    )
    assert (slow.measured, slow.expected, slow.unit, slow.source) == (41.0, 150.0, "GB/s", "test")
    assert any(e.startswith("gpu[001-003] (3 nodes): 41 GB/s") for e in slow.evidence)
    assert found["gpu001"].verdict is Verdict.OK
    assert found["gpu001"].message.startswith("cleared: 400 GB/s >= 150 in a run of 2 nodes")


def test_two_slow_nodes_are_both_located_within_the_default_budget() -> None:
    nodes = names(8)
    for pair in [("gpu002", "gpu006"), ("gpu001", "gpu002"), ("gpu007", "gpu008")]:
        run = Cluster({pair[0]: 60.0, pair[1]: 90.0})
        loc = locate(nodes, run, 300.0)
        assert set(loc.slow) == set(pair), (pair, run.calls)
        assert set(loc.cleared) == set(nodes) - set(pair)
        assert len(run.calls) <= mn.default_budget(8), run.calls


def test_a_failed_run_counts_as_a_failure_even_with_a_zero_threshold() -> None:
    run = Cluster(fails=frozenset({"gpu005"}))
    loc = locate(names(6), run, 0.0)
    assert loc.slow == ("gpu005",)
    found = mn.findings(loc)
    assert found["gpu005"].verdict is Verdict.FAIL
    assert "no result (srun: error" in found["gpu005"].message
    assert found["gpu005"].measured is None


def test_a_slow_link_is_told_from_a_slow_node() -> None:
    run = Cluster(link=("gpu002", "gpu004"))
    loc = locate(names(5), run, 300.0)
    assert loc.slow == ()
    assert {frozenset(p) for p in loc.links} == {frozenset({"gpu002", "gpu004"})}
    found = mn.findings(loc)
    assert found["gpu002"].verdict is found["gpu004"].verdict is Verdict.FAIL
    assert "slow link or path between" in found["gpu004"].message
    assert {found[n].verdict for n in ("gpu001", "gpu003", "gpu005")} == {Verdict.OK}


def test_a_failure_only_at_scale_is_unresolved() -> None:
    run = Cluster(scale=4)
    loc = locate(names(4), run, 300.0)
    assert loc.slow == ()
    assert loc.links == ()
    assert set(loc.unresolved) | set(loc.cleared) == set(names(4))
    assert loc.unresolved
    found = mn.findings(loc)
    assert {found[n].verdict for n in loc.unresolved} == {Verdict.UNKNOWN}


def test_two_nodes_cannot_be_told_apart() -> None:
    run = Cluster({"gpu002": 10.0})
    loc = locate(names(2), run, 300.0)
    assert len(run.calls) == 1
    assert loc.unresolved == ("gpu001", "gpu002")
    found = mn.findings(loc)
    assert "with two nodes the slow one cannot be told apart" in found["gpu001"].message
    assert found["gpu002"].verdict is Verdict.UNKNOWN


def test_the_budget_bounds_the_runs() -> None:
    run = Cluster({"gpu011": 41.0})
    loc = locate(names(16), run, 300.0, max_runs=3)
    assert len(run.calls) == 3
    assert loc.exhausted
    assert loc.slow == ()
    assert "gpu011" in loc.unresolved
    found = mn.findings(loc)
    assert "not resolved within 3 runs" in found["gpu011"].message


def test_locate_needs_two_nodes() -> None:
    with pytest.raises(ValueError, match="two or more"):
        locate(["gpu001"], Cluster(), 1.0)


# ------------------------------------------------------------------------------------------
# Threshold and Slurm's view


def test_threshold_configured_or_derived_from_the_nics(cluster_yml: Path) -> None:
    exp = expectations(load_cluster(cluster_yml))["gpu001"]
    value, source = mn.threshold_for(exp)
    assert value == 300.0  # 0.75 x 8 x 400 Gb/s / 8
    assert source.startswith("derived: 0.75 x the NICs' line rate (8 x 400 Gb/s = 400 GB/s)")
    exp.thresholds[mn.THRESHOLD_KEY] = 350.0
    assert mn.threshold_for(exp)[0] == 350.0
    exp.thresholds[mn.THRESHOLD_KEY] = None
    assert mn.threshold_for(type(exp)(node="x", group="g", gpu_count=8)) == (None, "not set")


@pytest.mark.parametrize(
    ("record", "verdict", "text"),
    [
        ({"state": "IDLE", "state_flags": []}, None, None),
        ({"state": "MIXED", "state_flags": []}, None, None),
        ({"state": "IDLE", "state_flags": ["DRAIN"], "reason": "gpuctl: x"}, Verdict.WARN, "x"),
        (
            {"state": "DOWN", "state_flags": ["*"], "reason": "Not responding"},
            Verdict.UNKNOWN,
            "DOWN",
        ),
        (None, Verdict.UNKNOWN, "does not know"),
    ],
)
def test_slurm_exclusion(record: Any, verdict: Verdict | None, text: str | None) -> None:
    got = mn.slurm_exclusion(record)
    if verdict is None:
        assert got is None
    else:
        assert got is not None
        assert got[0] is verdict
        assert text is not None
        assert text in got[1]


# ------------------------------------------------------------------------------------------
# Phase 3 of the collector: srun on the launch node, answered by the lab's simulator


def scontrol_text(nodes: Mapping[str, str]) -> str:
    """`scontrol show node` records, node -> State (reason for drained ones)."""
    out = []
    for node, state in nodes.items():
        out.append(f"NodeName={node} Arch=x86_64 CoresPerSocket=2 \n   State={state} "
                   "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A\n"
                   "   Partitions=gpu \n")  # fmt: skip
        if "DRAIN" in state:
            out.append("   Reason=gpuctl: nccl.busbw 190 [root@2026-12-01T05:00:00]\n")
        out.append("\n")
    return "".join(out)


class SlurmSim:
    """Sim for the node's own tools; on the launch node, `scontrol show node` and `srun`
    (every node's state from the lab's simulator, rank 0's output with srun's labels)."""

    def __init__(
        self, faults: Mapping[str, dict[str, Any]] | None = None, states: Mapping[str, str] = {}
    ) -> None:
        self.faults = dict(faults or {})
        self.sim = Sim(self.faults)
        self.states = {"gpu001": "IDLE", "gpu002": "IDLE", "gpu003": "IDLE", **states}
        self.sruns: list[list[str]] = []

    def __call__(self, node: str, argv: list[str]) -> FakeRunning:
        if argv[:3] == ["scontrol", "show", "node"]:
            return done(scontrol_text(self.states))
        if argv[:1] == ["srun"]:
            self.sruns.append(argv)
            opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            nodes = sim_ranks.expand(opts["nodelist"])
            per_node = int(opts["ntasks-per-node"])
            gpus = int(argv[argv.index("-g") + 1])
            # a rail's run: env NCCL_IB_HCA==<adapter> ... before the tool (lab.sim.ranks)
            words = argv[argv.index("env") + 1 :] if "env" in argv else []
            hca = dict(w.split("=", 1) for w in words if "=" in w).get("NCCL_IB_HCA")
            states = [
                sim_ranks.node_state(PROFILE, self.faults.get(n, {}), n, per_node * gpus, hca)
                for n in nodes
            ]
            args = sim_perf.NcclArgs(8, 8 << 30, 2, gpus)
            try:
                text = sim_perf.all_reduce_perf_ranks(args, states, per_node)
            except sim_perf.ToolFailure as exc:
                return done(exc.output, 1, "srun: error: task 8: Exited with exit code 1\n")
            return done("".join(f"0: {line}\n" for line in text.splitlines()))
        return self.sim(node, argv)


def nccl_multinode(report: Any) -> dict[str, tuple[Verdict, str]]:
    return {
        n.node: (c.verdict, c.message) for n in report.nodes for c in n.checks
        if c.check == mn.CHECK
    }  # fmt: skip


def run_long(cluster: Path, answer: Callable[[str, list[str]], FakeRunning]) -> Any:
    conn = FakeConnector(answer)
    out = cluster.parent / "b"
    return validate(load_cluster(cluster), level="long", out=out, connector=conn), conn


def test_long_healthy_runs_one_multinode_run_from_the_controller(cluster_yml: Path) -> None:
    per_gpu(cluster_yml)
    sim = SlurmSim()
    res, conn = run_long(cluster_yml, sim)
    assert not res.failed, {n.node: [c.message for c in n.problems()] for n in res.report.nodes}
    # the group's run, then one per rail (the lab's cluster.yml: mlx5_0-7 are rails)
    assert len(sim.sruns) == 1 + 8
    assert {n for n, c in conn.log if " srun " in f" {c} "} == {"ctl01"}
    found = nccl_multinode(res.report)
    assert set(found) == {"gpu001", "gpu002", "gpu003"}
    assert {v for v, _ in found.values()} == {Verdict.OK}
    folder = res.bundle / MULTINODE_DIR / "gpu"
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["nodes"] == ["gpu001", "gpu002", "gpu003"]
    assert meta["threshold"] == 300.0
    run = meta["runs"][0]
    assert run["file"] == "run-01.txt"
    assert run["command"].startswith("srun --nodes=3 --ntasks-per-node=8 --gpus-per-node=8")
    assert (folder / "run-01.txt").read_text().startswith("0: # nccl-tests version")
    assert res.report.extra["nccl_multinode"]["gpu"]["passed"] is True


def test_long_locates_the_slow_node_and_rejudging_the_bundle_agrees(cluster_yml: Path) -> None:
    sim = SlurmSim({"gpu002": fault("nccl_slow", "0.5")})
    res, _ = run_long(cluster_yml, sim)
    assert res.failed_nodes == ["gpu002"]
    found = nccl_multinode(res.report)
    assert found["gpu002"][0] is Verdict.FAIL
    assert found["gpu002"][1].startswith(
        "gpu002: multi-node all_reduce runs with gpu002 reach 188.53 GB/s, runs without it 377"
    )
    assert found["gpu001"][0] is found["gpu003"][0] is Verdict.OK
    group_runs = [a for a in sim.sruns if "--job-name=gpuctl-nccl-multinode" in a]
    assert 2 <= len(group_runs) <= mn.default_budget(3)
    # each rail then runs once without the slow node (it would fail every rail)
    rail_runs = [a for a in sim.sruns if "--job-name=gpuctl-nccl-rail" in a]
    assert len(rail_runs) == 8
    assert all("--nodelist=gpu[001,003]" in a for a in rail_runs)
    rails = {
        (n.node, c.subject): c.verdict for n in res.report.nodes for c in n.checks
        if c.check == "nccl.multinode.rail"
    }  # fmt: skip
    assert {v for (node, _), v in rails.items() if node == "gpu002"} == {Verdict.UNKNOWN}
    assert {v for (node, _), v in rails.items() if node != "gpu002"} == {Verdict.OK}
    # offline: the same verdicts from the bundle alone
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    assert nccl_multinode(again.report) == found


def test_rejudging_with_a_lower_threshold_replays_without_new_runs(cluster_yml: Path) -> None:
    sim = SlurmSim({"gpu003": fault("nccl_slow", "0.5")})
    res, _ = run_long(cluster_yml, sim)
    assert nccl_multinode(res.report)["gpu003"][0] is Verdict.FAIL
    doc = cluster_yml.read_text(encoding="utf-8")
    cluster_yml.write_text(
        doc.replace(
            "\nvalidation:\n", "\nvalidation:\n  thresholds: {nccl_multinode_busbw_gbs: 150}\n", 1
        )
        if "\nvalidation:\n" in doc
        else doc + "validation:\n  thresholds: {nccl_multinode_busbw_gbs: 150}\n",
        encoding="utf-8",
    )
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    assert {v for v, _ in nccl_multinode(again.report).values()} == {Verdict.OK}


def test_drained_nodes_are_left_out_with_a_warning(cluster_yml: Path) -> None:
    sim = SlurmSim(states={"gpu003": "IDLE+DRAIN"})
    res, _ = run_long(cluster_yml, sim)
    found = nccl_multinode(res.report)
    assert found["gpu003"] == (
        Verdict.WARN,
        "not in the multi-node run: drained in Slurm (gpuctl: nccl.busbw 190)",
    )
    assert "--nodelist=gpu[001-002]" in sim.sruns[0]
    assert not res.failed, {n.node: [c.message for c in n.problems()] for n in res.report.nodes}


def test_an_unusable_srun_makes_every_node_unknown_not_ok(cluster_yml: Path) -> None:
    def answer(node: str, argv: list[str]) -> FakeRunning:
        if argv[:1] == ["srun"]:
            return done("", 1, "srun: error: Invalid MPI type 'pmix', --mpi=list for acceptable "
                        "types\n")  # fmt: skip
        return SlurmSim()(node, argv)

    res, conn = run_long(cluster_yml, answer)
    found = nccl_multinode(res.report)
    assert {v for v, _ in found.values()} == {Verdict.UNKNOWN}
    assert set(res.failed_nodes) == {"gpu001", "gpu002", "gpu003"}
    assert "Invalid MPI type" in found["gpu001"][1]
    assert "srun refused the run; nothing was located" in found["gpu001"][1]
    assert sum(1 for _, c in conn.log if " srun " in f" {c} ") == 1  # no subsets: all refused


def test_standard_runs_no_multinode_test(cluster_yml: Path) -> None:
    sim = SlurmSim()
    res = validate(
        load_cluster(cluster_yml),
        level="standard",
        out=cluster_yml.parent / "b",
        connector=FakeConnector(sim),
    )
    assert sim.sruns == []
    assert nccl_multinode(res.report) == {}
    assert not (res.bundle / MULTINODE_DIR).exists()


# ------------------------------------------------------------------------------------------
# The lab's stand-in under srun (gpuctl/lab/sim/ranks.py): every node reports to rank 0


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
        ("gpu[001,003],ctl01", ["gpu001", "gpu003", "ctl01"]),
        ("a[8-10]x", ["a8x", "a9x", "a10x"]),
        ("gpu007", ["gpu007"]),
    ],
)
def test_slurm_host_lists_expand(text: str, names: list[str]) -> None:
    assert sim_ranks.expand(text) == names


def test_a_task_knows_its_place_from_slurms_environment() -> None:
    env = {
        "SLURM_NTASKS": "24",
        "SLURM_PROCID": "17",
        "SLURM_NNODES": "3",
        "SLURM_NODEID": "2",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "gpu[001-003]",
        "SLURM_JOB_ID": "12",
        "SLURM_STEP_ID": "0",
    }
    task = sim_ranks.job(env)
    assert task is not None
    assert (task.rank, task.ranks, task.nodes, task.node_index, task.local) == (17, 24, 3, 2, 1)
    assert task.nodelist == ("gpu001", "gpu002", "gpu003")
    assert task.per_node == 8
    assert task.port == sim_ranks.BASE_PORT + 12 * 16
    assert sim_ranks.job({**env, "SLURM_NTASKS": "1"}) is None  # one task: a single-node run
    assert sim_ranks.job({}) is None


def test_rank_0_prints_the_run_with_the_slowest_nodes_bandwidth() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    faults: dict[str, dict[str, Any]] = {
        "n1": {},
        "n2": {"nccl_slow": 0.5},
        "n3": {"ib_rate": {"mlx5_0": 200}},
    }
    tasks = [
        sim_ranks.Job(8 * i, 24, 3, i, 0, ("127.0.0.1", "127.0.0.1", "127.0.0.1"), port)
        for i in range(3)
    ]
    states = {
        f"n{i + 1}": sim_ranks.node_state(PROFILE, faults[f"n{i + 1}"], f"n{i + 1}", 8)
        for i in range(3)
    }
    gathered: list[list[dict[str, Any]]] = []
    rank0 = threading.Thread(
        target=lambda: gathered.append(sim_ranks.gather(tasks[0], states["n1"]))
    )
    rank0.start()
    assert sim_ranks.report(tasks[1], states["n2"])
    assert sim_ranks.report(tasks[2], states["n3"])
    rank0.join(10)
    assert [s["node"] for s in gathered[0]] == ["n1", "n2", "n3"]
    text = sim_perf.all_reduce_perf_ranks(sim_perf.NcclArgs(8, 8 << 30, 2, 1), gathered[0], 8)
    got = outcome(("n1", "n2", "n3"), text)
    assert got.busbw == pytest.approx(378.0 * 0.5, rel=0.01)  # n2's halved NCCL bandwidth
    assert text.count("#  Rank") == 24
    assert "#  Rank 23 Group  0 Pid" in text
    # one HCA at half rate costs its node 1/16 of its bandwidth across nodes
    assert states["n3"]["capacity"] == pytest.approx(378.0 * 15 / 16)


def test_a_node_that_cannot_run_fails_the_whole_run() -> None:
    states = [
        sim_ranks.node_state(PROFILE, {}, "n1", 8),
        sim_ranks.node_state(PROFILE, {"gpu_lost": [3]}, "n2", 8),
    ]
    with pytest.raises(sim_perf.ToolFailure, match=r"n2: Test CUDA failure .*invalid device"):
        sim_perf.all_reduce_perf_ranks(sim_perf.NcclArgs(8, 8 << 30, 2, 1), states, 8)


def test_a_node_left_alone_is_not_measured_with_a_warning(cluster_yml: Path) -> None:
    sim = SlurmSim(states={"gpu002": "IDLE+DRAIN", "gpu003": "DOWN*"})
    res, _ = run_long(cluster_yml, sim)
    found = nccl_multinode(res.report)
    assert sim.sruns == []
    assert found["gpu001"] == (
        Verdict.WARN,
        "not measured: no other node of group gpu can run in Slurm",
    )
    assert found["gpu002"][0] is Verdict.WARN
    assert found["gpu003"][0] is Verdict.UNKNOWN
    assert "Slurm state DOWN" in found["gpu003"][1]
    # each rail's run likewise: not run, with the same verdicts (a lone node does not fail)
    rails = [
        (n.node, c.verdict, c.message) for n in res.report.nodes for c in n.checks
        if c.check == "nccl.multinode.rail"
    ]  # fmt: skip
    assert len(rails) == 3 * 8
    assert {v for node, v, _ in rails if node != "gpu003"} == {Verdict.WARN}
    assert {v for node, v, _ in rails if node == "gpu003"} == {Verdict.UNKNOWN}
    assert all(m.startswith("rail mlx5_") for _, _, m in rails)
    assert "gpu001" not in res.failed_nodes


def test_a_long_bundle_without_its_multinode_runs_is_unknown_not_passed(
    cluster_yml: Path,
) -> None:
    import shutil

    per_gpu(cluster_yml)
    res, _ = run_long(cluster_yml, SlurmSim())
    assert not res.failed
    shutil.rmtree(res.bundle / MULTINODE_DIR)  # a bundle someone trimmed
    again = judge_bundle(load_cluster(cluster_yml), res.bundle)
    found = nccl_multinode(again.report)
    assert {v for v, _ in found.values()} == {Verdict.UNKNOWN}
    assert set(found) == {"gpu001", "gpu002", "gpu003"}
    assert found["gpu001"][1] == (
        "not measured: the bundle holds no multi-node run of group gpu with gpu001 (level long)"
    )
    assert again.failed_nodes == ["gpu001", "gpu002", "gpu003"]


def test_a_stopped_collection_is_judged_unknown(cluster_yml: Path, tmp_path: Path) -> None:
    exps = expectations(load_cluster(cluster_yml))

    def execute(argv: tuple[str, ...], timeout: int) -> Any:
        raise KeyboardInterrupt  # Ctrl-C during the first run

    def write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    nodes = ["gpu001", "gpu002", "gpu003"]
    slurm = {n: {"state": "IDLE", "state_flags": []} for n in nodes}
    with pytest.raises(KeyboardInterrupt):
        multinode_collect.collect_group(tmp_path, "gpu", nodes, exps, execute, slurm=slurm)
    results, _ = multinode_bundle.judge_bundle_dir(tmp_path, exps)
    assert {(r.node, r.verdict) for r in results} == {(n, Verdict.UNKNOWN) for n in nodes}
    assert "not finished" in results[0].message


def test_one_rank_per_node_from_cluster_yml(cluster_yml: Path) -> None:
    doc = per_gpu(cluster_yml).read_text(encoding="utf-8")
    block = "  multinode: {rank_per: node, launch_node: gpu002, partition: gpu}\n"
    cluster_yml.write_text(
        doc.replace("\nvalidation:\n", "\nvalidation:\n" + block, 1)
        if "\nvalidation:\n" in doc
        else doc + "validation:\n" + block,
        encoding="utf-8",
    )
    sim = SlurmSim({"gpu001": fault("nccl_slow", "0.5")})
    res, conn = run_long(cluster_yml, sim)
    assert res.failed_nodes == ["gpu001"]
    assert {n for n, c in conn.log if " srun " in f" {c} "} == {"gpu002"}
    argv = sim.sruns[0]
    assert "--ntasks-per-node=1" in argv
    assert "--partition=gpu" in argv
    assert argv[-2:] == ["-g", "8"]
    assert nccl_multinode(res.report)["gpu001"][0] is Verdict.FAIL

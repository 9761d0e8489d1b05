"""Multi-node nccl-tests through Slurm at `--level long`, on the shared provisioned lab.

The lab's three compute nodes run real slurmd; `srun --mpi=pmix` starts the stand-in
all_reduce_perf on all of them (one rank per node driving its 8 simulated GPUs, `-g 8`), whose
rank 0 prints the run with the slowest node's bandwidth (gpuctl/lab/sim/ranks.py). srun runs
on gpu001 (`validation.multinode.launch_node`): the slurm_node role installs the PMIx library
Slurm's mpi/pmix plugin loads, the slurm_controller role does not (yet), so srun on ctl01 says
"can not load PMIx library". A healthy lab passes the multi-node check in one run; `nccl_slow`
on gpu003 (its NCCL bandwidth halved) fails exactly gpu003 with the locator's finding, and
`--drain-failed` drains exactly gpu003. Then each rail runs alone (the lab's adapters are
rails, gpuctl/validation/rails.py): `ib_rate` on one port of gpu002 passes the group's run and
fails that rail's run on gpu002 alone. At `--level burn` (long, then 30 s of DCGM stress
runs and all_reduce sampled by nvidia-smi dmon), a GPU that throttles under load fails its node
on burn.throttle and a node whose bandwidth sags from run to run fails on burn.nccl.drift, the
third node passes every burn check. Every test leaves the lab healthy and undrained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lab_helpers import ProvisionedLab, sh

from gpuctl.config import load_cluster
from gpuctl.lab import lab
from gpuctl.validation.api import ValidateResult, drain_failed, judge_bundle, validate
from gpuctl.validation.bundle import MULTINODE_DIR
from gpuctl.validation.multinode import CHECK
from gpuctl.validation.rails import RAIL_CHECK
from gpuctl.validation.results import Verdict

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SLOW = "gpu003"
COMPUTE = ("gpu001", "gpu002", "gpu003")


@pytest.fixture
def cluster(provisioned_lab: ProvisionedLab) -> Path:
    """The lab's cluster.yml with srun launched from gpu001, one rank per node (`-g 8`): Slurm
    refuses 8 tasks on the lab's 2-CPU nodes ("Requested node configuration is not available",
    with or without --overcommit). Written beside it: the same relative paths."""
    doc = yaml.safe_load(provisioned_lab.cluster.read_text(encoding="utf-8"))
    doc.setdefault("validation", {})["multinode"] = {"launch_node": "gpu001", "rank_per": "node"}
    path = provisioned_lab.cluster.with_name("cluster-multinode.yml")
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _checks(result: ValidateResult, check: str) -> dict[str, tuple[Verdict, str]]:
    return {
        n.node: (c.verdict, c.message) for n in result.report.nodes for c in n.checks
        if c.check == check
    }  # fmt: skip


def _problems(result: ValidateResult) -> dict[str, list[str]]:
    return {
        n.node: [f"{c.check}: {c.message}" for c in n.problems()]
        for n in result.report.nodes
        if n.failed
    }


def _drained() -> dict[str, str]:
    res = sh(lab.address_of("ctl01"), 'sinfo -R -h -N -o "%N|%E"')
    assert res.returncode == 0, res.stderr
    return dict(ln.split("|", 1) for ln in res.stdout.splitlines() if "|" in ln)


def _resume(node: str) -> None:
    sh(lab.address_of("ctl01"), f"scontrol update nodename={node} state=resume")


def test_healthy_lab_passes_the_multinode_check_in_one_run(cluster: Path, tmp_path: Path) -> None:
    res = validate(load_cluster(cluster), level="long", out=tmp_path / "long")
    assert res.failed_nodes == [], _problems(res)
    found = _checks(res, CHECK)
    assert set(found) == set(COMPUTE), found
    assert all(v is Verdict.OK for v, _ in found.values()), found
    assert all("all_reduce over 3 nodes" in m for _, m in found.values()), found
    runs = sorted((res.bundle / MULTINODE_DIR / "gpu").glob("run-*.txt"))
    assert [p.name for p in runs] == ["run-01.txt"]
    text = runs[0].read_text(encoding="utf-8")
    assert text.startswith("0: # nccl-tests version"), text[:200]  # srun --label
    assert "on     gpu003 device  7" in text  # rank 0 lists every node's ranks
    # then each rail alone (the lab's adapters are rails): 8 runs, NCCL held to one adapter
    rails = _rail_checks(res)
    assert len(rails) == 3 * 8, rails
    assert {v for v, _ in rails.values()} == {Verdict.OK}, rails
    rail = res.bundle / MULTINODE_DIR / "gpu@mlx5_3"
    assert [p.name for p in sorted(rail.glob("run-*.txt"))] == ["run-01.txt"]
    assert "all_reduce_perf" in (rail / "run-01.txt").read_text(encoding="utf-8")
    again = judge_bundle(load_cluster(cluster), res.bundle)
    assert _checks(again, CHECK) == found
    assert _rail_checks(again) == rails


def _rail_checks(result: ValidateResult) -> dict[tuple[str, str], tuple[Verdict, str]]:
    return {
        (n.node, c.subject or ""): (c.verdict, c.message)
        for n in result.report.nodes
        for c in n.checks
        if c.check == RAIL_CHECK
    }


def test_a_slow_rail_passes_the_groups_run_and_fails_its_own_on_its_node(
    cluster: Path, tmp_path: Path
) -> None:
    # one port of gpu002 at half rate: the group's run (eight adapters a node) loses 1/16 and
    # passes; mlx5_2's own run is at half its floor and the locator finds gpu002
    lab.inject_fault("gpu002", "ib_rate", "mlx5_2:200")
    try:
        res = validate(load_cluster(cluster), level="long", out=tmp_path / "rail")
    finally:
        lab.clear_faults("gpu002")
    assert {v for v, _ in _checks(res, CHECK).values()} == {Verdict.OK}, _checks(res, CHECK)
    rails = _rail_checks(res)
    bad = {k: v for k, v in rails.items() if v[0] is not Verdict.OK}
    assert list(bad) == [("gpu002", "mlx5_2")], bad
    assert bad["gpu002", "mlx5_2"][0] is Verdict.FAIL, bad
    assert "runs with gpu002 reach" in bad["gpu002", "mlx5_2"][1], bad
    assert res.failed_nodes == ["gpu002"], _problems(res)


def test_burn_finds_the_gpu_that_throttles_and_the_node_that_drifts(
    cluster: Path, tmp_path: Path
) -> None:
    lab.inject_fault("gpu002", "thermal_throttle", "3")
    lab.inject_fault("gpu003", "nccl_drift", "8")
    try:
        res = validate(load_cluster(cluster), level="burn", out=tmp_path / "burn", burn_s=30)
    finally:
        lab.clear_faults("gpu002")
        lab.clear_faults("gpu003")
    problems = _problems(res)
    assert set(problems) == {"gpu002", "gpu003"}, problems
    assert {p.split(":", 1)[0] for p in problems["gpu002"]} == {"burn.throttle"}, problems
    throttle = _burn_checks(res, "gpu002", "burn.throttle")
    assert [s for s, (v, _) in throttle.items() if v is not Verdict.OK] == ["GPU3"], throttle
    # at most a run later it is also below the floor (burn.nccl)
    assert "burn.nccl.drift" in {p.split(":", 1)[0] for p in problems["gpu003"]}, problems
    assert {p.split(":", 1)[0] for p in problems["gpu003"]} <= {"burn.nccl", "burn.nccl.drift"}
    healthy = _burn_checks(res, "gpu001")
    assert {v for v, _ in healthy.values()} == {Verdict.OK}, healthy
    assert healthy["burn.samples", "GPU0"][1] == "4 dmon samples of 4 asked for", healthy
    assert {v for v, _ in _checks(res, CHECK).values()} == {Verdict.OK}, _checks(res, CHECK)


def _burn_checks(
    result: ValidateResult, node: str, check: str | None = None
) -> dict[Any, tuple[Verdict, str]]:
    nr = next(n for n in result.report.nodes if n.node == node)
    if check is not None:
        return {c.subject: (c.verdict, c.message) for c in nr.checks if c.check == check}
    return {
        (c.check, c.subject): (c.verdict, c.message)
        for c in nr.checks
        if c.check.startswith("burn.")
    }


def test_slow_node_is_located_and_drained_alone(cluster: Path, tmp_path: Path) -> None:
    lab.inject_fault(SLOW, "nccl_slow", "0.5")
    try:
        res = validate(load_cluster(cluster), level="long", out=tmp_path / "slow")
        assert res.failed_nodes == [SLOW], _problems(res)
        found = _checks(res, CHECK)
        verdict, message = found[SLOW]
        assert verdict is Verdict.FAIL, found
        assert f"runs with {SLOW} reach" in message, message
        assert "runs without it" in message, message
        assert all(found[n][0] is Verdict.OK for n in ("gpu001", "gpu002")), found
        summary = res.report.extra["nccl_multinode"]["gpu"]
        assert summary["slow"] == [SLOW], summary
        assert len(summary["runs"]) <= 6, summary["runs"]  # the full run, then a few subsets
        # offline: the locator replayed over the bundle's runs says the same
        assert _checks(judge_bundle(load_cluster(cluster), res.bundle), CHECK) == found

        drained = drain_failed(load_cluster(cluster), res.report)
        assert not drained.failed, drained.to_json()
        now = _drained()
        assert set(now) == {SLOW}, now
        assert now[SLOW].startswith("gpuctl: "), now
    finally:
        lab.clear_faults(SLOW)
    # repaired but drained: left out of the multi-node run with a warning, resumed on its own
    # checks; the two others pass together
    after = validate(load_cluster(cluster), level="long", out=tmp_path / "repaired")
    try:
        found = _checks(after, CHECK)
        assert found[SLOW][0] is Verdict.WARN, found
        assert "drained in Slurm" in found[SLOW][1], found
        assert after.failed_nodes == [], _problems(after)
        resumed = drain_failed(load_cluster(cluster), after.report)
        assert not resumed.failed, resumed.to_json()
        assert SLOW not in _drained()
    finally:
        _resume(SLOW)

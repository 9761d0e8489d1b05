"""`gpuctl node-check` and the light `gpuctl-node-check` through Typer's CliRunner: exit codes,
the exact messages, --json, on a node answered by the lab's simulator and a model of scontrol."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_collect import fault
from test_nodecheck import NODE, FakeNode
from typer.testing import CliRunner

from gpuctl.cli import nodecheck_cmd, nodecheck_main
from gpuctl.cli.app import app as full_app
from gpuctl.starter import starter
from gpuctl.validation import nodecheck

runner = CliRunner()
APPS = {"gpuctl": (full_app, ["node-check"]), "gpuctl-node-check": (nodecheck_main.app, [])}


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeNode]:
    """The CLI's node_check, answering from ``state["node"]`` instead of real commands."""
    state: dict[str, FakeNode] = {"node": FakeNode()}

    def fake_check(*args: Any, **kw: Any) -> nodecheck.NodeCheckResult:
        return nodecheck.node_check(*args, runner=state["node"], **kw)

    monkeypatch.setattr(nodecheck_cmd, "node_check", fake_check)
    return state


def invoke(which: str, *args: str) -> Any:
    app, prefix = APPS[which]
    return runner.invoke(app, [*prefix, *args])


@pytest.mark.parametrize("which", list(APPS))
def test_a_healthy_node_exits_0(which: str, cluster_yml: Path, node: dict[str, FakeNode]) -> None:
    res = invoke(which, "--cluster", str(cluster_yml), "--node", NODE)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"{NODE}: ok (quick: ")
    assert res.stderr == f"Slurm: {NODE}: in service\n"


@pytest.mark.parametrize("which", list(APPS))
def test_a_failing_node_exits_1_and_says_what_it_drained(
    which: str, cluster_yml: Path, node: dict[str, FakeNode]
) -> None:
    node["node"] = FakeNode(fault("pcie_degraded", "2"))
    res = invoke(which, "--cluster", str(cluster_yml), "--node", NODE)
    assert res.exit_code == 1, res.output
    assert res.stdout.startswith(f"{NODE}: fail (quick: ")
    assert "  fail    gpu.pcie.width GPU2: " in res.stdout
    _, reason = node["node"].slurm.nodes[NODE]
    assert res.stderr == f"drained {NODE}: {reason}\n"


@pytest.mark.parametrize("which", list(APPS))
def test_scontrol_missing_exits_1_with_the_error(
    which: str, cluster_yml: Path, node: dict[str, FakeNode]
) -> None:
    from gpuctl.remote import ExecResult

    node["node"] = FakeNode(scontrol=ExecResult(stderr=b"scontrol: not found\n", rc=127))
    res = invoke(which, "--cluster", str(cluster_yml), "--node", NODE)
    assert res.exit_code == 1, res.output
    assert res.stderr == (
        f"error: Slurm: scontrol show node {NODE}: exit 127: scontrol: not found\n"
    )


@pytest.mark.parametrize("which", list(APPS))
def test_a_node_not_in_the_cluster_exits_2(
    which: str, cluster_yml: Path, node: dict[str, FakeNode]
) -> None:
    res = invoke(which, "--cluster", str(cluster_yml), "--node", "gpu999")
    assert res.exit_code == 2, res.output
    assert res.stderr == (
        f"error: node 'gpu999' is not in {cluster_yml} (its nodes: ctl01,gpu[001-003]); "
        "pass --node NAME\n"
    )


@pytest.mark.parametrize("which", list(APPS))
def test_a_bad_cluster_yml_exits_2_with_its_line(
    which: str, tmp_path: Path, node: dict[str, FakeNode]
) -> None:
    bad = tmp_path / "cluster.yml"
    bad.write_text(starter("lab", 3).replace("count: 8", "count: 0"), encoding="utf-8")
    res = invoke(which, "--cluster", str(bad), "--node", NODE)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {bad}:")
    assert "node_groups[1].gpus.count" in res.stderr


@pytest.mark.parametrize("which", list(APPS))
def test_a_bad_level_is_a_usage_error(which: str, cluster_yml: Path) -> None:
    res = invoke(which, "--cluster", str(cluster_yml), "--level", "long")
    assert res.exit_code == 2
    assert "'long' is not one of 'quick', 'standard'" in res.stderr


def test_json_has_stable_keys_and_the_report(cluster_yml: Path, node: dict[str, FakeNode]) -> None:
    node["node"] = FakeNode(slurm={NODE: ("IDLE+DRAIN", "gpuctl node-check: xid 79")})
    res = invoke("gpuctl-node-check", "--cluster", str(cluster_yml), "--node", NODE, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data) == [
        "node",
        "level",
        "verdict",
        "failed",
        "collected_at",
        "seconds",
        "bundle",
        "slurm",
        "slurm_note",
        "slurm_error",
        "probes",
        "report",
    ]
    assert (data["node"], data["verdict"], data["failed"]) == (NODE, "ok", False)
    assert data["slurm"]["action"] == "resume"
    assert data["slurm"]["done"] is True
    assert data["report"]["schema_version"] == 1
    assert [n["node"] for n in data["report"]["nodes"]] == [NODE]
    assert data["probes"]["ibstat"]["command"] == "ibstat"
    assert res.stderr == f"resumed {NODE} (was: gpuctl node-check: xid 79)\n"


def test_no_drain_and_out(cluster_yml: Path, node: dict[str, FakeNode]) -> None:
    node["node"] = FakeNode(fault("pcie_degraded", "2"))
    out = cluster_yml.parent / "bundle"
    res = invoke(
        "gpuctl", "--cluster", str(cluster_yml), "--node", NODE, "--no-drain", "--out", str(out)
    )
    assert res.exit_code == 1, res.output
    assert res.stderr == "Slurm: --no-drain: Slurm left as it is\n"
    assert node["node"].scontrol_calls() == []
    assert (out / NODE / "meta.json").is_file()


def test_a_bug_is_exit_70_with_a_traceback(
    cluster_yml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(nodecheck_cmd, "node_check", broken)
    res = invoke("gpuctl-node-check", "--cluster", str(cluster_yml))
    assert res.exit_code == 70
    assert "RuntimeError: boom" in res.stderr
    assert "internal error: this is a bug in gpuctl" in res.stderr


def test_the_light_entry_point_is_installed_and_starts() -> None:
    bin_dir = Path(sys.executable).parent
    res = subprocess.run(
        [str(bin_dir / "gpuctl-node-check"), "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: gpuctl-node-check [OPTIONS]")
    assert "--no-drain" in res.stdout


def test_both_apps_run_the_same_command() -> None:
    # the light app's callback is the full app's command: one implementation
    assert nodecheck_main.app.registered_callback is not None
    assert nodecheck_main.app.registered_callback.callback is nodecheck_cmd.node_check_cmd
    names = {c.name: c.callback for c in full_app.registered_commands}
    assert names["node-check"] is nodecheck_cmd.node_check_cmd

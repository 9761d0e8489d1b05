"""`gpuctl validate` through Typer's CliRunner: a saved bundle judged again (--bundle), a live
run over a fake transport (the lab's simulator), the report files, exit codes, and
--drain-failed against a small model of Slurm's scontrol."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from test_collect import FakeConnector, FakeRunning, Sim, done, fault
from typer.testing import CliRunner

from gpuctl.cli import validate_cmd
from gpuctl.cli.app import app
from gpuctl.config import load_cluster
from gpuctl.validation import api, slurm
from gpuctl.validation.api import validate
from gpuctl.validation.reports.drain import PREFIX
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict

runner = CliRunner()


# GPU nodes in the lab cluster's cluster_yml fixture (tests/conftest.py)
LAB_NODES = 2


def _bundle(cluster_yml: Path, name: str, sim: Sim, **kw: Any) -> Path:
    out = cluster_yml.parent / name
    validate(load_cluster(cluster_yml), level="quick", out=out, connector=FakeConnector(sim), **kw)
    return out


@pytest.fixture
def healthy(cluster_yml: Path) -> Path:
    return _bundle(cluster_yml, "healthy", Sim())


@pytest.fixture
def gpu_lost(cluster_yml: Path) -> Path:
    return _bundle(cluster_yml, "lost", Sim({"gpu002": fault("gpu_lost", "3")}))


def test_a_healthy_bundle_passes_with_a_table(cluster_yml: Path, healthy: Path) -> None:
    res = runner.invoke(app, ["validate", str(cluster_yml), "--bundle", str(healthy)])
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.stdout.splitlines() if re.search(r"\b(ctl01|gpu00\d)\b", ln)]
    assert len(rows) == 3
    assert all(" ok " in row for row in rows), rows
    assert "3 nodes: 0 failed, 0 unreachable" in res.stderr


def test_a_failed_node_is_shown_with_its_reason_and_exits_1(
    cluster_yml: Path, gpu_lost: Path
) -> None:
    res = runner.invoke(app, ["validate", str(cluster_yml), "--bundle", str(gpu_lost)])
    assert res.exit_code == 1, res.output
    row = next(ln for ln in res.stdout.splitlines() if "gpu002" in ln)
    assert "fail" in row
    assert "gpu.count: 7 GPUs visible, expected 8" in res.stdout
    assert "3 nodes: 1 failed, 0 unreachable" in res.stderr


def test_json_is_the_report(cluster_yml: Path, gpu_lost: Path) -> None:
    res = runner.invoke(app, ["validate", str(cluster_yml), "--bundle", str(gpu_lost), "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["schema_version"] == 1
    assert data["level"] == "quick"
    assert [n["node"] for n in data["nodes"] if n["failed"]] == ["gpu002"]
    assert data == json.loads((gpu_lost / "results.json").read_text())


def test_report_files(cluster_yml: Path, gpu_lost: Path, tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        [
            "validate",
            str(cluster_yml),
            "--bundle",
            str(gpu_lost),
            "--junit",
            str(tmp_path / "r.xml"),
            "--html",
            str(tmp_path / "r.html"),
            "--prom",
            str(tmp_path / "prom"),
        ],
    )
    assert res.exit_code == 1, res.output
    assert "gpu.count" in (tmp_path / "r.xml").read_text()
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert 'node="gpu002"' in (tmp_path / "prom" / "gpuctl.prom").read_text()


def test_a_bundle_from_an_unfinished_collection_warns(cluster_yml: Path, healthy: Path) -> None:
    header = json.loads((healthy / "bundle.json").read_text())
    (healthy / "bundle.json").write_text(json.dumps({**header, "complete": False}))
    res = runner.invoke(app, ["validate", str(cluster_yml), "--bundle", str(healthy)])
    assert "did not finish" in res.stderr


def test_limit_on_a_bundle(cluster_yml: Path, gpu_lost: Path) -> None:
    res = runner.invoke(
        app, ["validate", str(cluster_yml), "--bundle", str(gpu_lost), "--limit", "gpu001"]
    )
    assert res.exit_code == 0, res.output
    assert "gpu002" not in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--level", "fast"], "Invalid value"),
        (["--limit", "gpu[007]"], "not in the cluster: gpu007"),
        (["--bundle", "{bundle}", "--drain-failed"], "--bundle is offline"),
        (["--bundle", "{bundle}", "--out", "x"], "--out does not apply"),
        (["--bundle", "/nonexistent"], "not a directory"),
        (["--parallel", "0"], "Invalid value"),
        (["--level", "burn"], "--level burn needs --duration"),
        (["--level", "long", "--duration", "4h"], "--duration is the burn's"),
        (["--level", "burn", "--duration", "4 hours"], "is not a duration"),
        (["--level", "burn", "--duration", "10s"], "the burn runs 30 s to 604800 s"),
        (["--bundle", "{bundle}", "--duration", "4h"], "--duration is the one it records"),
    ],
)
def test_usage_errors_exit_2(
    cluster_yml: Path, healthy: Path, args: list[str], message: str
) -> None:
    args = [a.replace("{bundle}", str(healthy)) for a in args]
    res = runner.invoke(app, ["validate", str(cluster_yml), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_a_bad_cluster_yml_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yml"
    bad.write_text("name: x\n")
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 2
    assert "error: " in res.stderr


def test_missing_known_hosts_exits_2(cluster_yml: Path) -> None:
    (cluster_yml.parent / ".gpuctl" / "lab" / "known_hosts").unlink()
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick"])
    assert res.exit_code == 2
    assert "known_hosts" in res.stderr


# ------------------------------------------------------------------------------------------
# A live run (fake transport) and --drain-failed against a model of scontrol


class Slurm:
    """scontrol show node / update on a controller, for a few nodes."""

    def __init__(self, nodes: dict[str, tuple[str, str | None]]) -> None:
        self.nodes = dict(nodes)  # name -> (state, reason)
        self.updates: list[str] = []

    def show(self) -> str:
        out = []
        for name, (state, reason) in self.nodes.items():
            out.append(
                f"NodeName={name} Arch=x86_64 CoresPerSocket=2\n"
                f"   CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.00\n"
                f"   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1\n"
                f"   Partitions=gpu\n"
                + (f"   Reason={reason} [root@2026-12-01T01:00:00]\n" if reason else "")
            )
        return "\n".join(out)

    def __call__(self, node: str, argv: list[str]) -> FakeRunning:
        if node != "ctl01":
            return Sim()(node, argv)
        if argv[:3] == ["scontrol", "show", "node"]:
            return done(self.show())
        if argv[:2] == ["scontrol", "update"]:
            self.updates.append(shlex.join(argv))
            fields = dict(a.split("=", 1) for a in argv[2:])
            name = fields["nodename"]
            state, _ = self.nodes[name]
            base = state.split("+")[0]
            if fields["state"] == "drain":
                self.nodes[name] = (f"{base}+DRAIN", fields["reason"])
            else:
                self.nodes[name] = (base, None)
            return done("")
        return done("", 1, "unexpected")


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """`gpuctl validate` with the fake transport put under the CLI's validate/drain calls."""
    state: dict[str, Any] = {}

    def fake_validate(*args: Any, **kw: Any) -> Any:
        return validate(*args, connector=state["connector"], **kw)

    def fake_drain(*args: Any, **kw: Any) -> Any:
        return api.drain_failed(*args, connector=state["connector"], **kw)

    monkeypatch.setattr(validate_cmd, "validate", fake_validate)
    monkeypatch.setattr(validate_cmd, "drain_failed", fake_drain)
    return state


def test_live_run_with_an_unreachable_node(cluster_yml: Path, live: dict[str, Any]) -> None:
    live["connector"] = FakeConnector(Sim(), unreachable={"gpu001": "ssh: connect timed out"})
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick"])
    assert res.exit_code == 1, res.output
    assert "unreachable: gpu001" in res.stderr
    assert "node.reachable: not checked: ssh: connect timed out" in res.stdout
    assert "3 nodes: 1 failed, 1 unreachable" in res.stderr
    bundles = list((cluster_yml.parent / ".gpuctl" / "validate").iterdir())
    assert len(bundles) == 1


def test_drain_failed_drains_with_gpuctls_reason_and_resumes_later(
    cluster_yml: Path, live: dict[str, Any]
) -> None:
    model = Slurm({"gpu001": ("IDLE", None), "gpu002": ("IDLE", None)})
    faulty = Sim({"gpu002": fault("gpu_lost", "3")})

    def answer(node: str, argv: list[str]) -> FakeRunning:
        return model(node, argv) if node == "ctl01" else faulty(node, argv)

    live["connector"] = FakeConnector(answer)
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick", "--drain-failed"])
    assert res.exit_code == 1, res.output
    state, reason = model.nodes["gpu002"]
    assert state == "IDLE+DRAIN"
    assert reason is not None
    assert reason.startswith("gpuctl: gpu.count 7 GPUs visible, expected 8")
    assert f"drained gpu002: {reason}" in res.stderr
    assert model.nodes["gpu001"] == ("IDLE", None)
    # the fault is gone: the next run resumes the node gpuctl drained
    faulty.faults.clear()
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick", "--drain-failed"])
    assert res.exit_code == 0, res.output
    assert model.nodes["gpu002"] == ("IDLE", None)
    assert "resumed gpu002" in res.stderr


def test_a_node_an_operator_drained_is_never_resumed_or_relabelled(
    cluster_yml: Path, live: dict[str, Any]
) -> None:
    model = Slurm({"gpu001": ("IDLE+DRAIN", "maintenance"), "gpu002": ("IDLE", None)})
    faults = Sim({"gpu001": fault("gpu_lost", "1")})
    live["connector"] = FakeConnector(
        lambda node, argv: model(node, argv) if node == "ctl01" else faults(node, argv)
    )
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick", "--drain-failed"])
    assert res.exit_code == 1
    assert model.nodes["gpu001"] == ("IDLE+DRAIN", "maintenance")  # failed, but not ours
    faults.faults.clear()
    res = runner.invoke(app, ["validate", str(cluster_yml), "--level", "quick", "--drain-failed"])
    assert res.exit_code == 0, res.output
    assert model.nodes["gpu001"] == ("IDLE+DRAIN", "maintenance")  # passes, still not ours
    assert model.updates == []
    assert "left drained: drained by someone else (maintenance)" in res.stderr


def test_an_unreachable_controller_makes_the_run_fail(
    cluster_yml: Path, live: dict[str, Any]
) -> None:
    live["connector"] = FakeConnector(Sim(), unreachable={"ctl01": "ssh: connection refused"})
    res = runner.invoke(
        app,
        ["validate", str(cluster_yml), "--level", "quick", "--drain-failed", "-l", "gpu001"],
    )
    assert res.exit_code == 1, res.output
    assert "--drain-failed: cannot reach ctl01: ssh: connection refused" in res.stderr


# ------------------------------------------------------------------------------------------
# The drain plan alone


def _node(name: str, *verdicts: Verdict) -> NodeReport:
    return NodeReport(
        name, tuple(CheckResult(f"c{i}", name, v, f"m{i}") for i, v in enumerate(verdicts))
    )


def _plan(nodes: list[NodeReport], records: dict[str, tuple[str, str | None]]) -> list[Any]:
    report = ValidationReport("lab", "quick", tuple(nodes))
    parsed = {
        name: {"state": s.split("+")[0], "state_flags": s.split("+")[1:], "reason": r}
        for name, (s, r) in records.items()
    }
    return [(a.node, a.action) for a in slurm.plan(report, parsed)]


def test_plan() -> None:
    fail, ok, unknown = Verdict.FAIL, Verdict.OK, Verdict.UNKNOWN
    ours = f"{PREFIX} c0 m0"
    assert _plan(
        [
            _node("a", fail),  # idle: drain
            _node("b", ok),  # drained by gpuctl for c0, which passed now: resume
            _node("b2", ok),  # drained at standard for nccl.busbw, not run at quick: keep
            _node("c", ok),  # drained by an operator: leave
            _node("d", fail),  # drained by an operator: leave (never relabel)
            _node("e", fail),  # drained by gpuctl with the same reason: nothing to do
            _node("f", unknown),  # UNKNOWN fails (fail closed): drain
            _node("g", ok),  # idle and fine
            _node("h", fail),  # not in Slurm
            _node("i", fail),  # drained by gpuctl for another reason: new reason
        ],
        {
            "a": ("IDLE", None),
            "b": ("IDLE+DRAIN", f"{PREFIX} c0 x [quick]"),
            "b2": ("IDLE+DRAIN", f"{PREFIX} nccl.busbw x [standard]"),
            "c": ("MIXED+DRAIN", "maintenance"),
            "d": ("DOWN+DRAIN", "bad psu"),
            "e": ("IDLE+DRAIN", ours),
            "f": ("ALLOCATED", None),
            "g": ("IDLE", None),
            "i": ("IDLE+DRAIN", f"{PREFIX} xid 79"),
        },
    ) == [
        ("a", "drain"),
        ("b", "resume"),
        ("b2", "none"),
        ("c", "none"),
        ("d", "none"),
        ("e", "none"),
        ("f", "drain"),
        ("h", "none"),
        ("i", "drain"),
    ]


def test_update_command_lines() -> None:
    drain = slurm.SlurmAction("gpu002", "drain", "gpuctl: gpu.count 7 GPUs", "")
    assert shlex.join(slurm.update_argv(drain)) == (
        "scontrol update nodename=gpu002 state=drain 'reason=gpuctl: gpu.count 7 GPUs'"
    )
    resume = slurm.SlurmAction("gpu002", "resume", None, "")
    assert slurm.update_argv(resume) == (
        "scontrol",
        "update",
        "nodename=gpu002",
        "state=resume",
    )


def test_drain_failed_reads_slurm_before_changing_anything(cluster_yml: Path) -> None:
    model = Slurm({"gpu001": ("IDLE", None)})
    conn = FakeConnector(model)
    report = ValidationReport("lab", "quick", (_node("gpu001", Verdict.FAIL),))
    got = api.drain_failed(load_cluster(cluster_yml), report, connector=conn)
    assert not got.failed
    commands = [c for n, c in conn.log if n == "ctl01"]
    assert "scontrol show node" in commands[0]
    assert "state=drain" in commands[1]
    assert load_cluster(cluster_yml).slurm.controller == got.controller == "ctl01"

"""`gpuctl node-check` without a node: a fake runner answering with the lab's simulator (the
same stand-in tools lab nodes run) and a small model of scontrol; then the real local runner
on harmless commands (timeouts, exit statuses, commands that do not exist)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_collect import Sim, fault
from test_validate_cli import Slurm

from gpuctl.config import load_cluster
from gpuctl.errors import UsageError
from gpuctl.remote import ExecResult, local
from gpuctl.remote.local import run_local
from gpuctl.validation import nodecheck
from gpuctl.validation.api import judge_bundle
from gpuctl.validation.expect import expectations
from gpuctl.validation.nodecheck import PREFIX, node_check, slurm_plan
from gpuctl.validation.probes import probes_for
from gpuctl.validation.results import CheckResult, NodeReport, Verdict
from gpuctl.validation.scope import with_level

NODE = "gpu002"


class FakeNode:
    """A node for node-check: the probes answer from the simulator, scontrol from a model
    of Slurm (or fails as told); every call is logged with its timeout."""

    def __init__(
        self,
        faults: dict[str, Any] | None = None,
        slurm: dict[str, tuple[str, str | None]] | None = None,
        *,
        scontrol: ExecResult | None = None,  # what every scontrol call gives instead
        update: ExecResult | None = None,  # what scontrol update gives instead
        answers: dict[str, ExecResult] | None = None,  # argv[0] + argv[1] -> result
    ) -> None:
        self.sim = Sim({NODE: faults or {}})
        self.slurm = Slurm(slurm if slurm is not None else {NODE: ("IDLE", None)})
        self.scontrol = scontrol
        self.update = update
        self.answers = answers or {}
        self.calls: list[tuple[tuple[str, ...], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        argv = tuple(argv)
        self.calls.append((argv, timeout_s))
        key = " ".join(argv[:2])
        if key in self.answers:
            return self.answers[key]
        if argv[0] == "scontrol":
            if self.scontrol is not None:
                return self.scontrol
            if argv[1] == "update" and self.update is not None:
                return self.update
            return self.slurm("ctl01", list(argv)).result
        return self.sim(NODE, list(argv)).result

    def scontrol_calls(self) -> list[tuple[str, ...]]:
        return [argv for argv, _ in self.calls if argv[0] == "scontrol"]

    def probe_calls(self) -> set[tuple[tuple[str, ...], float]]:
        return {(argv, t) for argv, t in self.calls if argv[0] != "scontrol"}


def check(cluster_yml: Path, fake: FakeNode, **kw: Any) -> nodecheck.NodeCheckResult:
    return node_check(load_cluster(cluster_yml), node=kw.pop("node", NODE), runner=fake, **kw)


def problems(result: nodecheck.NodeCheckResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in result.node_report.problems():
        out.setdefault(c.check, []).append(c.message)
    return out


# ------------------------------------------------------------------------------------------
# The probes: exactly validate's, judged by the same core


@pytest.mark.parametrize("level", ["quick", "standard"])
def test_runs_exactly_the_probes_validate_runs_with_their_timeouts(
    cluster_yml: Path, level: str
) -> None:
    fake = FakeNode()
    res = check(cluster_yml, fake, level=level)
    exp = expectations(with_level(load_cluster(cluster_yml), level))[NODE]
    # validate's probes but the GPUDirect RDMA loopbacks (a server and a client at once)
    plan = [p for p in probes_for(exp, level) if not p.per_gpu]
    assert len(plan) < len(probes_for(exp, level)) or level == "quick"
    want = {(p.command(exp), float(p.timeout_s)) for p in plan}
    assert fake.probe_calls() == want
    assert not res.failed, problems(res)
    assert set(res.probes) == {p.kind for p in plan}
    assert res.probes["smi-xml"]["command"] == "nvidia-smi -q -x"
    assert res.probes["smi-xml"]["timeout_s"] == 60
    # a node alone: no ib_write_bw (it needs a second node), no fleet comparison
    checks = {c.check for c in res.node_report.checks}
    assert not {"ib.write_bw", "gpudirect.write_bw", "nccl.busbw.fleet"} & checks
    if level == "standard":
        assert "nccl.busbw" in checks


def test_a_passing_node_in_service_is_left_alone(cluster_yml: Path) -> None:
    fake = FakeNode()
    res = check(cluster_yml, fake)
    assert not res.failed
    assert not res.slurm_failed
    assert res.slurm is not None
    assert (res.slurm.action, res.slurm.detail) == ("none", "in service")
    assert fake.scontrol_calls() == [("scontrol", "show", "node", NODE)]
    assert fake.slurm.updates == []


def test_a_failing_probe_drains_the_node_with_node_checks_reason(cluster_yml: Path) -> None:
    fake = FakeNode(fault("pcie_degraded", "2"))
    res = check(cluster_yml, fake)
    assert res.failed
    assert "gpu.pcie.width" in problems(res)
    assert res.slurm is not None
    assert res.slurm.action == "drain"
    assert res.slurm.done
    state, reason = fake.slurm.nodes[NODE]
    assert state == "IDLE+DRAIN"
    assert reason is not None
    assert reason.startswith("gpuctl node-check: gpu.pcie.width ")
    assert "x8" in reason
    assert len(reason) <= 100
    assert fake.scontrol_calls()[1] == (
        "scontrol",
        "update",
        f"nodename={NODE}",
        "state=drain",
        f"reason={reason}",
    )


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("IDLE+DRAIN", "maintenance"),
        ("IDLE+DRAIN", "gpuctl: gpu.count 7 GPUs visible"),  # gpuctl validate --drain-failed
        ("DOWN", "Not responding"),
        ("DOWN+DRAIN", "gpuctl rollout: rebooting"),
        ("IDLE+DRAIN", None),
    ],
)
def test_a_failing_node_already_drained_or_down_keeps_its_reason(
    cluster_yml: Path, state: str, reason: str | None
) -> None:
    fake = FakeNode(fault("pcie_degraded", "2"), {NODE: (state, reason)})
    res = check(cluster_yml, fake)
    assert res.failed
    assert not res.slurm_failed
    assert res.slurm is not None
    assert res.slurm.action == "none"
    assert res.slurm.detail.startswith("left as it is: already ")
    assert fake.slurm.updates == []
    assert fake.slurm.nodes[NODE] == (state, reason)


def test_its_own_drain_gains_the_checks_this_run_adds(cluster_yml: Path) -> None:
    # drained by node-check at standard for NCCL; this quick run fails the PCIe width and does
    # not run NCCL: both stay named, so a later run that passes only one does not resume it
    own = "gpuctl node-check: nccl.busbw 120 GB/s < 360 GB/s [standard]"
    fake = FakeNode(fault("pcie_degraded", "2"), {NODE: ("IDLE+DRAIN", own)})
    res = check(cluster_yml, fake)
    assert res.slurm is not None
    assert res.slurm.action == "drain"
    _, reason = fake.slurm.nodes[NODE]
    assert reason is not None
    assert reason.startswith("gpuctl node-check: gpu.pcie.width GPU2 ")
    assert reason.endswith("; nccl.busbw 120 GB/s < 360 GB/s [standard]")
    # the same failure again adds no check: the reason (and its time) is left as it is
    again = FakeNode(fault("pcie_degraded", "2"), {NODE: ("IDLE+DRAIN", reason)})
    res = check(cluster_yml, again)
    assert res.slurm is not None
    assert res.slurm.action == "none"
    assert again.slurm.updates == []


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("IDLE+DRAIN", "maintenance"),
        ("IDLE+DRAIN", "gpuctl: gpu.count 7 GPUs visible"),
        ("IDLE+DRAIN", "gpuctl rollout: batch 2"),
        ("DOWN", "Not responding"),
    ],
)
def test_a_passing_node_drained_by_someone_else_is_not_resumed(
    cluster_yml: Path, state: str, reason: str
) -> None:
    fake = FakeNode(slurm={NODE: (state, reason)})
    res = check(cluster_yml, fake)
    assert not res.failed
    assert not res.slurm_failed
    assert res.slurm is not None
    assert res.slurm.action == "none"
    assert "not drained by gpuctl node-check" in res.slurm.detail
    assert fake.slurm.updates == []


def test_a_passing_node_node_check_drained_is_resumed(cluster_yml: Path) -> None:
    own = "gpuctl node-check: gpu.pcie.width GPU2 PCIe link trained at x8 of x16 [quick]"
    fake = FakeNode(slurm={NODE: ("IDLE+DRAIN", own)})
    res = check(cluster_yml, fake)
    assert not res.failed
    assert not res.slurm_failed
    assert res.slurm is not None
    assert (res.slurm.action, res.slurm.done) == ("resume", True)
    assert fake.slurm.updates == [f"scontrol update nodename={NODE} state=resume"]
    assert fake.slurm.nodes[NODE] == ("IDLE", None)


def test_a_reason_without_its_level_is_resumed_only_at_standard(cluster_yml: Path) -> None:
    # written before reasons recorded their level: as if drained at standard (fail closed);
    # gpu.pcie.width reports only failures, so a quick run cannot tell it was judged
    old = "gpuctl node-check: gpu.pcie.width GPU2 x8"
    quick = check(cluster_yml, FakeNode(slurm={NODE: ("IDLE+DRAIN", old)}))
    assert quick.slurm is not None
    assert (quick.slurm.action, quick.slurm.detail) == (
        "none",
        "kept drained: gpu.pcie.width not run at level quick",
    )
    standard = FakeNode(slurm={NODE: ("IDLE+DRAIN", old)})
    res = check(cluster_yml, standard, level="standard")
    assert res.slurm is not None
    assert res.slurm.action == "resume"


def test_a_quick_check_keeps_a_node_drained_for_nccl(cluster_yml: Path) -> None:
    own = "gpuctl node-check: nccl.busbw 120 GB/s < 360 GB/s [standard]"
    fake = FakeNode(slurm={NODE: ("IDLE+DRAIN", own)})
    res = check(cluster_yml, fake)
    assert not res.failed
    assert res.slurm is not None
    assert (res.slurm.action, res.slurm.detail) == (
        "none",
        "kept drained: nccl.busbw not run at level quick",
    )
    assert fake.slurm.updates == []
    again = FakeNode(slurm={NODE: ("IDLE+DRAIN", own)})
    res = check(cluster_yml, again, level="standard")
    assert res.slurm is not None
    assert res.slurm.action == "resume"


def test_drain_then_pass_again_resumes(cluster_yml: Path) -> None:
    faulty = FakeNode(fault("ib_port_down", "mlx5_3"))
    check(cluster_yml, faulty)
    healthy = FakeNode(slurm=faulty.slurm.nodes)
    res = check(cluster_yml, healthy)
    assert res.slurm is not None
    assert res.slurm.action == "resume"
    assert healthy.slurm.nodes[NODE] == ("IDLE", None)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            ExecResult(stderr=b"scontrol: command not found\n", rc=127),
            "scontrol show node gpu002: exit 127: scontrol: command not found",
        ),
        (
            ExecResult(stderr=b"slurm_load_node error: Unable to contact slurm controller\n", rc=1),
            "exit 1: slurm_load_node error: Unable to contact slurm controller",
        ),
        (ExecResult(timed_out=True), "scontrol show node gpu002: timed out"),
        (ExecResult(b"Node gpu002 not found\n", rc=0), "output not understood"),
    ],
)
def test_scontrol_failing_is_an_error_never_ignored(
    cluster_yml: Path, answer: ExecResult, error: str
) -> None:
    res = check(cluster_yml, FakeNode(fault("pcie_degraded", "2"), scontrol=answer))
    assert res.slurm_failed
    assert res.slurm_error is not None
    assert error in res.slurm_error
    # a healthy node too: a health check that cannot reach Slurm says so
    assert check(cluster_yml, FakeNode(scontrol=answer)).slurm_failed


def test_scontrol_update_failing_is_an_error(cluster_yml: Path) -> None:
    denied = ExecResult(stderr=b"slurm_update error: Invalid user id\n", rc=1)
    res = check(cluster_yml, FakeNode(fault("pcie_degraded", "2"), update=denied))
    assert res.slurm_failed
    assert res.slurm is not None
    assert res.slurm.action == "drain"
    assert not res.slurm.done
    assert res.slurm.error == "scontrol update: exit 1: slurm_update error: Invalid user id"


def test_slurm_not_knowing_the_node_is_an_error(cluster_yml: Path) -> None:
    res = check(cluster_yml, FakeNode(slurm={"gpu001": ("IDLE", None)}))
    assert res.slurm_error == "scontrol show node gpu002: Slurm does not list gpu002"


# ------------------------------------------------------------------------------------------
# Fail closed


def test_a_probe_that_times_out_is_unknown_and_fails_the_node(cluster_yml: Path) -> None:
    fake = FakeNode(answers={"nvidia-smi -q": ExecResult(b"<?xml", timed_out=True)})
    res = check(cluster_yml, fake)
    assert res.failed
    gpu = [c for c in res.node_report.checks if c.check == "gpu"]
    assert [c.verdict for c in gpu] == [Verdict.UNKNOWN]
    assert "timed out after 60 s" in gpu[0].message
    assert res.probes["smi-xml"]["timed_out"] is True
    state, reason = fake.slurm.nodes[NODE]
    assert state == "IDLE+DRAIN"
    assert reason is not None
    assert reason.startswith(f"{PREFIX} gpu ")


def test_unknown_does_not_fail_when_cluster_yml_says_so(cluster_yml: Path) -> None:
    doc = yaml.safe_load(cluster_yml.read_text())
    doc.setdefault("validation", {})["unknown_is_failure"] = False
    cluster_yml.write_text(yaml.safe_dump(doc))
    fake = FakeNode(answers={"ibstat": ExecResult(error="could not run: boom")})
    res = check(cluster_yml, fake)
    assert res.node_report.verdict is Verdict.UNKNOWN
    assert not res.failed
    assert fake.slurm.updates == []


def test_a_tool_that_is_missing_is_unknown_not_ok(cluster_yml: Path) -> None:
    missing = ExecResult(stderr=b"ibstat: command not found\n", rc=127)
    res = check(cluster_yml, FakeNode(answers={"ibstat": missing}))
    assert res.failed
    assert res.probes["ibstat"]["error"] == "ibstat: command not found (exit 127)"


def test_the_deadline_ends_probes_and_they_count_as_timed_out(cluster_yml: Path) -> None:
    fake = FakeNode()
    seen: dict[str, float] = {}

    def slow_nccl(argv: Sequence[str], timeout_s: float) -> ExecResult:
        seen[argv[0]] = timeout_s
        if argv[0] == "all_reduce_perf":  # runs into its (shortened) timeout
            time.sleep(timeout_s)
            return ExecResult(timed_out=True, seconds=timeout_s)
        return fake(argv, timeout_s)

    res = node_check(
        load_cluster(cluster_yml),
        node=NODE,
        level="standard",
        deadline_s=1,
        runner=slow_nccl,
        drain=False,
    )
    assert seen["nvidia-smi"] == 1  # every probe is bounded by the deadline
    assert seen["all_reduce_perf"] == 1
    assert "dcgmi" not in seen  # the deadline had passed: never started
    assert (res.probes["nccl"]["timeout_s"], res.probes["nccl"]["deadline_s"]) == (1, 1)
    assert res.probes["nccl"]["error"] == "timed out after 1 s"
    assert res.probes["dcgm-diag"]["error"] == "not run: the node-check deadline of 1 s had passed"
    assert res.failed
    verdicts = {c.check: c.verdict for c in res.node_report.checks}
    assert verdicts["nccl.busbw"] is Verdict.UNKNOWN
    assert verdicts["dcgm"] is Verdict.UNKNOWN


# ------------------------------------------------------------------------------------------
# Which node, which Slurm


def test_a_node_not_in_cluster_yml_is_a_usage_error(cluster_yml: Path) -> None:
    with pytest.raises(UsageError, match=r"node 'gpu009' is not in .*gpu\[001-003\]"):
        check(cluster_yml, FakeNode(), node="gpu009")


def test_the_node_defaults_to_the_short_host_name(
    cluster_yml: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu002.cluster.example")
    res = node_check(load_cluster(cluster_yml), runner=FakeNode())
    assert res.node == NODE


def test_no_drain_and_nodes_slurm_does_not_run_leave_slurm_alone(cluster_yml: Path) -> None:
    fake = FakeNode(fault("pcie_degraded", "2"))
    res = check(cluster_yml, fake, drain=False)
    assert res.failed
    assert res.slurm is None
    assert fake.scontrol_calls() == []
    assert res.slurm_note == "--no-drain: Slurm left as it is"
    ctl = FakeNode()
    res = check(cluster_yml, ctl, node="ctl01")
    assert res.slurm is None
    assert ctl.calls == []
    assert res.slurm_note is not None
    assert "not a Slurm compute node" in res.slurm_note
    assert not res.failed


def test_an_unknown_level_is_a_usage_error(cluster_yml: Path) -> None:
    with pytest.raises(UsageError, match="--level: 'long'"):
        check(cluster_yml, FakeNode(), level="long")


def test_slurm_plan_is_pure() -> None:
    bad = NodeReport(NODE, (CheckResult("xid", NODE, Verdict.FAIL, "Xid 79 on GPU3"),))
    good = NodeReport(NODE, (CheckResult("xid", NODE, Verdict.OK, "none"),))
    idle: dict[str, Any] = {"state": "IDLE", "state_flags": [], "reason": None}
    ours = {"state": "IDLE", "state_flags": ["DRAIN"], "reason": f"{PREFIX} xid 79"}
    assert slurm_plan(bad, idle).reason == f"{PREFIX} xid Xid 79 on GPU3 [quick]"
    assert slurm_plan(good, ours).action == "resume"
    assert slurm_plan(bad, ours).action == "none"
    assert slurm_plan(good, idle).action == "none"


# ------------------------------------------------------------------------------------------
# The bundle: the validate format, judged again offline with the same verdicts


def test_out_keeps_a_bundle_that_validate_judges_again(cluster_yml: Path) -> None:
    out = cluster_yml.parent / "bundle"
    res = check(cluster_yml, FakeNode(fault("pcie_degraded", "2")), out=out)
    assert res.bundle == out
    assert sorted(p.name for p in out.iterdir()) == ["bundle.json", NODE, "results.json"]
    header = json.loads((out / "bundle.json").read_text())
    assert (header["complete"], header["nodes"], header["level"]) == (True, [NODE], "quick")
    again = judge_bundle(load_cluster(cluster_yml), out)
    node = next(n for n in again.report.nodes if n.node == NODE)
    assert [(c.check, c.verdict) for c in node.checks] == [
        (c.check, c.verdict) for c in res.node_report.checks
    ]
    with pytest.raises(UsageError, match="exists and is not an empty directory"):
        check(cluster_yml, FakeNode(), out=out)


def test_without_out_nothing_is_left_behind(
    cluster_yml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    check(cluster_yml, FakeNode())
    assert list((tmp_path / "tmp").iterdir()) == []


# ------------------------------------------------------------------------------------------
# The local runner: real processes


def test_run_local_keeps_the_exit_status_and_output() -> None:
    res = run_local(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (res.stdout, res.stderr, res.rc, res.timed_out, res.error) == (
        b"out\n",
        b"err\n",
        3,
        False,
        None,
    )


def test_run_local_times_out_and_ends_the_whole_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "child-survived"
    start = time.monotonic()
    # the shell's child ignores nothing; both are in the group that gets SIGTERM
    res = run_local(["sh", "-c", f"(sleep 3; touch {marker}) & sleep 30"], 0.3)
    assert time.monotonic() - start < 5
    assert res.timed_out
    assert res.rc is None
    time.sleep(3.5)
    assert not marker.exists()


def test_run_local_kills_what_ignores_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "KILL_AFTER_S", 0.3)
    start = time.monotonic()
    res = run_local(["sh", "-c", "trap '' TERM; sleep 30"], 0.2)
    assert res.timed_out
    assert time.monotonic() - start < 5


def test_run_local_reports_missing_and_unrunnable_commands(tmp_path: Path) -> None:
    res = run_local(["gpuctl-no-such-tool"], 5)
    assert (res.rc, res.stderr) == (127, b"gpuctl-no-such-tool: command not found\n")
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    res = run_local([str(script)], 5)
    assert res.rc == 126


def test_run_local_reports_a_signal_as_an_error() -> None:
    res = run_local(["sh", "-c", "kill -KILL $$"], 5)
    assert res.rc is None
    assert res.error == "sh was killed by signal 9"


# ------------------------------------------------------------------------------------------
# The light entry point imports only what the nodes' virtualenv holds


def test_the_light_entry_point_imports_no_heavy_module() -> None:
    code = (
        "import sys, gpuctl.cli.nodecheck_main\n"
        "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('gpuctl.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    for heavy in ("jinja2", "ansible_runner", "ansible", "paramiko", "pytest", "rich"):
        assert heavy not in out, heavy
    for ours in ("gpuctl.render", "gpuctl.provision", "gpuctl.lab", "gpuctl.acceptance"):
        assert not any(m == ours or m.startswith(ours + ".") for m in out), ours

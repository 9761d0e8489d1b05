"""`gpuctl rollout plan|apply|status|resume|abort` end to end on a fake cluster (the backend is
tests/unit/rollout_fake.FakeBackend; state, lock and audit log are the real ones on disk)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko  # type: ignore[import-untyped]
import pytest
from rollout_fake import OLD, FakeBackend, FakeNode, Killed, Script
from typer.testing import CliRunner

from gpuctl.cli.app import app
from gpuctl.rollout import run as rollout_run
from gpuctl.rollout.model import Component
from gpuctl.rollout.store import cluster_lock

runner = CliRunner()
NODES = ("gpu001", "gpu002", "gpu003")
TARGET = "2.0"


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "fw.bin"
    path.write_bytes(b"firmware")
    return path


def node(name: str, **script: bool) -> FakeNode:
    return FakeNode(
        name,
        running={Component.NIC_FIRMWARE: OLD},
        pending={Component.NIC_FIRMWARE: None},
        script=Script(**script),
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    cluster = FakeBackend(node(n) for n in NODES)
    monkeypatch.setattr(rollout_run, "cluster_backend", lambda *a: cluster)
    return cluster


def invoke(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def rollout(cluster_yml: Path, image: Path, verb: str = "apply", *more: str) -> list[str]:
    return [
        "rollout",
        verb,
        str(cluster_yml),
        "--component",
        "nic-firmware",
        "--to",
        TARGET,
        "--image",
        str(image),
        *more,
    ]


def test_plan_shows_canary_and_batches_and_changes_nothing(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    fake.nodes["gpu003"].drained, fake.nodes["gpu003"].reason = True, "hw ticket 4711"
    code, out, err = invoke(*rollout(cluster_yml, image, "plan", "--max-unavailable", "1"))
    assert code == 0, err
    rows = {line.split("│")[2].strip(): line for line in out.splitlines() if "gpu00" in line}
    assert "canary" in rows["gpu001"]
    assert "update" in rows["gpu002"]
    assert "leave" in rows["gpu003"]
    assert "hw ticket 4711" in rows["gpu003"]
    assert "2 of 3 nodes to update in 2 batches; at most 1 out of service" in err
    assert fake.calls_of("drain") == []
    assert not (cluster_yml.parent / ".gpuctl" / "rollouts").exists()


def test_plan_exits_1_when_a_node_cannot_be_read(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    fake.nodes["gpu002"].script.versions_unreadable = True
    code, out, err = invoke(*rollout(cluster_yml, image, "plan", "--json"))
    assert code == 1
    plan = json.loads(out)
    actions = {n["node"]: n["action"] for n in plan["nodes"]}
    assert actions == {"gpu001": "update", "gpu002": "unknown", "gpu003": "update"}
    assert "apply would refuse this plan" in err
    # and apply refuses it, touching nothing
    code, _, err = invoke(*rollout(cluster_yml, image))
    assert code == 2
    assert "cannot plan these nodes, nothing started: gpu002" in err
    assert fake.calls_of("drain") == []


def test_apply_updates_every_node_and_status_shows_it(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    code, out, err = invoke(*rollout(cluster_yml, image, "apply", "--json"))
    assert code == 0, err
    state = json.loads(out)
    assert state["status"] == "done"
    assert {n: s["phase"] for n, s in state["nodes"].items()} == dict.fromkeys(NODES, "done")
    assert all(fake.nodes[n].running[Component.NIC_FIRMWARE] == TARGET for n in NODES)
    assert not any(fake.nodes[n].drained for n in NODES)
    assert "drained" in err  # the audit log followed live
    code, out, err = invoke("rollout", "status", str(cluster_yml), "--audit", "3")
    assert code == 0
    assert "done" in err
    # the default state dir is beside cluster.yml, with the audit log as JSON lines
    root = cluster_yml.parent / ".gpuctl" / "rollouts"
    rid = (root / "current").read_text().strip()
    lines = (root / rid / "audit.jsonl").read_text().splitlines()
    assert all(json.loads(line)["rollout"] == rid for line in lines)
    assert json.loads((root / rid / "options.json").read_text())["image"] == str(image)


def test_a_failed_validation_leaves_the_node_drained_and_exits_1(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    fake.nodes["gpu002"].script.validation_fail = True
    more = ("--failure-threshold", "2", "--max-unavailable", "2")
    code, out, err = invoke(*rollout(cluster_yml, image, "apply", *more))
    assert code == 1
    assert fake.nodes["gpu002"].drained
    assert fake.nodes["gpu002"].reason == f"gpuctl rollout: nic-firmware {TARGET}"
    assert "failed" in out
    assert fake.nodes["gpu003"].running[Component.NIC_FIRMWARE] == TARGET
    assert "done" in err


def test_a_failed_node_left_drained_uses_up_max_unavailable(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    fake.nodes["gpu002"].script.validation_fail = True
    more = ("--failure-threshold", "2", "--max-unavailable", "1")
    code, _, err = invoke(*rollout(cluster_yml, image, "apply", *more))
    assert code == 1
    assert "halted" in err
    assert fake.nodes["gpu003"].running[Component.NIC_FIRMWARE] == OLD
    assert not fake.nodes["gpu003"].drained


def test_a_halted_rollout_blocks_a_new_one_until_resumed_or_aborted(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    fake.nodes["gpu001"].script.no_come_back = True
    code, _, err = invoke(*rollout(cluster_yml, image))
    assert code == 1
    assert "halted" in err
    assert "did not come back" in err
    code, _, err = invoke(*rollout(cluster_yml, image))
    assert code == 2
    assert "resume` or `gpuctl rollout abort` it first" in err
    code, _, err = invoke("rollout", "abort", str(cluster_yml), "--reason", "ticket 12")
    assert code == 0
    assert "aborted; still drained by gpuctl: gpu001" in err
    # the failed node still holds the only max_unavailable slot: resume halts again at once
    code, _, err = invoke("rollout", "resume", str(cluster_yml), "--failure-threshold", "2")
    assert code == 1
    assert "max_unavailable (1) is used up by failed nodes left drained: gpu001" in err
    # the operator repairs gpu001 and resumes it in Slurm; gpuctl lets go of it and goes on
    n = fake.nodes["gpu001"]
    n.down, n.script.no_come_back, n.drained, n.reason = False, False, False, None
    code, _, err = invoke("rollout", "resume", str(cluster_yml), "--failure-threshold", "2")
    assert code == 1  # done, with gpu001's failure on record
    assert "done" in err
    assert all(fake.nodes[x].running[Component.NIC_FIRMWARE] == TARGET for x in NODES[1:])
    assert not any(fake.nodes[x].drained for x in NODES)
    assert fake.applies()["gpu001"] == 1  # not updated twice


def test_a_second_process_is_refused_while_one_holds_the_lock(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    with cluster_lock(cluster_yml.parent / ".gpuctl"):
        code, _, err = invoke(*rollout(cluster_yml, image))
    assert code != 0
    assert "pid" in err or "process" in err
    assert fake.calls_of("drain") == []


def test_resume_refuses_new_batching(cluster_yml: Path, image: Path, fake: FakeBackend) -> None:
    fake.nodes["gpu001"].script.no_come_back = True
    assert invoke(*rollout(cluster_yml, image))[0] == 1
    code, _, err = invoke("rollout", "resume", str(cluster_yml), "--max-unavailable", "3")
    assert code == 2
    assert "No such option" in err or "fixed once planned" in err


def test_gpu_firmware_needs_a_package_and_the_bmc_credentials(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    base = ("rollout", "plan", str(cluster_yml), "--component", "gpu-firmware", "--to", "1.2")
    code, _, err = invoke(*base)
    assert code == 2
    assert "gpu-firmware: give the firmware image with --image FILE" in err
    # the lab starter names a CA and a vault file that are not there: refused before any node
    # is read
    code, _, err = invoke(*base, "--image", str(image))
    assert code == 2
    assert "bmc.ca_bundle:" in err
    assert "ca.pem is not a file" in err
    ca = cluster_yml.parent / ".gpuctl/lab/bmc/ca.pem"
    ca.parent.mkdir(parents=True)
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    code, _, err = invoke(*base, "--image", str(image))
    assert code == 2
    assert "vault password file" in err
    assert "Traceback" not in err
    assert fake.count == 0


# a pid no process can have: Linux pids stay below pid_max, at most 2**22
DEAD_PID = 4_194_305


def _rollout_dir(cluster_yml: Path) -> Path:
    root = cluster_yml.parent / ".gpuctl" / "rollouts"
    return root / (root / "current").read_text().strip()


def test_a_killed_apply_is_interrupted_not_running_and_a_new_apply_says_so(
    cluster_yml: Path, image: Path, fake: FakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of `rollout apply` (simulated: the process dies at gpu001's reboot, its pid
    is gone): status says interrupted (pid N gone), as provision does, not running."""

    def die_at_the_reboot(f: FakeBackend, method: str, node: str) -> None:
        if method == "restart":
            f.dead = True
            raise Killed

    fake.hook = die_at_the_reboot
    with monkeypatch.context() as m:
        m.setattr(os, "getpid", lambda: DEAD_PID)
        with pytest.raises(Killed):
            runner.invoke(app, rollout(cluster_yml, image))
    fake.revive()
    fake.hook = None
    code, out, err = invoke("rollout", "status", str(cluster_yml))
    assert code == 1
    last = [line for line in err.splitlines() if line.startswith("rollout ")][-1]
    assert f"interrupted (pid {DEAD_PID} gone)" in last
    assert " running" not in last
    assert f"continue with: gpuctl rollout resume {cluster_yml}" in err
    code, out, _ = invoke("rollout", "status", str(cluster_yml), "--json")
    assert json.loads(out)["interrupted"] == f"interrupted (pid {DEAD_PID} gone)"
    # a new apply is refused, naming what happened and what to do
    code, _, err = invoke(*rollout(cluster_yml, image))
    assert code == 2
    assert f"was interrupted (pid {DEAD_PID} gone): `gpuctl rollout resume` or" in err
    # and the resume it names finishes the rollout, no node updated twice
    code, _, err = invoke("rollout", "resume", str(cluster_yml))
    assert code == 0, err
    assert fake.applies() == dict.fromkeys(NODES, 1)


def test_the_halt_hint_names_what_to_do_before_resume(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    """A halt's hint: a plain `resume` would halt again (the failed node holds the only slot
    and counts toward failure_threshold 1); the hint names both steps, and they work."""
    fake.nodes["gpu001"].script.validation_fail = True
    code, _, err = invoke(*rollout(cluster_yml, image))
    assert code == 1
    assert "halted" in err
    assert "continue with: gpuctl rollout resume CLUSTER" not in err
    assert "to continue (a resume alone would halt again):" in err
    assert (
        "1. repair gpu001, then return it to service in Slurm: scontrol update nodename=gpu001 "
        "state=resume"
    ) in err
    assert f"2. gpuctl rollout resume {cluster_yml} --failure-threshold 2" in err
    # status prints the same steps
    _, _, status_err = invoke("rollout", "status", str(cluster_yml))
    assert f"gpuctl rollout resume {cluster_yml} --failure-threshold 2" in status_err
    # the claim holds: a plain resume halts again at once
    code, _, err = invoke("rollout", "resume", str(cluster_yml))
    assert code == 1
    assert "halted" in err
    assert fake.applies()["gpu002"] == 0
    # both steps: the operator repairs gpu001 and resumes it in Slurm, then raises the threshold
    n = fake.nodes["gpu001"]
    n.drained, n.reason, n.script.validation_fail = False, None, False
    code, _, err = invoke("rollout", "resume", str(cluster_yml), "--failure-threshold", "2")
    assert code == 1  # done, with gpu001's failure on record
    assert "done" in err
    assert all(fake.nodes[x].running[Component.NIC_FIRMWARE] == TARGET for x in NODES)
    assert "continue with" not in err


def test_audit_lines_print_counts_and_lists_not_python_values(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    code, _, err = invoke(*rollout(cluster_yml, image))
    assert code == 0, err
    finished = [line for line in err.splitlines() if " finished " in line]
    assert len(finished) == 1
    assert "counts=3 done" in finished[0]
    for char in "{}[]'":
        assert char not in finished[0], finished[0]
    code, out, _ = invoke("rollout", "status", str(cluster_yml), "--audit", "1000")
    assert "counts=3 done" in out
    assert "{'" not in out
    assert "batches=gpu001 | gpu002 | gpu003" in out


def test_node_text_is_printed_literally(cluster_yml: Path, image: Path, fake: FakeBackend) -> None:
    """A reason from Slurm with a PCI address (rich's :ab: emoji code), markup and an escape
    sequence comes out as it was written."""
    reason = "hw 0000:ab:00.0 [bold]x[/bold] \x1b[2J"
    fake.nodes["gpu003"].drained, fake.nodes["gpu003"].reason = True, reason
    code, out, err = invoke(*rollout(cluster_yml, image, "plan"))
    assert code == 0, err
    row = next(line for line in out.splitlines() if "gpu003" in line)
    assert "0000:ab:00.0 [bold]x[/bold] \\x1b[2J" in row
    assert "\x1b" not in out


@contextmanager
def _as_in_a_terminal() -> Iterator[None]:
    """Logging and threads as in a terminal: pytest's log handlers off (a record then reaches
    logging.lastResort, which writes to stderr) and Python's default thread excepthook."""
    root = logging.getLogger()
    handlers, hook = root.handlers[:], threading.excepthook
    root.handlers[:] = []
    threading.excepthook = threading.__excepthook__
    try:
        yield
    finally:
        root.handlers[:] = handlers
        threading.excepthook = hook


def _paramiko_transport_thread() -> None:
    """What paramiko's Transport.run does when a rebooting node resets the connection."""
    log = logging.getLogger("paramiko.transport")
    try:
        raise paramiko.SSHException(
            "Error reading SSH protocol banner[Errno 104] Connection reset by peer"
        )
    except paramiko.SSHException as exc:
        log.error("Exception (client): %s", exc)
        for line in paramiko.util.tb_strings():
            log.error(line)


def _thread_that_dies() -> None:
    raise ConnectionResetError(104, "Connection reset by peer (uncaught in a thread)")


def test_library_logging_and_thread_tracebacks_stay_off_the_terminal(
    cluster_yml: Path, image: Path, fake: FakeBackend
) -> None:
    def reboot_noise(f: FakeBackend, method: str, node: str) -> None:
        if method == "wait_up" and node == "gpu001":
            for target in (_paramiko_transport_thread, _thread_that_dies):
                t = threading.Thread(target=target, name=f"paramiko-{target.__name__}")
                t.start()
                t.join()

    fake.hook = reboot_noise
    with _as_in_a_terminal():
        code, out, err = invoke(*rollout(cluster_yml, image))
    assert code == 0, err
    for noise in ("Traceback", "SSH protocol banner", "Connection reset", "paramiko"):
        assert noise not in err
        assert noise not in out
    log = (_rollout_dir(cluster_yml) / "gpuctl.log").read_text(encoding="utf-8")
    assert "paramiko.transport" in log
    assert "Exception (client): Error reading SSH protocol banner" in log
    assert "ConnectionResetError" in log

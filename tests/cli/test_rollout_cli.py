"""`gpuctl rollout plan|apply|status|resume|abort` end to end on a fake cluster (the backend is
tests/unit/rollout_fake.FakeBackend; state, lock and audit log are the real ones on disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rollout_fake import OLD, FakeBackend, FakeNode, Script
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

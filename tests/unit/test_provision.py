"""gpuctl provision through real ansible-runner and ansible-playbook, on this machine.

The hosts of the lab's cluster.yml are reached with Ansible's local connection
(ANSIBLE_TRANSPORT=local), so the runner, its events and stats, run directories, --resume, the
lock, cancelling and the CLI are exercised for real without SSH; the lab tests do the same over
SSH against real nodes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT
from typer.testing import CliRunner

from gpuctl.cli.app import app
from gpuctl.config import load_cluster
from gpuctl.errors import EnvironmentProblem, UsageError
from gpuctl.provision import (
    ProgressEvent,
    ProvisionResult,
    provision,
    read_log,
    read_record,
    runner,
    state_dir_for,
)
from gpuctl.provision.runner import ansible_limit
from gpuctl.provision.runs import RunRecord, write_record

PLAYBOOK = str(Path(__file__).with_name("playbooks") / "provision-mixed.yml")
SECRET = "s3cr3t-munge-like-value-8f1b2c"  # noqa: S105 - a test value to search for


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    text = (ROOT / "inventories" / "lab.yml").read_text(encoding="utf-8")
    path = tmp_path / "cluster.yml"
    path.write_text(text.replace(".gpuctl/lab/known_hosts", "known_hosts"), encoding="utf-8")
    (tmp_path / "known_hosts").write_text("198.18.0.10 ssh-ed25519 AAAAC3Nz...\n")
    state = tmp_path / "test-state"
    state.mkdir()
    monkeypatch.setenv("ANSIBLE_TRANSPORT", "local")
    monkeypatch.setenv("ANSIBLE_PYTHON_INTERPRETER", sys.executable)
    monkeypatch.setenv("GPUCTL_TEST_SECRET", SECRET)
    monkeypatch.setenv("GPUCTL_TEST_STATE", str(state))
    monkeypatch.delenv("GPUCTL_STATE_DIR", raising=False)
    monkeypatch.setattr(runner, "PLAYBOOK", PLAYBOOK)
    return path


def _state(cluster: Path) -> Path:
    return cluster.parent / "test-state"


def _provision(cluster: Path, state_dir: Path | None = None, **options: Any) -> ProvisionResult:
    """provision() as `gpuctl provision` calls it: cluster.yml loaded, the default state dir."""
    return provision(
        load_cluster(cluster),
        cluster_file=cluster,
        state_dir=state_dir_for(cluster, state_dir),
        **options,
    )


def test_per_host_outcomes_come_from_the_runner_stats(cluster: Path) -> None:
    (_state(cluster) / "fail-gpu002").touch()
    events: list[ProgressEvent] = []
    result = _provision(cluster, on_event=events.append)
    rec = result.record
    assert rec.status == "failed"
    assert {h: o.state for h, o in rec.hosts.items()} == {
        "ctl01": "ok",
        "gpu001": "changed",
        "gpu002": "failed",
    }
    assert rec.hosts["gpu001"].changed == 1
    assert rec.hosts["gpu002"].failed == 1
    assert result.run_dir == cluster.parent / ".gpuctl" / "runs" / rec.run_id
    on_disk = read_record(result.run_dir)
    assert on_disk.to_json() == rec.to_json()
    assert ("play", "Mixed outcomes") in {(e.kind, e.play) for e in events}
    assert (
        ProgressEvent(
            "result", "Mixed outcomes", "Fail on gpu002 while its marker exists", "gpu002", "failed"
        )
        in events
    )
    # ansible-runner would switch host key checking off; gpuctl keeps it on
    command = result.run_dir / "runner" / "artifacts" / rec.run_id / "command"
    assert json.loads(command.read_text())["env"]["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    # the rendered inventory and the known_hosts it checks against are kept with the run
    assert (result.run_dir / "inventory" / "inventory.yml").is_file()
    assert (result.run_dir / "inventory" / "known_hosts").read_text().startswith("198.18.0.10")


def test_resume_reruns_only_the_failed_hosts(cluster: Path) -> None:
    marker = _state(cluster) / "fail-gpu002"
    marker.touch()
    first = _provision(cluster)
    assert first.record.status == "failed"
    marker.unlink()
    second = _provision(cluster, resume=True)
    assert second.record.resumed_from == first.record.run_id
    assert second.record.limit == "gpu002"
    assert second.record.status == "successful"
    assert set(second.record.hosts) == {"gpu002"}
    third = _provision(cluster, resume=True)
    assert third.nothing_to_do
    assert third.record.run_id == second.record.run_id


def test_resume_after_a_killed_run_reruns_its_whole_target(cluster: Path) -> None:
    runs = cluster.parent / ".gpuctl" / "runs" / "20260101T000000Z"
    runs.mkdir(parents=True)
    dead = RunRecord(
        run_id=runs.name,
        cluster=str(cluster),
        started="2026-01-01T00:00:00Z",
        limit="gpu001,gpu002",
        pid=2**22 + 17,  # no such process
    )
    write_record(runs, dead)
    assert read_record(runs).status == "interrupted"
    result = _provision(cluster, resume=True)
    assert result.record.limit == "gpu001,gpu002"
    assert set(result.record.hosts) == {"gpu001", "gpu002"}


def test_the_secret_never_reaches_the_run_directory(cluster: Path) -> None:
    result = _provision(cluster)
    assert result.record.status == "successful"
    leaks = [
        str(p)
        for p in result.run_dir.rglob("*")
        if p.is_file() and SECRET.encode() in p.read_bytes()
    ]
    assert leaks == []
    # the task did run: its censored result is in the events
    log = read_log(result.run_dir)
    assert any(r.task == "Handle a secret" for r in log.results)


def test_cancel_stops_the_run_and_records_it(cluster: Path) -> None:
    (_state(cluster) / "block").touch()
    cancel = threading.Event()

    def on_event(event: ProgressEvent) -> None:
        if event.kind == "task" and event.task.startswith("Wait while"):
            cancel.set()

    result = _provision(cluster, on_event=on_event, cancel=cancel)
    assert result.record.status == "canceled"
    assert result.seconds < 30
    assert read_record(result.run_dir).status == "canceled"
    # a canceled run has no per-host outcome: --resume takes its whole target again
    (_state(cluster) / "block").unlink()
    again = _provision(cluster, resume=True)
    assert again.record.status == "successful"
    assert set(again.record.hosts) == {"ctl01", "gpu001", "gpu002"}


def test_a_second_provision_on_the_same_cluster_is_refused(cluster: Path) -> None:
    state = cluster.parent / ".gpuctl"
    with runner._lock(state), pytest.raises(UsageError, match="another gpuctl provision"):
        _provision(cluster)


def test_missing_known_hosts_is_an_environment_problem(cluster: Path) -> None:
    (cluster.parent / "known_hosts").unlink()
    with pytest.raises(EnvironmentProblem, match=r"ssh\.known_hosts: .*known_hosts is missing"):
        _provision(cluster)


def test_limit_accepts_node_sets_and_ansible_patterns() -> None:
    assert ansible_limit("gpu[001-003]") == "gpu001,gpu002,gpu003"
    assert ansible_limit("gpu[001-002],ng_ctl") == "gpu001,gpu002,ng_ctl"
    assert ansible_limit("ng_gpu:!gpu001") == "ng_gpu:!gpu001"
    assert ansible_limit("gpu00[1:2]") == "gpu00[1:2]"  # Ansible's own slice syntax


def test_cli_table_exit_code_and_logs(cluster: Path) -> None:
    (_state(cluster) / "fail-gpu002").touch()
    cli = CliRunner()
    res = cli.invoke(app, ["provision", str(cluster), "--limit", "gpu[001-002]"])
    assert res.exit_code == 1, res.output
    rows = [ln.replace("│", " ").split() for ln in res.stdout.splitlines()]
    lines = {r[0]: r for r in rows if r and r[0].startswith("gpu")}
    assert lines["gpu001"][:4] == ["gpu001", "changed", "3", "1"]
    assert lines["gpu002"][1] == "failed"
    assert "ctl01" not in res.stdout
    state = cluster.parent / ".gpuctl"
    logs = cli.invoke(app, ["logs", "--state-dir", str(state)])
    assert logs.exit_code == 0, logs.output
    assert "gpu002 marker present" in logs.stdout
    host = cli.invoke(app, ["logs", "--cluster", str(cluster), "--host", "gpu001"])
    assert "Change on gpu001" in host.stdout
    as_json = cli.invoke(app, ["logs", "--state-dir", str(state), "--json"])
    assert json.loads(as_json.stdout)["hosts"]["gpu002"]["state"] == "failed"
    (_state(cluster) / "fail-gpu002").unlink()
    ok = cli.invoke(app, ["provision", str(cluster), "--resume"])
    assert ok.exit_code == 0, ok.output
    assert ": successful in " in ok.stderr


def test_run_directory_is_private(cluster: Path) -> None:
    result = _provision(cluster)
    assert os.stat(result.run_dir).st_mode & 0o077 == 0


def test_a_relative_state_dir_works_from_any_directory(
    cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scripts/main.sh passes --state-dir out/lab-runs; Ansible runs in the playbooks folder."""
    monkeypatch.chdir(cluster.parent)
    result = _provision(cluster, state_dir=Path("runs-here"))
    assert result.record.status == "successful", result.record.to_json()
    assert set(result.record.hosts) == {"ctl01", "gpu001", "gpu002"}
    assert result.run_dir.is_relative_to(cluster.parent / "runs-here")

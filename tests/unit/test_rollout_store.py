"""The rollout store: atomic state.json, the audit log and its outbox, ids, abort, the lock."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT

from gpuctl.rollout.backend import Versions
from gpuctl.rollout.model import (
    AuditEvent,
    Component,
    NodeState,
    Phase,
    Plan,
    Policy,
    RolloutError,
    RolloutLocked,
    RolloutState,
    Status,
)
from gpuctl.rollout.plan import plan_rollout
from gpuctl.rollout.store import (
    RolloutStore,
    cluster_lock,
    current_rollout,
    new_rollout,
    new_rollout_id,
    rollouts_root,
)
from gpuctl.slurm import SlurmNode

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class Crash(BaseException):
    """A process dying inside a write."""


def a_plan() -> Plan:
    nodes = ["gpu001", "gpu002", "gpu003"]
    return plan_rollout(
        nodes,
        {n: SlurmNode(frozenset({"IDLE"})) for n in nodes},
        {"gpu001": Versions("1.0"), "gpu002": Versions("2.0"), "gpu003": Versions("1.0")},
        Component.DRIVER,
        "2.0",
        Policy(canary=1),
    )


def created(tmp_path: Path) -> tuple[RolloutStore, RolloutState]:
    store = RolloutStore(tmp_path / "20250314T101500Z-driver")
    return store, store.create(a_plan())


def test_create_writes_a_planned_state_and_a_planned_audit_line(tmp_path: Path) -> None:
    store, state = created(tmp_path)
    assert stat.S_IMODE(store.state_path.stat().st_mode) == 0o644
    loaded = store.load()
    assert loaded == state
    assert loaded.status is Status.PLANNED
    assert {n: s.phase for n, s in loaded.nodes.items()} == {
        "gpu001": Phase.PENDING,
        "gpu002": Phase.SKIPPED,
        "gpu003": Phase.PENDING,
    }
    data = json.loads(store.state_path.read_text(encoding="utf-8"))
    assert list(data)[:6] == ["schema", "rollout", "component", "target", "status", "reason"]
    assert data["rollout"] == "20250314T101500Z-driver"
    assert data["nodes"]["gpu001"] == {
        "phase": "pending",
        "batch": 0,
        "from_version": "1.0",
        "drained": False,
        "reason": "",
        "failed_phase": None,
        "halts": False,
    }
    [line] = store.read_audit()
    assert line["event"] == "planned"
    assert line["seq"] == 1
    assert line["batches"] == [["gpu001"], ["gpu003"]]
    with pytest.raises(RolloutError, match="exists already"):
        store.create(a_plan())


def test_save_is_temp_file_fsync_replace_then_directory_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, state = created(tmp_path)
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        assert Path(src).parent == Path(dst).parent == store.directory
        assert Path(src).name.startswith(".state.json.")
        steps.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.save(state)
    assert steps == ["fsync-file", "replace", "fsync-dir"]

    steps.clear()
    RolloutStore(store.directory, durable=False).save(state)
    assert steps == ["replace"]


def test_a_crash_between_temp_write_and_replace_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, state = created(tmp_path)
    old = store.state_path.read_text(encoding="utf-8")

    def crash(src: Any, dst: Any) -> None:
        raise Crash

    monkeypatch.setattr(os, "replace", crash)
    state.status = Status.RUNNING
    with pytest.raises(Crash):
        store.save(state)
    assert store.state_path.read_text(encoding="utf-8") == old
    assert store.load().status is Status.PLANNED
    monkeypatch.undo()

    # a temp file a real crash left behind does not disturb loading or the next save
    (store.directory / ".state.json.abc123.tmp").write_text('{"half": ', encoding="utf-8")
    assert store.load().status is Status.PLANNED
    store.save(state)
    assert store.load().status is Status.RUNNING


def test_audit_lines_parse_and_carry_ts_rollout_node_event_and_seq(tmp_path: Path) -> None:
    store, state = created(tmp_path)
    store.record(
        state,
        AuditEvent("draining", "gpu001", {"reason": "gpuctl rollout: driver 2.0", "batch": 0}),
        AuditEvent("started", details={"resumed": False}),
    )
    store.request_abort("maintenance window over")
    raw = store.audit_path.read_text(encoding="utf-8").splitlines()
    lines = [json.loads(r) for r in raw]
    assert lines == store.read_audit()
    assert [(x["node"], x["event"], x.get("seq")) for x in lines] == [
        (None, "planned", 1),
        ("gpu001", "draining", 2),
        (None, "started", 3),
        (None, "abort-requested", None),
    ]
    for line in lines:
        assert list(line)[:4] == ["ts", "rollout", "node", "event"]
        assert TS.match(line["ts"])
        assert line["rollout"] == store.rollout_id
    assert lines[1]["reason"] == "gpuctl rollout: driver 2.0"
    assert lines[3]["reason"] == "maintenance window over"
    assert stat.S_IMODE(store.audit_path.stat().st_mode) == 0o644


def test_audit_lines_are_fsynced_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = created(tmp_path)
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.append(AuditEvent("a"), AuditEvent("b"))
    assert len(synced) == 2
    assert synced[0] < synced[1]


def test_a_kill_between_state_and_audit_is_caught_up_from_the_outbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, state = created(tmp_path)

    def crash(self: RolloutStore, line: dict[str, Any]) -> None:
        raise Crash

    monkeypatch.setattr(RolloutStore, "append_line", crash)
    state.nodes["gpu001"] = NodeState("gpu001", Phase.DRAINING, 0, "1.0", drained=True)
    with pytest.raises(Crash):
        store.record(state, AuditEvent("draining", "gpu001"), AuditEvent("x", "gpu001"))
    monkeypatch.undo()
    assert [x["event"] for x in store.read_audit()] == ["planned"]

    fresh = RolloutStore(store.directory)
    loaded = fresh.load()
    assert loaded.nodes["gpu001"].phase is Phase.DRAINING
    assert fresh.complete_audit(loaded) == 2
    assert fresh.complete_audit(loaded) == 0
    assert [(x["event"], x["seq"]) for x in fresh.read_audit()] == [
        ("planned", 1),
        ("draining", 2),
        ("x", 3),
    ]


def test_a_torn_last_audit_line_is_ignored_then_replaced(tmp_path: Path) -> None:
    store, state = created(tmp_path)
    store.record(state, AuditEvent("started"))
    whole = store.audit_path.read_bytes()
    store.audit_path.write_bytes(whole[:-20])  # the process died inside the last write
    assert [x["event"] for x in store.read_audit()] == ["planned"]
    assert store.complete_audit(store.load()) == 1
    assert [x["event"] for x in store.read_audit()] == ["planned", "started"]
    assert store.audit_path.read_bytes().endswith(b"\n")

    store.audit_path.write_bytes(b"{not json\n" + store.audit_path.read_bytes())
    with pytest.raises(RolloutError, match=r"audit\.jsonl:1: not JSON"):
        store.read_audit()


def test_abort_marker(tmp_path: Path) -> None:
    store, _ = created(tmp_path)
    assert not store.abort_requested()
    store.request_abort()
    assert store.abort_requested()
    assert RolloutStore(store.directory).abort_requested()
    store.clear_abort()
    store.clear_abort()
    assert not store.abort_requested()
    events = [x["event"] for x in store.read_audit()]
    assert events == ["planned", "abort-requested", "abort-cleared"]


def test_unreadable_states_are_rollout_errors_naming_the_file(tmp_path: Path) -> None:
    store, _ = created(tmp_path)
    data = json.loads(store.state_path.read_text(encoding="utf-8"))
    for broken in (
        "{",
        "[]",
        json.dumps({**data, "schema": 99}),
        json.dumps({**data, "nodes": {}}),
    ):
        store.state_path.write_text(broken, encoding="utf-8")
        with pytest.raises(RolloutError, match=re.escape(str(store.state_path))):
            store.load()
    store.state_path.unlink()
    with pytest.raises(RolloutError, match="cannot read rollout state"):
        store.load()


def test_unreadable_state_files_are_environment_problems_exit_2(tmp_path: Path) -> None:
    from gpuctl.errors import EnvironmentProblem
    from gpuctl.rollout.store import StateFileError

    store, _ = created(tmp_path)
    store.state_path.write_bytes(b"\xff")
    with pytest.raises(StateFileError, match="not UTF-8") as caught:
        store.load()
    assert isinstance(caught.value, EnvironmentProblem)  # the CLI: one line, exit 2
    assert isinstance(caught.value, RolloutError)
    store.audit_path.write_bytes(b'{"event": "x", "node": 5}\n')
    with pytest.raises(StateFileError, match=r"audit\.jsonl:1: not an audit line \(node is"):
        store.read_audit()


def test_new_rollout_names_it_by_time_and_component_and_points_current_at_it(
    tmp_path: Path,
) -> None:
    when = datetime(2025, 3, 14, 10, 15, 0, tzinfo=UTC)
    assert current_rollout(tmp_path) is None
    first = new_rollout(tmp_path, a_plan(), now=when)
    second = new_rollout(tmp_path, a_plan(), now=when)
    assert first.directory == rollouts_root(tmp_path) / "20250314T101500Z-driver"
    assert second.rollout_id == "20250314T101500Z-driver-2"
    assert (rollouts_root(tmp_path) / "current").read_text(encoding="utf-8") == (
        "20250314T101500Z-driver-2\n"
    )
    found = current_rollout(tmp_path)
    assert found is not None
    assert found.directory == second.directory
    assert re.fullmatch(
        r"\d{8}T\d{6}Z-nic-firmware", new_rollout_id(tmp_path, Component.NIC_FIRMWARE)
    )

    (rollouts_root(tmp_path) / "current").write_text("gone\n", encoding="utf-8")
    with pytest.raises(RolloutError, match="'gone', which is not a rollout"):
        current_rollout(tmp_path)


HOLDER = """
import sys
from pathlib import Path
from gpuctl.rollout.store import cluster_lock
with cluster_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_the_lock_is_exclusive_and_names_the_holder(tmp_path: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        with (
            pytest.raises(
                RolloutLocked, match=rf"pid {holder.pid} holds .*rollouts/\.lock"
            ) as info,
            cluster_lock(tmp_path),
        ):
            pass  # pragma: no cover - never reached
        assert info.value.pid == holder.pid
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0

    with cluster_lock(tmp_path) as path:
        assert path.read_text(encoding="utf-8") == f"{os.getpid()}\n"
        # a second holder in the same process is refused as well (one flock per open file)
        with pytest.raises(RolloutLocked, match=f"pid {os.getpid()}"), cluster_lock(tmp_path):
            pass  # pragma: no cover - never reached
    assert path.read_text(encoding="utf-8") == ""
    with cluster_lock(tmp_path):
        pass


def test_the_runner_pid_is_the_last_started_line_and_gone_means_interrupted() -> None:
    """A rollout whose state says running while nobody holds the lock: the note names the pid
    of its last run ('started' audit line) and whether that process is gone."""
    from gpuctl.rollout.store import interrupted_note, runner_pid

    dead = 4_194_305  # above Linux's pid_max limit: no process has it
    audit: list[dict[str, Any]] = [
        {"event": "planned", "node": None},
        {"event": "started", "node": None, "pid": 1111, "resumed": False},
        {"event": "draining", "node": "gpu001"},
        {"event": "started", "node": None, "pid": dead, "resumed": True},
        {"event": "abort-requested", "node": None},
    ]
    assert runner_pid(audit) == dead
    assert interrupted_note(audit) == f"interrupted (pid {dead} gone)"
    alive = [{"event": "started", "node": None, "pid": os.getpid()}]
    assert interrupted_note(alive) == f"interrupted (pid {os.getpid()} no longer holds the lock)"
    for bad in ([], [{"event": "started"}], [{"event": "started", "pid": "12"}],
                [{"event": "started", "pid": True}], [{"event": "started", "pid": 0}]):  # fmt: skip
        assert runner_pid(bad) is None
        assert interrupted_note(bad) == "interrupted (its process is gone)"

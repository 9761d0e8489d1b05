"""Broken rollout state on disk (issue 14): a state.json, audit.jsonl, options.json or
``current`` file that is not UTF-8 or not the JSON shape gpuctl writes is exit 2 with one clear
line naming the file, never a traceback (exit 70)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuctl import fileio
from gpuctl.cli.app import app
from gpuctl.rollout import run as rollout_run
from gpuctl.rollout import store as rollout_store
from gpuctl.rollout.backend import Versions
from gpuctl.rollout.model import Component, Policy, RolloutError
from gpuctl.rollout.plan import plan_rollout
from gpuctl.rollout.store import RolloutStore, new_rollout
from gpuctl.slurm import SlurmNode

runner = CliRunner()
NODES = ("gpu001", "gpu002", "gpu003")


def _no_backend(*args: Any) -> Any:
    raise AssertionError("a broken rollout must be refused before any node is touched")


@pytest.fixture
def cluster_yml(cluster_yml: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lab's cluster.yml (tests/conftest.py), with no state dir and no real backend."""
    monkeypatch.delenv("GPUCTL_STATE_DIR", raising=False)
    monkeypatch.setattr(rollout_run, "cluster_backend", _no_backend)
    return cluster_yml


@pytest.fixture
def store(cluster_yml: Path) -> RolloutStore:
    """A planned rollout beside cluster.yml, with its options.json (as `apply` leaves it)."""
    plan = plan_rollout(
        list(NODES),
        {n: SlurmNode(frozenset({"IDLE"})) for n in NODES},
        {n: Versions("1.0") for n in NODES},
        Component.NIC_FIRMWARE,
        "2.0",
        Policy(canary=1),
    )
    created = new_rollout(cluster_yml.parent / ".gpuctl", plan)
    options = {"cluster": str(cluster_yml), "image": None, "image_sha256": None}
    (created.directory / rollout_run.OPTIONS).write_text(json.dumps(options), encoding="utf-8")
    return created


def invoke(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stderr


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in err
    return lines[0]


def test_the_intact_rollout_reads(cluster_yml: Path, store: RolloutStore) -> None:
    code, err = invoke("rollout", "status", str(cluster_yml), "--audit", "5")
    assert code == 1  # planned, not done
    assert "planned" in err


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe{}",
        b"[" * 100_000 + b"]" * 100_000,
        b"{",
        b"[]",
        b'{"schema": 1, "nodes": "x"}',
        b"null",
    ],
)
def test_a_broken_state_json_is_exit_2_naming_it(
    cluster_yml: Path, store: RolloutStore, content: bytes
) -> None:
    store.state_path.write_bytes(content)
    code, err = invoke("rollout", "status", str(cluster_yml))
    assert code == 2, err
    assert str(store.state_path) in one_line(err).replace("\n", "")


def _state(store: RolloutStore) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(store.state_path.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize(
    "outbox",
    [
        [{"seq": "2", "event": "x"}],
        [{"seq": True, "event": "x"}],
        ["seq"],
        [[["seq", "x"]]],
        "x",
    ],
)
def test_an_outbox_of_the_wrong_shape_is_exit_2(
    cluster_yml: Path, store: RolloutStore, outbox: Any
) -> None:
    data = _state(store)
    data["outbox"] = outbox
    store.state_path.write_text(json.dumps(data), encoding="utf-8")
    code, err = invoke("rollout", "status", str(cluster_yml))
    assert code == 2, err
    assert "state.json" in one_line(err)


@pytest.mark.parametrize(
    "line",
    [
        b"\xff\xfe not utf-8",
        b"[1, 2]",
        b'"planned"',
        b'{"ts": "x", "node": ["gpu001"], "event": "planned"}',
        b'{"ts": "x", "node": null, "event": {"a": 1}}',
        b'{"ts": 5, "node": null, "event": "x"}',
        b'{"ts": "x", "node": null, "event": "x", "seq": "1"}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_a_broken_audit_line_is_exit_2_naming_the_file_and_line(
    cluster_yml: Path, store: RolloutStore, line: bytes
) -> None:
    good = store.audit_path.read_bytes()
    store.audit_path.write_bytes(line + b"\n" + good)
    code, err = invoke("rollout", "status", str(cluster_yml), "--audit", "5")
    assert code == 2, err
    text = one_line(err)
    assert "audit.jsonl:1" in text


def test_a_torn_last_audit_line_cut_inside_a_character_is_ignored(store: RolloutStore) -> None:
    good = store.audit_path.read_bytes()
    store.audit_path.write_bytes(good + '{"ts": "x", "event": "caf\u00e9'.encode()[:-1])
    assert [x["event"] for x in store.read_audit()] == ["planned"]
    assert store.complete_audit(store.load()) == 0


def test_an_audit_log_that_is_not_a_file_is_exit_2(cluster_yml: Path, store: RolloutStore) -> None:
    store.audit_path.unlink()
    store.audit_path.mkdir()
    code, err = invoke("rollout", "status", str(cluster_yml), "--audit", "5")
    assert code == 2, err
    assert "audit.jsonl" in one_line(err)


@pytest.mark.parametrize("content", [b"\xff\xfe", b"../../etc", b"a\x00b", b".", b".."])
def test_a_broken_current_file_is_exit_2(
    cluster_yml: Path, store: RolloutStore, content: bytes
) -> None:
    current = store.directory.parent / rollout_store.CURRENT
    current.write_bytes(content)
    code, err = invoke("rollout", "status", str(cluster_yml))
    assert code == 2, err
    assert "current" in one_line(err)


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe",
        b"[" * 100_000 + b"]" * 100_000,
        b"[]",
        b'{"cluster": 5}',
        b'{"cluster": "x", "image": ["a"]}',
        b'{"cluster": "x", "image": "/x", "image_sha256": 7}',
    ],
)
def test_a_broken_options_json_is_exit_2_on_resume(
    cluster_yml: Path, store: RolloutStore, content: bytes
) -> None:
    (store.directory / rollout_run.OPTIONS).write_bytes(content)
    code, err = invoke("rollout", "resume", str(cluster_yml))
    assert code == 2, err
    assert "options.json" in one_line(err)


def test_state_errors_are_still_rollout_errors(store: RolloutStore) -> None:
    store.state_path.write_bytes(b"\xff")
    with pytest.raises(RolloutError, match=r"state\.json"):
        store.load()


def test_the_store_writes_through_the_shared_atomic_writer(
    store: RolloutStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not hasattr(rollout_store, "write_atomic") or (
        rollout_store.write_atomic is fileio.write_atomic
    )
    written: list[tuple[str, int, bool]] = []
    real = fileio.write_atomic

    def spy(path: Path, data: bytes | str, *, mode: int = 0o644, durable: bool = False,
            dir_mode: int | None = None) -> None:  # fmt: skip
        written.append((path.name, mode, durable))
        real(path, data, mode=mode, durable=durable, dir_mode=dir_mode)

    monkeypatch.setattr(fileio, "write_atomic", spy)
    state = store.load()
    store.save(state)
    store.request_abort("x")
    assert written == [
        ("state.json", rollout_store.FILE_MODE, True),
        ("abort", rollout_store.FILE_MODE, True),
    ]
    RolloutStore(store.directory, durable=False).save(state)
    assert written[-1] == ("state.json", rollout_store.FILE_MODE, False)

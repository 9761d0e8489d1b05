"""On-disk state of rollouts: one directory per rollout, an audit log, an abort marker, a lock.

Layout under the state directory (``.gpuctl/`` beside cluster.yml unless configured)::

    rollouts/.lock               flock'ed by the process running a rollout; holds its pid
    rollouts/current             the id of the active (or latest) rollout
    rollouts/<id>/state.json     RolloutState, replaced atomically after every change
    rollouts/<id>/audit.jsonl    one JSON object per line, appended and fsynced line by line
    rollouts/<id>/abort          present once an abort was requested
    rollouts/<id>/gpuctl.log     what libraries logged while it ran (paramiko's transport
                                 thread, ...): the CLI routes it here, away from the terminal

A rollout id is the UTC time it was created and the component: ``20250314T101500Z-driver``.

state.json is written to a temporary file in the same directory, fsynced, renamed over the old
one with ``os.replace`` and the directory is fsynced, so after a crash it is the old or the new
file, never a mix. Audit lines carry ``ts`` (ISO-8601 UTC with microseconds), ``rollout``,
``node`` (null for the whole rollout), ``event`` and ``seq`` (the number of a line that goes with
a state change; absent on an abort request), then the event's details. A line is written before
the next state change, and state.json keeps the lines of its last change (``outbox``), so the
log is complete even after a kill between the two writes.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuctl import fileio
from gpuctl.errors import EnvironmentProblem
from gpuctl.rollout.model import (
    AuditEvent,
    Component,
    Plan,
    RolloutError,
    RolloutLocked,
    RolloutState,
)

STATE = "state.json"
AUDIT = "audit.jsonl"
ABORT = "abort"
CURRENT = "current"
LOCK = ".lock"
LIBRARY_LOG = "gpuctl.log"
FILE_MODE = 0o644


def utc_now_iso() -> str:
    """``2025-03-14T10:15:00.123456Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rollouts_root(state_dir: Path) -> Path:
    """``<state_dir>/rollouts``: one directory per rollout, the ``current`` file and the lock."""
    return state_dir / "rollouts"


def new_rollout_id(root: Path, component: Component, now: datetime | None = None) -> str:
    """A sortable id: the UTC time and the component, with a counter when the name is taken."""
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = f"{stamp}-{component}", 1
    while (root / candidate).exists():
        n += 1
        candidate = f"{stamp}-{component}-{n}"
    return candidate


class StateFileError(RolloutError, EnvironmentProblem):
    """A file of the rollout state that cannot be read: missing, not UTF-8, not JSON or not the
    shape gpuctl writes. The message names the file (the CLI exits 2)."""


# What ``current`` may name: a folder beside it (new_rollout_id: ``20250314T101500Z-driver``)
_ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def write_state_file(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` so a reader (or a crash) sees the old or the new file."""
    fileio.write_atomic(path, text, mode=FILE_MODE, durable=durable)


def read_json_file(path: Path) -> Any:
    """The JSON value of a state file gpuctl wrote; StateFileError naming it when it cannot be
    read or is not JSON."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StateFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        return fileio.decode_json(raw)
    except ValueError as exc:
        raise StateFileError(f"{path}: {exc}") from None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def audit_line_problem(line: Any) -> str | None:
    """Why ``line`` is not an audit line as the store writes it, or None."""
    if not isinstance(line, dict):
        return "not a JSON object"
    if not isinstance(line.get("event"), str):
        return "event is not a string"
    if not isinstance(line.get("ts", ""), str):
        return "ts is not a string"
    if line.get("node") is not None and not isinstance(line.get("node"), str):
        return "node is not a string or null"
    if "seq" in line and not _int(line["seq"]):
        return "seq is not a whole number"
    return None


class RolloutStore:
    """The directory of one rollout. Safe to share between the executor's threads.

    ``durable=False`` skips the fsyncs (for tests that write thousands of states); the rename
    stays atomic.
    """

    def __init__(self, directory: Path, *, durable: bool = True) -> None:
        self.directory = directory
        self.durable = durable
        self._lock = threading.Lock()

    @property
    def rollout_id(self) -> str:
        return self.directory.name

    @property
    def state_path(self) -> Path:
        return self.directory / STATE

    @property
    def audit_path(self) -> Path:
        return self.directory / AUDIT

    @property
    def abort_path(self) -> Path:
        return self.directory / ABORT

    def exists(self) -> bool:
        return self.state_path.is_file()

    def create(self, plan: Plan) -> RolloutState:
        """Write the first state.json (status ``planned``) and the ``planned`` audit line."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.exists():
            raise RolloutError(f"{self.state_path} exists already")
        state = RolloutState.new(self.rollout_id, plan, utc_now_iso())
        self.record(
            state,
            AuditEvent(
                "planned",
                details={
                    "component": str(plan.component),
                    "target": plan.target,
                    "max_unavailable": plan.max_unavailable,
                    "batches": [list(b) for b in plan.batches],
                    "problems": [p.node for p in plan.problems],
                    "policy": plan.policy.to_json(),
                },
            ),
        )
        return state

    def load(self) -> RolloutState:
        """state.json; StateFileError naming it when it cannot be read or is not a rollout
        state (with its outbox of audit lines)."""
        path = self.state_path
        try:
            data = read_json_file(path)
        except StateFileError as exc:
            raise StateFileError(f"{path}: cannot read rollout state ({exc})") from None
        if not isinstance(data, dict):
            raise StateFileError(f"{path}: not a rollout state")
        outbox = data.get("outbox", [])
        if not isinstance(outbox, list):
            raise StateFileError(f"{path}: not a rollout state (outbox is not a list)")
        for i, line in enumerate(outbox):
            why = audit_line_problem(line) or (None if _int(line.get("seq")) else "no seq")
            if why is not None:
                raise StateFileError(f"{path}: not a rollout state (outbox line {i + 1}: {why})")
        try:
            return RolloutState.from_json(data)
        except RolloutError as exc:
            raise StateFileError(f"{path}: {exc}") from None
        except RecursionError:
            raise StateFileError(f"{path}: not a rollout state (nested too deep)") from None

    def save(self, state: RolloutState) -> None:
        """Replace state.json atomically (stamps ``state.updated``)."""
        with self._lock:
            state.updated = utc_now_iso()
            text = json.dumps(state.to_json(), indent=2) + "\n"
            write_state_file(self.state_path, text, durable=self.durable)

    def _line(self, event: AuditEvent, seq: int | None) -> dict[str, Any]:
        line: dict[str, Any] = {
            "ts": utc_now_iso(),
            "rollout": self.rollout_id,
            "node": event.node,
            "event": event.event,
        }
        if seq is not None:
            line["seq"] = seq
        for key, value in event.details.items():
            line.setdefault(key, value)
        return line

    def append_line(self, line: dict[str, Any]) -> None:
        """Append one line to audit.jsonl in one write, then fsync it."""
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.audit_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            try:
                os.write(fd, data)
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def append(self, *events: AuditEvent) -> None:
        """Append events that change no state (an abort request): no ``seq``."""
        for event in events:
            self.append_line(self._line(event, None))

    def record(self, state: RolloutState, *events: AuditEvent) -> None:
        """Save ``state`` with ``events`` numbered in its outbox, then append them.

        state.json is the truth a resume starts from; the outbox makes sure the audit log
        catches up with it even when the process dies between the two writes."""
        lines = [self._line(e, state.audit_seq + i) for i, e in enumerate(events, 1)]
        state.audit_seq += len(lines)
        state.outbox = lines
        self.save(state)
        for line in lines:
            self.append_line(line)

    def complete_audit(self, state: RolloutState) -> int:
        """Append the outbox lines audit.jsonl lacks (after a crash); how many were appended.

        A torn last line (the process died inside a write) is cut off first; if it was a
        recorded event, the outbox holds it whole."""
        with self._lock:
            try:
                raw = self.audit_path.read_bytes()
            except FileNotFoundError:
                raw = b""
            except OSError as exc:
                raise StateFileError(
                    f"{self.audit_path}: cannot be read ({exc.strerror or exc})"
                ) from None
            if raw and not raw.endswith(b"\n"):
                keep = raw.rfind(b"\n") + 1
                with self.audit_path.open("r+b") as fh:
                    fh.truncate(keep)
                raw = raw[:keep]
        last = 0
        for line in self._parse_audit(raw):
            seq = line.get("seq")
            if isinstance(seq, int):
                last = max(last, seq)
        missing = [line for line in state.outbox if int(line.get("seq", 0)) > last]
        for line in missing:
            self.append_line(line)
        return len(missing)

    def _parse_audit(self, raw: bytes) -> list[dict[str, Any]]:
        """The lines of audit.jsonl; a torn last line (no newline: a crash mid-write, maybe
        inside a character) is left out, any other line that is not an audit line is a
        StateFileError naming the file and the line."""
        out: list[dict[str, Any]] = []
        lines = raw.split(b"\n")
        torn = lines.pop()  # b"" after the last newline, else the torn last line
        if torn:
            lines.append(torn)
        for i, data in enumerate(lines):
            last = bool(torn) and i == len(lines) - 1
            where = f"{self.audit_path}:{i + 1}"
            try:
                obj = json.loads(data.decode("utf-8"))
            except UnicodeDecodeError:
                if last:
                    break
                raise StateFileError(f"{where}: not UTF-8") from None
            except RecursionError:
                raise StateFileError(f"{where}: not JSON (nested too deep)") from None
            except ValueError:
                if last:
                    break
                raise StateFileError(f"{where}: not JSON") from None
            why = audit_line_problem(obj)
            if why is not None:
                raise StateFileError(f"{where}: not an audit line ({why})")
            out.append(obj)
        return out

    def read_audit(self) -> list[dict[str, Any]]:
        """The audit lines, parsed; a torn last line (a crash mid-write) is ignored."""
        try:
            raw = self.audit_path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateFileError(
                f"{self.audit_path}: cannot be read ({exc.strerror or exc})"
            ) from None
        return self._parse_audit(raw)

    def request_abort(self, reason: str = "") -> None:
        """Ask a running executor (in this or another process) to start no new node."""
        text = json.dumps({"ts": utc_now_iso(), "reason": reason}) + "\n"
        write_state_file(self.abort_path, text)
        self.append(AuditEvent("abort-requested", details={"reason": reason}))

    def abort_requested(self) -> bool:
        return self.abort_path.exists()

    def clear_abort(self) -> None:
        """Withdraw an abort request, so that the rollout can be continued."""
        if self.abort_requested():
            self.abort_path.unlink()
            self.append(AuditEvent("abort-cleared"))


def runner_pid(audit: list[dict[str, Any]]) -> int | None:
    """The process that last ran the rollout: the pid of the last ``started`` audit line (the
    executor writes its own), or None when it never started or the line has none."""
    for line in reversed(audit):
        if line.get("event") == "started":
            pid = line.get("pid")
            return pid if _int(pid) and pid > 0 else None
    return None


def interrupted_note(audit: list[dict[str, Any]]) -> str:
    """``interrupted (pid N gone)``: how a rollout whose state says ``running`` while no process
    holds the lock is shown (its process was killed: ``kill -9``, a crash, a reboot of this
    host), as `gpuctl provision` shows a killed run. The caller has found the lock free."""
    pid = runner_pid(audit)
    if pid is None:
        return "interrupted (its process is gone)"
    if fileio.process_alive(pid):  # the pid was reused, or the process let go of the lock and hangs
        return f"interrupted (pid {pid} no longer holds the lock)"
    return f"interrupted (pid {pid} gone)"


def new_rollout(state_dir: Path, plan: Plan, now: datetime | None = None) -> RolloutStore:
    """Create ``rollouts/<id>/`` for ``plan``, write its first state and point ``current`` at it.

    The caller holds :func:`cluster_lock`."""
    root = rollouts_root(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    store = RolloutStore(root / new_rollout_id(root, plan.component, now))
    store.create(plan)
    write_state_file(root / CURRENT, store.rollout_id + "\n")
    return store


def current_rollout(state_dir: Path) -> RolloutStore | None:
    """The rollout ``current`` names, or None when there is none."""
    root = rollouts_root(state_dir)
    path = root / CURRENT
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise StateFileError(f"{path}: not UTF-8") from None
    if not _ROLLOUT_ID.fullmatch(name):
        raise StateFileError(f"{path} names {name[:80]!r}, which is not a rollout id")
    store = RolloutStore(root / name)
    if not store.exists():
        raise StateFileError(f"{path} names {name!r}, which is not a rollout")
    return store


def _read_pid(fd: int) -> int | None:
    try:
        raw = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


@contextmanager
def cluster_lock(state_dir: Path) -> Iterator[Path]:
    """Hold ``rollouts/.lock`` (flock, exclusive, non-blocking) for the ``with`` block.

    Only one process runs or changes a cluster's rollouts at a time; a second one gets
    :class:`RolloutLocked` naming the holder's pid at once rather than waiting. The lock goes
    with the process (a killed holder releases it).
    """
    root = rollouts_root(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RolloutLocked(str(path), _read_pid(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)

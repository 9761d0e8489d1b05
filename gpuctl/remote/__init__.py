"""The one way gpuctl reaches a node: run a command there (bounded), start one, copy a file.

Every caller (`gpuctl validate`'s collector, its ``--drain-failed``, `gpuctl rollout`,
`gpuctl node-check`) goes through this contract, over SSH (:mod:`gpuctl.remote.ssh`) or on this
machine (:mod:`gpuctl.remote.local`); the unit tests hand in fakes of :class:`Link`.

One timeout rule: a command gets ``timeout -k KILL_AFTER_S T`` on the node itself (so a command
that outlives its budget is ended there, not left running), the channel is given up
``KILL_AFTER_S + GRACE_S`` seconds later, and exit status 124 (coreutils ``timeout``) means
timed out. Locally, :func:`gpuctl.remote.local.run_local` does the same with signals. A timeout
is the ``timed_out`` field of :class:`ExecResult`, never a fake exit status.

A connection that dies (the node lost power, its sshd went away) is a third outcome, ``lost``:
the transport notices it at once (a closed channel with a dead transport, or no answer to its
keepalives within a few seconds, see :mod:`gpuctl.remote.ssh`), so callers never wait for a
command's timeout on a node that is gone (:meth:`LinkSession.lost`,
:meth:`Started.finish_unless`).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

TIMEOUT_RC = 124  # coreutils `timeout`: the command ran out of time
CANNOT_RUN_RC = 126  # the shell: found but not executable
NOT_FOUND_RC = 127  # the shell: command not found
# The node-side `timeout` sends SIGKILL this long after SIGTERM.
KILL_AFTER_S = 10
# Extra seconds past a command's own timeout (and KILL_AFTER_S) before its channel is given up:
# the node-side `timeout` ends the command first and reports it (exit 124).
GRACE_S = 15


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    address: str  # what to connect to: the management address, else the node name


@dataclass(frozen=True, slots=True)
class ExecResult:
    """How one command ended: its output, or why there is none."""

    stdout: bytes = b""
    stderr: bytes = b""
    rc: int | None = None
    timed_out: bool = False
    error: str | None = None  # could not run, connection lost, output cut off, ...
    seconds: float = 0.0
    lost: bool = False  # the connection to the node died (the node is gone, not the command)


class Unreachable(Exception):
    """The node cannot be reached; ``reason`` is what the report says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Runner = Callable[[Sequence[str], float], ExecResult]
"""Runs ``argv`` bounded by ``timeout_s`` seconds: :meth:`Session.run` (or a fake in tests)."""


class Running(Protocol):
    """A command started on a node."""

    def wait_for(self, text: str, timeout: float) -> bool:
        """Until ``text`` shows in its stdout (True), it ends or ``timeout`` passes (False)."""
        ...

    def finish(self, timeout: float) -> ExecResult:
        """Wait up to ``timeout`` seconds for it to end; a command still running then is
        abandoned (its channel closed) and reported timed out."""
        ...


class Link(Protocol):
    """One open connection as a transport gives it: start a shell line, close. A transport
    that can tell a dead connection also has ``lost() -> str | None`` (why, or None while it
    is alive) and its :class:`Running` ``done() -> bool``; both are optional."""

    def start(self, command: str) -> Running: ...

    def close(self) -> None: ...


@runtime_checkable
class FileLink(Link, Protocol):
    """A link that can also copy a file to the node (SSH: over SFTP)."""

    def put(self, data: bytes, remote: str) -> str: ...


class Connector(Protocol):
    def connect(self, target: Target) -> Link:
        """A connected link; raises :class:`Unreachable`."""
        ...

    def close(self) -> None: ...


class Session(Protocol):
    """One node, as every caller uses it: run a command (the timeout rule applied), copy a
    file, close. :class:`LinkSession` (over SSH) and :class:`gpuctl.remote.local.LocalSession`."""

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult: ...

    def put(self, data: bytes, remote: str) -> str: ...

    def close(self) -> None: ...


def command_line(argv: Sequence[str], timeout_s: float | None, *, become: bool) -> str:
    """The shell line for ``argv``: each word quoted, under the node's own `timeout` (so a
    command that outlives its budget is ended on the node, not left running), with sudo when
    the login user is not root."""
    words = list(argv)
    if timeout_s is not None:
        words = ["timeout", "-k", str(KILL_AFTER_S), str(int(timeout_s)), *words]
    if become:
        words = ["sudo", "-n", "--", *words]
    return shlex.join(words)


def ended(result: ExecResult) -> ExecResult:
    """``result`` with exit 124 of the node-side `timeout` read as timed out."""
    if result.rc == TIMEOUT_RC and result.error is None and not result.timed_out:
        return dataclasses.replace(result, timed_out=True)
    return result


# How often a command is checked while its peer on another node might be lost.
WATCH_SLICE_S = 0.25
_NEVER = "\x00gpuctl: never printed\x00"


class Started:
    """A command started under the timeout rule (an ib_write_bw server that must be up before
    its client starts)."""

    def __init__(self, running: Running, timeout_s: float) -> None:
        self.running = running
        self.timeout_s = timeout_s
        self.started = time.monotonic()

    def wait_for(self, text: str, timeout: float) -> bool:
        return self.running.wait_for(text, timeout)

    def finish(self, wait_s: float | None = None) -> ExecResult:
        """Its result; the channel is given up after ``wait_s`` (default: its timeout plus
        KILL_AFTER_S and GRACE_S). ``seconds`` is how long it ran, also when it timed out, was
        lost or could not be read (a transport that does not say is timed here)."""
        if wait_s is None:
            wait_s = self.timeout_s + KILL_AFTER_S + GRACE_S
        result = ended(self.running.finish(wait_s))
        if result.seconds <= 0.0:
            result = dataclasses.replace(result, seconds=time.monotonic() - self.started)
        return result

    def finish_unless(
        self, gone: Callable[[], str | None], wait_s: float | None = None
    ) -> ExecResult | None:
        """:meth:`finish`, unless ``gone`` (the other node of a pair: why it is lost, or None)
        says before it ends that waiting is pointless: then None, and the command is abandoned
        (its channel closed; the node-side `timeout` ends it). A transport whose commands
        cannot say they are done (no ``done()``) is checked once, before a plain finish."""
        if wait_s is None:
            wait_s = self.timeout_s + KILL_AFTER_S + GRACE_S
        done = getattr(self.running, "done", None)
        deadline = time.monotonic() + wait_s
        while callable(done) and not done():
            if gone() is not None:
                self.abandon()
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.running.wait_for(_NEVER, min(WATCH_SLICE_S, remaining))
        if not callable(done) and gone() is not None:
            self.abandon()
            return None
        return self.finish(max(0.0, deadline - time.monotonic()))

    def abandon(self) -> ExecResult:
        """Stop waiting at once: the channel is closed (the node-side `timeout` ends the
        command); what it printed so far, timed out."""
        return self.finish(0.0)


class LinkSession:
    """:class:`Session` over a transport's :class:`Link`: commands under the node-side
    `timeout`, with sudo when ``become``."""

    def __init__(self, link: Link, *, become: bool = False) -> None:
        self.link = link
        self.become = become

    def start(self, command: str) -> Running:
        """A raw shell line (:func:`command_line` builds them), no timeout rule applied."""
        return self.link.start(command)

    def spawn(self, argv: Sequence[str], timeout_s: float) -> Started:
        return Started(self.start(command_line(argv, timeout_s, become=self.become)), timeout_s)

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        return self.spawn(argv, timeout_s).finish()

    def put(self, data: bytes, remote: str) -> str:
        """Write ``data`` to ``remote`` (relative to the login's home, or absolute), mode 0600;
        the absolute path written. Raises OSError when it cannot."""
        if not isinstance(self.link, FileLink):
            raise OSError("this connection cannot copy files")
        return self.link.put(data, remote)

    def lost(self) -> str | None:
        """Why the connection is dead (the node is gone), or None while it is alive (or the
        transport cannot tell)."""
        probe = getattr(self.link, "lost", None)
        if not callable(probe):
            return None
        try:
            why = probe()
        except Exception as exc:  # a transport that cannot even say: treat as lost
            return f"connection state unknown: {exc or type(exc).__name__}"
        return why if isinstance(why, str) and why else None

    def close(self) -> None:
        self.link.close()


def connect(connector: Connector, target: Target, *, become: bool = False) -> LinkSession:
    """A session to ``target``; raises :class:`Unreachable`."""
    return LinkSession(connector.connect(target), become=become)

"""`gpuctl validate`: run the probes on every node over SSH, write a bundle, judge it.

One SSH connection per node (paramiko, host keys checked against cluster.yml's
``ssh.known_hosts`` and nothing else, unknown keys rejected), a bounded pool of worker threads
across nodes, every probe with its timeout. What each probe gave is written into a bundle
directory (:mod:`gpuctl.validation.suite` describes the format) that the validation core then
judges; the bundle can be judged again later without SSH (:func:`judge_bundle`).

A node that cannot be reached (refused, timed out, authentication failed, host key unknown or
different) is a failed node with the reason, never skipped. A probe that timed out is recorded
as timed out, one that could not be started with its error, and every exit status is kept: the
judges turn each of them into UNKNOWN or FAIL, never OK.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ClusterShell.NodeSet import NodeSet, NodeSetParseError

from gpuctl import __version__
from gpuctl.config import load_cluster
from gpuctl.config.derived import nodes as cluster_nodes
from gpuctl.config.derived import split_top_level
from gpuctl.config.model import Cluster, Level
from gpuctl.errors import EnvironmentProblem, UsageError
from gpuctl.fileio import write_atomic as write_atomic  # the bundle writer, asserted by tests
from gpuctl.validation import multinode
from gpuctl.validation import pairs as pairing
from gpuctl.validation.expect import NodeExpectation, expectations
from gpuctl.validation.judges import ProbeOutput, judge_ib_write_bw
from gpuctl.validation.probes import (
    GRACE_S,
    IB_WRITE_BW_BASE_PORT,
    IB_WRITE_BW_SERVER_START_S,
    IB_WRITE_BW_TIMEOUT_S,
    KILL_AFTER_S,
    LEVELS,
    SERVER_READY,
    Probe,
    ib_write_bw_client,
    ib_write_bw_server,
    perftest_kind,
    probes_for,
    wants_ib_write_bw,
)
from gpuctl.validation.results import CheckResult, NodeReport, ValidationReport, Verdict
from gpuctl.validation.suite import (
    MISSING,
    BundleFileError,
    collection_time,
    judge_directory,
    not_judged,
    read_bundle_json,
    read_node_meta,
    short,
)

T = TypeVar("T")
R = TypeVar("R")

DEFAULT_PARALLEL = 64
RETEST_PASSES = 2  # rounds of retests of ib_write_bw suspects
# Light probes of one node run at once on this many SSH channels of its connection (sshd's
# MaxSessions is 10 by default).
CHANNELS_PER_NODE = 3
MAX_OUTPUT_BYTES = 64 * 1024 * 1024  # per stream; a runaway command is cut off here
STDERR_TAIL = 2000  # characters of stderr kept in meta.json
BUNDLE_FILE = "bundle.json"
RESULTS_FILE = "results.json"
_TIMEOUT_RC = 124  # coreutils `timeout`: the command ran out of time
_NOT_FOUND_RC = 127
_CANNOT_RUN_RC = 126


# ------------------------------------------------------------------------------------------
# Transport: what the collector needs from SSH (paramiko here, a fake in the unit tests)


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


class Unreachable(Exception):
    """The node cannot be reached; ``reason`` is what the report says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Running(Protocol):
    """A command started on a node."""

    def wait_for(self, text: str, timeout: float) -> bool:
        """Until ``text`` shows in its stdout (True), it ends or ``timeout`` passes (False)."""
        ...

    def finish(self, timeout: float) -> ExecResult:
        """Wait up to ``timeout`` seconds for it to end; a command still running then is
        abandoned (its channel closed) and reported timed out."""
        ...


class Session(Protocol):
    """One connection to one node."""

    def start(self, command: str) -> Running: ...

    def close(self) -> None: ...


class Connector(Protocol):
    def connect(self, target: Target) -> Session:
        """A connected session; raises :class:`Unreachable`."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SshSettings:
    user: str
    port: int
    connect_timeout_s: float
    known_hosts: Path
    private_key: Path | None
    become: bool
    jump_host: str | None = None
    jump_user: str | None = None
    jump_port: int = 22


def _resolve(cluster_path: Path, configured: str) -> Path:
    path = Path(os.path.expanduser(configured))
    return path if path.is_absolute() else cluster_path.resolve().parent / path


def ssh_settings(cluster: Cluster, cluster_path: Path) -> SshSettings:
    """cluster.yml's ssh section with paths resolved (relative to the folder of cluster.yml)."""
    ssh = cluster.ssh
    known = _resolve(cluster_path, ssh.known_hosts)
    if not known.is_file() or known.stat().st_size == 0:
        raise EnvironmentProblem(
            f"ssh.known_hosts: {known} is missing or empty; gpuctl checks every node's host key "
            "against it (collect the keys, e.g. with ssh-keyscan, and verify their fingerprints)"
        )
    key = _resolve(cluster_path, ssh.private_key) if ssh.private_key else None
    if key is not None and not key.is_file():
        raise EnvironmentProblem(f"ssh.private_key: {key} does not exist")
    jump = ssh.jump_host
    return SshSettings(
        user=ssh.user,
        port=ssh.port,
        connect_timeout_s=float(ssh.connect_timeout_s),
        known_hosts=known,
        private_key=key,
        become=ssh.become and ssh.user != "root",
        jump_host=jump.host if jump else None,
        jump_user=(jump.user or ssh.user) if jump else None,
        jump_port=jump.port if jump else 22,
    )


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


class ParamikoConnector:
    """SSH with paramiko: host keys from ``settings.known_hosts`` only (RejectPolicy)."""

    def __init__(self, settings: SshSettings) -> None:
        import paramiko  # type: ignore[import-untyped]

        self._paramiko = paramiko
        self.settings = settings
        try:
            self._known = paramiko.HostKeys(str(settings.known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise EnvironmentProblem(
                f"ssh.known_hosts: cannot read {settings.known_hosts}: {exc}"
            ) from None
        self._pkey: Any = None
        if settings.private_key is not None:
            try:
                self._pkey = paramiko.PKey.from_path(str(settings.private_key))
            except paramiko.PasswordRequiredException:
                raise EnvironmentProblem(
                    f"ssh.private_key: {settings.private_key} is encrypted; gpuctl does not "
                    "ask for passphrases: load it into ssh-agent and set ssh.private_key: null"
                ) from None
            except (OSError, ValueError, paramiko.SSHException) as exc:
                raise EnvironmentProblem(
                    f"ssh.private_key: cannot load {settings.private_key}: {exc}"
                ) from None
        self._jump: Any = None
        self._jump_lock = threading.Lock()

    def _client(self, host: str, port: int) -> Any:
        client = self._paramiko.SSHClient()
        client.set_missing_host_key_policy(self._paramiko.RejectPolicy())
        name = host if port == 22 else f"[{host}]:{port}"
        known = self._known.lookup(name)
        if known is not None:
            keys = client.get_host_keys()
            for keytype, key in known.items():
                keys.add(name, keytype, key)
        return client

    def _open(self, host: str, port: int, user: str, sock: Any = None) -> Any:
        s = self.settings
        client = self._client(host, port)
        p = self._paramiko
        try:
            client.connect(
                hostname=host,
                port=port,
                username=user,
                pkey=self._pkey,
                timeout=s.connect_timeout_s,
                banner_timeout=s.connect_timeout_s,
                auth_timeout=s.connect_timeout_s,
                channel_timeout=s.connect_timeout_s,
                allow_agent=self._pkey is None,
                look_for_keys=self._pkey is None,
                sock=sock,
            )
        except p.BadHostKeyException:
            client.close()
            raise Unreachable(
                f"ssh: the host key of {host} differs from the one in {s.known_hosts} "
                "(refused: the node was reinstalled, or someone is in between)"
            ) from None
        except p.AuthenticationException:
            client.close()
            raise Unreachable(f"ssh: authentication failed for {user}@{host}") from None
        except p.SSHException as exc:
            client.close()
            text = str(exc)
            if "not found in known_hosts" in text:
                raise Unreachable(
                    f"ssh: the host key of {host} is not in {s.known_hosts} (refused)"
                ) from None
            raise Unreachable(f"ssh: {text or type(exc).__name__}") from None
        except TimeoutError:
            client.close()
            raise Unreachable(
                f"ssh: connect to {host}:{port} timed out after {s.connect_timeout_s:g} s"
            ) from None
        except ConnectionRefusedError:
            client.close()
            raise Unreachable(f"ssh: connection to {host}:{port} refused") from None
        except socket.gaierror as exc:
            client.close()
            raise Unreachable(f"ssh: cannot resolve {host}: {exc.strerror}") from None
        except (OSError, EOFError) as exc:
            client.close()
            causes = list(getattr(exc, "errors", {}).values())  # paramiko: one per address
            if causes and all(isinstance(c, ConnectionRefusedError) for c in causes):
                raise Unreachable(f"ssh: connection to {host}:{port} refused") from None
            why = "; ".join(c.strerror or str(c) for c in causes) if causes else None
            why = why or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unreachable(f"ssh: {host}:{port}: {why}") from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(30)
        return client

    def _jump_transport(self) -> Any:
        s = self.settings
        assert s.jump_host is not None  # noqa: S101 - only called with a jump host
        with self._jump_lock:
            if self._jump is None or not self._jump.get_transport().is_active():
                try:
                    self._jump = self._open(s.jump_host, s.jump_port, s.jump_user or s.user)
                except Unreachable as exc:
                    raise Unreachable(f"jump host {s.jump_host}: {exc.reason}") from None
            return self._jump.get_transport()

    def connect(self, target: Target) -> Session:
        s = self.settings
        sock = None
        if s.jump_host is not None:
            try:
                sock = self._jump_transport().open_channel(
                    "direct-tcpip",
                    (target.address, s.port),
                    ("127.0.0.1", 0),
                    timeout=s.connect_timeout_s,
                )
            except Unreachable:
                raise
            except (self._paramiko.SSHException, OSError, EOFError) as exc:
                raise Unreachable(
                    f"ssh: through {s.jump_host} to {target.address}:{s.port}: {exc}"
                ) from None
        return _ParamikoSession(self._open(target.address, s.port, s.user, sock=sock))

    def close(self) -> None:
        with self._jump_lock:
            if self._jump is not None:
                self._jump.close()
                self._jump = None


class _ParamikoSession:
    def __init__(self, client: Any) -> None:
        self.client = client

    def start(self, command: str) -> Running:
        started = time.monotonic()
        try:
            transport = self.client.get_transport()
            if transport is None or not transport.is_active():
                return _Failed("ssh: the connection is closed")
            chan = transport.open_session(timeout=30)
            chan.exec_command(command)
            chan.shutdown_write()  # nothing on stdin: a command that reads it gets EOF
        except Exception as exc:  # paramiko raises many kinds: all mean "could not run"
            return _Failed(f"ssh: could not start the command: {exc or type(exc).__name__}")
        return _ParamikoRunning(chan, started)

    def put(self, data: bytes, remote: str) -> str:
        """Write ``data`` to ``remote`` (a path relative to the login's home, or absolute)
        over SFTP on this connection, mode 0600; the absolute path written. Raises OSError
        when it cannot."""
        try:
            sftp = self.client.open_sftp()
        except Exception as exc:  # paramiko: SSHException and friends
            raise OSError(f"sftp: {exc or type(exc).__name__}") from None
        try:
            with sftp.file(remote, "wb") as fh:
                fh.set_pipelined(True)
                fh.write(data)
            sftp.chmod(remote, 0o600)
            return str(sftp.normalize(remote))
        finally:
            sftp.close()

    def close(self) -> None:
        self.client.close()


class _Failed:
    """A command that could not be started."""

    def __init__(self, error: str) -> None:
        self.error = error

    def wait_for(self, text: str, timeout: float) -> bool:
        return False

    def finish(self, timeout: float) -> ExecResult:
        return ExecResult(error=self.error)


class _ParamikoRunning:
    _SLICE = 0.5

    def __init__(self, chan: Any, started: float) -> None:
        self.chan = chan
        self.started = started
        self.out = bytearray()
        self.err = bytearray()
        self.eof = False
        self.error: str | None = None

    def _drain_stderr(self) -> None:
        while self.chan.recv_stderr_ready():
            data = self.chan.recv_stderr(65536)
            if not data:
                break
            if len(self.err) < MAX_OUTPUT_BYTES:
                self.err += data

    def _pump(self, deadline: float, until: bytes | None = None) -> bool:
        """Read until ``until`` shows in stdout (True), the command ended or the deadline."""
        while True:
            if until is not None and until in self.out:
                return True
            self._drain_stderr()
            if self.eof and self.chan.exit_status_ready():
                self._drain_stderr()
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.eof:
                self.chan.status_event.wait(min(remaining, self._SLICE))
                continue
            self.chan.settimeout(min(remaining, self._SLICE))
            try:
                data = self.chan.recv(65536)
            except TimeoutError:
                continue
            except (OSError, EOFError) as exc:
                self.error = f"ssh: connection lost: {exc or type(exc).__name__}"
                return False
            if not data:
                self.eof = True
                continue
            self.out += data
            if len(self.out) > MAX_OUTPUT_BYTES:
                self.error = f"output larger than {MAX_OUTPUT_BYTES // (1024 * 1024)} MiB, cut"
                return False

    def wait_for(self, text: str, timeout: float) -> bool:
        return self._pump(time.monotonic() + timeout, text.encode())

    def finish(self, timeout: float) -> ExecResult:
        self._pump(time.monotonic() + timeout)
        seconds = time.monotonic() - self.started
        if self.error is None and not (self.eof and self.chan.exit_status_ready()):
            if self.chan.closed or not self.chan.get_transport().is_active():
                self.error = "ssh: the connection was lost while the command ran"
            else:
                self.chan.close()  # the node-side `timeout` ends the command itself
                return ExecResult(
                    bytes(self.out), bytes(self.err), None, timed_out=True, seconds=seconds
                )
        if self.error is not None:
            self.chan.close()
            return ExecResult(bytes(self.out), bytes(self.err), None, error=self.error)
        status = self.chan.recv_exit_status()
        self.chan.close()
        rc: int | None = status if status >= 0 else None
        error = None if rc is not None else "ended without an exit status (killed by a signal?)"
        return ExecResult(bytes(self.out), bytes(self.err), rc, error=error, seconds=seconds)


# ------------------------------------------------------------------------------------------
# The bundle directory


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _tail(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")[-STDERR_TAIL:]


def _said(stderr: bytes, limit: int = 200) -> str:
    """What a tool said on stderr, on one line."""
    lines = [ln.strip() for ln in _tail(stderr).splitlines() if ln.strip()]
    return "; ".join(lines)[-limit:]


def probe_meta(result: ExecResult, argv: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """What meta.json says about one probe (suite.py reads rc, timed_out and error)."""
    error = result.error
    if error is None and result.timed_out:
        error = f"timed out after {timeout_s:g} s"
    if error is None and result.rc == _NOT_FOUND_RC:
        error = f"{argv[0]}: command not found (exit 127)"
    elif error is None and result.rc == _CANNOT_RUN_RC:
        error = f"{argv[0]}: cannot be run (exit 126)"
    elif error is None and result.rc not in (0, None) and not result.stdout.strip():
        # nothing to judge: say why, from what the tool said on stderr
        said = _said(result.stderr)
        error = f"{argv[0]} exited with {result.rc} and printed nothing" + (
            f": {said}" if said else ""
        )
    return {
        "rc": result.rc,
        "timed_out": result.timed_out,
        "error": error,
        "command": shlex.join(argv),
        "timeout_s": timeout_s,
        "seconds": round(result.seconds, 3),
        "stderr": _tail(result.stderr),
    }


@dataclass
class _NodeState:
    target: Target
    folder: Path
    session: Session | None = None  # open from the node's probes until it is no longer needed
    reached: bool = False  # phase 1 connected to it
    unreachable: str | None = None
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self, kind: str, result: ExecResult, argv: Sequence[str], timeout_s: float, **extra: Any
    ) -> None:
        """Store one probe's output (``<kind>.txt``, atomically) and its outcome."""
        if result.stdout or result.error is None:
            write_atomic(self.folder / f"{kind}.txt", result.stdout)
        else:
            with contextlib.suppress(FileNotFoundError):
                (self.folder / f"{kind}.txt").unlink()
        with self.lock:
            self.probes[kind] = {**probe_meta(result, argv, timeout_s), **extra}

    def write_meta(self) -> None:
        with self.lock:
            if self.unreachable is not None:
                meta: dict[str, Any] = {"unreachable": self.unreachable}
            else:
                meta = {"probes": dict(sorted(self.probes.items()))}
        write_atomic(self.folder / "meta.json", _json_bytes(meta))


# ------------------------------------------------------------------------------------------
# Collecting


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    kind: str  # "node" (a node's probes are done), "pair" (an ib_write_bw pair is done),
    # "multinode" (a multi-node run of node group ``node`` is done)
    node: str = ""
    status: str = ""  # node: "ok" | "unreachable"; pair: "ok" | "failed"
    done: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class PairRun:
    """One ib_write_bw pair: every HCA from ``client`` to ``server``."""

    fabric: str
    server: str
    client: str
    passed: bool
    retest: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "fabric": self.fabric,
            "server": self.server,
            "client": self.client,
            "passed": self.passed,
            "retest": self.retest,
        }


@dataclass(frozen=True, slots=True)
class CollectResult:
    bundle: Path
    unreachable: dict[str, str]
    pairs: tuple[PairRun, ...]
    collected_at: str
    seconds: float


@dataclass(frozen=True, slots=True)
class MultinodePlan:
    """Where and how phase 3 starts the multi-node runs (level long)."""

    controller: Target
    options: multinode.SrunOptions = field(default_factory=multinode.SrunOptions)


def multinode_plan(cluster: Cluster) -> MultinodePlan:
    """srun runs on ``validation.multinode.launch_node`` (default ``slurm.controller``) with
    cluster.yml's ``validation.multinode``."""
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    mn = cluster.validation.multinode
    name = mn.launch_node or cluster.slurm.controller
    return MultinodePlan(
        Target(name, address.get(name, name)),
        multinode.SrunOptions(mn.mpi, mn.partition, mn.reservation, mn.max_runs, mn.rank_per),
    )


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Collector:
    """Runs the probes of each node's level on every target and writes the bundle."""

    def __init__(
        self,
        connector: Connector,
        exps: Mapping[str, NodeExpectation],
        *,
        level: str | None = None,
        parallel: int = DEFAULT_PARALLEL,
        channels: int = CHANNELS_PER_NODE,
        become: bool = False,
        pair_rounds: int | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        multinode: MultinodePlan | None = None,
    ) -> None:
        if parallel < 1:
            raise UsageError("--parallel must be 1 or more")
        self.connector = connector
        self.exps = exps
        self.level = level
        self.parallel = parallel
        self.channels = max(1, channels)
        self.become = become
        self.pair_rounds = pair_rounds
        self.multinode = multinode
        self.on_progress = on_progress or (lambda _e: None)
        self._done = 0
        self._count_lock = threading.Lock()
        self._pair_nodes: set[str] = set()
        self._keep_open = True
        self._cancel = threading.Event()

    def _parallel(self, fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
        """``fn`` over ``items`` on ``workers`` threads. Ctrl-C (or any error) stops handing
        out work: what runs is abandoned (its sessions are closed by the caller), nothing new
        starts."""
        if not items:
            return []
        pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))))
        try:
            results = list(pool.map(fn, items))
        except BaseException:
            self._cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results

    # -- one command --------------------------------------------------------------------

    def _run(self, session: Session, argv: Sequence[str], timeout_s: float) -> ExecResult:
        running = session.start(command_line(argv, timeout_s, become=self.become))
        result = running.finish(timeout_s + KILL_AFTER_S + GRACE_S)
        if result.rc == _TIMEOUT_RC and result.error is None:
            return ExecResult(
                result.stdout, result.stderr, result.rc, timed_out=True, seconds=result.seconds
            )
        return result

    def _probe(self, state: _NodeState, probe: Probe) -> None:
        if self._cancel.is_set() or state.session is None:
            return  # stopped: meta.json keeps saying "not finished"
        exp = self.exps[state.target.node]
        argv = probe.command(exp)
        try:
            result = self._run(state.session, argv, probe.timeout_s)
        except Exception as exc:  # a transport bug must not lose the node
            result = ExecResult(error=f"could not run: {exc or type(exc).__name__}")
        state.record(probe.kind, result, argv, probe.timeout_s)

    # -- phase 1: every node's own probes -------------------------------------------------

    def _node(self, state: _NodeState, total: int) -> None:
        exp = self.exps[state.target.node]
        plan = probes_for(exp, self.level)
        state.folder.mkdir(parents=True, exist_ok=True)
        # until the probes are done, meta.json says they are not: a bundle left by a collector
        # that was stopped is judged UNKNOWN for what it lacks, never from half its outputs
        with state.lock:
            state.probes = {
                p.kind: {
                    "rc": None,
                    "timed_out": False,
                    "error": "not finished (the collection was stopped)",
                    "command": shlex.join(p.command(exp)),
                }
                for p in plan
            }
        state.write_meta()
        if self._cancel.is_set():
            return
        try:
            state.session = self.connector.connect(state.target)
        except Unreachable as exc:
            state.unreachable = exc.reason
        except Exception as exc:  # never lose a node to an unexpected error
            state.unreachable = f"ssh: {exc or type(exc).__name__}"
        if state.session is not None:
            state.reached = True
            light = [p for p in plan if not p.exclusive]
            heavy = [p for p in plan if p.exclusive]
            self._parallel(lambda p: self._probe(state, p), light, self.channels)
            for p in heavy:
                self._probe(state, p)
            if not (self._keep_open and state.target.node in self._pair_nodes):
                self._close(state)
        state.write_meta()
        with self._count_lock:
            self._done += 1
            done = self._done
        self.on_progress(
            ProgressEvent(
                "node",
                state.target.node,
                "unreachable" if state.unreachable else "ok",
                done,
                total,
            )
        )

    # -- phase 2: ib_write_bw between nodes -----------------------------------------------

    def _hcas(self, node: str, fabric: str) -> list[str]:
        return [n.device for n in self.exps[node].nics if n.fabric == fabric]

    @staticmethod
    def _close(state: _NodeState) -> None:
        if state.session is not None:
            with contextlib.suppress(Exception):
                state.session.close()
            state.session = None

    @contextlib.contextmanager
    def _borrow(self, state: _NodeState) -> Iterator[Session]:
        """The node's open session, or a new connection for the time of one pair (when more
        nodes take part in ib_write_bw than --parallel, sessions are not kept between)."""
        if state.session is not None:
            yield state.session
            return
        session = self.connector.connect(state.target)
        try:
            yield session
        finally:
            with contextlib.suppress(Exception):
                session.close()

    def _pair(
        self,
        states: Mapping[str, _NodeState],
        fabric: str,
        server: str,
        client: str,
        retest: bool,
        record_server: bool = True,
    ) -> PairRun:
        srv, cli = states[server], states[client]
        try:
            with self._borrow(srv) as s_session, self._borrow(cli) as c_session:
                ok = self._pair_hcas(srv, cli, s_session, c_session, fabric, retest, record_server)
        except Unreachable as exc:
            for st, other in ((srv, cli), (cli, srv)):
                if st is srv and not record_server:
                    continue
                for hca in self._hcas(st.target.node, fabric):
                    st.record(
                        perftest_kind(hca),
                        ExecResult(
                            error=f"not measured: reconnecting for ib_write_bw with "
                            f"{other.target.node}: {exc.reason}"
                        ),
                        ("ib_write_bw",),
                        IB_WRITE_BW_TIMEOUT_S,
                    )
            ok = False
        return PairRun(fabric, server, client, ok, retest)

    def _pair_hcas(
        self,
        srv: _NodeState,
        cli: _NodeState,
        s_session: Session,
        c_session: Session,
        fabric: str,
        retest: bool,
        record_server: bool,
    ) -> bool:
        server, client = srv.target.node, cli.target.node
        server_hcas = self._hcas(server, fabric)
        ok = True
        for i, hca in enumerate(self._hcas(client, fabric)):
            peer_hca = hca if hca in server_hcas else server_hcas[i % len(server_hcas)]
            port = IB_WRITE_BW_BASE_PORT + i
            s_argv = ib_write_bw_server(peer_hca, port)
            c_argv = ib_write_bw_client(hca, port, srv.target.address)
            extra_s = {"role": "server", "peer": client, "peer_hca": hca, "retest": retest}
            extra_c = {"role": "client", "peer": server, "peer_hca": peer_hca, "retest": retest}
            t = IB_WRITE_BW_TIMEOUT_S
            running = s_session.start(command_line(s_argv, t, become=self.become))
            if not running.wait_for(SERVER_READY, IB_WRITE_BW_SERVER_START_S):
                s_res = running.finish(KILL_AFTER_S + GRACE_S)
                why = s_res.error or (
                    f"exit {s_res.rc}: {_said(s_res.stderr)}"
                    if s_res.rc is not None
                    else f"no '{SERVER_READY}' within {IB_WRITE_BW_SERVER_START_S} s"
                )
                c_res = ExecResult(
                    error=f"not run: the ib_write_bw server on {server} ({peer_hca}) did not "
                    f"start: {why}"
                )
            else:
                c_res = self._run(c_session, c_argv, t)
                s_res = running.finish(t + KILL_AFTER_S + GRACE_S)
            if s_res.rc == _TIMEOUT_RC and s_res.error is None:
                s_res = ExecResult(s_res.stdout, s_res.stderr, s_res.rc, timed_out=True)
            # the server prints the same result table: each side's output goes to its own node,
            # except in a retest against a node that passed already, where only the node under
            # suspicion (the client) gets the new result
            if record_server:
                srv.record(perftest_kind(peer_hca), s_res, s_argv, t, **extra_s)
            cli.record(perftest_kind(hca), c_res, c_argv, t, **extra_c)
            ok = ok and self._passes(client, hca, c_res) and self._passes(server, peer_hca, s_res)
        return ok

    def _passes(self, node: str, hca: str, result: ExecResult) -> bool:
        exp = self.exps[node]
        only = tuple(n for n in exp.nics if n.device == hca)
        if not only:
            return True
        out = ProbeOutput(
            "perftest",
            result.stdout.decode("utf-8", errors="replace") if result.stdout else None,
            rc=result.rc,
            timed_out=result.timed_out,
            error=result.error,
        )
        verdicts = judge_ib_write_bw(dataclasses.replace(exp, nics=only), {hca: out})
        return all(r.verdict is Verdict.OK for r in verdicts)

    def _pairs(self, states: Mapping[str, _NodeState], total: int) -> list[PairRun]:
        by_fabric: dict[str, list[str]] = {}
        for node, st in states.items():
            exp = self.exps[node]
            if not st.reached or node not in self._pair_nodes:
                continue
            for fabric in dict.fromkeys(n.fabric for n in exp.nics):
                by_fabric.setdefault(fabric, []).append(node)
        runs: list[PairRun] = []
        done = 0

        def report(run: PairRun) -> None:
            nonlocal done
            done += 1
            status = "ok" if run.passed else "failed"
            self.on_progress(ProgressEvent("pair", run.client, status, done, total))

        # fabrics one after the other: a node on two fabrics never runs two tests at once
        # each pair holds two connections: without kept sessions, half as many pairs at once
        workers = self.parallel if self._keep_open else max(1, self.parallel // 2)
        for fabric, members in sorted(by_fabric.items()):
            runs += self._fabric_pairs(states, fabric, members, workers, report)
        return runs

    def _fabric_pairs(
        self,
        states: Mapping[str, _NodeState],
        fabric: str,
        members: list[str],
        workers: int,
        report: Callable[[PairRun], None],
    ) -> list[PairRun]:
        rounds = pairing.schedule(members, self.pair_rounds)
        status: dict[str, bool] = {}  # node -> whether its last recorded pair passed
        tested: set[frozenset[str]] = set()
        runs: list[PairRun] = []

        def play(rnd: pairing.Round, retest: bool, both: bool) -> list[PairRun]:
            got = self._parallel(
                lambda p: self._pair(states, fabric, p[0], p[1], retest, both), rnd, workers
            )
            for run in got:
                report(run)
                tested.add(frozenset((run.server, run.client)))
                status[run.client] = run.passed
                if both:
                    status[run.server] = run.passed
            return got

        for rnd in rounds:
            runs += play(rnd, False, True)
        # a failed pair does not say which node is at fault: each node whose last pair failed
        # is tested again with a node that passed (or, while none has, with another suspect it
        # has not met: a pair of those that passes clears both)
        for _ in range(RETEST_PASSES):
            suspects = [n for n in members if status.get(n) is False]
            good = [n for n in members if status.get(n) is True]
            again = pairing.retest(suspects, good, tested)
            for rnd in again:
                runs += play(rnd, True, not good)
            if not again:
                break
        covered = pairing.covered(rounds)
        for node in members:
            if node in covered:
                continue
            for hca in self._hcas(node, fabric):
                states[node].record(
                    perftest_kind(hca),
                    ExecResult(
                        error=f"not measured: no other reachable node on fabric {fabric} "
                        "to run ib_write_bw with"
                    ),
                    ("ib_write_bw",),
                    IB_WRITE_BW_TIMEOUT_S,
                )
        return runs

    # -- phase 3: multi-node nccl-tests through Slurm (level long; gpuctl/validation/multinode.py)

    def _multinode(self, states: Mapping[str, _NodeState], out: Path) -> None:
        plan = self.multinode
        if plan is None or self._cancel.is_set():
            return
        reached = [n for n, st in states.items() if st.reached and st.unreachable is None]
        groups = multinode.participants(self.exps, reached, self.level)
        if not groups:
            return
        controller = plan.controller.node
        try:
            session = self.connector.connect(plan.controller)
        except Unreachable as exc:
            why = f"{controller}, where srun runs, cannot be reached: {exc.reason}"
            multinode.write_not_measured(out, groups, why, write_atomic)
            return
        try:
            argv = ("scontrol", "show", "node")
            res = self._run(session, argv, multinode.SCONTROL_TIMEOUT_S)
            slurm: dict[str, dict[str, Any]] | str
            if res.rc != 0 or res.error is not None or res.timed_out:
                said = res.error or ("timed out" if res.timed_out else _said(res.stderr))
                slurm = f"scontrol show node on {controller}: exit {res.rc}: {said}"
            else:
                slurm = multinode.slurm_records(res.stdout.decode("utf-8", errors="replace"))
            if isinstance(slurm, str):
                multinode.write_not_measured(out, groups, slurm, write_atomic)
                return
            for group, nodes in sorted(groups.items()):
                if self._cancel.is_set():
                    return
                done = 0

                def report(run: multinode.RunOutcome, group: str = group) -> None:
                    nonlocal done
                    done += 1
                    ok = run.busbw is not None and run.failure is None
                    self.on_progress(
                        ProgressEvent("multinode", group, "ok" if ok else "failed", done)
                    )

                multinode.collect_group(
                    out,
                    group,
                    nodes,
                    self.exps,
                    lambda argv, timeout: self._run(session, argv, timeout),
                    probe_meta,
                    write_atomic,
                    slurm=slurm,
                    options=plan.options,
                    on_run=report,
                )
        finally:
            with contextlib.suppress(Exception):
                session.close()

    # -- the whole run ---------------------------------------------------------------------

    def collect(self, targets: Sequence[Target], out: Path) -> CollectResult:
        started = time.monotonic()
        collected_at = _iso(datetime.now(UTC))
        out.mkdir(parents=True, exist_ok=True)
        header = {
            "gpuctl": __version__,
            "collected_at": collected_at,
            "level": self.level,
            "nodes": [t.node for t in targets],
            "complete": False,
        }
        write_atomic(out / BUNDLE_FILE, _json_bytes(header))
        states = {t.node: _NodeState(t, out / t.node) for t in targets}
        self._pair_nodes = {
            t.node for t in targets if wants_ib_write_bw(self.exps[t.node], self.level)
        }
        # sessions stay open for ib_write_bw when that keeps within --parallel connections
        self._keep_open = len(self._pair_nodes) <= self.parallel
        try:
            self._parallel(
                lambda s: self._node(s, len(states)), list(states.values()), self.parallel
            )
            pair_total = sum(1 for n, s in states.items() if s.reached and n in self._pair_nodes)
            runs = self._pairs(states, max(1, pair_total // 2))
            self._multinode(states, out)
            for st in states.values():
                st.write_meta()
        finally:
            for st in states.values():
                self._close(st)
            with contextlib.suppress(Exception):
                self.connector.close()
        unreachable = {n: s.unreachable for n, s in states.items() if s.unreachable is not None}
        seconds = time.monotonic() - started
        write_atomic(
            out / BUNDLE_FILE,
            _json_bytes(
                {
                    **header,
                    "complete": True,
                    "seconds": round(seconds, 3),
                    "unreachable": unreachable,
                    "pairs": [r.to_json() for r in runs],
                }
            ),
        )
        return CollectResult(out, unreachable, tuple(runs), collected_at, seconds)


# ------------------------------------------------------------------------------------------
# The library entry points: validate (collect + judge) and judge_bundle (judge again)


@dataclass(frozen=True, slots=True)
class ValidateResult:
    """What one `gpuctl validate` found: the bundle it wrote (or read) and its verdicts."""

    bundle: Path
    report: ValidationReport
    unreachable: dict[str, str]
    level: str | None  # the level asked for; None = each node's level from cluster.yml
    nodes: tuple[str, ...]
    collected_at: str | None
    seconds: float = 0.0
    pairs: tuple[PairRun, ...] = ()
    complete: bool = True  # False: the bundle is from a collection that did not finish
    ignored: tuple[str, ...] = ()  # node folders of the bundle cluster.yml does not know
    warnings: tuple[str, ...] = ()  # what the CLI shows as warnings (ignored folders)

    @property
    def failed(self) -> bool:
        return self.report.failed

    @property
    def failed_nodes(self) -> list[str]:
        return [n.node for n in self.report.nodes if n.failed]


def with_level(cluster: Cluster, level: str | None) -> Cluster:
    """The cluster with every node at ``level`` (None: unchanged, each group's own level)."""
    if level is None:
        return cluster
    if level not in LEVELS:
        raise UsageError(f"unknown level {level!r}; levels: {', '.join(LEVELS)}")
    lvl = Level(level)
    return cluster.model_copy(
        update={
            "validation": cluster.validation.model_copy(update={"level": lvl}),
            "node_groups": [
                g.model_copy(update={"validation": g.validation.model_copy(update={"level": lvl})})
                for g in cluster.node_groups
            ],
        }
    )


def select_nodes(cluster: Cluster, limit: str | None) -> list[str]:
    """The nodes ``limit`` names (node sets such as ``gpu[001-004]``, node group names, comma
    separated), in the order of cluster.yml; every node when ``limit`` is None."""
    every = [n.name for n in cluster_nodes(cluster)]
    if limit is None:
        return every
    groups = {g.name: g.node_names() for g in cluster.node_groups}
    wanted: set[str] = set()
    unknown: list[str] = []
    for piece in split_top_level(limit):
        if piece in groups:
            wanted.update(groups[piece])
            continue
        try:
            names = list(NodeSet(piece))
        except NodeSetParseError as exc:
            raise UsageError(f"--limit: {piece!r} is not a node set: {exc}") from None
        unknown += [n for n in names if n not in every]
        wanted.update(names)
    if unknown:
        shown = str(NodeSet.fromlist(unknown))
        raise UsageError(f"--limit: not in the cluster: {shown}")
    chosen = [n for n in every if n in wanted]
    if not chosen:
        raise UsageError("--limit selects no node")
    return chosen


def default_out(cluster_path: Path) -> Path:
    """A new directory ``.gpuctl/validate/<UTC time>`` beside cluster.yml."""
    base = cluster_path.resolve().parent / ".gpuctl" / "validate"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate, n = base / stamp, 1
    while candidate.exists():
        n += 1
        candidate = base / f"{stamp}-{n}"
    return candidate


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty directory")


def _judge(
    cluster: Cluster,
    bundle: Path,
    nodes: Sequence[str],
    level: str | None,
    now: datetime | None,
    clock_problem: str | None,
    generated_at: str | None,
) -> ValidationReport:
    """The report of ``nodes`` (every other node of cluster.yml is left out) from ``bundle``;
    ``now`` ends the Xid window, ``clock_problem`` says why there is no trusted time."""
    leveled = with_level(cluster, level)
    report = judge_directory(
        leveled,
        bundle,
        level=level,
        now=now,
        clock_problem=clock_problem,
        generated_at=generated_at,
    )
    keep = set(nodes)
    extra = {
        k: ({n: v for n, v in val.items() if n in keep} if isinstance(val, dict) else val)
        for k, val in report.extra.items()
    }
    # multi-node nccl-tests (level long): the locator replayed over the recorded runs
    mn = multinode_plan(cluster).options
    exps = expectations(leveled)
    try:
        mn_results, mn_summary = multinode.judge_bundle_dir(bundle, exps, mn)
    except Exception as exc:  # never lose the nodes' own verdicts to it
        mn_results = [not_judged(n, exc, multinode.CHECK) for n in nodes if exps[n].gpu_count]
        mn_summary = {}
    more: dict[str, list[CheckResult]] = {}
    for r in mn_results:
        more.setdefault(r.node, []).append(r)
    reached = [n.node for n in report.nodes if n.node in keep and not _lost(n)]
    for group, members in multinode.participants(exps, reached, level).items():
        for node in members:
            if node not in more:  # a run was due and the bundle does not hold it
                more[node] = [
                    CheckResult(
                        check=multinode.CHECK,
                        node=node,
                        verdict=Verdict.UNKNOWN,
                        message=f"not measured: the bundle holds no multi-node run of group "
                        f"{group} with {node} (level long)",
                    )
                ]
    if mn_summary:
        extra["nccl_multinode"] = mn_summary
    return ValidationReport(
        cluster=report.cluster,
        level=report.level,
        nodes=tuple(
            NodeReport(n.node, n.checks + tuple(more.get(n.node, ())), n.unknown_fails)
            for n in report.nodes
            if n.node in keep
        ),
        generated_at=report.generated_at,
        extra=extra,
    )


def _lost(node: NodeReport) -> bool:
    """Not reached, or its folder not judged: no multi-node run is due for it."""
    return any(
        c.check in ("node.reachable", "node.bundle", "node.judged") and c.verdict is not Verdict.OK
        for c in node.checks
    )


def validate(
    cluster_path: Path,
    *,
    level: str | None = None,
    limit: str | None = None,
    out: Path | None = None,
    parallel: int = DEFAULT_PARALLEL,
    pair_rounds: int | None = None,
    connector: Connector | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
) -> ValidateResult:
    """Collect every selected node's probe outputs over SSH into ``out`` and judge them.

    ``level`` overrides every node's level from cluster.yml; ``limit`` selects nodes (see
    :func:`select_nodes`); ``connector`` replaces SSH (tests). The bundle also gets
    ``results.json`` (the report, for `gpuctl report`).
    """
    cluster = load_cluster(cluster_path)
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    nodes = select_nodes(cluster, limit)
    out = out if out is not None else default_out(cluster_path)
    _check_out(out)
    settings = ssh_settings(cluster, cluster_path) if connector is None else None
    if connector is None:
        assert settings is not None  # noqa: S101
        connector = ParamikoConnector(settings)
    become = settings.become if settings is not None else False
    leveled = with_level(cluster, level)
    exps = expectations(leveled)
    address = {n.name: n.address or n.name for n in cluster_nodes(cluster)}
    targets = [Target(n, address[n]) for n in nodes]
    collector = Collector(
        connector,
        exps,
        level=level,
        parallel=parallel,
        become=become,
        pair_rounds=pair_rounds,
        on_progress=on_progress,
        multinode=multinode_plan(cluster),
    )
    got = collector.collect(targets, out)
    now, clock_problem = collection_time({"collected_at": got.collected_at})
    report = _judge(cluster, out, nodes, level, now, clock_problem, got.collected_at)
    write_atomic(out / RESULTS_FILE, report.dumps().encode("utf-8"))
    return ValidateResult(
        bundle=out,
        report=report,
        unreachable=got.unreachable,
        level=level,
        nodes=tuple(nodes),
        collected_at=got.collected_at,
        seconds=got.seconds,
        pairs=got.pairs,
    )


def read_bundle_header(bundle: Path) -> dict[str, Any]:
    """bundle.json of a bundle written by `gpuctl validate` ({} for a hand-made bundle).

    Read like every file of a bundle (never through a link, bounded); one that cannot be read
    or is not a JSON object makes the whole bundle unreadable (UsageError, one line)."""
    try:
        data = read_bundle_json(bundle, BUNDLE_FILE)
    except FileNotFoundError:
        return {}
    except BundleFileError as exc:
        raise UsageError(f"--bundle {bundle}: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--bundle {bundle}: {BUNDLE_FILE}: not a JSON object")
    return data


def _header_level(bundle: Path, header: Mapping[str, Any]) -> str | None:
    level = header.get("level")
    if level is None:
        return None
    if not isinstance(level, str) or level not in LEVELS:
        raise UsageError(
            f"--bundle {bundle}: {BUNDLE_FILE}: level {short(level, 40)} is not one of "
            f"{', '.join(LEVELS)}"
        )
    return level


def bundle_folders(bundle: Path) -> list[str]:
    """The names of what looks like node folders in ``bundle`` (links included, never
    followed): everything but files, ``_multinode`` and dot names."""
    try:
        entries = list(os.scandir(bundle))
    except OSError as exc:
        raise UsageError(f"--bundle {bundle}: cannot be listed: {exc.strerror or exc}") from None
    return sorted(
        e.name
        for e in entries
        if (e.is_dir(follow_symlinks=False) or e.is_symlink())
        and e.name != multinode.BUNDLE_DIR
        and not e.name.startswith(".")
    )


def _pairs(header: Mapping[str, Any]) -> tuple[PairRun, ...]:
    recorded = header.get("pairs")
    if not isinstance(recorded, list):
        return ()
    return tuple(
        PairRun(
            short(p.get("fabric"), 100),
            short(p.get("server"), 100),
            short(p.get("client"), 100),
            p.get("passed") is True,
            p.get("retest") is True,
        )
        for p in recorded
        if isinstance(p, dict)
    )


def judge_bundle(
    cluster_path: Path,
    bundle: Path,
    *,
    level: str | None = None,
    limit: str | None = None,
) -> ValidateResult:
    """Judge a saved bundle again, offline (no SSH): every node of cluster.yml (``limit``
    narrows them), at the level it was collected at unless ``level`` says otherwise; the Xid
    window ends at its collection time.

    The bundle may come from someone else: a selected node it lacks fails (``missing from the
    bundle``), folders of nodes cluster.yml does not know are ignored (``ignored``, with a
    warning), and a collection time that is missing or implausible is not trusted (the Xid
    check cannot pass). A bundle.json that cannot be read is a UsageError."""
    if not bundle.is_dir():
        raise UsageError(f"--bundle {bundle}: not a directory")
    cluster = load_cluster(cluster_path)
    header = read_bundle_header(bundle)
    if level is None:
        level = _header_level(bundle, header)
    if level is not None and level not in LEVELS:
        raise UsageError(f"--level: {level!r} is not one of {', '.join(LEVELS)}")
    nodes = select_nodes(cluster, limit)
    known = {n.name for n in cluster_nodes(cluster)}
    ignored = tuple(name for name in bundle_folders(bundle) if name not in known)
    warnings: tuple[str, ...] = ()
    if ignored:
        warnings = (
            "the bundle holds folders of nodes that cluster.yml does not know, not judged: "
            + ", ".join(short(n, 100) for n in ignored),
        )
    now, clock_problem = collection_time(header)
    stamp = header.get("collected_at") if now is not None else None
    collected_at = stamp if isinstance(stamp, str) else None
    report = _judge(cluster, bundle, nodes, level, now, clock_problem, collected_at)
    unreachable = dict(_unreachable_in(bundle, nodes))
    return ValidateResult(
        bundle=bundle,
        report=report,
        unreachable=unreachable,
        level=level,
        nodes=tuple(nodes),
        collected_at=collected_at,
        complete=header.get("complete", True) is True,
        pairs=_pairs(header),
        ignored=ignored,
        warnings=warnings,
    )


def _unreachable_in(bundle: Path, nodes: Iterable[str]) -> Iterator[tuple[str, str]]:
    for node in nodes:
        try:
            os.lstat(bundle / node)
        except (FileNotFoundError, NotADirectoryError):
            yield node, MISSING
            continue
        except OSError:
            continue
        data, _ = read_node_meta(bundle, node)
        if data is not None and data.get("unreachable"):
            yield node, short(data["unreachable"], 500)

"""SSH with paramiko: host keys checked against cluster.yml's ``ssh.known_hosts`` and nothing
else (unknown keys rejected), an optional jump host, one connection per node with a channel per
command, files copied over SFTP. What it gives is a :class:`gpuctl.remote.FileLink`; callers wrap
it in :class:`gpuctl.remote.LinkSession`.

A node that loses power sends nothing more: no FIN, no RST. So that a dead connection is
noticed in seconds, not after TCP's retransmissions (many minutes), each connection sends an
SSH keepalive after ``KEEPALIVE_S`` idle seconds and its socket gives up on data not
acknowledged within ``LOST_AFTER_S`` (Linux ``TCP_USER_TIMEOUT``, with TCP keepalives for an
idle socket). The transport then dies, and every command on it ends as ``lost``
(:class:`gpuctl.remote.ExecResult`), as does one whose channel closes with the transport.
Through a jump host the socket is a channel of the jump host's connection: only the SSH
keepalive applies there (and the jump host's own socket, which is tuned the same way)."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctl.config.model import Cluster
from gpuctl.errors import EnvironmentProblem
from gpuctl.remote import ExecResult, Running, Target, Unreachable

MAX_OUTPUT_BYTES = 64 * 1024 * 1024  # per stream; a runaway command is cut off here
KEEPALIVE_S = 2  # an SSH keepalive after this many idle seconds
LOST_AFTER_S = 8  # data not acknowledged for this long: the connection is dead


def tune_socket(sock: Any, lost_after_s: float = LOST_AFTER_S) -> bool:
    """TCP keepalives and a user timeout on a connection's socket, so that a peer that is gone
    is noticed within about ``lost_after_s`` seconds; False when ``sock`` is not a TCP socket
    (a jump host's channel) or the options are refused."""
    if not isinstance(sock, socket.socket):
        return False
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_S),
        ("TCP_KEEPINTVL", 1),
        ("TCP_KEEPCNT", max(1, int(lost_after_s) - KEEPALIVE_S)),
        ("TCP_USER_TIMEOUT", int(lost_after_s * 1000)),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    try:
        for level, option, value in options:
            sock.setsockopt(level, option, value)
    except OSError:
        return False
    return True


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


def _path(configured: str) -> Path:
    return Path(os.path.expanduser(configured))


def ssh_settings(cluster: Cluster) -> SshSettings:
    """cluster.yml's ssh section (the loader made its paths absolute: relative ones are
    relative to the folder of cluster.yml), checked: known_hosts must hold keys, the key exist."""
    ssh = cluster.ssh
    known = _path(ssh.known_hosts)
    if not known.is_file() or known.stat().st_size == 0:
        raise EnvironmentProblem(
            f"ssh.known_hosts: {known} is missing or empty; gpuctl checks every node's host key "
            "against it (collect the keys, e.g. with ssh-keyscan, and verify their fingerprints)"
        )
    key = _path(ssh.private_key) if ssh.private_key else None
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
            transport.set_keepalive(KEEPALIVE_S)
            tune_socket(getattr(transport, "sock", None))
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

    def connect(self, target: Target) -> _ParamikoLink:
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
        return _ParamikoLink(self._open(target.address, s.port, s.user, sock=sock))

    def close(self) -> None:
        with self._jump_lock:
            if self._jump is not None:
                self._jump.close()
                self._jump = None


class _ParamikoLink:
    """One SSH connection (a :class:`gpuctl.remote.FileLink`)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def lost(self) -> str | None:
        """Why this connection is dead, or None while it is alive."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            return "ssh: the connection to the node was lost"
        return None

    def start(self, command: str) -> Running:
        started = time.monotonic()
        try:
            why = self.lost()
            if why is not None:
                return _Failed(why, lost=True)
            chan = self.client.get_transport().open_session(timeout=30)
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
    """A command that could not be started (``lost``: the connection is dead)."""

    def __init__(self, error: str, *, lost: bool = False) -> None:
        self.error = error
        self.lost = lost

    def wait_for(self, text: str, timeout: float) -> bool:
        return False

    def done(self) -> bool:
        return True

    def finish(self, timeout: float) -> ExecResult:
        return ExecResult(error=self.error, lost=self.lost)


class _ParamikoRunning:
    _SLICE = 0.5

    def __init__(self, chan: Any, started: float) -> None:
        self.chan = chan
        self.started = started
        self.out = bytearray()
        self.err = bytearray()
        self.eof = False
        self.error: str | None = None
        self.lost = False

    def _dead(self) -> bool:
        """The connection died under the command (the node is gone): noted as lost."""
        transport = self.chan.get_transport()
        # paramiko closes the channels of a dead transport a moment before it says so
        settle = time.monotonic() + (0.5 if self.chan.closed else 0.0)
        while transport is not None and transport.is_active():
            if time.monotonic() >= settle:
                return False
            time.sleep(0.05)
        self.lost = True
        self.error = "ssh: the connection to the node was lost while the command ran"
        return True

    def done(self) -> bool:
        """It ended (or its channel or connection closed): finish() returns at once."""
        return bool(self.chan.exit_status_ready())

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
                if self.chan.closed and self.chan.exit_status < 0:
                    self._dead()  # closed with no exit status: lost when the transport is
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
                if self._dead():
                    return False
                continue
            except (OSError, EOFError) as exc:
                self.lost = True
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
            if not self._dead() and self.chan.closed:
                self.error = "ssh: the channel closed while the command ran"
            elif self.error is None:
                self.chan.close()  # the node-side `timeout` ends the command itself
                return ExecResult(
                    bytes(self.out), bytes(self.err), None, timed_out=True, seconds=seconds
                )
        if self.error is not None:
            self.chan.close()
            return ExecResult(
                bytes(self.out),
                bytes(self.err),
                None,
                error=self.error,
                seconds=seconds,
                lost=self.lost,
            )
        status = self.chan.recv_exit_status()
        self.chan.close()
        rc: int | None = status if status >= 0 else None
        error = None if rc is not None else "ended without an exit status (killed by a signal?)"
        return ExecResult(bytes(self.out), bytes(self.err), rc, error=error, seconds=seconds)

"""Commands on this machine, under the same contract as a node over SSH (`gpuctl node-check`
runs its probes here): argv lists, never a shell, the timeout rule of :mod:`gpuctl.remote` done
with signals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from gpuctl.fileio import write_atomic
from gpuctl.remote import CANNOT_RUN_RC, KILL_AFTER_S, NOT_FOUND_RC, ExecResult


def _killpg(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def run_local(argv: Sequence[str], timeout_s: float) -> ExecResult:
    """Run ``argv`` (no shell) in its own process group with nothing on stdin. At ``timeout_s``
    the group gets SIGTERM, KILL_AFTER_S later SIGKILL (what ``timeout -k`` does on the node for
    `gpuctl validate`), and the result says ``timed_out``. A command that cannot be started is
    reported as a shell would (exit 127 not found, 126 not executable); every exit status is
    kept."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(  # noqa: S603 - an argv list from the probe table
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        return ExecResult(stderr=f"{argv[0]}: command not found\n".encode(), rc=NOT_FOUND_RC)
    except PermissionError:
        return ExecResult(stderr=f"{argv[0]}: Permission denied\n".encode(), rc=CANNOT_RUN_RC)
    except OSError as exc:
        return ExecResult(error=f"{argv[0]}: cannot be started: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=max(timeout_s, 0.001))
    except subprocess.TimeoutExpired:
        _killpg(proc, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            _killpg(proc, signal.SIGKILL)
            out, err = proc.communicate()
        return ExecResult(out, err, None, timed_out=True, seconds=time.monotonic() - started)
    seconds = time.monotonic() - started
    if proc.returncode < 0:
        return ExecResult(
            out,
            err,
            None,
            error=f"{argv[0]} was killed by signal {-proc.returncode}",
            seconds=seconds,
        )
    return ExecResult(out, err, proc.returncode, seconds=seconds)


class LocalSession:
    """:class:`gpuctl.remote.Session` on this machine."""

    def run(self, argv: Sequence[str], timeout_s: float) -> ExecResult:
        return run_local(argv, timeout_s)

    def put(self, data: bytes, remote: str) -> str:
        """Write ``data`` to ``remote`` (relative to the home folder, or absolute), mode 0600;
        the absolute path written."""
        path = Path(remote).expanduser()
        path = path if path.is_absolute() else Path.home() / path
        write_atomic(path, data, mode=0o600)
        return str(path)

    def close(self) -> None:
        pass

"""The lab's one subprocess chokepoint: argv lists, explicit timeouts, errors as LabError."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuctl.errors import EnvironmentProblem


def lab_dir() -> Path:
    """The lab's directory: ``$GPUCTL_LAB_DIR``, default /var/lib/gpuctl-lab."""
    return Path(os.environ.get("GPUCTL_LAB_DIR", "/var/lib/gpuctl-lab"))


def wheelhouse_dir() -> Path:
    """``<lab dir>/wheelhouse``: the wheels of gpuctl's node check for the lab nodes (they have
    no internet; gpuctl.provision.wheelhouse builds it)."""
    return lab_dir() / "wheelhouse"


def run_dir() -> Path:
    """``<lab dir>/run``: pid files and logs of the lab's processes (made when missing)."""
    d = lab_dir() / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d


class LabError(EnvironmentProblem):
    """The lab could not do what was asked (not root, a command failed, a node did not boot)."""


@dataclass(frozen=True, slots=True)
class Run:
    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str


def run(
    argv: Sequence[str],
    *,
    timeout: float = 120,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> Run:
    try:
        proc = subprocess.run(  # noqa: S603 - argv list, never a shell
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **env} if env else None,
            input=stdin,
        )
    except FileNotFoundError:
        raise LabError(f"{argv[0]} is not installed (run scripts/bootstrap.sh --test)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    result = Run(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise LabError(f"{' '.join(argv)} failed ({proc.returncode}): {' / '.join(detail)}")
    return result


def spawn(argv: Sequence[str], log: Path, *, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in the background, in its own session, its output appended to ``log``
    (the lab's servers and node supervisors; they outlive this process)."""
    with open(log, "ab") as handle:
        return subprocess.Popen(  # noqa: S603 - argv list, never a shell
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (network namespaces, bridges, overlay mounts, systemd-nspawn); "
            "run it as root, e.g. sudo gpuctl lab up"
        )

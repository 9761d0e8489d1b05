"""Plain constants and functions every test tier shares (the fixtures are in conftest.py).

Test modules import it as ``from helpers import ...``: pytest puts ``tests/`` on sys.path for
the conftest.py there, and mypy finds it as a top-level module beside it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (pyproject.toml, playbooks/, inventories/, docs/ ...)."""

KNOWN_HOSTS_LINE = "x ssh-ed25519 AAAA\n"
"""A known_hosts line for clusters that only need the file to exist."""


def write_lab_cluster(directory: Path, nodes: int = 3) -> Path:
    """The lab starter's cluster.yml in ``directory`` (ctl01 + gpu001..gpu00N, 8x H100, 8 NDR
    HCAs), with a known_hosts where it says (``.gpuctl/lab/known_hosts``, relative to it)."""
    from gpuctl.starter import starter  # here: `from helpers import ROOT` imports no gpuctl

    path = directory / "cluster.yml"
    path.write_text(starter("lab", nodes), encoding="utf-8")
    (directory / ".gpuctl" / "lab").mkdir(parents=True, exist_ok=True)
    (directory / ".gpuctl" / "lab" / "known_hosts").write_text(KNOWN_HOSTS_LINE)
    return path


def require_tool(name: str, install: str) -> str:
    """The path of the program ``name``; a test without it fails (never skips: CI installs every
    tool, with ``scripts/bootstrap.sh --test``), saying what to install."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is missing: {install} (scripts/bootstrap.sh --test installs it)",
            pytrace=False,
        )
    return path


def sim_node_env(tmp_path: Path, name: str, profile: str, *faults: str) -> dict[str, str]:
    """The environment of a lab stand-in run as node ``name`` of hardware ``profile``, with
    ``faults`` (``"ib_latency=mlx5_1:3"``) stored as the lab stores them."""
    import json

    from gpuctl.lab.sim import profiles
    from gpuctl.lab.sim.faults import apply

    hardware = tmp_path / f"{name}-hardware.json"
    hardware.write_text(profiles.profile_json(profile))
    found: dict[str, object] = {}
    for text in faults:
        key, _, value = text.partition("=")
        found = dict(apply(found, key, value))
    stored = tmp_path / f"{name}-faults.json"
    stored.write_text(json.dumps(found))
    return {
        "GPUCTL_SIM_PROFILE": str(hardware),
        "GPUCTL_SIM_FAULTS": str(stored),
        "GPUCTL_SIM_NODE": name,
        "GPUCTL_SIM_CONNECT_TIMEOUT": "10",
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
    }


STANDIN_CODE = (
    "import sys; from gpuctl.lab.sim.standin import main; sys.exit(main(sys.argv[1], sys.argv[2:]))"
)
"""Runs a lab stand-in as a node does: ``python -c STANDIN_CODE /usr/bin/<tool> args...``."""


def standin_pair(
    tool: str, server_env: dict[str, str], client_env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """A perftest stand-in's server in the background and its client against it on a free
    port of 127.0.0.1; both results."""
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    command = [sys.executable, "-c", STANDIN_CODE, f"/usr/bin/{tool}", *args, "-p", port]
    server = subprocess.Popen(
        command, env=server_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        client = subprocess.run(
            [*command, "127.0.0.1"],
            env=client_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return subprocess.CompletedProcess(server.args, server.returncode, out, err), client

"""What the lab test modules share: a shell command on a node, real Ansible on the lab."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import ROOT

from gpuctl.config import load_cluster
from gpuctl.lab import lab
from gpuctl.render import render_cluster

# apt options for tests that install packages on nodes gpuctl has not provisioned: the lab gives
# nodes no proxy (cluster.yml's package_sources does, at provisioning), so these tests name the
# lab's apt proxy themselves, and reach the lab repository directly
LAB_APT_PROXY = (
    "-o Acquire::http::Proxy=http://198.18.0.1:3142 -o Acquire::http::Proxy::198.18.0.1=DIRECT"
)


def sh(
    address: str, command: str, *, stdin: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with sh on a lab node (host keys checked), never raising."""
    return subprocess.run(
        lab.ssh_argv(address, ["sh", "-c", f"'{command}'"]),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def render_lab(cluster_yml: Path, out: Path) -> Path:
    """gpuctl render of the running lab, with the lab's known_hosts beside the inventory."""
    render_cluster(load_cluster(cluster_yml), out)
    shutil.copy(lab.known_hosts(), out / "known_hosts")
    return out


def ansible(
    render_dir: Path, tool: str, *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``ansible`` or ``ansible-playbook`` with the rendered ansible.cfg and the roles."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(render_dir / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "playbooks" / "roles"),
        "ANSIBLE_HOME": str(render_dir / ".ansible"),
        "ANSIBLE_LOCAL_TEMP": str(render_dir / ".t"),
        "ANSIBLE_NOCOLOR": "1",
    }
    return subprocess.run(
        [str(Path(sys.executable).parent / tool), *args],
        cwd=render_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- the shared provisioned lab (tests/lab/conftest.py) ---------------------------------

GPUCTL = str(Path(sys.executable).parent / "gpuctl")
COMPUTE = ("gpu001", "gpu002", "gpu003")
NODES = ("ctl01", *COMPUTE)


@dataclass(frozen=True)
class ProvisionedLab:
    cluster: Path  # a copy of the lab's cluster.yml; runs go to .gpuctl beside it
    check: dict[str, Any]  # run record of `gpuctl provision --check` on the fresh lab
    first: dict[str, Any]  # run record of the first `gpuctl provision`
    installed_after_check: dict[str, list[str]]  # node -> packages installed after --check


def gpuctl(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUCTL, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def installed_packages(node: str) -> list[str]:
    res = subprocess.run(
        lab.ssh_argv(
            lab.address_of(node), ["dpkg", "-l", "munge", "slurmd", "slurmctld", "nvidia-open"]
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    return [ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("ii")]


def on(node: str, command: str, timeout: float = 120) -> str:
    """Run ``command`` on a lab node; its stdout (asserts it succeeded)."""
    res = sh(lab.address_of(node), command, timeout=timeout)
    assert res.returncode == 0, (node, command, res.stdout[-1500:], res.stderr[-1500:])
    return res.stdout


def boot_id(node: str) -> str:
    return on(node, "cat /proc/sys/kernel/random/boot_id").strip()


def slurm(node: str) -> tuple[str, str]:
    """(state, reason) as sinfo shows them."""
    out = on("ctl01", f'sinfo -h -N -n {node} -o "%T|%E"').strip().splitlines()[0]
    state, reason = out.split("|", 1)
    return state, reason

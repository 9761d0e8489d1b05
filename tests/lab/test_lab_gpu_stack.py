"""The GPU software stack roles on the lab, with real Ansible over SSH (needs root).

Renders the running lab's cluster.yml (its group_vars carry the pinned versions), runs
playbooks/nvidia_driver.yml, fabric_manager.yml, nccl.yml and dcgm.yml against the two GPU
nodes, then checks the packages (exact versions, held), the services, nouveau blacklisted, the
device nodes, nvidia-smi and all_reduce_perf through gpuctl's own parsers, a second run and a
check-mode run that change nothing, and that a Fabric Manager version other than the driver's
stops the fabric_manager role before it installs anything. The NVIDIA packages are the lab
repository's stand-ins (gpuctl/lab/repo_packages.yml) and nccl-tests comes from the lab's git
mirror; the roles do not know that. The lab comes up once for the module and goes down at its
end.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT
from lab_helpers import ansible, sh

from gpuctl.lab import lab
from gpuctl.validation.parsing import parse

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

PLAYBOOKS = [
    str(ROOT / "playbooks" / f"{name}.yml")
    for name in ("nvidia_driver", "fabric_manager", "nccl", "dcgm")
]
GPU_NODES = ("gpu001", "gpu002")
CURRENT = "/opt/nccl-tests/current"
DRIVER = "570.172.08"
NCCL = "2.26.2-1+cuda12.8"
# what the roles pin on Debian 12 (the lab's cluster.yml pins driver, NCCL and DCGM 4.4.1)
PINNED = {
    "nvidia-open": f"{DRIVER}-1",
    "nvidia-driver": f"{DRIVER}-1",
    "nvidia-kernel-open-dkms": f"{DRIVER}-1",
    "nvidia-smi": f"{DRIVER}-1",
    "libnvidia-ml1": f"{DRIVER}-1",
    "nvidia-persistenced": f"{DRIVER}-1",
    "nvidia-fabricmanager-570": f"{DRIVER}-1",
    "libnvidia-nscq-570": f"{DRIVER}-1",
    "libnccl2": NCCL,
    "libnccl-dev": NCCL,
    "datacenter-gpu-manager-4-core": "1:4.4.1-1",
    "datacenter-gpu-manager-4-cuda12": "1:4.4.1-1",
}


def ssh(running: lab.UpResult, name: str, command: str) -> subprocess.CompletedProcess[str]:
    address = next(n.address for n in running.status.nodes if n.name == name)
    return sh(address, command, timeout=300)


def playbooks(render_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return ansible(render_dir, "ansible-playbook", *PLAYBOOKS, *args, timeout=900)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    hosts = {}
    for m in re.finditer(r"^(\S+)\s*:\s*(ok=.*)$", stdout.split("PLAY RECAP", 1)[-1], re.M):
        hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return hosts


def _tail(res: subprocess.CompletedProcess[str]) -> str:
    return res.stdout[-4000:] + res.stderr[-2000:]


def test_check_mode_on_fresh_nodes_plans_without_changing(
    running: lab.UpResult, render_dir: Path
) -> None:
    res = playbooks(render_dir, "--check")
    assert res.returncode == 0, _tail(res)
    hosts = recap(res.stdout)
    assert sorted(hosts) == sorted(GPU_NODES)
    assert all(h["failed"] == 0 and h["changed"] > 0 for h in hosts.values()), hosts
    for node in GPU_NODES:  # nothing installed, nothing cloned
        res = ssh(running, node, "dpkg-query -W nvidia-open libnccl2; ls /opt/nccl-tests")
        assert res.returncode != 0
        assert "no packages found matching nvidia-open" in res.stderr, res.stderr


def test_first_run_installs_the_stack(running: lab.UpResult, render_dir: Path) -> None:
    res = playbooks(render_dir)
    assert res.returncode == 0, _tail(res)
    hosts = recap(res.stdout)
    assert sorted(hosts) == sorted(GPU_NODES)
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts
    assert all(h["changed"] > 0 for h in hosts.values()), hosts


@pytest.mark.parametrize("node", GPU_NODES)
def test_packages_at_their_versions_and_held(running: lab.UpResult, node: str) -> None:
    names = " ".join(PINNED)
    res = ssh(running, node, f"dpkg-query -W -f=\\${{Package}}=\\${{Version}}\\\\n {names}")
    assert res.returncode == 0, res.stderr
    assert dict(line.split("=", 1) for line in res.stdout.split()) == PINNED
    held = set(ssh(running, node, "apt-mark showhold").stdout.split())
    assert set(PINNED) <= held, set(PINNED) - held


@pytest.mark.parametrize("node", GPU_NODES)
def test_services_devices_and_nouveau(running: lab.UpResult, node: str) -> None:
    units = "nvidia-persistenced nvidia-fabricmanager nvidia-dcgm"
    res = ssh(running, node, f"systemctl is-enabled {units}; systemctl is-active {units}")
    assert res.stdout.split() == ["enabled"] * 3 + ["active"] * 3, res.stdout + res.stderr
    conf = ssh(running, node, "cat /etc/modprobe.d/blacklist-nouveau.conf").stdout
    assert re.search(r"^blacklist nouveau$", conf, re.M), conf
    devices = ssh(running, node, 'stat -c "%F %t:%T" /dev/nvidia0 /dev/nvidia7 /dev/nvidiactl')
    # stat prints major:minor in hex
    assert devices.stdout.split("\n")[:3] == [
        "character special file c3:0",
        "character special file c3:7",
        "character special file c3:ff",
    ], devices.stdout + devices.stderr
    # modprobe answers as on a GPU node (the module stand-in's /etc/modprobe.d install lines)
    loaded = ssh(running, node, "modprobe nvidia && modprobe nvidia-uvm && modprobe nvidia-peermem")
    assert loaded.returncode == 0, loaded.stderr


def test_nvidia_smi_and_all_reduce_perf_parse(running: lab.UpResult) -> None:
    smi = parse("smi-q", ssh(running, "gpu001", "nvidia-smi -q").stdout)
    assert smi.recognised, smi.problems
    assert smi.data["driver_version"] == DRIVER
    assert len(smi.data["gpus"]) == 8
    current = ssh(running, "gpu001", "readlink /opt/nccl-tests/current; command -v all_reduce_perf")
    assert current.stdout.split() == ["/opt/nccl-tests/2.17.9", "/usr/local/bin/all_reduce_perf"]
    run = ssh(running, "gpu001", f"{CURRENT}/build/all_reduce_perf -b 8 -e 8G -f 2 -g 8")
    assert run.returncode == 0, run.stdout[-1000:] + run.stderr[-1000:]
    nccl = parse("nccl", run.stdout)
    assert nccl.recognised, nccl.problems
    assert nccl.data["avg_busbw"] is not None


def test_second_run_changes_nothing(running: lab.UpResult, render_dir: Path) -> None:
    res = playbooks(render_dir)
    assert res.returncode == 0, _tail(res)
    changed = {n: h["changed"] for n, h in recap(res.stdout).items()}
    assert changed == dict.fromkeys(GPU_NODES, 0), _tail(res)


def test_check_mode_changes_nothing(running: lab.UpResult, render_dir: Path) -> None:
    res = playbooks(render_dir, "--check")
    assert res.returncode == 0, _tail(res)
    changed = {n: h["changed"] for n, h in recap(res.stdout).items()}
    assert changed == dict.fromkeys(GPU_NODES, 0), _tail(res)


def test_fabric_manager_other_than_the_driver_stops_the_role(
    running: lab.UpResult, render_dir: Path
) -> None:
    res = ansible(
        render_dir,
        "ansible-playbook",
        str(ROOT / "playbooks" / "fabric_manager.yml"),
        "-e",
        "fabric_manager_version=570.124.06",
        timeout=300,
    )
    assert res.returncode != 0
    assert re.search(
        r"Fabric Manager 570\.124\.06 must equal the NVIDIA driver version 570\.172\.08", res.stdout
    ), _tail(res)
    hosts = recap(res.stdout)
    assert all(h["failed"] == 1 and h["changed"] == 0 for h in hosts.values()), hosts
    version = ssh(running, "gpu001", "dpkg-query -W -f=\\${Version} nvidia-fabricmanager-570")
    assert version.stdout == f"{DRIVER}-1"  # nothing was installed

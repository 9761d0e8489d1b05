"""The lab on this machine: real systemd-nspawn nodes, real SSH, real reboots (needs root).

Module order matters: the lab comes up once, the tests use it, the last test takes it down and
checks that nothing of it is left.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_helpers import ansible, render_lab

from gpuctl.config import load_cluster
from gpuctl.lab import lab

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]


# the lab's processes: node containers and their supervisors, the simulated BMCs, the apt
# proxy, the repo server
LAB_PROCESSES = (
    "systemd-nspawn",
    "gpuctl.lab.supervisor",
    "gpuctl.lab.sim.bmc",
    "apt-cacher-ng",
    "http.server",
)


def _host_state() -> dict[str, list[str]]:
    links = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    netns = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout
    procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return {
        "links": sorted(line.split(": ")[1].split("@")[0] for line in links.splitlines()),
        "netns": sorted(netns.split()),
        "mounts": sorted(line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()),
        # running processes only: an exited child waiting to be reaped (<defunct>) is not one
        "procs": sorted(
            p
            for p in procs.splitlines()
            if any(m in p for m in LAB_PROCESSES) and "<defunct>" not in p
        ),
    }


@pytest.fixture(scope="module")
def before() -> dict[str, list[str]]:
    lab.down()  # a lab left running (scripts/main.sh) would hide residue: start from none
    return _host_state()


@pytest.fixture(scope="module")
def running(before: dict[str, list[str]]) -> Iterator[lab.UpResult]:
    result = lab.up(2)
    yield result
    lab.down()  # also when a test failed; the residue test checks it on the normal path


def ssh(
    address: str, *command: str, known_hosts: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = lab.ssh_argv(address, list(command))
    if known_hosts is not None:
        argv = [a.replace(str(lab.known_hosts()), str(known_hosts)) for a in argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_three_nodes_answer_ssh_with_systemd_running(running: lab.UpResult) -> None:
    names = [n.name for n in running.status.nodes]
    assert names == ["ctl01", "gpu001", "gpu002"]
    for node in running.status.nodes:
        assert node.state == "running"
        res = ssh(node.address, "hostname", ";", "systemctl", "is-system-running")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == [node.name, "running"]


def test_host_key_checking_is_on(running: lab.UpResult, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    res = ssh(running.status.nodes[1].address, "true", known_hosts=empty)
    assert res.returncode != 0
    assert "Host key verification failed" in res.stderr
    keys = lab.known_hosts().read_text().splitlines()
    assert len(keys) == 3
    assert len({line.split()[-1] for line in keys}) == 3  # every node has its own host key


def test_distinct_addresses_and_nodes_reach_each_other(running: lab.UpResult) -> None:
    nodes = running.status.nodes
    assert len({n.address for n in nodes}) == 3
    for node in nodes:
        res = ssh(node.address, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
        assert f"inet {node.address}/24" in res.stdout
        routes = ssh(node.address, "ip", "route").stdout
        assert "default" not in routes  # the bridge reaches nothing else
    res = ssh(nodes[1].address, "ping", "-c1", "-W2", nodes[2].address)
    assert res.returncode == 0, res.stdout + res.stderr
    res = ssh(nodes[2].address, "ping", "-c1", "-W2", "ctl01")  # names from /etc/hosts
    assert res.returncode == 0, res.stdout + res.stderr


def test_cluster_yml_of_the_running_lab(running: lab.UpResult) -> None:
    assert running.status.cluster_yml is not None
    cluster = load_cluster(running.status.cluster_yml)
    addresses = {
        name: addr
        for g in cluster.node_groups
        for name, addr in zip(g.node_names(), g.address_list() or [], strict=True)
    }
    assert addresses == {n.name: n.address for n in running.status.nodes}
    assert cluster.ssh.private_key == str(lab.ssh_key())


def test_second_up_changes_nothing(running: lab.UpResult) -> None:
    address = running.status.nodes[1].address
    boot = ssh(address, "cat", "/proc/sys/kernel/random/boot_id").stdout
    again = lab.up(2)
    assert again.started == ()
    assert not again.base_built
    assert ssh(address, "cat", "/proc/sys/kernel/random/boot_id").stdout == boot


def test_reboot_from_inside_comes_back_with_its_disk(running: lab.UpResult) -> None:
    address = running.status.nodes[2].address
    assert ssh(address, "sh", "-c", "'echo kept > /root/marker'").returncode == 0
    before_id, after_id = lab.reboot("gpu002")
    assert before_id != after_id
    assert ssh(address, "cat", "/root/marker").stdout.strip() == "kept"
    assert ssh(address, "systemctl", "is-system-running").stdout.strip() == "running"


def test_real_ansible_over_ssh_reboots_a_node(running: lab.UpResult, tmp_path: Path) -> None:
    """gpuctl render's inventory and ansible.cfg drive the lab with real Ansible, host keys
    checked against the lab's known_hosts; the reboot module sees a real reboot."""
    assert running.status.cluster_yml is not None
    render_lab(running.status.cluster_yml, tmp_path)
    ping = ansible(tmp_path, "ansible", "all", "-m", "ansible.builtin.ping", timeout=300)
    assert ping.returncode == 0, ping.stdout[-2000:] + ping.stderr[-2000:]
    assert ping.stdout.count("SUCCESS") == 3
    address = running.status.nodes[1].address
    before = ssh(address, "cat", "/proc/sys/kernel/random/boot_id").stdout
    res = ansible(tmp_path, "ansible", "gpu001", "-m", "ansible.builtin.reboot", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "rebooted: true" in res.stdout
    assert ssh(address, "cat", "/proc/sys/kernel/random/boot_id").stdout != before


def test_down_leaves_no_residue(running: lab.UpResult, before: dict[str, list[str]]) -> None:
    removed = lab.down()
    assert removed == ["ctl01", "gpu001", "gpu002"]
    assert _host_state() == before
    assert lab.status().nodes == ()
    assert (lab.lab_dir() / "base" / ".gpuctl-base-ok").is_file()  # the image cache stays

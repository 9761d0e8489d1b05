"""The preflight, rdma and validation_tools roles on the lab, with real Ansible over SSH.

Renders the running lab's cluster.yml (inbox RDMA stack, nvidia-peermem asked for, InfiniBand
fabric) plus an opensm host var for gpu001 as render writes it for a fabric whose subnet
manager is opensm, runs playbooks/preflight.yml, rdma.yml and validation_tools.yml in one
ansible-playbook, then checks the version gate passed, the packages (the lab repository's
stand-ins where it has them), ibstat read by gpuctl's parser, the opensm and nvidia-peermem
decisions, idempotence and check mode. Last, the nvidia-peermem load path on gpu001 with a
kernel symbol table that has the peer memory API (the lab's kernel has none).

The lab has no RDMA device and its fabric is InfiniBand, so IPoIB addresses (which need
/sys/class/infiniband) are not configured here, and roce_qos runs as the no-op it is on an
InfiniBand node (no roce_qos_devices); given a device anyway it installs its pieces and stops
with a clear message, as there is no netdev to set. The lab comes up once for the module and
goes down at its end.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT
from lab_helpers import ansible, render_lab, sh

from gpuctl.lab import lab
from gpuctl.validation.parsing import parse

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

PLAYBOOKS = [
    str(ROOT / "playbooks" / f"{p}.yml")
    for p in ("preflight", "rdma", "roce_qos", "validation_tools")
]
NODES = ("ctl01", "gpu001", "gpu002")
GPU_NODES = ("gpu001", "gpu002")
SM_HOST = "gpu001"


@pytest.fixture(scope="module")
def render_dir(running: lab.UpResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rdma-render")
    assert running.status.cluster_yml is not None
    render_lab(running.status.cluster_yml, out)
    (out / "host_vars").mkdir(exist_ok=True)
    (out / "host_vars" / f"{SM_HOST}.yml").write_text("rdma_opensm_enabled: true\n")
    return out


def ssh(running: lab.UpResult, name: str, command: str) -> subprocess.CompletedProcess[str]:
    address = next(n.address for n in running.status.nodes if n.name == name)
    return sh(address, command, timeout=120)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    hosts = {}
    for m in re.finditer(r"^(\S+)\s*:\s*(ok=.*)$", stdout.split("PLAY RECAP", 1)[-1], re.M):
        hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return hosts


@pytest.fixture(scope="module")
def first_run(render_dir: Path) -> subprocess.CompletedProcess[str]:
    return ansible(render_dir, "ansible-playbook", *PLAYBOOKS)


def test_first_run_passes_on_every_node(first_run: subprocess.CompletedProcess[str]) -> None:
    out = first_run.stdout[-4000:] + first_run.stderr[-2000:]
    assert first_run.returncode == 0, out
    hosts = recap(first_run.stdout)
    assert sorted(hosts) == sorted(NODES), out
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values()), hosts


def test_the_version_gate_passed(first_run: subprocess.CompletedProcess[str]) -> None:
    passed = re.findall(r"The version set passes (\d+) compatibility rules", first_run.stdout)
    assert len(passed) == len(NODES), first_run.stdout[-3000:]
    assert int(passed[0]) >= 9


def test_packages_are_the_lab_stand_ins_and_debians(
    running: lab.UpResult, first_run: subprocess.CompletedProcess[str]
) -> None:
    want = {
        "infiniband-diags": "44.0-2+gpuctllab1",  # the lab repository's stand-ins
        "ibverbs-utils": "44.0-2+gpuctllab1",
        "perftest": "4.5+0.17-1+gpuctllab1",
        "rdma-core": "44.0-2",  # Debian's, through the proxy
        "rdmacm-utils": "44.0-2",
        "opensm": None,
        "pciutils": None,
        "dmidecode": None,
    }
    for name in GPU_NODES:
        res = ssh(
            running, name, "dpkg-query -W -f=\\${Package}=\\${Version}\\\\n " + " ".join(want)
        )
        assert res.returncode == (0 if name == SM_HOST else 1), (name, res.stdout, res.stderr)
        have = dict(line.split("=", 1) for line in res.stdout.split())
        for package, version in want.items():
            if package == "opensm" and name != SM_HOST:
                assert package not in have, name
                continue
            assert package in have, (name, package)
            if version is not None:
                assert have[package] == version, (name, package, have[package])
    ctl = ssh(running, "ctl01", "dpkg-query -W infiniband-diags perftest")
    assert ctl.returncode != 0  # the controller has no fabric NIC and no GPU: not in those plays


def test_ibstat_parses_with_gpuctls_parser(
    running: lab.UpResult, first_run: subprocess.CompletedProcess[str]
) -> None:
    res = ssh(running, "gpu002", "ibstat")
    assert res.returncode == 0, res.stderr
    parsed = parse("ibstat", res.stdout)
    assert parsed.recognised, parsed.problems
    cas = parsed.data["cas"]
    assert sorted(cas) == [f"mlx5_{i}" for i in range(8)]
    assert {ca["ports"]["1"]["state"] for ca in cas.values()} == {"Active"}


def test_peermem_is_not_loaded_on_an_inbox_kernel(
    running: lab.UpResult, first_run: subprocess.CompletedProcess[str]
) -> None:
    # the lab's kernel exports no peer memory API, so nvidia-peermem would refuse to load
    assert first_run.stdout.count("nvidia-peermem is not loaded: the inbox kernel") == 2
    for name in GPU_NODES:
        assert ssh(running, name, "test -e /etc/modules-load.d/nvidia-peermem.conf").returncode == 1


def test_opensm_is_enabled_on_its_host_and_waits_for_a_device(
    running: lab.UpResult, first_run: subprocess.CompletedProcess[str]
) -> None:
    res = ssh(running, SM_HOST, "systemctl is-enabled opensm; systemctl is-active opensm")
    assert res.stdout.split() == ["enabled", "inactive"], res.stdout + res.stderr
    assert "opensm is installed and enabled but not started" in first_run.stdout


def test_roce_qos_is_a_no_op_on_infiniband_nodes(
    running: lab.UpResult, first_run: subprocess.CompletedProcess[str]
) -> None:
    for task in ("Preflight", "Install", "Configure"):
        # the hosts' lines come in the order their results arrive
        found = re.search(
            rf"TASK \[roce_qos : {task}\] \*+\n((?:skipping: \[gpu00\d\]\n)+)", first_run.stdout
        )
        assert found, task
        assert sorted(found.group(1).split()) == sorted(
            [f"[{n}]" for n in GPU_NODES] + ["skipping:"] * len(GPU_NODES)
        ), (task, found.group(1))
    for name in GPU_NODES:
        res = ssh(
            running, name, "ls /etc/gpuctl/roce-qos.conf /etc/systemd/system/gpuctl-roce-qos*"
        )
        assert res.returncode != 0, res.stdout


def test_second_run_changes_nothing(
    render_dir: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    res = ansible(render_dir, "ansible-playbook", *PLAYBOOKS)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert {n: h["changed"] for n, h in recap(res.stdout).items()} == dict.fromkeys(NODES, 0)


def test_check_mode_changes_nothing(
    render_dir: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    res = ansible(render_dir, "ansible-playbook", "--check", *PLAYBOOKS)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert {n: h["changed"] for n, h in recap(res.stdout).items()} == dict.fromkeys(NODES, 0)


def test_peermem_loads_and_persists_where_the_kernel_has_the_api(
    running: lab.UpResult, render_dir: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    # the lab's driver stand-in answers `modprobe nvidia-peermem` with a modprobe.d install line
    setup = ssh(
        running,
        SM_HOST,
        "DEBIAN_FRONTEND=noninteractive apt-get -q -y install nvidia-kernel-open-dkms >/dev/null"
        ' && echo "0000000000000000 T ib_register_peer_memory_client [ib_core]"'
        " > /root/kallsyms-peer-api",
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    args = [PLAYBOOKS[1], "--limit", SM_HOST, "--tags", "rdma_peermem"]
    res = ansible(
        render_dir, "ansible-playbook", *args, "-e", "__rdma_kallsyms=/root/kallsyms-peer-api"
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert re.search(r"TASK \[rdma : Load nvidia-peermem\] \*+\nchanged: \[gpu001\]", res.stdout)
    conf = ssh(running, SM_HOST, "cat /etc/modules-load.d/nvidia-peermem.conf")
    assert conf.stdout.splitlines()[-1] == "nvidia-peermem", conf.stdout
    assert conf.stdout.startswith("#")  # ansible_managed
    # back on the real kernel table the persisted load goes away again
    res = ansible(render_dir, "ansible-playbook", *args)
    assert res.returncode == 0, res.stdout[-3000:]
    assert ssh(running, SM_HOST, "test -e /etc/modules-load.d/nvidia-peermem.conf").returncode == 1


def test_roce_qos_without_a_netdev_stops_with_a_clear_message(
    running: lab.UpResult, render_dir: Path, first_run: subprocess.CompletedProcess[str]
) -> None:
    args = [PLAYBOOKS[2], "--limit", "gpu002", "-e", '{"roce_qos_devices": ["mlx5_0"]}']
    res = ansible(render_dir, "ansible-playbook", *args)
    assert res.returncode == 2, res.stdout[-3000:]
    assert "error: mlx5_0: no netdev under /sys/class/infiniband/mlx5_0/device/net" in res.stdout
    conf = ssh(
        running, "gpu002", "cat /etc/gpuctl/roce-qos.conf; systemctl is-enabled gpuctl-roce-qos"
    )
    assert 'ROCE_QOS_DEVICES="mlx5_0"' in conf.stdout
    assert 'ROCE_QOS_TOS="104"' in conf.stdout  # DSCP 26 << 2
    assert conf.stdout.split()[-1] == "enabled"

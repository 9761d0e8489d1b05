"""The slurm_controller and slurm_node roles on the lab, with real Ansible over SSH (needs root).

Renders the running lab's cluster.yml, runs playbooks/munge.yml then playbooks/slurm.yml, and
checks what Slurm itself reports: both compute nodes idle with their 8 GPUs, a job across both,
the rendered files on every node, then idempotence, check mode, and a restart of the daemons when
the configuration changes. The lab comes up once for the module and goes down at its end.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from helpers import ROOT
from lab_helpers import LAB_APT_PROXY, ansible, sh

from gpuctl.lab import lab

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

PLAYBOOKS = (ROOT / "playbooks" / "munge.yml", ROOT / "playbooks" / "slurm.yml")
NODES = ("ctl01", "gpu001", "gpu002")
COMPUTE = ("gpu001", "gpu002")
CONFIG_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf")


def ssh(running: lab.UpResult, name: str, command: str) -> subprocess.CompletedProcess[str]:
    address = next(n.address for n in running.status.nodes if n.name == name)
    return sh(address, command, timeout=180)


def provision(render_dir: Path, *args: str) -> list[subprocess.CompletedProcess[str]]:
    """munge.yml, then slurm.yml (as site.yml orders them); stops after a failed one."""
    results = []
    for playbook in PLAYBOOKS:
        res = ansible(render_dir, "ansible-playbook", str(playbook), *args)
        results.append(res)
        assert res.returncode == 0, f"{playbook.name}:\n{res.stdout[-4000:]}{res.stderr[-2000:]}"
    return results


def recap(stdout: str) -> dict[str, dict[str, int]]:
    hosts = {}
    for m in re.finditer(r"^(\S+)\s*:\s*(ok=.*)$", stdout.split("PLAY RECAP", 1)[-1], re.M):
        hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return hosts


def changed(results: list[subprocess.CompletedProcess[str]]) -> dict[str, int]:
    """Changed tasks per host, summed over the playbooks."""
    total = dict.fromkeys(NODES, 0)
    for res in results:
        hosts = recap(res.stdout)
        assert sorted(hosts) == sorted(NODES), res.stdout[-2000:]
        for name, h in hosts.items():
            assert (h["failed"], h["unreachable"]) == (0, 0), (name, h)
            total[name] += h["changed"]
    return total


def sinfo(running: lab.UpResult) -> list[str]:
    res = ssh(running, "ctl01", 'sinfo -h -N -o "%N %T %G"')
    assert res.returncode == 0, res.stdout + res.stderr
    return sorted(res.stdout.split("\n")[:-1])


def wait_idle(running: lab.UpResult, timeout: float = 60) -> list[str]:
    """sinfo once both compute nodes are idle with their GPUs (or the last answer)."""
    want = [f"{n} idle gpu:h100:8" for n in COMPUTE]
    deadline = time.monotonic() + timeout
    lines = sinfo(running)
    while lines != want and time.monotonic() < deadline:
        time.sleep(1)
        lines = sinfo(running)
    return lines


def main_pid(running: lab.UpResult, name: str, service: str) -> str:
    res = ssh(running, name, f"systemctl show -p MainPID --value {service}")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_compute_nodes_have_their_gpu_device_files(running: lab.UpResult) -> None:
    # gres.conf lists File=/dev/nvidia[0-7]; slurmd refuses to start without them. In the lab
    # the stand-in of the kernel module package makes them (the nvidia_driver role's job on a
    # real cluster).
    for name in COMPUTE:
        res = ssh(
            running,
            name,
            f"apt-get {LAB_APT_PROXY} update -q >/dev/null && DEBIAN_FRONTEND=noninteractive "
            f"apt-get {LAB_APT_PROXY} install -y -q nvidia-kernel-open-dkms >/dev/null && ls /dev",
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert {f"nvidia{i}" for i in range(8)} <= set(res.stdout.split()), (name, res.stdout)


def test_check_mode_on_fresh_nodes_passes_and_installs_nothing(
    running: lab.UpResult, render_dir: Path
) -> None:
    provision(render_dir, "--check")
    for name in NODES:
        res = ssh(running, name, "ls /etc/slurm/slurm.conf /usr/sbin/slurmctld /usr/sbin/slurmd")
        assert res.stdout == "", (name, res.stdout)


def test_first_run_brings_up_both_compute_nodes_with_their_gpus(
    running: lab.UpResult, render_dir: Path
) -> None:
    assert all(n > 0 for n in changed(provision(render_dir)).values())
    assert wait_idle(running) == [f"{n} idle gpu:h100:8" for n in COMPUTE]


def test_a_job_runs_across_both_nodes(running: lab.UpResult) -> None:
    res = ssh(running, "ctl01", "timeout 60 srun -N2 hostname")
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.split()) == list(COMPUTE)


def test_every_node_has_the_rendered_files(running: lab.UpResult, render_dir: Path) -> None:
    paths = " ".join(f"/etc/slurm/{f}" for f in CONFIG_FILES)
    for name in NODES:
        for f in CONFIG_FILES:
            res = ssh(running, name, f"cat /etc/slurm/{f}")
            assert res.returncode == 0, (name, res.stderr)
            assert res.stdout == (render_dir / "slurm" / f).read_text(), (name, f)
        modes = ssh(running, name, f'stat -c "%a %U %G" {paths}')
        assert modes.stdout.split("\n")[:-1] == ["644 root root"] * len(CONFIG_FILES), name


def test_daemons_directories_and_holds(running: lab.UpResult) -> None:
    res = ssh(running, "ctl01", 'stat -c "%n %a %U" /var/lib/slurm/slurmctld /var/log/slurm')
    assert res.stdout.split("\n")[:-1] == [
        "/var/lib/slurm/slurmctld 755 slurm",
        "/var/log/slurm 755 slurm",
    ]
    res = ssh(running, "ctl01", "systemctl is-enabled slurmctld; systemctl is-active slurmctld")
    assert res.stdout.split() == ["enabled", "active"]
    for name in COMPUTE:
        res = ssh(running, name, "systemctl is-enabled slurmd; systemctl is-active slurmd")
        assert res.stdout.split() == ["enabled", "active"], name
        res = ssh(running, name, 'stat -c "%a %U" /var/lib/slurm/slurmd')
        assert res.stdout.strip() == "755 root", name
    # no version pinned in the lab: nothing is held
    for name in NODES:
        res = ssh(running, name, "apt-mark showhold")
        assert res.stdout == "", (name, res.stdout)


def test_second_run_changes_nothing(running: lab.UpResult, render_dir: Path) -> None:
    pids = {n: main_pid(running, n, "slurmd") for n in COMPUTE}
    assert changed(provision(render_dir)) == dict.fromkeys(NODES, 0)
    assert {n: main_pid(running, n, "slurmd") for n in COMPUTE} == pids


def test_check_mode_changes_nothing(render_dir: Path) -> None:
    assert changed(provision(render_dir, "--check")) == dict.fromkeys(NODES, 0)


def test_a_pinned_version_is_held(running: lab.UpResult, render_dir: Path) -> None:
    # "22.05.8" stands for any Debian revision of it (the lab installs 22.05.8-4+deb12u3)
    res = ansible(
        render_dir,
        "ansible-playbook",
        str(PLAYBOOKS[1]),
        "-e",
        "slurm_controller_package_version=22.05.8",
        "-e",
        "slurm_node_package_version=22.05.8",
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    # one changed task per host: the hold (the installed packages already match)
    assert {n: h["changed"] for n, h in recap(res.stdout).items()} == dict.fromkeys(NODES, 1)
    held = {n: ssh(running, n, "apt-mark showhold").stdout.split() for n in NODES}
    assert held == {
        "ctl01": ["slurm-client", "slurmctld"],
        "gpu001": ["slurm-client", "slurmd"],
        "gpu002": ["slurm-client", "slurmd"],
    }


def test_a_file_edited_on_a_node_is_put_back(running: lab.UpResult, render_dir: Path) -> None:
    # the role reads every installed file's checksum, mode and owner in one call and copies
    # only those that differ: a local edit and a changed mode must still be found
    edit = "chmod 0600 /etc/slurm/cgroup.conf && echo '# local edit' >> /etc/slurm/gres.conf"
    assert ssh(running, "gpu001", edit).returncode == 0
    res = ansible(render_dir, "ansible-playbook", str(PLAYBOOKS[1]), "--limit", "gpu001")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert recap(res.stdout)["gpu001"]["changed"] >= 2, res.stdout[-3000:]
    mode = ssh(running, "gpu001", "stat -c %a /etc/slurm/cgroup.conf").stdout.strip()
    assert mode == "644"
    gres = ssh(running, "gpu001", "cat /etc/slurm/gres.conf").stdout
    assert gres == (render_dir / "slurm" / "gres.conf").read_text()
    assert wait_idle(running) == [f"{n} idle gpu:h100:8" for n in COMPUTE]


def test_a_configuration_change_restarts_the_daemons(
    running: lab.UpResult, render_dir: Path
) -> None:
    # the health check hook: slurm.conf names the program (gpuctl's node check later; /bin/true
    # here) and slurm_node_health_check_program says the same
    ctld = main_pid(running, "ctl01", "slurmctld")
    slurmd = {n: main_pid(running, n, "slurmd") for n in COMPUTE}
    conf = render_dir / "slurm" / "slurm.conf"
    conf.write_text(conf.read_text() + "HealthCheckProgram=/bin/true\nHealthCheckInterval=300\n")
    res = ansible(
        render_dir,
        "ansible-playbook",
        str(PLAYBOOKS[1]),
        "-e",
        "slurm_node_health_check_program=/bin/true",
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert main_pid(running, "ctl01", "slurmctld") != ctld
    assert all(main_pid(running, n, "slurmd") != slurmd[n] for n in COMPUTE)
    # no version pinned any more: the holds are released
    assert all(ssh(running, n, "apt-mark showhold").stdout == "" for n in NODES)
    res = ssh(running, "gpu001", "scontrol show config")
    assert re.search(r"^HealthCheckProgram\s*=\s*/bin/true$", res.stdout, re.M), res.stdout
    assert wait_idle(running) == [f"{n} idle gpu:h100:8" for n in COMPUTE]


def test_a_health_check_program_that_slurm_conf_does_not_name_fails_early(
    render_dir: Path,
) -> None:
    res = ansible(
        render_dir,
        "ansible-playbook",
        str(PLAYBOOKS[1]),
        "--limit",
        "gpu001",
        "-e",
        "slurm_node_health_check_program=/usr/sbin/nhc",
    )
    assert res.returncode != 0
    assert "HealthCheckProgram /bin/true; " in res.stdout, res.stdout[-3000:]
    assert recap(res.stdout)["gpu001"]["changed"] == 0

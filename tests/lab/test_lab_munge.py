"""The munge role on the lab, with real Ansible over SSH (needs root).

Renders the running lab's cluster.yml, runs playbooks/munge.yml with a generated key, then checks
idempotence, check mode, credentials across nodes, the key file's owner and mode, and that the key
never shows in Ansible's output. The lab comes up once for the module and goes down at its end.
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

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]

PLAYBOOK = ROOT / "playbooks" / "munge.yml"
NODES = ("ctl01", "gpu001", "gpu002")
OUTPUTS: list[str] = []  # every ansible-playbook stdout+stderr of this module


def address(running: lab.UpResult, name: str) -> str:
    return next(n.address for n in running.status.nodes if n.name == name)


def ssh(
    running: lab.UpResult, name: str, command: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return sh(address(running, name), command, stdin=stdin, timeout=120)


def playbook(render_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    res = ansible(render_dir, "ansible-playbook", str(PLAYBOOK), *args)
    OUTPUTS.append(res.stdout + res.stderr)
    return res


def recap(stdout: str) -> dict[str, dict[str, int]]:
    hosts = {}
    for m in re.finditer(r"^(\S+)\s*:\s*(ok=.*)$", stdout.split("PLAY RECAP", 1)[-1], re.M):
        hosts[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return hosts


def cluster_key(running: lab.UpResult) -> str:
    res = ssh(running, "ctl01", "base64 -w0 /etc/munge/munge.key")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip()) >= 40
    return res.stdout.strip()


def test_first_run_generates_and_distributes_one_key(
    running: lab.UpResult, render_dir: Path
) -> None:
    res = playbook(render_dir, "-e", "munge_key_generate=true")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    hosts = recap(res.stdout)
    assert sorted(hosts) == sorted(NODES)
    assert all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts.values())
    key = cluster_key(running)
    for name in NODES:
        assert ssh(running, name, "base64 -w0 /etc/munge/munge.key").stdout.strip() == key, name


def test_second_run_changes_nothing(running: lab.UpResult, render_dir: Path) -> None:
    res = playbook(render_dir, "-e", "munge_key_generate=true")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    hosts = recap(res.stdout)
    assert sorted(hosts) == sorted(NODES)
    assert {name: h["changed"] for name, h in hosts.items()} == dict.fromkeys(NODES, 0)


def test_the_same_key_given_explicitly_changes_nothing(
    running: lab.UpResult, render_dir: Path
) -> None:
    key = cluster_key(running)
    vars_file = render_dir / "munge-key.yml"
    vars_file.write_text(f"munge_key_b64: {key}\n")
    vars_file.chmod(0o600)
    try:
        res = playbook(render_dir, "-e", f"@{vars_file}")
    finally:
        vars_file.unlink()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert {n: h["changed"] for n, h in recap(res.stdout).items()} == dict.fromkeys(NODES, 0)


def test_check_mode_passes(running: lab.UpResult, render_dir: Path) -> None:
    res = playbook(render_dir, "-e", "munge_key_generate=true", "--check")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert {n: h["changed"] for n, h in recap(res.stdout).items()} == dict.fromkeys(NODES, 0)


def test_a_credential_from_ctl01_decodes_on_gpu002(running: lab.UpResult) -> None:
    cred = ssh(running, "ctl01", "munge -n")
    assert cred.returncode == 0, cred.stderr
    assert cred.stdout.startswith("MUNGE:")
    res = ssh(running, "gpu002", "unmunge", stdin=cred.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^STATUS:\s+Success \(0\)", res.stdout, re.M), res.stdout


def test_key_file_owner_and_mode_on_every_node(running: lab.UpResult) -> None:
    for name in NODES:
        res = ssh(running, name, 'stat -c "%a %U %G" /etc/munge/munge.key /etc/munge')
        assert res.returncode == 0, res.stderr
        assert res.stdout.split("\n")[:2] == ["600 munge munge", "700 munge munge"], name
        active = ssh(running, name, "systemctl is-enabled munge; systemctl is-active munge")
        assert active.stdout.split() == ["enabled", "active"], name


def test_the_key_never_shows_in_ansible_output(running: lab.UpResult) -> None:
    key = cluster_key(running)
    assert len(OUTPUTS) == 4
    for out in OUTPUTS:
        assert key not in out
        assert key[:24] not in out  # nor a piece of it

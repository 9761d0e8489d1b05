"""The shared pin-and-hold role (playbooks/roles/pinned_packages) run for real on this machine
with apt, in check mode, as a role includes it.

`apt-cache show NAME=VERSION` of a package apt knows, at a version it does not, exits 0 and
prints nothing: the role must still see that version as unknown (a fresh version the lists do not
hold yet is planned as a change in check mode, and refreshes the lists when run for real)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import ROOT
from playbook_run import run_local_play

ROLES = ROOT / "playbooks" / "roles"
TASK = "TASK [pinned_packages : At the pinned version (apt): tar]"

pytestmark = pytest.mark.skipif(
    shutil.which("apt-cache") is None, reason="needs apt (a Debian or Ubuntu machine)"
)


def _installed(package: str) -> str:
    return subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def _check_mode(tmp: Path, version: str) -> subprocess.CompletedProcess[str]:
    """A role that includes pinned_packages for `tar` at ``version``, in check mode."""
    wrapper = tmp / "roles" / "wrapper" / "tasks"
    wrapper.mkdir(parents=True)
    include = {
        "name": "tar, pinned",
        "ansible.builtin.include_role": {"name": "pinned_packages"},
        "vars": {
            "pinned_packages_label": "tar",
            "pinned_packages_names": ["tar"],
            "pinned_packages_version": version,
            "pinned_packages_hold": False,
        },
    }
    (wrapper / "main.yml").write_text(yaml.safe_dump([include]), encoding="utf-8")
    play = [{"hosts": "localhost", "gather_facts": True, "roles": ["wrapper"]}]
    env = {
        "ANSIBLE_ROLES_PATH": f"{tmp / 'roles'}:{ROLES}",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        "ANSIBLE_GATHER_SUBSET": "min",
    }
    return run_local_play(tmp, play, env, check=True)


def test_a_version_apt_does_not_have_is_planned_as_a_change_in_check_mode(tmp_path: Path) -> None:
    res = _check_mode(tmp_path, "9.9-not-in-any-list")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    task = res.stdout[res.stdout.index(TASK) :]
    assert task.split("TASK [", 2)[1].count("changed: [localhost]") == 1, task[:2000]


def test_the_installed_version_is_known_and_changes_nothing(tmp_path: Path) -> None:
    res = _check_mode(tmp_path, _installed("tar"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    task = res.stdout[res.stdout.index(TASK) :]
    assert task.split("TASK [", 2)[1].count("ok: [localhost]") == 1, task[:2000]
